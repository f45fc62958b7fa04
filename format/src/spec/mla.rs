//! The MLA, YaRN, grouped-sigmoid-routing and DSA parts of a DeepSeek-V3-style config.json,
//! read with `DeepseekV3Config`'s / `GlmMoeDsaConfig`'s / `DeepseekV32Config`'s defaults
//! (transformers 5.23).

use super::json::Fields;
use super::Family;
use crate::FormatError;

/// YaRN parameters (`rope_scaling` / `rope_parameters` with `type`/`rope_type` `"yarn"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// `factor` (context extension ratio).
    pub factor: f64,
    /// `original_max_position_embeddings` (tokens).
    pub original_max_position_embeddings: f64,
    /// `beta_fast` (default 32).
    pub beta_fast: f64,
    /// `beta_slow` (default 1).
    pub beta_slow: f64,
    /// `mscale` (None when absent).
    pub mscale: Option<f64>,
    /// `mscale_all_dim` (None when absent).
    pub mscale_all_dim: Option<f64>,
    /// `truncate` (default true): round the correction range to whole dimensions (floor/ceil)
    /// in `_compute_yarn_parameters`; gpt-oss sets false.
    pub truncate: bool,
}

/// The MLA / DeepSeek-V3 specific part of config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct MlaSpec {
    /// `q_lora_rank` (None: plain `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank` (latent width, values per token in the cache besides `k_pe`).
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim` (RoPE dimension, one shared key head).
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// `rope_interleave` (default true): rotate pairs `(x[2i], x[2i+1])`.
    pub rope_interleave: bool,
    /// No RoPE at all (Kimi-Linear's `mla_use_nope`): the `qk_rope_head_dim` part of the
    /// queries and of the shared key is used as projected, unrotated.
    pub nope: bool,
    /// YaRN scaling, when configured.
    pub yarn: Option<Yarn>,
    /// `(dn + dr)^-0.5`, times `mscale(factor, mscale_all_dim)^2` under YaRN.
    pub softmax_scale: f32,
    /// Epsilon of `q_a_layernorm` / `kv_a_layernorm`: 1e-6 where transformers builds them
    /// without one (DeepSeek-V3, GLM-5, Kimi-Linear), `rms_norm_eps` in GLM-5.3-Flash.
    pub latent_norm_eps: f32,
    /// Routing groups `n_group` (1: no group step).
    pub n_group: usize,
    /// Groups kept per token, `topk_group`.
    pub topk_group: usize,
    /// `routed_scaling_factor`, multiplies the routing weights.
    pub routed_scaling_factor: f32,
    /// `n_shared_experts` (shared SwiGLU of `moe_intermediate_size * n_shared_experts`).
    pub n_shared_experts: usize,
    /// Layers below this index have a dense MLP.
    pub first_k_dense_replace: usize,
    /// A layer at or past `first_k_dense_replace` is MoE when `layer % moe_layer_freq == 0`.
    pub moe_layer_freq: usize,
    /// `num_nextn_predict_layers` (MTP layers stored after the decoder layers; 0 or 1).
    pub num_nextn_predict_layers: usize,
    /// GLM-5 / DeepSeek-V3.2 `mlp_layer_types` (true = `"sparse"`, MoE); None: derived from
    /// `first_k_dense_replace` / `moe_layer_freq`.
    pub mlp_sparse: Option<Vec<bool>>,
    /// GLM-5 DSA indexer (`glm_moe_dsa`), None for DeepSeek-V3 / Kimi-K2.
    pub dsa: Option<DsaSpec>,
    /// `kv_b_proj` held as llama.cpp splits it (config key `mla_kv_b_split`, which
    /// `coli-convert` writes for a deepseek2 GGUF; no Hugging Face config has it): see
    /// [`super::MlaKvBSpec::Split`].
    pub kv_b_split: bool,
}

/// The DSA lightning indexer parameters of a GLM-5 or DeepSeek-V3.2 config.
#[derive(Clone, Debug, PartialEq)]
pub struct DsaSpec {
    /// Indexer heads (`index_n_heads`).
    pub n_heads: usize,
    /// Indexer head dimension (`index_head_dim`); its first `qk_rope_head_dim` values get RoPE.
    pub head_dim: usize,
    /// Keys kept per query (`index_topk`).
    pub topk: usize,
    /// Per main layer: true = `"full"` (runs its indexer), false = `"shared"` (reuses the
    /// previous full layer's selection).
    pub full: Vec<bool>,
    /// The indexer's RoPE on its first `qk_rope_head_dim` dimensions: interleaved pairs
    /// (GLM-5, `apply_rotary_pos_emb_interleave` in `GlmMoeDsaIndexer`) or `rotate_half` halves
    /// (DeepSeek-V3.2, `apply_rotary_pos_emb` in `DeepseekV32Indexer`).
    pub rope_interleave: bool,
    /// GLM-5.3-Flash: the indexer scores pools of keys, not keys (None: every key).
    pub kpool: Option<KPool>,
}

/// GLM-5.3-Flash's k-pool indexer (`Glm5NextTextIndexer`): keys are grouped into pools of
/// `size` consecutive positions, each complete pool scored through one key (a per-channel
/// softmax-weighted mean of its keys), `index_topk / size` pools selected and expanded back to
/// their positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KPool {
    /// Positions per pool (`index_kpool`).
    pub size: usize,
    /// The query's own incomplete pool is always attended (`index_kpool_always_select_tail`).
    pub select_tail: bool,
}

impl DsaSpec {
    /// f32 values a full layer's indexer keeps per position: its key, and with k-pools the
    /// position's pooling logits and the key of the pool it closes (`3 index_head_dim`).
    pub fn cached_dim(&self) -> usize {
        match self.kpool {
            Some(_) => 3 * self.head_dim,
            None => self.head_dim,
        }
    }

    /// Whether `layer` runs its own indexer (layers past the list, such as the MTP layer, do).
    pub fn is_full(&self, layer: usize) -> bool {
        self.full.get(layer).copied().unwrap_or(true)
    }

    /// Reads `index_n_heads` (default `default_heads`: 32 for `GlmMoeDsaConfig`, 64 for
    /// `DeepseekV32Config`), `index_head_dim` (default 128), `index_topk` (default 2048) and the
    /// per-layer indexer types
    /// (`indexer_types`, else `index_topk_pattern` as a string of F/S or a list, else
    /// `index_topk_freq` / `index_skip_topk_offset`), and checks `layer_types`.
    pub(crate) fn read(
        f: &Fields<'_>,
        num_layers: usize,
        rope_dim: usize,
        default_heads: usize,
        per_layer_types: bool,
    ) -> Result<DsaSpec, FormatError> {
        let n_heads = f.usize("index_n_heads")?.unwrap_or(default_heads);
        let head_dim = f.usize("index_head_dim")?.unwrap_or(128);
        let topk = f.usize("index_topk")?.unwrap_or(2048);
        if n_heads == 0 || topk == 0 || head_dim < rope_dim || head_dim == 0 {
            return Err(f.err(format!(
                "index_n_heads {n_heads}, index_topk {topk} must be positive and index_head_dim {head_dim} >= qk_rope_head_dim {rope_dim}"
            )));
        }
        if !per_layer_types {
            // DeepSeek-V3.2: every layer builds its indexer; no per-layer keys are read.
            return Ok(DsaSpec {
                n_heads,
                head_dim,
                topk,
                full: vec![true; num_layers],
                rope_interleave: false,
                kpool: None,
            });
        }
        if let Some(lt) = f.strings("layer_types")? {
            if lt.len() != num_layers {
                return Err(f.err(format!(
                    "layer_types has {} entries for {num_layers} layers",
                    lt.len()
                )));
            }
            if let Some(other) = lt.iter().find(|t| **t != "indexed_attention") {
                return Err(FormatError::Unsupported(format!(
                    "layer_types entry {other:?} (glm_moe_dsa layers are \"indexed_attention\")"
                )));
            }
        }
        let full = Self::indexer_types(f, num_layers)?;
        if full.first() == Some(&false) {
            return Err(f.err(
                "indexer_types[0] is \"shared\" but no earlier full layer has a selection to share",
            ));
        }
        Ok(DsaSpec {
            n_heads,
            head_dim,
            topk,
            full,
            rope_interleave: true,
            kpool: None,
        })
    }

    /// Per layer, whether it runs its own indexer: `indexer_types` (`"full"` / `"shared"`),
    /// else `index_topk_pattern` (a string of F/S or a list), else `index_topk_freq` /
    /// `index_skip_topk_offset` (`"full"` when `max(i - offset + 1, 0) % freq == 0`), as
    /// transformers' `GlmMoeDsaConfig` and `Glm5NextTextConfig` resolve them.
    pub(crate) fn indexer_types(
        f: &Fields<'_>,
        num_layers: usize,
    ) -> Result<Vec<bool>, FormatError> {
        let types: Vec<String> = match f.strings("indexer_types")? {
            Some(t) => t.into_iter().map(str::to_string).collect(),
            None => match f.get("index_topk_pattern") {
                Some(serde_json::Value::String(p)) => p
                    .chars()
                    .map(|c| match c {
                        'F' => Ok("full".to_string()),
                        'S' => Ok("shared".to_string()),
                        o => {
                            Err(f.err(format!("{}index_topk_pattern has {o:?} (F or S)", f.prefix)))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                Some(serde_json::Value::Array(_)) => f
                    .strings("index_topk_pattern")?
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
                _ => {
                    let freq = f.usize("index_topk_freq")?.unwrap_or(1).max(1);
                    let offset = f.usize("index_skip_topk_offset")?.unwrap_or(2);
                    (0..num_layers)
                        .map(|i| {
                            if (i + 1).saturating_sub(offset) % freq == 0 {
                                "full".to_string()
                            } else {
                                "shared".to_string()
                            }
                        })
                        .collect()
                }
            },
        };
        if types.len() != num_layers {
            return Err(f.err(format!(
                "{}indexer_types has {} entries for {num_layers} layers",
                f.prefix,
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full" => Ok(true),
                "shared" => Ok(false),
                o => Err(f.err(format!(
                    "{}indexer_types entry {o:?} (\"full\" or \"shared\")",
                    f.prefix
                ))),
            })
            .collect::<Result<Vec<bool>, _>>()
    }
}

/// transformers' `get_mscale` / `yarn_get_mscale`: `0.1 * m * ln(scale) + 1`, 1 when scale <= 1.
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The RoPE base and YaRN parameters of `rope_parameters` (transformers 5) or `rope_theta` +
/// `rope_scaling` (older configs): rope types `default` and `yarn` (`family` names the family in
/// the error for any other). Returns `rope_theta` when set (top level or inside the
/// parameters) and the YaRN parameters when the type is yarn.
///
/// # Errors
/// [`FormatError::Config`] for a yarn block without factor or original length;
/// [`FormatError::Unsupported`] for another rope type.
pub(crate) fn rope_params(
    f: &Fields<'_>,
    family: &str,
) -> Result<(Option<f64>, Option<Yarn>), FormatError> {
    let params = f
        .object("rope_parameters", "rope_parameters.")
        .or_else(|| f.object("rope_scaling", "rope_scaling."));
    let mut rope_theta = f.f64("rope_theta")?;
    let mut yarn = None;
    if let Some(p) = params {
        if let Some(t) = p.f64("rope_theta")? {
            rope_theta = Some(t);
        }
        let ty = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        match ty {
            "default" => {}
            "yarn" => {
                let factor = p
                    .f64("factor")?
                    .ok_or_else(|| f.err("yarn rope scaling without factor"))?;
                let orig = p
                    .f64("original_max_position_embeddings")?
                    .or(f.f64("max_position_embeddings")?)
                    .ok_or_else(|| f.err("yarn needs original_max_position_embeddings"))?;
                if !(factor.is_finite() && factor > 0.0 && orig.is_finite() && orig > 0.0) {
                    return Err(f.err(format!(
                        "yarn factor {factor} and original_max_position_embeddings {orig} must be positive"
                    )));
                }
                yarn = Some(Yarn {
                    factor,
                    original_max_position_embeddings: orig,
                    beta_fast: p.f64("beta_fast")?.unwrap_or(32.0),
                    beta_slow: p.f64("beta_slow")?.unwrap_or(1.0),
                    mscale: p.f64("mscale")?,
                    mscale_all_dim: p.f64("mscale_all_dim")?,
                    truncate: p.bool("truncate")?.unwrap_or(true),
                });
            }
            other => {
                return Err(FormatError::Unsupported(format!(
                    "rope type {other:?} ({family} runs default and yarn)"
                )))
            }
        }
    }
    Ok((rope_theta, yarn))
}

/// The defaults a DeepSeek-V3-style config class gives the keys config.json may omit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaDefaults {
    /// `n_group`.
    pub n_group: usize,
    /// `topk_group`.
    pub topk_group: usize,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f64,
    /// `n_shared_experts`.
    pub n_shared_experts: usize,
    /// `first_k_dense_replace`.
    pub first_k_dense_replace: usize,
    /// `q_lora_rank` when the key is absent (an explicit null means no q LoRA).
    pub q_lora_rank: Option<usize>,
    /// `num_nextn_predict_layers` (`num_mtp_layers`).
    pub num_nextn_predict_layers: usize,
}

impl MlaDefaults {
    /// The class defaults of transformers 5.23: `DeepseekV3Config` (n_group 8, topk_group 4,
    /// scaling 2.5, 1 shared expert, 3 dense layers, q_lora_rank 1536, 1 MTP layer),
    /// `DeepseekV32Config` (the same, no MTP field), `GlmMoeDsaConfig` (n_group 1, topk_group
    /// 1, q_lora_rank 2048, no MTP field). Other families get DeepSeek-V3's.
    pub fn of(family: Family) -> MlaDefaults {
        let v3 = MlaDefaults {
            n_group: 8,
            topk_group: 4,
            routed_scaling_factor: 2.5,
            n_shared_experts: 1,
            first_k_dense_replace: 3,
            q_lora_rank: Some(1536),
            num_nextn_predict_layers: 1,
        };
        match family {
            Family::DeepseekV32 => MlaDefaults {
                num_nextn_predict_layers: 0,
                ..v3
            },
            Family::GlmMoeDsa => MlaDefaults {
                n_group: 1,
                topk_group: 1,
                q_lora_rank: Some(2048),
                num_nextn_predict_layers: 0,
                ..v3
            },
            _ => v3,
        }
    }
}

impl MlaSpec {
    /// Reads the MLA, RoPE and routing keys of a DeepSeek-V3-style config (`f`) with the
    /// defaults of `family`'s config class (transformers 5.23 `DeepseekV3Config`,
    /// `GlmMoeDsaConfig`, `DeepseekV32Config`: see [`MlaDefaults::of`]); `num_experts` is
    /// `n_routed_experts`. GLM-5 and DeepSeek-V3.2: MLA RoPE always interleaved, the DSA
    /// indexer keys ([`DsaSpec`]) are read too (V3.2: every layer runs its indexer, whose RoPE
    /// is half-split); GLM-5 also reads `mlp_layer_types`.
    ///
    /// # Errors
    /// [`FormatError::Config`] for missing/mistyped keys or groups that do not divide the
    /// experts; [`FormatError::Unsupported`] for another rope type, scoring or top-k method,
    /// or more than one MTP layer.
    pub(crate) fn read(
        f: &Fields<'_>,
        num_experts: usize,
        default_theta: f64,
        family: Family,
    ) -> Result<MlaSpec, FormatError> {
        let d = MlaDefaults::of(family);
        let glm = family == Family::GlmMoeDsa;
        let dsa_family = glm || family == Family::DeepseekV32;
        if let Some(s) = f.get("scoring_func").and_then(|v| v.as_str()) {
            if s != "sigmoid" {
                return Err(FormatError::Unsupported(format!(
                    "scoring_func {s:?} (only sigmoid for deepseek_v3)"
                )));
            }
        }
        if let Some(s) = f.get("topk_method").and_then(|v| v.as_str()) {
            if s != "noaux_tc" {
                return Err(FormatError::Unsupported(format!(
                    "topk_method {s:?} (only noaux_tc for deepseek_v3)"
                )));
            }
        }
        let (rope_theta, yarn) = rope_params(f, "deepseek_v3")?;
        let qk_nope_head_dim = f.req_usize("qk_nope_head_dim")?;
        let qk_rope_head_dim = f.req_usize("qk_rope_head_dim")?;
        if qk_rope_head_dim == 0 || qk_rope_head_dim % 2 != 0 {
            return Err(f.err(format!(
                "qk_rope_head_dim {qk_rope_head_dim} must be even and positive"
            )));
        }
        let mut softmax_scale = ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5);
        if let Some(y) = &yarn {
            if let Some(m) = y.mscale_all_dim.filter(|&m| m != 0.0) {
                let s = yarn_mscale(y.factor, m);
                softmax_scale *= s * s;
            }
        }
        let num_layers = f.req_usize("num_hidden_layers")?;
        let (mlp_sparse, dsa) = if dsa_family {
            let sparse = match f.get("mlp_layer_types") {
                None => None,
                Some(serde_json::Value::Array(a)) if a.len() == num_layers => Some(
                    a.iter()
                        .map(|t| match t.as_str() {
                            Some("sparse") => Ok(true),
                            Some("dense") => Ok(false),
                            _ => Err(f.err(format!(
                                "mlp_layer_types entry {t} (\"dense\" or \"sparse\")"
                            ))),
                        })
                        .collect::<Result<Vec<bool>, _>>()?,
                ),
                Some(x) => {
                    return Err(f.err(format!(
                        "mlp_layer_types must list {num_layers} strings, found {x}"
                    )))
                }
            };
            // GLM-5: per-layer indexer types, interleaved indexer RoPE, 32 heads by default;
            // DeepSeek-V3.2 (DeepseekV32Attention always builds its indexer): every layer full,
            // half-split indexer RoPE, 64 heads.
            let heads = if glm { 32 } else { 64 };
            let dsa = DsaSpec::read(f, num_layers, qk_rope_head_dim, heads, glm)?;
            (sparse, Some(dsa))
        } else {
            (None, None)
        };
        let n_group = f.usize("n_group")?.unwrap_or(d.n_group).max(1);
        let topk_group = f.usize("topk_group")?.unwrap_or(d.topk_group).max(1);
        if !num_experts.is_multiple_of(n_group) || topk_group > n_group {
            return Err(f.err(format!(
                "n_group {n_group} must divide n_routed_experts {num_experts} and be >= topk_group {topk_group}"
            )));
        }
        let num_nextn_predict_layers = match f.usize("num_nextn_predict_layers")? {
            Some(n) => n,
            None => f
                .usize("num_mtp_layers")?
                .unwrap_or(d.num_nextn_predict_layers),
        };
        if num_nextn_predict_layers > 1 {
            return Err(FormatError::Unsupported(format!(
                "num_nextn_predict_layers {num_nextn_predict_layers}: coli runs at most one MTP layer"
            )));
        }
        Ok(MlaSpec {
            // Absent: the class default; an explicit null: no q LoRA (plain q_proj).
            q_lora_rank: match f.v.get("q_lora_rank") {
                None => d.q_lora_rank,
                Some(_) => f.usize("q_lora_rank")?,
            },
            kv_lora_rank: f.req_usize("kv_lora_rank")?,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim: f.req_usize("v_head_dim")?,
            rope_theta: rope_theta.unwrap_or(default_theta),
            rope_interleave: dsa_family || f.bool("rope_interleave")?.unwrap_or(true),
            nope: false,
            yarn,
            softmax_scale: softmax_scale as f32,
            latent_norm_eps: 1e-6,
            n_group,
            topk_group,
            routed_scaling_factor: f
                .f64("routed_scaling_factor")?
                .unwrap_or(d.routed_scaling_factor) as f32,
            n_shared_experts: f.usize("n_shared_experts")?.unwrap_or(d.n_shared_experts),
            first_k_dense_replace: f
                .usize("first_k_dense_replace")?
                .unwrap_or(d.first_k_dense_replace),
            moe_layer_freq: f.usize("moe_layer_freq")?.unwrap_or(1).max(1),
            num_nextn_predict_layers,
            mlp_sparse,
            dsa,
            kv_b_split: f.bool("mla_kv_b_split")?.unwrap_or(false),
        })
    }

    /// Whether main layer `layer` is a MoE layer: `mlp_layer_types[layer] == "sparse"` when
    /// given, else `layer >= first_k_dense_replace && layer % moe_layer_freq == 0`.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        match &self.mlp_sparse {
            Some(s) => s.get(layer).copied().unwrap_or(true),
            None => {
                layer >= self.first_k_dense_replace && layer.is_multiple_of(self.moe_layer_freq)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn dsa(v: &Value, layers: usize) -> Result<DsaSpec, FormatError> {
        let f = Fields {
            v,
            file: "config.json",
            prefix: "",
        };
        DsaSpec::read(&f, layers, 8, 32, true)
    }

    #[test]
    fn indexer_types_as_transformers_derives_them() {
        let base = json!({"index_n_heads": 4, "index_head_dim": 16, "index_topk": 8});
        let c = dsa(&base, 3).unwrap();
        assert_eq!(c.full, vec![true; 3]);
        assert!(c.is_full(3));
        let mut v = base.clone();
        v["index_topk_freq"] = json!(2);
        v["index_skip_topk_offset"] = json!(1);
        // full iff max(i - 1 + 1, 0) % 2 == 0
        assert_eq!(dsa(&v, 4).unwrap().full, vec![true, false, true, false]);
        let mut v = base.clone();
        v["index_topk_pattern"] = json!("FSSF");
        assert_eq!(dsa(&v, 4).unwrap().full, vec![true, false, false, true]);
        v["indexer_types"] = json!(["full", "shared"]);
        assert_eq!(dsa(&v, 2).unwrap().full, vec![true, false]);
        v["indexer_types"] = json!(["shared", "full"]);
        assert!(dsa(&v, 2).is_err());
        v["indexer_types"] = json!(["full", "sparse"]);
        let e = dsa(&v, 2).unwrap_err().to_string();
        assert!(e.contains("sparse"), "{e}");
        let mut v = base.clone();
        v["layer_types"] = json!(["indexed_attention", "full_attention"]);
        let e = dsa(&v, 2).unwrap_err().to_string();
        assert!(e.contains("full_attention"), "{e}");
        let mut v = base;
        v["index_head_dim"] = json!(4);
        assert!(dsa(&v, 2).is_err());
    }
}
