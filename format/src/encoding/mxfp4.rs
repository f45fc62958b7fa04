//! Encoding id 6, `mxfp4`: OCP microscaling FP4 (OCP Microscaling Formats (MX) Specification
//! v1.0, sections 5.3 and 6.3): 4-bit e2m1 codes, two per byte, with one e8m0 power-of-two scale
//! per block of [`MXFP4_BLOCK`] (32) consecutive columns of a row; the last block of a row is
//! shorter when 32 does not divide `cols`. Weight section `rows * ceil(cols / 2)` bytes: column
//! `2j` is the LOW nibble of byte `j` of its row, column `2j + 1` the high nibble (the order of
//! gpt-oss's published `*_blocks` tensors, which transformers' `convert_moe_packed_tensors`
//! decodes with `lut[blk & 0x0F]` for even columns); a row of odd `cols` ends with a high nibble
//! of 0. Scale section: `rows * ceil(cols / 32)` **bytes** (e8m0), row-major, not f32.
//!
//! A weight is `w = e2m1(code) * 2^(e - 127)`, one f32 multiplication, exact (the product of a
//! value with one significant bit after the point and a power of two is representable) except
//! where it exceeds the f32 range (codes of magnitude >= 2 with `e >= 254 - ..`; it is then
//! ±inf, as the same product in bf16 would be). e8m0 255 is NaN: a store never holds it (the
//! converter refuses it, naming the tensor).
//!
//! Stores keep the published blocks and scales as they are (the converter copies them; it never
//! re-encodes f32 values into mxfp4), so [`Codec::encode_row`] returns `None`.

use super::{Codec, ErrSums};
use crate::MatrixView;

/// Columns per e8m0 scale (the OCP MX block size k = 32).
pub const MXFP4_BLOCK: usize = 32;

/// The 16 e2m1 values by code: bit 3 is the sign, bits 0..3 the magnitude index into
/// `[0, 0.5, 1, 1.5, 2, 3, 4, 6]` (1 exponent bit with bias 1, 1 mantissa bit; code 1 is the
/// subnormal 0.5). Code 8 is -0.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The integer form of the e2m1 values: `E2M1_DOUBLED[c] = 2 * E2M1_VALUES[c]`, integers in
/// `-12..=12` (code 8, -0, is 0). A block's weights are then `E2M1_DOUBLED[c] * 2^(e - 128)`,
/// which is how integer-activation products (kernels' `q8a` rule) and llama.cpp's
/// `kvalues_mxfp4` pair them with int8 activations.
pub const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`: the e8m0 scale `e` halved, the multiplier of [`E2M1_DOUBLED`] (exact: a
/// power of two, the f32 subnormal `2^-128` for `e = 0`); NaN for e = 255.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    e8m0_to_f32(e) * 0.5
}

/// The e8m0 NaN code.
pub const E8M0_NAN: u8 = 255;

/// Decodes one e2m1 code (low 4 bits of `code`; the high bits are ignored).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[(code & 0x0F) as usize]
}

/// Decodes one e8m0 scale: `2^(e - 127)` exactly, as an f32 (e = 0 gives the subnormal
/// 2^-127, e = 254 gives 2^127); e = 255 is NaN.
#[inline]
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        E8M0_NAN => f32::NAN,
        // 2^-127 is the f32 subnormal with only mantissa bit 22 set.
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((e as u32) << 23),
    }
}

/// Index of the first e8m0 NaN code in `scales`, if any.
pub fn find_nan_scale(scales: &[u8]) -> Option<usize> {
    scales.iter().position(|&e| e == E8M0_NAN)
}

/// The `mxfp4` codec.
#[derive(Clone, Copy, Debug)]
pub struct Mxfp4;

impl Codec for Mxfp4 {
    fn id(&self) -> u16 {
        6
    }
    fn group_size_field(&self) -> u16 {
        MXFP4_BLOCK as u16
    }
    fn name(&self) -> String {
        "mxfp4".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols.div_ceil(2)
    }
    fn scale_count(&self, rows: usize, cols: usize) -> usize {
        rows * cols.div_ceil(MXFP4_BLOCK)
    }
    fn scale_width(&self) -> usize {
        1
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let cols = m.cols();
        let stride = cols.div_ceil(2);
        let row = &m.data()[r * stride..(r + 1) * stride];
        let nb = cols.div_ceil(MXFP4_BLOCK);
        let srow = &m.e8m0_scales()[r * nb..(r + 1) * nb];
        for (c, o) in (c0..c1).zip(out.iter_mut()) {
            let byte = row[c / 2];
            let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            *o = e2m1_to_f32(code) * e8m0_to_f32(srow[c / MXFP4_BLOCK]);
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

    #[test]
    fn every_code_and_exponent_decodes_exactly() {
        // e2m1: sign * 2^(E - 1) * (1 + M / 2) for E > 0, sign * M / 2 for E = 0 (OCP MX 5.3.3).
        for code in 0u8..16 {
            let (s, e, m) = ((code >> 3) & 1, (code >> 1) & 3, code & 1);
            let mag = if e == 0 {
                m as f64 * 0.5
            } else {
                2f64.powi(e as i32 - 1) * (1.0 + m as f64 / 2.0)
            };
            let v = if s == 1 { -mag } else { mag };
            assert_eq!(e2m1_to_f32(code) as f64, v, "code {code}");
            assert_eq!(e2m1_to_f32(code).is_sign_negative(), s == 1, "code {code}");
        }
        for e in 0u8..=254 {
            assert_eq!(e8m0_to_f32(e) as f64, 2f64.powi(e as i32 - 127), "e8m0 {e}");
        }
        assert!(e8m0_to_f32(255).is_nan());
        for code in 0u8..16 {
            assert_eq!(
                E2M1_DOUBLED[code as usize] as f32 * 0.5,
                e2m1_to_f32(code),
                "code {code}"
            );
        }
        for e in 0u8..=254 {
            assert_eq!(
                e8m0_half(e) as f64,
                2f64.powi(e as i32 - 128),
                "e8m0 {e} halved"
            );
        }
        // The extremes: smallest nonzero weight 0.5 * 2^-127 = 2^-128 (an f32 subnormal),
        // 6 * 2^127 overflows to inf, 1 * 2^127 does not.
        assert_eq!(e2m1_to_f32(1) * e8m0_to_f32(0), 2f32.powi(-128));
        assert_eq!(e2m1_to_f32(7) * e8m0_to_f32(254), f32::INFINITY);
        assert_eq!(e2m1_to_f32(0xA) * e8m0_to_f32(254), -(2f32.powi(127)));
    }

    #[test]
    fn decode_cols_nibble_order_and_short_last_block() {
        // 1 row, 35 columns: blocks of 32 + 3, odd cols (padding high nibble 0).
        let cols = 35;
        let data: Vec<u8> = (0..18u8)
            .map(|j| (j % 16) | (((j + 5) % 16) << 4))
            .collect();
        let scales = [127u8, 130];
        let m = MatrixView::from_sections(Encoding::Mxfp4, 1, cols, &data, &scales).unwrap();
        let mut row = vec![0f32; cols];
        m.dequantize_row(0, &mut row);
        for (c, &v) in row.iter().enumerate() {
            let code = if c % 2 == 0 {
                data[c / 2] & 15
            } else {
                data[c / 2] >> 4
            };
            let s = if c < 32 { 1.0 } else { 8.0 };
            assert_eq!(v, E2M1_VALUES[code as usize] * s, "col {c}");
        }
        for c0 in 0..cols {
            let mut part = vec![0f32; cols - c0];
            m.decode_cols(0, c0, cols, &mut part);
            assert_eq!(part, row[c0..]);
        }
        assert_eq!(find_nan_scale(&[1, 2, 255]), Some(2));
    }
}
