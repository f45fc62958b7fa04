//! OLMoE (`model_type: olmoe`), as transformers 5.23 `OlmoeConfig` / `modeling_olmoe.py`.
//!
//! - Layers: every decoder layer is a MoE layer.
//! - Attention: GQA with q/k/v/o bias when `attention_bias`, then ONE RMSNorm over the whole
//!   projected q vector (`q_norm`, `heads * head_dim` values) and one over the whole k vector
//!   (`k_norm`, `kv_heads * head_dim`), then q, k, v clamped to `[-clip_qkv, clip_qkv]` when
//!   set, then RoPE (default theta 1e4); no sliding window.
//! - Routing: softmax (f32), top-k, renormalized only when `norm_topk_prob` (default false).
//! - Tensors: router `mlp.gate.weight`, experts `mlp.experts.E.{gate,up,down}_proj.weight` of
//!   `intermediate_size`.

use super::build;
use super::json::Fields;
use super::{
    gqa_rope_theta, num_experts, Family, ModelSpec, ModelTensors, QkNormSpec, Routing, TensorClass,
};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = num_experts(f, "num_experts", "num_local_experts")?;
    s.moe_intermediate_size = f.req_usize("intermediate_size")?;
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(false);
    s.routing = Routing::SoftmaxTopK {
        renormalize: s.norm_topk_prob,
    };
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    s.clip_qkv = f.f64("clip_qkv")?.map(|c| c as f32);
    s.rope_theta = gqa_rope_theta(f, Family::Olmoe)?;
    s.moe_layers = vec![s.num_experts > 0; s.num_layers];
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let c = TensorClass::Dense;
    let layers = (0..s.num_layers)
        .map(|i| {
            let p = format!("model.layers.{i}.self_attn");
            let qk = QkNormSpec::Full {
                q: build::norm(format!("{p}.q_norm.weight"), s.num_heads * s.head_dim, c),
                k: build::norm(format!("{p}.k_norm.weight"), s.num_kv_heads * s.head_dim, c),
            };
            build::layer(
                s,
                i,
                build::gqa(s, i, qk),
                build::softmax_moe(s, i, "mlp", ["gate_proj", "up_proj", "down_proj"]),
                c,
            )
        })
        .collect();
    build::model(s, layers, vec![])
}
