//! ggml type 23, `iq4_xs`: blocks of 256 weights in 136 bytes: f16 `d` (0..2), u16 `scales_h`
//! (2..4), 4 bytes `scales_l` (4..8), 128 bytes `qs`. Group `g < 8` of 32 weights has the 6-bit
//! scale `s = ((scales_l[g / 2] >> 4 (g % 2)) & 15 | ((scales_h >> 2g) & 3) << 4) - 32` and
//! `dl = d * s`; its weight `16 h + j` (`h < 2`, `j < 16`) is nibble `h` of `qs[16 g + j]`,
//! `w = dl * k[q]` with IQ4_NL's table.

use super::iq4_nl::KVALUES;

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let sl = &b[4..8];
    let qs = &b[8..136];
    for g in 0..8 {
        let lo = (sl[g / 2] >> (4 * (g % 2))) & 0x0F;
        let hi = ((sh >> (2 * g)) & 3) as u8;
        let dl = d * ((lo | hi << 4) as i32 - 32) as f32;
        let q = &qs[16 * g..16 * g + 16];
        let o = &mut out[32 * g..32 * g + 32];
        for j in 0..16 {
            o[j] = dl * KVALUES[(q[j] & 0x0F) as usize] as f32;
            o[j + 16] = dl * KVALUES[(q[j] >> 4) as usize] as f32;
        }
    }
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q`, `a[g] = dl`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 0);
    let sh = u16::from_le_bytes([b[2], b[3]]);
    for g in 0..8 {
        let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F;
        let hi = ((sh >> (2 * g)) & 3) as u8;
        a[g] = d * ((lo | hi << 4) as i32 - 32) as f32;
        for j in 0..16 {
            let v = b[8 + 16 * g + j];
            q[32 * g + j] = KVALUES[(v & 0x0F) as usize];
            q[32 * g + j + 16] = KVALUES[(v >> 4) as usize];
        }
    }
}
