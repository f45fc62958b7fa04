//! ggml type 2, `q4_0`: blocks of 32 weights in 18 bytes: f16 `d` (bytes 0..2), then 16 bytes
//! `qs`. Weight `j < 16` is the low nibble of `qs[j]`, weight `j + 16` its high nibble;
//! `w = d * (q - 8)` (one f32 product).

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        out[j] = d * ((qs[j] & 0x0F) as i32 - 8) as f32;
        out[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

/// The integer form of a block: `w = a[0] * q` with `q = nibble - 8`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    a[0] = super::f16(b, 0);
    for j in 0..16 {
        q[j] = (b[2 + j] & 0x0F) as i8 - 8;
        q[j + 16] = (b[2 + j] >> 4) as i8 - 8;
    }
}
