//! Encoding id 8, `mxfp8` (format version 5): OCP microscaling FP8 (OCP Microscaling Formats
//! (MX) Specification v1.0, sections 5.3 and 6.3, element type E4M3): one e4m3 ("fn": no
//! infinities, `S.1111.111` is NaN) code per byte, with one e8m0 power-of-two scale per block
//! of [`MXFP8_BLOCK`] (32) consecutive columns of a row; the last block of a row is shorter
//! when 32 does not divide `cols`. Weight section `rows * cols` bytes, row-major. Scale
//! section: `rows * ceil(cols / 32)` **bytes** (e8m0), row-major, not f32 (as mxfp4's).
//!
//! A weight is `w = e4m3(code) * 2^(e - 127)`, one f32 multiplication
//! ([`crate::encoding::fp8_e4m3_to_f32`], through its table, times
//! [`crate::encoding::mxfp4::e8m0_to_f32`]), exact
//! where it is in the f32 range (an e4m3 value has 4 significant bits). e8m0 255 (NaN) and the
//! e4m3 NaN codes never reach a store: the converter refuses them, naming the tensor.
//!
//! Stores keep the published codes and scales as they are (Inkling 2's `-MXFP8` releases; the
//! converter copies them, it never re-encodes f32 values into mxfp8), so [`Codec::encode_row`]
//! returns `None`.

use super::fp8::FP8_LUT;
use super::mxfp4::e8m0_to_f32;
use super::{Codec, ErrSums};
use crate::MatrixView;

/// Columns per e8m0 scale (the OCP MX block size k = 32).
pub const MXFP8_BLOCK: usize = 32;

/// The `mxfp8` codec.
#[derive(Clone, Copy, Debug)]
pub struct Mxfp8;

impl Codec for Mxfp8 {
    fn id(&self) -> u16 {
        8
    }
    fn group_size_field(&self) -> u16 {
        MXFP8_BLOCK as u16
    }
    fn name(&self) -> String {
        "mxfp8".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols
    }
    fn scale_count(&self, rows: usize, cols: usize) -> usize {
        rows * cols.div_ceil(MXFP8_BLOCK)
    }
    fn scale_width(&self) -> usize {
        1
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let cols = m.cols();
        let row = &m.data()[r * cols..(r + 1) * cols];
        let nb = cols.div_ceil(MXFP8_BLOCK);
        let srow = &m.e8m0_scales()[r * nb..(r + 1) * nb];
        // `FP8_LUT[b]` is `fp8_e4m3_to_f32(b)` (tested in `fp8`).
        let lut = &*FP8_LUT;
        let mut c = c0;
        while c < c1 {
            let end = ((c / MXFP8_BLOCK + 1) * MXFP8_BLOCK).min(c1);
            let s = e8m0_to_f32(srow[c / MXFP8_BLOCK]);
            for (o, &b) in out[c - c0..end - c0].iter_mut().zip(&row[c..end]) {
                *o = lut[b as usize] * s;
            }
            c = end;
        }
    }
    fn encode_row(&self, _w: &[f32], _dst: &mut [u8], _scales: &mut [f32]) -> Option<ErrSums> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    /// e4m3 by its definition (OCP MX 5.3.3): `(-1)^s 2^(e - 7) (1 + m / 8)`, subnormals
    /// `(-1)^s 2^-6 m / 8`.
    fn e4m3(code: u8) -> f64 {
        let (s, e, m) = (code >> 7, (code >> 3) & 15, code & 7);
        let mag = if e == 0 {
            2f64.powi(-6) * m as f64 / 8.0
        } else {
            2f64.powi(e as i32 - 7) * (1.0 + m as f64 / 8.0)
        };
        if s == 1 {
            -mag
        } else {
            mag
        }
    }

    #[test]
    fn every_code_times_every_exponent_decodes_exactly() {
        // One row of 256 columns: every code, 8 blocks; each exponent in turn for all blocks.
        let data: Vec<u8> = (0..=255u8).collect();
        for e in 0u8..=254 {
            let scales = [e; 8];
            let m = MatrixView::from_sections(Encoding::Mxfp8, 1, 256, &data, &scales).unwrap();
            let mut row = vec![0f32; 256];
            m.dequantize_row(0, &mut row);
            for (c, &v) in row.iter().enumerate() {
                let code = c as u8;
                if code & 0x7F == 0x7F {
                    assert!(v.is_nan(), "code {code:#x}");
                    continue;
                }
                let want = e4m3(code) * 2f64.powi(e as i32 - 127);
                let want = if want.abs() > f32::MAX as f64 {
                    want.signum() * f64::INFINITY
                } else {
                    want
                };
                assert_eq!(v as f64, want, "code {code:#x} e8m0 {e}");
            }
        }
    }

    #[test]
    fn decode_cols_short_last_block_and_sections() {
        // 2 rows, 35 columns: blocks of 32 + 3.
        let (rows, cols) = (2, 35);
        let data: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 120) as u8).collect();
        let scales = [127u8, 130, 126, 128];
        let m = MatrixView::from_sections(Encoding::Mxfp8, rows, cols, &data, &scales).unwrap();
        assert_eq!(Encoding::Mxfp8.weight_bytes(rows, cols), 70);
        assert_eq!(Encoding::Mxfp8.scale_bytes(rows, cols), 4);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut row);
            for (c, &v) in row.iter().enumerate() {
                let s = 2f64.powi(scales[r * 2 + c / 32] as i32 - 127);
                assert_eq!(v as f64, e4m3(data[r * cols + c]) * s, "[{r}, {c}]");
            }
            for c0 in 0..cols {
                let mut part = vec![0f32; cols - c0];
                m.decode_cols(r, c0, cols, &mut part);
                assert_eq!(part, row[c0..]);
            }
        }
    }
}
