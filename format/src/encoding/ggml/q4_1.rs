//! ggml type 3, `q4_1`: blocks of 32 weights in 20 bytes: f16 `d`, f16 `m`, 16 bytes `qs`
//! (nibbles as in `q4_0`, unsigned); `w = d * q + m` (product rounded, then the sum).

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let (d, m) = (super::f16(b, 0), super::f16(b, 2));
    let qs = &b[4..20];
    for j in 0..16 {
        out[j] = d * (qs[j] & 0x0F) as f32 + m;
        out[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

/// The integer form of a block: `w = a[0] * q + m[0]`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    (a[0], m[0]) = (super::f16(b, 0), super::f16(b, 2));
    for j in 0..16 {
        q[j] = (b[4 + j] & 0x0F) as i8;
        q[j + 16] = (b[4 + j] >> 4) as i8;
    }
}
