//! Encoding id 1, `f32`: little-endian IEEE binary32 values, no scales. Used for 1-D tensors
//! (norms, biases) and for F16/F32 sources kept as they are (F16 widens exactly).

use super::{Codec, ErrSums};
use crate::MatrixView;

/// The `f32` codec.
#[derive(Clone, Copy, Debug)]
pub struct F32;

impl Codec for F32 {
    fn id(&self) -> u16 {
        1
    }
    fn group_size_field(&self) -> u16 {
        0
    }
    fn name(&self) -> String {
        "f32".into()
    }
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize {
        rows * cols * 4
    }
    fn scale_count(&self, _rows: usize, _cols: usize) -> usize {
        0
    }
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        let cols = m.cols();
        let row = &m.data()[(r * cols + c0) * 4..(r * cols + c1) * 4];
        for (o, b) in out[..c1 - c0].iter_mut().zip(row.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    /// The values as they are: no error; `w2` summed in column order.
    fn encode_row(&self, w: &[f32], dst: &mut [u8], _scales: &mut [f32]) -> Option<ErrSums> {
        let mut s = ErrSums::default();
        for (d, &x) in dst.chunks_exact_mut(4).zip(w) {
            d.copy_from_slice(&x.to_le_bytes());
            s.err2 += 0.0;
            s.w2 += (x as f64) * (x as f64);
        }
        Some(s)
    }
}
