//! Tests of the config reading and the tensor lists.

use super::*;
use serde_json::json;

fn spec(v: Value) -> Result<ModelSpec, FormatError> {
    ModelSpec::from_config(&v, None)
}

fn mixtral() -> Value {
    json!({"model_type": "mixtral", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32,
           "num_local_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 2})
}

fn deepseek() -> Value {
    json!({"model_type": "deepseek_v3", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 4,
           "num_attention_heads": 2, "n_routed_experts": 4, "moe_intermediate_size": 4,
           "intermediate_size": 12, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
           "q_lora_rank": 8, "kv_lora_rank": 4, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
           "v_head_dim": 4, "topk_method": "noaux_tc", "n_shared_experts": 1,
           "num_nextn_predict_layers": 1, "n_group": 1, "topk_group": 1})
}

fn glm() -> Value {
    json!({"model_type": "glm_moe_dsa", "vocab_size": 100, "hidden_size": 64,
           "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 96,
           "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
           "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1,
           "rope_interleave": false, "index_n_heads": 4, "index_head_dim": 16,
           "index_topk": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
}

fn names(s: &ModelSpec) -> Vec<String> {
    s.tensors.dense().iter().map(|t| t.name.clone()).collect()
}

#[test]
fn mixtral_defaults_and_eos_union() {
    let c = ModelSpec::from_config(&mixtral(), Some(&json!({"eos_token_id": [2, 7]}))).unwrap();
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.eos_token_ids, vec![2, 7]);
    assert!(c.norm_topk_prob);
    assert_eq!(c.routing, Routing::SoftmaxTopK { renormalize: true });
    assert_eq!(c.rms_norm_eps, 1e-5);
    let n = names(&c);
    assert!(n.contains(&"model.layers.1.block_sparse_moe.gate.weight".to_string()));
    assert!(n.contains(&"lm_head.weight".to_string()));
    assert!(!c.tensors.lm_head.optional);
    let e = &c.tensors.expert_sets()[1];
    assert_eq!(
        e.tensor_names(3)[1],
        "model.layers.1.block_sparse_moe.experts.3.w3.weight"
    );
    assert_eq!(e.tensors(3)[2].shape, vec![64, 32]);
}

#[test]
fn rope_styles() {
    let mut v = mixtral();
    v["rope_theta"] = json!(5000.0);
    v["rope_scaling"] = Value::Null;
    assert_eq!(spec(v.clone()).unwrap().rope_theta, 5000.0);
    v["rope_scaling"] = json!({"rope_type": "default"});
    assert_eq!(spec(v.clone()).unwrap().rope_theta, 5000.0);
    let mut w = mixtral();
    w["rope_parameters"] = json!({"rope_theta": 123.0, "rope_type": "default"});
    assert_eq!(spec(w).unwrap().rope_theta, 123.0);
    v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
    let e = spec(v).unwrap_err().to_string();
    assert!(e.contains("unsupported rope scaling"), "{e}");
}

#[test]
fn bad_fields_are_named() {
    let mut v = mixtral();
    v["model_type"] = json!("llama");
    let e = spec(v).unwrap_err().to_string();
    assert!(
        e.contains("llama") && e.contains("olmoe") && e.contains("kimi_k2"),
        "{e}"
    );
    let mut v = mixtral();
    v["eos_token_id"] = json!("x");
    assert!(spec(v).unwrap_err().to_string().contains("eos_token_id"));
    let mut v = mixtral();
    v.as_object_mut().unwrap().remove("hidden_size");
    let e = spec(v).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("hidden_size"),
        "{e}"
    );
    let mut v = mixtral();
    v.as_object_mut().unwrap().remove("num_local_experts");
    let e = spec(v).unwrap_err().to_string();
    assert!(e.contains("num_local_experts"), "{e}");
    let mut v = mixtral();
    v.as_object_mut().unwrap().remove("intermediate_size");
    let e = spec(v).unwrap_err().to_string();
    assert!(e.contains("intermediate_size"), "{e}");
    let mut v = mixtral();
    v["hidden_size"] = json!("8");
    assert!(spec(v).unwrap_err().to_string().contains("hidden_size"));
    let mut v = mixtral();
    v["quantization_config"] = json!({"weight_block_size": [64, 64]});
    let e = spec(v).unwrap_err().to_string();
    assert!(e.contains("weight_block_size"), "{e}");
    let mut v = mixtral();
    v["hidden_act"] = json!("gelu");
    assert!(spec(v).unwrap_err().to_string().contains("gelu"));
}

#[test]
fn qwen3_sparse_layers() {
    let v = json!({"model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, "head_dim": 32,
           "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
           "mlp_only_layers": [0], "decoder_sparse_step": 2, "norm_topk_prob": true});
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.head_dim, 32);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.moe_layers, [false, true, false, true]);
    let n = names(&c);
    assert!(n.contains(&"model.layers.0.mlp.up_proj.weight".to_string()));
    assert!(n.contains(&"model.layers.1.self_attn.q_norm.weight".to_string()));
    assert_eq!(c.tensors.expert_sets().len(), 2);
    // transformers 5.x spelling of the expert count
    let mut w = v;
    w.as_object_mut().unwrap().remove("num_experts");
    w["num_local_experts"] = json!(8);
    assert_eq!(spec(w.clone()).unwrap().num_experts, 8);
    w["mlp_only_layers"] = json!(["a"]);
    assert!(spec(w).unwrap_err().to_string().contains("mlp_only_layers"));
}

#[test]
fn deepseek_layers_routing_and_mtp() {
    let c = spec(deepseek()).unwrap();
    assert_eq!(c.moe_layers, [false, true, true, true]);
    assert_eq!(c.mtp_layer(), Some(4));
    let n = names(&c);
    for want in [
        "model.layers.1.mlp.gate.e_score_correction_bias",
        "model.layers.1.self_attn.q_a_proj.weight",
        "model.layers.1.mlp.shared_experts.up_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.4.eh_proj.weight",
        "model.layers.4.self_attn.kv_b_proj.weight",
        "model.layers.4.shared_head.head.weight",
    ] {
        assert!(n.contains(&want.to_string()), "{want}");
    }
    let mtp = &c.tensors.mtp[0];
    let (embed, head) = (mtp.embed.as_ref().unwrap(), mtp.head.as_ref().unwrap());
    assert!(!embed.optional && !head.optional && !mtp.eh_proj.weight.optional);
    assert!(mtp.dense().iter().all(|t| t.class == TensorClass::Mtp));
    let sets = c.tensors.expert_sets();
    assert_eq!(sets.last().unwrap().layer, 4);
    assert_eq!(sets.last().unwrap().class, TensorClass::Mtp);
    assert_eq!(c.expert_layers(), vec![(1, 4), (2, 4), (3, 4), (4, 4)]);
    // No MTP layer declared: none listed.
    let mut v = deepseek();
    v["num_nextn_predict_layers"] = json!(0);
    assert!(spec(v.clone()).unwrap().tensors.mtp.is_empty());
    v["num_nextn_predict_layers"] = json!(2);
    assert!(spec(v.clone()).unwrap_err().to_string().contains("MTP"));
    // Without q_lora: q_proj.
    let mut v = deepseek();
    v["q_lora_rank"] = Value::Null;
    assert!(names(&spec(v).unwrap()).contains(&"model.layers.2.self_attn.q_proj.weight".into()));
    // Only grouped sigmoid routing with noaux_tc runs.
    let mut v = deepseek();
    v["topk_method"] = json!("greedy");
    assert!(matches!(spec(v), Err(FormatError::Unsupported(_))));
    // mlp_layer_types is a GLM-5 key; DeepSeek-V3 ignores it as transformers does.
    let mut v = deepseek();
    v["mlp_layer_types"] = json!(["dense", "sparse", "dense", "moe"]);
    assert_eq!(spec(v).unwrap().moe_layers, [false, true, true, true]);
}

#[test]
fn glm_moe_dsa_reads_indexer_and_layer_types() {
    let mut v = glm();
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.family, Family::GlmMoeDsa);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope_theta, 1e6);
    let m = c.mla.as_ref().unwrap();
    assert!(m.rope_interleave, "GLM-5 RoPE is always interleaved");
    let d = m.dsa.as_ref().unwrap();
    assert_eq!((d.n_heads, d.head_dim, d.topk), (4, 16, 8));
    assert_eq!(d.full, vec![true; 3]);
    assert_eq!(c.moe_layers, [false, true, true]);
    assert!(names(&c).contains(&"model.layers.2.self_attn.indexer.k_norm.bias".to_string()));
    v["mlp_layer_types"] = json!(["dense", "sparse", "dense"]);
    assert_eq!(spec(v.clone()).unwrap().moe_layers, [false, true, false]);
    v["mlp_layer_types"] = json!(["dense", "moe", "dense"]);
    let e = spec(v.clone()).unwrap_err().to_string();
    assert!(e.contains("moe"), "{e}");
    v["mlp_layer_types"] = json!(["dense", "sparse"]);
    assert!(spec(v.clone())
        .unwrap_err()
        .to_string()
        .contains("mlp_layer_types"));
    v["mlp_layer_types"] = Value::Null;
    v["indexer_types"] = json!(["full", "shared", "full"]);
    let c = spec(v.clone()).unwrap();
    assert!(!names(&c).contains(&"model.layers.1.self_attn.indexer.wk.weight".to_string()));
    // GlmMoeDsaConfig's defaults for the indexer keys.
    v.as_object_mut().unwrap().remove("index_topk");
    v.as_object_mut().unwrap().remove("index_n_heads");
    let d = spec(v.clone()).unwrap().mla.unwrap().dsa.unwrap();
    assert_eq!((d.topk, d.n_heads, d.head_dim), (2048, 32, 16));
    v["index_topk"] = json!(0);
    let e = spec(v.clone()).unwrap_err().to_string();
    assert!(e.contains("index_topk"), "{e}");
    let mut v = glm();
    v["q_lora_rank"] = Value::Null;
    assert!(spec(v).unwrap_err().to_string().contains("q_lora_rank"));
}

#[test]
fn text_config_of_a_multimodal_wrapper() {
    let wrapped = json!({"model_type": "llava_next", "tie_word_embeddings": true,
        "eos_token_id": 9, "text_config": mixtral(), "vision_config": {"hidden_size": 3}});
    let c = spec(wrapped).unwrap();
    assert_eq!(c.wrapper.as_deref(), Some("llava_next"));
    assert_eq!(c.family, Family::Mixtral);
    assert!(c.tie_word_embeddings && c.tensors.lm_head.optional);
    assert_eq!(c.eos_token_ids, vec![2, 9]);
    assert_eq!(
        c.canonical_tensor_name("language_model.model.layers.0.input_layernorm.weight")
            .as_deref(),
        Some("model.layers.0.input_layernorm.weight")
    );
    assert_eq!(
        c.canonical_tensor_name("model.language_model.norm.weight")
            .as_deref(),
        Some("model.norm.weight")
    );
    assert_eq!(
        c.canonical_tensor_name("language_model.lm_head.weight")
            .as_deref(),
        Some("lm_head.weight")
    );
    assert_eq!(c.canonical_tensor_name("vision_tower.blocks.0.w"), None);
    // A missing field is named with its path.
    let mut t = mixtral();
    t.as_object_mut().unwrap().remove("vocab_size");
    let e = spec(json!({"model_type": "llava_next", "text_config": t}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("text_config.vocab_size"), "{e}");
    // A plain config names every tensor as it is.
    let c = spec(mixtral()).unwrap();
    assert_eq!(c.canonical_tensor_name("x.y").as_deref(), Some("x.y"));
    // A wrapper whose text model coli does not run is refused by its own model_type.
    let e = spec(json!({"model_type": "llava", "text_config": {"model_type": "llama"}}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("llava"), "{e}");
}

/// Every committed fixture checkpoint holds exactly the tensors its spec lists: the required
/// ones, and optional ones only where the spec allows (FP8 block scales aside).
#[test]
fn fixture_checkpoints_hold_exactly_the_spec_tensors() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny");
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).expect("tests/fixtures/tiny exists") {
        let dir = entry.unwrap().path();
        let config: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let index: Value = serde_json::from_slice(
            &std::fs::read(dir.join("model.safetensors.index.json")).unwrap(),
        )
        .unwrap();
        let s = spec(config).unwrap();
        // Tensors outside the language model (Inkling's audio tower, Qwen3.5's vision tower)
        // are not the spec's; a wrapper's tensors are compared by their canonical names.
        let mut in_checkpoint: std::collections::BTreeSet<String> = index["weight_map"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !k.ends_with("_scale_inv"))
            // compressed-tensors MXFP4 (Kimi K3's experts): the converter reads a
            // `weight_packed` with its `weight_scale` as the spec's `.weight`.
            .filter(|k| !k.ends_with(".weight_scale"))
            .map(|k| match k.strip_suffix("_packed") {
                Some(w) => w.to_string(),
                None => k.clone(),
            })
            // DeepSeek-V4's block scales beside their FP8 / FP4 weights.
            .filter(|k| {
                k.strip_suffix(".scale").is_none_or(|stem| {
                    !index["weight_map"]
                        .as_object()
                        .unwrap()
                        .contains_key(&format!("{stem}.weight"))
                })
            })
            .filter_map(|k| s.canonical_tensor_name(&k).map(|c| c.into_owned()))
            // An MTP layer coli does not convert (GLM-5.3-Flash's, DeepSeek-V4's `mtp.{k}.*`)
            // is not the spec's either.
            .filter(|k| !(s.family == Family::DeepseekV4 && k.starts_with("mtp.")))
            .filter(|k| {
                crate::spec::layer_of(k).is_none_or(|l| {
                    (l as usize) < s.num_layers
                        || (l as usize) >= s.num_layers + s.unconverted_mtp_layers
                        || s.num_mtp_layers > 0
                })
            })
            .collect();
        for t in s.tensors.dense() {
            let present = in_checkpoint.remove(&t.name);
            assert!(
                present || t.optional,
                "{}: {} missing",
                dir.display(),
                t.name
            );
        }
        for e in s.tensors.expert_sets() {
            let fused = [
                format!("{}.gate_up_proj", e.prefix),
                format!("{}.down_proj", e.prefix),
            ];
            if matches!(e.storage, ExpertStorage::PerExpert(_))
                && fused.iter().all(|n| in_checkpoint.contains(n))
            {
                // A per-expert family stored fused (Qwen3.5 as published): `FusedConcat`.
                for n in &fused {
                    in_checkpoint.remove(n);
                }
            } else if let ExpertStorage::PerExpert(_) = e.storage {
                for x in 0..e.count {
                    for n in e.tensor_names(x) {
                        assert!(in_checkpoint.remove(&n), "{}: {n} missing", dir.display());
                    }
                }
            } else {
                // gpt-oss: the layer's fused tensors (MXFP4 blocks and scales, or BF16).
                for (n, _, _) in e.fused_tensors() {
                    assert!(in_checkpoint.remove(&n), "{}: {n} missing", dir.display());
                }
            }
        }
        assert!(
            in_checkpoint.is_empty(),
            "{}: not in the spec: {in_checkpoint:?}",
            dir.display()
        );
        seen += 1;
    }
    assert!(seen >= 8, "expected the eight tiny fixtures, found {seen}");
}

#[test]
fn layer_index_of_names() {
    assert_eq!(layer_of("model.layers.61.eh_proj.weight"), Some(61));
    assert_eq!(layer_of("model.norm.weight"), None);
    assert_eq!(layer_of("lm_head.weight"), None);
}

#[test]
fn kimi_k2_is_deepseek_v3_and_dense_layers_come_first() {
    let v = json!({"model_type": "kimi_k2", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 96,
        "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1,
        "n_group": 2, "topk_group": 1, "rope_theta": 50000.0});
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.family, Family::DeepseekV3);
    assert_eq!(c.model_type, "kimi_k2");
    let m = c.mla.as_ref().unwrap();
    assert_eq!(m.q_lora_rank, None);
    assert!(m.rope_interleave && m.yarn.is_none());
    assert_eq!(c.rope_theta, 50000.0);
    assert!((m.softmax_scale - 24f32.powf(-0.5)).abs() < 1e-7);
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && c.is_moe_layer(3));
    assert_eq!(
        c.routing,
        Routing::GroupedSigmoid {
            n_group: 2,
            topk_group: 1,
            renormalize: true,
            scaling: 2.5 // DeepseekV3Config's default routed_scaling_factor
        }
    );
    // DeepseekV3Config's defaults: 1 shared expert, 1 MTP layer; an absent q_lora_rank is 1536.
    assert_eq!((c.n_shared_experts, c.mtp_layer()), (1, Some(4)));
    let mut w = v.clone();
    w.as_object_mut().unwrap().remove("q_lora_rank");
    assert_eq!(spec(w).unwrap().mla.unwrap().q_lora_rank, Some(1536));
    let mut bad = v.clone();
    bad["n_group"] = json!(3);
    assert!(spec(bad.clone()).is_err());
    bad["n_group"] = json!(2);
    bad["rope_scaling"] = json!({"type": "llama3", "factor": 8.0});
    let e = spec(bad).unwrap_err();
    assert!(e.to_string().contains("llama3"), "{e}");
}

/// gpt-oss: `GptOssConfig`'s defaults (YaRN when no rope block, sliding on even layers,
/// swiglu 1.702 / 7.0), the published MXFP4 storage when `quantization_config` says so, the
/// fused BF16 storage otherwise, and the window per layer.
#[test]
fn gpt_oss_defaults_and_storage() {
    let base = json!({"model_type": "gpt_oss", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 96, "num_local_experts": 8,
        "num_experts_per_tok": 2});
    let s = spec(base.clone()).unwrap();
    assert_eq!(s.family, Family::GptOss);
    assert_eq!(s.routing, Routing::TopKSoftmax);
    assert_eq!(s.sliding_layers, vec![true, false, true, false]);
    assert_eq!((s.window_of(0), s.window_of(1)), (Some(128), None));
    let y = s.rope_yarn.clone().expect("default yarn");
    assert_eq!(
        (y.factor, y.original_max_position_embeddings, y.truncate),
        (32.0, 4096.0, false)
    );
    assert_eq!(s.rope_theta, 150_000.0);
    assert_eq!(
        s.expert_activation,
        ExpertActivation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    let e = s.tensors.expert_sets()[0];
    assert_eq!(e.storage, ExpertStorage::FusedInterleaved);
    assert!(e.biases);
    let mut mx = base.clone();
    mx["quantization_config"] = json!({"quant_method": "mxfp4"});
    mx["layer_types"] = json!([
        "full_attention",
        "sliding_attention",
        "full_attention",
        "full_attention"
    ]);
    mx["sliding_window"] = json!(8);
    let s = spec(mx.clone()).unwrap();
    assert_eq!(
        s.tensors.expert_sets()[0].storage,
        ExpertStorage::FusedMxfp4
    );
    assert_eq!(s.window_of(1), Some(8));
    assert_eq!(s.window_of(0), None);
    // Every layer's attention has sinks; the router has a bias.
    let names: Vec<String> = s.tensors.dense().iter().map(|t| t.name.clone()).collect();
    assert!(names.contains(&"model.layers.3.self_attn.sinks".to_string()));
    assert!(names.contains(&"model.layers.0.mlp.router.bias".to_string()));
    assert!(names.contains(&"model.layers.0.self_attn.q_proj.bias".to_string()));
    // MXFP4 needs whole 32-column blocks.
    mx["intermediate_size"] = json!(80);
    let err = spec(mx).unwrap_err().to_string();
    assert!(err.contains("multiples of 32"), "{err}");
    let mut bad = base;
    bad["layer_types"] = json!(["sliding_attention"]);
    assert!(spec(bad).unwrap_err().to_string().contains("layer_types"));
}

fn glm4_moe() -> Value {
    json!({"model_type": "glm4_moe", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 20,
           "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8,
           "num_experts_per_tok": 2})
}

#[test]
fn glm4_moe_defaults_as_glm4_moe_config() {
    let c = spec(glm4_moe()).unwrap();
    assert_eq!(c.family, Family::Glm4Moe);
    // Glm4MoeConfig: partial_rotary_factor 0.5, first_k_dense_replace 1, n_shared_experts 1,
    // num_nextn_predict_layers 1, n_group/topk_group 1, routed_scaling_factor 1, norm_topk true.
    assert_eq!(c.rotary_dim, 10);
    assert_eq!(c.moe_layers, vec![false, true, true]);
    assert_eq!(c.n_shared_experts, 1);
    assert_eq!(c.mtp_layer(), Some(3));
    assert_eq!(
        c.routing,
        Routing::GroupedSigmoid {
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            scaling: 1.0
        }
    );
    assert_eq!((c.rope_theta, c.rms_norm_eps), (10_000.0, 1e-5));
    assert!(c.mla.is_none() && !c.attention_bias && !c.qk_norm);
    let n = names(&c);
    assert!(!n
        .iter()
        .any(|n| n.contains("q_norm") || n.ends_with(".bias")));
    assert!(n.contains(&"model.layers.0.mlp.gate_proj.weight".to_string()));
    assert!(n.contains(&"model.layers.1.mlp.shared_experts.down_proj.weight".to_string()));
    assert!(n.contains(&"model.layers.2.mlp.gate.e_score_correction_bias".to_string()));
    // The MTP layer: its embedding and head optional (GLM-4.6/4.7 publish none).
    let m = &c.tensors.mtp[0];
    let (embed, head) = (m.embed.as_ref().unwrap(), m.head.as_ref().unwrap());
    assert!(embed.optional && head.optional && !m.eh_proj.weight.optional);
    assert_eq!(m.layer.experts().unwrap().class, TensorClass::Mtp);
}

#[test]
fn glm4_moe_biases_norms_and_rotary_factor() {
    let mut v = glm4_moe();
    v["attention_bias"] = json!(true);
    v["use_qk_norm"] = json!(true);
    v["partial_rotary_factor"] = json!(1.0);
    v["rope_theta"] = json!(1e6);
    v["rope_scaling"] = Value::Null;
    v["num_nextn_predict_layers"] = json!(0);
    v["n_group"] = json!(2);
    v["topk_group"] = json!(1);
    v["routed_scaling_factor"] = json!(2.5);
    let c = spec(v.clone()).unwrap();
    assert_eq!((c.rotary_dim, c.rope_theta), (20, 1e6));
    assert!(c.tensors.mtp.is_empty() && c.mtp_layer().is_none());
    let n = names(&c);
    for t in [
        "q_proj.bias",
        "k_proj.bias",
        "v_proj.bias",
        "q_norm.weight",
        "k_norm.weight",
    ] {
        assert!(n.contains(&format!("model.layers.0.self_attn.{t}")), "{t}");
    }
    assert!(!n.contains(&"model.layers.0.self_attn.o_proj.bias".to_string()));
    assert!(matches!(
        c.routing,
        Routing::GroupedSigmoid { n_group: 2, topk_group: 1, scaling, .. } if scaling == 2.5
    ));
    // transformers 5 writes the factor inside rope_parameters; that one wins.
    let mut w = v.clone();
    w["rope_parameters"] =
        json!({"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5});
    let c = spec(w).unwrap();
    assert_eq!((c.rotary_dim, c.rope_theta), (10, 5e5));
    // An explicit null is kept by Glm4MoeConfig's setdefault: RoPE over the whole head.
    let mut w = glm4_moe();
    w["partial_rotary_factor"] = Value::Null;
    assert_eq!(spec(w).unwrap().rotary_dim, 20);
    // Refusals name the field.
    for (k, x, what) in [
        (
            "partial_rotary_factor",
            json!(0.45),
            "partial_rotary_factor",
        ),
        ("n_group", json!(3), "n_group"),
        (
            "num_nextn_predict_layers",
            json!(2),
            "num_nextn_predict_layers",
        ),
        ("scoring_func", json!("softmax"), "scoring_func"),
    ] {
        let mut w = v.clone();
        w[k] = x;
        let e = spec(w).unwrap_err().to_string();
        assert!(e.contains(what), "{k}: {e}");
    }
    let mut w = v;
    w.as_object_mut().unwrap().remove("n_routed_experts");
    let e = spec(w).unwrap_err().to_string();
    assert!(e.contains("n_routed_experts"), "{e}");
}

#[test]
fn minimax_m2_as_minimax_m2_config() {
    let v = json!({"model_type": "minimax_m2", "vocab_size": 100, "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "intermediate_size": 32, "num_local_experts": 8, "num_experts_per_tok": 2,
                   "rotary_dim": 64, "scoring_func": "sigmoid",
                   "quantization_config": {"quant_method": "fp8", "fmt": "float8_e4m3fn",
                                           "weight_block_size": [128, 128]}});
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.family, Family::MinimaxM2);
    // MiniMaxM2Config: head_dim 128 by default (not hidden / heads), theta 5e6, eps 1e-6;
    // rotary_dim read as partial_rotary_factor = rotary_dim / head_dim.
    assert_eq!((c.head_dim, c.rotary_dim), (128, 64));
    assert_eq!((c.rope_theta, c.rms_norm_eps), (5e6, 1e-6));
    assert_eq!(c.moe_intermediate_size, 32);
    assert_eq!(c.moe_layers, vec![true, true]);
    assert_eq!((c.n_shared_experts, c.mtp_layer()), (0, None));
    assert_eq!(
        c.routing,
        Routing::GroupedSigmoid {
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            scaling: 1.0
        }
    );
    let n = names(&c);
    for t in [
        "model.layers.1.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.e_score_correction_bias",
        "model.layers.0.self_attn.q_norm.weight",
    ] {
        assert!(n.contains(&t.to_string()), "{t}");
    }
    assert!(!n
        .iter()
        .any(|n| n.ends_with(".bias") || n.contains("shared")));
    let q = c.tensors.dense()[2..]
        .iter()
        .find(|t| t.name.ends_with("q_norm.weight"))
        .cloned();
    assert_eq!(
        q.unwrap().shape,
        vec![4 * 128],
        "one norm over the whole projection"
    );
    let e = &c.tensors.expert_sets()[0];
    assert_eq!(
        e.tensor_names(5),
        [
            "model.layers.0.block_sparse_moe.experts.5.w1.weight",
            "model.layers.0.block_sparse_moe.experts.5.w3.weight",
            "model.layers.0.block_sparse_moe.experts.5.w2.weight"
        ]
    );
    // Without rotary_dim every head dimension rotates (factor 1).
    let mut w = v.clone();
    w.as_object_mut().unwrap().remove("rotary_dim");
    assert_eq!(spec(w).unwrap().rotary_dim, 128);
    let mut w = v;
    w["scoring_func"] = json!("softmax");
    assert!(spec(w).unwrap_err().to_string().contains("scoring_func"));
}

#[test]
fn deepseek_v32_is_deepseek_v3_with_an_indexer_on_every_layer() {
    let mut v = glm();
    v["model_type"] = json!("deepseek_v32");
    v["n_group"] = json!(2);
    v["topk_group"] = json!(1);
    v["indexer_types"] = json!(["full", "shared", "full"]);
    v.as_object_mut().unwrap().remove("index_n_heads");
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.family, Family::DeepseekV32);
    assert!(c.family.is_mla());
    let m = c.mla.as_ref().unwrap();
    let d = m.dsa.as_ref().unwrap();
    // Every layer runs its indexer (DeepseekV32Attention always builds one), half-split RoPE
    // in the indexer, interleaved in the attention; DeepseekV32Config's 64 indexer heads.
    assert_eq!(d.full, vec![true; 3]);
    assert!(!d.rope_interleave && m.rope_interleave);
    assert_eq!(d.n_heads, 64);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert!(names(&c).contains(&"model.layers.1.self_attn.indexer.wk.weight".to_string()));
    // DeepseekV32Config reads mlp_layer_types when given; the GLM-5-only per-layer indexer
    // keys are not read (a "shared" first entry would be refused for GLM-5).
    v["mlp_layer_types"] = json!(["dense", "sparse", "dense"]);
    v["indexer_types"] = json!(["shared", "full", "full"]);
    let c = spec(v.clone()).unwrap();
    assert_eq!(c.moe_layers, [false, true, false]);
    v["attention_bias"] = json!(true);
    assert!(spec(v.clone())
        .unwrap_err()
        .to_string()
        .contains("attention_bias"));
    v["attention_bias"] = json!(false);
    v["q_lora_rank"] = Value::Null;
    assert!(spec(v).unwrap_err().to_string().contains("q_lora_rank"));
}

/// A published-style Inkling config: the language model under `text_config` (no model_type
/// there), MTP fields in the top-level `mtp_config`.
fn inkling() -> Value {
    json!({"model_type": "inkling_mm_model", "eos_token_id": 2,
        "mtp_config": {"num_nextn_predict_layers": 2, "local_layer_ids": [1],
                       "chain_hidden_post_norm": true},
        "text_config": {"vocab_size": 64, "unpadded_vocab_size": 60, "hidden_size": 32,
            "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "swa_head_dim": 4, "swa_num_attention_heads": 2,
            "swa_num_key_value_heads": 1, "intermediate_size": 16,
            "dense_intermediate_size": 48, "dense_mlp_idx": 2, "n_routed_experts": 8,
            "num_experts_per_tok": 2, "sconv_kernel_size": 3}})
}

#[test]
fn inkling_layers_heads_and_mtp() {
    let s = spec(inkling()).unwrap();
    assert_eq!(s.family, Family::Inkling);
    assert_eq!(s.wrapper.as_deref(), Some("inkling_mm_model"));
    // dense_intermediate_size: intermediate_size is the experts' width.
    assert_eq!((s.moe_intermediate_size, s.intermediate_size), (16, 48));
    // Default pattern: every layer slides but those with (i + 1) % 6 == 0.
    let sliding: Vec<bool> = (0..7).map(|i| s.window_of(i).is_some()).collect();
    assert_eq!(sliding, [true, true, true, true, true, false, true]);
    assert_eq!(s.moe_layers, [false, false, true, true, true, true, true]);
    let ink = s.inkling.as_ref().unwrap();
    assert_eq!((ink.conv_kernel, ink.unpadded_vocab_size), (3, 60));
    let d = ink.layer_dims(&s, 0);
    assert_eq!((d.heads, d.kv_heads, d.head_dim, d.extent), (2, 1, 4, 512));
    let d = ink.layer_dims(&s, 5);
    assert_eq!((d.heads, d.kv_heads, d.head_dim, d.extent), (4, 2, 8, 1024));
    // MTP from mtp_config: two chained layers, the second sliding, the shared chain norm.
    assert_eq!(s.num_mtp_layers, 2);
    assert_eq!(ink.mtp_sliding, [false, true]);
    assert_eq!(s.tensors.mtp.len(), 2);
    let m = &s.tensors.mtp[1];
    assert_eq!(
        m.eh_proj.weight.name,
        "model.mtp.layers.1.input_proj.weight"
    );
    assert_eq!(
        m.head_norm.as_ref().map(|t| t.name.as_str()),
        Some("model.mtp.chain_norm.weight")
    );
    assert!(m.embed.is_none() && m.head.is_none() && m.hidden_first && m.chain_normed);
    assert_eq!(ink.layer_dims(&s, 7 + 1).extent, 512, "MTP layer 1 slides");
    // Conv weights keep their 3-D shape; the routed experts are fused.
    let l = &s.tensors.layers[2];
    let AttentionSpec::Inkling(a) = &l.attention else {
        panic!("Inkling attention")
    };
    assert_eq!(a.k_conv.shape, [4, 1, 3]);
    assert_eq!(a.k_conv.rows_cols(), (4, 3));
    let e = l.experts().unwrap();
    assert_eq!(e.storage, ExpertStorage::FusedW13);
    assert_eq!(
        e.fused_tensors()[0].0,
        "model.llm.layers.2.mlp.experts.w13_weight"
    );
    // Only the language model's tensors are read.
    assert!(s
        .canonical_tensor_name("model.visual.layers.linear_0.weight")
        .is_none());
    assert!(s.canonical_tensor_name("model.llm.norm.weight").is_some());
    // What transformers does not compute is refused, naming the field.
    let mut c = inkling();
    c["text_config"]["shared_expert_sink"] = json!(false);
    assert!(spec(c)
        .unwrap_err()
        .to_string()
        .contains("shared_expert_sink"));
    let mut c = inkling();
    c["text_config"]["layer_types"] = json!(vec!["full_attention"; 7]);
    assert!(spec(c).unwrap_err().to_string().contains("layer_types"));
}

/// A Qwen3-Next or Qwen3.5 config that leaves the attention shape out takes transformers'
/// defaults (`Qwen3NextConfig`, `Qwen3_5MoeTextConfig`: 2 KV heads, head_dim 256, 32768
/// positions), not the generic `num_attention_heads` / `hidden / heads`.
#[test]
fn hybrid_families_default_attention_shape_as_transformers() {
    let text = |model_type: &str| {
        json!({"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 4, "vocab_size": 100, "num_experts": 8,
            "num_experts_per_tok": 2})
    };
    for c in [
        text("qwen3_next"),
        json!({"model_type": "qwen3_5_moe", "text_config": text("qwen3_5_moe_text")}),
    ] {
        let s = spec(c).unwrap();
        assert_eq!(
            (s.num_kv_heads, s.head_dim, s.max_position_embeddings),
            (2, 256, 32768),
            "{:?}",
            s.family
        );
        assert_eq!(s.rotary_dim, 64, "partial rotary 0.25 of head_dim 256");
    }
    // Given fields win.
    let mut c = text("qwen3_next");
    c["num_key_value_heads"] = json!(4);
    c["head_dim"] = json!(16);
    let s = spec(c).unwrap();
    assert_eq!((s.num_kv_heads, s.head_dim), (4, 16));
    // An odd head count cannot take the default of 2 KV heads: named.
    let mut c = text("qwen3_next");
    c["num_attention_heads"] = json!(3);
    c["head_dim"] = json!(16);
    let e = spec(c).unwrap_err().to_string();
    assert!(e.contains("num_key_value_heads 2"), "{e}");
}

/// Qwen3-Next's and Qwen3.5's MTP layer: `mtp.*` as vLLM's `qwen3_next_mtp.py` reads it, a
/// gated full-attention MoE layer at index `num_hidden_layers` whose experts are of class Mtp;
/// at most one (`num_nextn_predict_layers` / `mtp_num_hidden_layers`), none when 0.
#[test]
fn hybrid_families_mtp_layer() {
    let text = |model_type: &str| {
        json!({"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 100,
            "num_experts": 8, "num_experts_per_tok": 2})
    };
    let wrapped = |t: Value| json!({"model_type": "qwen3_5_moe", "text_config": t});
    for (c, key) in [
        (text("qwen3_next"), "num_nextn_predict_layers"),
        (wrapped(text("qwen3_5_moe_text")), "mtp_num_hidden_layers"),
    ] {
        let s = spec(c.clone()).unwrap();
        assert_eq!(s.num_mtp_layers, 1, "default 1");
        let m = &s.tensors.mtp[0];
        assert_eq!(m.layer.index, 4);
        assert_eq!(m.enorm.name, "mtp.pre_fc_norm_embedding.weight");
        assert_eq!(m.hnorm.name, "mtp.pre_fc_norm_hidden.weight");
        assert_eq!(m.eh_proj.weight.name, "mtp.fc.weight");
        assert_eq!(m.eh_proj.weight.shape, [64, 128]);
        assert_eq!(m.head_norm.as_ref().unwrap().name, "mtp.norm.weight");
        assert!(m.embed.is_none() && m.head.is_none() && !m.hidden_first && m.chain_normed);
        let AttentionSpec::Gqa { q, gated, .. } = &m.layer.attention else {
            panic!("gated full attention")
        };
        assert!(*gated);
        assert_eq!(q.weight.name, "mtp.layers.0.self_attn.q_proj.weight");
        let e = m.layer.experts().expect("MoE");
        assert_eq!((e.layer, e.class), (4, TensorClass::Mtp));
        assert_eq!(
            e.tensor_names(3)[0],
            "mtp.layers.0.mlp.experts.3.gate_proj.weight"
        );
        assert!(m.dense().iter().all(|t| t.class == TensorClass::Mtp));
        // The published names are read as they are, beside a wrapper's prefix.
        assert_eq!(
            s.canonical_tensor_name("mtp.fc.weight").as_deref(),
            Some("mtp.fc.weight")
        );
        // None, and more than one, as the config says.
        let set = |v: Value| {
            let mut c = c.clone();
            match c.get_mut("text_config") {
                Some(t) => t[key] = v,
                None => c[key] = v,
            }
            spec(c)
        };
        assert!(set(json!(0)).unwrap().tensors.mtp.is_empty());
        let e = set(json!(2)).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("at most one"), "{e}");
    }
}

/// Kimi-Linear's published config (docs/configs): 1-based layer lists in
/// `linear_attn_config`, the published key names (`num_experts_per_token`, `moe_renormalize`,
/// `model_max_length`, ...), NoPE MLA, grouped sigmoid routing; and the same model described
/// by per-layer lists (`layer_types`, `mlp_layer_types`, which transformers 5.25 saves beside
/// `linear_attn_config` and reads first) with transformers' `attribute_map` aliases
/// (`num_experts_per_tok`) and top-level `linear_*` keys.
#[test]
fn kimi_linear_reads_published_and_transformers_configs() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/configs/kimi-linear-48b-a3b.config.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let s = spec(v.clone()).unwrap();
    assert_eq!(s.family, Family::KimiLinear);
    assert_eq!((s.num_experts, s.top_k, s.n_shared_experts), (256, 8, 1));
    assert_eq!(s.max_position_embeddings, 1 << 20);
    assert_eq!(s.rms_norm_eps, 1e-5);
    let g = s.gated_delta.as_ref().unwrap();
    assert_eq!(g.rule, DeltaRule::Kda);
    let full: Vec<usize> = (0..27).filter(|&i| !g.linear_layers[i]).collect();
    assert_eq!(full, [3, 7, 11, 15, 19, 23, 26]);
    assert_eq!(
        (g.key_heads, g.value_heads, g.key_head_dim, g.conv_kernel),
        (32, 32, 128, 4)
    );
    assert_eq!(g.conv_channels(), 3 * 32 * 128);
    let m = s.mla.as_ref().unwrap();
    assert!(m.nope && m.q_lora_rank.is_none() && m.dsa.is_none());
    assert_eq!(m.softmax_scale, (192f64).powf(-0.5) as f32);
    assert_eq!(
        s.routing,
        Routing::GroupedSigmoid {
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            scaling: 2.446
        }
    );
    assert_eq!(s.moe_layers, [vec![false], vec![true; 26]].concat());
    assert_eq!(s.num_mtp_layers, 0);
    let n = names(&s);
    for t in [
        "model.layers.0.self_attn.q_conv1d.weight",
        "model.layers.0.self_attn.A_log",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.3.self_attn.kv_b_proj.weight",
        "model.layers.1.block_sparse_moe.gate.e_score_correction_bias",
        "model.layers.1.block_sparse_moe.shared_experts.down_proj.weight",
    ] {
        assert!(n.iter().any(|x| x == t), "{t}");
    }
    let a_log = s
        .tensors
        .dense()
        .into_iter()
        .find(|t| t.name == "model.layers.0.self_attn.A_log")
        .unwrap();
    assert_eq!(a_log.shape, [1, 1, 32, 1]);
    let e = s.tensors.expert_sets()[0];
    assert_eq!(
        e.tensor_names(5)[1],
        "model.layers.1.block_sparse_moe.experts.5.w3.weight"
    );
    // Dense tensors plus 26 x 256 x 3 experts: the release's 20,493 names.
    let experts: usize = s
        .tensors
        .expert_sets()
        .iter()
        .map(|e| 3 * e.count as usize)
        .sum();
    assert_eq!(s.tensors.dense().len() + experts, 20_493);

    // Per-layer lists, the attribute_map aliases and the top-level linear keys.
    let mut t = v.clone();
    let o = t.as_object_mut().unwrap();
    o.remove("linear_attn_config");
    o.insert(
        "layer_types".into(),
        json!((0..27)
            .map(|i| if full.contains(&i) {
                "full_attention"
            } else {
                "linear_attention"
            })
            .collect::<Vec<_>>()),
    );
    o.insert(
        "mlp_layer_types".into(),
        json!((0..27)
            .map(|i| if i < 2 { "dense" } else { "sparse" })
            .collect::<Vec<_>>()),
    );
    o.insert("linear_num_heads".into(), json!(32));
    o.insert("linear_head_dim".into(), json!(128));
    let per_tok = o.remove("num_experts_per_token").unwrap();
    o.insert("num_experts_per_tok".into(), per_tok);
    let t = spec(t).unwrap();
    assert_eq!(
        t.gated_delta.as_ref().unwrap().linear_layers,
        g.linear_layers
    );
    assert_eq!(t.moe_layers, [vec![false; 2], vec![true; 25]].concat());
    assert_eq!(t.top_k, 8);

    // Without any layer list: full attention at 0-based multiples of 4 from 4 on.
    let mut d = v.clone();
    let lin = d["linear_attn_config"].as_object_mut().unwrap();
    lin.remove("kda_layers");
    lin.remove("full_attn_layers");
    let d = spec(d).unwrap();
    let lin = &d.gated_delta.as_ref().unwrap().linear_layers;
    assert!(lin[0] && !lin[4] && lin[5] && !lin[8]);

    // Refused, naming the field.
    for (key, val, what) in [
        ("mla_use_nope", json!(false), "mla_use_nope"),
        (
            "moe_router_activation_func",
            json!("softmax"),
            "moe_router_activation_func",
        ),
        ("moe_layer_freq", json!(2), "moe_layer_freq"),
        (
            "num_nextn_predict_layers",
            json!(1),
            "num_nextn_predict_layers",
        ),
        ("mlp_layer_types", json!(["dense"]), "mlp_layer_types"),
    ] {
        let mut b = v.clone();
        b[key] = val;
        let e = spec(b).unwrap_err().to_string();
        assert!(e.contains(what), "{key}: {e}");
    }
    for (edit, what) in [
        (
            json!({"full_attn_layers": [4, 8, 12, 16, 20, 24, 28]}),
            "1..=27",
        ),
        (
            json!({"full_attn_layers": [4, 8, 12, 16, 20, 24, 26]}),
            "both list layer 26",
        ),
        (
            json!({"full_attn_layers": [4, 8, 12, 16, 20, 24, 27, 27]}),
            "lists layer 27 twice",
        ),
        (
            json!({"full_attn_layers": [4, 8, 12, 16, 20, 24]}),
            "layer 27",
        ),
        (json!({"num_heads": 0}), "num_heads is 0"),
        (
            json!({"kda_layers": null}),
            "full_attn_layers is given without",
        ),
        (json!({"full_attn_layers": ["4"]}), "whole numbers"),
        (
            json!({"gate_lower_bound": 1.0}),
            "must be a negative number",
        ),
    ] {
        let mut b = v.clone();
        for (k, x) in edit.as_object().unwrap() {
            b["linear_attn_config"][k] = x.clone();
        }
        let e = spec(b).unwrap_err().to_string();
        assert!(e.contains(what), "{edit}: {e}");
    }
}

#[test]
fn glm5_next_reads_the_published_config_and_refuses_what_transformers_would() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/configs/glm-5.3-flash.config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let s = spec(cfg.clone()).unwrap();
    assert_eq!(s.family, Family::Glm5Next);
    assert_eq!(s.wrapper.as_deref(), Some("glm5_next"));
    assert_eq!(
        (s.num_layers, s.hidden_size, s.num_experts, s.top_k),
        (45, 4096, 288, 8)
    );
    let g = s.gated_delta.as_ref().unwrap();
    assert_eq!(g.linear_layer_count(), 34);
    assert_eq!(g.gate_lower_bound, Some(-5.0));
    assert_eq!((g.value_heads, g.key_head_dim), (64, 128));
    let h = s.hyper.unwrap();
    assert_eq!((h.mult, h.sinkhorn_iters), (4, 20));
    let m = s.mla.as_ref().unwrap();
    assert_eq!(
        (m.qk_rope_head_dim, m.kv_lora_rank, m.q_lora_rank),
        (0, 512, Some(1536))
    );
    assert_eq!(m.latent_norm_eps, 1e-5);
    assert_eq!(m.dsa.as_ref().unwrap().kpool.unwrap().size, 16);
    assert_eq!(s.moe_layers.iter().filter(|&&m| m).count(), 42);
    assert_eq!(s.unconverted_mtp_layers, 1);
    assert_eq!(s.swiglu_limit, Some(10.0));
    // Every layer has its two hyper-connections; the DSA layers their k-pool indexer.
    let l3 = &s.tensors.layers[3];
    let names: Vec<&str> = l3.dense().iter().map(|t| t.name.as_str()).collect();
    for n in [
        "model.layers.3.hc_attn_fn",
        "model.layers.3.hc_ffn_scale",
        "model.layers.3.self_attn.indexer.index_kpool_compress_ape",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    // Refusals, each naming the key.
    let with = |k: &str, v: Value| {
        let mut c = cfg.clone();
        c["text_config"][k] = v;
        spec(c).unwrap_err().to_string()
    };
    assert!(with("qk_rope_head_dim", json!(64)).contains("qk_rope_head_dim"));
    assert!(with("index_kpool", json!(3)).contains("index_kpool"));
    assert!(with("num_key_value_heads", json!(8)).contains("num_key_value_heads"));
    assert!(with("index_kpool_always_select_tail", json!(false)).contains("select_tail"));
    assert!(with("hc_mult", json!(0)).contains("hc_mult"));
    assert!(with("layer_types", json!(vec!["sliding_attention"; 45])).contains("layer_types"));
    // A shared DSA layer must follow a full one (transformers hands the selection on only to
    // the next layer); layer 3 follows KDA layer 2.
    let mut types = vec![json!("full"); 45];
    types[3] = json!("shared");
    assert!(with("indexer_types", json!(types)).contains("layer 3"));
    assert!(with("swiglu_limit", Value::Null).contains("swiglu_limit is null"));
    // A text_config without its model_type is read as glm5_next_text (transformers'
    // sub-config default), not refused as the wrapper's type.
    let mut c = cfg.clone();
    c["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("model_type");
    assert_eq!(spec(c).unwrap().family, Family::Glm5Next);
    // linear_lower_bound null with safe_gate false: Kimi-Linear's softplus gate.
    let mut c = cfg.clone();
    c["text_config"]["linear_attn_config"]["gate_lower_bound"] = Value::Null;
    c["text_config"]["linear_attn_config"]["safe_gate"] = json!(false);
    assert_eq!(spec(c).unwrap().gated_delta.unwrap().gate_lower_bound, None);
}

/// Kimi K3's released config.json: a `kimi_k3` wrapper whose `text_config` is the K3 version of
/// `kimi_linear` (SiTU, attention residuals, latent MoE, gated MLA, full-rank KDA gate with the
/// bounded decay, compressed-tensors MXFP4 experts).
#[test]
fn kimi_k3_reads_the_published_config_and_refuses_what_it_cannot_run() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/configs/kimi-k3.config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let s = spec(cfg.clone()).unwrap();
    assert_eq!(s.family, Family::KimiLinear);
    assert_eq!(s.wrapper.as_deref(), Some("kimi_k3"));
    assert_eq!(
        (s.num_layers, s.hidden_size, s.num_experts, s.top_k),
        (93, 7168, 896, 16)
    );
    assert_eq!(
        s.kimi_k3,
        Some(KimiK3Spec {
            attn_res_block: Some(12),
            latent: Some(3584),
            latent_norm: true,
            mla_output_gate: true,
        })
    );
    let situ = ExpertActivation::SoftcappedSwiglu {
        gate_cap: 4.0,
        up_cap: 25.0,
    };
    assert_eq!((s.expert_activation, s.mlp_activation), (situ, Some(situ)));
    assert_eq!(s.expert_hidden(), 3584);
    assert_eq!(s.residual_values(), 9 * 7168);
    let g = s.gated_delta.as_ref().unwrap();
    assert_eq!(
        (g.linear_layer_count(), g.gate_lower_bound, g.full_rank_gate),
        (69, Some(-5.0), true)
    );
    assert_eq!(declared_expert_encoding(&cfg), Some(crate::Encoding::Mxfp4));
    let t = &s.tensors;
    let l0 = &t.layers[0];
    assert!(l0.attn_res.as_ref().unwrap().attn.norm.optional);
    let AttentionSpec::GatedDeltaNet(a) = &l0.attention else {
        panic!("layer 0 is KDA")
    };
    assert_eq!(a.a_log.shape, vec![96]);
    let GatedDeltaInput::Kda { g_a: None, g_b, .. } = &a.input else {
        panic!("full-rank gate")
    };
    assert_eq!(g_b.weight.name, "model.layers.0.self_attn.g_proj.weight");
    let AttentionSpec::Mla { gate: Some(g), .. } = &t.layers[3].attention else {
        panic!("layer 3 is gated MLA")
    };
    assert_eq!(g.weight.shape, vec![96 * 128, 7168]);
    let FfnSpec::Moe(m) = &t.layers[1].ffn else {
        panic!("layer 1 is MoE")
    };
    assert_eq!((m.experts.hidden, m.experts.intermediate), (3584, 3072));
    let lat = m.latent.as_ref().unwrap();
    assert_eq!(lat.down.weight.shape, vec![3584, 7168]);
    assert!(lat.norm.is_some());
    assert_eq!(
        t.final_res.as_ref().unwrap().proj.name,
        "model.output_attn_res_proj.weight"
    );
    // Keys left out take Kimi K3's config class defaults, not transformers' Kimi-Linear ones.
    let mut c = cfg.clone();
    for key in [
        "rms_norm_eps",
        "routed_scaling_factor",
        "first_k_dense_replace",
        "num_shared_experts",
        "activation_situ_linear_beta",
    ] {
        c["text_config"].as_object_mut().unwrap().remove(key);
    }
    let d = spec(c).unwrap();
    assert_eq!((d.rms_norm_eps, d.n_shared_experts), (1e-6, 0));
    assert_eq!(d.moe_layers.iter().filter(|&&m| m).count(), 93);
    assert!(matches!(d.routing, Routing::GroupedSigmoid { scaling, .. } if scaling == 1.0));
    assert_eq!(
        d.expert_activation,
        ExpertActivation::SoftcappedSwiglu {
            gate_cap: 4.0,
            up_cap: f32::INFINITY
        }
    );
    // Top-1 is not renormalized by K3's gate (transformers' Kimi-Linear always renormalizes).
    let mut c = cfg.clone();
    c["text_config"]["num_experts_per_token"] = json!(1);
    assert!(!spec(c).unwrap().norm_topk_prob);
    // What it cannot run, refused naming the key.
    for (key, value, what) in [
        (
            "activation_situ_linear_beta",
            json!(0.0),
            "activation_situ_linear_beta 0",
        ),
        (
            "kv_lora_rank",
            Value::Null,
            "kv_lora_rank (Kimi K3's config class has no default)",
        ),
        (
            "mla_use_nope",
            Value::Null,
            "mla_use_nope false (Kimi K3's config class default",
        ),
        (
            "activation_situ_beta",
            json!(-1.0),
            "activation_situ_beta -1 must be a positive",
        ),
        ("attn_res_block_size", json!(0), "attn_res_block_size is 0"),
        (
            "routed_expert_hidden_size",
            json!(0),
            "routed_expert_hidden_size is 0",
        ),
        ("hidden_act", json!("gelu"), "hidden_act"),
        (
            "routed_expert_hidden_size",
            json!(1u64 << 40),
            "routed_expert_hidden_size 1099511627776 is beyond any model's",
        ),
        (
            "moe_intermediate_size",
            json!(1u64 << 33),
            "is beyond any model's",
        ),
    ] {
        let mut c = cfg.clone();
        c["text_config"][key] = value;
        let e = spec(c).unwrap_err().to_string();
        assert!(e.contains(what), "{key}: {e}");
    }
}

/// DeepSeek-V4-Flash's released config.json: 43 layers (sliding 0-1, then CSA and HCA
/// alternating, layer 42 CSA; the 44th ratio is the MTP layer's), three hash layers, 64 of 512
/// dimensions rotated, the compressed layers' YaRN with attention factor 1, FP4 experts declared.
#[test]
fn deepseek_v4_flash_config_reads_as_released() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/configs/deepseek-v4-flash.config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let s = spec(cfg.clone()).unwrap();
    let v = s.deepseek_v4.as_ref().unwrap();
    assert_eq!(v.attention.len(), 43);
    assert_eq!(
        &v.attention[..4],
        &[
            V4Attention::Sliding,
            V4Attention::Sliding,
            V4Attention::Csa,
            V4Attention::Hca
        ]
    );
    assert_eq!(v.attention[42], V4Attention::Csa);
    assert_eq!(v.hash_layers.iter().filter(|&&h| h).count(), 3);
    assert_eq!(
        (v.rope_dim, v.csa_rate, v.hca_rate, v.window),
        (64, 4, 128, 128)
    );
    assert_eq!((v.main_theta, v.compress_theta), (10_000.0, 160_000.0));
    let y = v.compress_yarn.as_ref().unwrap();
    assert_eq!(
        (y.factor, y.original_max_position_embeddings),
        (16.0, 65536.0)
    );
    assert_eq!(v.compress_attention_factor, 1.0);
    assert_eq!(
        (s.num_kv_heads, s.head_dim, s.top_k, s.num_experts),
        (1, 512, 6, 256)
    );
    assert_eq!(declared_expert_encoding(&cfg), Some(crate::Encoding::Mxfp4));
    // Per token of context: (512 + 128) / 4 f32 on each of 21 CSA layers, 512 / 128 on 20 HCA.
    assert_eq!(v.values_per_token(s.head_dim), 21 * 160 + 20 * 4);
}

/// DeepSeek-V4's config as transformers 5.25's `DeepseekV4Config.__post_init__` resolves it
/// (each expectation printed by that class): the default layer schedule, `rope_scaling` over
/// `rope_parameters`, a nested compress RoPE without its theta taking `rope_theta`, one key-value
/// head by default; lists shorter than the layers and unknown kinds refused, naming the key.
#[test]
fn deepseek_v4_config_resolves_as_transformers() {
    let base = || {
        json!({"model_type": "deepseek_v4", "hidden_size": 64, "num_attention_heads": 4,
               "head_dim": 32, "num_hidden_layers": 4, "vocab_size": 256, "num_experts_per_tok": 2,
               "n_routed_experts": 8, "moe_intermediate_size": 32, "q_lora_rank": 32,
               "o_groups": 2, "o_lora_rank": 16, "index_head_dim": 16, "index_n_heads": 2,
               "qk_rope_head_dim": 8})
    };
    let s = spec(base()).unwrap();
    let v = s.deepseek_v4.as_ref().unwrap();
    use V4Attention::{Csa, Hca};
    assert_eq!(v.attention, vec![Hca, Hca, Hca, Csa]);
    assert_eq!(v.hash_layers, vec![true, true, true, false]);
    assert_eq!(s.num_kv_heads, 1);
    assert!(v.compress_yarn.is_none());
    let mut c = base();
    c["rope_scaling"] =
        json!({"type": "yarn", "factor": 4, "original_max_position_embeddings": 64});
    c["rope_parameters"] =
        json!({"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 64});
    let s = spec(c).unwrap();
    assert_eq!(
        s.deepseek_v4
            .as_ref()
            .unwrap()
            .compress_yarn
            .as_ref()
            .unwrap()
            .factor,
        4.0
    );
    let mut c = base();
    c["rope_parameters"] = json!({
        "main": {"rope_type": "default", "partial_rotary_factor": 0.25},
        "compress": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                     "partial_rotary_factor": 0.25}});
    let s = spec(c.clone()).unwrap();
    let v = s.deepseek_v4.as_ref().unwrap();
    assert_eq!(
        v.compress_theta, 10_000.0,
        "the nested compress theta defaults to rope_theta"
    );
    // Without its own partial_rotary_factor a nested dict rotates whole heads: refused.
    c["rope_parameters"]["compress"]
        .as_object_mut()
        .unwrap()
        .remove("partial_rotary_factor");
    let e = spec(c).unwrap_err().to_string();
    assert!(
        e.contains("rope_parameters.compress.partial_rotary_factor"),
        "{e}"
    );
    for (key, value, says) in [
        ("compress_ratios", json!([0, 4, 128]), "compress_ratios"),
        (
            "compress_ratios",
            json!([0, 4, 128, 5]),
            "compress_ratios[3] (layer 3) is 5",
        ),
        (
            "layer_types",
            json!([
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "sliding_attention"
            ]),
            "layer_types entry",
        ),
        (
            "mlp_layer_types",
            json!(["moe", "dense", "moe", "moe"]),
            "mlp_layer_types entry",
        ),
        ("num_key_value_heads", json!(2), "num_key_value_heads"),
        ("scoring_func", json!("softmax"), "scoring_func"),
    ] {
        let mut c = base();
        c[key] = value;
        let e = spec(c).unwrap_err().to_string();
        assert!(e.contains(says), "{key}: {e}");
    }
    // A longer list (the release's, with the MTP layer's entry) is cut to the layers.
    let mut c = base();
    c["compress_ratios"] = json!([0, 4, 128, 4, 0]);
    let s = spec(c).unwrap();
    assert_eq!(s.deepseek_v4.unwrap().attention.len(), 4);
}
