//! ggml type 16, `iq2_xxs`: blocks of 256 weights in 66 bytes: f16 `d` (0..2), then per group
//! `g < 8` of 32 weights 8 bytes at `2 + 8g`: 4 grid indices (one per 8 weights) and a
//! little-endian u32 `s` whose bits `7k .. 7k + 7` (`k < 4`) pick the signs of the `k`-th 8
//! weights from `KSIGNS` and whose top 4 bits are the scale `ls`. With
//! `db = d * (0.5 + ls) * 0.25`, weight `8k + j` is `db * IQ2XXS_GRID[idx_k][j]`, negated where
//! bit `j` of the signs is set.

use super::iq_grids::{IQ2XXS_GRID, KSIGNS};
use super::{put8, signed};

#[inline(always)]
fn group(b: &[u8], g: usize) -> (&[u8], u32) {
    let o = 2 + 8 * g;
    (
        &b[o..o + 4],
        u32::from_le_bytes([b[o + 4], b[o + 5], b[o + 6], b[o + 7]]),
    )
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q`, `a[g] = db`, `q` the signed
/// grid entry (8, 25 or 43).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 0);
    for g in 0..8 {
        let (idx, s) = group(b, g);
        a[g] = d * (0.5 + (s >> 28) as f32) * 0.25;
        for k in 0..4 {
            let signs = KSIGNS[((s >> (7 * k)) & 127) as usize];
            put8(
                &mut q[32 * g + 8 * k..],
                signed(IQ2XXS_GRID[idx[k] as usize], signs),
            );
        }
    }
}
