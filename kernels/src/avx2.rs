//! AVX2 + FMA (+ F16C) kernels (x86-64 only; selected at run time by `lib.rs`).
//!
//! A row is consumed in chunks of 8 columns. Each chunk is decoded to one `__m256` of f32
//! weights (exactly the reference value `code * scale`, one f32 rounding, as
//! `MatrixView::dequantize_row`; int8: the bare code, the row scale multiplies the row's sum),
//! then multiplied into the token's accumulators with FMA. int4 with a group size that is a
//! multiple of 32 dividing `cols` has its own kernel (the "int4 fast path" at the end).
//! Summation order per token (fixed, independent of threads and of how many tokens share a
//! pass): chunk `c` goes into accumulator `c % 4`; the last partial chunk (`cols % 8` columns,
//! zero padded) goes into accumulator `(cols / 8) % 4`; the four accumulators are combined as
//! `(a0 + a1) + (a2 + a3)`, then the 8 lanes are summed pairwise (`hsum`).
//!
//! `matvec_rows` decodes on the fly (fused); `matmul_rows` decodes each row once into a buffer
//! with the same decoders and runs up to 3 tokens per pass over it. Both feed the accumulators
//! the same values in the same order, so their results are bit-identical.

use std::arch::x86_64::*;

use coli_format::encoding::mxfp4::{e8m0_to_f32, MXFP4_BLOCK};
use coli_format::encoding::mxfp8::MXFP8_BLOCK;
use coli_format::encoding::{GgmlType, FP8_BLOCK};
use coli_format::{Encoding, MatrixView};

use crate::scalar::decode_cols;

/// Tokens per pass in `matmul_rows` (3 tokens x 4 accumulators = 12 of the 16 ymm registers).
const TILE: usize = 3;

/// A sequential source of decoded weight chunks (8 f32 each) of one row.
pub(crate) trait Chunks {
    /// The next full chunk of 8 decoded weights.
    ///
    /// # Safety
    /// The CPU supports AVX2, FMA and F16C; at most `cols / 8` chunks are taken per source.
    unsafe fn next(&mut self) -> __m256;

    /// The next 4 full chunks (the same values as 4 calls of `next`); sources override it to
    /// share bounds checks and scale loads.
    ///
    /// # Safety
    /// As `next`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { [self.next(), self.next(), self.next(), self.next()] }
    }
}

/// Loads 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(a: &[f32; 8]) -> __m256 {
    // SAFETY: `a` is a valid reference to 8 contiguous f32 (unaligned load allowed).
    unsafe { _mm256_loadu_ps(a.as_ptr()) }
}

/// Sums the 8 lanes of `(a[0] + a[1]) + (a[2] + a[3])` in a fixed pairwise order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(a: &[__m256; 4]) -> f32 {
    hsum1(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ))
}

/// Dot products of one row (given by `src`, `nfull` full chunks, then `wtail`: the last
/// `cols % 8` weights zero padded, if any) with `T` tokens' activations `xs[t]` (`cols` long).
///
/// # Safety
/// AVX2, FMA and F16C are available; `src` yields at least `nfull` chunks; `nfull == cols / 8`.
// Index loops keep the chunk -> accumulator assignment explicit (and fully unrolled).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_tokens<const T: usize, S: Chunks>(
    src: &mut S,
    nfull: usize,
    wtail: Option<&[f32; 8]>,
    xs: [&[f32]; T],
) -> [f32; T] {
    let xc: [&[[f32; 8]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<8>().0[..nfull]);
    let groups = nfull / 4;
    let xg: [&[[[f32; 8]; 4]]; T] = std::array::from_fn(|t| &xc[t].as_chunks::<4>().0[..groups]);
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    for gi in 0..groups {
        // SAFETY: AVX2+FMA+F16C available (caller); chunks 4 * gi .. 4 * gi + 4 < nfull, in order.
        let w = unsafe { src.next4() };
        for k in 0..4 {
            for t in 0..T {
                acc[t][k] = _mm256_fmadd_ps(w[k], load8(&xg[t][gi][k]), acc[t][k]);
            }
        }
    }
    // SAFETY: as above; `4 * groups` chunks taken so far.
    unsafe { dot_tokens_finish(acc, src, nfull, wtail, xs) }
}

/// The end of [`dot_tokens`] after its `nfull / 4` groups of 4 chunks (also the end of the
/// AVX-512 kernel that runs those groups on paired accumulators): the `nfull % 4` remaining
/// chunks into accumulators `0..`, the zero-padded tail chunk into the next, then
/// `hsum((a0 + a1) + (a2 + a3))` per token.
///
/// # Safety
/// AVX2, FMA and F16C are available; `src` yields the `nfull % 4` chunks after the first
/// `nfull / 4 * 4`; `nfull == cols / 8`; `xs[t]` is `cols` long.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_tokens_finish<const T: usize, S: Chunks>(
    mut acc: [[__m256; 4]; T],
    src: &mut S,
    nfull: usize,
    wtail: Option<&[f32; 8]>,
    xs: [&[f32]; T],
) -> [f32; T] {
    let xc: [&[[f32; 8]]; T] = std::array::from_fn(|t| &xs[t].as_chunks::<8>().0[..nfull]);
    let groups = nfull / 4;
    let rem = nfull % 4;
    for k in 0..4 {
        if k < rem {
            let c = groups * 4 + k;
            // SAFETY: AVX2+FMA+F16C available (caller); c < nfull.
            let w = unsafe { src.next() };
            for t in 0..T {
                acc[t][k] = _mm256_fmadd_ps(w, load8(&xc[t][c]), acc[t][k]);
            }
        }
    }
    if let Some(wt) = wtail {
        let w = load8(wt);
        for k in 0..4 {
            if k == rem {
                for t in 0..T {
                    let tail = xs[t].as_chunks::<8>().1;
                    let mut xt = [0f32; 8];
                    xt[..tail.len()].copy_from_slice(tail);
                    acc[t][k] = _mm256_fmadd_ps(w, load8(&xt), acc[t][k]);
                }
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum(&acc[t]);
    }
    out
}

/// A forward cursor over the full-chunk bytes of one row.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    /// The next `N` bytes (one bounds check).
    #[inline]
    fn take<const N: usize>(&mut self) -> &'a [u8; N] {
        let b = self.data[self.pos..self.pos + N]
            .as_chunks::<N>()
            .0
            .first()
            .expect("slice of exactly N bytes");
        self.pos += N;
        b
    }
}

/// 8 f32 from the 32 little-endian bytes starting at `k * 32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f32_bytes(b: &[u8], k: usize) -> __m256 {
    let b = &b[k * 32..k * 32 + 32];
    // SAFETY: `b` is 32 readable bytes = 8 f32 (unaligned load).
    unsafe { _mm256_loadu_ps(b.as_ptr().cast::<f32>()) }
}

/// f32 weights: a plain load.
struct F32Src<'a> {
    cur: Cursor<'a>,
}

impl Chunks for F32Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        load_f32_bytes(self.cur.take::<32>(), 0)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<128>();
        [
            load_f32_bytes(b, 0),
            load_f32_bytes(b, 1),
            load_f32_bytes(b, 2),
            load_f32_bytes(b, 3),
        ]
    }
}

/// 8 bf16 (16 bytes starting at `k * 16`) to f32: zero-extend to 32 bits, shift left by 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16x8(b: &[u8], k: usize) -> __m256 {
    let b = &b[k * 16..k * 16 + 16];
    // SAFETY: `b` is 16 readable bytes (unaligned 128-bit load).
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(v)))
}

/// bf16 weights.
pub(crate) struct Bf16Src<'a> {
    cur: Cursor<'a>,
}

impl<'a> Bf16Src<'a> {
    /// The chunks of the bf16 weights `bytes` (16 bytes per chunk of 8), from the first.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Bf16Src {
            cur: Cursor::new(bytes),
        }
    }
}

impl Chunks for Bf16Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        bf16x8(self.cur.take::<16>(), 0)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<64>();
        [bf16x8(b, 0), bf16x8(b, 1), bf16x8(b, 2), bf16x8(b, 3)]
    }
}

/// Loads the 8 bytes starting at `k * 8` into the low half of an xmm register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_u8x8(b: &[u8], k: usize) -> __m128i {
    let b: [u8; 8] = b[k * 8..k * 8 + 8].try_into().expect("8 bytes");
    _mm_cvtsi64_si128(i64::from_le_bytes(b))
}

/// fp8 e4m3fn weights, decoded through float16: an e4m3 code `S EEEE MMM` placed as the f16
/// bits `S 0EEEE MMM 0000000` is the same number times 2^-8 (normals and subnormals alike, as
/// both formats share the subnormal rule), which `vcvtph2ps` widens to f32 exactly. The 2^8 is
/// folded into the block scale: `(v * 2^-8) * (s * 2^8)` is the exact product `v * s` rounded
/// once, i.e. the reference value (for any scale below 2^119 in magnitude; real block scales
/// are near 1). The NaN codes (`x111 1111`) become f16 NaN.
pub(crate) struct Fp8Src<'a> {
    cur: Cursor<'a>,
    /// The scales of this row's block row (one per 128 columns).
    srow: &'a [f32],
    /// Index of the next chunk.
    c: usize,
}

/// 8 e4m3 codes (as u16 lanes of `x`) to f16 bit patterns (value * 2^-8), NaN codes to NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fp8_to_f16_bits(x: __m128i) -> __m128i {
    let abs = _mm_and_si128(x, _mm_set1_epi16(0x7F));
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(x, _mm_set1_epi16(0x80)));
    let bits = _mm_or_si128(sign, _mm_slli_epi16::<7>(abs));
    // 0xFFFF (all ones) is an f16 NaN.
    _mm_or_si128(bits, _mm_cmpeq_epi16(abs, _mm_set1_epi16(0x7F)))
}

/// 8 fp8 codes (bytes `k * 8..k * 8 + 8`) times `scale256` (= block scale * 256).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fp8x8(b: &[u8], k: usize, scale256: __m256) -> __m256 {
    let x = _mm_cvtepu8_epi16(load_u8x8(b, k));
    _mm256_mul_ps(_mm256_cvtph_ps(fp8_to_f16_bits(x)), scale256)
}

/// 16 e4m3 codes (as u16 lanes of `x`) to f16 bit patterns, as [`fp8_to_f16_bits`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn fp8_to_f16_bits_x16(x: __m256i) -> __m256i {
    let abs = _mm256_and_si256(x, _mm256_set1_epi16(0x7F));
    let sign = _mm256_slli_epi16::<8>(_mm256_and_si256(x, _mm256_set1_epi16(0x80)));
    let bits = _mm256_or_si256(sign, _mm256_slli_epi16::<7>(abs));
    _mm256_or_si256(bits, _mm256_cmpeq_epi16(abs, _mm256_set1_epi16(0x7F)))
}

/// 16 fp8 codes (bytes `k * 16..k * 16 + 16`) times `scale256`: two chunks, the same values
/// as two [`fp8x8`] calls.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fp8x16(b: &[u8], k: usize, scale256: __m256) -> (__m256, __m256) {
    let b = &b[k * 16..k * 16 + 16];
    // SAFETY: `b` is 16 readable bytes (unaligned 128-bit load).
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) };
    let h = fp8_to_f16_bits_x16(_mm256_cvtepu8_epi16(v));
    let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    let hi = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
    (_mm256_mul_ps(lo, scale256), _mm256_mul_ps(hi, scale256))
}

impl<'a> Fp8Src<'a> {
    /// The source of row `r` of fp8 matrix `w` from its full chunk `c0` on (`c0` a multiple
    /// of 4), as `with_src!` builds it from chunk 0.
    pub(crate) fn at(w: &MatrixView<'a>, r: usize, c0: usize) -> Self {
        let cols = w.cols();
        let nfull = cols / 8;
        let bcols = cols.div_ceil(FP8_BLOCK);
        let br = r / FP8_BLOCK;
        Fp8Src {
            cur: Cursor::new(&w.data()[r * cols + c0 * 8..r * cols + nfull * 8]),
            srow: &w.scales()[br * bcols..(br + 1) * bcols],
            c: c0,
        }
    }
}

impl Fp8Src<'_> {
    /// The block scale of chunk `c`, times 2^8 (16 chunks of 8 columns per 128-column block).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scale256(&self, c: usize) -> __m256 {
        _mm256_set1_ps(self.srow[c / (FP8_BLOCK / 8)] * 256.0)
    }
}

impl Chunks for Fp8Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s = self.scale256(self.c);
        self.c += 1;
        fp8x8(self.cur.take::<8>(), 0, s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<32>();
        // `c` is a multiple of 4 and a block spans 16 chunks: one scale for all 4.
        let s = self.scale256(self.c);
        self.c += 4;
        let (w0, w1) = fp8x16(b, 0, s);
        let (w2, w3) = fp8x16(b, 1, s);
        [w0, w1, w2, w3]
    }
}

/// MXFP8 weights: 8 e4m3 codes per chunk through their f16 bit patterns (`value * 2^-8`, exact),
/// times 256 (exact), times the e8m0 scale of the chunk's 32-column block: one rounding, the
/// reference's `e4m3(code) * 2^(e - 127)` (coli_format `encoding::mxfp8`), NaN codes NaN.
pub(crate) struct Mxfp8Src<'a> {
    cur: Cursor<'a>,
    /// The row's e8m0 scales.
    srow: &'a [u8],
    /// Index of the next chunk (8 columns; a block is 4 chunks).
    c: usize,
}

impl<'a> Mxfp8Src<'a> {
    /// The source of row `r` of mxfp8 matrix `w` from its full chunk `c0` on (`c0` a multiple
    /// of 4), as `with_src!` builds it from chunk 0.
    pub(crate) fn at(w: &MatrixView<'a>, r: usize, c0: usize) -> Self {
        let cols = w.cols();
        let nfull = cols / 8;
        let nb = cols.div_ceil(MXFP8_BLOCK);
        Mxfp8Src {
            cur: Cursor::new(&w.data()[r * cols + c0 * 8..r * cols + nfull * 8]),
            srow: &w.e8m0_scales()[r * nb..(r + 1) * nb],
            c: c0,
        }
    }
}

impl Chunks for Mxfp8Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s = _mm256_set1_ps(e8m0_to_f32(self.srow[self.c / 4]));
        self.c += 1;
        _mm256_mul_ps(fp8x8(self.cur.take::<8>(), 0, _mm256_set1_ps(256.0)), s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<32>();
        // `c` is a multiple of 4 here: the 4 chunks are one block.
        let s = _mm256_set1_ps(e8m0_to_f32(self.srow[self.c / 4]));
        self.c += 4;
        let k = _mm256_set1_ps(256.0);
        let (w0, w1) = fp8x16(b, 0, k);
        let (w2, w3) = fp8x16(b, 1, k);
        [
            _mm256_mul_ps(w0, s),
            _mm256_mul_ps(w1, s),
            _mm256_mul_ps(w2, s),
            _mm256_mul_ps(w3, s),
        ]
    }
}

/// int8 weights: the codes, sign-extended and converted (exact in f32); the row scale is
/// applied once to the row's sum (see [`row_post_scale`]).
struct Int8Src<'a> {
    cur: Cursor<'a>,
}

/// 8 int8 codes (bytes `k * 8..k * 8 + 8`) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn int8x8(b: &[u8], k: usize) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load_u8x8(b, k)))
}

impl Chunks for Int8Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        int8x8(self.cur.take::<8>(), 0)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<32>();
        [int8x8(b, 0), int8x8(b, 1), int8x8(b, 2), int8x8(b, 3)]
    }
}

/// The factor applied to row `r`'s dot product after the sum: the row scale for int8 (its
/// chunks are the bare codes: `s * sum q x` instead of `sum (q s) x`, equal up to f32
/// rounding, one multiply per row instead of one per weight), 1 for every other encoding
/// (whose chunks carry their scales).
fn row_post_scale(w: &MatrixView<'_>, r: usize) -> f32 {
    match w.encoding() {
        Encoding::Int8 => w.scales()[r],
        _ => 1.0,
    }
}

/// The 8 nibbles of bytes `k * 4..k * 4 + 4` (low nibble first) as `nibble - 8` in f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn int4_codes(b: &[u8], k: usize) -> __m256 {
    let b: [u8; 4] = b[k * 4..k * 4 + 4].try_into().expect("4 bytes");
    let v = _mm256_set1_epi32(i32::from_le_bytes(b));
    let sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let nib = _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32(0x0F));
    _mm256_cvtepi32_ps(_mm256_sub_epi32(nib, _mm256_set1_epi32(8)))
}

/// int4 weights with a group size that is a multiple of 8: one scale per chunk.
struct Int4Src<'a> {
    cur: Cursor<'a>,
    srow: &'a [f32],
    /// Chunks (of 8 columns) per group: `group_size / 8`.
    per_group: usize,
    /// Index of the next chunk.
    c: usize,
}

impl Chunks for Int4Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s = _mm256_set1_ps(self.srow[self.c / self.per_group]);
        self.c += 1;
        _mm256_mul_ps(int4_codes(self.cur.take::<4>(), 0), s)
    }
}

/// int4 weights with a power-of-two group size of at least 32 (the usual 32, 64, 128): the 4
/// chunks of `next4` share one scale, and the group index is a shift.
struct Int4Pow2Src<'a> {
    cur: Cursor<'a>,
    srow: &'a [f32],
    /// `log2(group_size / 8)`.
    shift: u32,
    /// Index of the next chunk.
    c: usize,
}

impl Chunks for Int4Pow2Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s = _mm256_set1_ps(self.srow[self.c >> self.shift]);
        self.c += 1;
        _mm256_mul_ps(int4_codes(self.cur.take::<4>(), 0), s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<16>();
        // `c` is a multiple of 4 here and a group spans a multiple of 4 chunks.
        let s = _mm256_set1_ps(self.srow[self.c >> self.shift]);
        self.c += 4;
        [
            _mm256_mul_ps(int4_codes(b, 0), s),
            _mm256_mul_ps(int4_codes(b, 1), s),
            _mm256_mul_ps(int4_codes(b, 2), s),
            _mm256_mul_ps(int4_codes(b, 3), s),
        ]
    }
}

/// The 8 e2m1 codes of bytes `k * 4..k * 4 + 4` (low nibble first) decoded exactly to f32
/// lanes: magnitude `[0, 0.5, 1, 1.5, 2, 3, 4, 6][code & 7]` by a lane permutation, sign from
/// bit 3 (`coli_format::encoding::mxfp4::E2M1_VALUES`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn e2m1_codes(b: &[u8], k: usize) -> __m256 {
    let b: [u8; 4] = b[k * 4..k * 4 + 4].try_into().expect("4 bytes");
    let v = _mm256_set1_epi32(i32::from_le_bytes(b));
    let sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let nib = _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32(0x0F));
    let mags = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let mag = _mm256_permutevar8x32_ps(mags, nib);
    let sign = _mm256_slli_epi32(_mm256_and_si256(nib, _mm256_set1_epi32(8)), 28);
    _mm256_xor_ps(mag, _mm256_castsi256_ps(sign))
}

/// mxfp4 weights: e2m1 codes times the block's e8m0 scale (one exact f32 product per weight,
/// as the reference decode); the 4 chunks of `next4` share one block of 32 columns.
struct Mxfp4Src<'a> {
    cur: Cursor<'a>,
    /// The row's e8m0 scales.
    srow: &'a [u8],
    /// Index of the next chunk (8 columns; a block is 4 chunks).
    c: usize,
}

impl Chunks for Mxfp4Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s = _mm256_set1_ps(e8m0_to_f32(self.srow[self.c / 4]));
        self.c += 1;
        _mm256_mul_ps(e2m1_codes(self.cur.take::<4>(), 0), s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<16>();
        // `c` is a multiple of 4 here: the 4 chunks are one block.
        let s = _mm256_set1_ps(e8m0_to_f32(self.srow[self.c / 4]));
        self.c += 4;
        [
            _mm256_mul_ps(e2m1_codes(b, 0), s),
            _mm256_mul_ps(e2m1_codes(b, 1), s),
            _mm256_mul_ps(e2m1_codes(b, 2), s),
            _mm256_mul_ps(e2m1_codes(b, 3), s),
        ]
    }
}

/// int4 weights with any even group size: per-lane scales (slower; group sizes that are not a
/// multiple of 8 are unusual).
struct Int4AnySrc<'a> {
    cur: Cursor<'a>,
    srow: &'a [f32],
    g: usize,
    c: usize,
}

impl Chunks for Int4AnySrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let s: [f32; 8] = std::array::from_fn(|i| self.srow[(self.c * 8 + i) / self.g]);
        self.c += 1;
        _mm256_mul_ps(int4_codes(self.cur.take::<4>(), 0), load8(&s))
    }
}

/// Decoded weights in a buffer (one row, chunk-padded).
struct BufSrc<'a> {
    chunks: &'a [[f32; 8]],
    pos: usize,
}

impl Chunks for BufSrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let v = load8(&self.chunks[self.pos]);
        self.pos += 1;
        v
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let c = &self.chunks[self.pos..self.pos + 4];
        self.pos += 4;
        [load8(&c[0]), load8(&c[1]), load8(&c[2]), load8(&c[3])]
    }
}

/// The last `cols % 8` weights of row `r`, zero padded, or `None` when `cols % 8 == 0`; as
/// the chunk sources decode them (int8: the bare codes, see [`row_post_scale`]).
pub(crate) fn tail_weights(w: &MatrixView<'_>, r: usize) -> Option<[f32; 8]> {
    let c0 = w.cols() / 8 * 8;
    (c0 < w.cols()).then(|| {
        let mut t = [0f32; 8];
        if w.encoding() == Encoding::Int8 {
            let row = &w.data()[r * w.cols() + c0..(r + 1) * w.cols()];
            for (o, &q) in t.iter_mut().zip(row) {
                *o = (q as i8) as f32;
            }
        } else {
            decode_cols(w, r, c0, w.cols(), &mut t);
        }
        t
    })
}

/// Runs `$body` with `$src` bound to the chunk source of row `$r` of `$w` (a macro rather than
/// a closure so that the source type stays concrete and inlines).
macro_rules! with_src {
    ($w:expr, $r:expr, |$src:ident| $body:expr) => {{
        let w: &MatrixView<'_> = $w;
        let r: usize = $r;
        let cols = w.cols();
        let nfull = cols / 8;
        match w.encoding() {
            Encoding::F32 => {
                let row = &w.data()[r * cols * 4..(r + 1) * cols * 4];
                let $src = &mut F32Src {
                    cur: Cursor::new(&row[..nfull * 32]),
                };
                $body
            }
            Encoding::Bf16 => {
                let row = &w.data()[r * cols * 2..(r + 1) * cols * 2];
                let $src = &mut Bf16Src {
                    cur: Cursor::new(&row[..nfull * 16]),
                };
                $body
            }
            Encoding::Fp8 => {
                let row = &w.data()[r * cols..(r + 1) * cols];
                let bcols = cols.div_ceil(FP8_BLOCK);
                let br = r / FP8_BLOCK;
                let $src = &mut Fp8Src {
                    cur: Cursor::new(&row[..nfull * 8]),
                    srow: &w.scales()[br * bcols..(br + 1) * bcols],
                    c: 0,
                };
                $body
            }
            Encoding::Int8 => {
                let row = &w.data()[r * cols..(r + 1) * cols];
                let $src = &mut Int8Src {
                    cur: Cursor::new(&row[..nfull * 8]),
                };
                $body
            }
            Encoding::Int4 { group_size } => {
                let g = group_size as usize;
                let stride = cols.div_ceil(2);
                // Full chunks cover bytes [0, nfull * 4), all inside the row.
                let row = &w.data()[r * stride..r * stride + nfull * 4];
                let ng = cols.div_ceil(g);
                let srow = &w.scales()[r * ng..(r + 1) * ng];
                if g >= 32 && g.is_power_of_two() {
                    let $src = &mut Int4Pow2Src {
                        cur: Cursor::new(row),
                        srow,
                        shift: (g / 8).trailing_zeros(),
                        c: 0,
                    };
                    $body
                } else if g % 8 == 0 {
                    let $src = &mut Int4Src {
                        cur: Cursor::new(row),
                        srow,
                        per_group: g / 8,
                        c: 0,
                    };
                    $body
                } else {
                    let $src = &mut Int4AnySrc {
                        cur: Cursor::new(row),
                        srow,
                        g,
                        c: 0,
                    };
                    $body
                }
            }
            Encoding::Mxfp4 => {
                let stride = cols.div_ceil(2);
                let row = &w.data()[r * stride..r * stride + nfull * 4];
                let nb = cols.div_ceil(MXFP4_BLOCK);
                let $src = &mut Mxfp4Src {
                    cur: Cursor::new(row),
                    srow: &w.e8m0_scales()[r * nb..(r + 1) * nb],
                    c: 0,
                };
                $body
            }
            Encoding::Mxfp8 => {
                let row = &w.data()[r * cols..(r + 1) * cols];
                let nb = cols.div_ceil(MXFP8_BLOCK);
                let $src = &mut Mxfp8Src {
                    cur: Cursor::new(&row[..nfull * 8]),
                    srow: &w.e8m0_scales()[r * nb..(r + 1) * nb],
                    c: 0,
                };
                $body
            }
            Encoding::Ggml(
                t @ (GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K),
            ) => {
                let stride = t.bytes_of(cols);
                let row = &w.data()[r * stride..(r + 1) * stride];
                match t {
                    GgmlType::Q8_0 => {
                        let $src = &mut crate::avx2_ggml::Q80Src { row, b: 0, c: 0 };
                        $body
                    }
                    GgmlType::Q4_0 => {
                        let $src = &mut crate::avx2_ggml::Q40Src { row, b: 0, c: 0 };
                        $body
                    }
                    GgmlType::Q4_K => {
                        let $src = &mut crate::avx2_ggml::Q4KSrc::new(row);
                        $body
                    }
                    _ => {
                        let $src = &mut crate::avx2_ggml::Q6KSrc::new(row);
                        $body
                    }
                }
            }
            Encoding::Ggml(_) => {
                // The other ggml block types: the row decoded by the reference decoder (the
                // values gguf-py's dequantization gives), then summed as f32 weights.
                let mut dec = vec![0f32; nfull * 8];
                w.decode_cols(r, 0, nfull * 8, &mut dec);
                let bytes: &[u8] = zerocopy::IntoBytes::as_bytes(&dec[..]);
                let $src = &mut F32Src {
                    cur: Cursor::new(bytes),
                };
                $body
            }
        }
    }};
}

/// `y[i] = row (r0 + i) of w . x` (`x.len() == cols`), decoding on the fly.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w`'s section lengths are those of its encoding (`MatrixView::new`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    let nfull = w.cols() / 8;
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let tail = tail_weights(w, r);
        let v = with_src!(w, r, |src| {
            // SAFETY: AVX2+FMA+F16C available (caller); each source has exactly `nfull` full chunks.
            unsafe { dot_tokens::<1, _>(src, nfull, tail.as_ref(), [x]) }
        });
        *yo = v[0] * row_post_scale(w, r);
    }
}

/// Decodes the `cols / 8` full chunks of row `r` of `w` into `buf` with the chunk sources of
/// [`matvec_rows`] (the same calls, `next4` per 4 chunks then `next`, hence the same values).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView::new`);
/// `buf.len() == cols / 8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_row(w: &MatrixView<'_>, r: usize, buf: &mut [[f32; 8]]) {
    with_src!(w, r, |src| {
        let (quads, rest) = buf.as_chunks_mut::<4>();
        for q in quads {
            // SAFETY: AVX2+FMA+F16C available (caller); `nfull` chunks requested in all.
            let v = unsafe { src.next4() };
            for (b, v) in q.iter_mut().zip(v) {
                // SAFETY: `b` is a valid, writable [f32; 8] (unaligned store).
                unsafe { _mm256_storeu_ps(b.as_mut_ptr(), v) };
            }
        }
        for b in rest {
            // SAFETY: as above.
            let v = unsafe { src.next() };
            // SAFETY: `b` is a valid, writable [f32; 8] (unaligned store).
            unsafe { _mm256_storeu_ps(b.as_mut_ptr(), v) };
        }
    });
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for this chunk's rows (`yt.len() / n` of them).
/// Each row is decoded once into a buffer, then dotted with up to [`TILE`] tokens per pass.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView::new`); `x.len() == n * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_rows(
    w: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let nfull = cols / 8;
    let mut buf = vec![[0f32; 8]; nfull];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        let r = r0 + i;
        // SAFETY: AVX2+FMA+F16C available (caller); `buf` holds `nfull` chunks.
        unsafe { decode_row(w, r, &mut buf) };
        let tail = tail_weights(w, r);
        let post = row_post_scale(w, r);
        let xt = |t: usize| &x[t * cols..(t + 1) * cols];
        let mut t = 0;
        while t + TILE <= n {
            let src = &mut BufSrc {
                chunks: &buf,
                pos: 0,
            };
            // SAFETY: AVX2+FMA+F16C available; `buf` holds `nfull` chunks.
            let v = unsafe {
                dot_tokens::<TILE, _>(src, nfull, tail.as_ref(), [xt(t), xt(t + 1), xt(t + 2)])
            };
            for (o, v) in yrow[t..t + TILE].iter_mut().zip(v) {
                *o = v * post;
            }
            t += TILE;
        }
        while t < n {
            let src = &mut BufSrc {
                chunks: &buf,
                pos: 0,
            };
            // SAFETY: as above.
            let v = unsafe { dot_tokens::<1, _>(src, nfull, tail.as_ref(), [xt(t)]) };
            yrow[t] = v[0] * post;
            t += 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// int4 fast path: group size a multiple of 32 that divides `cols`.
//
// A 32-column block is 16 bytes; byte `i` holds column `2i` (low nibble) and `2i + 1` (high
// nibble). The block is split into its 16 low and 16 high nibbles (two byte-wide ops on the
// whole block), `- 8` is applied on the bytes, and the four runs of 8 codes are widened to f32.
// That yields the columns in the order `0, 2, .., 30, 1, 3, .., 31`, so the activations are
// permuted once per product into the same order ([`int4_permute`]) instead of shuffling every
// weight. Within a group the codes are multiplied with the activations and summed (four 8-lane
// accumulators per token, run `k` of each block into accumulator `k`); at the end of the group
// the accumulators are combined as `(a0 + a1) + (a2 + a3)` and added into the token's total
// with one FMA by the group scale: `total = fma(group_sum, scale, total)`. The result is
// `sum_g scale_g * sum_{c in g} (q_c - 8) x_c`, the reference `sum_c ((q_c - 8) scale_g) x_c`
// up to f32 rounding (the products `(q - 8) * x` are exact in f32 before the sums; one scale
// multiply per group instead of one per weight). The 8 lanes of the total are summed pairwise
// at the end. The order per token is fixed, so `matvec` and every tile size of `matmul` agree
// bit for bit.
// ---------------------------------------------------------------------------------------------

/// Tokens per pass of the int4 fast path in `matmul` (2 tokens x 4 accumulators + 2 totals).
const INT4_TILE: usize = 2;

/// Whether `w` takes the int4 fast path: int4 with a group size that is a multiple of 32 and
/// divides `cols` (every real model's 32, 64 or 128 with hidden sizes that are multiples of
/// the group).
pub(crate) fn int4_fast(w: &MatrixView<'_>) -> bool {
    match w.encoding() {
        Encoding::Int4 { group_size } => {
            let g = group_size as usize;
            g >= 32 && g.is_multiple_of(32) && w.cols() > 0 && w.cols().is_multiple_of(g)
        }
        _ => false,
    }
}

/// `x` (`n` rows of `cols` activations, `cols % block == 0`) with each `block`-column block
/// reordered as the int4 fast paths decode it: the block's even columns first, then its odd
/// columns (`block` = 32 for AVX2, 64 for AVX-512).
pub(crate) fn int4_permute(x: &[f32], block: usize) -> Vec<f32> {
    let half = block / 2;
    let mut out = vec![0f32; x.len()];
    for (ob, xb) in out.chunks_exact_mut(block).zip(x.chunks_exact(block)) {
        for j in 0..half {
            ob[j] = xb[2 * j];
            ob[half + j] = xb[2 * j + 1];
        }
    }
    out
}

/// Sums the 8 lanes of `a` pairwise: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum1(a: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
}

/// Dot products of one int4 row (`row`: `cols / 2` bytes; `srow`: its `cols / g` scales) with
/// `T` tokens' permuted activations `xps[t]` (`cols` long, see [`int4_permute`]).
///
/// # Safety
/// AVX2, FMA and F16C are available; `g % 32 == 0`, `row.len() * 2 == xps[t].len() ==
/// srow.len() * g`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int4_dot_tokens<const T: usize>(
    row: &[u8],
    srow: &[f32],
    g: usize,
    xps: [&[f32]; T],
) -> [f32; T] {
    let per_group = g / 32;
    let blocks = row.as_chunks::<16>().0;
    let xb: [&[[f32; 32]]; T] = std::array::from_fn(|t| xps[t].as_chunks::<32>().0);
    let mask = _mm_set1_epi8(0x0F);
    let eight = _mm_set1_epi8(8);
    let mut tot = [_mm256_setzero_ps(); T];
    for (gi, &scale) in srow.iter().enumerate() {
        let mut acc = [[_mm256_setzero_ps(); 4]; T];
        for b in gi * per_group..(gi + 1) * per_group {
            // SAFETY: `blocks[b]` is 16 readable bytes (unaligned 128-bit load).
            let v = unsafe { _mm_loadu_si128(blocks[b].as_ptr().cast::<__m128i>()) };
            let lo = _mm_sub_epi8(_mm_and_si128(v, mask), eight);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(v), mask), eight);
            let w = [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo))),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(hi))),
            ];
            for t in 0..T {
                let xs = xb[t][b].as_chunks::<8>().0;
                for k in 0..4 {
                    acc[t][k] = _mm256_fmadd_ps(w[k], load8(&xs[k]), acc[t][k]);
                }
            }
        }
        let s = _mm256_set1_ps(scale);
        for t in 0..T {
            let a = &acc[t];
            let sum = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            tot[t] = _mm256_fmadd_ps(sum, s, tot[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum1(tot[t]);
    }
    out
}

/// The bytes and scales of row `r` of an int4 matrix.
pub(crate) fn int4_row<'a>(w: &MatrixView<'a>, r: usize, g: usize) -> (&'a [u8], &'a [f32]) {
    let stride = w.cols() / 2;
    let ng = w.cols() / g;
    (
        &w.data()[r * stride..(r + 1) * stride],
        &w.scales()[r * ng..(r + 1) * ng],
    )
}

/// The group size of an int4 matrix.
pub(crate) fn int4_group(w: &MatrixView<'_>) -> usize {
    match w.encoding() {
        Encoding::Int4 { group_size } => group_size as usize,
        _ => unreachable!("int4 fast path on a non-int4 matrix"),
    }
}

/// `y[i] = row (r0 + i) of w . x` on the int4 fast path; `xp` is `x` permuted by
/// [`int4_permute`].
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView::new`) and `int4_fast(w)`;
/// `xp.len() == cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn int4_matvec_rows(w: &MatrixView<'_>, xp: &[f32], r0: usize, y: &mut [f32]) {
    let g = int4_group(w);
    for (i, yo) in y.iter_mut().enumerate() {
        let (row, srow) = int4_row(w, r0 + i, g);
        // SAFETY: AVX2+FMA+F16C available (caller); lengths as `int4_fast` and the caller ensure.
        *yo = unsafe { int4_dot_tokens::<1>(row, srow, g, [xp]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` on the int4 fast path; `xp` is `X` (`[n, cols]`)
/// permuted by [`int4_permute`]. Up to [`INT4_TILE`] tokens per pass over a row.
///
/// # Safety
/// As [`int4_matvec_rows`]; `xp.len() == n * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn int4_matmul_rows(
    w: &MatrixView<'_>,
    xp: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let g = int4_group(w);
    let cols = w.cols();
    let xt = |t: usize| &xp[t * cols..(t + 1) * cols];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        let (row, srow) = int4_row(w, r0 + i, g);
        let mut t = 0;
        while t + INT4_TILE <= n {
            // SAFETY: as in `int4_matvec_rows`.
            let v = unsafe { int4_dot_tokens::<INT4_TILE>(row, srow, g, [xt(t), xt(t + 1)]) };
            yrow[t..t + INT4_TILE].copy_from_slice(&v);
            t += INT4_TILE;
        }
        if t < n {
            // SAFETY: as above.
            yrow[t] = unsafe { int4_dot_tokens::<1>(row, srow, g, [xt(t)]) }[0];
        }
    }
}

/// Twice the e2m1 values (`coli_format::encoding::mxfp4::E2M1_VALUES`) as i8, indexed by the
/// 4-bit code: every e2m1 value is a multiple of 0.5, so `2 v` is a small integer and the
/// MXFP4 fast paths fold the `1/2` into the block scale (`2^(e - 128)`, exact: a power of two).
pub(crate) const E2M1_TWICE: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Whether `w` takes the MXFP4 fast paths (AVX2 here, AVX-512 in `avx512.rs`): mxfp4 with
/// `cols` a multiple of the 32-column block (every published MXFP4 matrix).
pub(crate) fn mxfp4_fast(w: &MatrixView<'_>) -> bool {
    w.encoding() == Encoding::Mxfp4 && w.cols() > 0 && w.cols().is_multiple_of(MXFP4_BLOCK)
}

/// Half the block scale of e8m0 byte `e`: `2^(e - 128)`, exact for every `e` (2^-128 is an f32
/// subnormal; 255, the NaN code, never reaches a kernel: the store refuses it).
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    e8m0_to_f32(e) * 0.5
}

/// The bytes and e8m0 scales of row `r` of an mxfp4 matrix with `mxfp4_fast(w)`.
pub(crate) fn mxfp4_row<'a>(w: &MatrixView<'a>, r: usize) -> (&'a [u8], &'a [u8]) {
    let stride = w.cols() / 2;
    let nb = w.cols() / MXFP4_BLOCK;
    (
        &w.data()[r * stride..(r + 1) * stride],
        &w.e8m0_scales()[r * nb..(r + 1) * nb],
    )
}

/// Dot products of one mxfp4 row (`row`: `cols / 2` bytes; `srow`: its `cols / 32` e8m0
/// scales) with `T` tokens' permuted activations `xps[t]` (`cols` long, [`int4_permute`] with
/// blocks of 32), as the int4 fast path with a group of 32: per block `sum (2 v) x` over the
/// codes mapped by [`E2M1_TWICE`] (one byte shuffle per 16 codes), four 8-lane accumulators,
/// then `total = fma((a0 + a1) + (a2 + a3), 2^(e - 128), total)`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `row.len() * 2 == xps[t].len() == srow.len() * 32`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_dot_tokens<const T: usize>(row: &[u8], srow: &[u8], xps: [&[f32]; T]) -> [f32; T] {
    let blocks = row.as_chunks::<16>().0;
    let xb: [&[[f32; 32]]; T] = std::array::from_fn(|t| xps[t].as_chunks::<32>().0);
    let mask = _mm_set1_epi8(0x0F);
    // SAFETY: E2M1_TWICE is 16 readable bytes (unaligned 128-bit load).
    let lut = unsafe { _mm_loadu_si128(E2M1_TWICE.as_ptr().cast::<__m128i>()) };
    let mut tot = [_mm256_setzero_ps(); T];
    for (b, &e) in srow.iter().enumerate() {
        // SAFETY: `blocks[b]` is 16 readable bytes (unaligned 128-bit load).
        let v = unsafe { _mm_loadu_si128(blocks[b].as_ptr().cast::<__m128i>()) };
        let lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, mask));
        let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(v), mask));
        let w = [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(lo))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(hi))),
        ];
        let s = _mm256_set1_ps(e8m0_half(e));
        for t in 0..T {
            let xs = xb[t][b].as_chunks::<8>().0;
            let a01 = _mm256_fmadd_ps(w[1], load8(&xs[1]), _mm256_mul_ps(w[0], load8(&xs[0])));
            let a23 = _mm256_fmadd_ps(w[3], load8(&xs[3]), _mm256_mul_ps(w[2], load8(&xs[2])));
            tot[t] = _mm256_fmadd_ps(_mm256_add_ps(a01, a23), s, tot[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum1(tot[t]);
    }
    out
}

/// `y[i] = row (r0 + i) of w . x` on the MXFP4 fast path; `xp` is `x` permuted by
/// [`int4_permute`] with blocks of 32.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView`) and
/// `mxfp4_fast(w)`; `xp.len() == cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_matvec_rows(w: &MatrixView<'_>, xp: &[f32], r0: usize, y: &mut [f32]) {
    for (i, yo) in y.iter_mut().enumerate() {
        let (row, srow) = mxfp4_row(w, r0 + i);
        // SAFETY: AVX2+FMA+F16C available (caller); lengths as `mxfp4_fast` and the caller ensure.
        *yo = unsafe { mxfp4_dot_tokens::<1>(row, srow, [xp]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` on the MXFP4 fast path; `xp` is `X` (`[n, cols]`)
/// permuted by [`int4_permute`] with blocks of 32. Up to [`INT4_TILE`] tokens per pass.
///
/// # Safety
/// As [`mxfp4_matvec_rows`]; `xp.len() == n * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_matmul_rows(
    w: &MatrixView<'_>,
    xp: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let xt = |t: usize| &xp[t * cols..(t + 1) * cols];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        let (row, srow) = mxfp4_row(w, r0 + i);
        let mut t = 0;
        while t + INT4_TILE <= n {
            // SAFETY: as in `mxfp4_matvec_rows`.
            let v = unsafe { mxfp4_dot_tokens::<INT4_TILE>(row, srow, [xt(t), xt(t + 1)]) };
            yrow[t..t + INT4_TILE].copy_from_slice(&v);
            t += INT4_TILE;
        }
        if t < n {
            // SAFETY: as above.
            yrow[t] = unsafe { mxfp4_dot_tokens::<1>(row, srow, [xt(t)]) }[0];
        }
    }
}

/// Row `r` of an fp8 matrix decoded into `out` (`cols` values) through float16 as the fp8
/// products decode it ([`fp8x8`]); the columns past the last full 8-column chunk of each block
/// use the reference lookup table. Equal to the reference for every code whose product with
/// its block scale is finite and every scale below 2^119 in magnitude; the caller re-decodes a
/// row with a non-finite output with the reference.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` is an fp8 matrix (sections checked by
/// `MatrixView::new`), `r < rows`, `out.len() == cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fp8_dequantize_row(w: &MatrixView<'_>, r: usize, out: &mut [f32]) {
    debug_assert_eq!(w.encoding(), Encoding::Fp8);
    let lut = &*coli_format::encoding::fp8::FP8_LUT;
    let cols = w.cols();
    let row = &w.data()[r * cols..(r + 1) * cols];
    let bcols = cols.div_ceil(FP8_BLOCK);
    let srow = &w.scales()[(r / FP8_BLOCK) * bcols..(r / FP8_BLOCK + 1) * bcols];
    for ((o, b), &s) in out
        .chunks_mut(FP8_BLOCK)
        .zip(row.chunks(FP8_BLOCK))
        .zip(srow)
    {
        let s256 = _mm256_set1_ps(s * 256.0);
        let n8 = b.len() / 8;
        for k in 0..n8 {
            let v = fp8x8(b, k, s256);
            // SAFETY: (k + 1) * 8 <= b.len() == o.len(): 8 writable f32 (unaligned store).
            unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(k * 8), v) };
        }
        for (oo, &bb) in o[n8 * 8..].iter_mut().zip(&b[n8 * 8..]) {
            *oo = lut[bb as usize] * s;
        }
    }
}
