//! The ggml block decoders against gguf-py's numpy dequantization, bit for bit: vectors
//! written once by `tests/fixtures/gguf/make_ggml_vectors.py` (gguf 0.19).

use coli_format::encoding::ggml::ALL;
use coli_format::{Encoding, MatrixView};
use std::path::PathBuf;

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf/vectors")
}

#[test]
fn every_type_decodes_as_gguf_py() {
    for t in ALL {
        let name = t.name();
        let blocks = std::fs::read(vectors().join(format!("{name}.blocks"))).expect(name);
        let want: Vec<u32> = std::fs::read(vectors().join(format!("{name}.f32")))
            .expect(name)
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let n = blocks.len() / t.type_size();
        assert_eq!(n * t.type_size(), blocks.len(), "{name}");
        assert_eq!(want.len(), n * t.block_size(), "{name}");
        let mut got = vec![0f32; want.len()];
        t.decode_blocks(&blocks, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "{name}: value {i}: {g} vs {}",
                f32::from_bits(*w)
            );
        }
        // The same blocks as a [2, cols] matrix, decoded through MatrixView in pieces
        // that cut blocks (decode_cols of any column range is the row's slice).
        let enc = Encoding::Ggml(t);
        let cols = want.len() / 2;
        let m = MatrixView::new(enc, 2, cols, &blocks, &[]).unwrap();
        for r in 0..2 {
            for (c0, c1) in [(0, cols), (3, cols - 5), (cols / 2 - 1, cols / 2 + 40)] {
                let mut out = vec![0f32; c1 - c0];
                m.decode_cols(r, c0, c1, &mut out);
                for (k, v) in out.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        want[r * cols + c0 + k],
                        "{name} row {r} col {}",
                        c0 + k
                    );
                }
            }
        }
        // cols not a multiple of the block size is refused.
        if t.block_size() > 1 {
            let e = MatrixView::new(enc, 1, t.block_size() - 1, &blocks[..t.type_size()], &[]);
            assert!(e.is_err(), "{name}");
        }
    }
}

#[test]
fn integer_forms_give_the_reference_values() {
    for t in ALL.into_iter().filter(|t| t.code_group().is_some()) {
        let name = t.name();
        let blocks = std::fs::read(vectors().join(format!("{name}.blocks"))).expect(name);
        let g = t.code_group().unwrap();
        for blk in blocks.chunks_exact(t.type_size()) {
            let mut want = vec![0f32; t.block_size()];
            t.decode_block(blk, &mut want);
            let (mut q, mut a, mut m) = (vec![0i8; t.block_size()], [0f32; 16], [0f32; 16]);
            t.codes(blk, &mut q, &mut a, &mut m);
            for c in 0..t.block_size() {
                let v = a[c / g] * q[c] as f32;
                let v = if t.has_offset() { v + m[c / g] } else { v };
                assert_eq!(v.to_bits(), want[c].to_bits(), "{name} column {c}");
            }
        }
    }
}
