//! SIMD twins of `coli_format`'s scalar encoders, for the converter: int4 quantization of a row
//! (`coli_format::encoding::int4`), bit-identical to the reference (bytes, scales and error
//! sums), chosen by instruction set like the products.

#![forbid(unsafe_code)]

use crate::{detected_isa, require, Isa};
use coli_format::encoding::int4::{fold_lanes, quantize_groups, SUM_LANES};
use coli_format::ErrSums;

/// Quantizes one row `w` (finite f32 values) to int4 with groups of `g` columns, exactly as
/// `Encoding::Int4 { group_size: g }.encode_row` does: `ceil(len / 2)` bytes into `dst`,
/// `ceil(len / g)` scales into `scales`; returns the error sums (accumulated in 8 lanes, column
/// mod 8, folded in lane order). Uses the AVX2 twin when the detected instruction set has AVX2
/// and `g` is a multiple of 8.
///
/// # Panics
/// If `dst` or `scales` is shorter than the row needs.
pub fn quantize_int4_row(w: &[f32], g: usize, dst: &mut [u8], scales: &mut [f32]) -> ErrSums {
    quantize_int4_row_with(detected_isa(), w, g, dst, scales)
}

/// [`quantize_int4_row`] with an explicit instruction set (tests).
///
/// # Panics
/// As [`quantize_int4_row`]; also if `isa` is not supported by this CPU.
pub fn quantize_int4_row_with(
    isa: Isa,
    w: &[f32],
    g: usize,
    dst: &mut [u8],
    scales: &mut [f32],
) -> ErrSums {
    require(isa);
    let (mut e2, mut w2) = ([0f64; SUM_LANES], [0f64; SUM_LANES]);
    dst.fill(0);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() && g.is_multiple_of(8) && g > 0 {
        done = crate::avx2_quant::int4_full_groups(w, g, dst, scales, &mut e2, &mut w2);
    }
    quantize_groups(w, done, g, dst, scales, &mut e2, &mut w2);
    ErrSums {
        err2: fold_lanes(&e2),
        w2: fold_lanes(&w2),
    }
}
