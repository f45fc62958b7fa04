//! Qwen3-MoE (`model_type: qwen3_moe`), as transformers 5.23 `Qwen3MoeConfig` /
//! `modeling_qwen3_moe.py`.
//!
//! - Layers: layer i is a MoE layer when it is not in `mlp_only_layers` and
//!   `(i + 1) % decoder_sparse_step == 0`; else a dense SwiGLU `mlp.{gate,up,down}_proj` of
//!   `intermediate_size`.
//! - Attention: GQA with q/k/v/o bias when `attention_bias`, RMSNorm of EACH HEAD of q and k
//!   (`q_norm`/`k_norm` of `head_dim`) before RoPE (default theta 1e4); sliding window only
//!   when `use_sliding_window` (default window 4096).
//! - Routing: softmax (f32) over all experts, top-k, renormalized only when `norm_topk_prob`.
//! - Tensors: router `mlp.gate.weight`, experts `mlp.experts.E.{gate,up,down}_proj.weight` of
//!   `moe_intermediate_size`. The expert count is `num_experts` (transformers 5 writes its
//!   alias `num_local_experts`).

use super::build;
use super::json::Fields;
use super::{
    gqa_rope_theta, num_experts, Family, FfnSpec, ModelSpec, ModelTensors, QkNormSpec, Routing,
    TensorClass,
};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = num_experts(f, "num_experts", "num_local_experts")?;
    s.moe_intermediate_size = f.req_usize("moe_intermediate_size")?;
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(false);
    s.routing = Routing::SoftmaxTopK {
        renormalize: s.norm_topk_prob,
    };
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    if f.bool("use_sliding_window")?.unwrap_or(false) {
        s.sliding_window = Some(f.usize("sliding_window")?.unwrap_or(4096));
    }
    s.rope_theta = gqa_rope_theta(f, Family::Qwen3Moe)?;
    s.moe_layers = moe_layers(f, s.num_layers, s.num_experts)?;
    Ok(())
}

/// Which of `num_layers` layers are MoE layers, as Qwen3-MoE and Qwen3-Next decide it: layer
/// i when it is not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0` (and the
/// model has experts).
pub(crate) fn moe_layers(
    f: &Fields<'_>,
    num_layers: usize,
    num_experts: usize,
) -> Result<Vec<bool>, FormatError> {
    let mlp_only: Vec<usize> = match f.get("mlp_only_layers") {
        None | Some(serde_json::Value::Null) => vec![],
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| f.err("mlp_only_layers must list integers"))
            })
            .collect::<Result<_, _>>()?,
        Some(x) => return Err(f.err(format!("mlp_only_layers must be a list, found {x}"))),
    };
    // transformers divides by it (`(i + 1) % decoder_sparse_step`): 0 is refused, not taken as 1.
    let step = f.usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(f.err("decoder_sparse_step is 0 (every layer index is taken modulo it)"));
    }
    Ok((0..num_layers)
        .map(|l| !mlp_only.contains(&l) && num_experts > 0 && (l + 1).is_multiple_of(step))
        .collect())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let c = TensorClass::Dense;
    let layers = (0..s.num_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let qk = QkNormSpec::PerHead {
                q: build::norm(format!("{p}.self_attn.q_norm.weight"), s.head_dim, c),
                k: build::norm(format!("{p}.self_attn.k_norm.weight"), s.head_dim, c),
            };
            let ffn = if s.is_moe_layer(i) {
                build::softmax_moe(s, i, "mlp", ["gate_proj", "up_proj", "down_proj"])
            } else {
                FfnSpec::Dense(build::mlp(
                    &format!("{p}.mlp"),
                    s.hidden_size,
                    s.intermediate_size,
                    c,
                ))
            };
            build::layer(s, i, build::gqa(s, i, qk), ffn, c)
        })
        .collect();
    build::model(s, layers, vec![])
}
