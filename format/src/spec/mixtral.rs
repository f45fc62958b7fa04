//! Mixtral (`model_type: mixtral`), as transformers 5.23 `MixtralConfig` / `modeling_mixtral.py`.
//!
//! - Layers: every decoder layer is a MoE layer.
//! - Attention: GQA, q/k/v/o without bias, no q/k norm, RoPE (default theta 1e6), optional
//!   `sliding_window`.
//! - Routing: softmax over the f32 router logits, top-k, the top-k weights ALWAYS renormalized
//!   ([`Routing::SoftmaxTopK`] with `renormalize`).
//! - Tensors (published layout): `model.layers.L.block_sparse_moe.gate.weight` (router),
//!   experts `model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight` (gate, up, down) of
//!   `intermediate_size`.

use super::build;
use super::json::Fields;
use super::TensorClass;
use super::{gqa_rope_theta, num_experts, Family, ModelSpec, ModelTensors, QkNormSpec, Routing};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = num_experts(f, "num_local_experts", "num_experts")?;
    s.moe_intermediate_size = f.req_usize("intermediate_size")?;
    s.norm_topk_prob = true;
    s.routing = Routing::SoftmaxTopK { renormalize: true };
    s.sliding_window = f.usize("sliding_window")?;
    s.rope_theta = gqa_rope_theta(f, Family::Mixtral)?;
    s.moe_layers = vec![s.num_experts > 0; s.num_layers];
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let layers = (0..s.num_layers)
        .map(|i| {
            build::layer(
                s,
                i,
                build::gqa(s, i, QkNormSpec::None),
                build::softmax_moe(s, i, "block_sparse_moe", ["w1", "w3", "w2"]),
                TensorClass::Dense,
            )
        })
        .collect();
    build::model(s, layers, vec![])
}
