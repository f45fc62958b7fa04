//! The model config: `files/config.json` of the store (and `generation_config.json` for EOS ids),
//! read the way transformers 5.23 reads it for the supported families.

use crate::error::{EngineError, Result};
use serde_json::Value;

/// The supported model families (`model_type` of config.json).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `mixtral`: softmax router, top-k always renormalized.
    Mixtral,
    /// `qwen3_moe`: per-head q/k RMSNorm, `norm_topk_prob`, optional dense MLP layers.
    Qwen3Moe,
    /// `olmoe`: q/k RMSNorm over the whole projected vectors, optional `clip_qkv`.
    Olmoe,
    /// `deepseek_v3` (and `kimi_k2`, same architecture): MLA attention, YaRN RoPE, grouped
    /// sigmoid routing with shared experts, dense MLP in the first layers.
    DeepseekV3,
    /// `glm_moe_dsa` (GLM-5): DeepSeek-V3's architecture with always-interleaved RoPE, the DSA
    /// lightning indexer restricting each query to `index_topk` keys, `mlp_layer_types`.
    GlmMoeDsa,
}

impl Family {
    /// Parses a `model_type`.
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] for any other model type.
    pub fn from_model_type(s: &str) -> Result<Family> {
        match s {
            "mixtral" => Ok(Family::Mixtral),
            "qwen3_moe" => Ok(Family::Qwen3Moe),
            "olmoe" => Ok(Family::Olmoe),
            "deepseek_v3" | "kimi_k2" => Ok(Family::DeepseekV3),
            "glm_moe_dsa" => Ok(Family::GlmMoeDsa),
            other => Err(EngineError::Unsupported(format!(
                "model_type {other:?}; this engine runs mixtral, qwen3_moe, olmoe, deepseek_v3, kimi_k2 and glm_moe_dsa"
            ))),
        }
    }

    /// The `model_type` string.
    pub fn name(self) -> &'static str {
        match self {
            Family::Mixtral => "mixtral",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Olmoe => "olmoe",
            Family::DeepseekV3 => "deepseek_v3",
            Family::GlmMoeDsa => "glm_moe_dsa",
        }
    }

    /// `default_theta` of the transformers config class (used when config.json names no theta).
    fn default_theta(self) -> f64 {
        match self {
            Family::Mixtral => 1_000_000.0,
            Family::Qwen3Moe | Family::Olmoe | Family::DeepseekV3 | Family::GlmMoeDsa => 10_000.0,
        }
    }

    /// Default `rms_norm_eps` of the transformers config class.
    fn default_eps(self) -> f64 {
        match self {
            Family::Qwen3Moe | Family::DeepseekV3 => 1e-6,
            Family::Mixtral | Family::Olmoe | Family::GlmMoeDsa => 1e-5,
        }
    }
}

/// Everything the forward pass needs from config.json, with transformers' defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub family: Family,
    /// Vocabulary size (rows of the embedding and of lm_head).
    pub vocab_size: usize,
    /// Hidden size H.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA: `num_heads` is a multiple of it).
    pub num_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon (added to the f32 mean square).
    pub rms_norm_eps: f32,
    /// RoPE base (`rope_theta`).
    pub rope_theta: f64,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Sliding attention window in tokens (a query at position i sees keys j with i - window < j <= i).
    pub sliding_window: Option<usize>,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts selected per token (top-k).
    pub top_k: usize,
    /// Renormalize the top-k routing weights to sum to 1 (always true for Mixtral).
    pub norm_topk_prob: bool,
    /// Intermediate size I of one routed expert.
    pub moe_intermediate_size: usize,
    /// Intermediate size of the dense MLP of non-MoE layers (Qwen3-MoE `mlp_only_layers`).
    pub intermediate_size: usize,
    /// q/k/v/o projections have biases.
    pub attention_bias: bool,
    /// OLMoE: clamp q, k, v to [-clip, clip] after the q/k norms.
    pub clip_qkv: Option<f32>,
    /// Qwen3-MoE: layers with a dense MLP instead of experts.
    pub mlp_only_layers: Vec<usize>,
    /// Qwen3-MoE: layer i is sparse when (i + 1) % step == 0.
    pub decoder_sparse_step: usize,
    /// `bos_token_id`, when set.
    pub bos_token_id: Option<u32>,
    /// Every EOS id of config.json and generation_config.json (sorted, unique).
    pub eos_token_ids: Vec<u32>,
    /// MLA families (DeepSeek-V3 / Kimi-K2): attention, RoPE and routing parameters.
    pub mla: Option<crate::layers::mla::MlaConfig>,
}

pub(crate) fn cfg_err(what: impl Into<String>) -> EngineError {
    EngineError::Config {
        file: "config.json".into(),
        what: what.into(),
    }
}

pub(crate) fn get_usize(v: &Value, key: &str) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| cfg_err(format!("{key} must be a non-negative integer, found {x}"))),
    }
}

pub(crate) fn req_usize(v: &Value, key: &str) -> Result<usize> {
    get_usize(v, key)?.ok_or_else(|| cfg_err(format!("missing field {key}")))
}

pub(crate) fn get_f64(v: &Value, key: &str) -> Result<Option<f64>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| cfg_err(format!("{key} must be a number, found {x}"))),
    }
}

pub(crate) fn get_bool(v: &Value, key: &str) -> Result<Option<bool>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_bool()
            .map(Some)
            .ok_or_else(|| cfg_err(format!("{key} must be true or false, found {x}"))),
    }
}

/// The expert count under its primary key or its `attribute_map` alias (transformers 5 writes
/// `num_local_experts` for Qwen3-MoE).
fn num_experts(v: &Value, key: &str, alias: &str) -> Result<usize> {
    match get_usize(v, key)? {
        Some(n) => Ok(n),
        None => {
            get_usize(v, alias)?.ok_or_else(|| cfg_err(format!("missing field {key} (or {alias})")))
        }
    }
}

/// Reads `eos_token_id` (an int, a list of ints, or null) from a config object.
///
/// # Errors
/// [`EngineError::Config`] naming `file` when the field has another type.
pub fn eos_ids(v: &Value, file: &str) -> Result<Vec<u32>> {
    let bad = |x: &Value| EngineError::Config {
        file: file.into(),
        what: format!("eos_token_id must be an integer or a list of integers, found {x}"),
    };
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().map(|n| n as u32).ok_or_else(|| bad(x)))
            .collect(),
        Some(x) => Ok(vec![x.as_u64().ok_or_else(|| bad(x))? as u32]),
    }
}

/// RoPE theta from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older
/// configs), as `convert_rope_params_to_dict` resolves them; only the default rope type runs.
fn rope_theta(v: &Value, family: Family) -> Result<f64> {
    let params = match (v.get("rope_parameters"), v.get("rope_scaling")) {
        (Some(p), _) if !p.is_null() => Some(p),
        (_, Some(s)) if !s.is_null() => Some(s),
        _ => None,
    };
    let mut theta = get_f64(v, "rope_theta")?;
    if let Some(p) = params {
        if !p.is_object() {
            return Err(cfg_err(format!(
                "rope parameters must be an object, found {p}"
            )));
        }
        let ty = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if ty != "default" {
            return Err(EngineError::Unsupported(format!(
                "unsupported rope scaling {ty:?} (only the default RoPE is implemented)"
            )));
        }
        if let Some(t) = get_f64(p, "rope_theta")? {
            theta = Some(t);
        }
        if p.get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .is_some_and(|f| f != 1.0)
        {
            return Err(EngineError::Unsupported(
                "unsupported rope scaling: partial_rotary_factor != 1".into(),
            ));
        }
    }
    let theta = theta.unwrap_or(family.default_theta());
    if !(theta.is_finite() && theta > 0.0) {
        return Err(cfg_err(format!(
            "rope_theta must be positive, found {theta}"
        )));
    }
    Ok(theta)
}

impl ModelConfig {
    /// Parses config.json (and the EOS ids of generation_config.json when given).
    ///
    /// Defaults are those of the transformers 5.23 config classes (`MixtralConfig`,
    /// `Qwen3MoeConfig`, `OlmoeConfig`); `head_dim` is `config.head_dim` or `hidden / heads`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for a missing or mistyped field or inconsistent sizes;
    /// [`EngineError::Unsupported`] for another model type, activation or RoPE scaling.
    pub fn from_json(config: &Value, generation_config: Option<&Value>) -> Result<ModelConfig> {
        let v = config;
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| cfg_err("missing field model_type"))?;
        let family = Family::from_model_type(model_type)?;
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(EngineError::Unsupported(format!(
                    "hidden_act {act:?} (only silu)"
                )));
            }
        }
        let hidden_size = req_usize(v, "hidden_size")?;
        let num_heads = req_usize(v, "num_attention_heads")?;
        let num_kv_heads = get_usize(v, "num_key_value_heads")?.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(cfg_err(format!(
                "num_attention_heads {num_heads} must be a positive multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        let head_dim = match get_usize(v, "head_dim")? {
            Some(d) if d > 0 => d,
            _ => hidden_size / num_heads,
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(cfg_err(format!(
                "head_dim {head_dim} must be even and positive"
            )));
        }
        let intermediate_size = get_usize(v, "intermediate_size")?.unwrap_or(0);
        let (num_experts, moe_intermediate_size, norm_topk_prob) = match family {
            Family::Mixtral => (
                num_experts(v, "num_local_experts", "num_experts")?,
                intermediate_size,
                true,
            ),
            Family::Qwen3Moe => (
                num_experts(v, "num_experts", "num_local_experts")?,
                req_usize(v, "moe_intermediate_size")?,
                get_bool(v, "norm_topk_prob")?.unwrap_or(false),
            ),
            Family::Olmoe => (
                num_experts(v, "num_experts", "num_local_experts")?,
                intermediate_size,
                get_bool(v, "norm_topk_prob")?.unwrap_or(false),
            ),
            Family::DeepseekV3 | Family::GlmMoeDsa => (
                req_usize(v, "n_routed_experts")?,
                req_usize(v, "moe_intermediate_size")?,
                get_bool(v, "norm_topk_prob")?.unwrap_or(true),
            ),
        };
        let mla = match family {
            Family::DeepseekV3 | Family::GlmMoeDsa => {
                Some(crate::layers::mla::MlaConfig::from_json(
                    v,
                    num_experts,
                    family.default_theta(),
                    family == Family::GlmMoeDsa,
                )?)
            }
            _ => None,
        };
        let top_k = req_usize(v, "num_experts_per_tok")?;
        if top_k == 0 || top_k > num_experts {
            return Err(cfg_err(format!(
                "num_experts_per_tok {top_k} must be in 1..={num_experts}"
            )));
        }
        let sliding_window = match family {
            Family::Mixtral => get_usize(v, "sliding_window")?,
            Family::Qwen3Moe if get_bool(v, "use_sliding_window")?.unwrap_or(false) => {
                Some(get_usize(v, "sliding_window")?.unwrap_or(4096))
            }
            _ => None,
        };
        let clip_qkv = match family {
            Family::Olmoe => get_f64(v, "clip_qkv")?.map(|c| c as f32),
            _ => None,
        };
        let mlp_only_layers = match v.get("mlp_only_layers") {
            Some(Value::Array(a)) if family == Family::Qwen3Moe => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| cfg_err("mlp_only_layers must list integers"))
                })
                .collect::<Result<Vec<_>>>()?,
            _ => vec![],
        };
        let decoder_sparse_step = match family {
            Family::Qwen3Moe => get_usize(v, "decoder_sparse_step")?.unwrap_or(1).max(1),
            _ => 1,
        };
        let mut eos_token_ids = eos_ids(v, "config.json")?;
        if let Some(g) = generation_config {
            eos_token_ids.extend(eos_ids(g, "generation_config.json")?);
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        Ok(ModelConfig {
            family,
            vocab_size: req_usize(v, "vocab_size")?,
            hidden_size,
            num_layers: req_usize(v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: get_f64(v, "rms_norm_eps")?.unwrap_or(family.default_eps()) as f32,
            rope_theta: match &mla {
                Some(m) => m.rope_theta,
                None => rope_theta(v, family)?,
            },
            max_position_embeddings: get_usize(v, "max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings: get_bool(v, "tie_word_embeddings")?.unwrap_or(false),
            sliding_window,
            num_experts,
            top_k,
            norm_topk_prob,
            moe_intermediate_size,
            intermediate_size,
            attention_bias: family != Family::Mixtral
                && get_bool(v, "attention_bias")?.unwrap_or(false),
            clip_qkv,
            mlp_only_layers,
            decoder_sparse_step,
            bos_token_id: get_usize(v, "bos_token_id")?.map(|n| n as u32),
            eos_token_ids,
            mla,
        })
    }

    /// Whether decoder layer `layer` has routed experts by the config's rule (Qwen3-MoE:
    /// not in `mlp_only_layers` and `(layer + 1) % decoder_sparse_step == 0`; DeepSeek-V3 /
    /// GLM-5: `mlp_layer_types[layer] == "sparse"` when given, else `layer >=
    /// first_k_dense_replace` and `layer % moe_layer_freq == 0`; others: always).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match self.family {
            Family::Qwen3Moe => {
                !self.mlp_only_layers.contains(&layer)
                    && self.num_experts > 0
                    && (layer + 1).is_multiple_of(self.decoder_sparse_step)
            }
            Family::DeepseekV3 | Family::GlmMoeDsa => {
                self.mla.as_ref().is_some_and(|m| match &m.mlp_sparse {
                    Some(s) => s.get(layer).copied().unwrap_or(true),
                    None => {
                        layer >= m.first_k_dense_replace && layer.is_multiple_of(m.moe_layer_freq)
                    }
                })
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "mixtral", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32,
               "num_local_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 2})
    }

    #[test]
    fn mixtral_defaults_and_eos_union() {
        let c = ModelConfig::from_json(&base(), Some(&json!({"eos_token_id": [2, 7]}))).unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.eos_token_ids, vec![2, 7]);
        assert!(c.norm_topk_prob);
        assert_eq!(c.rms_norm_eps, 1e-5);
    }

    #[test]
    fn rope_styles() {
        let mut v = base();
        v["rope_theta"] = json!(5000.0);
        v["rope_scaling"] = Value::Null;
        assert_eq!(ModelConfig::from_json(&v, None).unwrap().rope_theta, 5000.0);
        v["rope_scaling"] = json!({"rope_type": "default"});
        assert_eq!(ModelConfig::from_json(&v, None).unwrap().rope_theta, 5000.0);
        let mut w = base();
        w["rope_parameters"] = json!({"rope_theta": 123.0, "rope_type": "default"});
        assert_eq!(ModelConfig::from_json(&w, None).unwrap().rope_theta, 123.0);
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = ModelConfig::from_json(&v, None).unwrap_err().to_string();
        assert!(e.contains("unsupported rope scaling"), "{e}");
    }

    #[test]
    fn bad_fields_are_named() {
        let mut v = base();
        v["model_type"] = json!("llama");
        assert!(ModelConfig::from_json(&v, None)
            .unwrap_err()
            .to_string()
            .contains("llama"));
        let mut v = base();
        v["eos_token_id"] = json!("x");
        assert!(ModelConfig::from_json(&v, None)
            .unwrap_err()
            .to_string()
            .contains("eos_token_id"));
        let mut v = base();
        v.as_object_mut().unwrap().remove("hidden_size");
        assert!(ModelConfig::from_json(&v, None)
            .unwrap_err()
            .to_string()
            .contains("hidden_size"));
    }

    #[test]
    fn qwen3_sparse_layers() {
        let v = json!({"model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, "head_dim": 32,
               "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
               "mlp_only_layers": [0], "decoder_sparse_step": 2, "norm_topk_prob": true});
        let c = ModelConfig::from_json(&v, None).unwrap();
        assert_eq!(c.head_dim, 32);
        assert_eq!(c.rope_theta, 10_000.0);
        assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && !c.is_moe_layer(2) && c.is_moe_layer(3));
    }

    #[test]
    fn glm_moe_dsa_reads_indexer_and_layer_types() {
        let mut v = json!({"model_type": "glm_moe_dsa", "vocab_size": 100, "hidden_size": 64,
               "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 96,
               "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
               "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
               "qk_rope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1,
               "rope_interleave": false, "index_n_heads": 4, "index_head_dim": 16,
               "index_topk": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}});
        let c = ModelConfig::from_json(&v, None).unwrap();
        assert_eq!(c.family, Family::GlmMoeDsa);
        assert_eq!(c.rms_norm_eps, 1e-5);
        assert_eq!(c.rope_theta, 1e6);
        let m = c.mla.as_ref().unwrap();
        assert!(m.rope_interleave, "GLM-5 RoPE is always interleaved");
        let d = m.dsa.as_ref().unwrap();
        assert_eq!((d.n_heads, d.head_dim, d.topk), (4, 16, 8));
        assert_eq!(d.full, vec![true; 3]);
        assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && c.is_moe_layer(2) && c.is_moe_layer(3));
        v["mlp_layer_types"] = json!(["dense", "sparse", "dense"]);
        let c = ModelConfig::from_json(&v, None).unwrap();
        assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && !c.is_moe_layer(2));
        v["mlp_layer_types"] = json!(["dense", "moe", "dense"]);
        let e = ModelConfig::from_json(&v, None).unwrap_err().to_string();
        assert!(e.contains("moe"), "{e}");
        v["mlp_layer_types"] = Value::Null;
        v.as_object_mut().unwrap().remove("index_topk");
        let e = ModelConfig::from_json(&v, None).unwrap_err().to_string();
        assert!(e.contains("index_topk"), "{e}");
    }
}
