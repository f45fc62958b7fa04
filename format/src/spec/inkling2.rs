//! Inkling 2 (`model_type: inkling2`, its language model `text_config` of type
//! `inkling2_text`), as transformers 5.25 `Inkling2TextConfig` / `modeling_inkling2.py` compute
//! it (written up in docs/ARCHITECTURES.md, "inkling2"). coli runs the language model; the
//! vision tower (`model.visual.*`) is left out of the store and reported as unused by the
//! converter.
//!
//! What it keeps of Inkling ([`super::inkling`]): no RoPE, sliding (`"hybrid_sliding"`, their own
//! `swa_*` head shape, window `sliding_window_size`) and full (`"hybrid"`) layers, keys and
//! values through short convolutions, a relative position bias from per-token relative states
//! and a profile bank `rel_logits_proj.proj` `[d_rel, extent]`, log-scaled full layers, short
//! convolutions over each sublayer's output, a padded unembedding (`unpadded_vocab_size`). What
//! changes:
//!
//! - **Attention residuals** (`n_layers_per_attn_res_block`): every `block` layers the layer's
//!   input becomes a closed block; each sublayer's input is a softmax-weighted sum, over the
//!   closed blocks and the running partial sum, of their unweighted RMS-normalized states
//!   (weights from a learned query per sublayer: `attn_res.attn_queries.{i-1}` (`[3, H]` on
//!   full layers: the query, key and value inputs), `attn_res.mlp_queries.{i}`,
//!   `attn_res.output_query`). A boundary layer restarts the partial sum at its attention output.
//! - Queries and relative states scaled per channel (`q_l2_clip.scale`, `rel_l2_clip.scale`)
//!   and clipped to an L2 norm (`qk_l2_clip_threshold`, `rel_l2_clip_threshold`), keys clipped,
//!   values RMS-normalized without weight; full layers scale queries and relative states by
//!   `tau(i)`. Scores `q.k / sqrt(head_dim)`; a per-token sink logit `attn_sink_proj(x)`; the
//!   output gated by `sigmoid(gate_attn(x))` before `wo_ud`.
//! - Short convolutions end in `(x + conv(x)) / sqrt(K + 1)`; full layers' key and value
//!   convolutions add per-token taps `weight_proj(x)` (one set per kv head) to `static_w` and end
//!   in `/ sqrt(2K + 1)`.
//! - Every layer is MoE, no shared experts: sigmoid scores plus `mlp.gate.bias` choose the top-k,
//!   the chosen scores normalized (sum + 1e-20) times `route_scale`; experts fused
//!   (`w13_weight` gate/up rows interleaved) with the softcapped SwiGLU
//!   `softcap(g, gate_cap) * sigmoid(g) * softcap(u, up_cap)` (`softcap(x, c) = c tanh(x / c)`).
//! - No muP divisor; logits `final_logit_softcapping * tanh(l / final_logit_softcapping)`.
//! - The `-MXFP8` releases hold the routed experts in MXFP8 (`quantization_config` `fp8` with
//!   `weight_block_size` `[1, 32]`, accepted for this family only; `w13_weight_scale` /
//!   `w2_weight_scale` U8): the spec lists them as `ExpertStorage::FusedW13Mxfp8`, and the
//!   converter keeps them (encoding `mxfp8`) or decodes them.

use super::json::Fields;
use super::{
    inkling, AttentionSpec, ExpertActivation, ExpertStorage, ExpertsSpec, FfnSpec,
    Inkling2AttentionSpec, InklingSpec, KvConvSpec, LayerSpec, LogScaling, ModelSpec, ModelTensors,
    MoeSpec, Routing, TensorClass, TensorKind,
};
use crate::FormatError;
use inkling::{linear, t};

/// The multimodal wrapper's `model_type`.
pub const WRAPPER_MODEL_TYPE: &str = "inkling2";

/// Whether `config` (config.json) declares MXFP8 routed experts: `quantization_config` (at the
/// top level or in `text_config`) with `weight_block_size` `[1, 32]`, as Inkling 2's `-MXFP8`
/// releases have it (transformers' finegrained FP8, `scale_fmt` `ue8m0`).
pub fn declares_mxfp8(config: &serde_json::Value) -> bool {
    config
        .get("quantization_config")
        .or_else(|| config.get("text_config")?.get("quantization_config"))
        .and_then(|q| q.get("weight_block_size"))
        .is_some_and(|b| b == &serde_json::json!([1, 32]))
}

/// What Inkling 2 adds to [`InklingSpec`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inkling2Params {
    /// Layers per attention-residual block (`n_layers_per_attn_res_block`).
    pub block: usize,
    /// `qk_l2_clip_threshold`: the largest L2 norm of a query or key head.
    pub qk_clip: f32,
    /// `rel_l2_clip_threshold`: the largest L2 norm of a relative-state head.
    pub rel_clip: f32,
    /// `mlp_gate_softcap`.
    pub gate_softcap: f32,
    /// `mlp_up_softcap`.
    pub up_softcap: f32,
    /// `final_logit_softcapping`.
    pub logit_softcap: f32,
    /// config.json declares MXFP8 experts (`quantization_config.weight_block_size` `[1, 32]`,
    /// the `-MXFP8` releases): the spec lists their scales
    /// ([`super::ExpertStorage::FusedW13Mxfp8`]).
    pub mxfp8_experts: bool,
}

/// A positive finite float field with a default (an explicit null is refused: the modules
/// transformers builds need the number).
fn positive_f32(f: &Fields<'_>, key: &str, default: f64) -> Result<f32, FormatError> {
    if f.v.get(key).is_some_and(serde_json::Value::is_null) {
        return Err(f.err(format!(
            "{}{key} is null; Inkling 2 needs a positive number (default {default})",
            f.prefix
        )));
    }
    let v = f.f64(key)?.unwrap_or(default);
    if !(v.is_finite() && v > 0.0) {
        return Err(f.err(format!(
            "{}{key} must be a positive finite number, found {v}",
            f.prefix
        )));
    }
    Ok(v as f32)
}

pub(crate) fn configure(
    config: &serde_json::Value,
    f: &Fields<'_>,
    s: &mut ModelSpec,
) -> Result<(), FormatError> {
    let n = s.num_layers;
    // Inkling2TextConfig's defaults where the generic reader assumes others.
    inkling::head_defaults(f, s)?;
    s.num_experts = match f.usize("n_routed_experts")? {
        Some(e) => e,
        None => f.usize("num_local_experts")?.unwrap_or(384),
    };
    s.n_shared_experts = 0;
    s.moe_intermediate_size = match f.usize("moe_intermediate_size")? {
        Some(i) => i,
        None => f.usize("intermediate_size")?.unwrap_or(2304),
    };
    s.intermediate_size = 0;
    if let Some(sf) = f.str("scoring_func")? {
        if sf != "sigmoid" {
            return Err(FormatError::Unsupported(format!(
                "{}scoring_func {sf:?} (Inkling 2 routes by sigmoid scores)",
                f.prefix
            )));
        }
    }
    let route_scale = match f.f64("route_scale")? {
        Some(r) => r,
        None => f.f64("routed_scaling_factor")?.unwrap_or(8.0),
    } as f32;
    if !route_scale.is_finite() {
        return Err(f.err(format!("{}route_scale must be finite", f.prefix)));
    }
    s.norm_topk_prob = true;
    s.routing = Routing::GroupedSigmoid {
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        scaling: route_scale,
    };
    s.sliding_window = Some(inkling::sliding_window(f, 1024)?);
    s.sliding_layers = match inkling::per_layer(f, "layer_types", n, ["hybrid_sliding", "hybrid"])?
    {
        Some(l) => l,
        None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
    };
    s.moe_layers = vec![true; n];
    if let Some(m) = f.usize("model_max_length")? {
        s.max_position_embeddings = m;
    } else if f.get("max_position_embeddings").is_none() {
        s.max_position_embeddings = 1 << 20;
    }
    let positive = |key: &str, default: usize| inkling::positive(f, key, default);
    let (swa_num_heads, swa_num_kv_heads) = inkling::swa_heads(f, (48, 8))?;
    let n_floor = f.f64("log_scaling_n_floor")?.unwrap_or(128000.0);
    if !(n_floor.is_finite() && n_floor > 0.0) {
        return Err(f.err(format!(
            "{}log_scaling_n_floor must be positive, found {n_floor}",
            f.prefix
        )));
    }
    let conv_kernel = inkling::conv_kernel(f)?;
    let unpadded_vocab_size = inkling::unpadded_vocab(f, s, 200058)?;
    if s.eos_token_ids.is_empty() && 200006 < s.vocab_size {
        // Inkling2TextConfig's default `eos_token_id`.
        s.eos_token_ids.push(200006);
    }
    let v2 = Inkling2Params {
        block: positive("n_layers_per_attn_res_block", 6)?,
        qk_clip: positive_f32(f, "qk_l2_clip_threshold", 22.627416997969522)?,
        rel_clip: positive_f32(f, "rel_l2_clip_threshold", 8.0)?,
        gate_softcap: positive_f32(f, "mlp_gate_softcap", 4.0)?,
        up_softcap: positive_f32(f, "mlp_up_softcap", 25.0)?,
        logit_softcap: positive_f32(f, "final_logit_softcapping", 30.0)?,
        mxfp8_experts: declares_mxfp8(config),
    };
    s.expert_activation = ExpertActivation::SoftcappedSwiglu {
        gate_cap: v2.gate_softcap,
        up_cap: v2.up_softcap,
    };
    s.inkling = Some(InklingSpec {
        swa_num_heads,
        swa_num_kv_heads,
        swa_head_dim: positive("swa_head_dim", 128)?,
        d_rel: positive("d_rel", 16)?,
        rel_extent: positive("rel_extent", 1024)?,
        log_scaling: Some(LogScaling {
            n_floor,
            alpha: f.f64("log_scaling_alpha")?.unwrap_or(0.1),
        }),
        conv_kernel,
        logits_divisor: 1.0,
        unpadded_vocab_size,
        route_scale,
        mtp_sliding: Vec::new(),
        chain_hidden_post_norm: false,
        mtp_hidden_first: true,
        v2: Some(v2),
    });
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let ink = s.inkling.as_ref().expect("configured as Inkling 2");
    let (h, v) = (s.hidden_size, s.vocab_size);
    ModelTensors {
        final_res: None,
        embed: t(
            "model.llm.embed.weight".into(),
            &[v, h],
            TensorKind::Embedding,
        ),
        embed_norm: Some(t(
            "model.llm.embed_norm.weight".into(),
            &[h],
            TensorKind::Norm,
        )),
        layers: (0..s.num_layers).map(|i| layer_spec(s, ink, i)).collect(),
        final_norm: t("model.llm.norm.weight".into(), &[h], TensorKind::Norm),
        lm_head: t(
            "model.llm.unembed.weight".into(),
            &[v, h],
            TensorKind::OutputHead,
        ),
        mtp: Vec::new(),
        final_query: Some(t(
            "model.llm.attn_res.output_query".into(),
            &[h],
            TensorKind::Mixing,
        )),
        hyper_head: None,
    }
}

/// Decoder layer `i`, `model.llm.layers.{i}` and its `model.llm.attn_res.*` queries.
fn layer_spec(s: &ModelSpec, ink: &InklingSpec, i: usize) -> LayerSpec {
    let (h, k) = (s.hidden_size, ink.conv_kernel);
    let d = ink.layer_dims(s, i);
    let full = d.window.is_none();
    let (qd, kvd) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let p = format!("model.llm.layers.{i}");
    let kv_conv = |which: &str| {
        if full {
            KvConvSpec::Dynamic {
                static_w: t(
                    format!("{p}.attn.{which}_sconv.static_w"),
                    &[k, kvd],
                    TensorKind::Mixing,
                ),
                proj: linear(
                    format!("{p}.attn.{which}_sconv.weight_proj"),
                    d.kv_heads * k,
                    h,
                ),
            }
        } else {
            KvConvSpec::Static(t(
                format!("{p}.attn.{which}_sconv.weight"),
                &[kvd, 1, k],
                TensorKind::Conv,
            ))
        }
    };
    let norm = |name: &str| t(format!("{p}.{name}.weight"), &[h], TensorKind::Norm);
    let attention = AttentionSpec::Inkling2(Box::new(Inkling2AttentionSpec {
        q: linear(format!("{p}.attn.wq_du.weight"), qd, h),
        k: linear(format!("{p}.attn.wk_dv.weight"), kvd, h),
        v: linear(format!("{p}.attn.wv_dv.weight"), kvd, h),
        r: linear(format!("{p}.attn.wr_du.weight"), d.heads * ink.d_rel, h),
        o: linear(format!("{p}.attn.wo_ud.weight"), h, qd),
        gate: linear(format!("{p}.attn.gate_attn.weight"), qd, h),
        sink: linear(format!("{p}.attn.attn_sink_proj.weight"), d.heads, h),
        q_scale: t(
            format!("{p}.attn.q_l2_clip.scale"),
            &[d.heads, d.head_dim],
            TensorKind::Mixing,
        ),
        rel_scale: t(
            format!("{p}.attn.rel_l2_clip.scale"),
            &[d.heads, ink.d_rel],
            TensorKind::Mixing,
        ),
        k_conv: kv_conv("k"),
        v_conv: kv_conv("v"),
        rel_proj: t(
            format!("{p}.attn.rel_logits_proj.proj"),
            &[ink.d_rel, d.extent],
            TensorKind::Mixing,
        ),
        out_conv: t(
            format!("{p}.attn_sconv.weight"),
            &[h, 1, k],
            TensorKind::Conv,
        ),
        mlp_out_conv: t(
            format!("{p}.mlp_sconv.weight"),
            &[h, 1, k],
            TensorKind::Conv,
        ),
        kv_input_norms: full.then(|| (norm("k_input_norm"), norm("v_input_norm"))),
        attn_query: (i > 0).then(|| {
            let name = format!("model.llm.attn_res.attn_queries.{}", i - 1);
            if full {
                t(name, &[3, h], TensorKind::Mixing)
            } else {
                t(name, &[h], TensorKind::Mixing)
            }
        }),
        mlp_query: t(
            format!("model.llm.attn_res.mlp_queries.{i}"),
            &[h],
            TensorKind::Mixing,
        ),
    }));
    let (e, im) = (s.num_experts, s.moe_intermediate_size);
    let ffn = FfnSpec::Moe(MoeSpec {
        latent: None,
        hash_table: None,
        router: t(format!("{p}.mlp.gate.weight"), &[e, h], TensorKind::Router),
        router_bias: Some(t(format!("{p}.mlp.gate.bias"), &[e], TensorKind::Bias)),
        router_logit_bias: None,
        shared: None,
        shared_gate: None,
        experts: ExpertsSpec {
            layer: i as u32,
            count: e as u32,
            hidden: h,
            intermediate: im,
            class: TensorClass::RoutedExpert,
            prefix: format!("{p}.mlp.experts"),
            storage: if ink.v2.is_some_and(|v| v.mxfp8_experts) {
                ExpertStorage::FusedW13Mxfp8
            } else {
                ExpertStorage::FusedW13
            },
            biases: false,
        },
    });
    LayerSpec {
        attn_res: None,
        index: i,
        input_norm: if full {
            norm("q_input_norm")
        } else {
            norm("attn_norm")
        },
        attention,
        post_norm: norm("mlp_norm"),
        ffn,
        hyper: None,
    }
}
