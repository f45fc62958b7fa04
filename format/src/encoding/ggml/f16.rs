//! ggml type 1, `f16`: one IEEE binary16 weight per 2 bytes, little-endian; decoded exactly.

pub(super) fn decode(b: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = super::f16(b, 2 * i);
    }
}
