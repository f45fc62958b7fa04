//! Encoding id 5, `int4-g{G}`: symmetric int4, two codes per byte, one f32 scale per group of
//! `G` consecutive columns of a row (the last group of a row is shorter when `G` does not divide
//! `cols`); scales `[rows, ceil(cols / G)]`. A weight is `(nibble - 8) * scale`; column `2j` is
//! the low nibble of byte `j` of its row, column `2j + 1` the high nibble; a row of odd `cols`
//! ends with a high nibble of 8 (q = 0). Rows are `ceil(cols / 2)` bytes.
//!
//! Encoding (the converter's, and colibri's so that quality figures compare): per group
//! `s = max(absmax / 7, 1e-8)`, `q = clip(round_half_even(w / s), -8, 7)`.

use super::{rne_small, Codec, ErrSums, MIN_SCALE};
use crate::MatrixView;

/// The `int4` codec with its group size.
#[derive(Clone, Copy, Debug)]
pub struct Int4 {
    /// Columns per scale group (even, at least 2).
    pub group_size: u16,
}

/// Number of f64 accumulator lanes of the int4 error sums (lane = column mod 8): a fixed
/// summation order that SIMD encoders can follow exactly.
pub const SUM_LANES: usize = 8;

/// int4 code of `x` with scale `s`: `clip(round_half_even(x / s), -8, 7)` (f32 division).
/// (Values are first limited to [-9, 8], which leaves the clipped result unchanged.)
#[inline]
pub fn int4_q(x: f32, s: f32) -> i8 {
    rne_small((x / s).clamp(-9.0, 8.0)).clamp(-8.0, 7.0) as i8
}

/// Adds the lane sums in lane order, starting from 0.
pub fn fold_lanes(l: &[f64; SUM_LANES]) -> f64 {
    l.iter().fold(0.0, |a, &b| a + b)
}

/// Quantizes the groups of row `w` from column `from` (a multiple of `g`) on: ORs nibbles into
/// `dst` (zeroed by the caller), writes the groups' scales, adds the error sums to the lanes
/// (`err2[c % 8]`, `w2[c % 8]`, in column order), and sets the odd-`cols` padding nibble.
/// A SIMD encoder may quantize the first groups itself and call this for the rest.
pub fn quantize_groups(
    w: &[f32],
    from: usize,
    g: usize,
    dst: &mut [u8],
    scales: &mut [f32],
    err2: &mut [f64; SUM_LANES],
    w2: &mut [f64; SUM_LANES],
) {
    for (gi, grp) in w[from..].chunks(g).enumerate() {
        let gi = gi + from / g;
        let absmax = grp.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let s = (absmax / 7.0).max(MIN_SCALE);
        scales[gi] = s;
        for (k, &x) in grp.iter().enumerate() {
            let c = gi * g + k;
            let q = int4_q(x, s);
            let nib = (q + 8) as u8;
            if c.is_multiple_of(2) {
                dst[c / 2] |= nib;
            } else {
                dst[c / 2] |= nib << 4;
            }
            let err = (q as f32 * s) as f64 - x as f64;
            err2[c % SUM_LANES] += err * err;
            w2[c % SUM_LANES] += (x as f64) * (x as f64);
        }
    }
    if w.len() % 2 == 1 {
        dst[w.len() / 2] |= 8 << 4;
    }
}

impl Codec for Int4 {
    fn id(&self) -> u16 {
        5
    }
    fn group_size_field(&self) -> u16 {
        self.group_size
    }
    fn name(&self) -> String {
        format!("int4-g{}", self.group_size)
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols.div_ceil(2)
    }
    fn scale_count(&self, rows: usize, cols: usize) -> usize {
        rows * cols.div_ceil(self.group_size as usize)
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let g = self.group_size as usize;
        let cols = m.cols();
        let stride = cols.div_ceil(2);
        let row = &m.data()[r * stride..(r + 1) * stride];
        let ng = cols.div_ceil(g);
        let srow = &m.scales()[r * ng..(r + 1) * ng];
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
            // Even start: whole bytes, low nibble = even column (the last high nibble may be
            // beyond `end`).
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
    /// Groups quantized in column order ([`quantize_groups`]); the error sums are accumulated
    /// in [`SUM_LANES`] lanes and folded in lane order ([`fold_lanes`]).
    fn encode_row(&self, w: &[f32], dst: &mut [u8], scales: &mut [f32]) -> Option<ErrSums> {
        let (mut e2, mut w2) = ([0f64; SUM_LANES], [0f64; SUM_LANES]);
        dst.fill(0);
        quantize_groups(
            w,
            0,
            self.group_size as usize,
            dst,
            scales,
            &mut e2,
            &mut w2,
        );
        Some(ErrSums {
            err2: fold_lanes(&e2),
            w2: fold_lanes(&w2),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    #[test]
    fn encode_then_decode_every_column_start() {
        // 13 columns, groups of 4 (short last group), odd cols (padding nibble).
        let w: Vec<f32> = (0..13).map(|i| (i as f32 - 6.0) * 0.37).collect();
        let enc = Encoding::Int4 { group_size: 4 };
        let mut data = vec![0u8; enc.weight_bytes(1, 13)];
        let mut scales = vec![0f32; enc.scale_count(1, 13)];
        enc.encode_row(&w, &mut data, &mut scales).unwrap();
        assert_eq!(data[6] >> 4, 8, "padding nibble");
        let m = MatrixView::new(enc, 1, 13, &data, &scales).unwrap();
        let mut full = vec![0f32; 13];
        m.dequantize_row(0, &mut full);
        for (x, y) in w.iter().zip(&full) {
            assert!((x - y).abs() <= 0.5 * 0.37 * 6.0 / 7.0 + 1e-6, "{x} vs {y}");
        }
        for c0 in 0..13 {
            let mut part = vec![0f32; 13 - c0];
            enc.decode_cols(&m, 0, c0, 13, &mut part);
            assert_eq!(part, full[c0..]);
        }
    }

    #[test]
    fn codes_round_half_even_and_clip() {
        assert_eq!(int4_q(2.5, 1.0), 2);
        assert_eq!(int4_q(3.5, 1.0), 4);
        assert_eq!(int4_q(100.0, 1.0), 7);
        assert_eq!(int4_q(-100.0, 1.0), -8);
    }
}
