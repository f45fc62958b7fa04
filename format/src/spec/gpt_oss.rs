//! gpt-oss (`model_type: gpt_oss`; gpt-oss-20b, gpt-oss-120b), as transformers 5.23
//! `GptOssConfig` / `modeling_gpt_oss.py` (written up in docs/ARCHITECTURES.md, "gpt_oss"):
//!
//! - Layers: every layer is MoE; `layer_types` alternates `sliding_attention` (window
//!   `sliding_window`, default 128) and `full_attention` (default when absent: layer i slides
//!   when `(i + 1) % 2 == 1`).
//! - Attention: GQA with q/k/v/o biases (`attention_bias`, default true), no q/k norm, learned
//!   per-head sinks `self_attn.sinks` `[heads]`, YaRN RoPE (`rope_scaling` type yarn, base
//!   `rope_theta` 150000, `truncate` false in the published configs).
//! - Router `mlp.router.{weight,bias}`: linear with bias, top-k of the logits, softmax over the
//!   k selected ([`Routing::TopKSoftmax`]).
//! - Experts (`num_local_experts`, top-k `num_experts_per_tok`, intermediate
//!   `intermediate_size`): fused tensors with biases (MXFP4 blocks as published, or BF16 after
//!   dequantization; [`ExpertStorage`]), clamped SwiGLU with alpha 1.702 and
//!   `swiglu_limit` (default 7.0) ([`ExpertActivation::ClampedSwiglu`]).

use super::build;
use super::json::Fields;
use super::mla::rope_params;
use super::{
    AttentionSpec, ExpertActivation, ExpertStorage, ExpertsSpec, FfnSpec, ModelSpec, ModelTensors,
    MoeSpec, QkNormSpec, Routing, TensorClass, TensorKind, TensorSpec,
};
use crate::FormatError;
use serde_json::Value;

/// `swiglu_alpha`'s default in `GptOssConfig` (published configs do not set it).
pub const SWIGLU_ALPHA: f32 = 1.702;

/// Whether config.json declares MXFP4 experts (`quantization_config.quant_method: "mxfp4"`).
pub fn declares_mxfp4(config: &Value) -> bool {
    config
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str)
        == Some("mxfp4")
}

pub(crate) fn configure(
    config: &Value,
    f: &Fields<'_>,
    s: &mut ModelSpec,
) -> Result<(), FormatError> {
    s.num_experts = super::num_experts(f, "num_local_experts", "num_experts")?;
    s.moe_intermediate_size = f.req_usize("intermediate_size")?;
    s.intermediate_size = s.moe_intermediate_size;
    s.norm_topk_prob = true;
    s.routing = Routing::TopKSoftmax;
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(true);
    let (theta, yarn) = rope_params(f, "gpt_oss")?;
    s.rope_theta = theta.unwrap_or(150_000.0);
    if !(s.rope_theta.is_finite() && s.rope_theta > 0.0) {
        return Err(f.err(format!(
            "rope_theta must be positive, found {}",
            s.rope_theta
        )));
    }
    let has_rope_block = f.get("rope_parameters").is_some() || f.get("rope_scaling").is_some();
    s.rope_yarn = match yarn {
        Some(y) => Some(y),
        // GptOssConfig's default rope_parameters.
        None if !has_rope_block => Some(super::Yarn {
            factor: 32.0,
            original_max_position_embeddings: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: None,
            mscale_all_dim: None,
            truncate: false,
        }),
        None => None,
    };
    s.sliding_window = Some(f.usize("sliding_window")?.unwrap_or(128));
    if s.sliding_window == Some(0) {
        return Err(f.err("sliding_window must be positive"));
    }
    s.sliding_layers = match f.get("layer_types") {
        None | Some(Value::Null) => (0..s.num_layers).map(|i| (i + 1) % 2 == 1).collect(),
        Some(Value::Array(a)) if a.len() == s.num_layers => a
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(f.err(format!(
                    "layer_types entries must be \"sliding_attention\" or \"full_attention\", found {t}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(x) => {
            return Err(f.err(format!(
                "layer_types must list {} layer types, found {x}",
                s.num_layers
            )))
        }
    };
    let limit = f.f64("swiglu_limit")?.unwrap_or(7.0) as f32;
    if !(limit.is_finite() && limit > 0.0) {
        return Err(f.err(format!("swiglu_limit must be positive, found {limit}")));
    }
    let alpha = f.f64("swiglu_alpha")?.unwrap_or(SWIGLU_ALPHA as f64) as f32;
    if !alpha.is_finite() {
        return Err(f.err(format!("swiglu_alpha must be finite, found {alpha}")));
    }
    s.expert_activation = ExpertActivation::ClampedSwiglu { alpha, limit };
    s.moe_layers = vec![s.num_experts > 0; s.num_layers];
    // Each expert matrix's input dimension is cut into MXFP4 blocks of 32.
    if declares_mxfp4(config)
        && (!s.hidden_size.is_multiple_of(32) || !s.moe_intermediate_size.is_multiple_of(32))
    {
        return Err(f.err(format!(
            "hidden_size {} and intermediate_size {} must be multiples of 32 for MXFP4 experts",
            s.hidden_size, s.moe_intermediate_size
        )));
    }
    s.mxfp4_experts = declares_mxfp4(config);
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let c = TensorClass::Dense;
    let storage = if s.mxfp4_experts {
        ExpertStorage::FusedMxfp4
    } else {
        ExpertStorage::FusedInterleaved
    };
    let layers = (0..s.num_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let attention = match build::gqa(s, i, QkNormSpec::None) {
                AttentionSpec::Gqa {
                    q,
                    k,
                    v,
                    o,
                    qk_norm,
                    ..
                } => AttentionSpec::Gqa {
                    q,
                    k,
                    v,
                    o,
                    qk_norm,
                    sinks: Some(TensorSpec::new(
                        format!("{p}.self_attn.sinks"),
                        &[s.num_heads],
                        c,
                        TensorKind::Bias,
                    )),
                    gated: false,
                },
                mla => mla,
            };
            let (e, h) = (s.num_experts, s.hidden_size);
            let ffn = FfnSpec::Moe(MoeSpec {
                latent: None,
                hash_table: None,
                router: TensorSpec::new(
                    format!("{p}.mlp.router.weight"),
                    &[e, h],
                    c,
                    TensorKind::Router,
                ),
                router_bias: None,
                router_logit_bias: Some(TensorSpec::new(
                    format!("{p}.mlp.router.bias"),
                    &[e],
                    c,
                    TensorKind::Bias,
                )),
                shared: None,
                shared_gate: None,
                experts: ExpertsSpec {
                    layer: i as u32,
                    count: e as u32,
                    hidden: h,
                    intermediate: s.moe_intermediate_size,
                    class: TensorClass::RoutedExpert,
                    prefix: format!("{p}.mlp.experts"),
                    storage,
                    biases: true,
                },
            });
            build::layer(s, i, attention, ffn, c)
        })
        .collect();
    build::model(s, layers, vec![])
}
