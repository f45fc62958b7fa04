//! Encoding id 2, `bf16`: bfloat16 bit patterns (u16, little-endian), no scales. Encoding
//! rounds f32 to nearest, ties to even ([`f32_to_bf16_rne`]).

use super::{Codec, ErrSums};
use crate::MatrixView;

/// The `bf16` codec.
#[derive(Clone, Copy, Debug)]
pub struct Bf16;

/// Decodes a bfloat16 bit pattern to f32 exactly (the high half of the f32 bits).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 bits, round to nearest, ties to even. The input must be finite (the
/// converter refuses NaN before it gets here); infinities and overflow round as IEEE does.
pub fn f32_to_bf16_rne(x: f32) -> u16 {
    let b = x.to_bits();
    let lsb = (b >> 16) & 1;
    (b.wrapping_add(0x7FFF + lsb) >> 16) as u16
}

impl Codec for Bf16 {
    fn id(&self) -> u16 {
        2
    }
    fn group_size_field(&self) -> u16 {
        0
    }
    fn name(&self) -> String {
        "bf16".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols * 2
    }
    fn scale_count(&self, _rows: usize, _cols: usize) -> usize {
        0
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let cols = m.cols();
        let row = &m.data()[(r * cols + c0) * 2..(r * cols + c1) * 2];
        for (o, b) in out[..c1 - c0].iter_mut().zip(row.chunks_exact(2)) {
            *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }
    }
    /// Rounds each value with [`f32_to_bf16_rne`]; error sums in column order.
    fn encode_row(&self, w: &[f32], dst: &mut [u8], _scales: &mut [f32]) -> Option<ErrSums> {
        let mut s = ErrSums::default();
        for (d, &x) in dst.chunks_exact_mut(2).zip(w) {
            let b = f32_to_bf16_rne(x);
            d.copy_from_slice(&b.to_le_bytes());
            let e = (bf16_to_f32(b) as f64) - (x as f64);
            s.err2 += e * e;
            s.w2 += (x as f64) * (x as f64);
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_ties_to_even() {
        assert_eq!(f32_to_bf16_rne(1.0), 0x3F80);
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(f32_to_bf16_rne(1.0 + 2f32.powi(-8)), 0x3F80);
        assert_eq!(f32_to_bf16_rne(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert_eq!(bf16_to_f32(0xBF80), -1.0);
    }
}
