//! ggml type 39, `mxfp4` (OCP microscaling FP4 as GGUF stores it): blocks of 32 weights in 17
//! bytes: the e8m0 exponent `e` (0), 16 bytes `qs` (1..17); weight `j < 16` is the low nibble of
//! `qs[j]`, weight `16 + j` its high nibble. `w = d * k[code]` with `k` the e2m1 values doubled
//! (`E2M1_DOUBLED`: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives) and `d = 2^(e - 128)` (ggml's
//! `ggml_e8m0_to_fp32_half`: e8m0 halved, subnormal for `e < 2`, `e = 255` is `2^127`, not NaN).
//! Unlike coli's own `mxfp4` encoding (encoding id 6: scales in their own section, adjacent
//! columns paired in a byte), the scale sits in each block and the nibbles split the block.

use crate::encoding::mxfp4::E2M1_DOUBLED;

/// `ggml_e8m0_to_fp32_half`.
fn half_scale(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = half_scale(b[0]);
    for j in 0..16 {
        out[j] = d * E2M1_DOUBLED[(b[1 + j] & 0x0F) as usize] as f32;
        out[j + 16] = d * E2M1_DOUBLED[(b[1 + j] >> 4) as usize] as f32;
    }
}

/// The integer form of a block: one group of 32, `w = a[0] * q`, `a[0] = d`, `q` the doubled
/// e2m1 value (-12 .. 12).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    a[0] = half_scale(b[0]);
    for j in 0..16 {
        q[j] = E2M1_DOUBLED[(b[1 + j] & 0x0F) as usize];
        q[j + 16] = E2M1_DOUBLED[(b[1 + j] >> 4) as usize];
    }
}
