//! DeepSeek-V4 (`model_type: deepseek_v4`: V4-Flash, V4-Pro), as transformers 5.25
//! `DeepseekV4Config` / `modeling_deepseek_v4.py` read the released config and checkpoint
//! (names as released: `embed.weight`, `layers.{i}.attn.wq_a.weight`, ..., which transformers'
//! `deepseek_v4` conversion mapping renames on load):
//!
//! - Residual: `hc_mult` streams (manifold-constrained hyper-connections, [`HyperSpec`]), two
//!   hyper-connections per layer (`layers.{i}.hc_{attn,ffn}_{fn,base,scale}`); the final hidden
//!   state is the weighted collapse `hc_head_{fn,base,scale}` (`DeepseekV4HyperHead`), then
//!   `norm`, `head`.
//! - Attention (`DeepseekV4Attention`): `wq_a` -> `q_norm` -> `wq_b`, each query head RMS-normed
//!   without weight; one key-value head `wkv` -> `kv_norm` (keys are the values); RoPE on the
//!   trailing `rope_dim` of a head, interleaved pairs, the attention output's rope part rotated
//!   back at the query's position; a sink logit per head (`attn_sink`); the grouped output
//!   `wo_a` (per group of heads) then `wo_b`. Every layer attends to its last `sliding_window`
//!   positions; `layer_types` adds compressed entries: `compressed_sparse_attention` (CSA,
//!   one entry per `compress_rates` block of 4, overlapping, the lightning indexer picking
//!   `index_topk` of them per query) and `heavily_compressed_attention` (HCA, one entry per
//!   block of 128, all attended). Sliding layers rotate with `rope_theta`; compressed layers,
//!   their compressors and the indexer with `compress_rope_theta` and the YaRN of
//!   `rope_parameters` / `rope_scaling` (attention factor 1).
//! - Feed-forward (`DeepseekV4SparseMoeBlock`): every layer is MoE; `mlp_layer_types`
//!   `hash_moe` layers (the first `num_hash_layers`, 3) take their experts from
//!   `ffn.gate.tid2eid[token id]`, the others the top-k of `sqrtsoftplus(logits) + ffn.gate.bias`;
//!   weights `score / sum * routed_scaling_factor`; one shared expert
//!   `ffn.shared_experts.{w1,w3,w2}` of `moe_intermediate_size`; routed experts
//!   `ffn.experts.{e}.{w1,w3,w2}`; every SwiGLU clamped at `swiglu_limit`.
//! - The MTP layer (`mtp.{k}.*`, `num_nextn_predict_layers`) is not converted: transformers does
//!   not load it, so there is no oracle for it here.

use super::build;
use super::json::Fields;
use super::{
    AttentionSpec, CompressorSpec, DeepseekV4AttentionSpec, DeepseekV4IndexerSpec, ExpertStorage,
    ExpertsSpec, FfnSpec, HyperConnSpec, HyperSpec, LayerHyperSpec, LayerSpec, LinearSpec, MlpSpec,
    ModelSpec, ModelTensors, MoeSpec, Routing, TensorClass, TensorKind, TensorSpec, Yarn,
};
use crate::FormatError;
use serde_json::Value;

/// The attention kind of a DeepSeek-V4 layer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V4Attention {
    /// `sliding_attention`: the window only.
    Sliding,
    /// `compressed_sparse_attention`: the window plus the indexer's pick of overlapping
    /// compressed entries.
    Csa,
    /// `heavily_compressed_attention`: the window plus every compressed entry.
    Hca,
}

impl V4Attention {
    /// The `layer_types` spelling.
    pub fn name(self) -> &'static str {
        match self {
            V4Attention::Sliding => "sliding_attention",
            V4Attention::Csa => "compressed_sparse_attention",
            V4Attention::Hca => "heavily_compressed_attention",
        }
    }
}

/// The DeepSeek-V4 part of config.json (defaults of `DeepseekV4Config`, V4-Flash's shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekV4Spec {
    /// Per layer, its attention kind.
    pub attention: Vec<V4Attention>,
    /// Per layer, whether its experts come from the token's `tid2eid` row.
    pub hash_layers: Vec<bool>,
    /// Positions per compressed entry on CSA layers (`compress_rates`, 4).
    pub csa_rate: usize,
    /// Positions per compressed entry on HCA layers (128).
    pub hca_rate: usize,
    /// `sliding_window` (128): a query sees itself and the `window - 1` positions before it.
    pub window: usize,
    /// `q_lora_rank` (1024).
    pub q_lora_rank: usize,
    /// `o_groups` (8).
    pub o_groups: usize,
    /// `o_lora_rank` (1024).
    pub o_lora_rank: usize,
    /// `index_n_heads` (64).
    pub index_heads: usize,
    /// `index_head_dim` (128).
    pub index_head_dim: usize,
    /// `index_topk` (512).
    pub index_topk: usize,
    /// The rotated trailing dimensions of a head: `int(head_dim * partial_rotary_factor)`
    /// (64 of 512).
    pub rope_dim: usize,
    /// `rope_theta` of the sliding layers (10000).
    pub main_theta: f64,
    /// `compress_rope_theta` of the compressed layers (160000).
    pub compress_theta: f64,
    /// The compressed layers' YaRN (`rope_scaling` / `rope_parameters`), None: default RoPE.
    pub compress_yarn: Option<Yarn>,
    /// The compressed layers' cos/sin multiplier (1: `DeepseekV4Config` forces YaRN's
    /// `attention_factor` to 1 unless the nested `rope_parameters.compress` gives one).
    pub compress_attention_factor: f32,
    /// `routed_scaling_factor` (1.5).
    pub routed_scaling_factor: f32,
    /// `swiglu_limit` (10).
    pub swiglu_limit: f32,
}

impl DeepseekV4Spec {
    /// The block of layer `layer`'s compressed entries (None: a sliding layer).
    pub fn rate(&self, layer: usize) -> Option<usize> {
        match self.attention.get(layer)? {
            V4Attention::Sliding => None,
            V4Attention::Csa => Some(self.csa_rate),
            V4Attention::Hca => Some(self.hca_rate),
        }
    }

    /// f32 values per compressed entry of layer `layer` (its pooled key-value, then the
    /// indexer's key on a CSA layer; 0 on a sliding layer), for `head_dim`.
    pub fn entry_values(&self, layer: usize, head_dim: usize) -> usize {
        match self.attention.get(layer) {
            Some(V4Attention::Csa) => head_dim + self.index_head_dim,
            Some(V4Attention::Hca) => head_dim,
            _ => 0,
        }
    }

    /// f32 values per position of layer `layer`'s raw compressor rows (`wkv` and `wgate`
    /// outputs, and the indexer's on a CSA layer), held for the open block (and the one before
    /// it on a CSA layer); 0 on a sliding layer.
    pub fn raw_values(&self, layer: usize, head_dim: usize) -> usize {
        match self.attention.get(layer) {
            Some(V4Attention::Csa) => 4 * head_dim + 4 * self.index_head_dim,
            Some(V4Attention::Hca) => 2 * head_dim,
            _ => 0,
        }
    }
}

impl DeepseekV4Spec {
    /// f32 values per position of context that grow with it: each compressed layer's entry
    /// per block, `entry_values / rate`, rounded up per layer (the window and the open blocks'
    /// rows are bounded: [`DeepseekV4Spec::kv_values`]).
    pub fn values_per_token(&self, head_dim: usize) -> usize {
        (0..self.attention.len())
            .filter_map(|l| Some(self.entry_values(l, head_dim).div_ceil(self.rate(l)?)))
            .sum()
    }

    /// f32 values a sequence of `context` positions holds in its layers' state (engine:
    /// `LayerKv` of `engine/src/layers/deepseek_v4.rs`): per layer the key-value rows of
    /// [`super::inkling::held_rows`]`(window - 1)` positions, on compressed layers the raw
    /// compressor rows of `held_rows(kernel - 1)` positions (kernel: the block, two on CSA
    /// layers) and one entry per closed block.
    pub fn kv_values(&self, head_dim: usize, context: usize) -> usize {
        use super::inkling::held_rows;
        (0..self.attention.len())
            .map(|l| {
                let window = head_dim * held_rows(self.window - 1, context);
                window
                    + match self.rate(l) {
                        Some(r) => {
                            let kernel = if self.attention[l] == V4Attention::Csa {
                                2 * r
                            } else {
                                r
                            };
                            self.raw_values(l, head_dim) * held_rows(kernel - 1, context)
                                + (context / r) * self.entry_values(l, head_dim)
                        }
                        None => 0,
                    }
            })
            .sum()
    }
}

/// Whether a DeepSeek-V4 config.json declares FP4 routed experts (`expert_dtype` `fp4`, at the
/// top level as released or inside `quantization_config`, where transformers moves it): e2m1
/// codes with e8m0 scales per 32 columns, MXFP4's bits.
pub fn declares_fp4(config: &Value) -> bool {
    config.get("model_type").and_then(Value::as_str) == Some("deepseek_v4")
        && [
            config.get("expert_dtype"),
            config
                .get("quantization_config")
                .and_then(|q| q.get("expert_dtype")),
        ]
        .into_iter()
        .flatten()
        .any(|v| v.as_str() == Some("fp4"))
}

fn layer_kinds(f: &Fields<'_>, n: usize) -> Result<Vec<V4Attention>, FormatError> {
    let pre = f.prefix;
    let kind = |t: &str| {
        match t {
        "sliding_attention" => Ok(V4Attention::Sliding),
        "compressed_sparse_attention" => Ok(V4Attention::Csa),
        "heavily_compressed_attention" => Ok(V4Attention::Hca),
        o => Err(f.err(format!(
            "{pre}layer_types entry {o:?} (sliding_attention, compressed_sparse_attention or heavily_compressed_attention)"
        ))),
    }
    };
    let mut kinds = if let Some(t) = f.strings("layer_types")? {
        t.iter().map(|t| kind(t)).collect::<Result<Vec<_>, _>>()?
    } else if let Some(r) = f.get("compress_ratios").filter(|v| !v.is_null()) {
        // The released configs: one ratio per layer (and one for the MTP layer), 0, 4 or 128
        // picking the kind (`_COMPRESS_RATIO_TO_LAYER_TYPE`); the block is `compress_rates`'.
        let list = r.as_array().ok_or_else(|| {
            f.err(format!(
                "{pre}compress_ratios must be a list of integers, found {r}"
            ))
        })?;
        list.iter()
            .enumerate()
            .map(|(i, v)| match v.as_u64() {
                Some(0) => Ok(V4Attention::Sliding),
                Some(4) => Ok(V4Attention::Csa),
                Some(128) => Ok(V4Attention::Hca),
                _ => Err(f.err(format!(
                    "{pre}compress_ratios[{i}] (layer {i}) is {v}: expected 0 (sliding), 4 (CSA) or 128 (HCA)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        // V4-Pro's default: two HCA layers, then CSA and HCA alternating.
        let mut k = vec![V4Attention::Hca; n.min(2)];
        k.extend((0..n.saturating_sub(2)).map(|i| {
            if i % 2 == 1 {
                V4Attention::Csa
            } else {
                V4Attention::Hca
            }
        }));
        k
    };
    if kinds.len() < n {
        return Err(f.err(format!(
            "{pre}layer_types (or compress_ratios) lists {} layers, {pre}num_hidden_layers is {n}",
            kinds.len()
        )));
    }
    kinds.truncate(n);
    Ok(kinds)
}

fn hash_layers(f: &Fields<'_>, n: usize) -> Result<Vec<bool>, FormatError> {
    let pre = f.prefix;
    if let Some(t) = f.strings("mlp_layer_types")? {
        if t.len() < n {
            return Err(f.err(format!(
                "{pre}mlp_layer_types lists {} layers, {pre}num_hidden_layers is {n}",
                t.len()
            )));
        }
        return t[..n]
            .iter()
            .map(|t| match *t {
                "hash_moe" => Ok(true),
                "moe" => Ok(false),
                o => Err(f.err(format!(
                    "{pre}mlp_layer_types entry {o:?} (\"hash_moe\" or \"moe\")"
                ))),
            })
            .collect();
    }
    let k = f.usize("num_hash_layers")?.unwrap_or(3);
    Ok((0..n).map(|i| i < k).collect())
}

/// The main (sliding) and compressed layers' RoPE: `(main theta, compress theta, YaRN,
/// attention factor)` as `DeepseekV4Config.__post_init__` resolves them.
///
/// `rope_dim` is the rotated width the top-level keys give: a nested `{main, compress}` form
/// rotates `int(head_dim * partial_rotary_factor)` of its own (1 when absent, as transformers'
/// `compute_default_rope_parameters` reads it), which must be the same.
fn ropes(
    f: &Fields<'_>,
    head_dim: usize,
    rope_dim: usize,
) -> Result<(f64, f64, Option<Yarn>, f32), FormatError> {
    let pre = f.prefix;
    let mut main = f.f64("rope_theta")?.unwrap_or(10_000.0);
    let mut compress = f.f64("compress_rope_theta")?.unwrap_or(160_000.0);
    // `rope_scaling or rope_parameters`: a non-empty `rope_scaling` wins.
    let params = f
        .object("rope_scaling", "rope_scaling.")
        .filter(|p| p.v.as_object().is_some_and(|o| !o.is_empty()))
        .or_else(|| f.object("rope_parameters", "rope_parameters."));
    let Some(p) = params else {
        return Ok((main, compress, None, 1.0));
    };
    let nested = |key: &str| {
        p.get(key).filter(|v| v.is_object()).map(|v| Fields {
            v,
            file: f.file,
            prefix: if key == "main" {
                "rope_parameters.main."
            } else {
                "rope_parameters.compress."
            },
        })
    };
    let ty = |q: &Fields<'_>| {
        q.get("rope_type")
            .or_else(|| q.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string()
    };
    let (yarn_block, forced_one) = match (nested("main"), nested("compress")) {
        (Some(m), Some(c)) => {
            for q in [&m, &c] {
                let d = (head_dim as f64 * q.f64("partial_rotary_factor")?.unwrap_or(1.0)) as usize;
                if d != rope_dim {
                    return Err(FormatError::Unsupported(format!(
                        "{}partial_rotary_factor rotates {d} of {head_dim} dimensions, the config's top level {rope_dim}: coli rotates one width on every layer",
                        q.prefix
                    )));
                }
            }
            if ty(&m) != "default" {
                return Err(FormatError::Unsupported(format!(
                    "{pre}rope_parameters.main.rope_type {:?} (DeepSeek-V4's sliding layers use the default RoPE)",
                    ty(&m)
                )));
            }
            if let Some(t) = m.f64("rope_theta")? {
                main = t;
            }
            // `convert_rope_params_to_dict` fills a nested dict's missing theta with
            // `rope_theta`, not `compress_rope_theta`.
            compress = match c.f64("rope_theta")? {
                Some(t) => t,
                None => f.f64("rope_theta")?.unwrap_or(10_000.0),
            };
            (c, false)
        }
        _ => (p, true),
    };
    let yarn = match ty(&yarn_block).as_str() {
        "default" => None,
        "yarn" => {
            let q = &yarn_block;
            let factor = q
                .f64("factor")?
                .ok_or_else(|| q.err(format!("{}factor is required for yarn", q.prefix)))?;
            // `_compute_yarn_parameters`: `max_position_embeddings` when absent.
            let orig = match q.f64("original_max_position_embeddings")? {
                Some(o) => o,
                None => f.f64("max_position_embeddings")?.unwrap_or(1_048_576.0),
            };
            if !(factor.is_finite() && factor >= 1.0 && orig.is_finite() && orig > 0.0) {
                return Err(q.err(format!(
                    "{}factor {factor} must be at least 1 and original_max_position_embeddings {orig} positive",
                    q.prefix
                )));
            }
            Some(Yarn {
                factor,
                original_max_position_embeddings: orig,
                // `beta_fast or 32`, `beta_slow or 1`: a 0 is the default too.
                beta_fast: q.f64("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: q.f64("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                mscale: q.f64("mscale")?,
                mscale_all_dim: q.f64("mscale_all_dim")?,
                // Read from the top-level `{main, compress}` dict, which never has it.
                truncate: true,
            })
        }
        other => {
            return Err(FormatError::Unsupported(format!(
                "{}rope type {other:?} on DeepSeek-V4's compressed layers (default and yarn run)",
                yarn_block.prefix
            )))
        }
    };
    let factor = match (&yarn, yarn_block.f64("attention_factor")?) {
        (None, _) => 1.0,
        (Some(_), Some(a)) => a as f32,
        (Some(_), None) if forced_one => 1.0,
        (Some(y), None) => match (y.mscale, y.mscale_all_dim) {
            (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                (super::mla::yarn_mscale(y.factor, m) / super::mla::yarn_mscale(y.factor, ma))
                    as f32
            }
            _ => super::mla::yarn_mscale(y.factor, 1.0) as f32,
        },
    };
    for (key, t) in [("rope_theta", main), ("compress_rope_theta", compress)] {
        if !(t.is_finite() && t > 0.0) {
            return Err(f.err(format!("{pre}{key} {t} must be a positive finite number")));
        }
    }
    if !(factor.is_finite() && factor > 0.0) {
        return Err(f.err(format!(
            "{pre}the compressed layers' YaRN attention_factor {factor} must be positive"
        )));
    }
    Ok((main, compress, yarn, factor))
}

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    let pre = f.prefix;
    let n = s.num_layers;
    if f.get("head_dim").is_none() {
        s.head_dim = 512;
    }
    if f.get("num_key_value_heads").is_none() {
        s.num_kv_heads = 1;
    }
    if s.num_kv_heads != 1 {
        return Err(f.err(format!(
            "{pre}num_key_value_heads {} (DeepSeek-V4 attends with one shared key-value head)",
            s.num_kv_heads
        )));
    }
    if f.bool("attention_bias")? == Some(true) || f.bool("mlp_bias")? == Some(true) {
        return Err(FormatError::Unsupported(format!(
            "deepseek_v4 with {pre}attention_bias or {pre}mlp_bias true (no release has biases)"
        )));
    }
    s.num_experts = match f.usize("n_routed_experts")? {
        Some(e) => e,
        None => f.usize("num_local_experts")?.unwrap_or(256),
    };
    s.moe_intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(2048);
    s.max_position_embeddings = f.usize("max_position_embeddings")?.unwrap_or(1_048_576);
    if f.get("bos_token_id").is_none() {
        s.bos_token_id = Some(0);
    }
    if f.get("eos_token_id").is_none() && s.eos_token_ids.is_empty() {
        s.eos_token_ids = vec![1];
    }
    // transformers builds one shared expert of `moe_intermediate_size` whatever the count says.
    let shared = f.usize("n_shared_experts")?.unwrap_or(1);
    if shared != 1 {
        return Err(f.err(format!(
            "{pre}n_shared_experts {shared}: DeepSeek-V4 has one shared expert (transformers builds one whatever the count)"
        )));
    }
    s.n_shared_experts = 1;
    s.norm_topk_prob = true;
    let scaling = f.f64("routed_scaling_factor")?.unwrap_or(1.5);
    if !(scaling.is_finite() && scaling > 0.0) {
        return Err(f.err(format!(
            "{pre}routed_scaling_factor {scaling} must be a positive finite number"
        )));
    }
    s.routing = match f.str("scoring_func")?.unwrap_or("sqrtsoftplus") {
        "sqrtsoftplus" => Routing::SqrtSoftplus {
            scaling: scaling as f32,
        },
        "sigmoid" => Routing::GroupedSigmoid {
            n_group: 1,
            topk_group: 1,
            renormalize: true,
            scaling: scaling as f32,
        },
        other => {
            return Err(FormatError::Unsupported(format!(
                "{pre}scoring_func {other:?} for deepseek_v4 (sqrtsoftplus and sigmoid run)"
            )))
        }
    };
    super::glm5_next::clamped_swiglu(f, s)?;
    s.moe_layers = vec![s.num_experts > 0; n];

    s.hyper = Some(super::glm5_next::hyper_spec(f)?);

    let rates = f.object("compress_rates", "compress_rates.");
    let rate = |key: &str, legacy: &str, default: usize| -> Result<usize, FormatError> {
        let r = match f.usize(legacy)? {
            Some(r) => r,
            None => match &rates {
                Some(r) => r.usize(key)?.unwrap_or(default),
                None => default,
            },
        };
        if r == 0 {
            return Err(f.err(format!("{pre}compress_rates.{key} is 0")));
        }
        Ok(r)
    };
    let csa_rate = rate("compressed_sparse_attention", "compress_rate_csa", 4)?;
    let hca_rate = rate("heavily_compressed_attention", "compress_rate_hca", 128)?;
    let window = f.usize("sliding_window")?.unwrap_or(128);
    let q_lora_rank = f.usize("q_lora_rank")?.unwrap_or(1024);
    let o_groups = f.usize("o_groups")?.unwrap_or(8);
    let o_lora_rank = f.usize("o_lora_rank")?.unwrap_or(1024);
    let index_heads = f.usize("index_n_heads")?.unwrap_or(64);
    let index_head_dim = f.usize("index_head_dim")?.unwrap_or(128);
    let index_topk = f.usize("index_topk")?.unwrap_or(512);
    for (key, v) in [
        ("sliding_window", window),
        ("q_lora_rank", q_lora_rank),
        ("o_groups", o_groups),
        ("o_lora_rank", o_lora_rank),
        ("index_n_heads", index_heads),
        ("index_head_dim", index_head_dim),
        ("index_topk", index_topk),
    ] {
        if v == 0 {
            return Err(f.err(format!("{pre}{key} is 0")));
        }
    }
    if !(s.num_heads * s.head_dim).is_multiple_of(o_groups) || !s.num_heads.is_multiple_of(o_groups)
    {
        return Err(f.err(format!(
            "{pre}o_groups {o_groups} must divide num_attention_heads {}",
            s.num_heads
        )));
    }
    let rope_dim = match f.f64("partial_rotary_factor")? {
        Some(p) => (s.head_dim as f64 * p) as usize,
        None => match f.usize("qk_rope_head_dim")? {
            Some(d) => d,
            None => s.head_dim * 64 / 512,
        },
    };
    if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > s.head_dim {
        return Err(f.err(format!(
            "the rotated dimensions {rope_dim} ({pre}partial_rotary_factor or {pre}qk_rope_head_dim) must be even, positive and at most head_dim {}",
            s.head_dim
        )));
    }
    if index_head_dim < rope_dim || index_head_dim % 2 != 0 {
        return Err(f.err(format!(
            "{pre}index_head_dim {index_head_dim} must be even and hold the rotated dimensions {rope_dim}"
        )));
    }
    let (main_theta, compress_theta, compress_yarn, factor) = ropes(f, s.head_dim, rope_dim)?;
    s.rope_theta = main_theta;
    s.rotary_dim = rope_dim;
    s.sliding_window = Some(window);
    s.sliding_layers = vec![true; n];
    s.unconverted_mtp_layers = f.usize("num_nextn_predict_layers")?.unwrap_or(1);
    s.deepseek_v4 = Some(DeepseekV4Spec {
        attention: layer_kinds(f, n)?,
        hash_layers: hash_layers(f, n)?,
        csa_rate,
        hca_rate,
        window,
        q_lora_rank,
        o_groups,
        o_lora_rank,
        index_heads,
        index_head_dim,
        index_topk,
        rope_dim,
        main_theta,
        compress_theta,
        compress_yarn,
        compress_attention_factor: factor,
        routed_scaling_factor: scaling as f32,
        swiglu_limit: s.swiglu_limit.unwrap_or(10.0),
    });
    Ok(())
}

fn t(name: String, shape: &[usize], kind: TensorKind) -> TensorSpec {
    TensorSpec::new(name, shape, TensorClass::Dense, kind)
}

fn linear(name: String, rows: usize, cols: usize) -> LinearSpec {
    build::linear(&name, rows, cols, false, TensorClass::Dense)
}

/// `{p}_{fn,base,scale}` of `rows` logits over the `N H` stream values (`scale` `[scales]`).
fn hyper(p: &str, rows: usize, cols: usize, scales: usize) -> HyperConnSpec {
    HyperConnSpec {
        proj: t(format!("{p}_fn"), &[rows, cols], TensorKind::Mixing),
        base: t(format!("{p}_base"), &[rows], TensorKind::Mixing),
        scale: t(format!("{p}_scale"), &[scales], TensorKind::Mixing),
    }
}

fn compressor(p: &str, width: usize, rate: usize, head_dim: usize, h: usize) -> CompressorSpec {
    CompressorSpec {
        kv: linear(format!("{p}.wkv"), width, h),
        gate: linear(format!("{p}.wgate"), width, h),
        ape: t(format!("{p}.ape"), &[rate, width], TensorKind::Mixing),
        norm: t(format!("{p}.norm.weight"), &[head_dim], TensorKind::Norm),
    }
}

fn layer(s: &ModelSpec, v: &DeepseekV4Spec, hc: &HyperSpec, i: usize) -> LayerSpec {
    let p = format!("layers.{i}");
    let (h, hd, nh) = (s.hidden_size, s.head_dim, s.num_heads);
    let a = format!("{p}.attn");
    let kind = v.attention[i];
    let rate = v.rate(i).unwrap_or(0);
    let attention = DeepseekV4AttentionSpec {
        q_a: linear(format!("{a}.wq_a"), v.q_lora_rank, h),
        q_norm: t(
            format!("{a}.q_norm.weight"),
            &[v.q_lora_rank],
            TensorKind::Norm,
        ),
        q_b: linear(format!("{a}.wq_b"), nh * hd, v.q_lora_rank),
        kv: linear(format!("{a}.wkv"), hd, h),
        kv_norm: t(format!("{a}.kv_norm.weight"), &[hd], TensorKind::Norm),
        o_a: linear(
            format!("{a}.wo_a"),
            v.o_groups * v.o_lora_rank,
            nh * hd / v.o_groups,
        ),
        o_b: linear(format!("{a}.wo_b"), h, v.o_groups * v.o_lora_rank),
        sinks: t(format!("{a}.attn_sink"), &[nh], TensorKind::Mixing),
        compressor: (kind != V4Attention::Sliding).then(|| {
            let width = if kind == V4Attention::Csa { 2 * hd } else { hd };
            compressor(&format!("{a}.compressor"), width, rate, hd, h)
        }),
        indexer: (kind == V4Attention::Csa).then(|| {
            let ix = format!("{a}.indexer");
            let id = v.index_head_dim;
            DeepseekV4IndexerSpec {
                q_b: linear(format!("{ix}.wq_b"), v.index_heads * id, v.q_lora_rank),
                weights: linear(format!("{ix}.weights_proj"), v.index_heads, h),
                compressor: compressor(&format!("{ix}.compressor"), 2 * id, rate, id, h),
            }
        }),
    };
    let f = format!("{p}.ffn");
    let (e, k, im) = (s.num_experts, s.top_k, s.moe_intermediate_size);
    let hash = v.hash_layers[i];
    let mlp =
        |w: &str, rows: usize, cols: usize| linear(format!("{f}.shared_experts.{w}"), rows, cols);
    let ffn = FfnSpec::Moe(MoeSpec {
        latent: None,
        router: t(format!("{f}.gate.weight"), &[e, h], TensorKind::Router),
        router_bias: (!hash).then(|| t(format!("{f}.gate.bias"), &[e], TensorKind::Bias)),
        router_logit_bias: None,
        shared: Some(Box::new(MlpSpec {
            gate: mlp("w1", im, h),
            up: mlp("w3", im, h),
            down: mlp("w2", h, im),
        })),
        shared_gate: None,
        experts: ExpertsSpec {
            layer: i as u32,
            count: e as u32,
            hidden: h,
            intermediate: im,
            class: TensorClass::RoutedExpert,
            prefix: format!("{f}.experts"),
            storage: ExpertStorage::PerExpert(["w1", "w3", "w2"]),
            biases: false,
        },
        hash_table: hash.then(|| {
            t(
                format!("{f}.gate.tid2eid"),
                &[s.vocab_size, k],
                TensorKind::Lookup,
            )
        }),
    });
    let n = hc.mult;
    LayerSpec {
        attn_res: None,
        index: i,
        input_norm: t(format!("{p}.attn_norm.weight"), &[h], TensorKind::Norm),
        attention: AttentionSpec::DeepseekV4(Box::new(attention)),
        post_norm: t(format!("{p}.ffn_norm.weight"), &[h], TensorKind::Norm),
        ffn,
        hyper: Some(Box::new(LayerHyperSpec {
            attn: hyper(&format!("{p}.hc_attn"), (2 + n) * n, n * h, 3),
            ffn: hyper(&format!("{p}.hc_ffn"), (2 + n) * n, n * h, 3),
        })),
    }
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let v = s.deepseek_v4.as_ref().expect("configured");
    let hc = s.hyper.as_ref().expect("configured");
    let (vocab, h, n) = (s.vocab_size, s.hidden_size, hc.mult);
    let head = t("head.weight".into(), &[vocab, h], TensorKind::OutputHead);
    ModelTensors {
        final_res: None,
        embed: t("embed.weight".into(), &[vocab, h], TensorKind::Embedding),
        embed_norm: None,
        layers: (0..s.num_layers).map(|i| layer(s, v, hc, i)).collect(),
        final_norm: t("norm.weight".into(), &[h], TensorKind::Norm),
        lm_head: if s.tie_word_embeddings {
            head.optional()
        } else {
            head
        },
        mtp: vec![],
        final_query: None,
        hyper_head: Some(hyper("hc_head", n, n * h, 1)),
    }
}
