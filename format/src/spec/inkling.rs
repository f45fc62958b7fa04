//! Inkling (`model_type: inkling_mm_model`, its language model `text_config` of type
//! `inkling_text`), as transformers 5.23 `InklingTextConfig` / `modeling_inkling.py` compute it
//! (written up in docs/ARCHITECTURES.md, "inkling"). coli runs the language model; the vision
//! and audio towers (`model.visual.*`, `model.audio.*`) are left out of the store and reported as
//! unused by the converter.
//!
//! - Tensor names as published (`model.llm.*`, mapped by transformers' `conversion_mapping.py`
//!   entry `inkling_mm_model`): `embed`, `embed_norm`, `norm`, `unembed`; per layer
//!   `attn_norm`, `attn.{wq_du,wk_dv,wv_dv,wr_du,wo_ud}`, `attn.{q,k}_norm`,
//!   `attn.{k,v}_sconv`, `attn.rel_logits_proj.proj`, `attn_sconv`, `mlp_norm`, `mlp_sconv`.
//! - Layers: `layer_types` `"hybrid_sliding"` (window `sliding_window_size`, its own head counts
//!   and head dim `swa_*`) or `"hybrid"` (full attention); default: every layer whose index `i`
//!   has `(i + 1) % 6 != 0` slides (or those listed in `local_layer_ids`).
//! - Attention: no RoPE. q/k RMS-normalized per head, keys and values through a causal depthwise
//!   short convolution (kernel `conv_kernel_size`, plus the input: `x + conv(x)`), scores
//!   `q.k / head_dim` plus a relative position bias `r_i . proj[:, i - j]` for
//!   `0 <= i - j < extent` (`r = wr_du(x)` per head, `extent` = `rel_extent` on full layers and
//!   the window on sliding ones); on full layers with `log_scaling_n_floor` set, q and the bias
//!   are multiplied by `1 + alpha * ln(max(1, (i + 1) / n_floor))`.
//! - The attention output and the MLP output each go through a short convolution
//!   (`attn_sconv`, `mlp_sconv`) before their residual add.
//! - MLP: `mlp_layer_types` `"dense"` (`w13_dn` gate/up interleaved, `w2_md`, times
//!   `global_scale`; width `intermediate_size`, or `dense_intermediate_size` when given) or
//!   `"sparse"`: router `mlp.gate.weight` `[E + S, H]`, sigmoid scores plus `mlp.gate.bias` choose
//!   the top-k routed experts; their logits and the S shared experts' logits go through
//!   `logsigmoid` and are normalized together (the shared experts are a softmax sink), times
//!   `route_scale * gate.global_scale`; shared experts stacked (`shared_w13_weight`
//!   `[S, 2I, H]` interleaved, `shared_w2_weight` `[S, H, I]`) with their weight applied before
//!   their down projection; routed experts fused ([`ExpertStorage::FusedW13`]).
//! - Embedding rows RMS-normalized (`embed_norm`); the final hidden state divided by
//!   `logits_mup_width_multiplier` before `unembed`; logits cut to `unpadded_vocab_size`.
//! - MTP (`mtp_config.num_nextn_predict_layers` chained layers `model.mtp.layers.{k}`, as
//!   transformers' `MtpModel` runs them): depth k takes the previous depth's output (the main
//!   model's final hidden state after `norm` for depth 0) and the embedding of the token k + 1
//!   ahead (the main embedding's raw row, without `embed_norm`):
//!   `u = input_proj(cat(hidden_norm(h), embed_norm(e)))` (hidden first unless
//!   `mtp_hidden_states_first` is false), then an Inkling decoder layer
//!   (`transformer_block.*`, dense MLP, sliding where `mtp_config.local_layer_ids` says) with its
//!   own cache; the output, after the shared `model.mtp.chain_norm` when
//!   `chain_hidden_post_norm`, feeds the next depth and the main `unembed` (with the main
//!   model's muP divisor and unpadded vocabulary).
//! - `rms_norm_eps_moe_gate` is read by the config class but used by no module of transformers
//!   5.23 (its router has no norm); coli reads it and does the same.

use super::json::Fields;
use super::{
    AttentionSpec, ExpertStorage, ExpertsSpec, FfnSpec, FusedMlpSpec, InklingAttentionSpec,
    LayerSpec, LinearSpec, ModelSpec, ModelTensors, MtpSpec, Routing, SinkMoeSpec, TensorClass,
    TensorKind, TensorSpec,
};
use crate::FormatError;
use serde_json::Value;

/// The multimodal wrapper's `model_type`.
pub const WRAPPER_MODEL_TYPE: &str = "inkling_mm_model";

/// Positions an Inkling layer keeps beyond what the next position reads (the engine's
/// sliding-window and convolution state), so that truncating by up to this many (speculative
/// drafts rejected, a pass rolled back) stays exact.
pub const KV_SLACK: usize = 64;

/// The engine drops an Inkling layer's older rows only once at least this many can go.
pub const KV_TRIM_CHUNK: usize = 64;

/// Positions of a trimmed state (a sliding layer's keys and values when `read_back` is
/// `window - 1`, convolution inputs when it is `kernel - 1`) held at most between passes, of a
/// sequence `context` positions long: what the next position reads, [`KV_SLACK`] and one
/// [`KV_TRIM_CHUNK`] not yet dropped.
pub fn held_rows(read_back: usize, context: usize) -> usize {
    (read_back + KV_SLACK + KV_TRIM_CHUNK).min(context)
}

impl InklingSpec {
    /// f32 values a sequence of `context` positions holds in its Inkling layers' state
    /// (engine: `LayerKv` of `engine/src/layers/inkling.rs`): per full layer keys and values
    /// of every position; per sliding layer those of [`held_rows`]`(window - 1)` positions;
    /// per layer the four convolutions' inputs (`2 * kv_dim + 2 * H`) of
    /// [`held_rows`]`(kernel - 1)` positions. A pass appends its rows before dropping: a
    /// prefill chunk's are counted with the prefill.
    pub fn kv_values(&self, spec: &ModelSpec, context: usize) -> usize {
        (0..spec.num_layers)
            .map(|l| {
                let d = self.layer_dims(spec, l);
                let kvd = d.kv_heads * d.head_dim;
                let kv_rows = match d.window {
                    Some(w) => held_rows(w - 1, context),
                    None => context,
                };
                2 * kvd * kv_rows
                    + (2 * kvd + 2 * spec.hidden_size) * held_rows(self.conv_kernel - 1, context)
            })
            .sum()
    }

    /// f32 values per position a prefill chunk appends to the Inkling layers' state before
    /// they drop what they no longer read: every layer's keys, values and convolution inputs.
    pub fn kv_values_per_chunk_row(&self, spec: &ModelSpec) -> usize {
        (0..spec.num_layers)
            .map(|l| {
                let d = self.layer_dims(spec, l);
                4 * d.kv_heads * d.head_dim + 2 * spec.hidden_size
            })
            .sum()
    }
}

/// The logarithmic logit scaling of the full-attention layers (`log_scaling_n_floor`,
/// `log_scaling_alpha`): queries and the position bias of the token at position `i` are
/// multiplied by `1 + alpha * ln(max(1, (i + 1) / n_floor))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogScaling {
    /// `log_scaling_n_floor`.
    pub n_floor: f64,
    /// `log_scaling_alpha`.
    pub alpha: f64,
}

impl LogScaling {
    /// The factor `tau` for the query at position `pos` (0-based), computed in f32 as
    /// transformers does (`1 + alpha * log(clamp((pos + 1) / n_floor, min=1))`).
    pub fn tau(&self, pos: usize) -> f32 {
        let n = (pos + 1) as f32 / self.n_floor as f32;
        1.0 + self.alpha as f32 * n.max(1.0).ln()
    }
}

/// What Inkling adds to [`ModelSpec`].
#[derive(Clone, Debug, PartialEq)]
pub struct InklingSpec {
    /// Query heads of the sliding layers (`swa_num_attention_heads`).
    pub swa_num_heads: usize,
    /// Key/value heads of the sliding layers (`swa_num_key_value_heads`).
    pub swa_num_kv_heads: usize,
    /// Head dimension of the sliding layers (`swa_head_dim`).
    pub swa_head_dim: usize,
    /// Per-head width of the relative states (`d_rel`).
    pub d_rel: usize,
    /// Backward distance, in tokens, over which the full layers' position bias applies
    /// (`rel_extent`).
    pub rel_extent: usize,
    /// The full layers' logarithmic logit scaling, when `log_scaling_n_floor` is set.
    pub log_scaling: Option<LogScaling>,
    /// Taps of every short convolution (`conv_kernel_size`, published as
    /// `sconv_kernel_size`).
    pub conv_kernel: usize,
    /// `logits_mup_width_multiplier`: the final hidden state is divided by it before `unembed`.
    pub logits_divisor: f32,
    /// Rows of `unembed` that are logits (`unpadded_vocab_size`, else `vocab_size`).
    pub unpadded_vocab_size: usize,
    /// `route_scale`.
    pub route_scale: f32,
    /// Per MTP layer: whether it slides (`mtp_config.local_layer_ids`; empty without MTP).
    pub mtp_sliding: Vec<bool>,
    /// `chain_hidden_post_norm`: the shared `model.mtp.chain_norm` normalizes each MTP layer's
    /// output.
    pub chain_hidden_post_norm: bool,
    /// `mtp_hidden_states_first`.
    pub mtp_hidden_first: bool,
    /// Inkling 2's parameters (None: Inkling).
    pub v2: Option<super::Inkling2Params>,
}

/// The attention shape of one Inkling layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InklingLayerDims {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Columns of `rel_logits_proj.proj`: distances the position bias covers.
    pub extent: usize,
    /// The sliding window, None on a full layer.
    pub window: Option<usize>,
}

impl InklingSpec {
    /// The attention shape of main layer `layer` of `spec`, or of MTP layer
    /// `layer - num_hidden_layers` for a layer past the main ones.
    pub fn layer_dims(&self, spec: &ModelSpec, layer: usize) -> InklingLayerDims {
        let window = match layer.checked_sub(spec.num_layers) {
            Some(k) => spec
                .sliding_window
                .filter(|_| self.mtp_sliding.get(k).copied().unwrap_or(false)),
            None => spec.window_of(layer),
        };
        match window {
            Some(w) => InklingLayerDims {
                heads: self.swa_num_heads,
                kv_heads: self.swa_num_kv_heads,
                head_dim: self.swa_head_dim,
                extent: w,
                window: Some(w),
            },
            None => InklingLayerDims {
                heads: spec.num_heads,
                kv_heads: spec.num_kv_heads,
                head_dim: spec.head_dim,
                extent: self.rel_extent,
                window: None,
            },
        }
    }
}

/// Whether a tensor of the published checkpoint belongs to the language model coli runs
/// (`model.llm.*`; the MTP layers `model.mtp.*` too, though not run yet).
pub fn language_model_tensor(name: &str) -> bool {
    name.starts_with("model.llm.") || name.starts_with("model.mtp.")
}

/// A positive integer field with a default.
pub(crate) fn positive(f: &Fields<'_>, key: &str, default: usize) -> Result<usize, FormatError> {
    let v = f.usize(key)?.unwrap_or(default);
    if v == 0 {
        return Err(f.err(format!("{}{key} must be positive", f.prefix)));
    }
    Ok(v)
}

/// The attention shape defaults of `InklingTextConfig` / `Inkling2TextConfig` where the
/// generic reader assumes others: `head_dim` 128, `num_key_value_heads` 8.
pub(crate) fn head_defaults(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    if f.get("head_dim").is_none() {
        s.head_dim = 128;
        s.rotary_dim = 128;
    }
    if f.get("num_key_value_heads").is_none() {
        s.num_kv_heads = 8;
        if !s.num_heads.is_multiple_of(8) {
            return Err(f.err(format!(
                "{p}num_attention_heads {} must be a multiple of {p}num_key_value_heads (default 8)",
                s.num_heads,
                p = f.prefix
            )));
        }
    }
    Ok(())
}

/// `sliding_window_size` (or its alias `sliding_window`), `default` when absent; positive.
pub(crate) fn sliding_window(f: &Fields<'_>, default: usize) -> Result<usize, FormatError> {
    let window = match f.usize("sliding_window_size")? {
        Some(w) => w,
        None => f.usize("sliding_window")?.unwrap_or(default),
    };
    if window == 0 {
        return Err(f.err(format!("{}sliding_window_size must be positive", f.prefix)));
    }
    Ok(window)
}

/// The sliding layers' query and key/value heads (`swa_num_attention_heads`,
/// `swa_num_key_value_heads`, `defaults` when absent), the first a multiple of the second.
pub(crate) fn swa_heads(
    f: &Fields<'_>,
    defaults: (usize, usize),
) -> Result<(usize, usize), FormatError> {
    let heads = positive(f, "swa_num_attention_heads", defaults.0)?;
    let kv_heads = positive(f, "swa_num_key_value_heads", defaults.1)?;
    if !heads.is_multiple_of(kv_heads) {
        return Err(f.err(format!(
            "{p}swa_num_attention_heads {heads} must be a multiple of {p}swa_num_key_value_heads {kv_heads}",
            p = f.prefix
        )));
    }
    Ok((heads, kv_heads))
}

/// The short convolutions' taps (`conv_kernel_size`, published as `sconv_kernel_size`; 4).
pub(crate) fn conv_kernel(f: &Fields<'_>) -> Result<usize, FormatError> {
    let k = match f.usize("conv_kernel_size")? {
        Some(k) => k,
        None => f.usize("sconv_kernel_size")?.unwrap_or(4),
    };
    if k == 0 {
        return Err(f.err(format!("{}conv_kernel_size must be positive", f.prefix)));
    }
    Ok(k)
}

/// `unpadded_vocab_size` (`default` when absent), in `1..=vocab_size`.
pub(crate) fn unpadded_vocab(
    f: &Fields<'_>,
    s: &ModelSpec,
    default: usize,
) -> Result<usize, FormatError> {
    let v = f.usize("unpadded_vocab_size")?.unwrap_or(default);
    if v == 0 || v > s.vocab_size {
        return Err(f.err(format!(
            "{}unpadded_vocab_size {v} must be in 1..=vocab_size {}",
            f.prefix, s.vocab_size
        )));
    }
    Ok(v)
}

/// Per layer, from a list of type names (`key`), `Ok(None)` when absent.
pub(crate) fn per_layer(
    f: &Fields<'_>,
    key: &str,
    n: usize,
    names: [&str; 2],
) -> Result<Option<Vec<bool>>, FormatError> {
    let Some(list) = f.strings(key)? else {
        return Ok(None);
    };
    if list.len() != n {
        return Err(f.err(format!(
            "{}{key} lists {} layers, num_hidden_layers is {n}",
            f.prefix,
            list.len()
        )));
    }
    list.iter()
        .map(|t| match *t {
            t if t == names[0] => Ok(true),
            t if t == names[1] => Ok(false),
            other => Err(f.err(format!(
                "{}{key} entries must be {:?} or {:?}, found {other:?}",
                f.prefix, names[0], names[1]
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

pub(crate) fn configure(
    config: &Value,
    f: &Fields<'_>,
    s: &mut ModelSpec,
) -> Result<(), FormatError> {
    let n = s.num_layers;
    // InklingTextConfig's defaults where the generic reader assumes others.
    head_defaults(f, s)?;
    s.num_experts = super::num_experts(f, "n_routed_experts", "num_local_experts")?;
    s.n_shared_experts = f.usize("n_shared_experts")?.unwrap_or(2);
    if s.n_shared_experts == 0 {
        return Err(f.err(format!(
            "{}n_shared_experts must be at least 1: the shared experts are the router's softmax sink",
            f.prefix
        )));
    }
    if f.bool("shared_expert_sink")? == Some(false) {
        return Err(FormatError::Unsupported(format!(
            "{}shared_expert_sink false (transformers 5.23 computes only the sink form)",
            f.prefix
        )));
    }
    // `dense_intermediate_size` (as the published configs have it) makes `intermediate_size`
    // the experts' width (`InklingTextConfig.__post_init__`).
    match f.usize("dense_intermediate_size")? {
        Some(d) => {
            s.moe_intermediate_size = f.usize("intermediate_size")?.unwrap_or(24576);
            s.intermediate_size = d;
        }
        None => {
            s.moe_intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(3072);
            s.intermediate_size = f.usize("intermediate_size")?.unwrap_or(24576);
        }
    }
    s.norm_topk_prob = false;
    let route_scale = f.f64("route_scale")?.unwrap_or(8.0) as f32;
    if !route_scale.is_finite() {
        return Err(f.err(format!("{}route_scale must be finite", f.prefix)));
    }
    s.routing = Routing::SigmoidSink;
    s.sliding_window = Some(sliding_window(f, 512)?);
    s.sliding_layers = match per_layer(f, "layer_types", n, ["hybrid_sliding", "hybrid"])? {
        Some(l) => l,
        None => match f.get("local_layer_ids") {
            Some(Value::Array(ids)) => {
                let mut l = vec![false; n];
                for id in ids {
                    let i = id.as_u64().map(|i| i as usize).filter(|&i| i < n);
                    let Some(i) = i else {
                        return Err(f.err(format!(
                            "{}local_layer_ids entries must be layer indices below {n}, found {id}",
                            f.prefix
                        )));
                    };
                    l[i] = true;
                }
                l
            }
            Some(x) => {
                return Err(f.err(format!(
                    "{}local_layer_ids must be a list of layer indices, found {x}",
                    f.prefix
                )))
            }
            None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
        },
    };
    s.moe_layers = match per_layer(f, "mlp_layer_types", n, ["sparse", "dense"])? {
        Some(l) => l,
        None => {
            let dense = f.usize("dense_mlp_idx")?.unwrap_or(0);
            (0..n).map(|i| i >= dense).collect()
        }
    };
    if s.moe_layers.iter().any(|&m| !m) && s.intermediate_size == 0 {
        return Err(f.err(format!(
            "{}intermediate_size must be positive for the dense layers",
            f.prefix
        )));
    }
    if let Some(m) = f.usize("model_max_length")? {
        s.max_position_embeddings = m;
    } else if f.get("max_position_embeddings").is_none() {
        s.max_position_embeddings = 131072;
    }
    let (swa_num_heads, swa_num_kv_heads) = swa_heads(f, (64, 16))?;
    let log_scaling = match f.f64("log_scaling_n_floor")? {
        None => None,
        Some(n_floor) if n_floor > 0.0 => Some(LogScaling {
            n_floor,
            alpha: f.f64("log_scaling_alpha")?.unwrap_or(0.1),
        }),
        Some(x) => {
            return Err(f.err(format!(
                "{}log_scaling_n_floor must be positive, found {x}",
                f.prefix
            )))
        }
    };
    let conv_kernel = conv_kernel(f)?;
    let logits_divisor = match f.f64("logits_mup_width_multiplier")? {
        Some(m) => m,
        None => f.f64("embedding_multiplier")?.unwrap_or(24.0),
    } as f32;
    if !(logits_divisor.is_finite() && logits_divisor != 0.0) {
        return Err(f.err(format!(
            "{}logits_mup_width_multiplier must be finite and non-zero",
            f.prefix
        )));
    }
    let unpadded_vocab_size = unpadded_vocab(f, s, s.vocab_size)?;
    // Read (and checked) as transformers reads it; no module of 5.23 uses it.
    f.f64("rms_norm_eps_moe_gate")?;
    // MTP: the text config's fields, else the checkpoint's top-level `mtp_config`
    // (`InklingConfig.__post_init__` sets the former from the latter when absent).
    let top = Fields {
        v: config,
        file: f.file,
        prefix: "",
    };
    let mtp = top.object("mtp_config", "mtp_config.");
    let depth = match f.usize("num_mtp_layers")? {
        Some(n) => n,
        // An explicit null in the text config stays (transformers' `setdefault` keeps it).
        None if f.v.get("num_mtp_layers").is_some() => 0,
        None => match &mtp {
            Some(m) => m.usize("num_nextn_predict_layers")?.unwrap_or(0),
            None => 0,
        },
    };
    let chain_hidden_post_norm = match f.bool("chain_hidden_post_norm")? {
        Some(b) => b,
        None => match &mtp {
            Some(m) => m.bool("chain_hidden_post_norm")?.unwrap_or(false),
            None => false,
        },
    };
    let local = match f.get("mtp_local_layer_ids") {
        Some(v) => Some((v, format!("{}mtp_local_layer_ids", f.prefix))),
        None => mtp
            .as_ref()
            .and_then(|m| m.get("local_layer_ids"))
            .map(|v| (v, "mtp_config.local_layer_ids".to_string())),
    };
    let mut mtp_sliding = vec![false; depth];
    if let Some((v, key)) = local {
        let ids = v.as_array().ok_or_else(|| {
            f.err(format!(
                "{key} must be a list of MTP layer indices, found {v}"
            ))
        })?;
        for id in ids {
            match id.as_u64().map(|i| i as usize).filter(|&i| i < depth) {
                Some(i) => mtp_sliding[i] = true,
                None => {
                    return Err(f.err(format!(
                        "{key} entries must be MTP layer indices below {depth}, found {id}"
                    )))
                }
            }
        }
    }
    s.num_mtp_layers = depth;
    s.inkling = Some(InklingSpec {
        swa_num_heads,
        swa_num_kv_heads,
        swa_head_dim: positive(f, "swa_head_dim", 128)?,
        d_rel: positive(f, "d_rel", 16)?,
        rel_extent: positive(f, "rel_extent", 1024)?,
        log_scaling,
        conv_kernel,
        logits_divisor,
        unpadded_vocab_size,
        route_scale,
        mtp_sliding,
        chain_hidden_post_norm,
        mtp_hidden_first: f.bool("mtp_hidden_states_first")?.unwrap_or(true),
        v2: None,
    });
    Ok(())
}

/// A dense tensor `name` of `shape`.
pub(crate) fn t(name: String, shape: &[usize], kind: TensorKind) -> TensorSpec {
    TensorSpec::new(name, shape, TensorClass::Dense, kind)
}

/// A dense linear weight `[rows, cols]` without bias.
pub(crate) fn linear(name: String, rows: usize, cols: usize) -> LinearSpec {
    LinearSpec {
        weight: t(name, &[rows, cols], TensorKind::Linear),
        bias: None,
    }
}

/// Every tensor of `l` (and of its experts) moved to class `class`.
fn with_class(mut l: LayerSpec, class: TensorClass) -> LayerSpec {
    fn set(t: &mut TensorSpec, c: TensorClass) {
        t.class = c;
    }
    set(&mut l.input_norm, class);
    set(&mut l.post_norm, class);
    if let AttentionSpec::Inkling(a) = &mut l.attention {
        for x in [&mut a.q, &mut a.k, &mut a.v, &mut a.r, &mut a.o] {
            set(&mut x.weight, class);
        }
        for x in [
            &mut a.q_norm,
            &mut a.k_norm,
            &mut a.k_conv,
            &mut a.v_conv,
            &mut a.rel_proj,
            &mut a.out_conv,
        ] {
            set(x, class);
        }
    }
    if let FfnSpec::FusedDense(m) = &mut l.ffn {
        set(&mut m.gate_up.weight, class);
        set(&mut m.down.weight, class);
        set(&mut m.scale, class);
        set(&mut m.out_conv, class);
    }
    l
}

/// Inkling's MTP layers `model.mtp.layers.{k}` (decoder layer index `num_hidden_layers + k`).
fn mtp_tensors(s: &ModelSpec, ink: &InklingSpec) -> Vec<MtpSpec> {
    let (h, c) = (s.hidden_size, TensorClass::Mtp);
    let chain_norm = ink
        .chain_hidden_post_norm
        .then(|| TensorSpec::new("model.mtp.chain_norm.weight", &[h], c, TensorKind::Norm));
    (0..s.num_mtp_layers)
        .map(|k| {
            let p = format!("model.mtp.layers.{k}");
            let block = format!("{p}.transformer_block");
            let layer = with_class(layer_spec(s, ink, s.num_layers + k, &block, false), c);
            MtpSpec {
                layer,
                embed: None,
                enorm: TensorSpec::new(format!("{p}.embed_norm.weight"), &[h], c, TensorKind::Norm),
                hnorm: TensorSpec::new(
                    format!("{p}.hidden_norm.weight"),
                    &[h],
                    c,
                    TensorKind::Norm,
                ),
                eh_proj: LinearSpec {
                    weight: TensorSpec::new(
                        format!("{p}.input_proj.weight"),
                        &[h, 2 * h],
                        c,
                        TensorKind::Linear,
                    ),
                    bias: None,
                },
                head_norm: chain_norm.clone(),
                head: None,
                hidden_first: ink.mtp_hidden_first,
                chain_normed: true,
            }
        })
        .collect()
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let ink = s.inkling.as_ref().expect("configured as Inkling");
    let (h, v) = (s.hidden_size, s.vocab_size);
    let layers = (0..s.num_layers)
        .map(|i| {
            layer_spec(
                s,
                ink,
                i,
                &format!("model.llm.layers.{i}"),
                s.is_moe_layer(i),
            )
        })
        .collect();
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
        layers,
        final_norm: t("model.llm.norm.weight".into(), &[h], TensorKind::Norm),
        lm_head: t(
            "model.llm.unembed.weight".into(),
            &[v, h],
            TensorKind::OutputHead,
        ),
        mtp: mtp_tensors(s, ink),
        final_query: None,
        hyper_head: None,
    }
}

/// The decoder layer `i` (an MTP layer past `num_hidden_layers`) named under `p`, MoE when
/// `moe`.
fn layer_spec(s: &ModelSpec, ink: &InklingSpec, i: usize, p: &str, moe: bool) -> LayerSpec {
    let (h, k) = (s.hidden_size, ink.conv_kernel);
    let d = ink.layer_dims(s, i);
    let (qd, kvd) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let attention = AttentionSpec::Inkling(Box::new(InklingAttentionSpec {
        q: linear(format!("{p}.attn.wq_du.weight"), qd, h),
        k: linear(format!("{p}.attn.wk_dv.weight"), kvd, h),
        v: linear(format!("{p}.attn.wv_dv.weight"), kvd, h),
        r: linear(format!("{p}.attn.wr_du.weight"), d.heads * ink.d_rel, h),
        o: linear(format!("{p}.attn.wo_ud.weight"), h, qd),
        q_norm: t(
            format!("{p}.attn.q_norm.weight"),
            &[d.head_dim],
            TensorKind::Norm,
        ),
        k_norm: t(
            format!("{p}.attn.k_norm.weight"),
            &[d.head_dim],
            TensorKind::Norm,
        ),
        k_conv: t(
            format!("{p}.attn.k_sconv.weight"),
            &[kvd, 1, k],
            TensorKind::Conv,
        ),
        v_conv: t(
            format!("{p}.attn.v_sconv.weight"),
            &[kvd, 1, k],
            TensorKind::Conv,
        ),
        rel_proj: t(
            format!("{p}.attn.rel_logits_proj.proj"),
            &[ink.d_rel, d.extent],
            TensorKind::Norm,
        ),
        out_conv: t(
            format!("{p}.attn_sconv.weight"),
            &[h, 1, k],
            TensorKind::Conv,
        ),
    }));
    let out_conv = t(
        format!("{p}.mlp_sconv.weight"),
        &[h, 1, k],
        TensorKind::Conv,
    );
    let ffn = if moe {
        let (e, sh, im) = (s.num_experts, s.n_shared_experts, s.moe_intermediate_size);
        FfnSpec::SinkMoe(Box::new(SinkMoeSpec {
            router: t(
                format!("{p}.mlp.gate.weight"),
                &[e + sh, h],
                TensorKind::Router,
            ),
            router_bias: t(format!("{p}.mlp.gate.bias"), &[e], TensorKind::Bias),
            router_scale: t(format!("{p}.mlp.gate.global_scale"), &[1], TensorKind::Norm),
            shared_gate_up: t(
                format!("{p}.mlp.shared_experts.shared_w13_weight"),
                &[sh, 2 * im, h],
                TensorKind::Linear,
            ),
            shared_down: t(
                format!("{p}.mlp.shared_experts.shared_w2_weight"),
                &[sh, h, im],
                TensorKind::Linear,
            ),
            num_shared: sh,
            experts: ExpertsSpec {
                layer: i as u32,
                count: e as u32,
                hidden: h,
                intermediate: im,
                class: TensorClass::RoutedExpert,
                prefix: format!("{p}.mlp.experts"),
                storage: ExpertStorage::FusedW13,
                biases: false,
            },
            out_conv,
        }))
    } else {
        let im = s.intermediate_size;
        FfnSpec::FusedDense(FusedMlpSpec {
            gate_up: linear(format!("{p}.mlp.w13_dn.weight"), 2 * im, h),
            down: linear(format!("{p}.mlp.w2_md.weight"), h, im),
            scale: t(format!("{p}.mlp.global_scale"), &[1], TensorKind::Norm),
            out_conv,
        })
    };
    LayerSpec {
        attn_res: None,
        index: i,
        input_norm: t(format!("{p}.attn_norm.weight"), &[h], TensorKind::Norm),
        attention,
        post_norm: t(format!("{p}.mlp_norm.weight"), &[h], TensorKind::Norm),
        ffn,
        hyper: None,
    }
}
