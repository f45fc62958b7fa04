//! The model spec (`coli_format::spec`) is the one list of tensors the converter and the engine
//! agree on. For every fixture family: the dense tensors the converter's preflight keeps
//! (required plus optional ones present) equal the tensors the engine loads (recorded by its
//! `Weights` loader) and the tensors the store holds, none left unread; the expert layers
//! likewise. A checkpoint with part of an MTP layer is refused at preflight naming the missing
//! tensor; one with no MTP layer converts and runs; a store written with part of an MTP layer
//! (by an older converter) still runs, without it, and says so.

use coli_convert::checkpoint::Checkpoint;
use coli_convert::{plan, Encodings, Options};
use coli_engine::models::Model;
use coli_engine::{Engine, EngineOptions};
use coli_format::spec::layer_of;
use coli_store::{EncodedMatrix, Encoding, StoreSpec, StoreWriter, WriterStart};
use coli_tests::{copy_checkpoint_without, expected, fixture_dir, greedy, ids, rewrite_checkpoint};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const FIXTURES: [&str; 15] = [
    "mixtral_fp8",
    "qwen3_moe_fp8",
    "qwen3_moe_bf16",
    "olmoe_fp8",
    "deepseek_v3_fp8",
    "glm5_fp8",
    "glm4_moe_fp8",
    "minimax_m2_fp8",
    "deepseek_v32_fp8",
    "inkling_bf16",
    "inkling2_bf16",
    "inkling2_mxfp8",
    "qwen3_next_bf16",
    "qwen3_5_moe_bf16",
    "kimi_linear_bf16",
];

fn default_encodings() -> Encodings {
    Encodings {
        experts: Encoding::Int4 { group_size: 64 },
        dense: Encoding::Bf16,
        roles: Default::default(),
        mtp: Some(Encoding::Int8),
        embeddings: None,
    }
}

fn convert(input: &Path, output: &Path) -> coli_convert::Result<coli_convert::Report> {
    coli_convert::run(&Options {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
        encodings: default_encodings(),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
}

fn open(dir: &Path) -> coli_store::Store {
    coli_tests::open_store(dir, true, coli_store::IoPreference::Auto)
}

#[test]
fn preflight_engine_and_store_read_the_same_tensors_for_every_family() {
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let ck = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let p = plan::build(&ck, default_encodings(), 4096).unwrap();
        assert!(p.unused.is_empty(), "{name}: unused {:?}", p.unused);
        let spec = ck.spec.clone();
        let in_checkpoint = |n: &str| ck.has(n);
        // What the spec asks for: every required tensor, optional ones when present; the MTP
        // layer when the checkpoint has it.
        let mtp_present = !p.mtp_layers.is_empty();
        let mut spec_tensors = spec.tensors.main_dense();
        if mtp_present {
            for m in &spec.tensors.mtp {
                spec_tensors.extend(m.dense());
            }
        }
        let want: BTreeSet<String> = spec_tensors
            .iter()
            .filter(|t| !t.optional || in_checkpoint(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let preflight: BTreeSet<String> = p.dense.iter().map(|d| d.name.clone()).collect();
        assert_eq!(preflight, want, "{name}: preflight vs spec");
        let sets = spec.tensors.expert_sets();
        let want_layers: Vec<(u32, usize)> = sets
            .iter()
            .filter(|s| mtp_present || s.layer < spec.num_layers as u32)
            .map(|s| (s.layer, s.count as usize))
            .collect();
        assert_eq!(
            p.expert_layers
                .iter()
                .map(|l| (l.layer, l.num_experts as usize))
                .collect::<Vec<_>>(),
            want_layers,
            "{name}: preflight expert layers"
        );

        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("store");
        convert(&dir, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let store = open(&out);
        let model = Model::load(&store, spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(model.warnings.is_empty(), "{name}: {:?}", model.warnings);
        assert_eq!(model.tensors_read, want, "{name}: engine vs spec");
        let in_store: BTreeSet<String> = store
            .manifest()
            .dense
            .iter()
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(
            in_store, model.tensors_read,
            "{name}: store tensors the engine never reads"
        );
        let store_layers: Vec<(u32, usize)> = store
            .manifest()
            .expert_layers
            .iter()
            .map(|l| (l.layer, l.num_experts as usize))
            .collect();
        assert_eq!(store_layers, model.expert_layers(), "{name}: expert layers");
        assert_eq!(model.mtp.is_some(), mtp_present, "{name}: MTP layer");
    }
}

/// Copies fixture `name` without `tensor` (and its FP8 block scale).
fn without(name: &str, tensor: &str, into: &Path) -> PathBuf {
    let scale = format!("{tensor}_scale_inv");
    let dst = into.join("ckpt");
    copy_checkpoint_without(&fixture_dir(name), &dst, |n| n == tensor || n == scale);
    dst
}

#[test]
fn partial_mtp_layers_are_refused_at_preflight_naming_the_tensor() {
    for (name, missing) in [
        (
            "deepseek_v3_fp8",
            "model.layers.3.self_attn.q_a_proj.weight",
        ),
        (
            "deepseek_v3_fp8",
            "model.layers.3.self_attn.kv_b_proj.weight",
        ),
        ("deepseek_v3_fp8", "model.layers.3.enorm.weight"),
        ("deepseek_v3_fp8", "model.layers.3.mlp.gate.weight"),
        (
            "deepseek_v3_fp8",
            "model.layers.3.mlp.gate.e_score_correction_bias",
        ),
        (
            "deepseek_v3_fp8",
            "model.layers.3.mlp.shared_experts.up_proj.weight",
        ),
        ("deepseek_v3_fp8", "model.layers.3.eh_proj.weight"),
        ("deepseek_v3_fp8", "model.layers.3.shared_head.head.weight"),
        ("deepseek_v3_fp8", "model.layers.3.embed_tokens.weight"),
        (
            "deepseek_v3_fp8",
            "model.layers.3.mlp.experts.5.down_proj.weight",
        ),
        ("glm5_fp8", "model.layers.3.self_attn.indexer.wk.weight"),
        ("glm5_fp8", "model.layers.3.hnorm.weight"),
        ("glm4_moe_fp8", "model.layers.3.self_attn.k_proj.bias"),
        ("glm4_moe_fp8", "model.layers.3.self_attn.q_norm.weight"),
        ("glm4_moe_fp8", "model.layers.3.shared_head.norm.weight"),
        (
            "deepseek_v32_fp8",
            "model.layers.3.self_attn.indexer.weights_proj.weight",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let ck = without(name, missing, tmp.path());
        let out = tmp.path().join("store");
        let e = convert(&ck, &out).expect_err(missing).to_string();
        assert!(e.contains(missing), "{name} without {missing}: {e}");
        assert!(
            !out.exists(),
            "{name} without {missing}: a store was written"
        );
        assert!(
            !tmp.path().join("store.partial").exists(),
            "{name} without {missing}: a partial store was left"
        );
    }
}

#[test]
fn checkpoints_without_an_mtp_layer_convert_and_run() {
    for name in [
        "deepseek_v3_fp8",
        "glm5_fp8",
        "glm4_moe_fp8",
        "deepseek_v32_fp8",
    ] {
        let exp = expected(name);
        let prompt = ids(&exp["prompt_ids"]);
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("ckpt");
        copy_checkpoint_without(&fixture_dir(name), &ck, |n| layer_of(n) == Some(3));
        let (out, full) = (tmp.path().join("no-mtp"), tmp.path().join("full"));
        convert(&ck, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
        convert(&fixture_dir(name), &full).unwrap();
        let store = open(&out);
        assert!(store.manifest().expert_layers.iter().all(|l| l.layer < 3));
        assert!(store
            .manifest()
            .dense
            .iter()
            .all(|d| layer_of(&d.name) != Some(3)));
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        assert!(!e.has_mtp(), "{name}");
        assert!(e.take_warnings().is_empty(), "{name}");
        let tokens = greedy(&mut e, &prompt, 8);
        // The main model is the same with or without its MTP layer.
        let full_store = open(&full);
        let mut f = Engine::new(&full_store, &EngineOptions::default()).unwrap();
        assert!(f.has_mtp(), "{name}");
        assert_eq!(tokens, greedy(&mut f, &prompt, 8), "{name}");
    }
}

/// Writes a copy of `src` (a store) without the dense tensor `skip`, as a converter that did
/// not check MTP layers could have written it.
fn copy_store_without(src: &coli_store::Store, dst: &Path, skip: &str) {
    let m = src.manifest();
    let spec = StoreSpec {
        family: m.family.clone(),
        config_json: src.file("config.json").unwrap().expect("config.json"),
        num_layers: m.num_layers,
        expert_layers: m.expert_layers.clone(),
        expert_encoding: m.expert_encoding().unwrap(),
        alignment: m.alignment as usize,
        segment_max_bytes: m.segment_max_bytes,
        matrix_order: Default::default(),
        converter_version: m.converter.version.clone(),
        parameter_defaults: Default::default(),
        parameters: m.parameters.clone(),
        sources: m.sources.clone(),
    };
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(dst, spec).unwrap() else {
        panic!("new target");
    };
    // Row-major (the copy is written --matrix-order row-major; the source may be interleaved).
    let owned = |v: coli_store::MatrixView<'_>| {
        let c = v.row_major_copy();
        let v = c.view();
        EncodedMatrix {
            encoding: v.encoding(),
            rows: v.rows(),
            cols: v.cols(),
            data: v.data().to_vec(),
            scales: v.scales().to_vec(),
            e8m0_scales: Vec::new(),
            bias: None,
        }
    };
    for d in &m.dense {
        if d.name != skip {
            let t = src.dense(&d.name).unwrap();
            w.add_dense(&d.name, &d.shape, &owned(t.matrix())).unwrap();
        }
    }
    for r in src.index() {
        let b = src.fetch_one(r.key()).unwrap();
        let (g, u, d) = (owned(b.gate()), owned(b.up()), owned(b.down()));
        w.add_expert(r.key(), b.hidden, b.intermediate, [&g, &u, &d])
            .unwrap();
    }
    for f in &m.files {
        if f.name != "config.json" {
            w.add_file(&f.name, &src.file(&f.name).unwrap().unwrap())
                .unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn a_store_with_a_partial_mtp_layer_runs_without_it_and_says_so() {
    let name = "deepseek_v3_fp8";
    let prompt = ids(&expected(name)["prompt_ids"]);
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    convert(&fixture_dir(name), &full).unwrap();
    let full_store = open(&full);
    let partial = tmp.path().join("partial");
    copy_store_without(&full_store, &partial, "model.layers.3.enorm.weight");
    let store = open(&partial);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(!e.has_mtp());
    let w = e.take_warnings();
    assert!(
        w.len() == 1 && w[0].contains("model.layers.3.enorm.weight") && w[0].contains("MTP"),
        "{w:?}"
    );
    let mut f = Engine::new(&full_store, &EngineOptions::default()).unwrap();
    assert_eq!(greedy(&mut e, &prompt, 8), greedy(&mut f, &prompt, 8));
}

#[test]
fn tensors_the_model_does_not_read_are_left_out_and_reported() {
    // Qwen3-MoE without attention_bias: q_proj.bias is not part of the model (transformers
    // ignores it too). It is not converted, so the store holds only what the engine reads.
    let name = "qwen3_moe_bf16";
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    copy_checkpoint_without(&fixture_dir(name), &ck, |_| false);
    // An extra tensor: the bias of layer 0's q_proj, in a shard of its own.
    let bias: Vec<u8> = (0..64u32).flat_map(|_| 0x3F80u16.to_le_bytes()).collect();
    let header = serde_json::json!({
        "model.layers.0.self_attn.q_proj.bias": {"dtype": "BF16", "shape": [64], "data_offsets": [0, 128]}
    });
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut shard = (h.len() as u64).to_le_bytes().to_vec();
    shard.extend_from_slice(&h);
    shard.extend_from_slice(&bias);
    std::fs::write(ck.join("model-extra.safetensors"), shard).unwrap();
    let idx_path = ck.join("model.safetensors.index.json");
    let mut idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&idx_path).unwrap()).unwrap();
    idx["weight_map"]["model.layers.0.self_attn.q_proj.bias"] = "model-extra.safetensors".into();
    std::fs::write(&idx_path, serde_json::to_vec(&idx).unwrap()).unwrap();
    let out = tmp.path().join("store");
    let report = convert(&ck, &out).unwrap();
    assert_eq!(
        report.not_converted,
        vec!["model.layers.0.self_attn.q_proj.bias".to_string()]
    );
    assert!(report.to_text().contains("not converted (1 tensors"));
    let store = open(&out);
    assert!(!store.has_dense("model.layers.0.self_attn.q_proj.bias"));
    Engine::new(&store, &EngineOptions::default()).unwrap();
}

/// A one-tensor safetensors shard `file` in `dir`, listed in the index.
fn add_bf16_tensor(dir: &Path, file: &str, name: &str, len: usize) {
    let data: Vec<u8> = (0..len).flat_map(|_| 0x3F80u16.to_le_bytes()).collect();
    let header = serde_json::json!({
        name: {"dtype": "BF16", "shape": [len], "data_offsets": [0, 2 * len]}
    });
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut shard = (h.len() as u64).to_le_bytes().to_vec();
    shard.extend_from_slice(&h);
    shard.extend_from_slice(&data);
    std::fs::write(dir.join(file), shard).unwrap();
    let idx_path = dir.join("model.safetensors.index.json");
    let mut idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&idx_path).unwrap()).unwrap();
    idx["weight_map"][name] = file.into();
    std::fs::write(&idx_path, serde_json::to_vec(&idx).unwrap()).unwrap();
}

#[test]
fn a_multimodal_wrapper_converts_and_runs_its_language_model() {
    let name = "mixtral_fp8";
    let prompt = ids(&expected(name)["prompt_ids"]);
    for prefix in ["language_model.", "model.language_model."] {
        let tmp = tempfile::tempdir().unwrap();
        let ck = tmp.path().join("ckpt");
        // Language-model tensors under the wrapper's prefix (transformers 4 Llava-style
        // `language_model.model.X` / `language_model.lm_head.weight`, or transformers 5
        // `model.language_model.X` with `lm_head.weight` at the top).
        rewrite_checkpoint(&fixture_dir(name), &ck, |n| {
            Some(match (prefix, n.strip_prefix("model.")) {
                ("language_model.", _) => format!("language_model.{n}"),
                (_, Some(rest)) => format!("model.language_model.{rest}"),
                (_, None) => n.to_string(),
            })
        });
        add_bf16_tensor(
            &ck,
            "vision.safetensors",
            "vision_tower.patch_embed.weight",
            16,
        );
        let cfg_path = ck.join("config.json");
        let text: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
        let wrapped = serde_json::json!({
            "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
            "text_config": text, "vision_config": {"hidden_size": 16}
        });
        std::fs::write(&cfg_path, serde_json::to_vec_pretty(&wrapped).unwrap()).unwrap();
        let out = tmp.path().join("store");
        let report = convert(&ck, &out).unwrap_or_else(|e| panic!("{prefix}: {e}"));
        assert_eq!(
            report.not_converted,
            vec!["vision_tower.patch_embed.weight".to_string()]
        );
        assert_eq!(report.family, "mixtral");
        let store = open(&out);
        assert!(store
            .manifest()
            .dense
            .iter()
            .all(
                |d| d.name.starts_with("model.") && !d.name.contains("language_model")
                    || d.name == "lm_head.weight"
            ));
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let plain = tmp.path().join("plain");
        convert(&fixture_dir(name), &plain).unwrap();
        let plain_store = open(&plain);
        let mut f = Engine::new(&plain_store, &EngineOptions::default()).unwrap();
        assert_eq!(
            greedy(&mut e, &prompt, 8),
            greedy(&mut f, &prompt, 8),
            "{prefix}"
        );
        // The same dense bytes under the same names.
        for d in &plain_store.manifest().dense {
            let (a, b) = (
                store.dense(&d.name).unwrap(),
                plain_store.dense(&d.name).unwrap(),
            );
            assert_eq!(a.data, b.data, "{prefix} {}", d.name);
        }
    }
}
