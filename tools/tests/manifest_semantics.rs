//! MANIFESTs edited with their checksums recomputed (so every byte check passes) but saying
//! something the model cannot be: each is refused by `coli-fsck` (exit 1, the problem naming
//! MANIFEST and the field) and by `coli run` (a non-zero exit naming the field) before any
//! token is computed. The store is the qwen3_moe_bf16 fixture converted (2 layers of 8
//! experts).

mod common;
use common::{convert_fixture, run, TempDir};
use serde_json::{json, Value};
use std::path::Path;

/// Rewrites `store`'s MANIFEST with `edit` applied to its JSON body (crc32 and length
/// recomputed, so only the meaning is wrong).
fn edit_manifest(store: &Path, edit: &dyn Fn(&mut Value)) {
    let p = store.join("MANIFEST");
    let b = std::fs::read(&p).unwrap();
    let mut v: Value = serde_json::from_slice(&b[24..]).unwrap();
    edit(&mut v);
    let body = serde_json::to_vec_pretty(&v).unwrap();
    let mut out = b[..12].to_vec();
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    std::fs::write(&p, out).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

type Edit = Box<dyn Fn(&mut Value)>;

fn cfg(key: &'static str, value: Value) -> Edit {
    Box::new(move |v| v["config"][key] = value.clone())
}

#[test]
fn manifests_that_cannot_describe_the_model_are_refused_by_fsck_and_run() {
    let t = TempDir::new("manifest-semantics");
    let good = t.path().join("good");
    convert_fixture("qwen3_moe_bf16", &good);
    let (fsck, coli) = (env!("CARGO_BIN_EXE_coli-fsck"), env!("CARGO_BIN_EXE_coli"));
    let (code, out, err) = run(fsck, &[good.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let cases: Vec<(&str, Edit)> = vec![
        ("num_layers 0", Box::new(|v| v["num_layers"] = json!(0))),
        (
            "num_layers 4294967295",
            Box::new(|v| v["num_layers"] = json!(u32::MAX)),
        ),
        ("num_layers 7", Box::new(|v| v["num_layers"] = json!(7))),
        ("num_layers 3", Box::new(|v| v["num_layers"] = json!(3))),
        (
            "layer 1 follows layer 1",
            Box::new(|v| {
                let l = v["expert_layers"][1].clone();
                v["expert_layers"].as_array_mut().unwrap().push(l);
            }),
        ),
        (
            "layer 0 follows layer 1",
            Box::new(|v| v["expert_layers"].as_array_mut().unwrap().reverse()),
        ),
        (
            "MoE layer 1 is missing|not an expert listed in MANIFEST expert_layers",
            Box::new(|v| {
                v["expert_layers"].as_array_mut().unwrap().pop();
            }),
        ),
        (
            "num_experts 0",
            Box::new(|v| v["expert_layers"][0]["num_experts"] = json!(0)),
        ),
        (
            "has 9 experts, the config 8|missing experts in layers [0]",
            Box::new(|v| v["expert_layers"][0]["num_experts"] = json!(9)),
        ),
        (
            "family \"llama\"",
            Box::new(|v| v["family"] = json!("llama")),
        ),
        ("family is empty", Box::new(|v| v["family"] = json!(""))),
        (
            "llama",
            Box::new(|v| {
                v["family"] = json!("llama");
                v["config"]["model_type"] = json!("llama");
            }),
        ),
        ("rope_theta", cfg("rope_theta", json!(-1.0))),
        ("rope_theta", cfg("rope_theta", json!(0.0))),
        ("rms_norm_eps", cfg("rms_norm_eps", json!(-1e-6))),
        ("rms_norm_eps", cfg("rms_norm_eps", json!(0.0))),
        ("num_experts_per_tok", cfg("num_experts_per_tok", json!(0))),
        ("num_experts_per_tok", cfg("num_experts_per_tok", json!(9))),
        ("num_hidden_layers", cfg("num_hidden_layers", json!(0))),
        ("num_hidden_layers", cfg("num_hidden_layers", json!(1))),
        ("hidden_size", cfg("hidden_size", json!(0))),
        ("vocab_size", cfg("vocab_size", json!(0))),
        ("num_attention_heads", cfg("num_attention_heads", json!(0))),
        ("num_key_value_heads", cfg("num_key_value_heads", json!(3))),
        ("num_experts", cfg("num_experts", json!(0))),
        (
            "moe_intermediate_size",
            cfg("moe_intermediate_size", json!(0)),
        ),
        ("decoder_sparse_step", cfg("decoder_sparse_step", json!(0))),
        ("hidden_act", cfg("hidden_act", json!("gelu"))),
        // Widths the stored tensors do not have (every byte check still passes).
        (
            "hidden_size|is stored as|does not describe the stored",
            cfg("hidden_size", json!(128)),
        ),
        (
            "moe_intermediate_size|is stored as|does not describe the stored",
            cfg("moe_intermediate_size", json!(48)),
        ),
        (
            "vocab_size|is stored as|does not describe the stored",
            cfg("vocab_size", json!(1024)),
        ),
        (
            "head_dim|is stored as|does not describe the stored",
            cfg("head_dim", json!(32)),
        ),
        (
            "num_attention_heads|is stored as|does not describe the stored",
            cfg("num_attention_heads", json!(8)),
        ),
        (
            "max_position_embeddings",
            cfg("max_position_embeddings", json!(0)),
        ),
    ];
    for (i, (want, edit)) in cases.iter().enumerate() {
        let store = t.path().join(format!("s{i}"));
        copy_dir(&good, &store);
        edit_manifest(&store, edit.as_ref());
        let s = store.to_str().unwrap();
        let (code, out, err) = run(fsck, &[s]);
        assert_ne!(
            code, 0,
            "coli-fsck passed a MANIFEST with {want}: {out}{err}"
        );
        // `want` lists what may name the problem, `|`-separated (the store's own open check
        // may find an INDEX record the edited MANIFEST no longer lists before the model check).
        let named = |text: &str| want.split('|').any(|w| text.contains(w));
        assert!(
            out.contains("MANIFEST") && named(&out),
            "coli-fsck on {want}: {out}{err}"
        );
        let (code, out, err) = run(
            coli,
            &[
                "run",
                "--store",
                s,
                "--prompt-ids",
                "1,2",
                "--max-tokens",
                "1",
            ],
        );
        assert_ne!(
            code, 0,
            "coli run started on a MANIFEST with {want}: {out}{err}"
        );
        assert!(named(&err), "coli run on {want}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
