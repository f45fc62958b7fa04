//! Kimi-Linear (`model_type: kimi_linear`; Kimi-Linear-48B-A3B), as transformers 5.25
//! `KimiLinearConfig` / `modeling_kimi_linear.py` reads the published config and checkpoint.
//!
//! - Layers: `layer_types` (transformers 5), else `linear_attn_config.kda_layers` and
//!   `.full_attn_layers` (1-based layer numbers, as published), else layer i is full attention
//!   when `i > 0 && i % 4 == 0`. A layer is MoE per `mlp_layer_types`, else from
//!   `first_k_dense_replace` (default 1) on; the others a dense SwiGLU `mlp.*` of
//!   `intermediate_size`.
//! - Kimi Delta Attention (`KimiLinearDeltaAttention`, [`DeltaRule::Kda`]), `self_attn.*`:
//!   `q_proj`, `k_proj`, `v_proj` then a causal depthwise convolution each (`q_conv1d`,
//!   `k_conv1d`, `v_conv1d`, `short_conv_kernel_size` taps) and SiLU, q/k L2-normalized (q
//!   scaled by `d^-0.5`), one log decay per key channel
//!   `g = -exp(A_log[h]) softplus(f_b(f_a(x)) + dt_bias)`, `beta = sigmoid(b_proj(x))`, the
//!   rule per head (`coli_kernels::kda`), the gated RMSNorm `o_norm(o) * sigmoid(g_b(g_a(x)))`,
//!   `o_proj`. `linear_attn_config.num_heads` heads of `.head_dim`.
//! - Full attention (`KimiLinearAttention`): DeepSeek-V3's MLA without RoPE (`mla_use_nope`:
//!   the `qk_rope_head_dim` part of the queries and of the shared key enters unrotated), softmax
//!   scale `(qk_nope_head_dim + qk_rope_head_dim)^-0.5`, `q_proj` (or the q LoRA when
//!   `q_lora_rank` is set).
//! - MoE (`KimiLinearMoE`, DeepSeek-V3's): grouped sigmoid routing with
//!   `block_sparse_moe.gate.e_score_correction_bias`, `routed_scaling_factor`, renormalized
//!   when `moe_renormalize`; `num_shared_experts` shared experts
//!   `block_sparse_moe.shared_experts.*`; routed experts `block_sparse_moe.experts.E.w1/w3/w2`.
//! - Config keys as published, or their transformers aliases (`attribute_map`): `num_experts`
//!   (`num_local_experts`), `num_experts_per_token` (`num_experts_per_tok`),
//!   `num_shared_experts` (`n_shared_experts`), `moe_renormalize` (`norm_topk_prob`),
//!   `num_expert_group` (`n_group`), `model_max_length` (`max_position_embeddings`).
//! - No MTP layer (the class has none; `num_nextn_predict_layers` above 0 is refused).

use super::build;
use super::deepseek_v3::{mla_attention, sigmoid_moe_named};
use super::json::Fields;
use super::mla::MlaSpec;
use super::qwen3_next::{linear_layer_types, DeltaRule};
use super::{
    AttentionSpec, AttnResQuerySpec, ExpertActivation, FfnSpec, GatedDeltaInput, GatedDeltaNetSpec,
    GatedDeltaSpec, LatentMoeSpec, LayerAttnResSpec, ModelSpec, ModelTensors, Routing, TensorClass,
    TensorKind, TensorSpec,
};
use crate::FormatError;

/// The first of `keys` that the config sets (published name first, then its alias), with the
/// key it was read from (for messages).
fn first_usize<'k>(
    f: &Fields<'_>,
    keys: &[&'k str],
) -> Result<Option<(usize, &'k str)>, FormatError> {
    for &k in keys {
        if let Some(v) = f.usize(k)? {
            return Ok(Some((v, k)));
        }
    }
    Ok(None)
}

/// Experts per token and the key that gave it: `num_experts_per_token` as published, else
/// `num_experts_per_tok`.
pub(crate) fn top_k(f: &Fields<'_>) -> Result<(usize, &'static str), FormatError> {
    first_usize(f, &["num_experts_per_token", "num_experts_per_tok"])?.ok_or_else(|| {
        f.err(format!(
            "missing field {}num_experts_per_token (or num_experts_per_tok)",
            f.prefix
        ))
    })
}

/// Per layer, whether it is a KDA layer (see the module doc for the precedence).
fn linear_layers(
    f: &Fields<'_>,
    lin: Option<&Fields<'_>>,
    n: usize,
) -> Result<Vec<bool>, FormatError> {
    let pre = f.prefix;
    if let Some(l) = linear_layer_types(f, n, "kimi_linear", &["full_attention"])? {
        return Ok(l);
    }
    // transformers falls back to its default pattern unless both lists are given; one list
    // without the other is a config mistake, not a request for the default.
    if let Some(l) = lin {
        let (kda, full) = (l.get("kda_layers"), l.get("full_attn_layers"));
        if kda.is_some() != full.is_some() {
            let (has, lacks) = if kda.is_some() {
                ("kda_layers", "full_attn_layers")
            } else {
                ("full_attn_layers", "kda_layers")
            };
            return Err(l.err(format!(
                "{p}{has} is given without {p}{lacks}: give both (1-based layer numbers) or neither (the default pattern: full attention on every 4th layer from layer 5)",
                p = l.prefix
            )));
        }
    }
    let lists = lin.and_then(|l| {
        l.get("kda_layers")
            .zip(l.get("full_attn_layers"))
            .map(|_| l)
    });
    let Some(l) = lists else {
        return Ok((0..n).map(|i| !(i > 0 && i % 4 == 0)).collect());
    };
    let mut kinds: Vec<Option<bool>> = vec![None; n];
    for (key, linear) in [("kda_layers", true), ("full_attn_layers", false)] {
        let Some(serde_json::Value::Array(a)) = l.get(key) else {
            return Err(l.err(format!("{}{key} must be a list of layer numbers", l.prefix)));
        };
        for v in a {
            let k = v
                .as_u64()
                .map(|k| k as usize)
                .filter(|&k| (1..=n).contains(&k));
            let Some(k) = k else {
                return Err(l.err(format!(
                    "{}{key} lists {v}: layer numbers are whole numbers 1..={n} (1-based, {pre}num_hidden_layers {n})",
                    l.prefix
                )));
            };
            match kinds[k - 1].replace(linear) {
                Some(was) if was == linear => {
                    return Err(l.err(format!("{}{key} lists layer {k} twice", l.prefix)))
                }
                Some(_) => {
                    return Err(l.err(format!(
                        "{}kda_layers and full_attn_layers both list layer {k} (each layer is one kind)",
                        l.prefix
                    )))
                }
                None => {}
            }
        }
    }
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            k.ok_or_else(|| {
                l.err(format!(
                    "{}kda_layers and full_attn_layers leave layer {} (1-based) out",
                    l.prefix,
                    i + 1
                ))
            })
        })
        .collect()
}

/// DeepSeek-V3's grouped sigmoid routing (`n_group` groups, `topk_group` kept, renormalized as
/// `s.norm_topk_prob`, times `scaling`), the group count checked against the expert count;
/// `group` and `experts_key` are the keys the counts came from (for the message).
pub(crate) fn grouped_sigmoid(
    f: &Fields<'_>,
    s: &mut ModelSpec,
    group: (usize, &str),
    topk_group: usize,
    experts_key: &str,
    scaling: f32,
) -> Result<(), FormatError> {
    let (n_group, group_key) = group;
    let pre = f.prefix;
    if !s.num_experts.is_multiple_of(n_group) || topk_group > n_group {
        return Err(f.err(format!(
            "{pre}{group_key} {n_group} must divide {pre}{experts_key} {} and be >= {pre}topk_group {topk_group}",
            s.num_experts
        )));
    }
    s.routing = Routing::GroupedSigmoid {
        n_group,
        topk_group,
        renormalize: s.norm_topk_prob,
        scaling,
    };
    Ok(())
}

/// Per layer, whether its feed-forward block is MoE: `mlp_layer_types` (`"dense"` /
/// `"sparse"`, one per layer) when given, else `default(i)`.
pub(crate) fn mlp_layer_types(
    f: &Fields<'_>,
    n: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>, FormatError> {
    let pre = f.prefix;
    match f.strings("mlp_layer_types")? {
        Some(t) if t.len() == n => t
            .iter()
            .map(|t| match *t {
                "sparse" => Ok(true),
                "dense" => Ok(false),
                o => Err(f.err(format!(
                    "{pre}mlp_layer_types entry {o:?} (\"dense\" or \"sparse\")"
                ))),
            })
            .collect(),
        Some(t) => Err(f.err(format!(
            "{pre}mlp_layer_types lists {} layers, {pre}num_hidden_layers is {n}",
            t.len()
        ))),
        None => Ok((0..n).map(default).collect()),
    }
}

/// KDA's heads, head dimension and convolution taps: `linear_attn_config.{num_heads, head_dim,
/// short_conv_kernel_size}`, which win over the top-level `linear_num_heads`, `linear_head_dim`,
/// `linear_conv_kernel_dim` (`KimiLinearConfig`, `Glm5NextTextConfig`); defaults
/// `default_heads`, 128, 4. A zero is refused naming the key it came from.
pub(crate) fn kda_dims(
    f: &Fields<'_>,
    lin: Option<&Fields<'_>>,
    default_heads: usize,
) -> Result<(usize, usize, usize), FormatError> {
    let read = |key: &'static str, top: &'static str, default: usize| {
        let nested = lin.map(|l| l.usize(key)).transpose()?.flatten();
        let (v, from) = match nested {
            Some(v) => (v, format!("{}{key}", lin.map_or("", |l| l.prefix))),
            None => (
                f.usize(top)?.unwrap_or(default),
                format!("{}{top}", f.prefix),
            ),
        };
        if v == 0 {
            return Err(f.err(format!("{from} is 0")));
        }
        Ok::<_, FormatError>(v)
    };
    Ok((
        read("num_heads", "linear_num_heads", default_heads)?,
        read("head_dim", "linear_head_dim", 128)?,
        read("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?,
    ))
}

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    let pre = f.prefix;
    let unsupported = |what: String| Err(FormatError::Unsupported(format!("kimi_linear {what}")));
    // Kimi K3's config class defaults `mla_use_nope` to false (RoPE), transformers' to true.
    let nope_default = s.wrapper.as_deref() != Some(K3_WRAPPER);
    if !f.bool("mla_use_nope")?.unwrap_or(nope_default) {
        return unsupported(format!(
            "with {pre}mla_use_nope false{} (RoPE in the MLA layers; the released models and transformers' class have none)",
            if nope_default { "" } else { " (Kimi K3's config class default when absent)" }
        ));
    }
    if let Some(a) = f.str("moe_router_activation_func")? {
        if a != "sigmoid" {
            return unsupported(format!(
                "with {pre}moe_router_activation_func {a:?} (only sigmoid)"
            ));
        }
    }
    if f.usize("moe_layer_freq")?.is_some_and(|v| v != 1) {
        return unsupported(format!(
            "with {pre}moe_layer_freq other than 1 (transformers' class does not read it)"
        ));
    }
    if f.bool("attention_bias")? == Some(true) {
        return unsupported(format!("with {pre}attention_bias true"));
    }
    let mtp = f.usize("num_nextn_predict_layers")?.unwrap_or(0);
    if mtp > 0 {
        return unsupported(format!(
            "with {pre}num_nextn_predict_layers {mtp} (the released model and transformers' class have no MTP layer)"
        ));
    }
    let lin = f.object("linear_attn_config", "linear_attn_config.");
    let full_rank_gate = match &lin {
        Some(l) => l.bool("use_full_rank_gate")?.unwrap_or(false),
        None => false,
    };
    let gate_lower_bound = match &lin {
        Some(l) => l.f64("gate_lower_bound")?.map(|v| v as f32),
        None => None,
    };
    if let Some(lb) = gate_lower_bound {
        if !(lb.is_finite() && lb < 0.0) {
            return Err(f.err(format!(
                "{pre}linear_attn_config.gate_lower_bound {lb} must be a negative number (the most negative log decay a step may take)"
            )));
        }
    }
    configure_k3(f, s)?;
    // Kimi K3's config class (the release's `configuration_kimi_k3.KimiLinearConfig`, Moonshot's)
    // has other defaults than transformers 5.25's `KimiLinearConfig`: a key a K3 config leaves
    // out takes the K3 class's value, so that it describes the model the release's code builds.
    let k3_class = s.wrapper.as_deref() == Some(K3_WRAPPER);
    let n = s.num_layers;
    let (num_experts, experts_key) =
        first_usize(f, &["num_experts", "num_local_experts"])?.unwrap_or((256, "num_experts"));
    s.num_experts = num_experts;
    s.moe_intermediate_size = match f.usize("moe_intermediate_size")? {
        Some(v) => v,
        None if k3_class => {
            return Err(f.err(format!(
                "missing field {pre}moe_intermediate_size (Kimi K3's config class has no default)"
            )))
        }
        None => 1024,
    };
    if f.get("intermediate_size").is_none() {
        s.intermediate_size = if k3_class { 11008 } else { 9216 };
    }
    if k3_class && f.get("rms_norm_eps").is_none() {
        s.rms_norm_eps = 1e-6;
    }
    s.max_position_embeddings = first_usize(f, &["model_max_length", "max_position_embeddings"])?
        .map_or(if k3_class { 4096 } else { 1_048_576 }, |v| v.0);
    s.norm_topk_prob = match f.bool("moe_renormalize")? {
        Some(b) => b,
        None => f.bool("norm_topk_prob")?.unwrap_or(true),
    };
    // Kimi K3's gate (`KimiMoEGate`, as DeepSeek-V3's official one) renormalizes only when it
    // picks more than one expert; transformers' Kimi-Linear always does.
    if k3_class && top_k(f)?.0 <= 1 {
        s.norm_topk_prob = false;
    }
    s.n_shared_experts = first_usize(f, &["num_shared_experts", "n_shared_experts"])?
        .map_or(usize::from(!k3_class), |v| v.0);
    let (n_group, group_key) =
        first_usize(f, &["num_expert_group", "n_group"])?.unwrap_or((1, "num_expert_group"));
    let n_group = n_group.max(1);
    let topk_group = f.usize("topk_group")?.unwrap_or(1).max(1);
    let scaling = f
        .f64("routed_scaling_factor")?
        .unwrap_or(if k3_class { 1.0 } else { 2.446 }) as f32;
    grouped_sigmoid(f, s, (n_group, group_key), topk_group, experts_key, scaling)?;
    let first_dense = f
        .usize("first_k_dense_replace")?
        .unwrap_or(usize::from(!k3_class));
    let mlp_sparse = mlp_layer_types(f, n, |i| i >= first_dense)?;
    s.moe_layers = mlp_sparse.iter().map(|&m| m && s.num_experts > 0).collect();
    let qk_nope_head_dim = f.usize("qk_nope_head_dim")?.unwrap_or(128);
    let qk_rope_head_dim = f.usize("qk_rope_head_dim")?.unwrap_or(64);
    let m = MlaSpec {
        q_lora_rank: f.usize("q_lora_rank")?,
        kv_lora_rank: match f.usize("kv_lora_rank")? {
            Some(v) => v,
            None if k3_class => {
                return Err(f.err(format!(
                    "missing field {pre}kv_lora_rank (Kimi K3's config class has no default)"
                )))
            }
            None => 512,
        },
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim: f.usize("v_head_dim")?.unwrap_or(128),
        // No RoPE: the theta is never used.
        rope_theta: 10_000.0,
        rope_interleave: false,
        nope: true,
        yarn: None,
        softmax_scale: ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5) as f32,
        latent_norm_eps: 1e-6,
        n_group,
        topk_group,
        routed_scaling_factor: scaling,
        n_shared_experts: s.n_shared_experts,
        first_k_dense_replace: first_dense,
        moe_layer_freq: 1,
        num_nextn_predict_layers: 0,
        mlp_sparse: Some(mlp_sparse),
        dsa: None,
        // A GGUF's split `attn_k_b` / `attn_v_b` (the converter's config for a kimi-k3 GGUF).
        kv_b_split: f.bool("mla_kv_b_split")?.unwrap_or(false),
    };
    for (key, v) in [
        ("kv_lora_rank", m.kv_lora_rank),
        ("qk_nope_head_dim", m.qk_nope_head_dim),
        ("v_head_dim", m.v_head_dim),
    ] {
        if v == 0 {
            return Err(f.err(format!("{pre}{key} is 0")));
        }
    }
    s.rope_theta = m.rope_theta;
    s.mla = Some(m);
    let (heads, head_dim, kernel) = kda_dims(f, lin.as_ref(), 32)?;
    s.gated_delta = Some(GatedDeltaSpec {
        rule: DeltaRule::Kda,
        linear_layers: linear_layers(f, lin.as_ref(), n)?,
        key_heads: heads,
        value_heads: heads,
        key_head_dim: head_dim,
        value_head_dim: head_dim,
        conv_kernel: kernel,
        gate_lower_bound,
        full_rank_gate,
        tiled_value_heads: false,
        split_qkvz: false,
    });
    Ok(())
}

/// The `model_type` of Kimi K3's multimodal wrapper, whose `text_config` is a `kimi_linear`.
pub(crate) const K3_WRAPPER: &str = "kimi_k3";

/// Kimi K3's additions to a Kimi-Linear language model (the release's `text_config`, which
/// says `kimi_linear`; its modeling file is the K3 version of `modeling_kimi_linear.py`).
/// Each is read where the config sets it, so a config without them is Kimi-Linear's:
///
/// - `hidden_act: situ` with `activation_situ_beta` (beta, default 1) and
///   `activation_situ_linear_beta` (lb; absent: the up branch as is, an infinite cap): every
///   MLP (dense, shared, routed experts) computes
///   `beta tanh(g / beta) sigmoid(g) * lb tanh(u / lb)` (`SituAndMul`) instead of SwiGLU;
/// - `attn_res_block_size`: attention residuals over blocks of that many layers
///   (`*_res_norm.weight` * `*_res_proj.weight` queries, `_apply_attn_res`);
/// - `routed_expert_hidden_size` L: the latent MoE (`routed_expert_down_proj` `[L, H]`,
///   `routed_expert_up_proj` `[H, L]`, `routed_expert_norm` `[L]` when
///   `latent_moe_use_norm`), the routed experts of hidden size L;
/// - `mla_use_output_gate`: the MLA layers' `self_attn.g_proj` sigmoid gate;
/// - `linear_attn_config.use_full_rank_gate` (KDA's `g_proj` `[Hv d, H]`, `A_log` `[Hv]`, published as `[head_dim]`) and
///   `.gate_lower_bound` (`g = lower_bound sigmoid(exp(A_log) (f + dt_bias))`), read by
///   `configure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KimiK3Spec {
    /// `attn_res_block_size`: layers per attention-residual block (None: plain residuals).
    pub attn_res_block: Option<usize>,
    /// `routed_expert_hidden_size` L (None: the routed experts read the hidden state).
    pub latent: Option<usize>,
    /// `latent_moe_use_norm`: the RMSNorm of the routed experts' sum before the up projection.
    pub latent_norm: bool,
    /// `mla_use_output_gate`.
    pub mla_output_gate: bool,
}

/// Reads the K3 keys of [`KimiK3Spec`] (and SiTU) into `s`.
fn configure_k3(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    let pre = f.prefix;
    if f.str("hidden_act")? == Some("situ") {
        let beta = match f.f64("activation_situ_beta")? {
            // `beta or 1.0`, as `_get_situ_activation_params` reads it.
            Some(b) if b != 0.0 => b as f32,
            _ => 1.0,
        };
        // None: the up branch as is (`SituAndMul`), an infinite cap.
        let lb = f
            .f64("activation_situ_linear_beta")?
            .map_or(f32::INFINITY, |v| v as f32);
        for (key, v) in [
            ("activation_situ_beta", beta),
            ("activation_situ_linear_beta", lb),
        ] {
            if v.is_nan() || v <= 0.0 {
                return Err(f.err(format!("{pre}{key} {v} must be a positive number")));
            }
        }
        let act = ExpertActivation::SoftcappedSwiglu {
            gate_cap: beta,
            up_cap: lb,
        };
        s.expert_activation = act;
        s.mlp_activation = Some(act);
    }
    let attn_res_block = f.usize("attn_res_block_size")?;
    if attn_res_block == Some(0) {
        return Err(f.err(format!(
            "{pre}attn_res_block_size is 0 (layers per attention-residual block; leave it out for none)"
        )));
    }
    let latent = f.usize("routed_expert_hidden_size")?;
    if latent == Some(0) {
        return Err(f.err(format!("{pre}routed_expert_hidden_size is 0")));
    }
    let k3 = KimiK3Spec {
        attn_res_block,
        latent,
        latent_norm: latent.is_some() && f.bool("latent_moe_use_norm")?.unwrap_or(false),
        mla_output_gate: f.bool("mla_use_output_gate")?.unwrap_or(false),
    };
    let plain = KimiK3Spec {
        attn_res_block: None,
        latent: None,
        latent_norm: false,
        mla_output_gate: false,
    };
    s.kimi_k3 = (k3 != plain).then_some(k3);
    Ok(())
}

/// The config key a Kimi K3 tensor needs set to be read, when the checkpoint has it but the
/// config does not set the key (a K3 checkpoint whose config lost a key would otherwise convert
/// into a different model, the tensor left out): `attn_res_block_size` for the
/// attention-residual vectors, `routed_expert_hidden_size` / `latent_moe_use_norm` for the
/// latent MoE's, `mla_use_output_gate` for an MLA layer's `g_proj`. None when the spec reads it
/// or it is no K3 tensor.
pub(crate) fn key_to_read(s: &ModelSpec, name: &str) -> Option<&'static str> {
    let k3 = s.kimi_k3;
    let res = name.ends_with("_res_norm.weight") || name.ends_with("_res_proj.weight");
    if res && k3.is_none_or(|k| k.attn_res_block.is_none()) {
        return Some("attn_res_block_size");
    }
    if name.ends_with(".routed_expert_norm.weight") && k3.is_none_or(|k| !k.latent_norm) {
        return Some(if k3.is_some_and(|k| k.latent.is_some()) {
            "latent_moe_use_norm"
        } else {
            "routed_expert_hidden_size"
        });
    }
    if name.contains(".block_sparse_moe.routed_expert_") && k3.is_none_or(|k| k.latent.is_none()) {
        return Some("routed_expert_hidden_size");
    }
    let mla = super::layer_of(name).is_some_and(|l| {
        s.gated_delta
            .as_ref()
            .is_some_and(|g| !g.linear_layers.get(l as usize).copied().unwrap_or(true))
    });
    if mla && name.ends_with(".self_attn.g_proj.weight") && k3.is_none_or(|k| !k.mla_output_gate) {
        return Some("mla_use_output_gate");
    }
    None
}

/// Whether a config declares compressed-tensors MXFP4 weights (`quantization_config`
/// `quant_method: compressed-tensors`, `format: mxfp4-pack-quantized`, at the top level or in
/// `text_config`): Kimi K3's routed experts, each matrix a `weight_packed` U8 `[rows, cols/2]`
/// (e2m1 codes, element 2i in the low nibble) with its `weight_scale` U8 `[rows, cols/32]`
/// (e8m0), MXFP4's bits.
pub fn declares_mxfp4_pack(config: &serde_json::Value) -> bool {
    [
        config,
        config
            .get("text_config")
            .unwrap_or(&serde_json::Value::Null),
    ]
    .iter()
    .filter_map(|c| c.get("quantization_config"))
    .any(|q| {
        q.get("quant_method").and_then(serde_json::Value::as_str) == Some("compressed-tensors")
            && q.get("format").and_then(serde_json::Value::as_str) == Some("mxfp4-pack-quantized")
    })
}

/// The KDA block of layer `i`: `model.layers.{i}.self_attn.*` (module doc), its `A_log` of
/// shape `a_log` (Kimi-Linear `[1, 1, Hv, 1]`, GLM-5.3-Flash `[Hv]`).
pub(crate) fn kda_attention(
    s: &ModelSpec,
    g: &GatedDeltaSpec,
    i: usize,
    a_log: &[usize],
) -> AttentionSpec {
    let p = format!("model.layers.{i}.self_attn");
    let (h, hv, d, c) = (
        s.hidden_size,
        g.value_heads,
        g.key_head_dim,
        TensorClass::Dense,
    );
    let lin = |name: &str, rows: usize, cols: usize| {
        build::linear(&format!("{p}.{name}"), rows, cols, false, c)
    };
    let conv = |name: &str| {
        TensorSpec::new(
            format!("{p}.{name}.weight"),
            &[hv * d, 1, g.conv_kernel],
            c,
            TensorKind::Conv,
        )
    };
    AttentionSpec::GatedDeltaNet(Box::new(GatedDeltaNetSpec {
        input: GatedDeltaInput::Kda {
            q: lin("q_proj", hv * d, h),
            k: lin("k_proj", hv * d, h),
            v: lin("v_proj", hv * d, h),
            f_a: lin("f_a_proj", d, h),
            f_b: lin("f_b_proj", hv * d, d),
            b: lin("b_proj", hv, h),
            g_a: (!g.full_rank_gate).then(|| lin("g_a_proj", d, h)),
            g_b: if g.full_rank_gate {
                lin("g_proj", hv * d, h)
            } else {
                lin("g_b_proj", hv * d, d)
            },
        },
        convs: vec![conv("q_conv1d"), conv("k_conv1d"), conv("v_conv1d")],
        dt_bias: TensorSpec::new(format!("{p}.dt_bias"), &[hv * d], c, TensorKind::Bias),
        a_log: {
            let t = TensorSpec::new(format!("{p}.A_log"), a_log, c, TensorKind::Bias);
            // K3 publishes `head_dim` values (128) for 96 heads; one per head is read.
            if g.full_rank_gate && g.key_head_dim > g.value_heads {
                t.padded_to(g.key_head_dim)
            } else {
                t
            }
        },
        norm: build::norm(format!("{p}.o_norm.weight"), d, c),
        out: lin("o_proj", h, hv * d),
    }))
}

/// A Kimi K3 attention-residual query `{prefix}_res_{norm,proj}.weight` (`[H]`, `[1, H]`).
fn res_query(prefix: &str, h: usize, optional: bool) -> AttnResQuerySpec {
    let c = TensorClass::Dense;
    let mut norm = build::norm(format!("{prefix}_res_norm.weight"), h, c);
    let mut proj = TensorSpec::new(
        format!("{prefix}_res_proj.weight"),
        &[1, h],
        c,
        TensorKind::Mixing,
    );
    if optional {
        norm = norm.optional();
        proj = proj.optional();
    }
    AttnResQuerySpec { norm, proj }
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let g = s.gated_delta.as_ref().expect("configured");
    let m = s.mla.as_ref().expect("configured");
    let k3 = s.kimi_k3;
    let c = TensorClass::Dense;
    let h = s.hidden_size;
    // Kimi-Linear pads A_log to `[1, 1, Hv, 1]`; K3's is a plain `[Hv]`.
    let a_log: &[usize] = if g.full_rank_gate {
        &[g.value_heads]
    } else {
        &[1, 1, g.value_heads, 1]
    };
    let layers = (0..s.num_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let attention = if g.linear_layers[i] {
                kda_attention(s, g, i, a_log)
            } else {
                let mut a = mla_attention(s, m, i, c, None);
                if let (AttentionSpec::Mla { gate, .. }, Some(true)) =
                    (&mut a, k3.map(|k| k.mla_output_gate))
                {
                    let rows = s.num_heads * m.v_head_dim;
                    *gate = Some(Box::new(build::linear(
                        &format!("{p}.self_attn.g_proj"),
                        rows,
                        h,
                        false,
                        c,
                    )));
                }
                a
            };
            let ffn = if s.is_moe_layer(i) {
                let mut ffn = sigmoid_moe_named(s, i, c, "block_sparse_moe", ["w1", "w3", "w2"]);
                if let (FfnSpec::Moe(moe), Some(l)) = (&mut ffn, k3.and_then(|k| k.latent)) {
                    let b = format!("{p}.block_sparse_moe");
                    moe.experts.hidden = l;
                    moe.latent = Some(Box::new(LatentMoeSpec {
                        down: build::linear(
                            &format!("{b}.routed_expert_down_proj"),
                            l,
                            h,
                            false,
                            c,
                        ),
                        up: build::linear(&format!("{b}.routed_expert_up_proj"), h, l, false, c),
                        norm: k3
                            .is_some_and(|k| k.latent_norm)
                            .then(|| build::norm(format!("{b}.routed_expert_norm.weight"), l, c)),
                    }));
                }
                ffn
            } else {
                FfnSpec::Dense(build::mlp(&format!("{p}.mlp"), h, s.intermediate_size, c))
            };
            let mut layer = build::layer(s, i, attention, ffn, c);
            if k3.is_some_and(|k| k.attn_res_block.is_some()) {
                layer.attn_res = Some(Box::new(LayerAttnResSpec {
                    attn: res_query(&format!("{p}.self_attention"), h, i == 0),
                    mlp: res_query(&format!("{p}.mlp"), h, false),
                }));
            }
            layer
        })
        .collect();
    let mut t = build::model(s, layers, vec![]);
    if k3.is_some_and(|k| k.attn_res_block.is_some()) {
        t.final_res = Some(res_query("model.output_attn", h, false));
    }
    t
}
