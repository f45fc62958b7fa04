//! ggml type 14, `q6_k`: blocks of 256 weights in 210 bytes: 128 bytes `ql` (0..128), 64 bytes
//! `qh` (128..192), 16 signed bytes `scales` (192..208), f16 `d` (208..210). Weight
//! `e = 128 h + k` (`h < 2`, `k < 128`) has the low nibble `k / 64` of `ql[64 h + k % 64]` and
//! the two high bits `(qh[32 h + k % 32] >> 2 (k / 32)) & 3`; its code is
//! `(lo | hi << 4) - 32` and `w = (d * scales[e / 16]) * q`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = super::f16(b, 208);
    for (e, o) in out.iter_mut().enumerate() {
        let (h, k) = (e / 128, e % 128);
        let lo = (ql[64 * h + k % 64] >> (4 * (k / 64))) & 0x0F;
        let hi = (qh[32 * h + k % 32] >> (2 * (k / 32))) & 3;
        let q = (lo | hi << 4) as i32 - 32;
        *o = (d * (sc[e / 16] as i8) as f32) * q as f32;
    }
}

/// The integer form of a block: group `g` of 16 has `w = a[g] * q`, `a[g] = d * scales[g]`,
/// `q` in -32..31.
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    let d = super::f16(b, 208);
    for (g, v) in a.iter_mut().enumerate().take(16) {
        *v = d * (b[192 + g] as i8) as f32;
    }
    for (e, o) in q.iter_mut().enumerate() {
        let (h, k) = (e / 128, e % 128);
        let lo = (b[64 * h + k % 64] >> (4 * (k / 64))) & 0x0F;
        let hi = (b[128 + 32 * h + k % 32] >> (2 * (k / 32))) & 3;
        *o = (lo | hi << 4) as i8 - 32;
    }
}
