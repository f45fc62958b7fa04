//! ggml type 7, `q5_1`: blocks of 32 weights in 24 bytes: f16 `d`, f16 `m`, u32 `qh`, 16 bytes
//! `qs` (codes as in `q5_0`, unsigned); `w = d * q + m`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let (d, m) = (super::f16(b, 0), super::f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0F) as u32 | ((qh >> j) & 1) << 4;
        let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * lo as f32 + m;
        out[j + 16] = d * hi as f32 + m;
    }
}

/// The integer form of a block: `w = a[0] * q + m[0]`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    (a[0], m[0]) = (super::f16(b, 0), super::f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        q[j] = ((b[8 + j] & 0x0F) as u32 | ((qh >> j) & 1) << 4) as i8;
        q[j + 16] = ((b[8 + j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i8;
    }
}
