//! The model spec: the one reader of a checkpoint's `config.json` (and `generation_config.json`
//! for EOS ids), and the list of every tensor the model needs.
//!
//! [`ModelSpec::from_config`] reads the config the way transformers 5.23 reads it for each
//! supported family (its config class's defaults), refuses what coli does not run, and builds
//! [`ModelTensors`]: every tensor with its name, shape, class and whether it is optional. The
//! converter's preflight checks a checkpoint against it; the engine's model files load exactly
//! its tensors. One file per family states the family's layers, attention and routing:
//! [`mixtral`], [`qwen3_moe`], [`olmoe`], [`deepseek_v3`] (also `kimi_k2`), [`glm_moe_dsa`],
//! [`gpt_oss`], [`glm4_moe`], [`minimax_m2`], [`deepseek_v32`], [`inkling`], [`qwen3_next`], [`qwen3_5_moe`],
//! [`kimi_linear`], [`glm5_next`], [`deepseek_v4`].
//!
//! Multimodal wrappers that keep the language model's config under `text_config` (and its
//! tensors under `language_model.` or `model.language_model.`) are read through
//! [`ModelSpec::canonical_tensor_name`]: the spec describes the language model alone.

pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod deepseek_v4;
pub mod glm4_moe;
pub mod glm5_next;
pub mod glm_moe_dsa;
pub mod gpt_oss;
pub mod inkling;
pub mod inkling2;
mod json;
pub mod kimi_linear;
pub mod minimax_m2;
pub mod mixtral;
pub mod mla;
pub mod olmoe;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;
pub mod tensors;

use crate::FormatError;
pub use deepseek_v4::{DeepseekV4Spec, V4Attention};
pub use inkling::{InklingSpec, LogScaling};
pub use inkling2::Inkling2Params;
pub use json::eos_ids;
use json::Fields;
pub use kimi_linear::KimiK3Spec;
pub use mla::{DsaSpec, MlaSpec, Yarn};
pub use qwen3_next::{DeltaRule, GatedDeltaSpec};
use serde_json::Value;
use std::collections::HashMap;
pub use tensors::*;

/// The encoding config.json declares its routed experts published in, which a store keeps bit
/// for bit (`coli-convert --experts auto` chooses it): mxfp4 for gpt-oss's MXFP4 experts
/// (`quantization_config.quant_method` `mxfp4`) and DeepSeek-V4's FP4 experts
/// (`expert_dtype` `fp4`: MXFP4's bits), mxfp8 for Inkling 2's MXFP8 experts
/// (`weight_block_size` `[1, 32]`); None otherwise.
pub fn declared_expert_encoding(config: &Value) -> Option<crate::Encoding> {
    if gpt_oss::declares_mxfp4(config)
        || deepseek_v4::declares_fp4(config)
        || kimi_linear::declares_mxfp4_pack(config)
    {
        Some(crate::Encoding::Mxfp4)
    } else if inkling2::declares_mxfp8(config) {
        Some(crate::Encoding::Mxfp8)
    } else {
        None
    }
}

/// The `model_type` values coli reads.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "mixtral",
    "qwen3_moe",
    "olmoe",
    "deepseek_v3",
    "kimi_k2",
    "glm_moe_dsa",
    "gpt_oss",
    "glm4_moe",
    "minimax_m2",
    "deepseek_v32",
    "inkling_text",
    "inkling2_text",
    "qwen3_next",
    "qwen3_5_moe_text",
    "kimi_linear",
    "glm5_next_text",
    "deepseek_v4",
];

/// A supported model family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `mixtral` ([`mixtral`]).
    Mixtral,
    /// `qwen3_moe` ([`qwen3_moe`]).
    Qwen3Moe,
    /// `olmoe` ([`olmoe`]).
    Olmoe,
    /// `deepseek_v3` and `kimi_k2`, the same architecture ([`deepseek_v3`]).
    DeepseekV3,
    /// `glm_moe_dsa`, GLM-5 ([`glm_moe_dsa`]).
    GlmMoeDsa,
    /// `gpt_oss`, gpt-oss-20b / -120b ([`gpt_oss`]).
    GptOss,
    /// `glm4_moe`, GLM-4.5 / 4.6 / 4.7 ([`glm4_moe`]).
    Glm4Moe,
    /// `minimax_m2`, MiniMax-M2 / M2.1 ([`minimax_m2`]).
    MinimaxM2,
    /// `deepseek_v32`, DeepSeek-V3.2 ([`deepseek_v32`]).
    DeepseekV32,
    /// `inkling_text`, the language model of Inkling (`inkling_mm_model`) ([`inkling`]).
    Inkling,
    /// `inkling2_text`, the language model of Inkling 2 (`inkling2`) ([`inkling2`]).
    Inkling2,
    /// `qwen3_next`, Qwen3-Next-80B-A3B ([`qwen3_next`]).
    Qwen3Next,
    /// `qwen3_5_moe_text`, the language model of Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`)
    /// ([`qwen3_5_moe`]).
    Qwen35Moe,
    /// `kimi_linear`, Kimi-Linear-48B-A3B ([`kimi_linear`]).
    KimiLinear,
    /// `glm5_next_text`, the language model of GLM-5.3-Flash (`glm5_next`) ([`glm5_next`]).
    Glm5Next,
    /// `deepseek_v4`, DeepSeek-V4-Flash / -Pro ([`deepseek_v4`]).
    DeepseekV4,
}

impl Family {
    /// The family of a `model_type`.
    ///
    /// # Errors
    /// [`FormatError::Unsupported`] for any other model type, listing the supported ones.
    pub fn from_model_type(s: &str) -> Result<Family, FormatError> {
        match s {
            "mixtral" => Ok(Family::Mixtral),
            "qwen3_moe" => Ok(Family::Qwen3Moe),
            "olmoe" => Ok(Family::Olmoe),
            "deepseek_v3" | "kimi_k2" => Ok(Family::DeepseekV3),
            "glm_moe_dsa" => Ok(Family::GlmMoeDsa),
            "gpt_oss" => Ok(Family::GptOss),
            "glm4_moe" => Ok(Family::Glm4Moe),
            "minimax_m2" => Ok(Family::MinimaxM2),
            "deepseek_v32" => Ok(Family::DeepseekV32),
            "inkling_text" => Ok(Family::Inkling),
            "inkling2_text" => Ok(Family::Inkling2),
            "qwen3_next" => Ok(Family::Qwen3Next),
            "qwen3_5_moe_text" => Ok(Family::Qwen35Moe),
            "kimi_linear" => Ok(Family::KimiLinear),
            "glm5_next_text" => Ok(Family::Glm5Next),
            "deepseek_v4" => Ok(Family::DeepseekV4),
            other => Err(FormatError::Unsupported(format!(
                "model_type {other:?}; coli runs {}",
                SUPPORTED_MODEL_TYPES.join(", ")
            ))),
        }
    }

    /// The family's canonical `model_type` (`deepseek_v3` for Kimi-K2 too).
    pub fn name(self) -> &'static str {
        match self {
            Family::Mixtral => "mixtral",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Olmoe => "olmoe",
            Family::DeepseekV3 => "deepseek_v3",
            Family::GlmMoeDsa => "glm_moe_dsa",
            Family::GptOss => "gpt_oss",
            Family::Glm4Moe => "glm4_moe",
            Family::MinimaxM2 => "minimax_m2",
            Family::DeepseekV32 => "deepseek_v32",
            Family::Inkling => "inkling_text",
            Family::Inkling2 => "inkling2_text",
            Family::Qwen3Next => "qwen3_next",
            Family::Qwen35Moe => "qwen3_5_moe_text",
            Family::KimiLinear => "kimi_linear",
            Family::Glm5Next => "glm5_next_text",
            Family::DeepseekV4 => "deepseek_v4",
        }
    }

    /// MLA families (DeepSeek-V3 architecture: MLA attention, grouped sigmoid routing, dense
    /// first layers, MTP layer).
    pub fn is_mla(self) -> bool {
        matches!(
            self,
            Family::DeepseekV3 | Family::GlmMoeDsa | Family::DeepseekV32
        )
    }

    /// `default_theta` of the transformers config class (used when config.json names no theta).
    fn default_theta(self) -> f64 {
        match self {
            Family::Mixtral => 1_000_000.0,
            Family::Qwen3Moe
            | Family::Olmoe
            | Family::DeepseekV3
            | Family::DeepseekV32
            | Family::GlmMoeDsa
            | Family::Glm4Moe
            | Family::Qwen3Next
            | Family::Qwen35Moe
            | Family::KimiLinear
            | Family::Glm5Next
            | Family::DeepseekV4 => 10_000.0,
            Family::GptOss => 150_000.0,
            Family::MinimaxM2 => 5_000_000.0,
            // No RoPE: a learned relative position bias.
            Family::Inkling | Family::Inkling2 => 0.0,
        }
    }

    /// Default `rms_norm_eps` of the transformers config class.
    fn default_eps(self) -> f64 {
        match self {
            Family::Qwen3Moe
            | Family::DeepseekV3
            | Family::DeepseekV32
            | Family::MinimaxM2
            | Family::Inkling
            | Family::Inkling2
            | Family::Qwen3Next
            | Family::Qwen35Moe
            | Family::DeepseekV4 => 1e-6,
            Family::Mixtral
            | Family::Olmoe
            | Family::GlmMoeDsa
            | Family::GptOss
            | Family::Glm4Moe
            | Family::KimiLinear
            | Family::Glm5Next => 1e-5,
        }
    }
}

/// How a MoE layer picks and weighs its experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// Softmax over the f32 router logits, top-k, the top-k weights renormalized to sum to 1
    /// when `renormalize` (Mixtral always; Qwen3-MoE and OLMoE with `norm_topk_prob`).
    SoftmaxTopK {
        /// Renormalize the top-k weights.
        renormalize: bool,
    },
    /// gpt-oss: top-k of the router logits (bias included), then a softmax over those k
    /// logits (`GptOssTopKRouter`).
    TopKSoftmax,
    /// DeepSeek-V3's grouped sigmoid routing: sigmoid scores plus `e_score_correction_bias`
    /// for selection only; groups scored by the sum of their top 2, the best `topk_group` of
    /// `n_group` kept, top-k experts among them; weights = unbiased scores (renormalized when
    /// `renormalize`) times `scaling`; shared experts added.
    GroupedSigmoid {
        /// Groups (`n_group`).
        n_group: usize,
        /// Groups kept (`topk_group`).
        topk_group: usize,
        /// Renormalize the top-k weights (`norm_topk_prob`).
        renormalize: bool,
        /// `routed_scaling_factor`.
        scaling: f32,
    },
    /// Inkling (`InklingTopkRouter`): sigmoid scores plus the selection bias choose the top-k
    /// routed experts; their logits and the shared experts' logits go through `logsigmoid` and
    /// are normalized together (a softmax whose shared-expert share is a sink), times
    /// `route_scale * gate.global_scale`. The shared experts take their share.
    SigmoidSink,
    /// DeepSeek-V4 (`DeepseekV4TopKRouter`): scores `sqrt(softplus(logits))`; the top-k of
    /// the scores plus `ffn.gate.bias` (or a hash layer's `tid2eid` row) are the experts;
    /// weights = their scores / (sum + 1e-20) * `scaling`; the shared expert added.
    SqrtSoftplus {
        /// `routed_scaling_factor`.
        scaling: f32,
    },
}

/// The activation between a routed expert's gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// SwiGLU `silu(gate) * up`.
    Silu,
    /// gpt-oss's clamped SwiGLU (`GptOssExperts`): `g = min(gate, limit)`,
    /// `u = clamp(up, -limit, limit)`, `(u + 1) * g * sigmoid(alpha * g)`.
    ClampedSwiglu {
        /// `alpha` (1.702).
        alpha: f32,
        /// `swiglu_limit` (7.0).
        limit: f32,
    },
    /// GLM-5.3-Flash's clamped SwiGLU (`Glm5NextTextExperts._apply_gate`):
    /// `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    SiluClamped {
        /// `swiglu_limit` (10.0).
        limit: f32,
    },
    /// Inkling 2's softcapped SwiGLU (`Inkling2SoftcappedSwiGLU`):
    /// `gate_cap tanh(g / gate_cap) * sigmoid(g) * up_cap tanh(u / up_cap)`; Kimi K3's SiTU
    /// (`SituAndMul`: `beta`, `linear_beta`), whose `up_cap` is infinite (the up branch as is)
    /// when the config gives no linear beta.
    SoftcappedSwiglu {
        /// `mlp_gate_softcap` (4.0).
        gate_cap: f32,
        /// `mlp_up_softcap` (25.0).
        up_cap: f32,
    },
}

/// Manifold-constrained hyper-connections (mHC; Xie et al. 2026; transformers 5.25
/// `Glm5NextTextHyperConnection`): the residual stream is `mult` streams of H values; before
/// each sublayer they are mixed into its input, after it its output is spread back over them
/// (see `coli_engine::layers::hyper`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperSpec {
    /// Residual streams N (`hc_mult`).
    pub mult: usize,
    /// Sinkhorn-Knopp iterations that make the comb matrix doubly stochastic
    /// (`hc_sinkhorn_iters`).
    pub sinkhorn_iters: usize,
    /// The floor added to pre and comb and to every Sinkhorn denominator (`hc_eps`).
    pub eps: f32,
}

/// Everything coli needs from a checkpoint's config: the dimensions and options of the forward
/// pass, with transformers' defaults applied, and every tensor the model reads.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Model family.
    pub family: Family,
    /// `model_type` as written (`kimi_k2` stays `kimi_k2`).
    pub model_type: String,
    /// The wrapper's `model_type` when config.json nests the language model under
    /// `text_config` (a multimodal checkpoint); None otherwise.
    pub wrapper: Option<String>,
    /// Vocabulary size (rows of the embedding and of lm_head).
    pub vocab_size: usize,
    /// Hidden size H.
    pub hidden_size: usize,
    /// Decoder layers (`num_hidden_layers`; MTP layers not included).
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA: `num_heads` is a multiple of it).
    pub num_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// GQA families: the leading dimensions of each q/k head that RoPE rotates (`rotate_half`
    /// over them, the rest passes through): `head_dim` unless the config has a partial rotary
    /// factor (GLM-4.5: `int(head_dim * partial_rotary_factor)`, transformers'
    /// `compute_default_rope_parameters`). Unused by MLA families (their [`MlaSpec`] says).
    pub rotary_dim: usize,
    /// RMSNorm epsilon (added to the f32 mean square).
    pub rms_norm_eps: f32,
    /// RoPE base (`rope_theta`).
    pub rope_theta: f64,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Sliding attention window in tokens (a query at position i sees keys j with
    /// i - window < j <= i), on the layers [`ModelSpec::sliding_layers`] marks.
    pub sliding_window: Option<usize>,
    /// Per main layer: whether it uses the sliding window (every layer when the family has one
    /// window for all; gpt-oss alternates by `layer_types`).
    pub sliding_layers: Vec<bool>,
    /// YaRN RoPE of a GQA family (gpt-oss), None for the default RoPE.
    pub rope_yarn: Option<Yarn>,
    /// The routed experts' activation.
    pub expert_activation: ExpertActivation,
    /// The activation of the dense MLPs and shared experts when it is not SwiGLU (Kimi K3's
    /// SiTU: its `hidden_act` applies to every MLP); None: SwiGLU (clamped where
    /// `swiglu_limit` says).
    pub mlp_activation: Option<ExpertActivation>,
    /// config.json declares MXFP4 experts (`quantization_config.quant_method: "mxfp4"`,
    /// gpt-oss as published).
    pub mxfp4_experts: bool,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts selected per token (top-k).
    pub top_k: usize,
    /// Renormalize the top-k routing weights to sum to 1 (always true for Mixtral).
    pub norm_topk_prob: bool,
    /// How experts are chosen and weighed.
    pub routing: Routing,
    /// Shared experts of a MoE layer (`n_shared_experts`: one always-on SwiGLU of
    /// `moe_intermediate_size * n_shared_experts`); 0 for the softmax-routed families.
    pub n_shared_experts: usize,
    /// Multi-token-prediction layers the config declares (`num_nextn_predict_layers`, 0 or 1),
    /// stored after the decoder layers.
    pub num_mtp_layers: usize,
    /// MTP layers the checkpoint holds after the decoder layers that coli does not convert or
    /// run (GLM-5.3-Flash's layer 45: transformers does not load it, so nothing checks it);
    /// their tensors are listed as not converted instead of refused.
    pub unconverted_mtp_layers: usize,
    /// Intermediate size I of one routed expert.
    pub moe_intermediate_size: usize,
    /// Intermediate size of the dense MLP of non-MoE layers.
    pub intermediate_size: usize,
    /// Qwen3-Next: the shared expert's intermediate size (`shared_expert_intermediate_size`);
    /// 0 for families whose shared experts are `n_shared_experts * moe_intermediate_size`.
    pub shared_expert_intermediate_size: usize,
    /// q/k/v/o projections have biases (GLM-4.5: q/k/v only).
    pub attention_bias: bool,
    /// GLM-4.5 `use_qk_norm`: RMSNorm of each q and k head before RoPE (Qwen3-MoE always
    /// has it, OLMoE has its whole-vector form; both say so in their tensors, not here).
    pub qk_norm: bool,
    /// OLMoE: clamp q, k, v to [-clip, clip] after the q/k norms.
    pub clip_qkv: Option<f32>,
    /// Per main layer: whether it has routed experts.
    pub moe_layers: Vec<bool>,
    /// `bos_token_id`, when set.
    pub bos_token_id: Option<u32>,
    /// Every EOS id of config.json and generation_config.json (sorted, unique).
    pub eos_token_ids: Vec<u32>,
    /// MLA families: attention, RoPE and routing parameters.
    pub mla: Option<MlaSpec>,
    /// Inkling: its sliding layers' heads, relative position bias, short convolutions, routing
    /// and output scaling.
    pub inkling: Option<InklingSpec>,
    /// Hybrid linear-attention families (Qwen3-Next, Qwen3.5, Kimi-Linear): the gated delta
    /// rule layers' rule, heads and which layers they are.
    pub gated_delta: Option<GatedDeltaSpec>,
    /// DeepSeek-V4: its layers' attention kinds, compression, indexer, RoPE and routing.
    pub deepseek_v4: Option<DeepseekV4Spec>,
    /// Kimi K3's additions to its Kimi-Linear language model (attention residuals, latent MoE,
    /// MLA output gate); None elsewhere.
    pub kimi_k3: Option<KimiK3Spec>,
    /// The residual streams of a model with hyper-connections (GLM-5.3-Flash's mHC:
    /// `hc_mult` streams, Sinkhorn-normalized mixing), None: one residual stream.
    pub hyper: Option<HyperSpec>,
    /// The clamp of every dense SwiGLU (dense MLPs, shared experts):
    /// `silu(min(gate, l)) * clamp(up, -l, l)` (GLM-5.3-Flash's `swiglu_limit`); None: no clamp.
    /// The routed experts' is in [`ModelSpec::expert_activation`].
    pub swiglu_limit: Option<f32>,
    /// RMSNorm weights are stored zero-centred: the model multiplies by `1 + w` (Qwen3-Next's
    /// `Qwen3NextRMSNorm`; not its gated norm, which uses `w`).
    pub zero_centered_norms: bool,
    /// Every tensor the model reads.
    pub tensors: ModelTensors,
}

/// RoPE theta of a GQA family from `rope_parameters` (transformers 5) or `rope_theta` +
/// `rope_scaling` (older configs), as `convert_rope_params_to_dict` resolves them; only the
/// default rope type runs.
fn gqa_rope_theta(f: &Fields<'_>, family: Family) -> Result<f64, FormatError> {
    let params = f
        .get("rope_parameters")
        .map(|p| (p, "rope_parameters."))
        .or_else(|| f.get("rope_scaling").map(|p| (p, "rope_scaling.")));
    let mut theta = f.f64("rope_theta")?;
    if let Some((p, prefix)) = params {
        if !p.is_object() {
            return Err(f.err(format!("rope parameters must be an object, found {p}")));
        }
        let p = Fields {
            v: p,
            file: f.file,
            prefix,
        };
        let ty = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if ty != "default" {
            return Err(FormatError::Unsupported(format!(
                "unsupported rope scaling {ty:?} (only the default RoPE is implemented)"
            )));
        }
        if let Some(t) = p.f64("rope_theta")? {
            theta = Some(t);
        }
        if !matches!(
            family,
            Family::Glm4Moe | Family::MinimaxM2 | Family::Qwen3Next | Family::Qwen35Moe
        ) && p
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .is_some_and(|x| x != 1.0)
        {
            return Err(FormatError::Unsupported(
                "unsupported rope scaling: partial_rotary_factor != 1".into(),
            ));
        }
    }
    let theta = theta.unwrap_or(family.default_theta());
    if !(theta.is_finite() && theta > 0.0) {
        return Err(f.err(format!("rope_theta must be positive, found {theta}")));
    }
    Ok(theta)
}

/// The rotary dimensions of a partial-rotary GQA family: `int(head_dim * factor)` with the
/// factor from `rope_parameters.partial_rotary_factor` (transformers 5), else `rope_scaling`'s,
/// else the top-level `partial_rotary_factor` (GLM-4.5's published configs), else
/// `rotary_dim / head_dim` from a top-level `rotary_dim` (MiniMax-M2's published configs, as
/// `MiniMaxM2Config.convert_rope_params_to_dict` reads it), else `default_factor` (the config
/// class's). As transformers' `compute_default_rope_parameters`.
///
/// # Errors
/// [`FormatError::Config`] when the factor is not in (0, 1] or gives an odd number of
/// dimensions or fewer than 2.
pub(crate) fn partial_rotary_dim(
    f: &Fields<'_>,
    head_dim: usize,
    default_factor: f64,
) -> Result<usize, FormatError> {
    let nested = ["rope_parameters", "rope_scaling"]
        .iter()
        .find_map(|k| f.get(k).and_then(|p| p.get("partial_rotary_factor")));
    let (factor, key) = match nested.or_else(|| f.v.get("partial_rotary_factor")) {
        // An explicit null survives the config class's `setdefault` and leaves RoPE over the
        // whole head (`compute_default_rope_parameters` reads 1.0).
        Some(Value::Null) => (1.0, "partial_rotary_factor"),
        Some(v) => (
            v.as_f64().ok_or_else(|| {
                f.err(format!("partial_rotary_factor must be a number, found {v}"))
            })?,
            "partial_rotary_factor",
        ),
        None => match f.usize("rotary_dim")? {
            Some(d) => (d as f64 / head_dim as f64, "rotary_dim"),
            None => (default_factor, "partial_rotary_factor"),
        },
    };
    let dim = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || dim < 2 || !dim.is_multiple_of(2) {
        return Err(f.err(format!(
            "{key} gives {dim} rotary dimensions (factor {factor}) of head_dim {head_dim}: must be even, at least 2 and at most head_dim"
        )));
    }
    Ok(dim)
}

/// The expert count under its primary key or its `attribute_map` alias (transformers 5 writes
/// `num_local_experts` for Qwen3-MoE).
fn num_experts(f: &Fields<'_>, key: &str, alias: &str) -> Result<usize, FormatError> {
    match f.usize(key)? {
        Some(n) => Ok(n),
        None => f
            .usize(alias)?
            .ok_or_else(|| f.err(format!("missing field {}{key} (or {alias})", f.prefix))),
    }
}

/// The text model type a multimodal wrapper builds its `text_config` as when that names no
/// `model_type` (transformers' `sub_configs_defaults`).
fn wrapper_text_type(wrapper: &str) -> Option<&'static str> {
    match wrapper {
        w if w == inkling::WRAPPER_MODEL_TYPE => Some("inkling_text"),
        w if w == inkling2::WRAPPER_MODEL_TYPE => Some("inkling2_text"),
        "glm5_next" => Some("glm5_next_text"),
        "qwen3_5_moe" => Some("qwen3_5_moe_text"),
        _ => None,
    }
}

/// The language model's config object: `config` itself, or its `text_config` when `config`
/// is a wrapper whose own `model_type` coli does not run but whose `text_config` names one it
/// does. Returns the object, its message prefix and the wrapper's model_type.
fn language_model_config(config: &Value) -> (&Value, &'static str, Option<String>) {
    let top = config.get("model_type").and_then(Value::as_str);
    let nested = config
        .get("text_config")
        .filter(|t| t.is_object())
        .filter(|t| {
            match t.get("model_type").and_then(Value::as_str) {
                Some(m) => SUPPORTED_MODEL_TYPES.contains(&m),
                // `InklingConfig` builds its text config as `inkling_text` whatever the
                // checkpoint's `text_config` says of its type; the other wrappers build theirs
                // as their own text type when it says none.
                None => top.is_some_and(|t| wrapper_text_type(t).is_some()),
            }
        });
    match (top, nested) {
        (Some(t), Some(n)) if !SUPPORTED_MODEL_TYPES.contains(&t) => {
            (n, "text_config.", Some(t.to_string()))
        }
        _ => (config, "", None),
    }
}

impl ModelSpec {
    /// Reads config.json (`config`) and the EOS ids of generation_config.json
    /// (`generation_config`, when given), applying the transformers 5.23 config classes'
    /// defaults (`MixtralConfig`, `Qwen3MoeConfig`, `OlmoeConfig`, `DeepseekV3Config`,
    /// `GlmMoeDsaConfig`, `GptOssConfig`, `Glm4MoeConfig`, `MiniMaxM2Config`,
    /// `DeepseekV32Config`); `head_dim` is `config.head_dim` or `hidden / heads`. A multimodal
    /// wrapper is read through its `text_config` (inheriting `tie_word_embeddings` and EOS ids
    /// from the top level).
    ///
    /// # Errors
    /// [`FormatError::Config`] naming config.json and the field: missing or mistyped fields,
    /// inconsistent sizes; [`FormatError::Unsupported`] for another model type, activation,
    /// RoPE scaling, scoring function or top-k method.
    pub fn from_config(
        config: &Value,
        generation_config: Option<&Value>,
    ) -> Result<ModelSpec, FormatError> {
        let (v, prefix, wrapper) = language_model_config(config);
        let f = Fields {
            v,
            file: "config.json",
            prefix,
        };
        let model_type = match f.str("model_type")? {
            Some(m) => m,
            None if wrapper.as_deref().and_then(wrapper_text_type).is_some() => wrapper
                .as_deref()
                .and_then(wrapper_text_type)
                .unwrap_or_default(),
            None => return Err(f.err(format!("missing field {prefix}model_type"))),
        };
        let family = Family::from_model_type(model_type)?;
        if let Some(act) = f.get("hidden_act").and_then(Value::as_str) {
            // Kimi K3's language model (a Kimi-Linear) runs SiTU in every MLP
            // (`kimi_linear::configure` reads its betas).
            if act != "silu" && !(act == "situ" && family == Family::KimiLinear) {
                return Err(FormatError::Unsupported(format!(
                    "hidden_act {act:?} (only silu)"
                )));
            }
        }
        if let Some(bs) = config
            .get("quantization_config")
            .filter(|_| family != Family::GptOss)
            .or_else(|| f.get("quantization_config"))
            .and_then(|q| q.get("weight_block_size"))
        {
            // Inkling 2's MXFP8 releases: blocks of 32 columns of one row, e8m0 scales, on the
            // routed experts (`ExpertStorage::FusedW13Mxfp8`).
            let mx = family == Family::Inkling2 && bs == &serde_json::json!([1, 32]);
            if bs != &serde_json::json!([128, 128]) && !mx {
                return Err(f.err(format!(
                    "quantization_config.weight_block_size is {bs}; only [128, 128] FP8 blocks are supported (and Inkling 2's MXFP8 [1, 32] experts)"
                )));
            }
        }
        let hidden_size = f.req_usize("hidden_size")?;
        let num_heads = f.req_usize("num_attention_heads")?;
        let num_kv_heads = f.usize("num_key_value_heads")?.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(f.err(format!(
                "num_attention_heads {num_heads} must be a positive multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        let head_dim = match f.usize("head_dim")? {
            Some(d) if d > 0 => d,
            _ => hidden_size / num_heads,
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(f.err(format!("head_dim {head_dim} must be even and positive")));
        }
        let num_layers = f.req_usize("num_hidden_layers")?;
        let vocab_size = f.req_usize("vocab_size")?;
        let tie_word_embeddings = match f.bool("tie_word_embeddings")? {
            Some(t) => t,
            None => Fields {
                v: config,
                file: "config.json",
                prefix: "",
            }
            .bool("tie_word_embeddings")?
            .unwrap_or(false),
        };
        let mut eos_token_ids = eos_ids(v, "config.json")?;
        if wrapper.is_some() {
            eos_token_ids.extend(eos_ids(config, "config.json")?);
        }
        if let Some(g) = generation_config {
            eos_token_ids.extend(eos_ids(g, "generation_config.json")?);
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let mut spec = ModelSpec {
            family,
            model_type: model_type.to_string(),
            wrapper,
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: f.f64("rms_norm_eps")?.unwrap_or(family.default_eps()) as f32,
            rope_theta: family.default_theta(),
            max_position_embeddings: f.usize("max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings,
            sliding_window: None,
            sliding_layers: vec![],
            rope_yarn: None,
            expert_activation: ExpertActivation::Silu,
            mlp_activation: None,
            mxfp4_experts: false,
            num_experts: 0,
            top_k: 0,
            norm_topk_prob: false,
            routing: Routing::SoftmaxTopK { renormalize: false },
            n_shared_experts: 0,
            num_mtp_layers: 0,
            unconverted_mtp_layers: 0,
            moe_intermediate_size: 0,
            intermediate_size: f.usize("intermediate_size")?.unwrap_or(0),
            shared_expert_intermediate_size: 0,
            attention_bias: false,
            qk_norm: false,
            clip_qkv: None,
            moe_layers: vec![true; num_layers],
            bos_token_id: f.usize("bos_token_id")?.map(|n| n as u32),
            eos_token_ids,
            mla: None,
            inkling: None,
            gated_delta: None,
            deepseek_v4: None,
            kimi_k3: None,
            hyper: None,
            swiglu_limit: None,
            zero_centered_norms: false,
            tensors: ModelTensors {
                final_res: None,
                embed: TensorSpec::new("", &[0], TensorClass::Dense, TensorKind::Embedding),
                embed_norm: None,
                layers: vec![],
                final_norm: TensorSpec::new("", &[0], TensorClass::Dense, TensorKind::Norm),
                lm_head: TensorSpec::new("", &[0], TensorClass::Dense, TensorKind::OutputHead),
                mtp: vec![],
                final_query: None,
                hyper_head: None,
            },
        };
        match family {
            Family::Mixtral => mixtral::configure(&f, &mut spec)?,
            Family::Qwen3Moe => qwen3_moe::configure(&f, &mut spec)?,
            Family::Olmoe => olmoe::configure(&f, &mut spec)?,
            Family::DeepseekV3 => deepseek_v3::configure(&f, &mut spec)?,
            Family::GlmMoeDsa => glm_moe_dsa::configure(&f, &mut spec)?,
            Family::GptOss => gpt_oss::configure(config, &f, &mut spec)?,
            Family::Glm4Moe => glm4_moe::configure(&f, &mut spec)?,
            Family::MinimaxM2 => minimax_m2::configure(&f, &mut spec)?,
            Family::DeepseekV32 => deepseek_v32::configure(&f, &mut spec)?,
            Family::Inkling => inkling::configure(config, &f, &mut spec)?,
            Family::Inkling2 => inkling2::configure(config, &f, &mut spec)?,
            Family::Qwen3Next => qwen3_next::configure(&f, &mut spec)?,
            Family::Qwen35Moe => qwen3_5_moe::configure(&f, &mut spec)?,
            Family::KimiLinear => kimi_linear::configure(&f, &mut spec)?,
            Family::Glm5Next => glm5_next::configure(&f, &mut spec)?,
            Family::DeepseekV4 => deepseek_v4::configure(&f, &mut spec)?,
        }
        if spec.sliding_layers.is_empty() {
            spec.sliding_layers = vec![spec.sliding_window.is_some(); num_layers];
        }
        let (top_k, top_k_key) = match family {
            Family::KimiLinear => kimi_linear::top_k(&f)?,
            _ => (f.req_usize("num_experts_per_tok")?, "num_experts_per_tok"),
        };
        if top_k == 0 || top_k > spec.num_experts {
            return Err(f.err(format!(
                "{top_k_key} {top_k} must be in 1..={}",
                spec.num_experts
            )));
        }
        spec.top_k = top_k;
        // Sizes the forward pass allocates and divides by.
        for (key, v) in [
            ("vocab_size", spec.vocab_size),
            ("hidden_size", spec.hidden_size),
            ("num_hidden_layers", spec.num_layers),
            ("num_attention_heads", spec.num_heads),
            // The context cap: no position could be decoded.
            ("max_position_embeddings", spec.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(f.err(format!("{prefix}{key} is 0")));
            }
        }
        if spec.mla.is_none() && spec.inkling.is_none() {
            if spec.head_dim == 0 {
                return Err(f.err(format!("{prefix}head_dim is 0")));
            }
            if spec.num_kv_heads == 0 || !spec.num_heads.is_multiple_of(spec.num_kv_heads) {
                return Err(f.err(format!(
                    "{prefix}num_key_value_heads {} must divide num_attention_heads {}",
                    spec.num_kv_heads, spec.num_heads
                )));
            }
        }
        // Numbers the forward pass divides by, takes powers or logarithms of: finite and
        // positive (Inkling has no RoPE: its theta is 0).
        if !(spec.rms_norm_eps.is_finite() && spec.rms_norm_eps > 0.0) {
            return Err(f.err(format!(
                "{prefix}rms_norm_eps {} must be a positive finite number",
                spec.rms_norm_eps
            )));
        }
        let no_rope =
            matches!(family, Family::Inkling | Family::Inkling2) && spec.rope_theta == 0.0;
        let theta_ok = spec.rope_theta.is_finite() && spec.rope_theta > 0.0;
        if !(no_rope || theta_ok) {
            return Err(f.err(format!(
                "{prefix}rope_theta (or rope_parameters.rope_theta) {} must be a positive finite number",
                spec.rope_theta
            )));
        }
        if spec.moe_layers.iter().any(|&m| m) && spec.moe_intermediate_size == 0 {
            return Err(f.err(format!(
                "the routed experts' intermediate size is 0 ({prefix}moe_intermediate_size / {prefix}intermediate_size)"
            )));
        }
        // Widths no model has: a typo or a hostile config, whose byte counts would overflow
        // (the plan, the record layouts) long before anything could be read.
        for (key, v) in [
            ("hidden_size", spec.hidden_size),
            ("intermediate_size", spec.intermediate_size),
            ("moe_intermediate_size", spec.moe_intermediate_size),
            (spec.expert_hidden_key(), spec.expert_hidden()),
            ("num_hidden_layers", spec.num_layers),
            ("num_attention_heads", spec.num_heads),
            ("head_dim", spec.head_dim),
            ("vocab_size", spec.vocab_size),
            ("num_experts", spec.num_experts),
        ] {
            if v > MAX_WIDTH {
                return Err(f.err(format!(
                    "{prefix}{key} {v} is beyond any model's (at most {MAX_WIDTH})"
                )));
            }
        }
        spec.tensors = match family {
            Family::Mixtral => mixtral::tensors(&spec),
            Family::Qwen3Moe => qwen3_moe::tensors(&spec),
            Family::Olmoe => olmoe::tensors(&spec),
            Family::DeepseekV3 => deepseek_v3::tensors(&spec),
            Family::GlmMoeDsa => glm_moe_dsa::tensors(&spec),
            Family::GptOss => gpt_oss::tensors(&spec),
            Family::Glm4Moe => glm4_moe::tensors(&spec),
            Family::MinimaxM2 => minimax_m2::tensors(&spec),
            Family::DeepseekV32 => glm_moe_dsa::tensors(&spec),
            Family::Inkling => inkling::tensors(&spec),
            Family::Inkling2 => inkling2::tensors(&spec),
            Family::Qwen3Next => qwen3_next::tensors(&spec),
            Family::Qwen35Moe => qwen3_5_moe::tensors(&spec),
            Family::KimiLinear => kimi_linear::tensors(&spec),
            Family::Glm5Next => glm5_next::tensors(&spec),
            Family::DeepseekV4 => deepseek_v4::tensors(&spec),
        };
        Ok(spec)
    }

    /// The model a store's MANIFEST describes, checked against the MANIFEST's own fields: its
    /// config parses into a spec (every field the family reads, in range), `family` is the
    /// config's `model_type`, `num_layers` is `num_hidden_layers` (plus the MTP layer when the
    /// store holds it), and `expert_layers` are the spec's MoE layers with the spec's expert
    /// counts (the MTP layer's optional). What `coli run` and `coli-fsck` check before they
    /// trust a store (a MANIFEST edited with its checksums recomputed passes the byte checks).
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST and the field; the config's own errors name
    /// `MANIFEST config` and the field.
    pub fn of_store(m: &crate::disk::manifest::Manifest) -> Result<ModelSpec, FormatError> {
        let bad = |what: String| FormatError::format(crate::disk::names::MANIFEST, what);
        let spec = ModelSpec::from_config(&m.config, None).map_err(|e| match e {
            FormatError::Config { what, .. } | FormatError::Format { what, .. } => {
                bad(format!("config: {what}"))
            }
            FormatError::Unsupported(what) => bad(format!("config: unsupported model: {what}")),
            e => e,
        })?;
        if m.family != spec.model_type {
            return Err(bad(format!(
                "family {:?} is not the config's model_type {:?}",
                m.family, spec.model_type
            )));
        }
        let main = spec.num_layers as u32;
        let with_mtp = main + u32::from(spec.mtp_layer().is_some());
        if m.num_layers != main && m.num_layers != with_mtp {
            return Err(bad(format!(
                "num_layers {} is neither the config's num_hidden_layers {main} nor {with_mtp} with its MTP layer",
                m.num_layers
            )));
        }
        let wanted = spec.expert_layers();
        for l in &m.expert_layers {
            match wanted.iter().find(|w| w.0 == l.layer) {
                None => {
                    return Err(bad(format!(
                        "expert_layers: layer {} is not a MoE layer of the config",
                        l.layer
                    )))
                }
                Some(&(_, n)) if n != l.num_experts => {
                    return Err(bad(format!(
                        "expert_layers: layer {} has {} experts, the config {n}",
                        l.layer, l.num_experts
                    )))
                }
                _ => {}
            }
        }
        if let Some(&(l, _)) = wanted
            .iter()
            .filter(|w| (w.0 as usize) < spec.num_layers)
            .find(|w| !m.expert_layers.iter().any(|x| x.layer == w.0))
        {
            return Err(bad(format!(
                "expert_layers: the config's MoE layer {l} is missing"
            )));
        }
        spec.check_dense_entries(m)?;
        Ok(spec)
    }

    /// Checks the MANIFEST's dense tensors against this spec (part of [`ModelSpec::of_store`]):
    /// every stored tensor has the spec's matrix shape, `mtp_shared` stand-ins are stored
    /// tensors of the shape of the tensor they stand in for, and no stored tensor is one the
    /// spec does not know. A tensor the model needs but the store lacks is named by the engine
    /// when it loads (an incomplete MTP layer only turns the MTP layer off).
    ///
    /// # Errors
    /// [`FormatError::Format`] naming MANIFEST, the tensor and both shapes (a config whose
    /// widths are not the stored tensors', e.g. an edited `hidden_size`).
    fn check_dense_entries(&self, m: &crate::disk::manifest::Manifest) -> Result<(), FormatError> {
        let bad = |what: String| FormatError::format(crate::disk::names::MANIFEST, what);
        let stored: HashMap<&str, &crate::disk::manifest::DenseEntry> =
            m.dense.iter().map(|d| (d.name.as_str(), d)).collect();
        let with_mtp = m.num_layers as usize > self.num_layers;
        let wanted = if with_mtp {
            self.tensors.dense()
        } else {
            self.tensors.main_dense()
        };
        let dims = |s: &[usize]| crate::matrix_dims(s);
        for t in &wanted {
            match stored.get(t.name.as_str()) {
                Some(d)
                    if dims(&d.shape) != Some(t.rows_cols()) && !t.accepts_shape(&d.shape) =>
                {
                    return Err(bad(format!(
                        "dense tensor {} is stored as {:?} but the config gives {:?}: the MANIFEST's config does not describe the stored weights",
                        t.name, d.shape, t.shape
                    )))
                }
                Some(_) => {}
                // A missing tensor of the main model is named by the engine when it loads;
                // a store of a few tensors (tests, tools) still passes coli-fsck.
                None => {
                    if let Some(by) = m.mtp_shared.get(&t.name) {
                        match stored.get(by.as_str()) {
                            Some(d) if dims(&d.shape) == Some(t.rows_cols()) => {}
                            Some(d) => {
                                return Err(bad(format!(
                                    "mtp_shared: {} stands in for {} {:?} but is stored as {:?}",
                                    by, t.name, t.shape, d.shape
                                )))
                            }
                            None => {
                                return Err(bad(format!(
                                    "mtp_shared: {} stands in for {} but is not a stored tensor",
                                    by, t.name
                                )))
                            }
                        }
                    }
                }
            }
        }
        let known: std::collections::HashSet<&str> =
            wanted.iter().map(|t| t.name.as_str()).collect();
        if let Some(d) = m.dense.iter().find(|d| !known.contains(d.name.as_str())) {
            return Err(bad(format!(
                "dense tensor {} is not one of the config's model",
                d.name
            )));
        }
        Ok(())
    }

    /// Checks the INDEX's expert records against this spec: each record's layer holds routed
    /// experts, its expert number is below the layer's count, and its hidden size,
    /// intermediate size and biases are the spec's for that layer.
    ///
    /// # Errors
    /// [`FormatError::Format`] naming INDEX, the record and the field.
    pub fn check_records(
        &self,
        records: &[crate::disk::index::IndexRecord],
    ) -> Result<(), FormatError> {
        let sets: HashMap<u32, &ExpertsSpec> = self
            .tensors
            .expert_sets()
            .into_iter()
            .map(|e| (e.layer, e))
            .collect();
        for r in records {
            let k = r.key();
            let bad = |what: String| {
                FormatError::format(
                    crate::disk::names::INDEX,
                    format!("record layer {} expert {}: {what}", k.layer, k.expert),
                )
            };
            let Some(e) = sets.get(&k.layer) else {
                return Err(bad(
                    "the config's model has no routed experts in this layer".into(),
                ));
            };
            if k.expert >= e.count {
                return Err(bad(format!("the layer has {} experts", e.count)));
            }
            let (h, i) = (r.hidden.get() as usize, r.intermediate.get() as usize);
            if (h, i) != (e.hidden, e.intermediate) || r.has_biases() != e.biases {
                return Err(bad(format!(
                    "hidden {h}, intermediate {i}{}, but the config gives hidden_size {} and an expert intermediate size of {}{} (moe_intermediate_size; intermediate_size for Mixtral and gpt-oss): the MANIFEST's config does not describe the stored experts",
                    if r.has_biases() { " with biases" } else { "" },
                    e.hidden,
                    e.intermediate,
                    if e.biases { " with biases" } else { "" }
                )));
            }
        }
        Ok(())
    }

    /// f32 values per token of the residual stream the decoder layers update: `hidden_size`,
    /// times `hc_mult` with hyper-connections (GLM-5.3-Flash), or the closed blocks plus the
    /// partial sum of Inkling 2's and Kimi K3's attention residuals (`ceil(layers / block) + 1` rows of
    /// `hidden_size`; `coli_engine::layers::attn_res`).
    pub fn residual_values(&self) -> usize {
        let h = self.hidden_size;
        match self.attn_res_block() {
            Some(block) => (self.num_layers.div_ceil(block) + 1) * h,
            None => self.hyper.map_or(1, |x| x.mult) * h,
        }
    }

    /// The config key that would make the model read tensor `name` (spec name), when the family
    /// knows the tensor but this config does not read it (Kimi K3's: a config that lost a key,
    /// [`kimi_linear`]); None otherwise. The converter refuses such a checkpoint instead of
    /// leaving the tensor out.
    pub fn key_to_read(&self, name: &str) -> Option<&'static str> {
        match self.family {
            Family::KimiLinear => kimi_linear::key_to_read(self, name),
            _ => None,
        }
    }

    /// The routed experts' hidden size: `hidden_size`, or Kimi K3's latent size
    /// (`routed_expert_hidden_size`), on which its experts run.
    pub fn expert_hidden(&self) -> usize {
        self.kimi_k3
            .and_then(|k| k.latent)
            .unwrap_or(self.hidden_size)
    }

    /// The config key [`ModelSpec::expert_hidden`] comes from (for messages).
    pub fn expert_hidden_key(&self) -> &'static str {
        match self.kimi_k3.and_then(|k| k.latent) {
            Some(_) => "routed_expert_hidden_size",
            None => "hidden_size",
        }
    }

    /// Layers per attention-residual block when the residual stream is blocks (Inkling 2's
    /// `n_layers_per_attn_res_block`, Kimi K3's `attn_res_block_size`); None elsewhere.
    pub fn attn_res_block(&self) -> Option<usize> {
        match self.inkling.as_ref().and_then(|i| i.v2) {
            Some(v2) => Some(v2.block),
            None => self.kimi_k3.and_then(|k| k.attn_res_block),
        }
    }

    /// The attention window of main layer `layer`: `sliding_window` on a sliding layer, None
    /// (full causal attention) elsewhere.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.sliding_layers.get(layer).copied().unwrap_or(false))
    }

    /// Whether main decoder layer `layer` has routed experts (the family's rule, see its file).
    /// Layers past `num_hidden_layers` (MTP) answer false here; see [`ModelSpec::mtp_layer`].
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe_layers.get(layer).copied().unwrap_or(false)
    }

    /// Whether every published checkpoint of this family leaves out the MTP layer's optional
    /// `embed_tokens` and `shared_head.head` (the main model's stand in): GLM-5, 5.1 and 5.2
    /// (`glm_moe_dsa`). GLM-4.5 ships them while GLM-4.6/4.7 do not, which config.json does not
    /// tell apart, so `glm4_moe` says false; a plan from config.json alone
    /// (`coli plan --config`) counts the copies only where this is false.
    pub fn releases_share_mtp_embed_and_head(&self) -> bool {
        self.family == Family::GlmMoeDsa
    }

    /// The context a run gets when none is asked for (`coli run`, `coli serve`, every `coli plan`
    /// mode and the converter's memory plan): `min(max_position_embeddings,`
    /// [`DEFAULT_CONTEXT_CAP`]`)`, tokens.
    pub fn default_context(&self) -> usize {
        self.max_position_embeddings.min(DEFAULT_CONTEXT_CAP)
    }

    /// The index of the MTP layer the config declares (`num_hidden_layers`), if any.
    pub fn mtp_layer(&self) -> Option<usize> {
        (self.num_mtp_layers > 0).then_some(self.num_layers)
    }

    /// Every main-layer routed expert count by layer, then the MTP layer's.
    pub fn expert_layers(&self) -> Vec<(u32, u32)> {
        self.tensors
            .expert_sets()
            .into_iter()
            .map(|e| (e.layer, e.count))
            .collect()
    }

    /// The name `name` of a checkpoint tensor has in this spec (and in the store). For a
    /// model read through a multimodal wrapper's `text_config`, the language model's tensors
    /// are `language_model.model.X` / `language_model.lm_head.weight` or
    /// `model.language_model.X` (transformers 5): they become `model.X` / `lm_head.weight`,
    /// and tensors outside the language model (vision tower, projector) give `None`. Then the
    /// family's transformers-5 renaming is undone ([`ModelSpec::transformers5_renames`]: a
    /// Mixtral saved by transformers 5 with `save_original_format=False` names its MoE block
    /// `model.layers.N.mlp.*`, the published layout `block_sparse_moe`).
    pub fn canonical_tensor_name<'n>(&self, name: &'n str) -> Option<std::borrow::Cow<'n, str>> {
        use std::borrow::Cow;
        let name = self.language_model_tensor_name(name)?;
        for (saved, published) in self.transformers5_renames() {
            if layer_of(&name).is_some() && name.contains(saved) {
                return Some(Cow::Owned(name.replacen(saved, published, 1)));
            }
        }
        Some(name)
    }

    /// The renamings transformers 5 applies when it loads this family's published checkpoints
    /// (its `conversion_mapping.py`, `WeightRenaming`), as `(name in memory and in a checkpoint
    /// saved with save_original_format=False, published name)` fragments of a decoder layer's
    /// tensor names: `.mlp.` for `.block_sparse_moe.` in Mixtral and MiniMax-M2 (whose
    /// published layers have no `.mlp.` tensor); Kimi-Linear's dense layer, which
    /// transformers' `save_pretrained` writes as `block_sparse_moe.{gate,up,down}_proj` (the
    /// reverse of its renaming) where the release has `mlp.*`. The fused expert tensors it saves beside them
    /// (`experts.gate_up_proj`, `experts.down_proj`) are read as [`ExpertStorage::FusedConcat`].
    pub fn transformers5_renames(&self) -> &'static [(&'static str, &'static str)] {
        match self.family {
            Family::Mixtral | Family::MinimaxM2 => &[(".mlp.", ".block_sparse_moe.")],
            // transformers saves Kimi-Linear's dense MLP by reversing its `.block_sparse_moe.`
            // -> `.mlp.` renaming, which the release does not (its MoE layers keep it).
            Family::KimiLinear => &[
                (".block_sparse_moe.gate_proj.", ".mlp.gate_proj."),
                (".block_sparse_moe.up_proj.", ".mlp.up_proj."),
                (".block_sparse_moe.down_proj.", ".mlp.down_proj."),
            ],
            _ => &[],
        }
    }

    /// [`ModelSpec::canonical_tensor_name`] before the family's renaming: the wrapper's prefix.
    fn language_model_tensor_name<'n>(&self, name: &'n str) -> Option<std::borrow::Cow<'n, str>> {
        use std::borrow::Cow;
        if self.wrapper.is_none() {
            return Some(Cow::Borrowed(name));
        }
        if matches!(self.family, Family::Inkling | Family::Inkling2) {
            // The published Inkling checkpoint names its language model `model.llm.*` (and its
            // MTP layers `model.mtp.*`); the vision and audio towers (`model.visual.*`,
            // `model.audio.*`) are not run.
            return inkling::language_model_tensor(name).then_some(Cow::Borrowed(name));
        }
        if let Some(rest) = name.strip_prefix("language_model.") {
            return Some(Cow::Borrowed(rest));
        }
        if let Some(rest) = name.strip_prefix("model.language_model.") {
            return Some(Cow::Owned(format!("model.{rest}")));
        }
        // Qwen3.5 publishes its MTP layer at the top level (`mtp.*`), beside the wrapper.
        if name == "lm_head.weight" || (self.num_mtp_layers > 0 && name.starts_with("mtp.")) {
            return Some(Cow::Borrowed(name));
        }
        None
    }
}

/// The cap of [`ModelSpec::default_context`], tokens.
pub const DEFAULT_CONTEXT_CAP: usize = 4096;

/// The layer index in a tensor name `model.layers.L.…`, if any.
pub fn layer_of(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("model.llm.layers."))
        .or_else(|| name.strip_prefix("layers."))?;
    let (num, _) = rest.split_once('.')?;
    num.parse().ok()
}

/// The largest width, count or vocabulary a config may give (2^22: 4.2M; the largest real ones
/// are vocabularies of ~260k and expert counts of ~900); beyond it byte counts could overflow.
pub const MAX_WIDTH: usize = 1 << 22;

/// Builders shared by the family files.
pub(crate) mod build {
    use super::tensors::*;

    /// A linear layer `{prefix}.weight` `[rows, cols]` (+ `{prefix}.bias` `[rows]`).
    pub fn linear(
        prefix: &str,
        rows: usize,
        cols: usize,
        bias: bool,
        class: TensorClass,
    ) -> LinearSpec {
        LinearSpec {
            weight: TensorSpec::new(
                format!("{prefix}.weight"),
                &[rows, cols],
                class,
                TensorKind::Linear,
            ),
            bias: bias.then(|| {
                TensorSpec::new(format!("{prefix}.bias"), &[rows], class, TensorKind::Bias)
            }),
        }
    }

    /// A norm weight `name` `[n]`.
    pub fn norm(name: String, n: usize, class: TensorClass) -> TensorSpec {
        TensorSpec::new(name, &[n], class, TensorKind::Norm)
    }

    /// A SwiGLU MLP `{prefix}.{gate,up,down}_proj` of intermediate size `inter`.
    pub fn mlp(prefix: &str, hidden: usize, inter: usize, class: TensorClass) -> MlpSpec {
        MlpSpec {
            gate: linear(&format!("{prefix}.gate_proj"), inter, hidden, false, class),
            up: linear(&format!("{prefix}.up_proj"), inter, hidden, false, class),
            down: linear(&format!("{prefix}.down_proj"), hidden, inter, false, class),
        }
    }

    /// The tensors outside the layers: embedding, final norm, lm_head (optional when tied).
    pub fn model(
        spec: &super::ModelSpec,
        layers: Vec<LayerSpec>,
        mtp: Vec<MtpSpec>,
    ) -> ModelTensors {
        let (v, h) = (spec.vocab_size, spec.hidden_size);
        let c = TensorClass::Dense;
        let lm_head = TensorSpec::new("lm_head.weight", &[v, h], c, TensorKind::OutputHead);
        ModelTensors {
            final_res: None,
            embed: TensorSpec::new(
                "model.embed_tokens.weight",
                &[v, h],
                c,
                TensorKind::Embedding,
            ),
            embed_norm: None,
            layers,
            final_norm: norm("model.norm.weight".into(), h, c),
            lm_head: if spec.tie_word_embeddings {
                lm_head.optional()
            } else {
                lm_head
            },
            mtp,
            final_query: None,
            hyper_head: None,
        }
    }

    /// A decoder layer `model.layers.{i}` with its two norms.
    pub fn layer(
        spec: &super::ModelSpec,
        i: usize,
        attention: AttentionSpec,
        ffn: FfnSpec,
        class: TensorClass,
    ) -> LayerSpec {
        let p = format!("model.layers.{i}");
        LayerSpec {
            attn_res: None,
            index: i,
            input_norm: norm(
                format!("{p}.input_layernorm.weight"),
                spec.hidden_size,
                class,
            ),
            attention,
            post_norm: norm(
                format!("{p}.post_attention_layernorm.weight"),
                spec.hidden_size,
                class,
            ),
            ffn,
            hyper: None,
        }
    }

    /// The GQA attention block `model.layers.{i}.self_attn` with `qk_norm`.
    pub fn gqa(spec: &super::ModelSpec, i: usize, qk_norm: QkNormSpec) -> AttentionSpec {
        let p = format!("model.layers.{i}.self_attn");
        let (h, b, c) = (spec.hidden_size, spec.attention_bias, TensorClass::Dense);
        let (qd, kvd) = (
            spec.num_heads * spec.head_dim,
            spec.num_kv_heads * spec.head_dim,
        );
        AttentionSpec::Gqa {
            q: linear(&format!("{p}.q_proj"), qd, h, b, c),
            k: linear(&format!("{p}.k_proj"), kvd, h, b, c),
            v: linear(&format!("{p}.v_proj"), kvd, h, b, c),
            o: linear(&format!("{p}.o_proj"), h, qd, b, c),
            qk_norm,
            sinks: None,
            gated: false,
        }
    }

    /// The softmax-routed MoE block of layer `i`: router `{block}.gate.weight`, experts
    /// `{block}.experts.E.{matrices}.weight`.
    pub fn softmax_moe(
        spec: &super::ModelSpec,
        i: usize,
        block: &str,
        matrices: [&'static str; 3],
    ) -> FfnSpec {
        let p = format!("model.layers.{i}.{block}");
        FfnSpec::Moe(MoeSpec {
            latent: None,
            hash_table: None,
            router: TensorSpec::new(
                format!("{p}.gate.weight"),
                &[spec.num_experts, spec.hidden_size],
                TensorClass::Dense,
                TensorKind::Router,
            ),
            router_bias: None,
            router_logit_bias: None,
            shared: None,
            shared_gate: None,
            experts: ExpertsSpec {
                layer: i as u32,
                count: spec.num_experts as u32,
                hidden: spec.hidden_size,
                intermediate: spec.moe_intermediate_size,
                class: TensorClass::RoutedExpert,
                prefix: format!("{p}.experts"),
                storage: ExpertStorage::PerExpert(matrices),
                biases: false,
            },
        })
    }
}

#[cfg(test)]
mod tests;
