//! Golden stores: a store of every released format version is committed under
//! `store/tests/golden/` and must keep opening, verifying and decoding with this reader.
//!
//! `v1-mixtral-int4-g64` was written by `coli-convert` 0.1.0 (format version 1) from the tiny
//! Mixtral fixture `tests/fixtures/tiny/mixtral_fp8` with default parameters (int4 g64 experts,
//! bf16 dense). Expected values come from that fixture's `expected.json` `int4_probe`, which the
//! fixture script computed with its own numpy implementation of the int4 formula — not from the
//! code under test.

use coli_store::fsck::{check, FsckOptions, NoProgress};
use coli_store::{Encoding, ExpertBuf, ExpertKey, MatrixView, Store};
use std::path::PathBuf;

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// `expected.json` of the tiny fixture `name` (tests/fixtures/tiny/).
fn fixture_expected(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny")
        .join(name)
        .join("expected.json");
    let text = std::fs::read_to_string(&path).expect("read fixture expected.json");
    serde_json::from_str(&text).expect("parse expected.json")
}

/// Every expert record of `store` (manifest order), each fetched with its checksum verified.
fn fetch_all(store: &Store) -> Vec<ExpertBuf> {
    let keys: Vec<ExpertKey> = store
        .manifest()
        .expert_layers
        .iter()
        .flat_map(|l| (0..l.num_experts).map(move |e| ExpertKey::new(l.layer, e)))
        .collect();
    assert_eq!(keys.len(), 24);
    store.fetch(&keys).expect("fetch every golden expert")
}

/// Rows `0..want.len()` of `view`, decoded by the store's reference decode, equal the fixture
/// script's values (`want`: a JSON array of rows) bit for bit.
fn assert_rows(view: &MatrixView<'_>, want: &serde_json::Value, what: &str) {
    let want = want.as_array().expect("probe rows");
    let mut row = vec![0f32; view.cols()];
    for (r, want_row) in want.iter().enumerate() {
        view.dequantize_row(r, &mut row);
        let want_row: Vec<f32> = want_row
            .as_array()
            .expect("probe row")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect();
        assert_eq!(row, want_row, "{what} row {r}");
    }
}

#[test]
fn golden_v1_opens_verifies_and_decodes() {
    let dir = golden("v1-mixtral-int4-g64");
    let store = Store::open(&dir).expect("golden v1 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 1);
    assert_eq!(m.family, "mixtral");
    assert_eq!(m.expert_layers.len(), 3);
    let experts = fetch_all(&store);

    // Expert (0, 0) gate rows 0 and 1 equal the fixture script's int4 g64 values bit for bit.
    let probe = &fixture_expected("mixtral_fp8")["int4_probe"];
    assert_eq!(probe["layer"], 0);
    assert_eq!(probe["expert"], 0);
    let gate = experts[0].gate();
    assert_eq!(gate.encoding(), Encoding::Int4 { group_size: 64 });
    assert_rows(&gate, &probe["int4_dequantized"], "golden v1");

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
/// that fixture's `expected.json` `mxfp4_probe` (the fixture script's own numpy MXFP4 decode).
#[test]
fn golden_v2_opens_verifies_and_decodes() {
    let dir = golden("v2-gpt-oss-mxfp4");
    let store = Store::open(&dir).expect("golden v2 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 2);
    assert_eq!(m.family, "gpt_oss");
    assert_eq!(m.expert_layers.len(), 3);
    let experts = fetch_all(&store);
    assert!(experts.iter().all(|x| x.has_biases()));
    let probe = &fixture_expected("gpt_oss_mxfp4")["mxfp4_probe"];
    assert_eq!(
        (probe["layer"].as_u64(), probe["expert"].as_u64()),
        (Some(0), Some(0))
    );
    let gate = experts[0].gate();
    assert_eq!(gate.encoding(), Encoding::Mxfp4);
    assert_rows(&gate, &probe["values_f32"], "golden v2");
    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}

/// `v3-mixtral-int4-dense` was written by `coli-convert` 0.1.0 (format version 3) from the tiny
/// Mixtral fixture with `--dense int4-g32 --embeddings int4-g64` (int4-g64 experts). Expected
/// values: the fixture's `expected_int4_dense.json` `probe` (layer 0's first attention
/// projection) and `expected.json` `int4_probe`, both computed by the fixture scripts' own numpy
/// int4 formula.
#[test]
fn golden_v3_opens_verifies_and_decodes() {
    let dir = golden("v3-mixtral-int4-dense");
    let store = Store::open(&dir).expect("golden v3 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 3);
    assert_eq!(m.family, "mixtral");
    let experts = fetch_all(&store);
    let probe = &fixture_expected("mixtral_fp8")["int4_probe"];
    assert_rows(
        &experts[0].gate(),
        &probe["int4_dequantized"],
        "golden v3 expert",
    );

    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny/mixtral_fp8/expected_int4_dense.json");
    let dense_probe: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("parse");
    let p = &dense_probe["probe"];
    let t = store
        .dense(p["tensor"].as_str().expect("name"))
        .expect("probe tensor");
    assert_eq!(t.encoding, Encoding::Int4 { group_size: 32 });
    let view = MatrixView::new(t.encoding, t.shape[0], t.shape[1], t.data, t.scales).unwrap();
    assert_rows(&view, &p["int4_dequantized"], "golden v3 dense");
    let embed = store.dense("model.embed_tokens.weight").expect("embedding");
    assert_eq!(embed.encoding, Encoding::Int4 { group_size: 64 });

    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}

/// A golden store converted from a GGUF fixture: it opens at `version`, expert (1, 2)'s three
/// matrices are of `want` with the blocks the fixture script hashed as gguf-py reads them
/// (`probe` of `tests/fixtures/gguf/<fixture>.json`), as is the probe's dense tensor (of
/// `dense`), and fsck passes.
fn check_gguf_golden(dir: &str, fixture: &str, version: u32, want: [Encoding; 3], dense: Encoding) {
    let dir = golden(dir);
    let store = Store::open(&dir).expect("golden GGUF store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, version);
    assert_eq!(m.family, "qwen3_moe");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../tests/fixtures/gguf/{fixture}.json"));
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("parse");
    let p = &exp["probe"];
    let key = ExpertKey::new(1, 2);
    let buf = store.fetch(&[key]).expect("fetch").pop().unwrap();
    assert_eq!(buf.encodings, want);
    for (i, v) in [buf.gate(), buf.up(), buf.down()].iter().enumerate() {
        assert_eq!(v.encoding(), want[i]);
        assert_eq!(
            sha256(v.data()),
            p["expert_sha256"][i].as_str().unwrap(),
            "matrix {i}"
        );
    }
    let t = store
        .dense(p["dense_tensor"].as_str().unwrap())
        .expect("dense");
    assert_eq!(t.encoding, dense);
    assert_eq!(sha256(t.data), p["dense_sha256"].as_str().unwrap());
    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}

/// `v4-qwen3-moe-gguf-q2_k` was written by `coli-convert` 0.1.0 (format version 4) from the GGUF
/// fixture `tests/fixtures/gguf/qwen3_moe-q2_k.gguf` (llama.cpp's Q2_K mix): ggml records whose
/// gate and up are Q2_K and down Q3_K, ggml dense tensors. Expected values: the fixture script's
/// sha256 of the blocks as gguf-py reads them (`probe`), and gguf-py's decode vectors.
#[test]
fn golden_v4_opens_verifies_and_keeps_the_gguf_blocks() {
    use coli_format::encoding::GgmlType;
    let (q2, q3) = (
        Encoding::Ggml(GgmlType::Q2_K),
        Encoding::Ggml(GgmlType::Q3_K),
    );
    check_gguf_golden(
        "v4-qwen3-moe-gguf-q2_k",
        "qwen3_moe-q2_k",
        4,
        [q2, q2, q3],
        q3,
    );
}

/// `v6-qwen3-moe-gguf-iq1` was written by `coli-convert` 0.1.0 (format version 6) from the GGUF
/// fixture `tests/fixtures/gguf/qwen3_moe-iq1.gguf` (llama.cpp's quantizer, per-tensor types):
/// ggml records whose gate is IQ1_S, up IQ1_M and down GGUF's MXFP4, i-quant dense tensors.
/// Expected values: the fixture script's sha256 of the blocks as gguf-py reads them (`probe`).
#[test]
fn golden_v6_opens_verifies_and_keeps_the_iquant_blocks() {
    use coli_format::encoding::GgmlType;
    let want = [
        Encoding::Ggml(GgmlType::IQ1_S),
        Encoding::Ggml(GgmlType::IQ1_M),
        Encoding::Ggml(GgmlType::MXFP4),
    ];
    check_gguf_golden(
        "v6-qwen3-moe-gguf-iq1",
        "qwen3_moe-iq1",
        6,
        want,
        Encoding::Ggml(GgmlType::IQ1_M),
    );
}

/// `v5-inkling2-mxfp8` was written by `coli-convert` 0.1.0 (format version 5) from the tiny
/// Inkling 2 fixture `tests/fixtures/tiny/inkling2_mxfp8` with default parameters (`--experts
/// auto` = mxfp8, the published e4m3 codes and e8m0 scales kept; bf16 dense). Expected values:
/// that fixture's `expected.json` `mxfp8_probe` (transformers' own MXFP8 dequantization of the
/// codes, computed by the fixture script).
#[test]
fn golden_v5_opens_verifies_and_decodes() {
    let dir = golden("v5-inkling2-mxfp8");
    let store = Store::open(&dir).expect("golden v5 store opens");
    let m = store.manifest();
    assert_eq!(m.format_version, 5);
    assert_eq!(m.family, "inkling2_text");
    assert_eq!(m.expert_layers.len(), 5);
    let probe = &fixture_expected("inkling2_mxfp8")["mxfp8_probe"];
    assert_eq!(
        (probe["layer"].as_u64(), probe["expert"].as_u64()),
        (Some(1), Some(0))
    );
    let buf = store
        .fetch(&[ExpertKey::new(1, 0)])
        .expect("fetch")
        .pop()
        .unwrap();
    let gate = buf.gate();
    assert_eq!(gate.encoding(), Encoding::Mxfp8);
    assert_rows(&gate, &probe["values_f32"], "golden v5");
    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}

/// `v7-qwen3-moe-int4-interleaved` was written by `coli-convert` 0.1.0 (format version 7) from the
/// tiny Qwen3-MoE BF16 fixture with `--experts int4-g64 --dense int4-g32 --embeddings int4-g64`
/// and the default `--matrix-order interleaved`: the int4 matrices of whole 64-column chunks and
/// at least 16 rows are stored in the interleaved row order (INDEX flag bit 1 for the records'
/// gate and up, [40, 64]; down, [64, 40], stays row-major; MANIFEST `interleaved` for dense
/// matrices such as `k_proj`). Expected values: the fixture's `expected.json` `int4_probe` (expert
/// 0's gate) and `expected_int4_dense.json` `probe` (`k_proj`), computed by the fixture scripts'
/// own numpy int4 formula.
#[test]
fn golden_v7_opens_verifies_and_decodes_interleaved_matrices() {
    let dir = golden("v7-qwen3-moe-int4-interleaved");
    let store = Store::open(&dir).expect("golden v7 store opens");
    assert_eq!(store.manifest().format_version, 7);
    let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
    let experts = store.fetch(&keys).expect("fetch every golden expert");
    for x in &experts {
        assert_eq!(x.interleaved(), [true, true, false], "{}", x.key);
        assert!(x.gate().is_interleaved() && !x.down().is_interleaved());
    }
    let probe = &fixture_expected("qwen3_moe_bf16")["int4_probe"];
    assert_eq!(
        (probe["layer"].as_u64(), probe["expert"].as_u64()),
        (Some(0), Some(0))
    );
    assert_rows(
        &experts[0].gate(),
        &probe["int4_dequantized"],
        "golden v7 expert",
    );
    let dense_probe = {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tiny/qwen3_moe_bf16/expected_int4_dense.json");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["probe"].clone()
    };
    let k = store
        .dense(dense_probe["tensor"].as_str().unwrap())
        .unwrap();
    assert!(k.interleaved && k.matrix().is_interleaved());
    assert_rows(
        &k.matrix(),
        &dense_probe["int4_dequantized"],
        "golden v7 dense",
    );
    // The row-major copy the store makes decodes the same rows.
    let rm = store
        .dense_ordered(k.name, false, MatrixView::interleave)
        .unwrap();
    assert!(!rm.is_interleaved());
    assert_rows(
        &rm,
        &dense_probe["int4_dequantized"],
        "golden v7 dense, row-major copy",
    );
    // The same records mapped in place read the same bytes as the fetched ones.
    let mapped = store.map_records(&keys).expect("map every golden record");
    for (m, f) in mapped.iter().zip(&experts) {
        assert!(m.is_mapped() && !f.is_mapped());
        assert_eq!(m.bytes(), f.bytes());
        assert_eq!(m.interleaved(), f.interleaved());
    }
    // Reordered back to row-major, a record decodes the same rows, its views row-major.
    let mut back = store.fetch_one(keys[0]).unwrap();
    back.deinterleave(|_| false);
    assert_eq!(back.interleaved(), [false; 3]);
    assert!(!back.gate().is_interleaved());
    assert_rows(
        &back.gate(),
        &probe["int4_dequantized"],
        "golden v7 expert, row-major",
    );
    let r = check(&dir, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
}

fn sha256(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}
