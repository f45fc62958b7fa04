//! ggml type 21, `iq3_s`: blocks of 256 weights in 110 bytes: f16 `d` (0..2), 64 bytes `qs`
//! (2..66), 8 bytes `qh` (66..74), 32 bytes of signs (74..106), 4 bytes `scales` (106..110).
//! Weights `4l .. 4l + 4` (`l < 64`) are grid point `qs[l] | ((qh[l / 8] >> (l % 8)) & 1) << 8`
//! of `IQ3S_GRID`; weight `8m + j` is negated where bit `j` of sign byte `m` is set. Group
//! `g < 8` of 32 weights has the scale `ls` = nibble `g % 2` of `scales[g / 2]` and
//! `db = d * (1 + 2 ls)`.

use super::iq_grids::IQ3S_GRID;
use super::{put8, signed};

/// Grid points `2m`, `2m + 1` (weights `8m .. 8m + 8`) as one 8-entry point, and their signs.
#[inline(always)]
fn pair(b: &[u8], m: usize) -> (u64, u8) {
    let point = |l: usize| {
        let hi = ((b[66 + l / 8] >> (l % 8)) & 1) as usize;
        IQ3S_GRID[b[2 + l] as usize | hi << 8] as u64
    };
    (point(2 * m) | point(2 * m + 1) << 32, b[74 + m])
}

#[inline(always)]
fn db(b: &[u8], d: f32, g: usize) -> f32 {
    let ls = (b[106 + g / 2] >> (4 * (g % 2))) & 0x0F;
    d * (1 + 2 * ls) as f32
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q`, `a[g] = db`, `q` the signed
/// grid entry (odd, 1 .. 15).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 0);
    for (g, v) in a.iter_mut().enumerate().take(8) {
        *v = db(b, d, g);
    }
    for m in 0..32 {
        let (p, signs) = pair(b, m);
        put8(&mut q[8 * m..], signed(p, signs));
    }
}
