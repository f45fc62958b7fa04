//! GLM-5.3-Flash (`model_type: glm5_next`, its language model `text_config` of type
//! `glm5_next_text`), as transformers 5.25 `Glm5NextTextConfig` / `modeling_glm5_next.py`
//! read the published config and checkpoint:
//!
//! - Residual: `hc_mult` streams of H values (manifold-constrained hyper-connections,
//!   [`HyperSpec`]); each layer has two hyper-connections, `hc_attn_{fn,base,scale}` and
//!   `hc_ffn_{fn,base,scale}` ([`super::LayerHyperSpec`]); the final hidden state is the mean of
//!   the streams (`Glm5NextTextHyperHead`), then `model.norm`, `lm_head`.
//! - Layers: `layer_types` (`"linear_attention"`, or `"full_attention"` /
//!   `"indexed_attention"` for a DSA layer), else layer i is DSA when `i % 4 == 3`. A layer is
//!   MoE per `mlp_layer_types`, else from layer 3 on (transformers ignores
//!   `first_k_dense_replace`); the others a dense SwiGLU `mlp.*` of `intermediate_size`.
//! - Kimi Delta Attention layers (`Glm5NextTextLinearAttention`): Kimi-Linear's
//!   ([`super::kimi_linear`]: `{q,k,v}_proj`, `{q,k,v}_conv1d`, `f_a_proj`/`f_b_proj`,
//!   `b_proj`, `g_a_proj`/`g_b_proj`, `o_norm`, `o_proj`; `A_log` `[Hv]`) with the safe forget
//!   gate `g = lower_bound * sigmoid(exp(A_log) (f + dt_bias))` (`linear_attn_config.gate_lower_bound`
//!   or `linear_lower_bound`, default -5; null with `safe_gate` false: Kimi-Linear's softplus gate).
//! - DSA layers (`Glm5NextTextAttention`): MLA without RoPE (`qk_rope_head_dim` must be 0), the q
//!   LoRA required, softmax scale `qk_nope_head_dim^-0.5`, and the k-pool lightning indexer
//!   (`self_attn.indexer.{wq_b, wk, k_norm, weights_proj, index_kpool_compress_gate,
//!   index_kpool_compress_ape}`, [`super::mla::KPool`]) on `"full"` layers of `indexer_types`;
//!   a `"shared"` layer reuses the selection of the layer right before it, which must be a full
//!   DSA layer (transformers raises otherwise).
//! - MoE (`Glm5NextTextMoE`): grouped sigmoid routing with `mlp.gate.e_score_correction_bias`,
//!   `routed_scaling_factor`, `norm_topk_prob`; `n_shared_experts` shared experts
//!   `mlp.shared_experts.*`; routed experts `mlp.experts.E.{gate,up,down}_proj` as published.
//!   Every SwiGLU (dense,
//!   shared, routed) is clamped: `silu(min(gate, swiglu_limit)) * clamp(up, ±swiglu_limit)`.
//! - Tensors nested under `model.language_model.*` beside a vision tower `model.visual.*` (not
//!   converted); the MTP layer (`num_nextn_predict_layers`, layer `num_hidden_layers`) is not
//!   converted: transformers does not load it, so there is no oracle for it here.

use super::build;
use super::deepseek_v3::mla_attention;
use super::json::Fields;
use super::kimi_linear::{grouped_sigmoid, kda_attention, kda_dims, mlp_layer_types};
use super::mla::{DsaSpec, KPool, MlaSpec};
use super::qwen3_next::{linear_layer_types, DeltaRule};
use super::{
    ExpertActivation, FfnSpec, GatedDeltaSpec, HyperConnSpec, HyperSpec, IndexerSpec, KPoolTensors,
    LayerHyperSpec, ModelSpec, ModelTensors, TensorClass, TensorKind, TensorSpec,
};
use crate::FormatError;

/// Per layer, whether it is a KDA layer (`layer_types`, DSA layers named `full_attention` or
/// `indexed_attention`; else every layer but each 4th).
fn linear_layers(f: &Fields<'_>, n: usize) -> Result<Vec<bool>, FormatError> {
    let full = ["full_attention", "indexed_attention"];
    Ok(linear_layer_types(f, n, "glm5_next", &full)?
        .unwrap_or_else(|| (0..n).map(|i| i % 4 != 3).collect()))
}

/// The KDA forget gate's lower bound as `Glm5NextTextConfig.__post_init__` resolves it.
fn lower_bound(f: &Fields<'_>, lin: Option<&Fields<'_>>) -> Result<Option<f32>, FormatError> {
    // `linear_lower_bound` (default -5.0; an explicit null means none) ...
    let mut lb = match f.v.get("linear_lower_bound") {
        None => Some(-5.0),
        Some(_) => f.f64("linear_lower_bound")?,
    };
    if let Some(l) = lin {
        // ... replaced by `linear_attn_config.gate_lower_bound` when that key is there ...
        if l.v.get("gate_lower_bound").is_some() {
            lb = l.f64("gate_lower_bound")?;
        }
        // ... and -5.0 again when `safe_gate` (default true) finds none.
        if l.bool("safe_gate")?.unwrap_or(true) && lb.is_none() {
            lb = Some(-5.0);
        }
    }
    match lb {
        Some(v) if !(v.is_finite() && v < 0.0) => Err(f.err(format!(
            "the KDA gate lower bound {v} must be a negative finite number"
        ))),
        _ => Ok(lb.map(|v| v as f32)),
    }
}

/// `swiglu_limit` (10; a strict float in the config classes, so null is refused): every SwiGLU
/// clamped, `silu(min(gate, l)) * clamp(up, -l, l)` (GLM-5.3-Flash, DeepSeek-V4).
pub(crate) fn clamped_swiglu(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    let pre = f.prefix;
    if f.v
        .get("swiglu_limit")
        .is_some_and(serde_json::Value::is_null)
    {
        return Err(f.err(format!(
            "{pre}swiglu_limit is null: give a number (10.0 as published)"
        )));
    }
    let limit = f.f64("swiglu_limit")?.unwrap_or(10.0);
    if !(limit.is_finite() && limit > 0.0) {
        return Err(f.err(format!(
            "{pre}swiglu_limit {limit} must be a positive finite number"
        )));
    }
    s.swiglu_limit = Some(limit as f32);
    s.expert_activation = ExpertActivation::SiluClamped {
        limit: limit as f32,
    };
    Ok(())
}

/// The manifold-constrained hyper-connections' `hc_mult` (4), `hc_sinkhorn_iters` (20) and
/// `hc_eps` (1e-6) (GLM-5.3-Flash, DeepSeek-V4).
pub(crate) fn hyper_spec(f: &Fields<'_>) -> Result<HyperSpec, FormatError> {
    let pre = f.prefix;
    let mult = f.usize("hc_mult")?.unwrap_or(4);
    let iters = f.usize("hc_sinkhorn_iters")?.unwrap_or(20);
    let eps = f.f64("hc_eps")?.unwrap_or(1e-6);
    if mult == 0 || iters == 0 || !(eps.is_finite() && eps >= 0.0) {
        return Err(f.err(format!(
            "{pre}hc_mult {mult} and {pre}hc_sinkhorn_iters {iters} must be positive, {pre}hc_eps {eps} finite and >= 0"
        )));
    }
    Ok(HyperSpec {
        mult,
        sinkhorn_iters: iters,
        eps: eps as f32,
    })
}

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    let pre = f.prefix;
    let n = s.num_layers;
    if s.num_heads != s.num_kv_heads {
        return Err(f.err(format!(
            "{pre}num_attention_heads {} must equal {pre}num_key_value_heads {} (MLA)",
            s.num_heads, s.num_kv_heads
        )));
    }
    if f.bool("attention_bias")? == Some(true) {
        return Err(FormatError::Unsupported(format!(
            "glm5_next with {pre}attention_bias true"
        )));
    }
    s.num_experts = match f.usize("n_routed_experts")? {
        Some(e) => e,
        None => f.usize("num_local_experts")?.unwrap_or(288),
    };
    s.moe_intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(2048);
    if f.get("intermediate_size").is_none() {
        s.intermediate_size = 12288;
    }
    s.max_position_embeddings = f.usize("max_position_embeddings")?.unwrap_or(1_048_576);
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(true);
    s.n_shared_experts = f.usize("n_shared_experts")?.unwrap_or(1);
    let n_group = f.usize("n_group")?.unwrap_or(1).max(1);
    let topk_group = f.usize("topk_group")?.unwrap_or(1).max(1);
    let scaling = f.f64("routed_scaling_factor")?.unwrap_or(2.5) as f32;
    grouped_sigmoid(
        f,
        s,
        (n_group, "n_group"),
        topk_group,
        "n_routed_experts",
        scaling,
    )?;
    // `swiglu_limit: float = 10.0` in the strict config class: null is not a value.
    clamped_swiglu(f, s)?;
    // transformers ignores `first_k_dense_replace`: three dense layers by default.
    let mlp_sparse = mlp_layer_types(f, n, |i| i >= 3)?;
    s.moe_layers = mlp_sparse.iter().map(|&m| m && s.num_experts > 0).collect();

    s.hyper = Some(hyper_spec(f)?);

    // DSA layers: NoPE MLA with the k-pool indexer.
    let linear = linear_layers(f, n)?;
    let rope = f.usize("qk_rope_head_dim")?.unwrap_or(0);
    if rope != 0 {
        return Err(FormatError::Unsupported(format!(
            "glm5_next with {pre}qk_rope_head_dim {rope} (its DSA layers have no RoPE; transformers refuses it)"
        )));
    }
    let Some(q_lora_rank) = f.usize("q_lora_rank")? else {
        return Err(f.err(format!(
            "{pre}q_lora_rank is required (the DSA indexer reads the q latent)"
        )));
    };
    let qk_nope_head_dim = f.usize("qk_nope_head_dim")?.unwrap_or(256);
    let kpool = f.usize("index_kpool")?.unwrap_or(16);
    let topk = f.usize("index_topk")?.unwrap_or(2048);
    if kpool == 0 || topk == 0 || !topk.is_multiple_of(kpool) {
        return Err(f.err(format!(
            "{pre}index_topk {topk} must be a positive multiple of {pre}index_kpool {kpool}"
        )));
    }
    if f.bool("index_kpool_always_select_tail")? == Some(false) {
        return Err(FormatError::Unsupported(format!(
            "glm5_next with {pre}index_kpool_always_select_tail false (a query would not attend to its own incomplete pool, nor at all before its first pool closes; the released model selects it)"
        )));
    }
    let full = DsaSpec::indexer_types(f, n)?;
    for i in (0..n).filter(|&i| !linear[i] && !full[i]) {
        if i == 0 || linear[i - 1] || !full[i - 1] {
            return Err(f.err(format!(
                "{pre}indexer_types makes DSA layer {i} \"shared\", but the layer before it is not a DSA layer that runs its indexer (transformers hands a selection only to the next layer)"
            )));
        }
    }
    let dsa = DsaSpec {
        n_heads: f.usize("index_n_heads")?.unwrap_or(32),
        head_dim: f.usize("index_head_dim")?.unwrap_or(128),
        topk,
        full,
        rope_interleave: false,
        kpool: Some(KPool {
            size: kpool,
            select_tail: true,
        }),
    };
    if dsa.n_heads == 0 || dsa.head_dim == 0 {
        return Err(f.err(format!(
            "{pre}index_n_heads {} and {pre}index_head_dim {} must be positive",
            dsa.n_heads, dsa.head_dim
        )));
    }
    let m = MlaSpec {
        q_lora_rank: Some(q_lora_rank),
        kv_lora_rank: f.usize("kv_lora_rank")?.unwrap_or(512),
        qk_nope_head_dim,
        qk_rope_head_dim: 0,
        v_head_dim: f.usize("v_head_dim")?.unwrap_or(256),
        // No RoPE: the theta is never used.
        rope_theta: 10_000.0,
        rope_interleave: false,
        nope: true,
        yarn: None,
        softmax_scale: (qk_nope_head_dim as f64).powf(-0.5) as f32,
        // `Glm5NextTextRMSNorm(..., eps=config.rms_norm_eps)`.
        latent_norm_eps: s.rms_norm_eps,
        n_group,
        topk_group,
        routed_scaling_factor: scaling,
        n_shared_experts: s.n_shared_experts,
        first_k_dense_replace: 3,
        moe_layer_freq: 1,
        num_nextn_predict_layers: 0,
        mlp_sparse: Some(mlp_sparse),
        dsa: Some(dsa),
        // A GGUF's split `attn_k_b` / `attn_v_b` (the converter's config for a glm5-next GGUF).
        kv_b_split: f.bool("mla_kv_b_split")?.unwrap_or(false),
    };
    for (key, v) in [
        ("q_lora_rank", q_lora_rank),
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
    s.unconverted_mtp_layers = f.usize("num_nextn_predict_layers")?.unwrap_or(0);

    // KDA layers: `linear_attn_config` wins over the top-level `linear_*` keys.
    let lin_prefix = if pre.is_empty() {
        "linear_attn_config."
    } else {
        "text_config.linear_attn_config."
    };
    let lin = f.object("linear_attn_config", lin_prefix);
    let (heads, head_dim, kernel) = kda_dims(f, lin.as_ref(), 64)?;
    s.gated_delta = Some(GatedDeltaSpec {
        rule: DeltaRule::Kda,
        linear_layers: linear,
        key_heads: heads,
        value_heads: heads,
        key_head_dim: head_dim,
        value_head_dim: head_dim,
        conv_kernel: kernel,
        gate_lower_bound: lower_bound(f, lin.as_ref())?,
        full_rank_gate: false,
        tiled_value_heads: false,
        split_qkvz: false,
    });
    Ok(())
}

/// `model.layers.{i}.hc_{which}_{fn,base,scale}`.
fn hyper_conn(s: &ModelSpec, h: &HyperSpec, i: usize, which: &str) -> HyperConnSpec {
    let p = format!("model.layers.{i}.hc_{which}");
    let n = h.mult;
    let t = |suffix: &str, shape: &[usize]| {
        TensorSpec::new(
            format!("{p}_{suffix}"),
            shape,
            TensorClass::Dense,
            TensorKind::Mixing,
        )
    };
    HyperConnSpec {
        proj: t("fn", &[(2 + n) * n, n * s.hidden_size]),
        base: t("base", &[(2 + n) * n]),
        scale: t("scale", &[3]),
    }
}

/// The k-pool indexer of DSA layer `i`.
fn indexer(s: &ModelSpec, d: &DsaSpec, rq: usize, kpool: usize, i: usize) -> IndexerSpec {
    let p = format!("model.layers.{i}.self_attn.indexer");
    let (h, c) = (s.hidden_size, TensorClass::Dense);
    IndexerSpec {
        wq_b: build::linear(&format!("{p}.wq_b"), d.n_heads * d.head_dim, rq, false, c),
        wk: build::linear(&format!("{p}.wk"), d.head_dim, h, false, c),
        k_norm_weight: build::norm(format!("{p}.k_norm.weight"), d.head_dim, c),
        k_norm_bias: build::norm(format!("{p}.k_norm.bias"), d.head_dim, c),
        weights_proj: build::linear(&format!("{p}.weights_proj"), d.n_heads, h, false, c),
        kpool: Some(KPoolTensors {
            gate: TensorSpec::new(
                format!("{p}.index_kpool_compress_gate"),
                &[d.head_dim, h],
                c,
                TensorKind::Mixing,
            ),
            ape: TensorSpec::new(
                format!("{p}.index_kpool_compress_ape"),
                &[kpool, d.head_dim],
                c,
                TensorKind::Mixing,
            ),
        }),
    }
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let g = s.gated_delta.as_ref().expect("configured");
    let m = s.mla.as_ref().expect("configured");
    let d = m.dsa.as_ref().expect("configured");
    let hc = s.hyper.as_ref().expect("configured");
    let rq = m.q_lora_rank.expect("configured");
    let kpool = d.kpool.expect("configured").size;
    let c = TensorClass::Dense;
    let layers = (0..s.num_layers)
        .map(|i| {
            let attention = if g.linear_layers[i] {
                kda_attention(s, g, i, &[g.value_heads])
            } else {
                let ix = d.is_full(i).then(|| indexer(s, d, rq, kpool, i));
                mla_attention(s, m, i, c, ix)
            };
            let ffn = if s.is_moe_layer(i) {
                super::deepseek_v3::sigmoid_moe(s, i, c)
            } else {
                FfnSpec::Dense(build::mlp(
                    &format!("model.layers.{i}.mlp"),
                    s.hidden_size,
                    s.intermediate_size,
                    c,
                ))
            };
            let mut l = build::layer(s, i, attention, ffn, c);
            l.hyper = Some(Box::new(LayerHyperSpec {
                attn: hyper_conn(s, hc, i, "attn"),
                ffn: hyper_conn(s, hc, i, "ffn"),
            }));
            l
        })
        .collect();
    build::model(s, layers, vec![])
}
