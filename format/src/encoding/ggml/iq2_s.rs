//! ggml type 22, `iq2_s`: blocks of 256 weights in 82 bytes: f16 `d` (0..2), 32 bytes `qs`
//! (2..34), 32 bytes of signs (34..66), 8 bytes `qh` (66..74), 8 bytes `scales` (74..82).
//! Weights `8l .. 8l + 8` (`l < 32`) are grid point `qs[l] | ((qh[l / 4] >> 2 (l % 4)) & 3) << 8`
//! of `IQ2S_GRID`, negated where bit `j` of sign byte `l` is set. Group `g < 16` of 16 weights
//! has the scale `ls` = nibble `g % 2` of `scales[g / 2]` and `db = d * (0.5 + ls) * 0.25`.

use super::iq_grids::IQ2S_GRID;

#[inline(always)]
fn entry(b: &[u8], l: usize) -> (u64, u8) {
    let hi = ((b[66 + l / 4] >> (2 * (l % 4))) & 3) as usize;
    (IQ2S_GRID[b[2 + l] as usize | hi << 8], b[34 + l])
}

/// The integer form of a block: group `g` of 16 has `w = a[g] * q`, `a[g] = db`, `q` the signed
/// grid entry (8, 25 or 43).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    super::iq2_codes_16(b, 74, q, a, |l| entry(b, l));
}
