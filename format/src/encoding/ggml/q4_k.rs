//! ggml type 12, `q4_k`: blocks of 256 weights in 144 bytes: f16 `d` (0..2), f16 `dmin` (2..4),
//! 12 bytes of packed 6-bit scales and mins (4..16, [`scale_min`]), 128 bytes `qs`. Weight
//! `e = 64 i + 32 s + j` (`i < 4`, `s < 2`, `j < 32`) is nibble `s` of `qs[32 i + j]`, in group
//! `g = e / 32` with `dl = d * sc[g]`, `ml = dmin * m[g]`; `w = dl * q - ml`.

/// The 8 six-bit scales and 8 six-bit mins packed in 12 bytes `k` (`get_scale_min_k4`):
/// for `g < 4`, `sc = k[g] & 63`, `m = k[g + 4] & 63`; for `g >= 4`,
/// `sc = k[g + 4] & 15 | (k[g - 4] >> 6) << 4`, `m = k[g + 4] >> 4 | (k[g] >> 6) << 4`.
#[inline]
pub(super) fn scale_min(k: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for g in 0..8 {
        if g < 4 {
            sc[g] = k[g] & 63;
            m[g] = k[g + 4] & 63;
        } else {
            sc[g] = (k[g + 4] & 0x0F) | ((k[g - 4] >> 2) & 0x30);
            m[g] = (k[g + 4] >> 4) | ((k[g] >> 2) & 0x30);
        }
    }
    (sc, m)
}

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (super::f16(b, 0), super::f16(b, 2));
    let (sc, m) = scale_min(&b[4..16]);
    let qs = &b[16..144];
    for g in 0..8 {
        let dl = d * sc[g] as f32;
        let ml = dmin * m[g] as f32;
        let (i, s) = (g / 2, g % 2);
        for j in 0..32 {
            let q = (qs[32 * i + j] >> (4 * s)) & 0x0F;
            out[32 * g + j] = dl * q as f32 - ml;
        }
    }
}

/// The integer form of a block: group `g` of 32 has `w = a[g] * q + m[g]`, `a[g] = dl`,
/// `m[g] = -ml`.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    let (d, dmin) = (super::f16(b, 0), super::f16(b, 2));
    let (sc, mn) = scale_min(&b[4..16]);
    for g in 0..8 {
        a[g] = d * sc[g] as f32;
        m[g] = -(dmin * mn[g] as f32);
        let (i, s) = (g / 2, g % 2);
        for j in 0..32 {
            q[32 * g + j] = ((b[16 + 32 * i + j] >> (4 * s)) & 0x0F) as i8;
        }
    }
}
