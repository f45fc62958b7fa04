//! Format version 2 (docs/FORMAT.md sections 3, 5, 6, 12): mxfp4 expert records and records
//! with bias sections are written as version 2 stores and read back exactly; stores without
//! them stay version 1 (byte-identical to what a version-1 writer produced); a version-1 store
//! whose INDEX claims biases or mxfp4 is refused as damage, naming the record.

mod common;
use coli_store::*;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn with_biases(m: &mut Model, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for (_, _, _, mats) in &mut m.experts {
        for mat in mats.iter_mut() {
            mat.bias = Some((0..mat.rows).map(|_| rng.gen_range(-2.0f32..2.0)).collect());
        }
    }
}

fn open(target: &std::path::Path) -> Store {
    Store::open(target).unwrap()
}

#[test]
fn mxfp4_records_with_biases_round_trip_as_version_2() {
    for (enc, biases) in [
        (Encoding::Mxfp4, true),
        (Encoding::Mxfp4, false),
        (Encoding::Mxfp8, false),
        (Encoding::Mxfp8, true),
        (Encoding::Int4 { group_size: 32 }, true),
        (Encoding::Bf16, true),
    ] {
        let p = ModelParams {
            encoding: enc,
            hidden: 64,
            inter: 96,
            ..Default::default()
        };
        let mut m = make_model(&p);
        if biases {
            with_biases(&mut m, 11);
        }
        let t = tempdir();
        let target = target_in(&t);
        assert_eq!(write_model(&target, &m), "fresh");
        let store = open(&target);
        assert_eq!(
            store.manifest().format_version,
            if enc == Encoding::Mxfp8 { 5 } else { 2 },
            "{} biases {biases}",
            enc.name()
        );
        let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
        let bufs = store.fetch(&keys).unwrap();
        for ((k, _, _, mats), b) in m.experts.iter().zip(&bufs) {
            assert_eq!(b.has_biases(), biases, "{k}");
            let views = [b.gate(), b.up(), b.down()];
            let bs = [b.gate_bias(), b.up_bias(), b.down_bias()];
            for ((view, want), bias) in views.iter().zip(mats).zip(bs) {
                assert_eq!(view.encoding(), enc);
                assert_eq!(view.data(), &want.data[..], "{k} data");
                assert_eq!(view.scale_section(), want.scale_section(), "{k} scales");
                assert_eq!(
                    bias.map(|b| b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    want.bias
                        .as_ref()
                        .map(|b| b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    "{k} bias"
                );
                // The reference decode of the stored view equals that of the input sections.
                let input = MatrixView::from_sections(
                    want.encoding,
                    want.rows,
                    want.cols,
                    &want.data,
                    want.scale_section(),
                )
                .unwrap();
                let (mut got, mut exp) = (vec![0f32; want.cols], vec![0f32; want.cols]);
                for r in [0, want.rows - 1] {
                    view.dequantize_row(r, &mut got);
                    input.dequantize_row(r, &mut exp);
                    assert_eq!(
                        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        exp.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    );
                }
            }
        }
        let r = fsck::check(&target, &fsck::FsckOptions::default(), &fsck::NoProgress);
        assert_eq!(r.exit_code(), 0, "{r:?}");
    }
}

#[test]
fn stores_without_version_2_features_stay_version_1() {
    let m = make_model(&ModelParams::default());
    let t = tempdir();
    let target = target_in(&t);
    write_model(&target, &m);
    assert_eq!(open(&target).manifest().format_version, 1);
    let index = std::fs::read(target.join("INDEX")).unwrap();
    assert_eq!(u32::from_le_bytes(index[8..12].try_into().unwrap()), 1);
    let seg = std::fs::read(target.join("segments/seg-00000.bin")).unwrap();
    assert_eq!(u32::from_le_bytes(seg[8..12].try_into().unwrap()), 1);
}

#[test]
fn a_version_1_store_claiming_biases_is_refused() {
    let m = make_model(&ModelParams::default());
    let t = tempdir();
    let target = target_in(&t);
    write_model(&target, &m);
    // Set the biases flag (bytes 56..60) of record 1 and fix its crc32: still version 1.
    rewrite_index(&target, |recs| {
        recs[1][56] = 1;
        let crc = crc32fast_hash(&recs[1][..60]);
        recs[1][60..64].copy_from_slice(&crc.to_le_bytes());
    });
    let err = match Store::open(&target) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("opened a version-1 store with a biases flag"),
    };
    assert!(err.contains("record 1") && err.contains("flags"), "{err}");
}
