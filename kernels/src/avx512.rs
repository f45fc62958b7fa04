//! AVX-512 kernels for int4, int8 and mxfp4 (x86-64 with AVX-512F; selected at run time by
//! `lib.rs` as [`crate::Isa::Avx512`], which runs the AVX2 kernels for every other product).
//!
//! The AVX2 int4 fast path (see `avx2.rs`) with 16-lane vectors and 64-column blocks: a block is
//! 32 bytes; its 32 low nibbles (the even columns) and 32 high nibbles (the odd columns) are
//! split with two byte-wide ops, `- 8` is applied on the bytes, and the four runs of 16 codes
//! are widened to f32. The activations are permuted once per product into the same order
//! (`avx2::int4_permute` with a block of 64). Per token, within a group, run `k` of each block
//! goes into accumulator `k`; at the group's end `total = fma((a0 + a1) + (a2 + a3), scale,
//! total)`; the 16 lanes of the total are summed as `hsum1(low 8 + high 8)`. Used for group
//! sizes that are multiples of 64 dividing `cols` (the default int4-g64, and g128).

use std::arch::x86_64::*;

use coli_format::{Encoding, MatrixView};

use crate::avx2::{e8m0_half, hsum1, int4_group, int4_row, mxfp4_row, E2M1_TWICE};

/// Tokens per pass of `int4_matmul_rows`.
const TILE: usize = 3;

/// Whether `w` takes the AVX-512 int4 path: int4 with a group size that is a multiple of 64 and
/// divides `cols`.
pub(crate) fn int4_fast(w: &MatrixView<'_>) -> bool {
    match w.encoding() {
        Encoding::Int4 { group_size } => {
            let g = group_size as usize;
            g >= 64 && g.is_multiple_of(64) && w.cols() > 0 && w.cols().is_multiple_of(g)
        }
        _ => false,
    }
}

/// Sums the 16 lanes of `a`: the two 8-lane halves added, then pairwise as `avx2::hsum1`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn hsum16(a: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(a);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
    hsum1(_mm256_add_ps(lo, hi))
}

/// Dot products of one int4 row (`row`: `cols / 2` bytes; `srow`: `cols / g` scales) with `T`
/// tokens' permuted activations (`cols` each, blocks of 64).
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `g % 64 == 0`; `row.len() * 2 == xps[t].len()
/// == srow.len() * g`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn int4_dot_tokens<const T: usize>(
    row: &[u8],
    srow: &[f32],
    g: usize,
    xps: [&[f32]; T],
) -> [f32; T] {
    let per_group = g / 64;
    let blocks = row.as_chunks::<32>().0;
    let xb: [&[[f32; 64]]; T] = std::array::from_fn(|t| xps[t].as_chunks::<64>().0);
    let mask = _mm256_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    let mut tot = [_mm512_setzero_ps(); T];
    for (gi, &scale) in srow.iter().enumerate() {
        let mut acc = [[_mm512_setzero_ps(); 4]; T];
        for b in gi * per_group..(gi + 1) * per_group {
            // SAFETY: `blocks[b]` is 32 readable bytes (unaligned 256-bit load).
            let v = unsafe { _mm256_loadu_si256(blocks[b].as_ptr().cast::<__m256i>()) };
            let lo = _mm256_sub_epi8(_mm256_and_si256(v, mask), eight);
            let hi = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16::<4>(v), mask), eight);
            let w = [
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(lo))),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(lo))),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(hi))),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256::<1>(hi))),
            ];
            for t in 0..T {
                let xs = xb[t][b].as_chunks::<16>().0;
                for k in 0..4 {
                    // SAFETY: `xs[k]` is 16 readable f32 (unaligned 512-bit load).
                    let xv = unsafe { _mm512_loadu_ps(xs[k].as_ptr()) };
                    acc[t][k] = _mm512_fmadd_ps(w[k], xv, acc[t][k]);
                }
            }
        }
        let s = _mm512_set1_ps(scale);
        for t in 0..T {
            let a = &acc[t];
            let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            tot[t] = _mm512_fmadd_ps(sum, s, tot[t]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum16(tot[t]);
    }
    out
}

/// `y[i] = row (r0 + i) of w . x`; `xp` is `x` permuted in blocks of 64.
///
/// # Safety
/// The CPU supports AVX-512F, AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView::new`) and
/// `int4_fast(w)`; `xp.len() == cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn int4_matvec_rows(w: &MatrixView<'_>, xp: &[f32], r0: usize, y: &mut [f32]) {
    let g = int4_group(w);
    for (i, yo) in y.iter_mut().enumerate() {
        let (row, srow) = int4_row(w, r0 + i, g);
        // SAFETY: features available (caller); lengths as `int4_fast` and the caller ensure.
        *yo = unsafe { int4_dot_tokens::<1>(row, srow, g, [xp]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]`; `xp` is `X` (`[n, cols]`) permuted in blocks of
/// 64. Up to [`TILE`] tokens per pass over a row.
///
/// # Safety
/// As [`int4_matvec_rows`]; `xp.len() == n * cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
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
        while t + TILE <= n {
            // SAFETY: as in `int4_matvec_rows`.
            let v = unsafe { int4_dot_tokens::<TILE>(row, srow, g, [xt(t), xt(t + 1), xt(t + 2)]) };
            yrow[t..t + TILE].copy_from_slice(&v);
            t += TILE;
        }
        while t < n {
            // SAFETY: as above.
            yrow[t] = unsafe { int4_dot_tokens::<1>(row, srow, g, [xt(t)]) }[0];
            t += 1;
        }
    }
}

/// Whether `w` takes the AVX-512 int8 path: int8 with `cols` a multiple of 64.
pub(crate) fn int8_fast(w: &MatrixView<'_>) -> bool {
    w.encoding() == Encoding::Int8 && w.cols() > 0 && w.cols().is_multiple_of(64)
}

/// Dot products of one int8 row (`row`: `cols` codes, `cols % 64 == 0`) with `T` tokens'
/// activations, times the row scale: 16-column chunk `c` into accumulator `c % 4`, combined
/// as `(a0 + a1) + (a2 + a3)`, lanes summed by [`hsum16`], then multiplied by `scale` (the
/// reference `sum (q s) x` up to f32 rounding, as the AVX2 int8 kernel).
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `row.len() == xs[t].len()`, a multiple of 64.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn int8_dot_tokens<const T: usize>(row: &[u8], scale: f32, xs: [&[f32]; T]) -> [f32; T] {
    let blocks = row.as_chunks::<64>().0;
    let xb: [&[[f32; 64]]; T] = std::array::from_fn(|t| xs[t].as_chunks::<64>().0);
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    for (b, block) in blocks.iter().enumerate() {
        let codes = block.as_chunks::<16>().0;
        let mut w = [_mm512_setzero_ps(); 4];
        for k in 0..4 {
            // SAFETY: `codes[k]` is 16 readable bytes (unaligned 128-bit load).
            let q = unsafe { _mm_loadu_si128(codes[k].as_ptr().cast::<__m128i>()) };
            w[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        }
        for t in 0..T {
            let xv = xb[t][b].as_chunks::<16>().0;
            for k in 0..4 {
                // SAFETY: `xv[k]` is 16 readable f32 (unaligned 512-bit load).
                let x = unsafe { _mm512_loadu_ps(xv[k].as_ptr()) };
                acc[t][k] = _mm512_fmadd_ps(w[k], x, acc[t][k]);
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let a = &acc[t];
        let sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        out[t] = hsum16(sum) * scale;
    }
    out
}

/// `y[i] = row (r0 + i) of w . x` for an int8 matrix with `int8_fast(w)`.
///
/// # Safety
/// The CPU supports AVX-512F, AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView::new`) and
/// `int8_fast(w)`; `x.len() == cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn int8_matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    let cols = w.cols();
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let row = &w.data()[r * cols..(r + 1) * cols];
        // SAFETY: features available (caller); `row` and `x` are `cols` long, a multiple of 64.
        *yo = unsafe { int8_dot_tokens::<1>(row, w.scales()[r], [x]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for an int8 matrix with `int8_fast(w)`; up to
/// [`TILE`] tokens per pass over a row.
///
/// # Safety
/// As [`int8_matvec_rows`]; `x.len() == n * cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn int8_matmul_rows(
    w: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let xt = |t: usize| &x[t * cols..(t + 1) * cols];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        let r = r0 + i;
        let row = &w.data()[r * cols..(r + 1) * cols];
        let s = w.scales()[r];
        let mut t = 0;
        while t + TILE <= n {
            // SAFETY: as in `int8_matvec_rows`.
            let v = unsafe { int8_dot_tokens::<TILE>(row, s, [xt(t), xt(t + 1), xt(t + 2)]) };
            yrow[t..t + TILE].copy_from_slice(&v);
            t += TILE;
        }
        while t < n {
            // SAFETY: as above.
            yrow[t] = unsafe { int8_dot_tokens::<1>(row, s, [xt(t)]) }[0];
            t += 1;
        }
    }
}

/// The 32 codes of one mxfp4 block (16 bytes) as `2 v` in f32: the even columns (low nibbles)
/// then the odd columns (high nibbles), mapped by [`E2M1_TWICE`] with one byte shuffle each.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn mxfp4_block(block: &[u8; 16], lut: __m128i) -> [__m512; 2] {
    let mask = _mm_set1_epi8(0x0F);
    // SAFETY: `block` is 16 readable bytes (unaligned 128-bit load).
    let v = unsafe { _mm_loadu_si128(block.as_ptr().cast::<__m128i>()) };
    let lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, mask));
    let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16::<4>(v), mask));
    [
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)),
    ]
}

/// Dot products of one mxfp4 row (`row`: `cols / 2` bytes; `srow`: its `cols / 32` e8m0
/// scales) with `T` tokens' activations permuted in blocks of 32 (`avx2::int4_permute`): per
/// block `fma(w_odd, x_odd, w_even * x_even)` over the codes as `2 v`, then
/// `total = fma(sum, 2^(e - 128), total)`, even blocks into one total and odd blocks into
/// another (two independent FMA chains), lanes summed by [`hsum16`] of `total0 + total1`.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `row.len() * 2 == xps[t].len() == srow.len() *
/// 32`.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn mxfp4_dot_tokens<const T: usize>(row: &[u8], srow: &[u8], xps: [&[f32]; T]) -> [f32; T] {
    let blocks = row.as_chunks::<16>().0;
    let xb: [&[[f32; 32]]; T] = std::array::from_fn(|t| xps[t].as_chunks::<32>().0);
    // SAFETY: E2M1_TWICE is 16 readable bytes (unaligned 128-bit load).
    let lut = unsafe { _mm_loadu_si128(E2M1_TWICE.as_ptr().cast::<__m128i>()) };
    let mut tot = [[_mm512_setzero_ps(); 2]; T];
    for (b, &e) in srow.iter().enumerate() {
        let w = mxfp4_block(&blocks[b], lut);
        let s = _mm512_set1_ps(e8m0_half(e));
        for t in 0..T {
            let xs = xb[t][b].as_chunks::<16>().0;
            // SAFETY: `xs[0]` and `xs[1]` are 16 readable f32 each (unaligned 512-bit loads).
            let (xe, xo) = unsafe {
                (
                    _mm512_loadu_ps(xs[0].as_ptr()),
                    _mm512_loadu_ps(xs[1].as_ptr()),
                )
            };
            let sum = _mm512_fmadd_ps(w[1], xo, _mm512_mul_ps(w[0], xe));
            tot[t][b % 2] = _mm512_fmadd_ps(sum, s, tot[t][b % 2]);
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        out[t] = hsum16(_mm512_add_ps(tot[t][0], tot[t][1]));
    }
    out
}

/// `y[i] = row (r0 + i) of w . x` for an mxfp4 matrix with `avx2::mxfp4_fast(w)`; `xp` is `x`
/// permuted in blocks of 32.
///
/// # Safety
/// The CPU supports AVX-512F, AVX2, FMA and F16C; `w`'s sections are checked (`MatrixView`)
/// and `mxfp4_fast(w)`; `xp.len() == cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_matvec_rows(w: &MatrixView<'_>, xp: &[f32], r0: usize, y: &mut [f32]) {
    for (i, yo) in y.iter_mut().enumerate() {
        let (row, srow) = mxfp4_row(w, r0 + i);
        // SAFETY: features available (caller); lengths as `mxfp4_fast` and the caller ensure.
        *yo = unsafe { mxfp4_dot_tokens::<1>(row, srow, [xp]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for an mxfp4 matrix with `mxfp4_fast(w)`; `xp`
/// is `X` (`[n, cols]`) permuted in blocks of 32. Up to [`TILE`] tokens per pass over a row.
///
/// # Safety
/// As [`mxfp4_matvec_rows`]; `xp.len() == n * cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
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
        while t + TILE <= n {
            // SAFETY: as in `mxfp4_matvec_rows`.
            let v = unsafe { mxfp4_dot_tokens::<TILE>(row, srow, [xt(t), xt(t + 1), xt(t + 2)]) };
            yrow[t..t + TILE].copy_from_slice(&v);
            t += TILE;
        }
        while t < n {
            // SAFETY: as above.
            yrow[t] = unsafe { mxfp4_dot_tokens::<1>(row, srow, [xt(t)]) }[0];
            t += 1;
        }
    }
}
