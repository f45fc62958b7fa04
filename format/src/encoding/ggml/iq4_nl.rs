//! ggml type 20, `iq4_nl`: blocks of 32 weights in 18 bytes: f16 `d`, 16 bytes of 4-bit
//! indices (nibble order as in `q4_0`) into the non-linear table [`KVALUES`]; `w = d * k[q]`.

/// The 16 signed levels of IQ4_NL and IQ4_XS (`kvalues_iq4nl` in ggml-common.h).
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        out[j] = d * KVALUES[(qs[j] & 0x0F) as usize] as f32;
        out[j + 16] = d * KVALUES[(qs[j] >> 4) as usize] as f32;
    }
}

/// The integer form of a block: `w = a[0] * q` with `q = KVALUES[nibble]`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    a[0] = super::f16(b, 0);
    for j in 0..16 {
        q[j] = KVALUES[(b[2 + j] & 0x0F) as usize];
        q[j + 16] = KVALUES[(b[2 + j] >> 4) as usize];
    }
}
