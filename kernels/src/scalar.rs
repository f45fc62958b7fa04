//! Portable kernels (the scalar twins of the AVX2 kernels, and the fallback on other CPUs).
//!
//! A row is first decoded to f32 (each weight exactly as `MatrixView::dequantize_row` decodes
//! it: one f32 rounding of `code * scale`), then dotted with each token's activations with
//! [`dot_lanes`]. Matrix-vector and matrix-matrix products run the very same two steps, so a
//! row of `matmul` is bit-identical to `matvec`.

#![forbid(unsafe_code)]

use std::sync::LazyLock;

use coli_store::encoding::{bf16_to_f32, fp8_e4m3_to_f32, FP8_BLOCK};
use coli_store::{Encoding, MatrixView};

/// Every float8 e4m3fn code decoded to f32 (index = the byte), built from the store's
/// reference decoder `fp8_e4m3_to_f32`.
pub(crate) static FP8_LUT: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| fp8_e4m3_to_f32(b as u8)));

/// Decodes columns `c0..c1` of row `r` of `w` into `out[..c1 - c0]`, exactly as
/// `MatrixView::dequantize_row` (FORMAT.md section 6) does.
///
/// The caller has checked the section lengths (`validate` in lib.rs); `c0 <= c1 <= cols`.
pub(crate) fn decode_cols(w: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
    let cols = w.cols;
    let out = &mut out[..c1 - c0];
    match w.encoding {
        Encoding::F32 => {
            let row = &w.data[(r * cols + c0) * 4..(r * cols + c1) * 4];
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Encoding::Bf16 => {
            let row = &w.data[(r * cols + c0) * 2..(r * cols + c1) * 2];
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Encoding::Fp8 => {
            let lut = &*FP8_LUT;
            let row = &w.data[r * cols..(r + 1) * cols];
            let bcols = cols.div_ceil(FP8_BLOCK);
            let srow = &w.scales[(r / FP8_BLOCK) * bcols..(r / FP8_BLOCK + 1) * bcols];
            let mut c = c0;
            while c < c1 {
                let blk = c / FP8_BLOCK;
                let end = c1.min((blk + 1) * FP8_BLOCK);
                let s = srow[blk];
                for (o, &b) in out[c - c0..end - c0].iter_mut().zip(&row[c..end]) {
                    *o = lut[b as usize] * s;
                }
                c = end;
            }
        }
        Encoding::Int8 => {
            let row = &w.data[r * cols + c0..r * cols + c1];
            let s = w.scales[r];
            for (o, &q) in out.iter_mut().zip(row) {
                *o = (q as i8) as f32 * s;
            }
        }
        Encoding::Int4 { group_size } => {
            let g = group_size as usize;
            let stride = cols.div_ceil(2);
            let row = &w.data[r * stride..(r + 1) * stride];
            let ng = cols.div_ceil(g);
            let srow = &w.scales[r * ng..(r + 1) * ng];
            let mut c = c0;
            while c < c1 {
                let gi = c / g;
                let end = c1.min((gi + 1) * g);
                let s = srow[gi];
                let mut col = c;
                if col % 2 == 1 {
                    // Odd start (only for an odd `c0`): the high nibble of its byte.
                    out[col - c0] = ((row[col / 2] >> 4) as i32 - 8) as f32 * s;
                    col += 1;
                }
                // Even start: whole bytes, low nibble = even column (the last high nibble may
                // be beyond `end`).
                let bytes = &row[col / 2..end.div_ceil(2)];
                for (o2, &byte) in out[col - c0..end - c0].chunks_mut(2).zip(bytes) {
                    o2[0] = ((byte & 0x0F) as i32 - 8) as f32 * s;
                    if let Some(h) = o2.get_mut(1) {
                        *h = ((byte >> 4) as i32 - 8) as f32 * s;
                    }
                }
                c = end;
            }
        }
    }
}

/// Dot product with a fixed summation order: eight running sums, lane `j` taking elements
/// `j, j + 8, j + 16, ...` (products rounded, then added: no fused multiply-add), combined as
/// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`.
///
/// Uses the first `min(a.len(), b.len())` elements.
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
    let mut buf = vec![0f32; w.cols];
    for (i, yo) in y.iter_mut().enumerate() {
        decode_cols(w, r0 + i, 0, w.cols, &mut buf);
        *yo = dot_lanes(&buf, x);
    }
}

/// `yt[i * n + t] = row (r0 + i) of w . X[t]` for the rows of this chunk (`yt.len() / n` rows).
/// Each row is decoded once for all `n` tokens.
pub(crate) fn matmul_rows(w: &MatrixView<'_>, x: &[f32], n: usize, r0: usize, yt: &mut [f32]) {
    let cols = w.cols;
    let mut buf = vec![0f32; cols];
    for (i, yrow) in yt.chunks_exact_mut(n).enumerate() {
        decode_cols(w, r0 + i, 0, cols, &mut buf);
        for (t, yo) in yrow.iter_mut().enumerate() {
            *yo = dot_lanes(&buf, &x[t * cols..(t + 1) * cols]);
        }
    }
}
