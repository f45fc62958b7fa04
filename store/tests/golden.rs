//! Golden stores: a store of every released format version is committed under
//! `store/tests/golden/` and must keep opening, verifying and decoding with this reader.
//!
//! `v1-mixtral-int4-g64` was written by `coli-convert` 0.1.0 (format version 1) from the tiny
//! Mixtral fixture `tests/fixtures/tiny/mixtral_fp8` with default parameters (int4 g64 experts,
//! bf16 dense). Expected values come from that fixture's `expected.json` `int4_probe`, which the
//! fixture script computed with its own numpy implementation of the int4 formula — not from the
//! code under test.

use coli_store::fsck::{check, FsckOptions, NoProgress};
use coli_store::{Encoding, ExpertKey, Store};
use std::path::PathBuf;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn fixture_probe() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny/mixtral_fp8/expected.json");
    let text = std::fs::read_to_string(&path).expect("read fixture expected.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("parse expected.json");
    v["int4_probe"].clone()
}

#[test]
fn golden_v1_opens_verifies_and_decodes() {
    let dir = golden("v1-mixtral-int4-g64");
    let store = Store::open(&dir).expect("golden v1 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 1);
    assert_eq!(m.family, "mixtral");
    assert_eq!(m.expert_layers.len(), 3);

    // Every record fetches with its checksum verified.
    let keys: Vec<ExpertKey> = m
        .expert_layers
        .iter()
        .flat_map(|l| (0..l.num_experts).map(move |e| ExpertKey::new(l.layer, e)))
        .collect();
    assert_eq!(keys.len(), 24);
    let experts = store.fetch(&keys).expect("fetch every golden expert");

    // Expert (0, 0) gate rows 0 and 1 equal the fixture script's int4 g64 values bit for bit.
    let probe = fixture_probe();
    assert_eq!(probe["layer"], 0);
    assert_eq!(probe["expert"], 0);
    let gate = experts[0].gate();
    assert_eq!(gate.encoding(), Encoding::Int4 { group_size: 64 });
    let want = probe["int4_dequantized"].as_array().expect("probe rows");
    let mut row = vec![0f32; gate.cols()];
    for (r, want_row) in want.iter().enumerate() {
        gate.dequantize_row(r, &mut row);
        let want_row: Vec<f32> = want_row
            .as_array()
            .expect("probe row")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_eq!(row, want_row, "golden v1 gate row {r}");
    }

    // fsck finds it clean.
    let report = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(
        report.exit_code, 0,
        "fsck of the golden v1 store: {report:?}"
    );
}

/// `v2-gpt-oss-mxfp4` was written by `coli-convert` 0.1.0 (format version 2) from the tiny
/// gpt-oss fixture `tests/fixtures/tiny/gpt_oss_mxfp4` with default parameters (`--experts
/// auto` = mxfp4, kept as published, with expert biases; bf16 dense). Expected values come from
/// that fixture's `expected.json` `mxfp4_probe` (the fixture script's own numpy MXFP4 decode)
/// and the checkpoint's BF16 biases.
#[test]
fn golden_v2_opens_verifies_and_decodes() {
    let dir = golden("v2-gpt-oss-mxfp4");
    let store = Store::open(&dir).expect("golden v2 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 2);
    assert_eq!(m.family, "gpt_oss");
    assert_eq!(m.expert_layers.len(), 3);
    let keys: Vec<ExpertKey> = m
        .expert_layers
        .iter()
        .flat_map(|l| (0..l.num_experts).map(move |e| ExpertKey::new(l.layer, e)))
        .collect();
    assert_eq!(keys.len(), 24);
    let experts = store.fetch(&keys).expect("fetch every golden expert");
    assert!(experts.iter().all(|x| x.has_biases()));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny/gpt_oss_mxfp4/expected.json");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read expected.json"))
            .expect("parse expected.json");
    let probe = &exp["mxfp4_probe"];
    assert_eq!(
        (probe["layer"].as_u64(), probe["expert"].as_u64()),
        (Some(0), Some(0))
    );
    let gate = experts[0].gate();
    assert_eq!(gate.encoding(), Encoding::Mxfp4);
    let want = probe["values_f32"].as_array().expect("probe rows");
    let mut row = vec![0f32; gate.cols()];
    for (r, want_row) in want.iter().enumerate() {
        gate.dequantize_row(r, &mut row);
        let want_row: Vec<f32> = want_row
            .as_array()
            .expect("probe row")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_eq!(row, want_row, "golden v2 gate row {r}");
    }
    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}
