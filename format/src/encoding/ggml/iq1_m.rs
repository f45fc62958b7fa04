//! ggml type 29, `iq1_m`: blocks of 256 weights in 56 bytes: 32 bytes `qs` (0..32), 16 bytes `qh`
//! (32..48), 4 little-endian u16 `sc` (48..56). The f16 `d` is spread over the top nibbles of
//! `sc`: its bits are `sc[0] >> 12 | (sc[1] >> 8) & 0xF0 | (sc[2] >> 4) & 0xF00 | sc[3] & 0xF000`.
//! Group `k < 16` of 16 weights has `dl = d * (2 s + 1)`, `s = (sc[k / 4] >> 3 (k % 4)) & 7`.
//! Weights `8l .. 8l + 8` (`l < 32`) use nibble `n` = nibble `l % 2` of `qh[l / 2]`: grid point
//! `qs[l] | (n & 7) << 8` of `IQ1S_GRID` (entries -1, 0, 1), `delta = 0.125` or, when bit 3 of
//! `n` is set, `-0.125`; `w = dl * (entry + delta)`.

use super::iq_grids::IQ1S_GRID;
use super::{iq1_codes, put8};

#[inline(always)]
fn sc(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[48 + 2 * i], b[49 + 2 * i]])
}

#[inline(always)]
fn d(b: &[u8]) -> f32 {
    let bits =
        sc(b, 0) >> 12 | (sc(b, 1) >> 8) & 0xF0 | (sc(b, 2) >> 4) & 0xF00 | sc(b, 3) & 0xF000;
    half::f16::from_bits(bits).to_f32()
}

#[inline(always)]
fn dl(b: &[u8], d: f32, k: usize) -> f32 {
    d * (2 * ((sc(b, k / 4) >> (3 * (k % 4))) & 7) + 1) as f32
}

/// Grid point of weights `8l .. 8l + 8`, and whether their delta is negative.
#[inline(always)]
fn point(b: &[u8], l: usize) -> (u64, bool) {
    let n = (b[32 + l / 2] >> (4 * (l % 2))) & 0x0F;
    (
        IQ1S_GRID[b[l] as usize | ((n & 7) as usize) << 8],
        n & 8 != 0,
    )
}

/// The integer form of a block: group `k` of 16 has `w = a[k] * q` with `q = 8 entry ± 1` (-9 ..
/// 9) and `a[k] = dl / 8` (exact), as iq1_s.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = d(b);
    for (k, v) in a.iter_mut().enumerate().take(16) {
        *v = dl(b, d, k) * 0.125;
    }
    for l in 0..32 {
        let (p, neg) = point(b, l);
        put8(&mut q[8 * l..], iq1_codes(p, !neg));
    }
}
