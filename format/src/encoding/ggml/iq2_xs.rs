//! ggml type 17, `iq2_xs`: blocks of 256 weights in 74 bytes: f16 `d` (0..2), 32 little-endian
//! u16 `qs` (2..66), 8 bytes `scales` (66..74). Entry `l` of `qs` covers weights `8l .. 8l + 8`:
//! its low 9 bits index `IQ2XS_GRID`, its high 7 pick the signs from `KSIGNS`. Group `g < 16`
//! of 16 weights has the scale `ls` = nibble `g % 2` of `scales[g / 2]` and
//! `db = d * (0.5 + ls) * 0.25`; a weight is `db * grid[j]`, negated where its sign bit is set.

use super::iq_grids::{IQ2XS_GRID, KSIGNS};

#[inline(always)]
fn entry(b: &[u8], l: usize) -> (u64, u8) {
    let v = u16::from_le_bytes([b[2 + 2 * l], b[3 + 2 * l]]);
    (IQ2XS_GRID[(v & 511) as usize], KSIGNS[(v >> 9) as usize])
}

/// The integer form of a block: group `g` of 16 has `w = a[g] * q`, `a[g] = db`, `q` the signed
/// grid entry (8, 25 or 43).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    super::iq2_codes_16(b, 66, q, a, |l| entry(b, l));
}
