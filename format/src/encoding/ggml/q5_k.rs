//! ggml type 13, `q5_k`: blocks of 256 weights in 176 bytes: f16 `d`, f16 `dmin`, 12 bytes of
//! scales and mins (as `q4_k`), 32 bytes `qh` (16..48), 128 bytes `qs` (48..176). Weight
//! `e = 64 i + 32 s + j` has the low nibble `s` of `qs[32 i + j]` and the fifth bit
//! `(qh[j] >> e / 32) & 1`; `w = d * sc[e / 32] * q - dmin * m[e / 32]` (each product rounded).

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (super::f16(b, 0), super::f16(b, 2));
    let (sc, m) = super::q4_k::scale_min(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for g in 0..8 {
        let dl = d * sc[g] as f32;
        let ml = dmin * m[g] as f32;
        let (i, s) = (g / 2, g % 2);
        for j in 0..32 {
            let lo = (qs[32 * i + j] >> (4 * s)) & 0x0F;
            let hi = (qh[j] >> g) & 1;
            out[32 * g + j] = dl * (lo | hi << 4) as f32 - ml;
        }
    }
}

/// The integer form of a block: as q4_k with 5-bit codes.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    let (d, dmin) = (super::f16(b, 0), super::f16(b, 2));
    let (sc, mn) = super::q4_k::scale_min(&b[4..16]);
    for g in 0..8 {
        a[g] = d * sc[g] as f32;
        m[g] = -(dmin * mn[g] as f32);
        let (i, s) = (g / 2, g % 2);
        for j in 0..32 {
            let lo = (b[48 + 32 * i + j] >> (4 * s)) & 0x0F;
            let hi = (b[16 + j] >> g) & 1;
            q[32 * g + j] = (lo | hi << 4) as i8;
        }
    }
}
