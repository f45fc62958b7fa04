//! The byte layout of one expert record (docs/FORMAT.md section 5).

use crate::encoding::{align_up, SECTION_ALIGN};
use crate::Encoding;

/// Byte layout of one expert record's sections: offsets from the start of the record of each
/// matrix's weight and scale sections, in the order gate `[I, H]`, up `[I, H]`, down `[H, I]`.
/// Each section starts at a multiple of [`SECTION_ALIGN`] (64 bytes); the record on disk is the
/// payload rounded up to the store's alignment with zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordLayout {
    /// (weight offset, weight bytes, scale offset, scale bytes) for gate, up, down. A matrix
    /// without scales has scale offset and bytes 0.
    pub sections: [(usize, usize, usize, usize); 3],
    /// Bytes before the zero padding.
    pub payload_len: usize,
}

impl RecordLayout {
    /// Layout of an expert with hidden size `hidden` (H) and intermediate size `inter` (I).
    pub fn new(encoding: Encoding, hidden: usize, inter: usize) -> RecordLayout {
        let shapes = [(inter, hidden), (inter, hidden), (hidden, inter)];
        let mut off = 0usize;
        let mut sections = [(0, 0, 0, 0); 3];
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            let wb = encoding.weight_bytes(rows, cols);
            let w_off = off;
            off = align_up(off + wb, SECTION_ALIGN);
            let sb = encoding.scale_bytes(rows, cols);
            let s_off = if sb > 0 { off } else { 0 };
            if sb > 0 {
                off = align_up(off + sb, SECTION_ALIGN);
            }
            sections[i] = (w_off, wb, s_off, sb);
        }
        // payload_len is the end of the last section (without its trailing 64-byte round-up).
        let (w_off, wb, s_off, sb) = sections[2];
        let payload_len = if sb > 0 { s_off + sb } else { w_off + wb };
        RecordLayout {
            sections,
            payload_len,
        }
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
        let l = RecordLayout::new(Encoding::Int4 { group_size: 64 }, 128, 64);
        assert_eq!(l.sections[0], (0, 4096, 4096, 512));
        assert_eq!(l.sections[1], (4608, 4096, 8704, 512));
        assert_eq!(l.sections[2], (9216, 4096, 13312, 512));
        assert_eq!(l.payload_len, 13824);
        assert_eq!(l.record_len(4096), 16384);
        let b = RecordLayout::new(Encoding::Bf16, 8, 4);
        assert_eq!(b.sections[2], (128, 64, 0, 0));
        assert_eq!(b.payload_len, 192);
    }
}
