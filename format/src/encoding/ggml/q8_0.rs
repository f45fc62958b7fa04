//! ggml type 8, `q8_0`: blocks of 32 weights in 34 bytes: f16 `d`, then 32 signed bytes;
//! `w = q * d`.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    let d = super::f16(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}
