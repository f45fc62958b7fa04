//! AVX-512 kernels for int4, int8, mxfp4, bf16, fp8 and mxfp8 (x86-64 with AVX-512F; selected at run time
//! by `lib.rs` as [`crate::Isa::Avx512`], which runs the AVX2 kernels for every other product).
//!
//! int4 (group sizes that are multiples of 64 dividing `cols`: the default int4-g64, and g128):
//! per group, a 16-entry table holds `(q - 8) * scale` for the codes `q` = 0..=15 (the reference
//! weights, one f32 rounding each, as `MatrixView::dequantize_row`); a 64-column block is 32
//! bytes, widened to 32-bit lanes 16 bytes at a time, and its four runs of 16 codes (the low
//! nibbles as they are, the high nibbles shifted down by 4) index the table with one `vpermps`
//! each, which reads only an index's low 4 bits. The activations
//! are permuted once per product into the same order (`avx2::int4_permute` with a block of
//! 64). Per token, run `k` of every block goes into accumulator `k` with one FMA; at the end
//! `hsum16((a0 + a1) + (a2 + a3))`. A run is decoded once for all the tokens of a tile.
//!
//! int8 and mxfp4 run as their AVX2 twins with 16-lane vectors (see their kernels); bf16, fp8
//! and mxfp8 hold the AVX2 kernel's accumulators in pairs and are bit-identical to it.
//!
//! The matmul kernels sweep a chunk of rows once per tile of tokens ([`tile_for`]), tiles
//! outermost, so a tile's activations stay in L1 while the rows stream past.

use std::arch::x86_64::*;

use coli_format::{Encoding, MatrixView};

use crate::avx2::{
    dot_tokens_finish, e8m0_half, fp8_to_f16_bits_x16, hsum1, int4_group, int4_row, mxfp4_row,
    tail_weights, Bf16Src, Fp8Src, Mxfp8Src, E2M1_TWICE,
};
use coli_format::encoding::mxfp4::e8m0_to_f32;
use coli_format::encoding::FP8_BLOCK;

/// Tokens per pass over a weight row in the matmul kernels (int4, int8, mxfp4): 6 tokens x 4
/// accumulators (int4, int8) or 2 (mxfp4) fit the 32 zmm registers beside the weights.
const TILE: usize = 6;

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
/// Each 16-code run `k` of a block is decoded once for all `T` tokens to the reference weights
/// `(q - 8) * scale` (one f32 rounding, as `MatrixView::dequantize_row`: a lookup in the group's
/// table of the 16 products, built with one multiply per group), then multiplied into
/// the token's accumulator `k` with one FMA: the per-token work is four FMAs per 64 columns,
/// which is what lets a pass over several tokens cost little more than one.
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
    let nblocks = row.len() / 32;
    // One length check per call keeps the loads below free of per-load bounds checks.
    assert!(
        srow.len() * per_group == nblocks && xps.iter().all(|x| x.len() >= nblocks * 64),
        "int4_dot_tokens: row, scales and activations disagree"
    );
    let wp = row.as_ptr();
    let xp: [*const f32; T] = std::array::from_fn(|t| xps[t].as_ptr());
    // `q - 8` for the codes 0..=15: times the group scale, the 16 reference weights of a group.
    let base = _mm512_setr_ps(
        -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
    );
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    for (gi, &scale) in srow.iter().enumerate() {
        let lut = _mm512_mul_ps(base, _mm512_set1_ps(scale));
        for b in gi * per_group..(gi + 1) * per_group {
            // SAFETY: block `b < nblocks` is the 32 bytes at `32 * b` of `row` (checked
            // above): two unaligned 128-bit loads.
            let (d0, d1) = unsafe {
                let p = wp.add(32 * b);
                (
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast::<__m128i>())),
                    _mm512_cvtepu8_epi32(_mm_loadu_si128(p.add(16).cast::<__m128i>())),
                )
            };
            // `vpermps` reads the low 4 bits of each index: the low nibbles as they are, the
            // high nibbles shifted down.
            let runs = [
                d0,
                d1,
                _mm512_srli_epi32::<4>(d0),
                _mm512_srli_epi32::<4>(d1),
            ];
            for k in 0..4 {
                let wk = _mm512_permutexvar_ps(runs[k], lut);
                for t in 0..T {
                    // SAFETY: token `t`'s block `b` is the 64 f32 at `64 * b` (checked
                    // above); run `k` is its 16 f32 at `16 * k` (unaligned 512-bit load).
                    let xv = unsafe { _mm512_loadu_ps(xp[t].add(64 * b + 16 * k)) };
                    acc[t][k] = _mm512_fmadd_ps(wk, xv, acc[t][k]);
                }
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let a = &acc[t];
        out[t] = hsum16(_mm512_add_ps(
            _mm512_add_ps(a[0], a[1]),
            _mm512_add_ps(a[2], a[3]),
        ));
    }
    out
}

/// Fills `$yt` (`[rows, n]`, row-major: `yt[i * n + t]`) with `$dot::<T>($($arg,)* [xt(t),
/// ..])` for every row `$i` (whose arguments `let $pat = $init;` binds) and token, in tiles
/// of up to `$tile` tokens (at most 8). Token tiles are the outer loop, so one tile's
/// activations stay in L1 while the chunk's rows stream past them (a row's weights are small;
/// eight tokens' activations of a 1536-column matrix are not). Every tile size computes a
/// token's result with the same operations in the same order, so the tiling never changes a
/// bit.
macro_rules! tiled_matmul {
    ($tile:expr, $n:expr, $xt:expr, $yt:expr,
     |$i:ident| let $pat:pat = $init:expr; $dot:ident($($arg:expr),*)) => {{
        let (n, xt, yt): (usize, _, &mut [f32]) = ($n, $xt, $yt);
        let nrows = yt.len() / n;
        let mut t = 0;
        while t < n {
            let m = (n - t).min($tile);
            debug_assert!(m <= 8, "tiled_matmul: tiles of at most 8 tokens");
            for $i in 0..nrows {
                let $pat = $init;
                let out = &mut yt[$i * n + t..$i * n + t + m];
                // SAFETY: forwarded from the caller of the enclosing function (features and
                // lengths); every `xt(t + j)` is one token's activations.
                unsafe {
                    match m {
                        1 => out.copy_from_slice(&$dot::<1>($($arg,)* [xt(t)])),
                        2 => out.copy_from_slice(&$dot::<2>($($arg,)* [xt(t), xt(t + 1)])),
                        3 => out.copy_from_slice(&$dot::<3>(
                            $($arg,)* [xt(t), xt(t + 1), xt(t + 2)]
                        )),
                        4 => out.copy_from_slice(&$dot::<4>(
                            $($arg,)* [xt(t), xt(t + 1), xt(t + 2), xt(t + 3)]
                        )),
                        5 => out.copy_from_slice(&$dot::<5>(
                            $($arg,)* [xt(t), xt(t + 1), xt(t + 2), xt(t + 3), xt(t + 4)]
                        )),
                        6 => out.copy_from_slice(&$dot::<6>(
                            $($arg,)*
                            [xt(t), xt(t + 1), xt(t + 2), xt(t + 3), xt(t + 4), xt(t + 5)]
                        )),
                        7 => out.copy_from_slice(&$dot::<7>(
                            $($arg,)*
                            [xt(t), xt(t + 1), xt(t + 2), xt(t + 3), xt(t + 4), xt(t + 5),
                             xt(t + 6)]
                        )),
                        _ => out.copy_from_slice(&$dot::<8>(
                            $($arg,)*
                            [xt(t), xt(t + 1), xt(t + 2), xt(t + 3), xt(t + 4), xt(t + 5),
                             xt(t + 6), xt(t + 7)]
                        )),
                    }
                }
            }
            t += m;
        }
    }};
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
    tiled_matmul!(tile_for(cols, TILE), n, xt, yt, |i| let (row, srow) = int4_row(w, r0 + i, g);
        int4_dot_tokens(row, srow, g));
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
    tiled_matmul!(TILE, n, xt, yt, |i| let (row, s) = (
            &w.data()[(r0 + i) * cols..(r0 + i + 1) * cols],
            w.scales()[r0 + i],
        );
        int8_dot_tokens(row, s));
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
    tiled_matmul!(TILE, n, xt, yt, |i| let (row, srow) = mxfp4_row(w, r0 + i);
        mxfp4_dot_tokens(row, srow));
}

/// Activation bytes one tile of tokens may span so that it stays in L1 while a chunk's rows
/// stream past it (48 KiB L1d on recent x86 cores; half of it for the activations).
const TILE_ACT_BYTES: usize = 24 << 10;

/// Tokens per tile for a matrix of `cols` columns: as many as [`TILE_ACT_BYTES`] holds, between
/// 1 and `max`. Speed only: every tile size gives the same bits.
fn tile_for(cols: usize, max: usize) -> usize {
    (TILE_ACT_BYTES / (cols.max(1) * 4)).clamp(1, max)
}

/// One group of 32 columns into the paired accumulators: weights `w` (columns `32 gi ..
/// 32 gi + 16`, then the next 16) times each token's activations there, fused-added to
/// `acc[t][0]` and `acc[t][1]` (AVX2's `[a0 | a1]` and `[a2 | a3]`).
///
/// # Safety
/// AVX-512F is available; every `xq[t]` points at `32 * gi + 32` readable f32.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn fma_pair<const T: usize>(
    acc: &mut [[__m512; 2]; T],
    w: [__m512; 2],
    xq: &[*const f32; T],
    gi: usize,
) {
    for h in 0..2 {
        for t in 0..T {
            // SAFETY: token `t`'s group `gi` is the 32 f32 at `32 * gi` (caller); half `h` is
            // 16 of them (unaligned 512-bit load).
            let xv = unsafe { _mm512_loadu_ps(xq[t].add(32 * gi + 16 * h)) };
            acc[t][h] = _mm512_fmadd_ps(w[h], xv, acc[t][h]);
        }
    }
}

/// AVX2's four 8-lane accumulators per token from the paired 16-lane ones
/// (`[a0 | a1]`, `[a2 | a3]`), for `avx2::dot_tokens_finish`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn unpair<const T: usize>(acc: [[__m512; 2]; T]) -> [[__m256; 4]; T] {
    let split = |a: __m512| {
        (
            _mm512_castps512_ps256(a),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))),
        )
    };
    std::array::from_fn(|t| {
        let (a0, a1) = split(acc[t][0]);
        let (a2, a3) = split(acc[t][1]);
        [a0, a1, a2, a3]
    })
}

/// Dot products of one bf16 row (`row`: `cols * 2` bytes) with `T` tokens, bit-identical to
/// the AVX2 kernels (`avx2::dot_tokens` over `Bf16Src`): AVX2's four 8-lane accumulators are
/// held as two 16-lane ones, `[a0 | a1]` and `[a2 | a3]`, so each 512-bit FMA does the work
/// of two 256-bit FMAs lane for lane (columns `32 i .. 32 i + 16` into the first, the next 16
/// into the second, each weight widened from bf16 by a 16-bit shift); the `nfull % 4`
/// remaining chunks, the zero-padded tail and the sums then run as `avx2::dot_tokens_finish`.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `row.len() == 2 * cols` and every `xs[t]` is
/// `cols` long.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn bf16_dot_tokens<const T: usize>(
    row: &[u8],
    wtail: Option<&[f32; 8]>,
    xs: [&[f32]; T],
) -> [f32; T] {
    let cols = row.len() / 2;
    let nfull = cols / 8;
    let groups = nfull / 4;
    // One length check per call keeps the loads below free of per-load bounds checks.
    assert!(
        xs.iter().all(|x| x.len() >= cols),
        "bf16_dot_tokens: row and activations disagree"
    );
    let xq: [*const f32; T] = std::array::from_fn(|t| xs[t].as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    for gi in 0..groups {
        // SAFETY: group `gi < cols / 32` is the 64 bytes (32 bf16) at `64 * gi` of `row`
        // (`2 * cols` bytes): two unaligned 256-bit loads.
        let (b0, b1) = unsafe {
            let wp = row.as_ptr().add(64 * gi).cast::<__m256i>();
            (_mm256_loadu_si256(wp), _mm256_loadu_si256(wp.add(1)))
        };
        let w = [
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b0))),
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b1))),
        ];
        // SAFETY: every `xq[t]` points at `cols >= 32 * gi + 32` f32 (checked above).
        unsafe { fma_pair(&mut acc, w, &xq, gi) };
    }
    let acc8 = unpair(acc);
    // The `nfull % 4` chunks after the groups, decoded as the AVX2 kernel decodes them.
    let src = &mut Bf16Src::new(&row[groups * 64..]);
    // SAFETY: features available (caller); `src` holds the `nfull % 4` chunks after the groups.
    unsafe { dot_tokens_finish(acc8, src, nfull, wtail, xs) }
}

/// 16 e4m3 codes (`b`, 16 bytes) as f32 times 2^-8 (their f16 bit patterns widened: exact),
/// the lanes of the AVX2 kernel's two `fp8x16` halves side by side.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn fp8x16_512(b: &[u8]) -> __m512 {
    // SAFETY: `b` is at least 16 readable bytes (unaligned 128-bit load; callers slice it).
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast::<__m128i>()) };
    _mm512_cvtph_ps(fp8_to_f16_bits_x16(_mm256_cvtepu8_epi16(v)))
}

/// Dot products of row `r` of an fp8 or mxfp8 matrix with `T` tokens, bit-identical to the
/// AVX2 kernels (`avx2::dot_tokens` over `Fp8Src` / `Mxfp8Src`): per group of 32 columns, two
/// 16-lane weight vectors decoded with the very operations of the AVX2 sources (e4m3 through
/// f16 times `256 * block scale` for fp8; times 256, then times the e8m0 scale, for mxfp8),
/// accumulated as `[a0 | a1]` and `[a2 | a3]` as [`bf16_dot_tokens`] does; the `nfull % 4`
/// remaining chunks, the tail and the sums as `avx2::dot_tokens_finish`.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C are available; `w` is fp8 or mxfp8 with checked sections; every
/// `xs[t]` is `cols` long.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn fp8_dot_tokens<const T: usize>(
    w: &MatrixView<'_>,
    r: usize,
    wtail: Option<&[f32; 8]>,
    xs: [&[f32]; T],
) -> [f32; T] {
    let cols = w.cols();
    let nfull = cols / 8;
    let groups = nfull / 4;
    assert!(
        xs.iter().all(|x| x.len() >= cols),
        "fp8_dot_tokens: row and activations disagree"
    );
    let mx = w.encoding() == Encoding::Mxfp8;
    let row = &w.data()[r * cols..(r + 1) * cols];
    // The row's scales: e8m0 bytes per 32 columns (mxfp8), or its block row's f32 scales per
    // 128 columns (fp8).
    let (e8m0, f32s): (&[u8], &[f32]) = if mx {
        let nb = cols.div_ceil(32);
        (&w.e8m0_scales()[r * nb..(r + 1) * nb], &[])
    } else {
        let bcols = cols.div_ceil(FP8_BLOCK);
        let br = r / FP8_BLOCK;
        (&[], &w.scales()[br * bcols..(br + 1) * bcols])
    };
    let k256 = _mm512_set1_ps(256.0);
    let xq: [*const f32; T] = std::array::from_fn(|t| xs[t].as_ptr());
    let mut acc = [[_mm512_setzero_ps(); 2]; T];
    for gi in 0..groups {
        let b = &row[32 * gi..32 * gi + 32];
        let (w0, w1) = (fp8x16_512(b), fp8x16_512(&b[16..]));
        let wv = if mx {
            let s = _mm512_set1_ps(e8m0_to_f32(e8m0[gi]));
            [
                _mm512_mul_ps(_mm512_mul_ps(w0, k256), s),
                _mm512_mul_ps(_mm512_mul_ps(w1, k256), s),
            ]
        } else {
            let s = _mm512_set1_ps(f32s[gi / 4] * 256.0);
            [_mm512_mul_ps(w0, s), _mm512_mul_ps(w1, s)]
        };
        // SAFETY: every `xq[t]` points at `cols >= 32 * gi + 32` f32 (checked above).
        unsafe { fma_pair(&mut acc, wv, &xq, gi) };
    }
    let acc8 = unpair(acc);
    // SAFETY: features available (caller); the sources hold the `nfull % 4` chunks after the
    // groups.
    unsafe {
        if mx {
            dot_tokens_finish(acc8, &mut Mxfp8Src::at(w, r, groups * 4), nfull, wtail, xs)
        } else {
            dot_tokens_finish(acc8, &mut Fp8Src::at(w, r, groups * 4), nfull, wtail, xs)
        }
    }
}

/// `y[i] = row (r0 + i) of w . x` for an fp8 or mxfp8 matrix ([`fp8_dot_tokens`], one token).
///
/// # Safety
/// The CPU supports AVX-512F, AVX2, FMA and F16C; `w` is fp8 or mxfp8 with checked sections;
/// `x.len() == cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn fp8_matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let tail = tail_weights(w, r);
        // SAFETY: features available (caller); `x` is `cols` long.
        *yo = unsafe { fp8_dot_tokens::<1>(w, r, tail.as_ref(), [x]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for an fp8 or mxfp8 matrix, in tiles of up to 8
/// tokens bounded by [`tile_for`]; bit-identical to [`fp8_matvec_rows`] and the AVX2 kernels.
///
/// # Safety
/// As [`fp8_matvec_rows`]; `x.len() == n * cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn fp8_matmul_rows(
    w: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let nrows = yt.len() / n;
    let tails: Vec<Option<[f32; 8]>> = (0..nrows).map(|i| tail_weights(w, r0 + i)).collect();
    let xt = |t: usize| &x[t * cols..(t + 1) * cols];
    tiled_matmul!(tile_for(cols, 8), n, xt, yt, |i| let (r, tail) = (r0 + i, tails[i].as_ref());
        fp8_dot_tokens(w, r, tail));
}

/// `y[i] = row (r0 + i) of w . x` for a bf16 matrix ([`bf16_dot_tokens`], one token).
///
/// # Safety
/// The CPU supports AVX-512F, AVX2, FMA and F16C; `w` is bf16 with checked sections
/// (`MatrixView::new`); `x.len() == cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn bf16_matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    let cols = w.cols();
    for (i, yo) in y.iter_mut().enumerate() {
        let r = r0 + i;
        let tail = tail_weights(w, r);
        let row = &w.data()[r * cols * 2..(r + 1) * cols * 2];
        // SAFETY: features available (caller); `row` is the row's `2 * cols` bytes.
        *yo = unsafe { bf16_dot_tokens::<1>(row, tail.as_ref(), [x]) }[0];
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for a bf16 matrix, in tiles of up to 8 tokens
/// (two accumulators each) bounded by [`tile_for`]; bit-identical to [`bf16_matvec_rows`] and
/// to the AVX2 kernels.
///
/// # Safety
/// As [`bf16_matvec_rows`]; `x.len() == n * cols`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn bf16_matmul_rows(
    w: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let nrows = yt.len() / n;
    let tails: Vec<Option<[f32; 8]>> = (0..nrows).map(|i| tail_weights(w, r0 + i)).collect();
    let xt = |t: usize| &x[t * cols..(t + 1) * cols];
    tiled_matmul!(tile_for(cols, 8), n, xt, yt, |i| let (row, tail) = (
            &w.data()[(r0 + i) * cols * 2..(r0 + i + 1) * cols * 2],
            tails[i].as_ref(),
        );
        bf16_dot_tokens(row, tail));
}
