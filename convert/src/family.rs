//! Model families: which layers hold routed experts, how expert tensors are named, and which
//! tensors every layer needs, from `config.json`.

use crate::error::{ConvertError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The `model_type` values coli-convert knows.
pub const SUPPORTED: &[&str] = &[
    "mixtral",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
    "kimi_k2",
    "glm_moe_dsa",
];

/// A supported model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `mixtral`: `block_sparse_moe.experts.E.{w1,w3,w2}` (gate, up, down).
    Mixtral,
    /// `qwen3_moe`.
    Qwen3Moe,
    /// `olmoe`.
    Olmoe,
    /// `deepseek_v3` (with an MTP layer at index `num_hidden_layers` when present).
    DeepseekV3,
    /// `kimi_k2` (DeepSeek-V3 architecture).
    KimiK2,
    /// `glm_moe_dsa` (GLM-5).
    GlmMoeDsa,
}

impl Family {
    /// Parses `model_type`.
    pub fn parse(s: &str) -> Option<Family> {
        Some(match s {
            "mixtral" => Family::Mixtral,
            "qwen3_moe" => Family::Qwen3Moe,
            "olmoe" => Family::Olmoe,
            "deepseek_v3" => Family::DeepseekV3,
            "kimi_k2" => Family::KimiK2,
            "glm_moe_dsa" => Family::GlmMoeDsa,
            _ => return None,
        })
    }

    /// DeepSeek-V3-style families (MLA, `first_k_dense_replace`, MTP layer).
    pub fn is_deepseek_like(self) -> bool {
        matches!(
            self,
            Family::DeepseekV3 | Family::KimiK2 | Family::GlmMoeDsa
        )
    }

    /// The three checkpoint names of expert `e` of layer `l`, in the order gate, up, down.
    pub fn expert_names(self, l: u32, e: u32) -> [String; 3] {
        match self {
            Family::Mixtral => {
                let p = format!("model.layers.{l}.block_sparse_moe.experts.{e}");
                [
                    format!("{p}.w1.weight"),
                    format!("{p}.w3.weight"),
                    format!("{p}.w2.weight"),
                ]
            }
            _ => {
                let p = format!("model.layers.{l}.mlp.experts.{e}");
                [
                    format!("{p}.gate_proj.weight"),
                    format!("{p}.up_proj.weight"),
                    format!("{p}.down_proj.weight"),
                ]
            }
        }
    }

    /// The router weight of a MoE layer.
    pub fn router_name(self, l: u32) -> String {
        match self {
            Family::Mixtral => format!("model.layers.{l}.block_sparse_moe.gate.weight"),
            _ => format!("model.layers.{l}.mlp.gate.weight"),
        }
    }
}

/// What the converter needs to know about the model, from config.json.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// The family.
    pub family: Family,
    /// `model_type` as written.
    pub model_type: String,
    /// `hidden_size` (H).
    pub hidden: usize,
    /// Routed experts' intermediate size (I).
    pub intermediate: usize,
    /// `num_hidden_layers` (MTP layers not included).
    pub num_hidden_layers: u32,
    /// Routed experts per MoE layer.
    pub num_experts: u32,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
    /// Which main layers (0..num_hidden_layers) hold routed experts.
    pub moe_layer: Vec<bool>,
    /// DeepSeek-like: `q_lora_rank` is set (q_a_proj/q_b_proj instead of q_proj).
    pub q_lora: bool,
    /// DeepSeek-like: shared experts per MoE layer.
    pub n_shared_experts: u32,
    /// DeepSeek-like: router has `e_score_correction_bias` (`topk_method == "noaux_tc"`).
    pub router_bias: bool,
    /// The config.json path (for messages).
    pub path: PathBuf,
}

fn cfg_err(path: &Path, what: impl Into<String>) -> ConvertError {
    ConvertError::Config {
        file: path.to_path_buf(),
        what: what.into(),
    }
}

fn req_u64(cfg: &Value, path: &Path, field: &str, why: &str) -> Result<u64> {
    match cfg.get(field) {
        Some(v) => v.as_u64().ok_or_else(|| {
            cfg_err(
                path,
                format!("field \"{field}\" is {v}, expected a non-negative integer"),
            )
        }),
        None => Err(cfg_err(
            path,
            format!("required field \"{field}\" ({why}) is missing"),
        )),
    }
}

impl ModelConfig {
    /// Interprets a parsed config.json.
    ///
    /// # Errors
    /// [`ConvertError::Config`] naming config.json and the field: unknown `model_type` (listing
    /// the supported ones), a missing or mistyped required field (hidden_size,
    /// num_hidden_layers, expert count, intermediate size, vocab_size), an unknown
    /// `mlp_layer_types` entry, or a `quantization_config.weight_block_size` other than
    /// [128, 128].
    pub fn from_json(cfg: &Value, path: &Path) -> Result<ModelConfig> {
        let model_type = cfg
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| cfg_err(path, "required field \"model_type\" is missing"))?;
        let family = Family::parse(model_type).ok_or_else(|| {
            cfg_err(
                path,
                format!(
                    "unsupported model_type \"{model_type}\": coli-convert supports {}",
                    SUPPORTED.join(", ")
                ),
            )
        })?;
        let hidden = req_u64(cfg, path, "hidden_size", "model width")? as usize;
        let num_hidden_layers =
            req_u64(cfg, path, "num_hidden_layers", "decoder layer count")? as u32;
        let vocab_size = req_u64(cfg, path, "vocab_size", "vocabulary size")? as usize;
        let (experts_field, inter_field) = match family {
            Family::Mixtral => ("num_local_experts", "intermediate_size"),
            Family::Olmoe => ("num_experts", "intermediate_size"),
            Family::Qwen3Moe => ("num_experts", "moe_intermediate_size"),
            _ => ("n_routed_experts", "moe_intermediate_size"),
        };
        // transformers 5.x writes Qwen3-MoE's expert count as num_local_experts (its
        // attribute_map aliases the two); accept either.
        let experts_field = if family == Family::Qwen3Moe
            && cfg.get("num_experts").is_none()
            && cfg.get("num_local_experts").is_some()
        {
            "num_local_experts"
        } else {
            experts_field
        };
        let num_experts = req_u64(cfg, path, experts_field, "routed experts per layer")? as u32;
        let intermediate =
            req_u64(cfg, path, inter_field, "routed expert intermediate size")? as usize;
        let opt_u64 = |f: &str, d: u64| -> Result<u64> {
            match cfg.get(f) {
                None | Some(Value::Null) => Ok(d),
                Some(v) => v.as_u64().ok_or_else(|| {
                    cfg_err(
                        path,
                        format!("field \"{f}\" is {v}, expected a non-negative integer"),
                    )
                }),
            }
        };
        let tie_word_embeddings = cfg
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let Some(bs) = cfg
            .get("quantization_config")
            .and_then(|q| q.get("weight_block_size"))
        {
            if bs != &serde_json::json!([128, 128]) {
                return Err(cfg_err(
                    path,
                    format!("quantization_config.weight_block_size is {bs}; only [128, 128] FP8 blocks are supported"),
                ));
            }
        }
        let n = num_hidden_layers as usize;
        let mut moe_layer = vec![num_experts > 0; n];
        match family {
            Family::Mixtral | Family::Olmoe => {}
            Family::Qwen3Moe => {
                let step = opt_u64("decoder_sparse_step", 1)?.max(1) as usize;
                let only: Vec<u64> = cfg
                    .get("mlp_only_layers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                for (l, m) in moe_layer.iter_mut().enumerate() {
                    *m = *m && !only.contains(&(l as u64)) && (l + 1) % step == 0;
                }
            }
            _ => {
                let k = opt_u64("first_k_dense_replace", 0)? as usize;
                let freq = opt_u64("moe_layer_freq", 1)?.max(1) as usize;
                for (l, m) in moe_layer.iter_mut().enumerate() {
                    *m = *m && l >= k && l % freq == 0;
                }
            }
        }
        if let Some(types) = cfg.get("mlp_layer_types").and_then(Value::as_array) {
            for (l, t) in types.iter().enumerate().take(n) {
                moe_layer[l] = match t.as_str() {
                    Some("sparse") | Some("moe") => num_experts > 0,
                    Some("dense") => false,
                    _ => {
                        return Err(cfg_err(
                            path,
                            format!(
                                "mlp_layer_types[{l}] is {t}; expected \"sparse\" or \"dense\""
                            ),
                        ))
                    }
                };
            }
        }
        let q_lora = !matches!(cfg.get("q_lora_rank"), None | Some(Value::Null));
        let n_shared_experts = opt_u64("n_shared_experts", 0)? as u32;
        let router_bias = cfg.get("topk_method").and_then(Value::as_str) == Some("noaux_tc");
        Ok(ModelConfig {
            family,
            model_type: model_type.to_string(),
            hidden,
            intermediate,
            num_hidden_layers,
            num_experts,
            vocab_size,
            tie_word_embeddings,
            moe_layer,
            q_lora,
            n_shared_experts,
            router_bias,
            path: path.to_path_buf(),
        })
    }

    /// Tensors that must be present for the main decoder layer `l` (not experts, which are
    /// checked separately), and for a MoE layer its router.
    pub fn required_layer_tensors(&self, l: u32) -> Vec<String> {
        let p = format!("model.layers.{l}");
        let mut v = vec![
            format!("{p}.input_layernorm.weight"),
            format!("{p}.post_attention_layernorm.weight"),
            format!("{p}.self_attn.o_proj.weight"),
        ];
        match self.family {
            Family::Mixtral | Family::Qwen3Moe | Family::Olmoe => {
                for x in ["q_proj", "k_proj", "v_proj"] {
                    v.push(format!("{p}.self_attn.{x}.weight"));
                }
            }
            Family::DeepseekV3 | Family::KimiK2 => {
                v.push(format!("{p}.self_attn.kv_a_proj_with_mqa.weight"));
                v.push(format!("{p}.self_attn.kv_b_proj.weight"));
                if self.q_lora {
                    v.push(format!("{p}.self_attn.q_a_proj.weight"));
                    v.push(format!("{p}.self_attn.q_b_proj.weight"));
                } else {
                    v.push(format!("{p}.self_attn.q_proj.weight"));
                }
            }
            Family::GlmMoeDsa => {}
        }
        let moe = self.moe_layer.get(l as usize).copied().unwrap_or(false);
        if moe {
            v.push(self.family.router_name(l));
            if self.family.is_deepseek_like() {
                if self.router_bias {
                    v.push(format!("{p}.mlp.gate.e_score_correction_bias"));
                }
                if self.n_shared_experts > 0 {
                    for x in ["gate_proj", "up_proj", "down_proj"] {
                        v.push(format!("{p}.mlp.shared_experts.{x}.weight"));
                    }
                }
            }
        } else {
            for x in ["gate_proj", "up_proj", "down_proj"] {
                v.push(format!("{p}.mlp.{x}.weight"));
            }
        }
        v
    }

    /// Tensors outside the layers that must be present.
    pub fn required_global_tensors(&self) -> Vec<String> {
        let mut v = vec![
            "model.embed_tokens.weight".to_string(),
            "model.norm.weight".to_string(),
        ];
        if !self.tie_word_embeddings {
            v.push("lm_head.weight".to_string());
        }
        v
    }
}

/// The decoder layer index in a tensor name `model.layers.L.…`, if any.
pub fn layer_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("model.layers.")?;
    let (num, _) = rest.split_once('.')?;
    num.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(v: Value) -> Result<ModelConfig> {
        ModelConfig::from_json(&v, Path::new("config.json"))
    }

    #[test]
    fn qwen3_sparse_step_and_mlp_only_layers() {
        let c = cfg(
            json!({"model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 6,
            "vocab_size": 10, "num_experts": 4, "moe_intermediate_size": 4,
            "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
        )
        .unwrap();
        assert_eq!(c.moe_layer, [false, true, false, false, false, true]);
        // transformers 5.x spelling of the expert count
        let c = cfg(
            json!({"model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 1,
            "vocab_size": 10, "num_local_experts": 4, "moe_intermediate_size": 4}),
        )
        .unwrap();
        assert_eq!(c.num_experts, 4);
    }

    #[test]
    fn deepseek_first_k_dense_and_layer_types() {
        let base = json!({"model_type": "deepseek_v3", "hidden_size": 8, "num_hidden_layers": 4,
            "vocab_size": 10, "n_routed_experts": 4, "moe_intermediate_size": 4,
            "first_k_dense_replace": 1, "q_lora_rank": 8, "topk_method": "noaux_tc",
            "n_shared_experts": 1});
        let c = cfg(base.clone()).unwrap();
        assert_eq!(c.moe_layer, [false, true, true, true]);
        let req = c.required_layer_tensors(1);
        assert!(req.contains(&"model.layers.1.mlp.gate.e_score_correction_bias".to_string()));
        assert!(req.contains(&"model.layers.1.self_attn.q_a_proj.weight".to_string()));
        assert!(req.contains(&"model.layers.1.mlp.shared_experts.up_proj.weight".to_string()));
        assert!(c
            .required_layer_tensors(0)
            .contains(&"model.layers.0.mlp.up_proj.weight".to_string()));
        let mut v = base;
        v["mlp_layer_types"] = json!(["dense", "sparse", "dense", "sparse"]);
        assert_eq!(cfg(v).unwrap().moe_layer, [false, true, false, true]);
    }

    #[test]
    fn missing_fields_and_unknown_type_named() {
        let e = cfg(
            json!({"model_type": "mixtral", "hidden_size": 8, "num_hidden_layers": 1,
            "vocab_size": 10, "num_local_experts": 4}),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("config.json") && e.contains("intermediate_size"),
            "{e}"
        );
        let e = cfg(json!({"model_type": "gpt2"})).unwrap_err().to_string();
        assert!(e.contains("gpt2") && e.contains("olmoe"), "{e}");
        let e = cfg(json!({"model_type": "olmoe", "hidden_size": "8"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn layer_index_of_names() {
        assert_eq!(layer_of("model.layers.61.eh_proj.weight"), Some(61));
        assert_eq!(layer_of("model.norm.weight"), None);
        assert_eq!(layer_of("lm_head.weight"), None);
    }
}
