//! GLM-5's MTP layer as the releases publish it, and `--mtp none` (issue 41).
//!
//! The published GLM-5 / 5.1 / 5.2 checkpoints ship their MTP layer (`model.layers.78`) without
//! `embed_tokens` and `shared_head.head`: the main model's embedding and lm_head serve it
//! (tests/fixtures/published/glm-5*.tensors.txt). Here the glm5_fp8 fixture without those two
//! tensors:
//!
//! - converts; the MANIFEST records which main tensors stand in (`mtp_shared`), `coli info`
//!   reports it, and the store is smaller by exactly the two copies;
//! - generates the full fixture's tokens (transformers' `expected.json`) with speculation off
//!   and with MTP drafts;
//! - drafts with the main embedding and head: its MTP logits equal, bit for bit, those of a
//!   checkpoint whose MTP copies hold the main tensors' bytes;
//! - a checkpoint missing any other tensor of the MTP layer is still refused, naming it;
//!   DeepSeek-V3.2 (whose releases carry real copies) still requires both.
//!
//! `--mtp none` leaves the MTP layer out (any family), records it, and `--speculate mtp` on such
//! a store names the option.

use coli_convert::checkpoint::Checkpoint;
use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, GenerateParams, Speculate, SpeculationParams};
use coli_store::{IoPreference, Store};
use coli_tests::{
    copy_checkpoint_without, encoding, expected, fixture_dir, greedy, ids, open_store,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const GLM5: &str = "glm5_fp8";
const EMBED: &str = "model.layers.3.embed_tokens.weight";
const HEAD: &str = "model.layers.3.shared_head.head.weight";

fn enc(mtp: Option<&str>) -> Encodings {
    Encodings {
        experts: encoding("int4-g64"),
        dense: encoding("bf16"),
        roles: Default::default(),
        mtp: mtp.map(encoding),
        embeddings: None,
    }
}

fn convert(input: &Path, out: &Path, encodings: Encodings) -> Result<(), String> {
    coli_convert::run(&Options {
        input: input.to_path_buf(),
        output: out.to_path_buf(),
        encodings,
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .map(|_| ())
    .map_err(|e| e.to_string())
}

fn open(dir: &Path) -> Store {
    open_store(dir, true, IoPreference::Auto)
}

fn files_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in walk(dir) {
        n += std::fs::metadata(e).unwrap().len();
    }
    n
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Greedy tokens with speculation `mode` (MTP drafts on every pass: gate off).
fn tokens(store: &Store, prompt: &[u32], n: usize, mode: Speculate) -> Vec<u32> {
    let mut e = Engine::new(store, &EngineOptions::default()).unwrap();
    if mode == Speculate::Off {
        return greedy(&mut e, prompt, n);
    }
    let params = GenerateParams {
        max_tokens: n,
        sampling: Default::default(),
        stop_on_eos: true,
        speculation: SpeculationParams {
            mode,
            draft_tokens: 2,
            gate: false,
            ..Default::default()
        },
    };
    let g = e.generate(prompt, &params, |_| Ok(true)).unwrap();
    assert!(g.stats.speculation.verify_passes > 0, "MTP never drafted");
    g.tokens
}

/// The glm5 fixture as GLM-5 is published: no MTP embed_tokens / shared_head.head.
fn glm5_as_published(tmp: &Path) -> PathBuf {
    let ck = tmp.join("glm5-published");
    copy_checkpoint_without(&fixture_dir(GLM5), &ck, |n| n == EMBED || n == HEAD);
    ck
}

#[test]
fn glm5_mtp_layer_without_its_embedding_and_head_converts_and_runs() {
    let exp = expected(GLM5);
    let tmp = tempfile::tempdir().unwrap();
    let published = glm5_as_published(tmp.path());
    let (shared_dir, full_dir) = (tmp.path().join("shared"), tmp.path().join("full"));
    convert(&published, &shared_dir, enc(Some("int8"))).unwrap();
    convert(&fixture_dir(GLM5), &full_dir, enc(Some("int8"))).unwrap();
    let (shared, full) = (open(&shared_dir), open(&full_dir));

    // The MANIFEST records the stand-ins; the copies are absent.
    let want: BTreeMap<String, String> = [
        (EMBED.to_string(), "model.embed_tokens.weight".to_string()),
        (HEAD.to_string(), "lm_head.weight".to_string()),
    ]
    .into();
    assert_eq!(shared.manifest().mtp_shared, want);
    assert!(full.manifest().mtp_shared.is_empty());
    let names =
        |s: &Store| -> Vec<String> { s.manifest().dense.iter().map(|d| d.name.clone()).collect() };
    let (a, b) = (names(&shared), names(&full));
    let missing: Vec<&String> = b.iter().filter(|n| !a.contains(n)).collect();
    assert_eq!(missing, [&EMBED.to_string(), &HEAD.to_string()]);
    // Smaller by the two copies (each section of dense.bin is 64-byte aligned; the MANIFEST
    // loses two entries and gains the mtp_shared record).
    let copies: u64 = full
        .manifest()
        .dense
        .iter()
        .filter(|d| d.name == EMBED || d.name == HEAD)
        .map(|d| d.length + d.scales_length)
        .sum();
    let dense_len = |s: &Store| s.manifest().dense_file.length;
    assert_eq!(dense_len(&full) - dense_len(&shared), copies);
    assert!(files_bytes(&full_dir) - files_bytes(&shared_dir) >= copies - 4096);

    // coli info says which head the MTP layer uses.
    let info = coli_tools::info::report(&shared_dir).unwrap();
    assert_eq!(info["mtp_shared"][HEAD], "lm_head.weight");
    assert_eq!(info["mtp_layer"], true);

    // The main model's tokens, with and without MTP drafts (int4 experts: greedy_int4_g64).
    let prompt = ids(&exp["prompt_ids"]);
    let want = ids(&exp["greedy_int4_g64"]);
    for mode in [Speculate::Off, Speculate::Mtp] {
        assert_eq!(tokens(&shared, &prompt, 32, mode), want, "shared, {mode}");
        assert_eq!(tokens(&full, &prompt, 32, mode), want, "full, {mode}");
    }
}

/// Writes `extra.safetensors` into checkpoint `dir` holding the bytes of the main tensors
/// `from` under the names `to`, and lists them in the index.
fn add_copies(dir: &Path, pairs: &[(&str, &str)]) {
    let ck = Checkpoint::open(dir).unwrap();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (from, to) in pairs {
        let (shard, info) = ck.get(from).unwrap();
        let bytes = shard.data(info);
        header.insert(
            to.to_string(),
            serde_json::json!({"dtype": info.dtype.name(), "shape": info.shape,
                "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(dir.join("extra.safetensors"), out).unwrap();
    let index = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    for (_, to) in pairs {
        v["weight_map"][*to] = "extra.safetensors".into();
    }
    std::fs::write(&index, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn the_shared_mtp_head_is_the_main_lm_head_bit_for_bit() {
    let exp = expected(GLM5);
    let tmp = tempfile::tempdir().unwrap();
    let published = glm5_as_published(tmp.path());
    // The same checkpoint with real copies holding the main tensors' bytes.
    let copied = tmp.path().join("copied");
    copy_checkpoint_without(&published, &copied, |_| false);
    add_copies(
        &copied,
        &[
            ("model.embed_tokens.weight", EMBED),
            ("lm_head.weight", HEAD),
        ],
    );
    let (a_dir, b_dir) = (tmp.path().join("a"), tmp.path().join("b"));
    convert(&published, &a_dir, enc(Some("int8"))).unwrap();
    convert(&copied, &b_dir, enc(Some("int8"))).unwrap();
    let (a, b) = (open(&a_dir), open(&b_dir));
    assert!(b.manifest().mtp_shared.is_empty());
    let m = &exp["mtp"];
    let hidden: Vec<f32> = m["main_hidden"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(coli_tests::floats)
        .collect();
    let next = ids(&m["next_ids"]);
    let logits = |s: &Store| {
        let mut e = Engine::new(s, &EngineOptions::default()).unwrap();
        assert!(e.has_mtp());
        e.mtp_logits(&hidden, &next).unwrap()
    };
    let (la, lb) = (logits(&a), logits(&b));
    assert_eq!(la.len(), next.len());
    for (x, y) in la.iter().zip(&lb) {
        assert!(
            x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "the shared head's MTP logits differ from the copied head's"
        );
    }
}

#[test]
fn a_partial_mtp_layer_is_still_refused_and_deepseek_v32_keeps_its_copies() {
    let tmp = tempfile::tempdir().unwrap();
    // GLM-5 as published, minus one more tensor of the MTP layer: refused, named, nothing written.
    let ck = tmp.path().join("glm5-partial");
    copy_checkpoint_without(&fixture_dir(GLM5), &ck, |n| {
        n == EMBED || n == HEAD || n.starts_with("model.layers.3.eh_proj")
    });
    let out = tmp.path().join("store");
    let e = convert(&ck, &out, enc(Some("int8"))).unwrap_err();
    assert!(e.contains("model.layers.3.eh_proj.weight"), "{e}");
    assert!(!out.exists() && !tmp.path().join("store.partial").exists());
    // DeepSeek-V3.2's MTP head differs from lm_head in its releases: both stay required.
    let ck = tmp.path().join("v32");
    copy_checkpoint_without(&fixture_dir("deepseek_v32_fp8"), &ck, |n| {
        n == "model.layers.3.shared_head.head.weight"
    });
    let e = convert(&ck, &out, enc(Some("int8"))).unwrap_err();
    assert!(e.contains("model.layers.3.shared_head.head.weight"), "{e}");
}

#[test]
fn mtp_none_leaves_the_mtp_layer_out_and_speculate_mtp_names_it() {
    let exp = expected(GLM5);
    let tmp = tempfile::tempdir().unwrap();
    let (none_dir, full_dir) = (tmp.path().join("none"), tmp.path().join("full"));
    convert(&fixture_dir(GLM5), &none_dir, enc(None)).unwrap();
    convert(&fixture_dir(GLM5), &full_dir, enc(Some("int8"))).unwrap();
    let (none, full) = (open(&none_dir), open(&full_dir));
    let m = none.manifest();
    assert_eq!(m.parameters["mtp"], "none");
    assert_eq!(m.num_layers, 3, "no MTP layer");
    assert!(m.expert_layers.iter().all(|l| l.layer < 3));
    assert!(m
        .dense
        .iter()
        .all(|d| coli_format::spec::layer_of(&d.name).is_none_or(|l| l < 3)));
    assert!(files_bytes(&none_dir) < files_bytes(&full_dir));
    // The main model is the same.
    let prompt = ids(&exp["prompt_ids"]);
    assert_eq!(
        tokens(&none, &prompt, 32, Speculate::Off),
        tokens(&full, &prompt, 32, Speculate::Off)
    );
    // --speculate mtp names the option; auto falls back to prompt lookup.
    let mut e = Engine::new(&none, &EngineOptions::default()).unwrap();
    assert!(!e.has_mtp());
    let params = |mode| GenerateParams {
        max_tokens: 4,
        sampling: Default::default(),
        stop_on_eos: false,
        speculation: SpeculationParams {
            mode,
            ..Default::default()
        },
    };
    let err = e
        .generate(&prompt, &params(Speculate::Mtp), |_| Ok(true))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--mtp none") && err.contains("--speculate mtp"),
        "{err}"
    );
    e.generate(&prompt, &params(Speculate::Auto), |_| Ok(true))
        .unwrap();
    // coli info shows the parameter although the store has no MTP layer.
    let info = coli_tools::info::report(&none_dir).unwrap();
    assert_eq!(info["provenance"]["parameters"]["mtp"], "none");
    assert_eq!(info["mtp_layer"], false);

    // On a family without an MTP layer `--mtp none` is a no-op: the same tensors and records.
    let tmp2 = tempfile::tempdir().unwrap();
    let (a, b) = (tmp2.path().join("a"), tmp2.path().join("b"));
    convert(&fixture_dir("qwen3_moe_bf16"), &a, enc(None)).unwrap();
    convert(&fixture_dir("qwen3_moe_bf16"), &b, enc(Some("int8"))).unwrap();
    // (Segment headers and the MANIFEST carry the store id, which covers the parameters.)
    for f in ["INDEX", "dense.bin"] {
        let same = std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap();
        assert!(same, "{f} differs");
    }
    let (sa, sb) = (open(&a), open(&b));
    for r in sa.index() {
        let k = coli_store::ExpertKey::new(r.layer.get(), r.expert.get());
        let same = sa.fetch(&[k]).unwrap()[0].bytes() == sb.fetch(&[k]).unwrap()[0].bytes();
        assert!(same, "{k} differs");
    }
}
