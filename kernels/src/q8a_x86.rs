//! The integer-activation rule (`q8a.rs`) on x86-64: AVX-512 VNNI (`vpdpbusd`) and AVX2
//! (`vpmaddubsw` + `vpmaddwd`). Both compute every integer sum exactly and then the rule's f32
//! steps in its order, so their results are the scalar twin's bit for bit.
//!
//! - int8, int4, mxfp4 (rule step 2): 16 rows in the 16 lanes of a register (AVX2: two of 8),
//!   read from the interleaved row order (`MatrixView::interleave`; row-major rows are packed
//!   into it first, [`Packed`], except with VNNI one token's rows, read in place by
//!   [`rows16_token_vnni`], which reduces each row's word sums to the same 16-lane block sums):
//!   per block of 32 columns, each 4-byte weight word of the 16 rows against the token's
//!   matching 4 activation bytes broadcast, then one `fma` per block for the 16 rows.
//!   VNNI multiplies unsigned by signed bytes: int4 codes (0..15) as they are, the offset
//!   applied as `-8 * sum q` per block (`QAct::corr`) added to the integer sum; int8 codes as
//!   `code + 128` (`xor 0x80`) and `-128 * sum q`; mxfp4 codes looked up (`vpshufb`) as
//!   `E2M1_DOUBLED + 12` (0..=24) and `-12 * sum q`. AVX2: int4 and mxfp4 codes as for VNNI;
//!   int8 as `|code|` times `q` with the code's sign (`vpsignb`), so a pair of products stays
//!   within i16 (128 * 127 * 2 < 2^15; mxfp4: 24 * 127 * 2).
//! - ggml types (rule steps 3-4): [`ggml_rows`], 16 lanes of 4 columns per 64.

use crate::avx2_ggml::f16_at;
use crate::q8a::{Kind, QAct, BLOCK, MXFP4_OFFSET};
use coli_format::encoding::ggml::IqTables;
use coli_format::encoding::mxfp4::{e8m0_half, E2M1_DOUBLED};
use coli_format::encoding::GgmlType;
use coli_format::{MatrixView, INTERLEAVE_ROWS};
use std::arch::x86_64::*;

/// `$m!(SRC)` with the in-place source constant of the i-quant type `$t` (one that
/// [`iq_source`] admits): the const generic the tiles and [`iq_chunk`] take.
macro_rules! with_iq_source {
    ($t:expr, $m:ident) => {
        match $t {
            GgmlType::IQ2_XXS => $m!(FROM_IQ2_XXS),
            GgmlType::IQ2_XS => $m!(FROM_IQ2_XS),
            GgmlType::IQ2_S => $m!(FROM_IQ2_S),
            GgmlType::IQ3_XXS => $m!(FROM_IQ3_XXS),
            GgmlType::IQ3_S => $m!(FROM_IQ3_S),
            GgmlType::IQ4_XS => $m!(FROM_IQ4_XS),
            _ => unreachable!("an i-quant with an in-place source"),
        }
    };
}

/// Bytes ahead of the chunk being read that the ggml kernels prefetch in each row.
const PREFETCH: usize = 2048;
/// Bytes ahead of the block being read that [`groups_vnni`] prefetches in each group (every
/// line of the block).
const GROUP_PREFETCH: usize = 2048;
/// Bytes ahead that [`rows16_token_vnni`] prefetches in each of its 16 rows (16 x 512 bytes
/// in flight stay well inside L1; 256 to 2048 measured alike in cache, 512 best from RAM).
const ROW_PREFETCH: usize = 512;
/// Tokens per pass over a weight row in the matmul kernels.
const TILE: usize = 4;

/// Step 4 of the rule over two 8-lane halves (`lo` = lanes 0..8).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum16_halves(lo: __m256, hi: __m256) -> f32 {
    let v8 = _mm256_add_ps(lo, hi);
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)))
}

/// The 16 mxfp4 codes' unsigned integer form `E2M1_DOUBLED + MXFP4_OFFSET`, twice (a `vpshufb`
/// table for each 128-bit half of a 256-bit register).
const MXFP4_LUT: [i8; 32] = {
    let mut t = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = E2M1_DOUBLED[i % 16] + MXFP4_OFFSET as i8;
        i += 1;
    }
    t
};

/// An int4 or mxfp4 chunk's 32 packed bytes as two registers of 32 unsigned codes: the low
/// nibbles (the chunk's even columns) and the high ones (odd columns); mxfp4's looked up as
/// `E2M1_DOUBLED + 12`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn nibbles<const MX: bool>(packed: __m256i) -> (__m256i, __m256i) {
    let m0f = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(packed, m0f);
    let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m0f);
    if MX {
        // SAFETY: 32 readable bytes in `MXFP4_LUT`.
        let lut = unsafe { _mm256_loadu_si256(MXFP4_LUT.as_ptr().cast()) };
        (_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi))
    } else {
        (lo, hi)
    }
}

/// A token's quantized activations: `(q, d, corr)` ([`QAct::token`]; int8, int4 and mxfp4:
/// `d` and `corr` per block of 32 columns).
type Tok<'a> = (&'a [i8], &'a [f32], &'a [i32]);

/// Rows per group (one row per 32-bit lane of a 512-bit register).
const G: usize = INTERLEAVE_ROWS;
/// Groups per pass of the VNNI kernel.
const PASS_GROUPS: usize = 2;

/// One group of 16 rows in the interleaved order (`MatrixView::interleave`).
#[derive(Clone, Copy)]
struct Group<'a> {
    /// `[cols / W, 16]` 4-byte words (`W` columns per word: 8 for int4 and mxfp4, 4 for int8):
    /// word `j` of row `u` at `(16 j + u) * 4`.
    words: &'a [u8],
    /// int4: `[cols / group, 16]` f32 scales; int8: the 16 rows' scales; mxfp4: empty.
    scales: &'a [f32],
    /// mxfp4: `[cols / 32, 16]` e8m0 bytes.
    e8m0: &'a [u8],
}

impl Group<'_> {
    /// Asserts the lengths the kernels read for a `cols`-column matrix of `kind`.
    fn check(&self, kind: Kind, cols: usize) {
        let ok = match kind {
            Kind::Int8 => self.words.len() == G * cols && self.scales.len() == G,
            Kind::Int4 { group } => {
                self.words.len() == G * cols / 2 && self.scales.len() == G * cols / group
            }
            Kind::Mxfp4 => self.words.len() == G * cols / 2 && self.e8m0.len() == G * cols / BLOCK,
            Kind::Ggml(_) => false,
        };
        assert!(ok, "a group of 16 rows of a {cols}-column {kind:?} matrix");
    }
}

/// Rows `r .. r + 16` of `w` packed as a [`Group`] (rows past the matrix: zero codes, zero
/// scales, e8m0 127; their results are dropped): for a row-major view, or the tail rows of an
/// interleaved one. One buffer per call of [`rows`], refilled group after group, so a group's
/// packed words are still in L1 when the kernel reads them: a record read from RAM once (as a
/// row-major kernel would), where reordering it whole first would write it back and read it
/// again.
struct Packed {
    words: Vec<u8>,
    scales: Vec<f32>,
    e8m0: Vec<u8>,
}

impl Packed {
    /// Buffers for `w`'s scales; the words' buffer is made by the first [`Packed::fill`].
    fn new(kind: Kind, w: &MatrixView<'_>) -> Packed {
        let ns = w.encoding().scale_count(1, w.cols());
        Packed {
            words: Vec::new(),
            scales: vec![0.0; if kind == Kind::Mxfp4 { 0 } else { G * ns }],
            e8m0: vec![127; if kind == Kind::Mxfp4 { G * ns } else { 0 }],
        }
    }

    /// Packs rows `r .. r + 16` (those of them that exist).
    fn fill(&mut self, w: &MatrixView<'_>, r: usize) -> Group<'_> {
        let present = G.min(w.rows().saturating_sub(r));
        let stride = w.encoding().weight_bytes(1, w.cols());
        if self.words.is_empty() {
            self.words = vec![0; G * stride];
        }
        let words = stride / 4;
        let simd = present == G && std::is_x86_feature_detected!("avx512f");
        if present < G {
            self.words.fill(0);
        }
        if simd && words.is_multiple_of(16) {
            // 16 whole rows: 16 x 16 word transposes (row-major rows are borrowed).
            let rows: [std::borrow::Cow<'_, [u8]>; G] = std::array::from_fn(|u| w.row_bytes(r + u));
            let rows: [&[u8]; G] = std::array::from_fn(|u| &*rows[u]);
            // SAFETY: AVX-512F detected above; 16 rows of `words` words into a group.
            unsafe { crate::interleave::x86::group(rows, &mut self.words, words) };
        } else {
            for u in 0..present {
                let row = w.row_bytes(r + u);
                for (j, word) in row.chunks_exact(4).enumerate() {
                    self.words[(j * G + u) * 4..(j * G + u) * 4 + 4].copy_from_slice(word);
                }
            }
        }
        self.fill_scales(w, r);
        Group {
            words: &self.words,
            scales: &self.scales,
            e8m0: &self.e8m0,
        }
    }

    /// Packs the scales of rows `r .. r + 16` (those of them that exist) alone: the group's
    /// words stay empty ([`rows16_token_vnni`] reads them in place).
    fn fill_scales(&mut self, w: &MatrixView<'_>, r: usize) -> Group<'_> {
        let present = G.min(w.rows().saturating_sub(r));
        let ns = w.encoding().scale_count(1, w.cols());
        let simd = present == G && std::is_x86_feature_detected!("avx512f");
        if present < G {
            self.scales.fill(0.0);
            self.e8m0.fill(127);
        }
        if simd && !self.scales.is_empty() && ns.is_multiple_of(16) {
            // f32 scales: the same transposes, 4-byte elements.
            let rows: [std::borrow::Cow<'_, [f32]>; G] =
                std::array::from_fn(|u| w.row_scales(r + u));
            let rows: [&[u8]; G] = std::array::from_fn(|u| f32_bytes(&rows[u]));
            let dst = f32_bytes_mut(&mut self.scales);
            // SAFETY: AVX-512F detected above; 16 rows of `ns` scales into a group.
            unsafe { crate::interleave::x86::group(rows, dst, ns) };
        } else {
            for u in 0..present {
                for (j, s) in w.row_scales(r + u).iter().enumerate() {
                    self.scales[j * G + u] = *s;
                }
            }
        }
        for u in 0..present {
            for (j, e) in w.row_e8m0(r + u).iter().enumerate() {
                self.e8m0[j * G + u] = *e;
            }
        }
        Group {
            words: &[],
            scales: &self.scales,
            e8m0: &self.e8m0,
        }
    }
}

/// `v`'s bytes.
fn f32_bytes(v: &[f32]) -> &[u8] {
    zerocopy::IntoBytes::as_bytes(v)
}

/// `v`'s bytes, writable.
fn f32_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    zerocopy::IntoBytes::as_mut_bytes(v)
}

/// Whole group `gi` (rows `16 gi .. 16 gi + 16`) of an interleaved view.
fn view_group<'a>(w: &MatrixView<'a>, gi: usize) -> Group<'a> {
    let cols = w.cols();
    let stride = w.encoding().weight_bytes(1, cols);
    let ns = w.encoding().scale_count(1, cols);
    let s = |v: usize| gi * G * v..(gi + 1) * G * v;
    Group {
        words: &w.data()[s(stride)],
        scales: if w.scales().is_empty() {
            &[]
        } else {
            &w.scales()[s(ns)]
        },
        e8m0: if w.e8m0_scales().is_empty() {
            &[]
        } else {
            &w.e8m0_scales()[s(ns)]
        },
    }
}

/// Offsets (from [`block_q`]) of the 8 activation words that pair with a block's 8 weight
/// vectors: int4 and mxfp4 words `4b .. 4b + 4` each give a low-nibble vector (columns
/// `8j + {0,2,4,6}`, lane-ordered `q` at `4j` of the chunk) and a high-nibble one (`8j +
/// {1,3,5,7}`, at `32 + 4j`): `[lo0, hi0, lo1, hi1, ..]`; int8 words `8b .. 8b + 8` one each.
const NIBBLE_WORDS: [usize; 8] = [0, 32, 4, 36, 8, 40, 12, 44];
const INT8_WORDS: [usize; 8] = [0, 4, 8, 12, 16, 20, 24, 28];

/// Where block `b`'s activation words start in a token's lane-ordered `q`.
#[inline(always)]
fn block_q(kind: Kind, b: usize) -> usize {
    match kind {
        Kind::Int8 => BLOCK * b,
        _ => 64 * (b / 2) + 16 * (b % 2),
    }
}

/// What both group kernels check first (the lengths their loads rely on; `mx` exactly for
/// mxfp4) and read of `kind`: blocks of 32, the int4 group size (0 for the others), the
/// activation words' offsets.
fn setup(
    mx: bool,
    kind: Kind,
    grp: &[Group<'_>],
    toks: &[Tok<'_>],
    cols: usize,
) -> (usize, usize, [usize; 8]) {
    assert_eq!(mx, kind == Kind::Mxfp4, "the mxfp4 instance for mxfp4 only");
    for g in grp {
        g.check(kind, cols);
    }
    let blocks = cols / BLOCK;
    for (q, d, c) in toks {
        assert!(q.len() == cols && d.len() == blocks && c.len() == blocks);
    }
    let group = match kind {
        Kind::Int4 { group } => group,
        _ => 0,
    };
    let offs = if kind == Kind::Int8 {
        INT8_WORDS
    } else {
        NIBBLE_WORDS
    };
    (blocks, group, offs)
}

/// Scale index (into a group's `[n, 16]` int4 scales) of block `b`.
#[inline]
fn int4_group(group: usize, b: usize) -> usize {
    if group == 64 {
        b / 2
    } else if group == 32 {
        b
    } else {
        b * BLOCK / group
    }
}

/// 16 e8m0 bytes as rule step 2's `2^(e - 128)` (`e8m0_half`: e = 0 the subnormal 2^-128,
/// e = 255 NaN).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn e8m0_half16(e: __m128i) -> __m512 {
    let e32 = _mm512_cvtepu8_epi32(e);
    let zero = _mm512_cmpeq_epi32_mask(e32, _mm512_setzero_si512());
    let nan = _mm512_cmpeq_epi32_mask(e32, _mm512_set1_epi32(255));
    // 2^(e - 127) for 1 <= e <= 254 (e = 0: the subnormal 2^-127), halved exactly.
    let bits = _mm512_mask_mov_epi32(_mm512_slli_epi32(e32, 23), zero, _mm512_set1_epi32(1 << 22));
    let v = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0.5));
    _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(f32::NAN))
}

/// `MXFP4_LUT` in both 256-bit halves of a 512-bit register (`vpshufb` looks up per 128 bits).
#[inline]
#[target_feature(enable = "avx512f")]
fn mxfp4_lut512() -> __m512i {
    // SAFETY: 32 readable bytes in `MXFP4_LUT`.
    let l = unsafe { _mm256_loadu_si256(MXFP4_LUT.as_ptr().cast()) };
    _mm512_inserti64x4(_mm512_castsi256_si512(l), l, 1)
}

/// Rule step 2's scale of block `b` for the 16 rows of `g`: mxfp4 (`MX`) the e8m0 scale
/// halved, int4 (`group` > 0) the group's scale, int8 1.0 (its row scales come last).
///
/// # Safety
/// Block `b`'s scales lie within `g`'s (`[blocks, 16]` e8m0 bytes, `[cols / group, 16]` f32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn block_scales<const MX: bool>(group: usize, g: Group<'_>, b: usize) -> __m512 {
    // SAFETY: the caller's guarantee.
    unsafe {
        if MX {
            e8m0_half16(_mm_loadu_si128(g.e8m0.as_ptr().add(b * G).cast()))
        } else if group != 0 {
            _mm512_loadu_ps(g.scales.as_ptr().add(int4_group(group, b) * G))
        } else {
            _mm512_set1_ps(1.0)
        }
    }
}

/// AVX-512 VNNI: `H` groups of 16 rows against `T` tokens, every (row, token) in rule step 2's
/// order: per block, the 16 rows' integer sums as 16 lanes (`vpdpbusd` of the rows' words with
/// the token's 4 activation bytes broadcast, two chains), then one `fma` per lane. `out[h][t]`
/// holds group `h`'s 16 rows for token `t`.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2 and FMA are available; `kind` is not ggml, mxfp4
/// exactly when `MX`; the groups and tokens have a `cols`-column matrix's lengths (asserted).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn groups_vnni<const MX: bool, const H: usize, const T: usize>(
    kind: Kind,
    grp: [Group<'_>; H],
    toks: [Tok<'_>; T],
    cols: usize,
) -> [[[f32; G]; T]; H] {
    let (blocks, group, offs) = setup(MX, kind, &grp, &toks, cols);
    let m0f = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let lut = mxfp4_lut512();
    let mut acc = [[_mm512_setzero_ps(); T]; H];
    for b in 0..blocks {
        // The groups' 8 weight vectors of block b (16 rows x 4 columns each, unsigned) and
        // their scale vectors.
        let mut wv = [[_mm512_setzero_si512(); 8]; H];
        let mut sv = [_mm512_setzero_ps(); H];
        for h in 0..H {
            let words = grp[h].words;
            // SAFETY: block b's words lie within `words` and its scales within the group's
            // (checked lengths); a prefetch never faults.
            unsafe {
                if kind == Kind::Int8 {
                    let at = words.as_ptr().add(b * 8 * 64);
                    for j in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(
                            at.wrapping_add(GROUP_PREFETCH + 64 * j).cast(),
                        );
                    }
                    for j in 0..8 {
                        wv[h][j] =
                            _mm512_xor_si512(_mm512_loadu_si512(at.add(64 * j).cast()), flip);
                    }
                } else {
                    let at = words.as_ptr().add(b * 4 * 64);
                    for j in 0..4 {
                        _mm_prefetch::<_MM_HINT_T0>(
                            at.wrapping_add(GROUP_PREFETCH + 64 * j).cast(),
                        );
                    }
                    for j in 0..4 {
                        let p = _mm512_loadu_si512(at.add(64 * j).cast());
                        let lo = _mm512_and_si512(p, m0f);
                        let hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), m0f);
                        if MX {
                            wv[h][2 * j] = _mm512_shuffle_epi8(lut, lo);
                            wv[h][2 * j + 1] = _mm512_shuffle_epi8(lut, hi);
                        } else {
                            wv[h][2 * j] = lo;
                            wv[h][2 * j + 1] = hi;
                        }
                    }
                }
                sv[h] = block_scales::<MX>(group, grp[h], b);
            }
        }
        let qo = block_q(kind, b);
        for t in 0..T {
            let (q, d, c) = toks[t];
            // SAFETY: block b's activation words lie within `q` (its length is `cols`).
            let qw =
                |j: usize| unsafe { q.as_ptr().add(qo + offs[j]).cast::<i32>().read_unaligned() };
            let db = _mm512_set1_ps(d[b]);
            let cb = _mm512_set1_epi32(c[b]);
            for h in 0..H {
                let mut p0 = cb;
                let mut p1 = _mm512_setzero_si512();
                for j in (0..8).step_by(2) {
                    p0 = _mm512_dpbusd_epi32(p0, wv[h][j], _mm512_set1_epi32(qw(j)));
                    p1 = _mm512_dpbusd_epi32(p1, wv[h][j + 1], _mm512_set1_epi32(qw(j + 1)));
                }
                let p = _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1));
                let m = if kind == Kind::Int8 {
                    db
                } else {
                    _mm512_mul_ps(db, sv[h])
                };
                acc[h][t] = _mm512_fmadd_ps(m, p, acc[h][t]);
            }
        }
    }
    let mut out = [[[0f32; G]; T]; H];
    for h in 0..H {
        for t in 0..T {
            let mut a = acc[h][t];
            if kind == Kind::Int8 {
                // SAFETY: the 16 row scales (checked length).
                a = _mm512_mul_ps(a, unsafe { _mm512_loadu_ps(grp[h].scales.as_ptr()) });
            }
            // SAFETY: 16 writable f32.
            unsafe { _mm512_storeu_ps(out[h][t].as_mut_ptr(), a) };
        }
    }
    out
}

/// AVX-512 VNNI, one token: rows `r .. r + 16` of a row-major int8, int4 or mxfp4 view read in
/// place, in rule step 2's order as [`groups_vnni`] (the same bits), without packing them first.
/// Per 128 columns (4 blocks) each row gives 16 sums of 4-byte words in the lanes, 128-bit lane
/// `L` holding block `L`'s: int4 and mxfp4 by two `vpdpbusd` of its 64 bytes' low and high
/// nibbles (mxfp4's looked up) against the token's matching activation bytes; int8 by a
/// `vpdpbusd` of each of its two 64-byte halves (codes + 128) and the halves' lanes paired by
/// block (two shuffles and an add per row). Three reduction steps (adds of pairs of words, of
/// pairs of those, then a 4 x 4 transpose of 128-bit lanes: 32 shuffles per 16 rows, 64 for
/// int8, where packing takes 64 per 16 x 16 words, two such for int8, and a trip through
/// memory) leave one register per block with
/// the 16 rows' exact integer sums, then one `fma` per block. `sc` holds the 16 rows' scales as
/// a [`Group`]'s (`Packed::fill_scales`; its words are not read).
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2 and FMA are available; `kind` is not ggml, mxfp4
/// exactly when `MX`, int8 exactly when `I8`; `w` is a row-major view of `kind` with checked
/// sections (its lengths, the token's and the scales' are asserted).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
unsafe fn rows16_token_vnni<const MX: bool, const I8: bool>(
    kind: Kind,
    w: &MatrixView<'_>,
    r: usize,
    tok: Tok<'_>,
    sc: Group<'_>,
) -> [f32; G] {
    let cols = w.cols();
    let (blocks, group, _) = setup(MX, kind, &[], &[tok], cols);
    assert_eq!(I8, kind == Kind::Int8, "the int8 instance for int8 only");
    let int8 = I8;
    let stride = w.encoding().weight_bytes(1, cols);
    let data = w.data();
    assert!(
        !matches!(kind, Kind::Ggml(_))
            && !w.is_interleaved()
            && cols.is_multiple_of(64)
            && data.len() >= (r + G) * stride
            && match kind {
                Kind::Int8 => sc.scales.len() == G,
                Kind::Mxfp4 => sc.e8m0.len() == G * blocks,
                _ => sc.scales.len() == G * cols / group,
            },
        "16 row-major rows of a {cols}-column {kind:?} matrix and their scales"
    );
    let (q, d, c) = tok;
    let m0f = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let lut = mxfp4_lut512();
    let mut acc = _mm512_setzero_ps();
    for ch in 0..cols.div_ceil(128) {
        // Blocks in this 128-column chunk: 4, or 2 in a last chunk of 64 columns.
        let nb = (blocks - 4 * ch).min(4);
        let o = 128 * ch;
        // The token's codes that pair with each row's words: int8's in column order (64 columns
        // per register); int4's and mxfp4's in the lane order of `QAct` (per 64 columns, the
        // even columns' then the odd ones'), lane k's 4 bytes for word k of the 128 columns.
        // SAFETY: columns o .. o + 32 nb of `q` exist (its length is `cols`).
        let (qa, qb) = unsafe {
            let at = |i: usize| _mm256_loadu_si256(q.as_ptr().add(o + i).cast());
            let two = |i: usize, j: usize| {
                if nb == 4 {
                    _mm512_inserti64x4(_mm512_castsi256_si512(at(i)), at(j), 1)
                } else {
                    _mm512_zextsi256_si512(at(i))
                }
            };
            if int8 {
                (
                    _mm512_loadu_si512(q.as_ptr().add(o).cast()),
                    if nb == 4 {
                        _mm512_loadu_si512(q.as_ptr().add(o + 64).cast())
                    } else {
                        _mm512_setzero_si512()
                    },
                )
            } else {
                (two(0, 64), two(32, 96))
            }
        };
        let mut s = [_mm512_setzero_si512(); G];
        for u in 0..G {
            // SAFETY: row r + u's bytes of this chunk (int8 o .. o + 32 nb, int4 and mxfp4
            // o / 2 .. o / 2 + 16 nb) lie within `data` (asserted length); a prefetch never
            // faults.
            unsafe {
                let row = data.as_ptr().add((r + u) * stride);
                if int8 {
                    let at = row.add(o);
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ROW_PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ROW_PREFETCH + 64).cast());
                    let a = _mm512_xor_si512(_mm512_loadu_si512(at.cast()), flip);
                    let b = if nb == 4 {
                        _mm512_xor_si512(_mm512_loadu_si512(at.add(64).cast()), flip)
                    } else {
                        _mm512_setzero_si512()
                    };
                    let sa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, qa);
                    let sb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b, qb);
                    // Block L's two 128-bit lanes of words side by side, then added.
                    s[u] = _mm512_add_epi32(
                        _mm512_shuffle_i32x4::<0x88>(sa, sb),
                        _mm512_shuffle_i32x4::<0xDD>(sa, sb),
                    );
                } else {
                    let at = row.add(o / 2);
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ROW_PREFETCH).cast());
                    let p = if nb == 4 {
                        _mm512_loadu_si512(at.cast())
                    } else {
                        _mm512_zextsi256_si512(_mm256_loadu_si256(at.cast()))
                    };
                    let mut lo = _mm512_and_si512(p, m0f);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), m0f);
                    if MX {
                        lo = _mm512_shuffle_epi8(lut, lo);
                        hi = _mm512_shuffle_epi8(lut, hi);
                    }
                    s[u] = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, qa),
                        hi,
                        qb,
                    );
                }
            }
        }
        // Pairs of rows: per 128-bit lane, (w0 + w2, w0' + w2', w1 + w3, w1' + w3') of rows
        // 2p and 2p + 1.
        let u: [__m512i; 8] = std::array::from_fn(|p| {
            _mm512_add_epi32(
                _mm512_unpacklo_epi32(s[2 * p], s[2 * p + 1]),
                _mm512_unpackhi_epi32(s[2 * p], s[2 * p + 1]),
            )
        });
        // Quads of rows: per 128-bit lane L, block L's sums of rows 4k .. 4k + 4.
        let v: [__m512i; 4] = std::array::from_fn(|k| {
            _mm512_add_epi32(
                _mm512_unpacklo_epi64(u[2 * k], u[2 * k + 1]),
                _mm512_unpackhi_epi64(u[2 * k], u[2 * k + 1]),
            )
        });
        // Lane L of the four gathered: block L's sums of rows 0 .. 16.
        let t0 = _mm512_shuffle_i32x4::<0x44>(v[0], v[1]);
        let t1 = _mm512_shuffle_i32x4::<0xEE>(v[0], v[1]);
        let t2 = _mm512_shuffle_i32x4::<0x44>(v[2], v[3]);
        let t3 = _mm512_shuffle_i32x4::<0xEE>(v[2], v[3]);
        let sums = [
            _mm512_shuffle_i32x4::<0x88>(t0, t2),
            _mm512_shuffle_i32x4::<0xDD>(t0, t2),
            _mm512_shuffle_i32x4::<0x88>(t1, t3),
            _mm512_shuffle_i32x4::<0xDD>(t1, t3),
        ];
        for l in 0..nb {
            let b = 4 * ch + l;
            let p = _mm512_cvtepi32_ps(_mm512_add_epi32(sums[l], _mm512_set1_epi32(c[b])));
            let db = _mm512_set1_ps(d[b]);
            let m = if int8 {
                db
            } else {
                // SAFETY: block b's scales lie within the group's (asserted lengths).
                _mm512_mul_ps(db, unsafe { block_scales::<MX>(group, sc, b) })
            };
            acc = _mm512_fmadd_ps(m, p, acc);
        }
    }
    if int8 {
        // SAFETY: the 16 row scales (asserted length).
        acc = _mm512_mul_ps(acc, unsafe { _mm512_loadu_ps(sc.scales.as_ptr()) });
    }
    let mut out = [0f32; G];
    // SAFETY: 16 writable f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// AVX2: one group of 16 rows (two 8-lane halves) against `T` tokens, in the order of
/// [`groups_vnni`]: per block the rows' integer sums (`vpmaddubsw` + `vpmaddwd`; int8 as
/// `|code|` times `q` with the code's sign, so a pair of products stays within i16), then one
/// `fma` per row.
///
/// # Safety
/// AVX2 and FMA are available; as [`groups_vnni`].
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
unsafe fn group_avx2<const MX: bool, const T: usize>(
    kind: Kind,
    grp: Group<'_>,
    toks: [Tok<'_>; T],
    cols: usize,
) -> [[f32; G]; T] {
    let (blocks, group, offs) = setup(MX, kind, &[grp], &toks, cols);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for b in 0..blocks {
        // The 8 weight vectors of block b per half (rows 0..8, 8..16): unsigned codes (int4,
        // mxfp4) or signed int8 codes.
        let mut wv = [[_mm256_setzero_si256(); 8]; 2];
        let mut sv = [_mm256_set1_ps(1.0); 2];
        // SAFETY: block b's words and scales lie within the group's (checked lengths).
        unsafe {
            if kind == Kind::Int8 {
                let at = grp.words.as_ptr().add(b * 8 * 64);
                for j in 0..8 {
                    for half in 0..2 {
                        wv[half][j] = _mm256_loadu_si256(at.add(64 * j + 32 * half).cast());
                    }
                }
            } else {
                let at = grp.words.as_ptr().add(b * 4 * 64);
                for j in 0..4 {
                    for half in 0..2 {
                        let (lo, hi) =
                            nibbles::<MX>(_mm256_loadu_si256(at.add(64 * j + 32 * half).cast()));
                        wv[half][2 * j] = lo;
                        wv[half][2 * j + 1] = hi;
                    }
                }
            }
            for half in 0..2 {
                sv[half] = if MX {
                    let e = grp.e8m0.as_ptr().add(b * G + 8 * half);
                    let v: [f32; 8] = std::array::from_fn(|i| e8m0_half(*e.add(i)));
                    _mm256_loadu_ps(v.as_ptr())
                } else if group != 0 {
                    _mm256_loadu_ps(grp.scales.as_ptr().add(int4_group(group, b) * G + 8 * half))
                } else {
                    _mm256_set1_ps(1.0)
                };
            }
        }
        let qo = block_q(kind, b);
        for t in 0..T {
            let (q, d, c) = toks[t];
            // SAFETY: block b's activation words lie within `q` (its length is `cols`).
            let qw =
                |j: usize| unsafe { q.as_ptr().add(qo + offs[j]).cast::<i32>().read_unaligned() };
            let db = _mm256_set1_ps(d[b]);
            for half in 0..2 {
                let mut p = if kind == Kind::Int8 {
                    _mm256_setzero_si256()
                } else {
                    _mm256_set1_epi32(c[b])
                };
                for j in 0..8 {
                    let qv = _mm256_set1_epi32(qw(j));
                    let w = wv[half][j];
                    let pr = if kind == Kind::Int8 {
                        _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(qv, w))
                    } else {
                        _mm256_maddubs_epi16(w, qv)
                    };
                    p = _mm256_add_epi32(p, _mm256_madd_epi16(pr, ones));
                }
                let m = if kind == Kind::Int8 {
                    db
                } else {
                    _mm256_mul_ps(db, sv[half])
                };
                acc[t][half] = _mm256_fmadd_ps(m, _mm256_cvtepi32_ps(p), acc[t][half]);
            }
        }
    }
    let mut out = [[0f32; G]; T];
    for t in 0..T {
        for half in 0..2 {
            let mut a = acc[t][half];
            if kind == Kind::Int8 {
                // SAFETY: the 16 row scales (checked length).
                a = _mm256_mul_ps(a, unsafe {
                    _mm256_loadu_ps(grp.scales.as_ptr().add(8 * half))
                });
            }
            // SAFETY: 8 writable f32.
            unsafe { _mm256_storeu_ps(out[t].as_mut_ptr().add(8 * half), a) };
        }
    }
    out
}

/// `yt[i * n + t] = row (r0 + i) . token t` for `n` tokens of `qa` (int8, int4, mxfp4), 16 rows
/// at a time: an interleaved view's whole groups as they are (with VNNI two groups per pass),
/// with VNNI one token's 16 row-major rows in place ([`rows16_token_vnni`]),
/// other rows packed into a group first ([`Packed`]); tokens 4 at a time, then one by one. Every
/// output is the rule's value for its row and token whatever the pass it ran in.
///
/// # Safety
/// AVX2 and FMA are available, and with `vnni` AVX-512F, AVX-512BW and AVX-512 VNNI; `w` is of
/// `kind` with checked sections; `qa` was quantized for `kind` with `w.cols()` columns and `n`
/// tokens; `yt` holds whole rows of `n`.
pub(crate) unsafe fn rows(
    vnni: bool,
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    // SAFETY: the caller's guarantees.
    unsafe {
        match (kind == Kind::Mxfp4, vnni) {
            (true, true) => rows_of::<true, true>(kind, w, qa, n, r0, yt),
            (true, false) => rows_of::<true, false>(kind, w, qa, n, r0, yt),
            (false, true) => rows_of::<false, true>(kind, w, qa, n, r0, yt),
            (false, false) => rows_of::<false, false>(kind, w, qa, n, r0, yt),
        }
    }
}

/// [`rows`] with `MX` = (`kind` is mxfp4) and `VNNI`.
///
/// # Safety
/// As [`rows`].
unsafe fn rows_of<const MX: bool, const VNNI: bool>(
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let nrows = yt.len() / n;
    let whole = if w.is_interleaved() {
        w.rows() / G * G
    } else {
        0
    };
    // Row r starts a group the view holds as it is.
    let in_view = |r: usize| r.is_multiple_of(G) && r + G <= whole;
    // Writes group results `o[t][u]` (rows r .. r + 16, tokens t0 ..) that lie within this call.
    let mut put = |r: usize, t0: usize, o: &[[f32; G]]| {
        for u in 0..G {
            let i = r + u - r0;
            if i >= nrows {
                break;
            }
            for (t, ot) in o.iter().enumerate() {
                yt[i * n + t0 + t] = ot[u];
            }
        }
    };
    let mut packed = None;
    let mut r = r0;
    while r < r0 + nrows {
        let pair = VNNI && in_view(r) && in_view(r + G) && r + 2 * G <= r0 + nrows;
        if pair {
            let grp = [view_group(w, r / G), view_group(w, r / G + 1)];
            let mut t = 0;
            while t < n {
                if t + TILE <= n {
                    let toks: [Tok<'_>; TILE] = std::array::from_fn(|u| qa.token(t + u));
                    // SAFETY: the caller's guarantees; whole groups of the view.
                    let o = unsafe { groups_vnni::<MX, PASS_GROUPS, TILE>(kind, grp, toks, cols) };
                    put(r, t, &o[0]);
                    put(r + G, t, &o[1]);
                    t += TILE;
                } else {
                    // SAFETY: as above.
                    let o = unsafe {
                        groups_vnni::<MX, PASS_GROUPS, 1>(kind, grp, [qa.token(t)], cols)
                    };
                    put(r, t, &o[0]);
                    put(r + G, t, &o[1]);
                    t += 1;
                }
            }
            r += 2 * G;
            continue;
        }
        if VNNI && n == 1 && !w.is_interleaved() && r + G <= w.rows() {
            // One token of a row-major view (a streamed record's decode): its rows in place,
            // only the scales packed.
            let sc = packed
                .get_or_insert_with(|| Packed::new(kind, w))
                .fill_scales(w, r);
            // SAFETY: the caller's guarantees; 16 rows of the view.
            let o = unsafe {
                if kind == Kind::Int8 {
                    rows16_token_vnni::<MX, true>(kind, w, r, qa.token(0), sc)
                } else {
                    rows16_token_vnni::<MX, false>(kind, w, r, qa.token(0), sc)
                }
            };
            put(r, 0, &[o]);
            r += G;
            continue;
        }
        let grp = if in_view(r) {
            view_group(w, r / G)
        } else {
            packed
                .get_or_insert_with(|| Packed::new(kind, w))
                .fill(w, r)
        };
        let mut t = 0;
        while t < n {
            if t + TILE <= n {
                let toks: [Tok<'_>; TILE] = std::array::from_fn(|u| qa.token(t + u));
                // SAFETY: the caller's guarantees; a whole group.
                let o = unsafe {
                    if VNNI {
                        groups_vnni::<MX, 1, TILE>(kind, [grp], toks, cols)[0]
                    } else {
                        group_avx2::<MX, TILE>(kind, grp, toks, cols)
                    }
                };
                put(r, t, &o);
                t += TILE;
            } else {
                // SAFETY: as above.
                let o = unsafe {
                    if VNNI {
                        groups_vnni::<MX, 1, 1>(kind, [grp], [qa.token(t)], cols)[0]
                    } else {
                        group_avx2::<MX, 1>(kind, grp, [qa.token(t)], cols)
                    }
                };
                put(r, t, &o);
                t += 1;
            }
        }
        r += G;
    }
}

/// 32 bytes of `b` from `at` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(b: &[u8], at: usize) -> __m256i {
    let v = &b[at..at + 32];
    // SAFETY: `v` holds 32 readable bytes.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Stores 32 codes into `q[at..at + 32]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store32(q: &mut [i8], at: usize, v: __m256i) {
    let o = &mut q[at..at + 32];
    // SAFETY: `o` holds 32 writable bytes.
    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) }
}

/// `GgmlType::codes` of a q8_0 block (the same values; AVX2 + F16C).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    a[0] = f16_at(b, 0);
    store32(q, 0, load32(b, 2));
}

/// `GgmlType::codes` of a q4_0 block: low nibbles are columns 0..16, high ones 16..32, each
/// minus 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    a[0] = f16_at(b, 0);
    let v = &b[2..18];
    // SAFETY: `v` holds 16 readable bytes.
    let x = unsafe { _mm_loadu_si128(v.as_ptr().cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(x, m);
    let hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    store32(
        q,
        0,
        _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8)),
    );
}

/// `GgmlType::codes` of a q4_k block: groups of 32, `a = d * sc`, `m = -(dmin * mn)` (the
/// reference's f32 operations); group `2i` the low nibbles of bytes `16 + 32 i ..`, `2i + 1`
/// the high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = coli_format::encoding::ggml::q4_k_scale_min(&b[4..16]);
    for g in 0..8 {
        a[g] = d * sc[g] as f32;
        m[g] = -(dmin * mn[g] as f32);
    }
    let mask = _mm256_set1_epi8(0x0F);
    for i in 0..4 {
        let x = load32(b, 16 + 32 * i);
        store32(q, 64 * i, _mm256_and_si256(x, mask));
        store32(
            q,
            64 * i + 32,
            _mm256_and_si256(_mm256_srli_epi16(x, 4), mask),
        );
    }
}

/// `GgmlType::codes` of a q6_k block: groups of 16, `a = d * scale`; column `e` (half
/// `h = e / 128`, `k = e % 128`) takes 4 low bits from byte `64 h + k % 64` (shifted by
/// `4 (k / 64)`) and 2 high bits from byte `128 + 32 h + k % 32` (shifted by `2 (k / 32)`),
/// minus 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    let d = f16_at(b, 208);
    for (g, v) in a.iter_mut().enumerate().take(16) {
        *v = d * (b[192 + g] as i8) as f32;
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    for h in 0..2 {
        let qh = load32(b, 128 + 32 * h);
        for p in 0..4 {
            // Columns 128 h + 32 p .. + 32: k = 32 p + 0..32.
            let ql = load32(b, 64 * h + 32 * (p % 2));
            let lo = _mm256_and_si256(
                _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (p / 2) as i32)),
                m4,
            );
            let hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32)), m2);
            let code = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            store32(
                q,
                128 * h + 32 * p,
                _mm256_sub_epi8(code, _mm256_set1_epi8(32)),
            );
        }
    }
}

/// The ggml block types under the rule (step 3's ggml form), AVX2: `yt[i * n + t] = row
/// (r0 + i) . token t`, [`GGML_TILE`] rows at a time. Each row's blocks are unpacked once into their integer form
/// (`GgmlType::codes`: int8 codes, per group the scale `a_g` and offset `m_g`; q8_0, q4_0,
/// q4_k and q6_k with AVX2 here, the same values; q8_0, and for up to 4 tokens q4_0 and (VNNI)
/// q4_k and q6_k, are read in place from the row's blocks instead), then every
/// token runs over it 32 columns (8 lanes) at a time: `p` as `|code|` times `q` with the
/// code's sign (`vpmaddubsw` + `vpmaddwd`; a pair of products stays within i16: 128 * 127 * 2),
/// `s = sum q` likewise against ones, and per lane `acc = fma(d * a_g, p, acc)` then (types
/// with offsets) `acc = fma(d * m_g, s, acc)`: the scalar twin's order, so its bits.
///
/// # Safety
/// AVX2, FMA and F16C are available, and with `vnni` AVX-512F, AVX-512BW and AVX-512 VNNI (then each
/// 64-column chunk runs as one `vpdpbusd`: [`ggml_tile_vnni`]); `w` is a row-major ggml matrix
/// of type `t` (with checked
/// sections) whose `cols` is a multiple of 64; `qa` was quantized for it with `n` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn ggml_rows(
    vnni: bool,
    t: GgmlType,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let (bs, ts) = (t.block_size(), t.type_size());
    let stride = t.bytes_of(cols);
    let g = t.code_group().expect("kind() admits integer types only");
    assert!(
        (g == 16 || g == 32) && cols.is_multiple_of(64) && cols.is_multiple_of(bs),
        "ggml rows: group {g}, {cols} columns"
    );
    assert!(!w.is_interleaved(), "ggml matrices stay row-major");
    let per_block = bs / g;
    // Per row of a tile: its codes, and its group scales and offsets (16 spare values: a
    // block's `codes` writes at least 16).
    let gs = cols / g + 16;
    // q8_0's codes and scales are read in place from the row's bytes, and q4_0's (and with
    // VNNI q4_k's, q6_k's and the i-quants' of `iq_source`: `iq_in_place_tokens`) for a few
    // tokens (decode, verification; for more their blocks are unpacked once into the buffer,
    // which the tokens then share).
    let in_place = t == GgmlType::Q8_0
        || (t == GgmlType::Q4_0 && n <= 4)
        || (matches!(t, GgmlType::Q4_K | GgmlType::Q6_K) && n <= 4 && vnni)
        || (iq_source(t).is_some() && n <= iq_in_place_tokens(t) && vnni);
    let iq_tabs = coli_format::encoding::ggml::iq_tables();
    let mut un = Unpacked {
        rows: [&[]; GGML_TILE],
        codes: if in_place {
            Vec::new()
        } else {
            vec![0i8; GGML_TILE * cols]
        },
        a: vec![0f32; GGML_TILE * gs],
        m: vec![0f32; GGML_TILE * gs],
        cols,
        gs,
        g,
        offset: t.has_offset(),
    };
    let nrows = yt.len() / n;
    // One token (decode): one row at a time, so that the weights stream from RAM in one
    // sequential run (as the int4 kernels found, 4 rows read side by side from 4 places of a
    // row-major section are slower from RAM); several: 4 rows per pass.
    let tile = if n == 1 { 1 } else { GGML_TILE };
    for i0 in (0..nrows).step_by(tile) {
        let rows = tile.min(nrows - i0);
        for u in 0..rows {
            let r = r0 + i0 + u;
            let row = &w.data()[r * stride..(r + 1) * stride];
            if in_place {
                // Every in-place source (`FROM_Q8_0`, `FROM_Q4_0`, `FROM_Q4_K`, `FROM_Q6_K`, the
                // `FROM_IQ*`): one pass over the row's bytes per token.
                un.rows[u] = row;
                continue;
            }
            for blk in 0..cols / bs {
                let b = &row[blk * ts..(blk + 1) * ts];
                let q = &mut un.codes[u * cols + blk * bs..u * cols + (blk + 1) * bs];
                let at = u * gs + blk * per_block;
                let (ab, mb) = (&mut un.a[at..], &mut un.m[at..]);
                match t {
                    // The block's integer form with AVX2 (this function's features), the
                    // same values as `GgmlType::codes`.
                    GgmlType::Q8_0 => q8_0_codes(b, q, ab),
                    GgmlType::Q4_0 => q4_0_codes(b, q, ab),
                    GgmlType::Q4_K => q4_k_codes(b, q, ab, mb),
                    GgmlType::Q6_K => q6_k_codes(b, q, ab),
                    // The i-quants decoded in registers, 64 columns at a time.
                    t if vnni && iq_source(t).is_some() => {
                        // SAFETY: `vnni` only where the CPU has AVX-512F, AVX-512BW and
                        // AVX-512 VNNI (the caller's guarantee); `b` is a whole block of `t`.
                        unsafe { iq_unpack(t, b, q, ab, &iq_tabs) }
                    }
                    _ => t.codes(b, q, ab, mb),
                }
            }
        }
        let out = &mut yt[i0 * n..(i0 + rows) * n];
        macro_rules! tiles {
            ($src:expr) => {
                if vnni {
                    // SAFETY: `vnni` only where the CPU has AVX-512F, AVX-512BW and AVX-512 VNNI (the
                    // caller's guarantee).
                    unsafe {
                        match rows {
                            4 => ggml_tile_vnni::<4, { $src }>(&un, qa, n, out),
                            3 => ggml_tile_vnni::<3, { $src }>(&un, qa, n, out),
                            2 => ggml_tile_vnni::<2, { $src }>(&un, qa, n, out),
                            _ => ggml_tile_vnni::<1, { $src }>(&un, qa, n, out),
                        }
                    }
                } else {
                    match rows {
                        4 => ggml_tile::<4, { $src }>(&un, qa, n, out),
                        3 => ggml_tile::<3, { $src }>(&un, qa, n, out),
                        2 => ggml_tile::<2, { $src }>(&un, qa, n, out),
                        _ => ggml_tile::<1, { $src }>(&un, qa, n, out),
                    }
                }
            };
        }
        match t {
            GgmlType::Q8_0 => tiles!(FROM_Q8_0),
            GgmlType::Q4_0 if in_place => tiles!(FROM_Q4_0),
            // SAFETY: `in_place` holds `vnni` for q4_k and q6_k: AVX-512F, AVX-512BW and
            // AVX-512 VNNI are there.
            GgmlType::Q4_K if in_place => unsafe {
                match rows {
                    4 => ggml_tile_vnni::<4, FROM_Q4_K>(&un, qa, n, out),
                    3 => ggml_tile_vnni::<3, FROM_Q4_K>(&un, qa, n, out),
                    2 => ggml_tile_vnni::<2, FROM_Q4_K>(&un, qa, n, out),
                    _ => ggml_tile_vnni::<1, FROM_Q4_K>(&un, qa, n, out),
                }
            },
            // SAFETY: as for q4_k.
            GgmlType::Q6_K if in_place => unsafe {
                match rows {
                    4 => ggml_tile_vnni::<4, FROM_Q6_K>(&un, qa, n, out),
                    3 => ggml_tile_vnni::<3, FROM_Q6_K>(&un, qa, n, out),
                    2 => ggml_tile_vnni::<2, FROM_Q6_K>(&un, qa, n, out),
                    _ => ggml_tile_vnni::<1, FROM_Q6_K>(&un, qa, n, out),
                }
            },
            // SAFETY: as for q4_k.
            t if in_place && iq_source(t).is_some() => unsafe {
                macro_rules! iq {
                    ($src:expr) => {
                        match rows {
                            4 => ggml_tile_vnni::<4, { $src }>(&un, qa, n, out),
                            3 => ggml_tile_vnni::<3, { $src }>(&un, qa, n, out),
                            2 => ggml_tile_vnni::<2, { $src }>(&un, qa, n, out),
                            _ => ggml_tile_vnni::<1, { $src }>(&un, qa, n, out),
                        }
                    };
                }
                with_iq_source!(t, iq)
            },
            _ => tiles!(FROM_BUF),
        }
    }
}

/// Tokens up to which [`ggml_rows`] decodes an i-quant's blocks in registers for every token
/// instead of unpacking them once into the buffer the tokens share (measured:
/// `kernels/benches/results/q8a_iquant_in_place_2026-12-06.txt`; iq4_xs's nibbles cost little
/// to decode again, the lattice gathers of the others more).
fn iq_in_place_tokens(t: GgmlType) -> usize {
    if t == GgmlType::IQ4_XS {
        4
    } else {
        1
    }
}

/// One i-quant block `b` of type `t` (with an in-place source) unpacked into its integer form:
/// its 256 codes into `q` ([`iq_chunk`]), its group scales into `a` ([`iq_block_scales`]; the
/// values `GgmlType::codes` writes).
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn iq_unpack(t: GgmlType, b: &[u8], q: &mut [i8], a: &mut [f32], tabs: &IqTables) {
    macro_rules! unpack {
        ($src:expr) => {{
            let per = 64 / iq_block($src).1;
            assert!(q.len() >= 256 && a.len() >= 4 * per);
            let mut sv = [0f32; 16];
            // SAFETY: this function's features are `iq_block_scales`'s; `b` is a whole block;
            // 16 floats into `sv`.
            unsafe { _mm512_storeu_ps(sv.as_mut_ptr(), iq_block_scales::<{ $src }>(b)) };
            for c in 0..4 {
                // SAFETY: this function's features are `iq_chunk`'s; `b` is a whole block.
                let codes = unsafe { iq_chunk::<{ $src }>(b, c, tabs) };
                // SAFETY: 64 bytes at 64 c of `q` (asserted above).
                unsafe { _mm512_storeu_si512(q.as_mut_ptr().add(64 * c).cast(), codes) };
                a[per * c..per * (c + 1)].copy_from_slice(&sv[4 * c..4 * c + per]);
            }
        }};
    }
    with_iq_source!(t, unpack)
}

/// Rows of a ggml matrix per pass of [`ggml_rows`]: each token's activation codes and scales
/// are loaded once for them, and their accumulator chains interleave.
const GGML_TILE: usize = 4;

/// Up to [`GGML_TILE`] rows of a ggml matrix in their integer form (row `u` at `u * cols` in
/// `codes`, at `u * gs` in `a` and `m`; a q8_0 row's codes are read from its blocks in `rows`).
struct Unpacked<'a> {
    /// q8_0: the rows' bytes (34-byte blocks, codes at 2..34 of each).
    rows: [&'a [u8]; GGML_TILE],
    codes: Vec<i8>,
    a: Vec<f32>,
    m: Vec<f32>,
    cols: usize,
    /// Group scales (and offsets) per row, with spare room.
    gs: usize,
    /// Columns per group: 16 or 32.
    g: usize,
    /// The type has offsets `m`.
    offset: bool,
}

impl Unpacked<'_> {
    /// Asserts what [`ggml_tile`] and [`ggml_tile_vnni`] read of `R` rows from `SRC` for `n`
    /// tokens into an output of `out_len` values: each row's scales and codes (the buffer, or
    /// whole q8_0 / q4_0 blocks of `cols` columns).
    fn check<const R: usize, const SRC: u8>(&self, n: usize, out_len: usize) {
        let (cols, gs, g) = (self.cols, self.gs, self.g);
        assert!(self.a.len() >= R * gs && self.m.len() >= R * gs && out_len == R * n);
        assert!(SRC != FROM_BUF || self.codes.len() >= R * cols);
        let (block, per) = match SRC {
            FROM_Q8_0 => (34, 32),
            FROM_Q4_0 => (18, 32),
            FROM_Q4_K => (144, 256),
            FROM_Q6_K => (210, 256),
            _ if SRC >= FROM_IQ2_XXS => (iq_block(SRC).0, 256),
            _ => return,
        };
        let group = match SRC {
            FROM_Q6_K => 16,
            _ if SRC >= FROM_IQ2_XXS => iq_block(SRC).1,
            _ => 32,
        };
        assert!(
            g == group
                && cols.is_multiple_of(per)
                && self.rows[..R].iter().all(|r| r.len() == cols / per * block)
        );
    }
}

/// Where [`ggml_tile`] reads a row's codes: the unpacked buffer.
const FROM_BUF: u8 = 0;
/// In place from q8_0 blocks (34 bytes: f16 `d`, 32 int8 codes).
const FROM_Q8_0: u8 = 1;
/// In place from q4_0 blocks (18 bytes: f16 `d`, 16 bytes of nibbles: columns 0..16 low,
/// 16..32 high; the code is the nibble minus 8, taken as `-8 * sum q` off the unsigned sum).
const FROM_Q4_0: u8 = 2;
/// In place from q4_k blocks (144 bytes: f16 `d` and `dmin`, 12 bytes of 6-bit scales and
/// mins, 128 bytes of nibbles: 64-column chunk `i` of the block is bytes `16 + 32 i ..`, its
/// first 32 columns the low nibbles, the next 32 the high ones); the codes are the nibbles
/// (unsigned, no offset), each block's `a_g = d * sc_g` and `m_g = -(dmin * m_g)` computed as
/// `GgmlType::codes` computes them. VNNI only.
const FROM_Q4_K: u8 = 3;
/// In place from q6_k blocks (210 bytes: 128 bytes `ql`, 64 bytes `qh`, 16 signed scales, f16
/// `d`): 64-column chunk `c` of the block (half `h = c / 2`, `s = c % 2`) has the low nibbles
/// `(ql[64 h ..][..64] >> 4 s) & 15` and the high bits `(qh[32 h ..][..32] >> 4 s) & 3` (its
/// first 32 columns), `>> (4 s + 2)` (the next 32); the code `lo | hi << 4` is unsigned, its
/// offset -32 taken as `-32 * sum q`; `a_g = d * scales[g]` per 16 columns, as
/// `GgmlType::codes` computes it. VNNI only.
const FROM_Q6_K: u8 = 4;
/// In place from i-quant blocks ([`iq_chunk`]): iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
/// iq4_xs (every `FROM_IQ*` is at least [`FROM_IQ2_XXS`]). VNNI only.
const FROM_IQ2_XXS: u8 = 5;
const FROM_IQ2_XS: u8 = 6;
const FROM_IQ2_S: u8 = 7;
const FROM_IQ3_XXS: u8 = 8;
const FROM_IQ3_S: u8 = 9;
const FROM_IQ4_XS: u8 = 10;

/// The in-place source of an i-quant type, if it has one.
fn iq_source(t: GgmlType) -> Option<u8> {
    Some(match t {
        GgmlType::IQ2_XXS => FROM_IQ2_XXS,
        GgmlType::IQ2_XS => FROM_IQ2_XS,
        GgmlType::IQ2_S => FROM_IQ2_S,
        GgmlType::IQ3_XXS => FROM_IQ3_XXS,
        GgmlType::IQ3_S => FROM_IQ3_S,
        GgmlType::IQ4_XS => FROM_IQ4_XS,
        _ => return None,
    })
}

/// Block bytes and group size of an i-quant source.
const fn iq_block(src: u8) -> (usize, usize) {
    match src {
        FROM_IQ2_XXS => (66, 32),
        FROM_IQ2_XS => (74, 16),
        FROM_IQ2_S => (82, 16),
        FROM_IQ3_XXS => (98, 32),
        FROM_IQ3_S => (110, 32),
        _ => (136, 32),
    }
}

/// The scale lanes of the 256-column q4_k block `b` (144 bytes: f16 `d`, f16 `dmin`, 12 bytes
/// of 6-bit scales and mins, 128 of nibbles): lanes 0..8 `d * scales[g]`, lanes 8..16
/// `-(dmin * mins[g])` (`(-dmin) * mins[g]`: negation commutes with the rounded product), the
/// values and f32 steps of `GgmlType::codes` (`format/src/encoding/ggml/q4_k.rs`,
/// `scale_min`: the 6-bit fields unpacked four at a time in 32-bit words, as ggml's
/// `kmask1..3` do). Once per block of a row (and token): the block's 4 chunks share it.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available (the tile's features);
/// `b` is a whole q4_k block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_block_scales(b: &[u8]) -> __m512 {
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let (k0, k1, k2) = (word(4), word(8), word(12));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    // scales[0..4] = k[g] & 63; scales[4..8] = (k[g + 4] & 15) | (k[g - 4] >> 6) << 4;
    // mins[0..4] = k[g + 4] & 63; mins[4..8] = (k[g + 4] >> 4) | (k[g] >> 6) << 4.
    let sc_lo = k0 & LOW6;
    let sc_hi = (k2 & LOW4) | (((k0 >> 6) & LOW2) << 4);
    let mn_lo = k1 & LOW6;
    let mn_hi = ((k2 >> 4) & LOW4) | (((k1 >> 6) & LOW2) << 4);
    let bytes = _mm_set_epi32(mn_hi as i32, mn_lo as i32, sc_hi as i32, sc_lo as i32);
    let v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
    let f = _mm512_mask_blend_ps(
        0xFF00,
        _mm512_set1_ps(f16_at(b, 0)),
        _mm512_set1_ps(-f16_at(b, 2)),
    );
    _mm512_mul_ps(f, v)
}

/// The group scales of the 256-column i-quant block `b`, chunk by chunk: lanes `4c..4c + 4`
/// hold 64-column chunk `c`'s 4 groups of 16 (iq2_xs, iq2_s) or 2 groups of 32 (the others;
/// lanes `4c + 2`, `4c + 3` zero), the values and f32 steps of `GgmlType::codes` (ggml's
/// layouts, `format/src/encoding/ggml/*.rs`). Once per block of a row (and token): the block's
/// 4 chunks share it.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available; `b` is a whole block
/// of `SRC`'s type.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn iq_block_scales<const SRC: u8>(b: &[u8]) -> __m512 {
    assert!(b.len() == iq_block(SRC).0);
    let d = f16_at(b, 0);
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    // Two groups of 32 per chunk: `a(2c)`, `a(2c + 1)`, 0, 0.
    let pairs = |a: &dyn Fn(usize) -> f32| {
        let mut v = [0f32; 16];
        for c in 0..4 {
            v[4 * c] = a(2 * c);
            v[4 * c + 1] = a(2 * c + 1);
        }
        // SAFETY: 16 floats.
        unsafe { _mm512_loadu_ps(v.as_ptr()) }
    };
    match SRC {
        FROM_IQ2_XS | FROM_IQ2_S => {
            // 16 groups of 16: `d * (0.5 + ls) * 0.25`, `ls` the nibbles of 8 bytes (low,
            // then high) from byte 66 (iq2_xs) / 74 (iq2_s).
            let at = if SRC == FROM_IQ2_XS { 66 } else { 74 };
            let x = _mm_cvtsi64_si128(i64::from_le_bytes(
                b[at..at + 8].try_into().expect("8 bytes"),
            ));
            let m = _mm_set1_epi8(0x0F);
            let nib =
                _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
            let ls = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib));
            _mm512_mul_ps(
                _mm512_mul_ps(_mm512_set1_ps(d), _mm512_add_ps(_mm512_set1_ps(0.5), ls)),
                _mm512_set1_ps(0.25),
            )
        }
        FROM_IQ2_XXS | FROM_IQ3_XXS => {
            // Group g's u32 of 4 sign indices and the scale (its top 4 bits).
            let (at, step, f) = if SRC == FROM_IQ2_XXS {
                (6, 8, 0.25)
            } else {
                (66, 4, 0.5)
            };
            pairs(&|g| d * (0.5 + (u32_at(at + step * g) >> 28) as f32) * f)
        }
        FROM_IQ3_S => pairs(&|g| {
            let s = (b[106 + g / 2] >> (4 * (g % 2))) & 15;
            d * (1 + 2 * s) as f32
        }),
        _ => {
            // iq4_xs.
            let sh = u16::from_le_bytes([b[2], b[3]]);
            pairs(&|g| {
                let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F;
                let hi = ((sh >> (2 * g)) & 3) as u8;
                d * ((lo | hi << 4) as i32 - 32) as f32
            })
        }
    }
}

/// 64-column chunk `c` (`0..4`) of the 256-column i-quant block `b`, decoded in registers: its
/// 64 signed codes in column order, the values of `GgmlType::codes` (ggml's layouts,
/// `format/src/encoding/ggml/*.rs`; the scales: [`iq_block_scales`]): lattice points gathered
/// from [`IqTables`] by their indices (iq2_*: 8 points of 8 values, iq3_*: 16 of 4), negated
/// where a sign bit is set (the 7-bit `KSIGNS` index's byte mask, gathered, or the sign bits
/// as they are for iq2_s and iq3_s), iq4_xs's nibbles looked up in its 16 levels.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available; `b` is a whole block
/// of `SRC`'s type.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn iq_chunk<const SRC: u8>(b: &[u8], c: usize, t: &IqTables) -> __m512i {
    assert!(b.len() == iq_block(SRC).0 && c < 4);
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    // The byte masks of 8 seven-bit `KSIGNS` indices (the low 7 bits of each u64 lane) and
    // their parity bits, gathered from `IqTables::ksign_masks` (computing them was slower:
    // `kernels/benches/results/q8a_iquant_block_scales_2026-12-07.txt`).
    let ksign_masks = |v: __m512i| {
        let at = _mm512_and_si512(v, _mm512_set1_epi64(127));
        // SAFETY: indices below 128, the table's length.
        unsafe { _mm512_i64gather_epi64::<8>(at, t.ksign_masks.as_ptr().cast()) }
    };
    // The masks of the sign indices of `s0` (entries 0..4) and `s1`, 7 bits each from bit 0.
    let ksigns = |s0: u32, s1: u32| {
        let v = _mm512_set_epi64(
            s1 as i64, s1 as i64, s1 as i64, s1 as i64, s0 as i64, s0 as i64, s0 as i64, s0 as i64,
        );
        ksign_masks(_mm512_srlv_epi64(
            v,
            _mm512_set_epi64(21, 14, 7, 0, 21, 14, 7, 0),
        ))
    };
    // `p` negated where the byte mask `m` is all ones: `(p ^ m) - m`.
    let sign = |p: __m512i, m: __m512i| _mm512_sub_epi8(_mm512_xor_si512(p, m), m);
    // `p` negated where bit `i` of `bits` is set for byte `i` (a masked `0 - p`: the same bytes
    // as `sign` with the bits as a byte mask).
    let sign_bits =
        |p: __m512i, bits: u64| _mm512_mask_sub_epi8(p, bits, _mm512_setzero_si512(), p);
    match SRC {
        FROM_IQ2_XXS | FROM_IQ3_XXS => {
            // Groups 2c and 2c + 1: each 8 bytes of indices (iq2_xxs: 4, then its u32; iq3_xxs:
            // 8) and a u32 of 4 sign indices and the scale.
            let (s0, s1) = if SRC == FROM_IQ2_XXS {
                (u32_at(2 + 16 * c + 4), u32_at(2 + 16 * c + 12))
            } else {
                (u32_at(66 + 8 * c), u32_at(66 + 8 * c + 4))
            };
            let p = if SRC == FROM_IQ2_XXS {
                let idx = (u32_at(2 + 16 * c) as u64) | (u32_at(2 + 16 * c + 8) as u64) << 32;
                let at = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(idx as i64));
                // SAFETY: indices below 256, the grid's length.
                unsafe { _mm512_i64gather_epi64::<8>(at, t.iq2xxs_grid.as_ptr().cast()) }
            } else {
                // SAFETY: 16 bytes at 2 + 16 c lie within the 98-byte block.
                let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
                // SAFETY: indices below 256, the grid's length.
                unsafe {
                    _mm512_i32gather_epi32::<4>(
                        _mm512_cvtepu8_epi32(x),
                        t.iq3xxs_grid.as_ptr().cast(),
                    )
                }
            };
            sign(p, ksigns(s0, s1))
        }
        FROM_IQ2_XS => {
            // SAFETY: 16 bytes of qs at 2 + 16 c lie within the 74-byte block.
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
            let v = _mm512_cvtepu16_epi64(x);
            // SAFETY: indices below 512, the grid's length.
            let p = unsafe {
                _mm512_i64gather_epi64::<8>(
                    _mm512_and_si512(v, _mm512_set1_epi64(511)),
                    t.iq2xs_grid.as_ptr().cast(),
                )
            };
            sign(p, ksign_masks(_mm512_srli_epi64::<9>(v)))
        }
        FROM_IQ2_S => {
            // Entries 8c .. 8c + 8: qs bytes, 2 high bits each from qh bytes 2c, 2c + 1.
            let lo = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(u64_at(2 + 8 * c) as i64));
            let qh = u16::from_le_bytes([b[66 + 2 * c], b[67 + 2 * c]]) as i64;
            let hi = _mm512_and_si512(
                _mm512_srlv_epi64(
                    _mm512_set1_epi64(qh),
                    _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0),
                ),
                _mm512_set1_epi64(3),
            );
            let at = _mm512_or_si512(lo, _mm512_slli_epi64::<8>(hi));
            // SAFETY: indices below 1024, the grid's length.
            let p = unsafe { _mm512_i64gather_epi64::<8>(at, t.iq2s_grid.as_ptr().cast()) };
            sign_bits(p, u64_at(34 + 8 * c))
        }
        FROM_IQ3_S => {
            // Entries 16c .. 16c + 16: qs bytes, a high bit each from qh bytes 2c, 2c + 1.
            // SAFETY: 16 bytes at 2 + 16 c lie within the 110-byte block.
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
            let qh = u16::from_le_bytes([b[66 + 2 * c], b[67 + 2 * c]]) as i32;
            let hi = _mm512_and_si512(
                _mm512_srlv_epi32(
                    _mm512_set1_epi32(qh),
                    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                ),
                _mm512_set1_epi32(1),
            );
            let at = _mm512_or_si512(_mm512_cvtepu8_epi32(x), _mm512_slli_epi32::<8>(hi));
            // SAFETY: indices below 512, the grid's length.
            let p = unsafe { _mm512_i32gather_epi32::<4>(at, t.iq3s_grid.as_ptr().cast()) };
            sign_bits(p, u64_at(74 + 8 * c))
        }
        _ => {
            // iq4_xs: groups 2c, 2c + 1, 16 bytes of nibbles each (low: columns 0..16).
            // SAFETY: 32 bytes at 8 + 32 c lie within the 136-byte block.
            let (x0, x1) = unsafe {
                (
                    _mm_loadu_si128(b.as_ptr().add(8 + 32 * c).cast()),
                    _mm_loadu_si128(b.as_ptr().add(24 + 32 * c).cast()),
                )
            };
            let mut z = _mm512_castsi128_si512(x0);
            z = _mm512_inserti32x4(z, _mm_srli_epi16(x0, 4), 1);
            z = _mm512_inserti32x4(z, x1, 2);
            z = _mm512_inserti32x4(z, _mm_srli_epi16(x1, 4), 3);
            let nib = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
            // SAFETY: 16 bytes.
            let lut =
                _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t.iq4_values.as_ptr().cast()) });
            _mm512_shuffle_epi8(lut, nib)
        }
    }
}

/// The first `R` rows of `un` against every token of `qa`: `out[u * n + t]`, each (row,
/// token) in the rule's order. `SRC`: where the codes are read ([`FROM_BUF`], [`FROM_Q8_0`],
/// [`FROM_Q4_0`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ggml_tile<const R: usize, const SRC: u8>(
    un: &Unpacked<'_>,
    qa: &QAct,
    n: usize,
    out: &mut [f32],
) {
    let (cols, gs, g) = (un.cols, un.gs, un.g);
    un.check::<R, SRC>(n, out.len());
    let arows: [&[f32]; R] = std::array::from_fn(|u| &un.a[u * gs..(u + 1) * gs]);
    let mrows: [&[f32]; R] = std::array::from_fn(|u| &un.m[u * gs..(u + 1) * gs]);
    let ones16 = _mm256_set1_epi16(1);
    let m4 = _mm_set1_epi8(0x0F);
    for tk in 0..n {
        let (q, d, sums) = qa.token(tk);
        assert!(q.len() == cols && d.len() == cols / 4 && sums.len() == cols / 4);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for c in (0..cols).step_by(32) {
            // SAFETY: c + 32 <= cols = q.len(), and the 8 lanes' scales c / 4 .. c / 4 + 8
            // lie within d (asserted above).
            let (qx, dv) = unsafe {
                (
                    _mm256_loadu_si256(q.as_ptr().add(c).cast()),
                    _mm256_loadu_ps(d.as_ptr().add(c / 4)),
                )
            };
            // The lanes' sums of activation codes (offsets; q4_0's -8), from `quantize`.
            // SAFETY: c / 4 + 8 <= cols / 4 = sums.len().
            let sq = unsafe { _mm256_loadu_si256(sums.as_ptr().add(c / 4).cast()) };
            let s = _mm256_cvtepi32_ps(sq);
            let h = (c / 32) % 2;
            for u in 0..R {
                let (a, m) = (arows[u], mrows[u]);
                // Group scales of the 8 lanes (columns c .. c + 32): in place, the block's f16
                // `d`.
                let (av, mv) = if SRC == FROM_Q8_0 {
                    (
                        _mm256_set1_ps(f16_at(un.rows[u], c / 32 * 34)),
                        _mm256_setzero_ps(),
                    )
                } else if SRC == FROM_Q4_0 {
                    (
                        _mm256_set1_ps(f16_at(un.rows[u], c / 32 * 18)),
                        _mm256_setzero_ps(),
                    )
                } else if g == 32 {
                    (_mm256_set1_ps(a[c / 32]), _mm256_set1_ps(m[c / 32]))
                } else {
                    let lo = c / 16;
                    (
                        _mm256_blend_ps(_mm256_set1_ps(a[lo]), _mm256_set1_ps(a[lo + 1]), 0xF0),
                        _mm256_blend_ps(_mm256_set1_ps(m[lo]), _mm256_set1_ps(m[lo + 1]), 0xF0),
                    )
                };
                // SAFETY: row u's codes are u * cols .. (u + 1) * cols of `codes`, or bytes
                // 2..34 (q8_0) / 2..18 (q4_0) of block c / 32 of its `cols / 32` blocks in
                // `rows[u]` (asserted above); c + 32 <= cols.
                let p = unsafe {
                    match SRC {
                        FROM_Q4_0 => {
                            let x =
                                _mm_loadu_si128(un.rows[u].as_ptr().add(c / 32 * 18 + 2).cast());
                            let nib = _mm256_set_m128i(
                                _mm_and_si128(_mm_srli_epi16(x, 4), m4),
                                _mm_and_si128(x, m4),
                            );
                            _mm256_sub_epi32(
                                _mm256_madd_epi16(_mm256_maddubs_epi16(nib, qx), ones16),
                                _mm256_slli_epi32(sq, 3),
                            )
                        }
                        _ => {
                            let wc = if SRC == FROM_Q8_0 {
                                _mm256_loadu_si256(un.rows[u].as_ptr().add(c / 32 * 34 + 2).cast())
                            } else {
                                _mm256_loadu_si256(un.codes.as_ptr().add(u * cols + c).cast())
                            };
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(_mm256_abs_epi8(wc), _mm256_sign_epi8(qx, wc)),
                                ones16,
                            )
                        }
                    }
                };
                acc[u][h] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dv, av), _mm256_cvtepi32_ps(p), acc[u][h]);
                if un.offset {
                    acc[u][h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, mv), s, acc[u][h]);
                }
            }
        }
        for (u, acc) in acc.iter().enumerate() {
            out[u * n + tk] = sum16_halves(acc[0], acc[1]);
        }
    }
}

/// [`ggml_tile`] with AVX-512 VNNI: a 64-column chunk (the rule's 16 lanes) per step,
/// `vpdpbusd` of the codes as unsigned bytes (q4_0's nibbles as they are, taken `-8 * sum q`
/// off; int8 codes plus 128, `-128 * sum q`) with the activation codes. The same lanes, integer
/// sums and f32 steps as [`ggml_tile`], so the same bits.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn ggml_tile_vnni<const R: usize, const SRC: u8>(
    un: &Unpacked<'_>,
    qa: &QAct,
    n: usize,
    out: &mut [f32],
) {
    let (cols, gs, g) = (un.cols, un.gs, un.g);
    un.check::<R, SRC>(n, out.len());
    // Lane j's group within a chunk's 4 (g = 16) or 2 (g = 32) groups.
    let idx = if g == 32 {
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    } else {
        _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
    };
    let flip = _mm512_set1_epi8(-128);
    let m0f = _mm512_set1_epi8(0x0F);
    let m0f_256 = _mm256_set1_epi8(0x0F);
    let m03 = _mm512_set1_epi8(0x03);
    let iq_tabs = coli_format::encoding::ggml::iq_tables();
    // Row u's current block's 16 scale lanes, computed once per block of a row and token:
    // FROM_Q4_K its 8 group scales `d * scales[g]` then its 8 offsets `-(dmin * mins[g])`
    // (`q4_k_block_scales`); FROM_Q6_K its 16 `d * scales[g]`; the i-quants their group scales
    // chunk by chunk (`iq_block_scales`).
    let mut blk = [[0f32; 16]; R];
    for tk in 0..n {
        let (q, d, sums) = qa.token(tk);
        assert!(q.len() == cols && d.len() == cols / 4 && sums.len() == cols / 4);
        let mut acc = [_mm512_setzero_ps(); R];
        for k in 0..cols / 64 {
            if SRC == FROM_Q4_K && k % 4 == 0 {
                for u in 0..R {
                    let b = &un.rows[u][k / 4 * 144..k / 4 * 144 + 144];
                    // SAFETY: this function's features are `q4_k_block_scales`'s; `b` is block
                    // k / 4 of the row (`check`: the row holds cols / 256 whole blocks); 16
                    // floats into `blk[u]`.
                    unsafe { _mm512_storeu_ps(blk[u].as_mut_ptr(), q4_k_block_scales(b)) };
                }
            }
            if SRC == FROM_Q6_K && k % 4 == 0 {
                for u in 0..R {
                    // The block's 16 products `d * scales[g]` at once: the same f32 products
                    // as one at a time.
                    let b = &un.rows[u][k / 4 * 210..k / 4 * 210 + 210];
                    // SAFETY: bytes 192..208 of the 210-byte block are its 16 scales; 16 floats
                    // fit `blk[u]`.
                    unsafe {
                        let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                            b.as_ptr().add(192).cast(),
                        )));
                        _mm512_storeu_ps(
                            blk[u].as_mut_ptr(),
                            _mm512_mul_ps(_mm512_set1_ps(f16_at(b, 208)), sc),
                        );
                    }
                }
            }
            if SRC >= FROM_IQ2_XXS && k % 4 == 0 {
                let bb = iq_block(SRC).0;
                for u in 0..R {
                    let b = &un.rows[u][k / 4 * bb..k / 4 * bb + bb];
                    // SAFETY: this function's features are `iq_block_scales`'s; `b` is block
                    // k / 4 of the row (`check`: the row holds cols / 256 whole blocks); 16
                    // floats into `blk[u]`.
                    unsafe { _mm512_storeu_ps(blk[u].as_mut_ptr(), iq_block_scales::<SRC>(b)) };
                }
            }
            // SAFETY: 64 k + 64 <= cols = q.len(), 16 k + 16 <= cols / 4 = d.len() =
            // sums.len().
            let (qx, dv, sq) = unsafe {
                (
                    _mm512_loadu_si512(q.as_ptr().add(64 * k).cast()),
                    _mm512_loadu_ps(d.as_ptr().add(16 * k)),
                    // The lanes' sums of activation codes, from `quantize`.
                    _mm512_loadu_si512(sums.as_ptr().add(16 * k).cast()),
                )
            };
            let g0 = 64 * k / g;
            for u in 0..R {
                let a = &un.a[u * gs..(u + 1) * gs];
                // An i-quant chunk: its codes, decoded in registers (its scales: `blk`).
                let iq = if SRC >= FROM_IQ2_XXS {
                    let (bb, _) = iq_block(SRC);
                    let b = &un.rows[u][k / 4 * bb..k / 4 * bb + bb];
                    _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                    // SAFETY: this function's features are `iq_chunk`'s; `b` is block k / 4 of
                    // the row (`check`: the row holds cols / 256 whole blocks).
                    unsafe { iq_chunk::<SRC>(b, k % 4, &iq_tabs) }
                } else {
                    _mm512_setzero_si512()
                };
                // The lanes' group scales: in place, the two blocks' f16 `d`.
                let a4 = match SRC {
                    FROM_Q8_0 | FROM_Q4_0 => {
                        let ts = if SRC == FROM_Q8_0 { 34 } else { 18 };
                        let row = un.rows[u];
                        // A prefetch of any address is allowed (it never faults).
                        _mm_prefetch::<_MM_HINT_T0>(
                            row.as_ptr().wrapping_add(2 * k * ts + PREFETCH).cast(),
                        );
                        // SAFETY: blocks 2 k and 2 k + 1 lie within the row (`check`: the row
                        // holds cols / 32 blocks, 64 k + 64 <= cols); x86 is little-endian.
                        let pair = unsafe {
                            let at = row.as_ptr().add(2 * k * ts);
                            at.cast::<u16>().read_unaligned() as i32
                                | (at.add(ts).cast::<u16>().read_unaligned() as i32) << 16
                        };
                        _mm_cvtph_ps(_mm_cvtsi32_si128(pair))
                    }
                    // Groups 2 (k % 4) and 2 (k % 4) + 1 of the block (8 of them).
                    FROM_Q4_K => {
                        _mm_prefetch::<_MM_HINT_T0>(
                            un.rows[u].as_ptr().wrapping_add(k * 36 + PREFETCH).cast(),
                        );
                        let p = blk[u][2 * (k % 4)..2 * (k % 4) + 2].as_ptr();
                        // SAFETY: 2 floats at `p`.
                        _mm_castsi128_ps(unsafe { _mm_loadl_epi64(p.cast()) })
                    }
                    // The chunk's 4 groups of 16: their `d * scales[g]`, from the block's 16.
                    FROM_Q6_K => {
                        // Per chunk (a block of 210 bytes is 4 chunks: every line asked for).
                        _mm_prefetch::<_MM_HINT_T0>(
                            un.rows[u]
                                .as_ptr()
                                .wrapping_add(k * 210 / 4 + PREFETCH)
                                .cast(),
                        );
                        // SAFETY: 4 floats of the 16 at 4 (k % 4).
                        unsafe { _mm_loadu_ps(blk[u].as_ptr().add(4 * (k % 4))) }
                    }
                    // The chunk's group scales, of the block's (`blk`).
                    // SAFETY: 4 floats of the 16 at 4 (k % 4).
                    _ if SRC >= FROM_IQ2_XXS => unsafe {
                        _mm_loadu_ps(blk[u].as_ptr().add(4 * (k % 4)))
                    },
                    // SAFETY: groups g0 .. g0 + 4 lie within the row's `gs` (16 spare).
                    _ => unsafe { _mm_loadu_ps(a.as_ptr().add(g0)) },
                };
                let av = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(a4));
                // SAFETY: the codes of columns 64 k .. 64 k + 64 of row u, as in `ggml_tile`
                // (asserted above).
                let (w, corr) = unsafe {
                    match SRC {
                        FROM_Q4_0 => {
                            let b = un.rows[u].as_ptr().add(2 * k * 18 + 2);
                            let x0 = _mm_loadu_si128(b.cast());
                            let x1 = _mm_loadu_si128(b.add(18).cast());
                            let mut z = _mm512_castsi128_si512(x0);
                            z = _mm512_inserti32x4(z, _mm_srli_epi16(x0, 4), 1);
                            z = _mm512_inserti32x4(z, x1, 2);
                            z = _mm512_inserti32x4(z, _mm_srli_epi16(x1, 4), 3);
                            (_mm512_and_si512(z, m0f), _mm512_slli_epi32(sq, 3))
                        }
                        FROM_Q4_K => {
                            let x = _mm256_loadu_si256(
                                un.rows[u]
                                    .as_ptr()
                                    .add(k / 4 * 144 + 16 + 32 * (k % 4))
                                    .cast(),
                            );
                            let z = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_and_si256(x, m0f_256)),
                                _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f_256),
                                1,
                            );
                            (z, _mm512_setzero_si512())
                        }
                        FROM_Q6_K => {
                            let b = un.rows[u].as_ptr().add(k / 4 * 210);
                            let (h, sh) = (k % 4 / 2, 4 * (k % 2) as i64);
                            let lo = _mm512_and_si512(
                                _mm512_srl_epi16(
                                    _mm512_loadu_si512(b.add(64 * h).cast()),
                                    _mm_cvtsi64_si128(sh),
                                ),
                                m0f,
                            );
                            let qh = _mm256_loadu_si256(b.add(128 + 32 * h).cast());
                            let hi = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_srl_epi16(qh, _mm_cvtsi64_si128(sh))),
                                _mm256_srl_epi16(qh, _mm_cvtsi64_si128(sh + 2)),
                                1,
                            );
                            let hi = _mm512_slli_epi16(_mm512_and_si512(hi, m03), 4);
                            (_mm512_or_si512(lo, hi), _mm512_slli_epi32(sq, 5))
                        }
                        _ if SRC >= FROM_IQ2_XXS => {
                            (_mm512_xor_si512(iq, flip), _mm512_slli_epi32(sq, 7))
                        }
                        FROM_Q8_0 => {
                            let b = un.rows[u].as_ptr().add(2 * k * 34 + 2);
                            let z = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_loadu_si256(b.cast())),
                                _mm256_loadu_si256(b.add(34).cast()),
                                1,
                            );
                            (_mm512_xor_si512(z, flip), _mm512_slli_epi32(sq, 7))
                        }
                        _ => {
                            let z =
                                _mm512_loadu_si512(un.codes.as_ptr().add(u * cols + 64 * k).cast());
                            (_mm512_xor_si512(z, flip), _mm512_slli_epi32(sq, 7))
                        }
                    }
                };
                let p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, qx), corr);
                acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, av), _mm512_cvtepi32_ps(p), acc[u]);
                if un.offset {
                    let m = &un.m[u * gs..(u + 1) * gs];
                    let m4 = if SRC == FROM_Q4_K {
                        let p = blk[u][8 + 2 * (k % 4)..8 + 2 * (k % 4) + 2].as_ptr();
                        // SAFETY: 2 floats at `p`.
                        _mm_castsi128_ps(unsafe { _mm_loadl_epi64(p.cast()) })
                    } else {
                        // SAFETY: as for `a`.
                        unsafe { _mm_loadu_ps(m.as_ptr().add(g0)) }
                    };
                    let mv = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(m4));
                    let s = _mm512_cvtepi32_ps(sq);
                    acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, mv), s, acc[u]);
                }
            }
        }
        for (u, a) in acc.iter().enumerate() {
            let lo = _mm512_castps512_ps256(*a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1));
            out[u * n + tk] = sum16_halves(lo, hi);
        }
    }
}

/// Step 1 of the integer rule for one block of 32 activations ([`crate::q8a::quantize_block`])
/// with AVX-512: the same operations on each value (`|x|`'s maximum, which no order changes;
/// `127 / amax` once; `(x inv + 1.5 2^23) - 1.5 2^23`, clamped to ±127), so the same codes
/// and `d`. None, with `q` untouched, when the block holds a NaN (the scalar step's `max`
/// skips NaN, which `vmaxps` does not do the same way) or its largest magnitude is so small
/// that `127 / amax` overflows (a zero then gives `0 * inf`, NaN): such a block takes the scalar
/// step.
///
/// # Safety
/// AVX-512F is available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn quantize_block_avx512(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> Option<f32> {
    // SAFETY: `x` holds 32 values and `q` 32 bytes: two 16-lane loads, two 16-byte stores.
    unsafe {
        let v = [
            _mm512_loadu_ps(x.as_ptr()),
            _mm512_loadu_ps(x.as_ptr().add(16)),
        ];
        if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[0]) != 0
            || _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[1]) != 0
        {
            return None;
        }
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        if amax == 0.0 || !amax.is_finite() {
            q.fill(0);
            return Some(if amax == 0.0 { 0.0 } else { f32::NAN });
        }
        let inv = 127.0 / amax;
        if !inv.is_finite() {
            // amax below 127 / f32::MAX: `0 * inf` is NaN, which the scalar step's clamp keeps
            // (code 0) and `vmaxps` does not.
            return None;
        }
        let inv = _mm512_set1_ps(inv);
        let magic = _mm512_set1_ps(crate::q8a::ROUND_MAGIC);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        for (h, &vh) in v.iter().enumerate() {
            let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(vh, inv), magic), magic);
            let r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            // Whole numbers within ±127: the conversion and the narrowing are exact.
            let b = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
            _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), b);
        }
        Some(amax / 127.0)
    }
}
