//! GLM-4.5 / 4.6 / 4.7 (`model_type: glm4_moe`), as transformers 5.23 `Glm4MoeConfig` /
//! `modeling_glm4_moe.py`; the MTP layer, which transformers skips on load, as vLLM's
//! `glm4_moe_mtp.py` runs it (the DeepSeek-V3 MTP of [`super::deepseek_v3`] with a GQA decoder
//! layer).
//!
//! - Layers: layer i has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size` when
//!   `i < first_k_dense_replace` (default 1), else a MoE block (no `moe_layer_freq`).
//! - Attention: GQA; `q_proj`, `k_proj`, `v_proj` carry a bias when `attention_bias`, `o_proj`
//!   never does; with `use_qk_norm` an RMSNorm of EACH HEAD of q and k (`q_norm`/`k_norm` of
//!   `head_dim`, Qwen3-MoE's form) before RoPE; RoPE `rotate_half` over the first
//!   `int(head_dim * partial_rotary_factor)` dimensions of each head (default factor 0.5, read
//!   from `rope_parameters` or the top level), the rest passed through; `head_dim` defaults to
//!   `hidden / heads`.
//! - Routing: DeepSeek-V3's grouped sigmoid (`Glm4MoeTopkRouter`): sigmoid of the f32 router
//!   logits, `mlp.gate.e_score_correction_bias` added for selection, `n_group` / `topk_group`,
//!   weights renormalized when `norm_topk_prob` (default true) and times
//!   `routed_scaling_factor`; `n_shared_experts` (default 1) shared experts
//!   `mlp.shared_experts.*` of `moe_intermediate_size * n_shared_experts`.
//! - Tensors: published per expert, `mlp.experts.E.{gate,up,down}_proj.weight` (transformers 5
//!   fuses them on load); the expert count is `n_routed_experts` (alias `num_local_experts`).
//! - MTP: `num_nextn_predict_layers` (default 1, alias `num_mtp_layers`) layers after the
//!   decoder layers: `model.layers.{N}.{enorm, hnorm, eh_proj, shared_head.norm}` and a full
//!   decoder layer (always MoE). GLM-4.5 also stores `embed_tokens` and `shared_head.head` in
//!   it; GLM-4.6/4.7 do not, and the main model's embedding and lm_head stand in (both are
//!   optional here).

use super::build;
use super::deepseek_v3::{mtp_spec, sigmoid_moe_or_dense};
use super::json::Fields;
use super::{
    gqa_rope_theta, num_experts, partial_rotary_dim, AttentionSpec, Family, LayerSpec, ModelSpec,
    ModelTensors, QkNormSpec, Routing, TensorClass,
};
use crate::FormatError;
use serde_json::Value;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = num_experts(f, "n_routed_experts", "num_local_experts")?;
    s.moe_intermediate_size = f.req_usize("moe_intermediate_size")?;
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(true);
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    s.qk_norm = f.bool("use_qk_norm")?.unwrap_or(false);
    s.rope_theta = gqa_rope_theta(f, Family::Glm4Moe)?;
    s.rotary_dim = partial_rotary_dim(f, s.head_dim, 0.5)?;
    if let Some(m) = f.get("scoring_func").and_then(Value::as_str) {
        if m != "sigmoid" {
            return Err(FormatError::Unsupported(format!(
                "scoring_func {m:?} (glm4_moe routes with sigmoid)"
            )));
        }
    }
    let n_group = f.usize("n_group")?.unwrap_or(1).max(1);
    let topk_group = f.usize("topk_group")?.unwrap_or(1).max(1);
    if !s.num_experts.is_multiple_of(n_group) || topk_group > n_group {
        return Err(f.err(format!(
            "n_group {n_group} must divide n_routed_experts {} and be >= topk_group {topk_group}",
            s.num_experts
        )));
    }
    let scaling = f.f64("routed_scaling_factor")?.unwrap_or(1.0) as f32;
    if !(scaling.is_finite() && scaling > 0.0) {
        return Err(f.err(format!(
            "routed_scaling_factor must be positive, found {scaling}"
        )));
    }
    s.routing = Routing::GroupedSigmoid {
        n_group,
        topk_group,
        renormalize: s.norm_topk_prob,
        scaling,
    };
    s.n_shared_experts = f.usize("n_shared_experts")?.unwrap_or(1);
    let first_dense = f.usize("first_k_dense_replace")?.unwrap_or(1);
    s.moe_layers = (0..s.num_layers)
        .map(|l| s.num_experts > 0 && l >= first_dense)
        .collect();
    let mtp = match f.usize("num_nextn_predict_layers")? {
        Some(n) => n,
        None => f.usize("num_mtp_layers")?.unwrap_or(1),
    };
    if mtp > 1 {
        return Err(FormatError::Unsupported(format!(
            "num_nextn_predict_layers (num_mtp_layers) {mtp}: coli runs at most one MTP layer"
        )));
    }
    s.num_mtp_layers = mtp;
    Ok(())
}

/// The GQA block of layer `i` (`class`: Dense, or Mtp for the MTP layer): q/k/v bias when
/// `attention_bias`, no o bias, per-head q/k norms when `use_qk_norm`.
fn attention(s: &ModelSpec, i: usize, class: TensorClass) -> AttentionSpec {
    let p = format!("model.layers.{i}.self_attn");
    let (h, b) = (s.hidden_size, s.attention_bias);
    let (qd, kvd) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
    AttentionSpec::Gqa {
        q: build::linear(&format!("{p}.q_proj"), qd, h, b, class),
        k: build::linear(&format!("{p}.k_proj"), kvd, h, b, class),
        v: build::linear(&format!("{p}.v_proj"), kvd, h, b, class),
        o: build::linear(&format!("{p}.o_proj"), h, qd, false, class),
        qk_norm: if s.qk_norm {
            QkNormSpec::PerHead {
                q: build::norm(format!("{p}.q_norm.weight"), s.head_dim, class),
                k: build::norm(format!("{p}.k_norm.weight"), s.head_dim, class),
            }
        } else {
            QkNormSpec::None
        },
        sinks: None,
        gated: false,
    }
}

fn layer(s: &ModelSpec, i: usize, class: TensorClass) -> LayerSpec {
    let ffn = sigmoid_moe_or_dense(s, i, class);
    build::layer(s, i, attention(s, i, class), ffn, class)
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let layers = (0..s.num_layers)
        .map(|i| layer(s, i, TensorClass::Dense))
        .collect();
    let mtp = s
        .mtp_layer()
        .map(|n| mtp_spec(s, layer(s, n, TensorClass::Mtp), true))
        .into_iter()
        .collect();
    build::model(s, layers, mtp)
}
