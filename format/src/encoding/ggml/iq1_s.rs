//! ggml type 19, `iq1_s`: blocks of 256 weights in 50 bytes: f16 `d` (0..2), 32 bytes `qs`
//! (2..34), 8 little-endian u16 `qh` (34..50), one per group `g` of 32 weights. With `h = qh[g]`:
//! `dl = d * (2 ((h >> 12) & 7) + 1)`, `delta = 0.125`, or `-0.125` when bit 15 of `h` is set;
//! weights `32g + 8l .. + 8` (`l < 4`) are grid point `qs[4g + l] | ((h >> 3l) & 7) << 8` of
//! `IQ1S_GRID` (entries -1, 0, 1), each `w = dl * (entry + delta)`.

use super::iq_grids::IQ1S_GRID;
use super::{iq1_codes, put8};

/// Group `g`'s `qh` word.
#[inline(always)]
fn qh(b: &[u8], g: usize) -> u16 {
    u16::from_le_bytes([b[34 + 2 * g], b[35 + 2 * g]])
}

#[inline(always)]
fn point(b: &[u8], g: usize, h: u16, l: usize) -> u64 {
    IQ1S_GRID[b[2 + 4 * g + l] as usize | (((h >> (3 * l)) & 7) as usize) << 8]
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q` with `q = 8 entry ± 1` (-9 ..
/// 9) and `a[g] = dl / 8` (exact: a power-of-two step of a normal f32), so that `a q` is the
/// same single rounding of `dl (entry + delta)`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 0);
    for g in 0..8 {
        let h = qh(b, g);
        a[g] = d * (2 * ((h >> 12) & 7) + 1) as f32 * 0.125;
        let plus = h & 0x8000 == 0;
        for l in 0..4 {
            put8(&mut q[32 * g + 8 * l..], iq1_codes(point(b, g, h, l), plus));
        }
    }
}
