//! Bad inputs of the GLM-4.5, MiniMax-M2, DeepSeek-V3.2, Inkling, Inkling 2, Qwen3-Next, Qwen3.5,
//! Kimi-Linear, Kimi K3, GLM-5.3-Flash and DeepSeek-V4 fixtures (copies of tests/fixtures/tiny/<name> with
//! one thing broken):
//! a missing shard, config fields the family needs, shapes that disagree with config.json and
//! config values the family cannot run are refused by `coli-convert`'s preflight with an error
//! naming the file, field or tensor, and nothing is written (no store, no partial directory).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Converts the checkpoint in `ck` into `tmp/store`: must fail with a message holding every
/// string of `names`, leaving neither the store nor its partial directory behind.
fn refused(ck: &Path, tmp: &Path, names: &[&str]) {
    let out = tmp.join("store");
    let e = coli_convert::run(&coli_convert::Options {
        input: ck.to_path_buf(),
        output: out.clone(),
        encodings: coli_convert::Encodings {
            experts: coli_tests::encoding("int4-g64"),
            dense: coli_tests::encoding("bf16"),
            roles: Default::default(),
            mtp: Some(coli_tests::encoding("int8")),
            embeddings: None,
        },
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .expect_err("conversion should fail")
    .to_string();
    for n in names {
        assert!(e.contains(n), "error {e:?} should name {n:?}");
    }
    assert!(!out.exists(), "a store was written: {e}");
    assert!(
        !tmp.join("store.partial").exists(),
        "a partial store was left: {e}"
    );
}

/// A copy of fixture `name` in `tmp/ckpt` whose config.json is `edit`ed.
fn with_config(name: &str, tmp: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let ck = tmp.join("ckpt");
    std::fs::create_dir(&ck).unwrap();
    for entry in std::fs::read_dir(coli_tests::fixture_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
    }
    let path = ck.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    ck
}

/// Fixture `name` with `key` set to `value` (`Value::Null` removes it) must be refused with an
/// error naming every string of `names`.
fn config_refused(name: &str, key: &str, value: Value, names: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(name, tmp.path(), |c| {
        if value.is_null() {
            c.as_object_mut().unwrap().remove(key);
        } else {
            c[key] = value;
        }
    });
    refused(&ck, tmp.path(), names);
}

/// Fixture `name` without tensor `drop` must be refused with an error naming every string of
/// `names`.
fn tensor_missing_refused(name: &str, drop: &str, names: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    coli_tests::copy_checkpoint_without(&coli_tests::fixture_dir(name), &ck, |n| n == drop);
    refused(&ck, tmp.path(), names);
}

fn missing_shard_refused(name: &str, shard: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(name, tmp.path(), |_| {});
    std::fs::remove_file(ck.join(shard)).unwrap();
    refused(&ck, tmp.path(), &[shard]);
}

#[test]
fn glm4_moe_bad_inputs_are_refused_before_anything_is_written() {
    let n = "glm4_moe_fp8";
    missing_shard_refused(n, "model-00003-of-00004.safetensors");
    for field in [
        "moe_intermediate_size",
        "n_routed_experts",
        "num_experts_per_tok",
    ] {
        config_refused(n, field, Value::Null, &["config.json", field]);
    }
    // Shapes that disagree with config.json name the tensor and the expected shape.
    config_refused(
        n,
        "head_dim",
        json!(16),
        &["model.layers.0.self_attn.", "expected [16]"],
    );
    config_refused(
        n,
        "intermediate_size",
        json!(64),
        &["model.layers.0.mlp.", "expected"],
    );
    config_refused(
        n,
        "n_shared_experts",
        json!(2),
        &["model.layers.1.mlp.shared_experts", "expected"],
    );
    // Values the family cannot run.
    config_refused(
        n,
        "partial_rotary_factor",
        json!(0.45),
        &["config.json", "partial_rotary_factor"],
    );
    config_refused(n, "n_group", json!(3), &["config.json", "n_group"]);
}

#[test]
fn minimax_m2_bad_inputs_are_refused_before_anything_is_written() {
    let n = "minimax_m2_fp8";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    for field in ["intermediate_size", "num_local_experts", "hidden_size"] {
        config_refused(n, field, Value::Null, &["config.json", field]);
    }
    // The whole-projection k norm is [kv_heads * head_dim]: another head_dim misshapes it.
    config_refused(
        n,
        "head_dim",
        json!(16),
        &["model.layers.0.self_attn.", "expected [32]"],
    );
    config_refused(
        n,
        "num_local_experts",
        json!(6),
        &["model.layers.0.block_sparse_moe.", "expected [6"],
    );
    config_refused(
        n,
        "rotary_dim",
        json!(30),
        &["config.json", "rotary_dim gives 30"],
    );
    config_refused(
        n,
        "scoring_func",
        json!("softmax"),
        &["scoring_func", "sigmoid"],
    );
}

#[test]
fn deepseek_v32_bad_inputs_are_refused_before_anything_is_written() {
    let n = "deepseek_v32_fp8";
    missing_shard_refused(n, "model-00004-of-00004.safetensors");
    for field in ["kv_lora_rank", "qk_rope_head_dim", "n_routed_experts"] {
        config_refused(n, field, Value::Null, &["config.json", field]);
    }
    config_refused(
        n,
        "index_head_dim",
        json!(16),
        &["model.layers.0.self_attn.indexer.", "expected"],
    );
    // Without the key, DeepseekV32Config's default 1536 applies and the checkpoint's 48 does
    // not fit it.
    config_refused(
        n,
        "q_lora_rank",
        Value::Null,
        &["model.layers.0.self_attn.", "1536]"],
    );
    // An explicit null (no q LoRA) leaves the indexer without its input.
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(n, tmp.path(), |c| c["q_lora_rank"] = Value::Null);
    refused(&ck, tmp.path(), &["config.json", "q_lora_rank", "indexer"]);
}

/// Inkling keeps its language model's config under `text_config`: fixture `inkling_bf16` with
/// `text_config.key` set to `value` (`Value::Null` removes it) must be refused naming `names`.
fn inkling_config_refused(key: &str, value: Value, names: &[&str]) {
    nested_config_refused("inkling_bf16", key, value, names);
}

/// Fixture `name` with `text_config.key` set to `value` (`Value::Null` removes it) must be
/// refused naming `names`.
fn nested_config_refused(name: &str, key: &str, value: Value, names: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(name, tmp.path(), |c| {
        let t = c["text_config"].as_object_mut().unwrap();
        if value.is_null() {
            t.remove(key);
        } else {
            t.insert(key.to_string(), value);
        }
    });
    refused(&ck, tmp.path(), names);
}

#[test]
fn inkling_bad_inputs_are_refused_before_anything_is_written() {
    missing_shard_refused("inkling_bf16", "model-00002-of-00003.safetensors");
    for field in ["hidden_size", "num_experts_per_tok"] {
        inkling_config_refused(field, Value::Null, &["config.json", field]);
    }
    // Shapes that disagree with config.json name the tensor and the expected shape.
    inkling_config_refused(
        "swa_head_dim",
        json!(16),
        &["model.llm.layers.0.attn.", "expected"],
    );
    inkling_config_refused("sconv_kernel_size", json!(3), &["sconv.weight", "expected"]);
    inkling_config_refused(
        "n_routed_experts",
        json!(6),
        &["model.llm.layers.1.mlp.", "expected"],
    );
    // What coli does not run, or cannot be, is named.
    inkling_config_refused("shared_expert_sink", json!(false), &["shared_expert_sink"]);
    inkling_config_refused(
        "unpadded_vocab_size",
        json!(600),
        &["config.json", "unpadded_vocab_size"],
    );
    inkling_config_refused(
        "layer_types",
        json!(["sliding_attention", "hybrid", "hybrid", "hybrid"]),
        &["config.json", "layer_types", "hybrid_sliding"],
    );
    // A missing convolution weight or half of the MTP layers is named.
    for drop in [
        "model.llm.layers.2.attn.k_sconv.weight",
        "model.mtp.layers.1.input_proj.weight",
    ] {
        tensor_missing_refused("inkling_bf16", drop, &[drop]);
    }
}

#[test]
fn inkling2_bad_inputs_are_refused_before_anything_is_written() {
    let n = "inkling2_bf16";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    // A layer the config calls full whose tensors are a sliding layer's (and the reverse) is
    // refused naming the tensor the config expects.
    nested_config_refused(
        n,
        "layer_types",
        json!([
            "hybrid",
            "hybrid",
            "hybrid_sliding",
            "hybrid_sliding",
            "hybrid",
            "hybrid_sliding"
        ]),
        &["model.llm."],
    );
    nested_config_refused(
        n,
        "layer_types",
        json!(vec!["hybrid_sliding"; 6]),
        &["model.llm."],
    );
    // Head shapes that disagree with the tensors name the tensor and the expected shape.
    nested_config_refused(
        n,
        "swa_head_dim",
        json!(16),
        &["model.llm.layers.0.attn.", "expected"],
    );
    nested_config_refused(n, "scoring_func", json!("softmax"), &["scoring_func"]);
    nested_config_refused(
        n,
        "mlp_up_softcap",
        json!(0.0),
        &["config.json", "mlp_up_softcap"],
    );
    // A null softcap is not "no cap": transformers' modules need the number.
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(n, tmp.path(), |c| {
        c["text_config"]["final_logit_softcapping"] = Value::Null
    });
    refused(
        &ck,
        tmp.path(),
        &["config.json", "final_logit_softcapping", "null"],
    );
    nested_config_refused(
        n,
        "unpadded_vocab_size",
        json!(600),
        &["config.json", "unpadded_vocab_size"],
    );
    // Missing attention-residual queries, dynamic convolution taps and the output query are
    // named.
    for drop in [
        "model.llm.attn_res.attn_queries.0",
        "model.llm.layers.4.attn.v_sconv.weight_proj",
        "model.llm.attn_res.output_query",
    ] {
        tensor_missing_refused(n, drop, &[drop]);
    }
}

#[test]
fn qwen3_next_bad_inputs_are_refused_before_anything_is_written() {
    let n = "qwen3_next_bf16";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    // Linear-attention shapes that disagree with config.json name the tensor.
    config_refused(
        n,
        "linear_value_head_dim",
        json!(16),
        &["model.layers.0.linear_attn.", "expected"],
    );
    config_refused(
        n,
        "linear_conv_kernel_dim",
        json!(3),
        &["model.layers.0.linear_attn.conv1d.weight", "expected"],
    );
    // A layer_types that does not match the tensors: layer 0 declared full attention, whose
    // projections the checkpoint does not hold.
    let types = json!([
        "full_attention",
        "linear_attention",
        "linear_attention",
        "full_attention"
    ]);
    config_refused(
        n,
        "layer_types",
        types,
        &["model.layers.0.self_attn.q_proj.weight"],
    );
    // Values the family cannot run.
    config_refused(
        n,
        "layer_types",
        json!(["linear_attention", "linear_attention", "full_attention"]),
        &["config.json", "layer_types"],
    );
    config_refused(
        n,
        "linear_num_value_heads",
        json!(3),
        &["config.json", "linear_num_value_heads"],
    );
    config_refused(
        n,
        "full_attention_interval",
        json!(0),
        &["config.json", "full_attention_interval"],
    );
    // A missing Gated DeltaNet tensor.
    let a_log = "model.layers.1.linear_attn.A_log";
    tensor_missing_refused(n, a_log, &[a_log]);
    config_refused(
        n,
        "num_nextn_predict_layers",
        json!(2),
        &["config.json", "num_nextn_predict_layers", "at most one"],
    );
    partial_mtp_refused(n);
}

/// A checkpoint holding part of its `mtp.*` layer: refused naming the missing tensor (and, for
/// a dense one, the layer to complete or drop).
fn partial_mtp_refused(n: &str) {
    for (drop, names) in [
        ("mtp.fc.weight", &["mtp.fc.weight", "mtp.*"][..]),
        (
            "mtp.layers.0.self_attn.k_norm.weight",
            &["mtp.layers.0.self_attn.k_norm.weight"][..],
        ),
        (
            "mtp.layers.0.mlp.experts.5.down_proj.weight",
            &["mtp.layers.0.mlp.experts.5.down_proj.weight"][..],
        ),
    ] {
        tensor_missing_refused(n, drop, names);
    }
}

/// Qwen3.5-MoE as published: the language model's config nested under `text_config`, its
/// tensors under `model.language_model.`, the experts fused.
#[test]
fn qwen3_5_moe_bad_inputs_are_refused_before_anything_is_written() {
    let n = "qwen3_5_moe_bf16";
    missing_shard_refused(n, "model-00003-of-00003.safetensors");
    let text_refused = |key: &str, value: Value, names: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let ck = with_config(n, tmp.path(), |c| c["text_config"][key] = value.clone());
        refused(&ck, tmp.path(), names);
    };
    // Split projections whose shapes disagree with config.json name the tensor.
    text_refused(
        "linear_key_head_dim",
        json!(8),
        &[
            "model.language_model.layers.0.linear_attn.",
            "expected",
            "config.json",
        ],
    );
    text_refused(
        "linear_value_head_dim",
        json!(16),
        &["model.language_model.layers.0.linear_attn.", "expected"],
    );
    // Fused experts of another width.
    text_refused(
        "moe_intermediate_size",
        json!(16),
        &["model.language_model.layers.0.mlp.experts.", "expected"],
    );
    // A layer_types that does not match the tensors.
    text_refused(
        "layer_types",
        json!([
            "full_attention",
            "linear_attention",
            "linear_attention",
            "full_attention"
        ]),
        &["model.language_model.layers.0.self_attn.q_proj.weight"],
    );
    text_refused(
        "layer_types",
        json!([
            "linear_attention",
            "sliding_attention",
            "linear_attention",
            "full_attention"
        ]),
        &[
            "config.json",
            "text_config.layer_types",
            "sliding_attention",
        ],
    );
    text_refused(
        "linear_num_key_heads",
        json!(3),
        &["config.json", "text_config.linear_num_value_heads"],
    );
    // A missing split projection.
    for drop in [
        "model.language_model.layers.1.linear_attn.in_proj_z.weight",
        "model.language_model.layers.2.linear_attn.in_proj_a.weight",
        // One of a layer's two fused expert tensors.
        "model.language_model.layers.1.mlp.experts.gate_up_proj",
        "model.language_model.layers.3.mlp.experts.down_proj",
    ] {
        tensor_missing_refused(n, drop, &[drop]);
    }
    text_refused(
        "mtp_num_hidden_layers",
        json!(2),
        &[
            "config.json",
            "text_config.mtp_num_hidden_layers",
            "at most one",
        ],
    );
    partial_mtp_refused(n);
}

/// Kimi-Linear as published: KDA and NoPE-MLA layers listed 1-based in `linear_attn_config`,
/// the per-channel decay tensors, DeepSeek-style MoE under `block_sparse_moe`.
#[test]
fn kimi_linear_bad_inputs_are_refused_before_anything_is_written() {
    let n = "kimi_linear_bf16";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    let lin_refused = |edit: &dyn Fn(&mut Value), names: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let ck = with_config(n, tmp.path(), |c| edit(&mut c["linear_attn_config"]));
        refused(&ck, tmp.path(), names);
    };
    // KDA shapes that disagree with config.json name the tensor and the expected shape.
    lin_refused(
        &|l| l["head_dim"] = json!(8),
        &["model.layers.0.self_attn.", "expected"],
    );
    lin_refused(
        &|l| l["short_conv_kernel_size"] = json!(3),
        &[
            "model.layers.0.self_attn.",
            "_conv1d.weight",
            "expected [64, 1, 3]",
        ],
    );
    // Fewer heads of twice the width: the projections keep their shapes, the per-head decay
    // tensors do not.
    lin_refused(
        &|l| {
            l["num_heads"] = json!(2);
            l["head_dim"] = json!(32);
        },
        &["model.layers.0.self_attn.", "expected"],
    );
    // Layer lists the tensors contradict: layer 3 (1-based) declared KDA, which holds MLA.
    lin_refused(
        &|l| {
            l["kda_layers"] = json!([1, 2, 3, 4]);
            l["full_attn_layers"] = json!([]);
        },
        &["model.layers.2.self_attn.", "missing", "layer kinds"],
    );
    // Lists that are not a partition of the layers.
    lin_refused(
        &|l| l["kda_layers"] = json!([1, 2]),
        &["config.json", "linear_attn_config.", "layer 4"],
    );
    lin_refused(
        &|l| l["full_attn_layers"] = json!([3, 4]),
        &["config.json", "both list layer 4"],
    );
    lin_refused(
        &|l| l["kda_layers"] = json!([0, 1, 2]),
        &["config.json", "linear_attn_config.kda_layers", "1-based"],
    );
    // A bounded decay that bounds nothing.
    lin_refused(
        &|l| l["gate_lower_bound"] = json!(1.0),
        &["config.json", "gate_lower_bound", "negative"],
    );
    // Values the family cannot run.
    config_refused(n, "mla_use_nope", json!(false), &["mla_use_nope"]);
    config_refused(
        n,
        "moe_router_activation_func",
        json!("softmax"),
        &["moe_router_activation_func"],
    );
    config_refused(
        n,
        "num_nextn_predict_layers",
        json!(1),
        &["num_nextn_predict_layers"],
    );
    config_refused(
        n,
        "num_experts_per_token",
        Value::Null,
        &["config.json", "num_experts_per_token"],
    );
    config_refused(
        n,
        "num_expert_group",
        json!(3),
        &["config.json", "num_expert_group"],
    );
    // A missing decay tensor.
    let dt_bias = "model.layers.1.self_attn.dt_bias";
    tensor_missing_refused(n, dt_bias, &[dt_bias]);
    // The language model nested under a wrapper's prefix that its plain config does not
    // declare: nothing matches the spec's names.
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    coli_tests::rewrite_checkpoint(&coli_tests::fixture_dir(n), &ck, |name| {
        Some(name.replacen("model.", "model.language_model.", 1))
    });
    refused(&ck, tmp.path(), &["model.embed_tokens.weight"]);
}

/// Kimi K3 as published (`kimi_k3_mxfp4`: nested under `text_config` / `language_model.`,
/// compressed-tensors MXFP4 experts): decay tensors of the wrong shape, a layer list the
/// tensors contradict, a missing or NaN MXFP4 scale, a config that lost a K3 key its tensors
/// need, SiTU without its up-branch beta and names without the wrapper's prefix are refused
/// before anything is written, naming the tensor or field.
#[test]
fn kimi_k3_bad_inputs_are_refused_before_anything_is_written() {
    let n = "kimi_k3_mxfp4";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    let k3_refused = |edit: &dyn Fn(&mut Value), names: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let ck = with_config(n, tmp.path(), |c| edit(&mut c["text_config"]));
        refused(&ck, tmp.path(), names);
    };
    // Kimi-Linear's padded A_log where K3's is a vector of at least H values.
    let a_log = "language_model.model.layers.0.self_attn.A_log";
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_tensor_edit(n, tmp.path(), a_log, |shape, bytes| {
        *shape = vec![1, 1, 4, 1];
        bytes.truncate(16);
    });
    refused(&ck, tmp.path(), &[a_log, "expected [4] or [16] (padded)"]);
    // One value per key channel (`dt_bias`'s layout) is another model: refused.
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_tensor_edit(n, tmp.path(), a_log, |shape, bytes| {
        *shape = vec![64];
        *bytes = bytes.repeat(4);
    });
    refused(
        &ck,
        tmp.path(),
        &[a_log, "shape [64]", "expected [4] or [16] (padded)"],
    );
    // Fewer values than heads (the release publishes more, of which the first are read).
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_tensor_edit(n, tmp.path(), a_log, |shape, bytes| {
        *shape = vec![3];
        bytes.truncate(12);
    });
    refused(
        &ck,
        tmp.path(),
        &[a_log, "shape [3]", "expected [4] or [16] (padded)"],
    );
    // Layer 3 (1-based) declared KDA: its tensors are MLA's.
    k3_refused(
        &|t| {
            t["linear_attn_config"]["kda_layers"] = json!([1, 2, 3, 4]);
            t["linear_attn_config"]["full_attn_layers"] = json!([5]);
        },
        &["layers.2.self_attn.", "missing", "layer kinds"],
    );
    // An expert matrix without its scale, and with the e8m0 NaN code.
    let stem = "language_model.model.layers.1.block_sparse_moe.experts.3.w2";
    let scale = format!("{stem}.weight_scale");
    tensor_missing_refused(n, &scale, &[&scale, "missing"]);
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_tensor_edit(n, tmp.path(), &scale, |_, bytes| bytes[5] = 0xFF);
    refused(&ck, tmp.path(), &[&scale, "NaN"]);
    // A config that lost a key its tensors need would convert a different model.
    for (key, value, tensor) in [
        ("attn_res_block_size", Value::Null, "mlp_res_norm.weight"),
        (
            "latent_moe_use_norm",
            json!(false),
            "routed_expert_norm.weight",
        ),
        (
            "mla_use_output_gate",
            json!(false),
            "self_attn.g_proj.weight",
        ),
    ] {
        nested_config_refused(n, key, value, &[tensor, &format!("text_config.{key}")]);
    }

    k3_refused(
        &|t| t["linear_attn_config"]["use_full_rank_gate"] = json!(false),
        &["layers.0.self_attn.g_a_proj.weight", "missing"],
    );
    nested_config_refused(
        n,
        "activation_situ_linear_beta",
        json!(0.0),
        &["activation_situ_linear_beta 0 must be a positive number"],
    );
    // What Kimi K3's config class has no default for, and its default RoPE.
    for key in ["moe_intermediate_size", "kv_lora_rank"] {
        nested_config_refused(
            n,
            key,
            Value::Null,
            &[&format!("text_config.{key}"), "no default"],
        );
    }
    nested_config_refused(n, "mla_use_nope", Value::Null, &["mla_use_nope", "Kimi K3"]);
    // Packed weights outside the routed experts, or under another compressed-tensors format.
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_config(n, tmp.path(), |c| {
        c["text_config"]["quantization_config"]["format"] = json!("pack-quantized");
    });
    refused(&ck, tmp.path(), &["weight_packed", "mxfp4-pack-quantized"]);
    // The language model's tensors without the wrapper's `language_model.` prefix.
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    coli_tests::rewrite_checkpoint(&coli_tests::fixture_dir(n), &ck, |name| {
        Some(name.trim_start_matches("language_model.").to_string())
    });
    refused(&ck, tmp.path(), &["model.embed_tokens.weight", "missing"]);
}

/// GLM-5.3-Flash as published: nested under `text_config` / `model.language_model.`, four
/// residual streams with two hyper-connections per layer, KDA with the safe forget gate, DSA
/// layers with the k-pool indexer, a vision tower and an MTP layer left unconverted.
#[test]
fn glm5_next_bad_inputs_are_refused_before_anything_is_written() {
    let n = "glm5_next_bf16";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    let text_refused = |edit: &dyn Fn(&mut Value), names: &[&str]| {
        let tmp = tempfile::tempdir().unwrap();
        let ck = with_config(n, tmp.path(), |c| edit(&mut c["text_config"]));
        refused(&ck, tmp.path(), names);
    };
    // A `hc_mult` the tensors contradict names the hyper-connection and its shape.
    text_refused(
        &|t| t["hc_mult"] = json!(2),
        &["model.language_model.layers.0.hc_attn_", "expected"],
    );
    // A KDA head width the decay tensors contradict.
    text_refused(
        &|t| t["linear_attn_config"]["head_dim"] = json!(8),
        &["model.language_model.layers.0.self_attn.", "expected"],
    );
    // A k-pool size the indexer's position offsets contradict.
    text_refused(
        &|t| t["index_kpool"] = json!(8),
        &["index_kpool_compress_ape", "expected"],
    );
    // Layer kinds the tensors contradict: layer 4 declared DSA holds a KDA layer.
    text_refused(
        &|t| t["layer_types"][4] = json!("full_attention"),
        &["model.language_model.layers.4.self_attn.", "missing"],
    );
    // Layer 2 declared KDA: the shared DSA layer 3 then follows no full DSA layer.
    text_refused(
        &|t| t["layer_types"][2] = json!("linear_attention"),
        &["config.json", "indexer_types", "layer 3"],
    );
    // A shared DSA layer after a KDA layer (transformers raises), an unknown layer kind, RoPE.
    text_refused(
        &|t| t["indexer_types"][2] = json!("shared"),
        &["config.json", "indexer_types", "layer 2"],
    );
    text_refused(
        &|t| t["layer_types"][0] = json!("sliding_attention"),
        &["config.json", "text_config.layer_types"],
    );
    text_refused(&|t| t["qk_rope_head_dim"] = json!(8), &["qk_rope_head_dim"]);
    // Missing hyper-connection and k-pool tensors, named as published.
    // A layer's own tensor has no block to blame: the message asks for the shard (the MTP
    // layer's tensors, which the release ships and coli leaves out, are no sign of a wrong
    // config).
    tensor_missing_refused(
        n,
        "model.language_model.layers.1.hc_ffn_fn",
        &[
            "model.language_model.layers.1.hc_ffn_fn",
            "is a shard absent",
        ],
    );
    tensor_missing_refused(
        n,
        "model.language_model.layers.2.self_attn.indexer.index_kpool_compress_gate",
        &["model.language_model.layers.2.self_attn.indexer.index_kpool_compress_gate"],
    );
}

/// A copy of fixture `name` in `tmp/ckpt` with tensor `tensor`'s shape and bytes `edit`ed (the
/// shard's header rewritten to match).
fn with_tensor_edit(
    name: &str,
    tmp: &Path,
    tensor: &str,
    edit: impl Fn(&mut Vec<u64>, &mut Vec<u8>),
) -> PathBuf {
    let ck = with_config(name, tmp, |_| {});
    for entry in std::fs::read_dir(&ck).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        if !header.contains_key(tensor) {
            continue;
        }
        let data = &bytes[8 + n..];
        let mut entries: Vec<(String, Value, Vec<u8>)> = header
            .into_iter()
            .filter(|(k, _)| k != "__metadata__")
            .map(|(k, v)| {
                let o = v["data_offsets"].as_array().unwrap();
                let (a, b) = (o[0].as_u64().unwrap(), o[1].as_u64().unwrap());
                let d = data[a as usize..b as usize].to_vec();
                (k, v, d)
            })
            .collect();
        let mut new_header = serde_json::Map::new();
        let mut new_data = Vec::new();
        for (k, mut v, mut d) in entries.drain(..) {
            if k == tensor {
                let mut shape: Vec<u64> = v["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap())
                    .collect();
                edit(&mut shape, &mut d);
                v["shape"] = json!(shape);
            }
            v["data_offsets"] = json!([new_data.len(), new_data.len() + d.len()]);
            new_data.extend_from_slice(&d);
            new_header.insert(k, v);
        }
        let h = serde_json::to_vec(&Value::Object(new_header)).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&new_data);
        std::fs::write(&p, out).unwrap();
        return ck;
    }
    panic!("{name}: no tensor {tensor}");
}

/// DeepSeek-V4 as released (`deepseek_v4_fp8`: FP8 dense with E8M0 `.scale` blocks, FP4
/// experts) and as BF16: compress rates, layer kinds, `hc_mult` or head shapes the tensors
/// contradict, a missing hash table, scale or compressor, an FP4 scale of the wrong shape, an
/// expert id outside the experts, an e8m0 NaN scale and unsupported config values are refused
/// before anything is written, naming the field or tensor.
#[test]
fn deepseek_v4_bad_inputs_are_refused_before_anything_is_written() {
    let n = "deepseek_v4_fp8";
    missing_shard_refused(n, "model-00002-of-00003.safetensors");
    // A compress rate the compressor's position offsets (`ape` [rate, w]) contradict.
    config_refused(
        n,
        "compress_rates",
        json!({"compressed_sparse_attention": 8, "heavily_compressed_attention": 8}),
        &["layers.1.attn.compressor.ape", "expected"],
    );
    // Layer kinds the tensors contradict: layer 0 declared CSA has no compressor.
    config_refused(
        n,
        "compress_ratios",
        json!([4, 4, 128, 4, 0, 0]),
        &["layers.0.attn.compressor", "missing"],
    );
    config_refused(
        n,
        "compress_ratios",
        json!([0, 3, 128, 4, 0, 0]),
        &["config.json", "compress_ratios"],
    );
    // A `hc_mult` the hyper-connections contradict; a head width the projections contradict.
    config_refused(n, "hc_mult", json!(2), &["hc_head_base", "expected [2]"]);
    config_refused(n, "head_dim", json!(16), &["layers.0.attn.", "expected"]);
    // Unsupported or impossible config values, named.
    config_refused(n, "num_key_value_heads", json!(2), &["num_key_value_heads"]);
    config_refused(n, "scoring_func", json!("softmax"), &["scoring_func"]);
    config_refused(n, "o_groups", json!(3), &["o_groups"]);
    config_refused(n, "qk_rope_head_dim", json!(7), &["qk_rope_head_dim"]);
    config_refused(n, "swiglu_limit", json!(0.0), &["swiglu_limit"]);
    config_refused(n, "n_shared_experts", json!(2), &["n_shared_experts"]);
    // More hash-routed layers than the tables: layer 2 has a selection bias, no table.
    config_refused(
        n,
        "num_hash_layers",
        json!(3),
        &["layers.2.ffn.gate.tid2eid", "num_hash_layers"],
    );
    // A missing hash table, FP8 block scale, FP4 scale.
    for t in [
        "layers.0.ffn.gate.tid2eid",
        "layers.1.attn.compressor.wgate.weight",
    ] {
        tensor_missing_refused(n, t, &[t, "missing"]);
    }
    tensor_missing_refused(
        n,
        "layers.0.attn.wq_a.scale",
        &["layers.0.attn.wq_a.weight", "block scale"],
    );
    tensor_missing_refused(
        n,
        "layers.3.ffn.experts.5.w2.scale",
        &["layers.3.ffn.experts.5.w2.weight", "e8m0 scale"],
    );
    // An FP4 scale of the wrong shape (one scale per 64 columns instead of 32).
    let tmp = tempfile::tempdir().unwrap();
    let s = "layers.2.ffn.experts.3.w1.scale";
    let ck = with_tensor_edit(n, tmp.path(), s, |shape, d| {
        shape[1] /= 2;
        d.truncate(d.len() / 2);
    });
    refused(&ck, tmp.path(), &[s, "F8_E8M0"]);
    // An e8m0 NaN scale (0xFF) in an FP4 expert.
    let tmp = tempfile::tempdir().unwrap();
    let ck = with_tensor_edit(n, tmp.path(), s, |_, d| d[3] = 0xFF);
    refused(&ck, tmp.path(), &[s, "NaN"]);
    // A hash table entry that is no expert (8 experts).
    let tmp = tempfile::tempdir().unwrap();
    let t = "layers.1.ffn.gate.tid2eid";
    let ck = with_tensor_edit(n, tmp.path(), t, |_, d| {
        d[16..24].copy_from_slice(&8i64.to_le_bytes());
    });
    refused(
        &ck,
        tmp.path(),
        &[t, "holds 8 at [1, 0]", "n_routed_experts"],
    );
    // An FP4 weight whose packed width does not match the config.
    let tmp = tempfile::tempdir().unwrap();
    let w = "layers.4.ffn.experts.0.w3.weight";
    let ck = with_tensor_edit(n, tmp.path(), w, |shape, d| {
        shape[1] /= 2;
        d.truncate(d.len() / 2);
    });
    refused(&ck, tmp.path(), &[w, "expected"]);
}
