//! AVX2 + FMA (+ F16C) kernels (x86-64 only; selected at run time by `lib.rs`).
//!
//! A row is consumed in chunks of 8 columns. Each chunk is decoded to one `__m256` of f32
//! weights (exactly the reference value `code * scale`, one f32 rounding, as
//! `MatrixView::dequantize_row`), then multiplied into the token's accumulators with FMA.
//! Summation order per token (fixed, independent of threads and of how many tokens share a
//! pass): chunk `c` goes into accumulator `c % 4`; the last partial chunk (`cols % 8` columns,
//! zero padded) goes into accumulator `(cols / 8) % 4`; the four accumulators are combined as
//! `(a0 + a1) + (a2 + a3)`, then the 8 lanes are summed pairwise (`hsum`).
//!
//! `matvec_rows` decodes on the fly (fused); `matmul_rows` decodes each row once into a buffer
//! with the same decoders and runs up to 3 tokens per pass over it. Both feed the accumulators
//! the same values in the same order, so their results are bit-identical.

use std::arch::x86_64::*;

use coli_store::encoding::FP8_BLOCK;
use coli_store::{Encoding, MatrixView};

use crate::scalar::decode_cols;

/// Tokens per pass in `matmul_rows` (3 tokens x 4 accumulators = 12 of the 16 ymm registers).
const TILE: usize = 3;

/// A sequential source of decoded weight chunks (8 f32 each) of one row.
trait Chunks {
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
    let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
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
    let rem = nfull % 4;
    for k in 0..4 {
        if k < rem {
            let c = groups * 4 + k;
            // SAFETY: as above; c < nfull.
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
struct Bf16Src<'a> {
    cur: Cursor<'a>,
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
struct Fp8Src<'a> {
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
fn fp8_to_f16_bits_x16(x: __m256i) -> __m256i {
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

/// int8 weights: sign-extend, convert, times the row scale.
struct Int8Src<'a> {
    cur: Cursor<'a>,
    scale: __m256,
}

/// 8 int8 codes (bytes `k * 8..k * 8 + 8`) times `scale`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn int8x8(b: &[u8], k: usize, scale: __m256) -> __m256 {
    let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load_u8x8(b, k)));
    _mm256_mul_ps(q, scale)
}

impl Chunks for Int8Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        int8x8(self.cur.take::<8>(), 0, self.scale)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        let b = self.cur.take::<32>();
        let s = self.scale;
        [
            int8x8(b, 0, s),
            int8x8(b, 1, s),
            int8x8(b, 2, s),
            int8x8(b, 3, s),
        ]
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

/// The last `cols % 8` weights of row `r`, zero padded, or `None` when `cols % 8 == 0`.
fn tail_weights(w: &MatrixView<'_>, r: usize) -> Option<[f32; 8]> {
    let c0 = w.cols / 8 * 8;
    (c0 < w.cols).then(|| {
        let mut t = [0f32; 8];
        decode_cols(w, r, c0, w.cols, &mut t);
        t
    })
}

/// Runs `$body` with `$src` bound to the chunk source of row `$r` of `$w` (a macro rather than
/// a closure so that the source type stays concrete and inlines).
macro_rules! with_src {
    ($w:expr, $r:expr, |$src:ident| $body:expr) => {{
        let w: &MatrixView<'_> = $w;
        let r: usize = $r;
        let cols = w.cols;
        let nfull = cols / 8;
        match w.encoding {
            Encoding::F32 => {
                let row = &w.data[r * cols * 4..(r + 1) * cols * 4];
                let $src = &mut F32Src {
                    cur: Cursor::new(&row[..nfull * 32]),
                };
                $body
            }
            Encoding::Bf16 => {
                let row = &w.data[r * cols * 2..(r + 1) * cols * 2];
                let $src = &mut Bf16Src {
                    cur: Cursor::new(&row[..nfull * 16]),
                };
                $body
            }
            Encoding::Fp8 => {
                let row = &w.data[r * cols..(r + 1) * cols];
                let bcols = cols.div_ceil(FP8_BLOCK);
                let br = r / FP8_BLOCK;
                let $src = &mut Fp8Src {
                    cur: Cursor::new(&row[..nfull * 8]),
                    srow: &w.scales[br * bcols..(br + 1) * bcols],
                    c: 0,
                };
                $body
            }
            Encoding::Int8 => {
                let row = &w.data[r * cols..(r + 1) * cols];
                let $src = &mut Int8Src {
                    cur: Cursor::new(&row[..nfull * 8]),
                    scale: _mm256_set1_ps(w.scales[r]),
                };
                $body
            }
            Encoding::Int4 { group_size } => {
                let g = group_size as usize;
                let stride = cols.div_ceil(2);
                // Full chunks cover bytes [0, nfull * 4), all inside the row.
                let row = &w.data[r * stride..r * stride + nfull * 4];
                let ng = cols.div_ceil(g);
                let srow = &w.scales[r * ng..(r + 1) * ng];
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
        }
    }};
}

/// `y[i] = row (r0 + i) of w . x` (`x.len() == cols`), decoding on the fly.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` was validated (section lengths) by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    let nfull = w.cols / 8;
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let tail = tail_weights(w, r);
        let v = with_src!(w, r, |src| {
            // SAFETY: AVX2+FMA+F16C available (caller); each source has exactly `nfull` full chunks.
            unsafe { dot_tokens::<1, _>(src, nfull, tail.as_ref(), [x]) }
        });
        *yo = v[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for this chunk's rows (`yt.len() / n` of them).
/// Each row is decoded once into a buffer, then dotted with up to [`TILE`] tokens per pass.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `w` was validated by the caller; `x.len() == n * cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_rows(
    w: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols;
    let nfull = cols / 8;
    let mut buf = vec![[0f32; 8]; nfull];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        let r = r0 + i;
        with_src!(w, r, |src| {
            // Same call pattern as `dot_tokens` (next4 per 4 chunks, then next).
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
        let tail = tail_weights(w, r);
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
            yrow[t..t + TILE].copy_from_slice(&v);
            t += TILE;
        }
        while t < n {
            let src = &mut BufSrc {
                chunks: &buf,
                pos: 0,
            };
            // SAFETY: as above.
            let v = unsafe { dot_tokens::<1, _>(src, nfull, tail.as_ref(), [xt(t)]) };
            yrow[t] = v[0];
            t += 1;
        }
    }
}
