//! Encoding id 4, `int8`: one signed byte per weight (two's complement) with one f32 scale per
//! row, `w[r][c] = q[r][c] * scale[r]`. Encoding: `s = max(absmax / 127, 1e-8)`,
//! `q = clip(round_half_even(w / s), -128, 127)`.

use super::{rne_small, Codec, ErrSums, MIN_SCALE};
use crate::MatrixView;

/// The `int8` codec.
#[derive(Clone, Copy, Debug)]
pub struct Int8;

/// int8 code of `x` with scale `s`: `clip(round_half_even(x / s), -128, 127)` (f32 division).
#[inline]
pub fn int8_q(x: f32, s: f32) -> i8 {
    rne_small((x / s).clamp(-129.0, 128.0)).clamp(-128.0, 127.0) as i8
}

impl Codec for Int8 {
    fn id(&self) -> u16 {
        4
    }
    fn group_size_field(&self) -> u16 {
        0
    }
    fn name(&self) -> String {
        "int8".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols
    }
    fn scale_count(&self, rows: usize, _cols: usize) -> usize {
        rows
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let cols = m.cols();
        let row = &m.data()[r * cols + c0..r * cols + c1];
        let s = m.scales()[r];
        for (o, &q) in out.iter_mut().zip(row) {
            *o = (q as i8) as f32 * s;
        }
    }
    /// One scale for the row; error sums in column order.
    fn encode_row(&self, w: &[f32], dst: &mut [u8], scales: &mut [f32]) -> Option<ErrSums> {
        let absmax = w.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let s = (absmax / 127.0).max(MIN_SCALE);
        scales[0] = s;
        let mut sums = ErrSums::default();
        for (d, &x) in dst.iter_mut().zip(w) {
            let q = int8_q(x, s);
            *d = q as u8;
            let err = (q as f32 * s) as f64 - x as f64;
            sums.err2 += err * err;
            sums.w2 += (x as f64) * (x as f64);
        }
        Some(sums)
    }
}
