//! MiniMax-M2 / M2.1 (`model_type: minimax_m2`), as transformers 5.23 `MiniMaxM2Config` /
//! `modeling_minimax_m2.py`.
//!
//! - Layers: every decoder layer is a MoE layer (no dense layers, no shared expert).
//! - Attention: GQA without biases; ONE RMSNorm over the whole projected q vector (`q_norm`,
//!   `heads * head_dim` values) and one over the whole k vector (`k_norm`,
//!   `kv_heads * head_dim`), OLMoE's form, before RoPE; RoPE `rotate_half` over the first
//!   `rotary_dim` dimensions of each head (published: `rotary_dim` 64 of `head_dim` 128;
//!   transformers turns it into `partial_rotary_factor`; default factor 1); theta default 5e6.
//! - Routing (`MiniMaxM2TopKRouter`): sigmoid of the f32 router logits, the block's
//!   `e_score_correction_bias` added for selection only, top-k with no expert groups, the
//!   chosen unbiased scores divided by their sum (always), no scaling factor.
//! - Tensors (published, Mixtral's names): router `block_sparse_moe.gate.weight`, selection bias
//!   `block_sparse_moe.e_score_correction_bias` (on the block, not the gate: transformers renames
//!   it to `mlp.e_score_correction_bias`), experts `block_sparse_moe.experts.E.{w1,w3,w2}.weight`
//!   of `intermediate_size`; FP8 releases write `fmt: "float8_e4m3fn"` with 128x128 blocks.

use super::build;
use super::json::Fields;
use super::{
    num_experts, partial_rotary_dim, ExpertStorage, ExpertsSpec, Family, FfnSpec, ModelSpec,
    ModelTensors, MoeSpec, QkNormSpec, Routing, TensorClass, TensorKind, TensorSpec,
};
use crate::FormatError;
use serde_json::Value;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = num_experts(f, "num_local_experts", "num_experts")?;
    s.moe_intermediate_size = f.req_usize("intermediate_size")?;
    s.norm_topk_prob = true;
    if f.usize("head_dim")?.is_none() {
        s.head_dim = 128; // MiniMaxM2Config's class default, not hidden / heads
    }
    s.rope_theta = super::gqa_rope_theta(f, Family::MinimaxM2)?;
    s.rotary_dim = partial_rotary_dim(f, s.head_dim, 1.0)?;
    if let Some(m) = f.get("scoring_func").and_then(Value::as_str) {
        if m != "sigmoid" {
            return Err(FormatError::Unsupported(format!(
                "scoring_func {m:?} (minimax_m2 routes with sigmoid)"
            )));
        }
    }
    s.routing = Routing::GroupedSigmoid {
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        scaling: 1.0,
    };
    s.moe_layers = vec![s.num_experts > 0; s.num_layers];
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let c = TensorClass::Dense;
    let (h, e) = (s.hidden_size, s.num_experts);
    let layers = (0..s.num_layers)
        .map(|i| {
            let a = format!("model.layers.{i}.self_attn");
            let qk = QkNormSpec::Full {
                q: build::norm(format!("{a}.q_norm.weight"), s.num_heads * s.head_dim, c),
                k: build::norm(format!("{a}.k_norm.weight"), s.num_kv_heads * s.head_dim, c),
            };
            let p = format!("model.layers.{i}.block_sparse_moe");
            let moe = FfnSpec::Moe(MoeSpec {
                latent: None,
                hash_table: None,
                router: TensorSpec::new(format!("{p}.gate.weight"), &[e, h], c, TensorKind::Router),
                router_bias: Some(TensorSpec::new(
                    format!("{p}.e_score_correction_bias"),
                    &[e],
                    c,
                    TensorKind::Bias,
                )),
                router_logit_bias: None,
                shared: None,
                shared_gate: None,
                experts: ExpertsSpec {
                    layer: i as u32,
                    count: e as u32,
                    hidden: h,
                    intermediate: s.moe_intermediate_size,
                    class: TensorClass::RoutedExpert,
                    prefix: format!("{p}.experts"),
                    storage: ExpertStorage::PerExpert(["w1", "w3", "w2"]),
                    biases: false,
                },
            });
            build::layer(s, i, build::gqa(s, i, qk), moe, c)
        })
        .collect();
    build::model(s, layers, vec![])
}
