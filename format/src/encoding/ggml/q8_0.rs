//! ggml type 8, `q8_0`: blocks of 32 weights in 34 bytes: f16 `d`, then 32 signed bytes;
//! `w = q * d`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// The integer form of a block: `w = a[0] * q` (the reference's `q * d`, the same product).
pub(super) fn codes(b: &[u8], q: &mut [i8], a: &mut [f32], _m: &mut [f32]) {
    a[0] = super::f16(b, 0);
    for (o, &v) in q.iter_mut().zip(&b[2..34]) {
        *o = v as i8;
    }
}
