//! ggml type 18, `iq3_xxs`: blocks of 256 weights in 98 bytes: f16 `d` (0..2), 64 bytes of grid
//! indices (2..66, one per 4 weights, into `IQ3XXS_GRID`), 8 little-endian u32 (66..98), one per
//! group `g` of 32 weights: bits `7k .. 7k + 7` (`k < 4`) pick the signs of the group's `k`-th 8
//! weights from `KSIGNS`, the top 4 bits are the scale `ls`, `db = d * (0.5 + ls) * 0.5`. A
//! weight is `db * grid[j]`, negated where its sign bit is set.

use super::iq_grids::{IQ3XXS_GRID, KSIGNS};
use super::{put8, signed};

#[inline(always)]
fn scale_signs(b: &[u8], g: usize) -> u32 {
    let o = 66 + 4 * g;
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Grid points `2k`, `2k + 1` of group `g` (its `k`-th 8 weights) as one 8-entry point.
#[inline(always)]
fn pair(b: &[u8], g: usize, k: usize) -> u64 {
    let i = 2 + 8 * g + 2 * k;
    IQ3XXS_GRID[b[i] as usize] as u64 | (IQ3XXS_GRID[b[i + 1] as usize] as u64) << 32
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q`, `a[g] = db`, `q` the signed
/// grid entry (4 .. 62).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 0);
    for g in 0..8 {
        let s = scale_signs(b, g);
        a[g] = d * (0.5 + (s >> 28) as f32) * 0.5;
        for k in 0..4 {
            let signs = KSIGNS[((s >> (7 * k)) & 127) as usize];
            put8(&mut q[32 * g + 8 * k..], signed(pair(b, g, k), signs));
        }
    }
}
