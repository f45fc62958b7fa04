//! ggml type 6, `q5_0`: blocks of 32 weights in 22 bytes: f16 `d`, a little-endian u32 `qh`
//! (bit `j` is the fifth bit of weight `j`), 16 bytes `qs` (low nibbles as in `q4_0`);
//! `w = d * ((lo | hi << 4) - 16)`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * (lo as i32 - 16) as f32;
        out[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

/// The integer form of a block: `w = a[0] * q` with `q = code - 16`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    a[0] = super::f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        q[j] = ((b[6 + j] & 0x0F) as u32 | ((qh >> j) & 1) << 4) as i8 - 16;
        q[j + 16] = ((b[6 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i8 - 16;
    }
}
