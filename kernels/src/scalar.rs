//! Portable kernels (the scalar twins of the AVX2 kernels, and the fallback on other CPUs).
//!
//! A row is first decoded to f32 by the encoding's reference decoder in `coli_format` (one f32
//! rounding of `code * scale`), then dotted with each token's activations with
//! [`dot_lanes`]. Matrix-vector and matrix-matrix products run the very same two steps, so a
//! row of `matmul` is bit-identical to `matvec`.

#![forbid(unsafe_code)]

use coli_format::MatrixView;

/// Decodes columns `c0..c1` of row `r` of `w` into `out[..c1 - c0]` with the encoding's
/// reference decoder (`coli_format::encoding`, FORMAT.md section 6).
pub(crate) fn decode_cols(w: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
    w.decode_cols(r, c0, c1, out);
}

/// Dot product with a fixed summation order: eight running sums, lane `j` taking elements
/// `j, j + 8, j + 16, ...` (products rounded, then added: no fused multiply-add), combined as
/// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
///
/// Uses the first `min(a.len(), b.len())` elements.
#[inline]
pub(crate) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ac, at) = a[..n].as_chunks::<8>();
    let (bc, bt) = b[..n].as_chunks::<8>();
    let mut s = [0f32; 8];
    for (x, y) in ac.iter().zip(bc) {
        for j in 0..8 {
            s[j] += x[j] * y[j];
        }
    }
    for (j, (x, y)) in at.iter().zip(bt).enumerate() {
        s[j] += x * y;
    }
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// `y[i] = row (r0 + i) of w . x` for every `i < y.len()`.
pub(crate) fn matvec_rows(w: &MatrixView<'_>, x: &[f32], r0: usize, y: &mut [f32]) {
    let mut buf = vec![0f32; w.cols()];
    for (i, yo) in y.iter_mut().enumerate() {
        decode_cols(w, r0 + i, 0, w.cols(), &mut buf);
        *yo = dot_lanes(&buf, x);
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for the rows of this chunk (`yt.len() / n` rows).
/// Each row is decoded once for all `n` tokens.
pub(crate) fn matmul_rows(w: &MatrixView<'_>, x: &[f32], n: usize, r0: usize, yt: &mut [f32]) {
    let cols = w.cols();
    let mut buf = vec![0f32; cols];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        decode_cols(w, r0 + i, 0, cols, &mut buf);
        for (t, yo) in yrow.iter_mut().enumerate() {
            *yo = dot_lanes(&buf, &x[t * cols..(t + 1) * cols]);
        }
    }
}
