//! DeepSeek-V4 from GGUF (issues 46, 47): llama.cpp's own converter (`conversion/deepseek.py`
//! `DeepseekV4Model`) writes a tiny random DeepSeek-V4 in the release's layout (the generator of
//! `tests/fixtures/make_deepseek_v4_fixtures.py`, HCA blocks of 128) as a `deepseek4` GGUF
//! (`tests/fixtures/gguf/make_deepseek_v4_gguf.py`): FP8 linears requantized to Q8_0, FP4
//! experts repacked to MXFP4 (exact), BF16 matrices and F32 tensors as they are (the BF16 norms
//! as F32, exactly), the hash layers' routing
//! tables as I32. coli keeps every block as the file holds it (the tables come back as f32
//! ids) and runs the model the metadata describes: transformers 5.25 on the values the file
//! holds (gguf-py's dequantization) is the oracle: greedy 32, teacher-forced top-1, a 150-token
//! prompt (one HCA block, 37 CSA blocks) and last logits within 1e-3.

use coli_engine::{Engine, EngineOptions};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{byte_after, open_store, placement_keeps_greedy};
use serde_json::Value;
use std::path::Path;

const NAME: &str = "deepseek_v4-mxfp4";

fn oracle() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/gguf/{NAME}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn deepseek4_gguf_runs_as_the_oracle() {
    let exp = oracle();
    let src = coli_tests::gguf_fixture(NAME);
    assert_eq!(
        coli_tests::sha256_hex(&std::fs::read(&src).unwrap()),
        exp["gguf_sha256"].as_str().unwrap(),
        "the committed GGUF is the one make_deepseek_v4_gguf.py wrote"
    );
    let (_tmp, dir) = coli_tests::gguf_convert(NAME);
    let store = open_store(&dir, true, IoPreference::Auto);
    let m = store.manifest();
    // MXFP4 experts: the i-quant / MXFP4 format version.
    assert_eq!(m.format_version, 6);
    let c = &m.config;
    assert_eq!(c["model_type"], "deepseek_v4");
    assert_eq!(
        c["layer_types"],
        serde_json::json!([
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
            "sliding_attention"
        ])
    );
    assert_eq!(
        c["compress_rates"],
        serde_json::json!({"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
    );
    assert_eq!(c["num_hash_layers"], 2);
    assert_eq!(c["scoring_func"], "sqrtsoftplus");
    // Every expert record is the file's MXFP4 blocks; the Q8_0 linears stay Q8_0.
    let types = &exp["tensor_types"];
    assert_eq!(types["blk.2.ffn_down_exps.weight"], "MXFP4");
    assert_eq!(types["blk.0.attn_q_b.weight"], "Q8_0");
    let d = m
        .dense
        .iter()
        .find(|d| d.name == "layers.0.attn.wq_b.weight")
        .expect("wq_b");
    let enc = |d: &coli_format::disk::manifest::DenseEntry| {
        coli_store::Encoding::from_id(d.encoding, d.group_size).unwrap()
    };
    assert_eq!(coli_tests::gguf_type_name(enc(d)), "Q8_0");
    // The hash layers' routing tables are the file's ids, as f32.
    let t = m
        .dense
        .iter()
        .find(|d| d.name == "layers.1.ffn.gate.tid2eid")
        .expect("tid2eid");
    assert_eq!(enc(t), coli_store::Encoding::F32);

    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    coli_tests::check_oracle(&mut e, &exp, "", NAME);
    // No MTP layer (llama.cpp's converter leaves V4's out): `--speculate mtp` is told why.
    assert!(!e.has_mtp());
    let why = e.mtp_absence().unwrap();
    assert!(why.contains("GGUF") && why.contains("ngram"), "{why}");
}

#[test]
fn deepseek4_gguf_placement_never_changes_tokens() {
    let exp = oracle();
    let (_tmp, dir) = coli_tests::gguf_convert(NAME);
    placement_keeps_greedy(
        &dir,
        ExpertKey::new(2, 0),
        &coli_tests::ids(&exp["prompt_ids"]),
        &coli_tests::ids(&exp["greedy"]),
        NAME,
    );
}

#[test]
fn deepseek4_gguf_plan_counts_the_store_and_export_refuses() {
    let (tmp, dir) = coli_tests::gguf_convert(NAME);
    coli_tests::check_gguf_plan(&coli_tests::gguf_fixture(NAME), &dir, NAME);
    // The store holds the routing tables as f32 where the file holds I32: not written back.
    let out = tmp.path().join("back.gguf");
    let e = coli_tools::export::run(&dir, &out).unwrap_err().to_string();
    assert!(
        e.contains("deepseek4")
            && e.contains("not written back")
            && e.contains("deepseek_v4-mxfp4.gguf"),
        "{e}"
    );
    assert!(!out.exists());
}

#[test]
fn deepseek4_gguf_bad_inputs_are_refused_naming_the_key_or_tensor() {
    let src = coli_tests::gguf_fixture(NAME);
    let g = coli_convert::gguf::file::Gguf::open(&src).unwrap();
    let table = g.data(&g.tensors["blk.0.ffn_gate_tid2eid.weight"]).to_vec();
    drop(g);
    // A routing table entry that is no expert id.
    let e = coli_tests::gguf_refused(&src, "tid.gguf", |b| {
        let at = byte_after(b, &table) - table.len();
        b[at..at + 4].copy_from_slice(&9i32.to_le_bytes());
    });
    assert!(
        e.contains("blk.0.ffn_gate_tid2eid.weight") && e.contains("entry 0 is 9"),
        "{e}"
    );
    // Softmax routing (llama.cpp's expert_gating_func 1; a u32 after the type).
    let e = coli_tests::gguf_refused(&src, "gating.gguf", |b| {
        let at = byte_after(b, b"deepseek4.expert_gating_func") + 4;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(
        e.contains("deepseek4.expert_gating_func") && e.contains("sqrtsoftplus"),
        "{e}"
    );
    // Two CSA layers pooling at different rates (layer 3's ratio 4 -> 8; the array: value type,
    // element type, count, then one u32 per layer).
    let e = coli_tests::gguf_refused(&src, "ratios.gguf", |b| {
        let at = byte_after(b, b"deepseek4.attention.compress_ratios") + 16 + 3 * 4;
        b[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
    });
    assert!(
        e.contains("deepseek4.attention.compress_ratios") && e.contains("layer 3"),
        "{e}"
    );
    // Hyper-connection width that contradicts the output width.
    let e = coli_tests::gguf_refused(&src, "hc.gguf", |b| {
        let at = byte_after(b, b"deepseek4.hyper_connection.count") + 4;
        b[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
    });
    assert!(e.contains("deepseek4.embedding_length_out"), "{e}");
    // An attention scaling the config cannot carry (llama.cpp applies it whatever the type).
    let e = coli_tests::gguf_refused(&src, "attn.gguf", |b| {
        let kv = coli_tests::gguf_kv("deepseek4.rope.scaling.attn_factor", 6, &2f32.to_le_bytes());
        coli_tests::insert_gguf_kvs(b, &kv, 1);
    });
    assert!(e.contains("deepseek4.rope.scaling.attn_factor"), "{e}");
}
