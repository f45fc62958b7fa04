//! Qwen3-Next (`model_type: qwen3_next`; Qwen3-Next-80B-A3B), as transformers 5.25
//! `Qwen3NextConfig` / `modeling_qwen3_next.py`.
//!
//! - Layers: `layer_types` (or, in the published configs, `full_attention_interval`, default
//!   4: layer i is full attention when `(i + 1) % interval == 0`) marks each layer
//!   `linear_attention` (a Gated DeltaNet, [`GatedDeltaSpec`]) or `full_attention`. A layer is
//!   MoE when not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`, else a dense
//!   SwiGLU of `intermediate_size`.
//! - Gated DeltaNet (`Qwen3NextGatedDeltaNet`): `in_proj_qkvz` / `in_proj_ba` (rows grouped per
//!   key head), a causal depthwise convolution of `linear_conv_kernel_dim` taps over `[q|k|v]`
//!   then SiLU, L2-normalized q and k (q scaled by `dk^-0.5`), `beta = sigmoid(b)`,
//!   `g = -exp(A_log) softplus(a + dt_bias)`, the gated delta rule per value head
//!   (`coli_kernels::gated_delta`), a gated RMSNorm (`norm(o) * w * silu(z)`), `out_proj`.
//! - Full attention (`Qwen3NextAttention`): GQA with an output gate (`q_proj` holds each
//!   head's query then its gate; `o_proj(attn * sigmoid(gate))`), per-head q/k RMSNorm,
//!   partial RoPE (`partial_rotary_factor`, default 0.25), default theta 1e4.
//! - MoE (`Qwen3NextSparseMoeBlock`): softmax over all experts, top-k, renormalized when
//!   `norm_topk_prob` (default true); plus one shared expert of
//!   `shared_expert_intermediate_size` scaled by `sigmoid(shared_expert_gate . x)`.
//! - Every RMSNorm but the gated one multiplies by `1 + w` (`Qwen3NextRMSNorm`,
//!   [`ModelSpec::zero_centered_norms`]).
//! - MTP: `num_nextn_predict_layers` (default 1, as vLLM reads it; the published config has
//!   none) layers `mtp.*` (`mtp_spec`: vLLM's `qwen3_next_mtp.py`); at most one.

use super::build;
use super::json::Fields;
use super::{
    gqa_rope_theta, partial_rotary_dim, AttentionSpec, ExpertStorage, ExpertsSpec, Family, FfnSpec,
    GatedDeltaInput, GatedDeltaNetSpec, LayerSpec, ModelSpec, ModelTensors, MoeSpec, MtpSpec,
    QkNormSpec, Routing, TensorClass, TensorKind, TensorSpec,
};
use crate::FormatError;

/// Which gated delta rule a hybrid model's linear-attention layers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeltaRule {
    /// The Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6): one log decay per value head and token,
    /// output gate `silu(z)` (`coli_kernels::gated_delta`).
    GatedDeltaNet,
    /// Kimi Delta Attention (Kimi-Linear; GLM-5.3-Flash and Kimi K3 build on it): one log
    /// decay per key channel and token, output gate `sigmoid(g)` (`coli_kernels::kda`).
    Kda,
}

/// The gated delta rule layers of a hybrid model: their rule, heads and which layers they are.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedDeltaSpec {
    /// The rule (and so the layer's tensors: [`super::GatedDeltaInput`]).
    pub rule: DeltaRule,
    /// Per main layer: whether it is a linear-attention (`linear_attention`) layer.
    pub linear_layers: Vec<bool>,
    /// Key (and query) heads `Hk` (`linear_num_key_heads`).
    pub key_heads: usize,
    /// Value heads `Hv` (`linear_num_value_heads`), a multiple of `Hk`: value head h reads key
    /// head `h / (Hv / Hk)` (grouped, the checkpoints' order), or `h % Hk` when
    /// [`GatedDeltaSpec::tiled_value_heads`].
    pub value_heads: usize,
    /// Key head dimension `dk` (`linear_key_head_dim`).
    pub key_head_dim: usize,
    /// Value head dimension `dv` (`linear_value_head_dim`).
    pub value_head_dim: usize,
    /// Taps of the short convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// KDA's safe forget gate (GLM-5.3-Flash's `linear_lower_bound` / `gate_lower_bound`):
    /// `g = lower_bound * sigmoid(exp(A_log) (f + dt_bias))` instead of
    /// `-exp(A_log) softplus(f + dt_bias)`; None for Gated DeltaNet and Kimi-Linear.
    pub gate_lower_bound: Option<f32>,
    /// KDA's full-rank output gate (Kimi K3's `use_full_rank_gate`: `g_proj` `[Hv d, H]`, its
    /// `A_log` `[Hv]`) instead of the low-rank `g_b(g_a(x))`.
    pub full_rank_gate: bool,
    /// The value heads in llama.cpp's tiled order (config key `linear_value_heads_tiled`, which
    /// coli-convert writes for a `qwen35moe` GGUF): value head `h` reads key head `h % Hk`.
    /// llama.cpp's `Qwen3_5MoeTextModel` reorders every value-head tensor (`in_proj_qkv`'s v
    /// rows, `in_proj_z`, `in_proj_b`, `in_proj_a`, `dt_bias`, `A_log`, the convolution's v
    /// channels, `out_proj`'s columns) from grouped `[G0_v0, G0_v1, G1_v0, ...]` to tiled
    /// `[G0_v0, G1_v0, ..., G0_v1, ...]`: the same heads relabelled, so only the key head a
    /// value head reads changes (quantized `out_proj` columns cannot be moved back without
    /// requantizing).
    pub tiled_value_heads: bool,
    /// Qwen3-Next's `in_proj_qkvz` held as llama.cpp's converter splits it (config key
    /// `linear_attn_split_qkvz`): `in_proj_qkv` `[q | k | v]` and `in_proj_z`, with
    /// `in_proj_ba` as published ([`GatedDeltaInput::SplitQkvz`]).
    pub split_qkvz: bool,
}

/// A decode pass whose start is a multiple of this many positions keeps a checkpoint of each
/// Gated DeltaNet layer's state; prefill chunks keep one at every chunk start (the engine's
/// `layers::gated_delta`).
pub const CHECKPOINT_EVERY: usize = 256;

/// Checkpoints a Gated DeltaNet layer keeps per sequence at most (the oldest dropped).
pub const MAX_CHECKPOINTS: usize = 4;

impl GatedDeltaSpec {
    /// f32 values one sequence holds at most in one Gated DeltaNet layer, whatever its length:
    /// the recurrent state, the convolution inputs kept (the last `K - 1`, plus the slack and
    /// trim chunk every layer that drops rows keeps: [`super::inkling::KV_SLACK`],
    /// [`super::inkling::KV_TRIM_CHUNK`]), [`MAX_CHECKPOINTS`] checkpoints and the copy a
    /// pass pins at its start (a state and `K - 1` convolution rows each). A verification
    /// pass holds one more state per row until the next pass (transient, not counted).
    pub fn held_values(&self) -> usize {
        let state = self.value_heads * self.key_head_dim * self.value_head_dim;
        let c = self.conv_channels();
        let rows = self.conv_kernel - 1 + super::inkling::KV_SLACK + super::inkling::KV_TRIM_CHUNK;
        state + rows * c + (MAX_CHECKPOINTS + 1) * (state + (self.conv_kernel - 1) * c)
    }

    /// Gated DeltaNet layers.
    pub fn linear_layer_count(&self) -> usize {
        self.linear_layers.iter().filter(|&&l| l).count()
    }

    /// Channels of the short convolution: `[q | k | v]`, `2 Hk dk + Hv dv`.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// f32 values of one sequence's state in one layer: the recurrent state
    /// (`Hv x dk x dv`) and the convolution's last `K - 1` inputs (`(K - 1) x C`). Constant in
    /// the context length.
    pub fn state_values(&self) -> usize {
        self.value_heads * self.key_head_dim * self.value_head_dim
            + (self.conv_kernel - 1) * self.conv_channels()
    }
}

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = f.usize("num_experts")?.unwrap_or(512);
    s.moe_intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(512);
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(true);
    s.routing = Routing::SoftmaxTopK {
        renormalize: s.norm_topk_prob,
    };
    configure_hybrid(f, s, Family::Qwen3Next)?;
    if let Some(g) = s.gated_delta.as_mut() {
        g.split_qkvz = f.bool("linear_attn_split_qkvz")?.unwrap_or(false);
    }
    s.moe_layers = super::qwen3_moe::moe_layers(f, s.num_layers, s.num_experts)?;
    check_shared(f, s)
}

/// What Qwen3-Next and Qwen3.5-MoE read alike: no attention bias, RoPE theta and the partial
/// rotary factor (default 0.25), zero-centred norms, one shared expert of
/// `shared_expert_intermediate_size` (default 512), the MTP depth (Qwen3-Next
/// `num_nextn_predict_layers`, Qwen3.5 `mtp_num_hidden_layers`, default 1), the layer kinds (`layer_types`, else
/// `full_attention_interval`) and the Gated DeltaNet dimensions ([`GatedDeltaSpec`]). Where
/// the config leaves them out, the attention shape takes both configs' defaults
/// (`Qwen3NextConfig`, `Qwen3_5MoeTextConfig`): `num_key_value_heads` 2, `head_dim` 256,
/// `max_position_embeddings` 32768, not the generic `num_attention_heads` / `hidden / heads`.
pub(crate) fn configure_hybrid(
    f: &Fields<'_>,
    s: &mut ModelSpec,
    family: Family,
) -> Result<(), FormatError> {
    let name = family.name();
    let pre = f.prefix;
    if f.get("num_key_value_heads").is_none() {
        s.num_kv_heads = 2;
        if !s.num_heads.is_multiple_of(2) {
            return Err(f.err(format!(
                "{pre}num_attention_heads {} must be a multiple of num_key_value_heads 2 (the {name} default; the config gives none)",
                s.num_heads
            )));
        }
    }
    if f.get("head_dim").is_none() {
        s.head_dim = 256;
    }
    if f.get("max_position_embeddings").is_none() {
        s.max_position_embeddings = 32768;
    }
    let mtp_key = match family {
        Family::Qwen35Moe => "mtp_num_hidden_layers",
        _ => "num_nextn_predict_layers",
    };
    s.num_mtp_layers = f.usize(mtp_key)?.unwrap_or(1);
    if s.num_mtp_layers > 1 {
        return Err(f.err(format!(
            "{pre}{mtp_key} {}: coli runs at most one MTP layer",
            s.num_mtp_layers
        )));
    }
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    if s.attention_bias {
        return Err(FormatError::Unsupported(format!(
            "{name} with attention_bias true (the released models have none)"
        )));
    }
    s.rope_theta = gqa_rope_theta(f, family)?;
    s.rotary_dim = partial_rotary_dim(f, s.head_dim, 0.25)?;
    // A GGUF's norms hold `1 + w` already (llama.cpp's converter adds the one; coli-convert
    // writes `zero_centered_norms: false` for them).
    s.zero_centered_norms = f.bool("zero_centered_norms")?.unwrap_or(true);
    s.n_shared_experts = 1;
    s.shared_expert_intermediate_size = f.usize("shared_expert_intermediate_size")?.unwrap_or(512);
    let n = s.num_layers;
    let linear_layers: Vec<bool> = match linear_layer_types(f, n, name, &["full_attention"])? {
        Some(l) => l,
        None => {
            let interval = f.usize("full_attention_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(f.err(format!("{pre}full_attention_interval is 0")));
            }
            (0..n).map(|i| !(i + 1).is_multiple_of(interval)).collect()
        }
    };
    let g = GatedDeltaSpec {
        rule: DeltaRule::GatedDeltaNet,
        linear_layers,
        key_heads: f.usize("linear_num_key_heads")?.unwrap_or(16),
        value_heads: f.usize("linear_num_value_heads")?.unwrap_or(32),
        key_head_dim: f.usize("linear_key_head_dim")?.unwrap_or(128),
        value_head_dim: f.usize("linear_value_head_dim")?.unwrap_or(128),
        conv_kernel: f.usize("linear_conv_kernel_dim")?.unwrap_or(4),
        gate_lower_bound: None,
        full_rank_gate: false,
        tiled_value_heads: f.bool("linear_value_heads_tiled")?.unwrap_or(false),
        split_qkvz: false,
    };
    for (key, v) in [
        ("linear_num_key_heads", g.key_heads),
        ("linear_num_value_heads", g.value_heads),
        ("linear_key_head_dim", g.key_head_dim),
        ("linear_value_head_dim", g.value_head_dim),
        ("linear_conv_kernel_dim", g.conv_kernel),
    ] {
        if v == 0 {
            return Err(f.err(format!("{pre}{key} is 0")));
        }
    }
    if !g.value_heads.is_multiple_of(g.key_heads) {
        return Err(f.err(format!(
            "{pre}linear_num_value_heads {} must be a multiple of {pre}linear_num_key_heads {}",
            g.value_heads, g.key_heads
        )));
    }
    s.gated_delta = Some(g);
    Ok(())
}

/// `layer_types` of a hybrid model, when the config has it: per layer, whether it is
/// `linear_attention` (else one of `full`: `full_attention`, and GLM-5.3-Flash's
/// `indexed_attention`); `name` names the family in the errors.
///
/// # Errors
/// [`FormatError::Config`] for a list of another length than `n` or another layer type.
pub(crate) fn linear_layer_types(
    f: &Fields<'_>,
    n: usize,
    name: &str,
    full: &[&str],
) -> Result<Option<Vec<bool>>, FormatError> {
    let pre = f.prefix;
    let Some(types) = f.strings("layer_types")? else {
        return Ok(None);
    };
    if types.len() != n {
        return Err(f.err(format!(
            "{pre}layer_types lists {} layers, {pre}num_hidden_layers is {n}",
            types.len()
        )));
    }
    types
        .iter()
        .map(|t| match *t {
            "linear_attention" => Ok(true),
            t if full.contains(&t) => Ok(false),
            other => Err(f.err(format!(
                "{pre}layer_types: {other:?} ({name} has linear_attention and {} layers)",
                full.join(" / ")
            ))),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A model with MoE layers needs its shared expert's width.
pub(crate) fn check_shared(f: &Fields<'_>, s: &ModelSpec) -> Result<(), FormatError> {
    if s.moe_layers.iter().any(|&m| m) && s.shared_expert_intermediate_size == 0 {
        return Err(f.err(format!("{}shared_expert_intermediate_size is 0", f.prefix)));
    }
    Ok(())
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    hybrid_tensors(s, fused_input)
}

/// Qwen3-Next's grouped projections (`in_proj_qkvz`, `in_proj_ba`), or `in_proj_qkvz` split
/// as llama.cpp writes it ([`GatedDeltaSpec::split_qkvz`]).
fn fused_input(p: &str, g: &GatedDeltaSpec, h: usize) -> GatedDeltaInput {
    let (kd, vd) = (
        g.key_heads * g.key_head_dim,
        g.value_heads * g.value_head_dim,
    );
    let c = TensorClass::Dense;
    if g.split_qkvz {
        return GatedDeltaInput::SplitQkvz {
            qkv: build::linear(&format!("{p}.in_proj_qkv"), g.conv_channels(), h, false, c),
            z: build::linear(&format!("{p}.in_proj_z"), vd, h, false, c),
            ba: build::linear(&format!("{p}.in_proj_ba"), 2 * g.value_heads, h, false, c),
        };
    }
    GatedDeltaInput::Fused {
        qkvz: build::linear(&format!("{p}.in_proj_qkvz"), 2 * kd + 2 * vd, h, false, c),
        ba: build::linear(&format!("{p}.in_proj_ba"), 2 * g.value_heads, h, false, c),
    }
}

/// The tensors of a hybrid model (Qwen3-Next, Qwen3.5-MoE): Gated DeltaNet layers whose input
/// projections `input(prefix, dims, H)` gives, gated GQA layers, MoE layers with a gated
/// shared expert (dense SwiGLU layers where [`ModelSpec::is_moe_layer`] is false), and the MTP
/// layer ([`mtp_spec`]).
pub(crate) fn hybrid_tensors(
    s: &ModelSpec,
    input: fn(&str, &GatedDeltaSpec, usize) -> GatedDeltaInput,
) -> ModelTensors {
    let g = s.gated_delta.as_ref().expect("configured");
    let layers = (0..s.num_layers)
        .map(|i| {
            let kind = LayerKind {
                linear: g.linear_layers[i],
                moe: s.is_moe_layer(i),
            };
            hybrid_layer(
                s,
                input,
                i,
                &format!("model.layers.{i}"),
                kind,
                TensorClass::Dense,
            )
        })
        .collect();
    let mtp = (0..s.num_mtp_layers)
        .map(|k| mtp_spec(s, input, k))
        .collect();
    build::model(s, layers, mtp)
}

/// Which attention and feed-forward block a hybrid layer has.
#[derive(Clone, Copy)]
struct LayerKind {
    /// A Gated DeltaNet, else gated full attention.
    linear: bool,
    /// MoE with a gated shared expert, else a dense SwiGLU.
    moe: bool,
}

/// Decoder layer `index` with tensors named `{p}.*` of `class` (Dense, or Mtp for the MTP layer,
/// whose routed experts are then of class Mtp too).
fn hybrid_layer(
    s: &ModelSpec,
    input: fn(&str, &GatedDeltaSpec, usize) -> GatedDeltaInput,
    index: usize,
    p: &str,
    kind: LayerKind,
    c: TensorClass,
) -> LayerSpec {
    let g = s.gated_delta.as_ref().expect("configured");
    let h = s.hidden_size;
    let attention = if kind.linear {
        let p = format!("{p}.linear_attn");
        let vd = g.value_heads * g.value_head_dim;
        AttentionSpec::GatedDeltaNet(Box::new(GatedDeltaNetSpec {
            input: input(&p, g, h),
            convs: vec![TensorSpec::new(
                format!("{p}.conv1d.weight"),
                &[g.conv_channels(), 1, g.conv_kernel],
                c,
                TensorKind::Conv,
            )],
            dt_bias: TensorSpec::new(
                format!("{p}.dt_bias"),
                &[g.value_heads],
                c,
                TensorKind::Bias,
            ),
            a_log: TensorSpec::new(format!("{p}.A_log"), &[g.value_heads], c, TensorKind::Bias),
            norm: build::norm(format!("{p}.norm.weight"), g.value_head_dim, c),
            out: build::linear(&format!("{p}.out_proj"), h, vd, false, c),
        }))
    } else {
        let p = format!("{p}.self_attn");
        let (qd, kvd) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        AttentionSpec::Gqa {
            // Each head's query, then its output gate.
            q: build::linear(&format!("{p}.q_proj"), 2 * qd, h, false, c),
            k: build::linear(&format!("{p}.k_proj"), kvd, h, false, c),
            v: build::linear(&format!("{p}.v_proj"), kvd, h, false, c),
            o: build::linear(&format!("{p}.o_proj"), h, qd, false, c),
            qk_norm: QkNormSpec::PerHead {
                q: build::norm(format!("{p}.q_norm.weight"), s.head_dim, c),
                k: build::norm(format!("{p}.k_norm.weight"), s.head_dim, c),
            },
            sinks: None,
            gated: true,
        }
    };
    let m = format!("{p}.mlp");
    let ffn = if kind.moe {
        FfnSpec::Moe(MoeSpec {
            latent: None,
            hash_table: None,
            router: TensorSpec::new(
                format!("{m}.gate.weight"),
                &[s.num_experts, h],
                c,
                TensorKind::Router,
            ),
            router_bias: None,
            router_logit_bias: None,
            shared: Some(Box::new(build::mlp(
                &format!("{m}.shared_expert"),
                h,
                s.shared_expert_intermediate_size,
                c,
            ))),
            shared_gate: Some(TensorSpec::new(
                format!("{m}.shared_expert_gate.weight"),
                &[1, h],
                c,
                TensorKind::Router,
            )),
            experts: ExpertsSpec {
                layer: index as u32,
                count: s.num_experts as u32,
                hidden: h,
                intermediate: s.moe_intermediate_size,
                class: if c == TensorClass::Mtp {
                    TensorClass::Mtp
                } else {
                    TensorClass::RoutedExpert
                },
                prefix: format!("{m}.experts"),
                storage: ExpertStorage::PerExpert(["gate_proj", "up_proj", "down_proj"]),
                biases: false,
            },
        })
    } else {
        FfnSpec::Dense(build::mlp(&m, h, s.intermediate_size, c))
    };
    LayerSpec {
        attn_res: None,
        index,
        input_norm: build::norm(format!("{p}.input_layernorm.weight"), h, c),
        attention,
        post_norm: build::norm(format!("{p}.post_attention_layernorm.weight"), h, c),
        ffn,
        hyper: None,
    }
}

/// MTP layer `k` as vLLM's `qwen3_next_mtp.py` / `qwen3_5_mtp.py` run it (transformers 5.25
/// has no MTP module for these families): `mtp.pre_fc_norm_embedding` (the `enorm`) of the
/// next token's main embedding and `mtp.pre_fc_norm_hidden` (the `hnorm`) of the main model's
/// hidden state after `model.norm`, concatenated embedding first, `mtp.fc` `[H, 2H]`, a
/// full-attention MoE decoder layer `mtp.layers.{k}` (decoder layer index
/// `num_hidden_layers + k`, its own KV cache), `mtp.norm`, the main `lm_head`. A chained draft
/// step feeds back the output after `mtp.norm` (vLLM's forward returns it normed). Every norm
/// is zero-centred like the main model's.
fn mtp_spec(
    s: &ModelSpec,
    input: fn(&str, &GatedDeltaSpec, usize) -> GatedDeltaInput,
    k: usize,
) -> MtpSpec {
    let (h, c) = (s.hidden_size, TensorClass::Mtp);
    // vLLM builds the layer as decoder layer 0 (its prefix `mtp.layers.0`): MoE where layer 0
    // is (every released config: all layers MoE).
    let kind = LayerKind {
        linear: false,
        moe: s.is_moe_layer(0),
    };
    MtpSpec {
        layer: hybrid_layer(
            s,
            input,
            s.num_layers + k,
            &format!("mtp.layers.{k}"),
            kind,
            c,
        ),
        embed: None,
        enorm: build::norm("mtp.pre_fc_norm_embedding.weight".into(), h, c),
        hnorm: build::norm("mtp.pre_fc_norm_hidden.weight".into(), h, c),
        eh_proj: build::linear("mtp.fc", h, 2 * h, false, c),
        head_norm: Some(build::norm("mtp.norm.weight".into(), h, c)),
        head: None,
        hidden_first: false,
        chain_normed: true,
    }
}
