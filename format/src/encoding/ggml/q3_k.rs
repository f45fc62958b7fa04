//! ggml type 11, `q3_k`: blocks of 256 weights in 110 bytes: 32 bytes `hmask` (0..32), 64
//! bytes `qs` (32..96), 12 bytes of packed scales (96..108), f16 `d` (108..110). Group `g < 16`
//! of 16 weights has the 6-bit scale
//! `((sc[g % 8] >> 4 (g / 8)) & 15 | ((sc[8 + g % 4] >> 2 (g / 4)) & 3) << 4) - 32` and
//! `dl = d * scale`. Weight `e = 128 h + 32 s + j` has the low bits
//! `(qs[32 h + j] >> 2 s) & 3` and the high bit `(hmask[e % 32] >> e / 32) & 1`; its code is
//! `low - 4` when the high bit is 0, `low` when it is 1; `w = dl * q`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = super::f16(b, 108);
    let mut dl = [0f32; 16];
    for (g, v) in dl.iter_mut().enumerate() {
        let lo = (sc[g % 8] >> (4 * (g / 8))) & 0x0F;
        let hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
        *v = d * ((lo | hi << 4) as i32 - 32) as f32;
    }
    for (e, o) in out.iter_mut().enumerate() {
        let (h, s, j) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((qs[32 * h + j] >> (2 * s)) & 3) as i32;
        let high = ((hmask[e % 32] >> (e / 32)) & 1) as i32;
        *o = dl[e / 16] * (low - ((high ^ 1) << 2)) as f32;
    }
}

/// The integer form of a block: group `g` of 16 has `w = a[g] * q`, `a[g] = dl`, `q` in -4..3.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 108);
    for (g, v) in a.iter_mut().enumerate().take(16) {
        let lo = (b[96 + g % 8] >> (4 * (g / 8))) & 0x0F;
        let hi = (b[104 + g % 4] >> (2 * (g / 4))) & 3;
        *v = d * ((lo | hi << 4) as i32 - 32) as f32;
    }
    for (e, o) in q.iter_mut().enumerate() {
        let (h, s, j) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((b[32 + 32 * h + j] >> (2 * s)) & 3) as i8;
        let high = ((b[e % 32] >> (e / 32)) & 1) as i8;
        *o = low - ((high ^ 1) << 2);
    }
}
