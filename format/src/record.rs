//! The byte layout of one expert record (docs/FORMAT.md section 5).

use crate::encoding::{align_up, SECTION_ALIGN};
use crate::Encoding;

/// Byte layout of one expert record's sections: offsets from the start of the record of each
/// matrix's weight, scale and bias sections, in the order gate `[I, H]`, up `[I, H]`, down
/// `[H, I]`. Each section starts at a multiple of [`SECTION_ALIGN`] (64 bytes); the record on
/// disk is the payload rounded up to the store's alignment with zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// (weight offset, weight bytes, scale offset, scale bytes) for gate, up, down. A matrix
    /// without scales has scale offset and bytes 0.
    pub sections: [(usize, usize, usize, usize); 3],
    /// (bias offset, bias bytes) for gate, up, down: f32 `[rows]` (`[I]`, `[I]`, `[H]`), or
    /// (0, 0) for a record without biases (format version 2; version 1 records have none).
    pub biases: [(usize, usize); 3],
    /// Bytes before the zero padding.
    pub payload_len: usize,
}

impl RecordLayout {
    /// Layout of an expert with hidden size `hidden` (H) and intermediate size `inter` (I),
    /// with a bias section after each matrix's scale section when `biases` (FORMAT.md
    /// section 5).
    pub fn new(encoding: Encoding, hidden: usize, inter: usize, biases: bool) -> RecordLayout {
        RecordLayout::mixed([encoding; 3], hidden, inter, biases)
    }

    /// [`RecordLayout::new`] with one encoding per matrix (gate, up, down): a record of ggml
    /// block types copied from a GGUF whose tensors differ in type (format version 4, e.g.
    /// llama.cpp's Q4_K_M keeps some layers' `ffn_down_exps` in Q6_K).
    pub fn mixed(
        encodings: [Encoding; 3],
        hidden: usize,
        inter: usize,
        biases: bool,
    ) -> RecordLayout {
        let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
        let mut off = 0usize;
        let mut end = 0usize;
        let mut sections = [(0, 0, 0, 0); 3];
        let mut bias = [(0, 0); 3];
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            let encoding = encodings[i];
            let wb = encoding.weight_bytes(rows, cols);
            let w_off = off;
            end = off + wb;
            off = align_up(end, SECTION_ALIGN);
            let sb = encoding.scale_bytes(rows, cols);
            let s_off = if sb > 0 { off } else { 0 };
            if sb > 0 {
                end = off + sb;
                off = align_up(end, SECTION_ALIGN);
            }
            sections[i] = (w_off, wb, s_off, sb);
            if biases {
                bias[i] = (off, rows * 4);
                end = off + rows * 4;
                off = align_up(end, SECTION_ALIGN);
            }
        }
        // payload_len is the end of the last section (without its trailing 64-byte round-up).
        RecordLayout {
            sections,
            biases: bias,
            payload_len: end,
        }
    }

    /// True when the record carries bias sections.
    pub fn has_biases(&self) -> bool {
        self.biases[0].1 > 0
    }

    /// Record length on disk, bytes: the payload rounded up to `alignment`.
    pub fn record_len(&self, alignment: usize) -> usize {
        align_up(self.payload_len, alignment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_g64_layout() {
        // H = 128, I = 64: gate/up [64, 128] = 4096 bytes + 128 scales; down [128, 64] =
        // 4096 bytes + 128 scales.
        let l = RecordLayout::new(Encoding::Int4 { group_size: 64 }, 128, 64, false);
        assert_eq!(l.sections[0], (0, 4096, 4096, 512));
        assert_eq!(l.sections[1], (4608, 4096, 8704, 512));
        assert_eq!(l.sections[2], (9216, 4096, 13312, 512));
        assert_eq!(l.payload_len, 13824);
        assert_eq!(l.record_len(4096), 16384);
        let b = RecordLayout::new(Encoding::Bf16, 8, 4, false);
        assert_eq!(b.sections[2], (128, 64, 0, 0));
        assert_eq!(b.payload_len, 192);
        assert!(!b.has_biases());
    }

    #[test]
    fn mxfp4_layout_with_biases() {
        // H = 64, I = 96: gate/up [96, 64] = 3072 bytes + 192 e8m0 scales + 384 bias bytes;
        // down [64, 96] = 3072 bytes + 192 scales (64 rows * 3 blocks) + 256 bias bytes.
        let l = RecordLayout::new(Encoding::Mxfp4, 64, 96, true);
        assert_eq!(l.sections[0], (0, 3072, 3072, 192));
        assert_eq!(l.biases[0], (3264, 384));
        assert_eq!(l.sections[1], (3648, 3072, 6720, 192));
        assert_eq!(l.biases[1], (6912, 384));
        assert_eq!(l.sections[2], (7296, 3072, 10368, 192));
        assert_eq!(l.biases[2], (10560, 256));
        assert_eq!(l.payload_len, 10816);
        assert!(l.has_biases());
        // Biases after a bf16 matrix (no scale section), H = 8, I = 4.
        let b = RecordLayout::new(Encoding::Bf16, 8, 4, true);
        assert_eq!(b.sections[0], (0, 64, 0, 0));
        assert_eq!(b.biases[0], (64, 16));
        assert_eq!(b.sections[2], (256, 64, 0, 0));
        assert_eq!(b.biases[2], (320, 32));
        assert_eq!(b.payload_len, 352);
    }
}
