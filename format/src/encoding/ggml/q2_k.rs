//! ggml type 10, `q2_k`: blocks of 256 weights in 84 bytes: 16 bytes `scales` (0..16), 64 bytes
//! `qs` (16..80), f16 `d` (80..82), f16 `dmin` (82..84). Weight `e = 128 h + 32 s + j`
//! (`h < 2`, `s < 4`, `j < 32`) has the 2-bit code `(qs[32 h + j] >> 2 s) & 3` and the group
//! `e / 16`, whose byte `sc` gives `dl = d * (sc & 15)` and `ml = dmin * (sc >> 4)`;
//! `w = dl * q - ml`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (super::f16(b, 80), super::f16(b, 82));
    for (e, o) in out.iter_mut().enumerate() {
        let (h, s, j) = (e / 128, (e / 32) % 4, e % 32);
        let q = (qs[32 * h + j] >> (2 * s)) & 3;
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *o = dl * q as f32 - ml;
    }
}

/// The integer form of a block: group `g` of 16 has `w = a[g] * q + m[g]`, `a[g] = dl`,
/// `m[g] = -ml` (`dl * q - ml` is `dl * q + (-ml)` in IEEE arithmetic).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    let (d, dmin) = (super::f16(b, 80), super::f16(b, 82));
    for g in 0..16 {
        a[g] = d * (b[g] & 0x0F) as f32;
        m[g] = -(dmin * (b[g] >> 4) as f32);
    }
    for (e, o) in q.iter_mut().enumerate() {
        let (h, s, j) = (e / 128, (e / 32) % 4, e % 32);
        *o = ((b[16 + 32 * h + j] >> (2 * s)) & 3) as i8;
    }
}
