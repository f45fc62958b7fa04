//! Encoding id 3, `fp8`: float8 e4m3fn codes (one byte per weight, as the published FP8
//! checkpoints store them) with one f32 scale per 128x128 block, `[ceil(rows / 128),
//! ceil(cols / 128)]` row-major; `w[r][c] = e4m3(q[r][c]) * scale[r / 128][c / 128]`. The
//! group size field is 128.
//!
//! [`fp8_e4m3_to_f32`] is THE e4m3 decode of coli: every other one (the lookup table here, the
//! kernels' SIMD paths) is tested against it.

use super::{Codec, ErrSums};
use crate::MatrixView;
use std::sync::LazyLock;

/// Rows (and columns) of one FP8 scale block: the published FP8 checkpoints use 128x128 blocks.
pub const FP8_BLOCK: usize = 128;

/// The `fp8` codec.
#[derive(Clone, Copy, Debug)]
pub struct Fp8;

/// Decodes one float8 e4m3fn value to f32 exactly (the NaN codes 0x7F/0xFF give NaN; e4m3fn
/// has no infinities). Layout `S EEEE MMM`, bias 7; subnormals `(M / 8) * 2^-6`
/// (OCP 8-bit floating point specification, "E4M3").
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0F && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * (man / 8.0) * (2.0f32).powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * (2.0f32).powi(exp - 7)
    }
}

/// Every e4m3fn code decoded with [`fp8_e4m3_to_f32`] (index = the byte).
pub static FP8_LUT: LazyLock<[f32; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| fp8_e4m3_to_f32(b as u8)));

/// Whether `b` holds an e4m3 NaN code (0x7F or 0xFF), 8 bytes at a time (SWAR: a byte of
/// `(x & 0x7F..) ^ 0x7F..` is zero exactly when the byte of `x` is a NaN code).
pub fn has_nan(b: &[u8]) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const M7F: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    let mut chunks = b.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        let x = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let v = (x & M7F) ^ M7F;
        acc |= v.wrapping_sub(LO) & !v & HI;
    }
    acc != 0 || chunks.remainder().iter().any(|&x| x & 0x7F == 0x7F)
}

impl Codec for Fp8 {
    fn id(&self) -> u16 {
        3
    }
    fn group_size_field(&self) -> u16 {
        FP8_BLOCK as u16
    }
    fn name(&self) -> String {
        "fp8".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols
    }
    fn scale_count(&self, rows: usize, cols: usize) -> usize {
        rows.div_ceil(FP8_BLOCK) * cols.div_ceil(FP8_BLOCK)
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let lut = &*FP8_LUT;
        let cols = m.cols();
        let row = &m.data()[r * cols..(r + 1) * cols];
        let bcols = cols.div_ceil(FP8_BLOCK);
        let srow = &m.scales()[(r / FP8_BLOCK) * bcols..(r / FP8_BLOCK + 1) * bcols];
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
    /// fp8 is never encoded from f32 values: the converter copies a checkpoint's FP8 bytes and
    /// block scales unchanged.
    fn encode_row(&self, _w: &[f32], _dst: &mut [u8], _scales: &mut [f32]) -> Option<ErrSums> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0xB8), -1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert!(fp8_e4m3_to_f32(0x7F).is_nan() && fp8_e4m3_to_f32(0xFF).is_nan());
        for b in 0..=255u8 {
            let (l, d) = (FP8_LUT[b as usize], fp8_e4m3_to_f32(b));
            assert!(l.to_bits() == d.to_bits() || (l.is_nan() && d.is_nan()));
        }
    }

    #[test]
    fn nan_scan_matches_bytewise() {
        for len in 0..20 {
            for pos in 0..len {
                for code in [0x7Fu8, 0xFF, 0x7E, 0x00] {
                    let mut v = vec![0x11u8; len];
                    v[pos] = code;
                    assert_eq!(has_nan(&v), code & 0x7F == 0x7F, "len {len} pos {pos}");
                }
            }
        }
    }
}
