//! The DeepSeek Sparse Attention (DSA) lightning indexer of GLM-5 (`glm_moe_dsa`), as
//! transformers 5.23 `GlmMoeDsaIndexer` computes it (DeepSeek-V3.2's `Indexer` with GLM's
//! interleaved RoPE; written up in `docs/MLA.md`):
//!
//! ```text
//! iq = wq_b(q_lat)                         [T, ih, id]   q_lat = q_a_layernorm(q_a_proj(x)), shared with MLA
//! ik = LayerNorm_1e-6(wk(x), k_norm.weight, k_norm.bias)   [T, id]   one key head, cached per token
//! RoPE (interleaved pairs, the attention's frequencies) on the FIRST dr dims of every iq head and of ik
//! w  = weights_proj(x) * ih^-0.5           [T, ih]
//! score[i, j] = sum_h w[i, h] * relu(iq[i, h] . ik[j] * id^-0.5)     for keys j <= i
//! selected(i) = the index_topk keys with the largest score (every j <= i when i < index_topk)
//! ```
//! `x` is the attention input (after `input_layernorm`). The attention of query `i` is then
//! restricted to `selected(i)`. Ties at the top-k boundary go to the LOWEST position first
//! (transformers' `torch.topk` leaves ties unspecified; the fixtures have none).
//!
//! `indexer_types` (GLM-5.2 IndexShare): a `"full"` layer runs its indexer, a `"shared"` layer
//! reuses the selection of the nearest full layer before it (no indexer weights, no cached keys).

use crate::config::{cfg_err, get_usize, req_usize};
use crate::error::Result;
use crate::layers::linear::load_vector;
use crate::layers::mla::rope_apply;
use crate::layers::Linear;
use coli_store::Store;
use rayon::prelude::*;
use serde_json::Value;

/// Eps of `indexer.k_norm` (`nn.LayerNorm(head_dim, eps=1e-6)` in transformers).
pub const K_NORM_EPS: f32 = 1e-6;

/// The indexer part of a `glm_moe_dsa` config.json.
#[derive(Clone, Debug, PartialEq)]
pub struct DsaConfig {
    /// `index_n_heads` (ih).
    pub n_heads: usize,
    /// `index_head_dim` (id; the first `qk_rope_head_dim` values are rotated).
    pub head_dim: usize,
    /// `index_topk`: keys each query attends to (at most).
    pub topk: usize,
    /// Per decoder layer: true = `"full"` (runs its indexer), false = `"shared"` (reuses the
    /// previous full layer's selection). Layers past the list (the MTP layer) are full.
    pub full: Vec<bool>,
}

impl DsaConfig {
    /// Reads `index_n_heads`, `index_head_dim`, `index_topk` and `indexer_types` (or, as
    /// `GlmMoeDsaConfig.__post_init__` derives it: `index_topk_pattern` of `F`/`S`, else
    /// `"full"` iff `max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0` with
    /// defaults freq 1, offset 2, i.e. every layer full). `layer_types`, when present, must be
    /// `"indexed_attention"` for every layer (the only attention transformers 5.23 has for
    /// this family). `rope_dim` is `qk_rope_head_dim` (must not exceed `index_head_dim`).
    ///
    /// # Errors
    /// [`crate::EngineError::Config`] for missing/mistyped keys, lists of the wrong length,
    /// unknown indexer types, a first layer that is `"shared"`, zero sizes;
    /// [`crate::EngineError::Unsupported`] for another `layer_types` value.
    pub fn from_json(v: &Value, num_layers: usize, rope_dim: usize) -> Result<DsaConfig> {
        let n_heads = req_usize(v, "index_n_heads")?;
        let head_dim = req_usize(v, "index_head_dim")?;
        let topk = req_usize(v, "index_topk")?;
        if n_heads == 0 || topk == 0 || head_dim < rope_dim || head_dim == 0 {
            return Err(cfg_err(format!(
                "index_n_heads {n_heads}, index_topk {topk} must be positive and index_head_dim {head_dim} >= qk_rope_head_dim {rope_dim}"
            )));
        }
        let strings = |key: &str| -> Result<Option<Vec<String>>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| cfg_err(format!("{key} must list strings, found {x}")))
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(Some),
                Some(x) => Err(cfg_err(format!("{key} must be a list, found {x}"))),
            }
        };
        if let Some(lt) = strings("layer_types")? {
            if lt.len() != num_layers {
                return Err(cfg_err(format!(
                    "layer_types has {} entries for {num_layers} layers",
                    lt.len()
                )));
            }
            if let Some(other) = lt.iter().find(|t| *t != "indexed_attention") {
                return Err(crate::EngineError::Unsupported(format!(
                    "layer_types entry {other:?} (glm_moe_dsa layers are \"indexed_attention\")"
                )));
            }
        }
        let types: Vec<String> = match strings("indexer_types")? {
            Some(t) => t,
            None => match v.get("index_topk_pattern") {
                Some(Value::String(p)) => p
                    .chars()
                    .map(|c| match c {
                        'F' => Ok("full".to_string()),
                        'S' => Ok("shared".to_string()),
                        o => Err(cfg_err(format!("index_topk_pattern has {o:?} (F or S)"))),
                    })
                    .collect::<Result<Vec<_>>>()?,
                Some(Value::Array(_)) => strings("index_topk_pattern")?.unwrap_or_default(),
                _ => {
                    let freq = get_usize(v, "index_topk_freq")?.unwrap_or(1).max(1);
                    let offset = get_usize(v, "index_skip_topk_offset")?.unwrap_or(2);
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
            return Err(cfg_err(format!(
                "indexer_types has {} entries for {num_layers} layers",
                types.len()
            )));
        }
        let full = types
            .iter()
            .map(|t| match t.as_str() {
                "full" => Ok(true),
                "shared" => Ok(false),
                o => Err(cfg_err(format!(
                    "indexer_types entry {o:?} (\"full\" or \"shared\")"
                ))),
            })
            .collect::<Result<Vec<bool>>>()?;
        if full.first() == Some(&false) {
            return Err(cfg_err(
                "indexer_types[0] is \"shared\" but no earlier full layer has a selection to share",
            ));
        }
        Ok(DsaConfig {
            n_heads,
            head_dim,
            topk,
            full,
        })
    }

    /// Whether layer `layer` runs its own indexer (layers past `indexer_types`, i.e. the MTP
    /// layer, do).
    pub fn is_full(&self, layer: usize) -> bool {
        self.full.get(layer).copied().unwrap_or(true)
    }
}

/// Keys selected for each query of a batch: `sel[t]` lists, in increasing order, the cached
/// positions query `t` may attend to.
pub type Selection = Vec<Vec<usize>>;

/// One layer's indexer.
pub struct DsaIndexer<'s> {
    /// `indexer.wq_b` `[ih * id, q_lora_rank]`.
    pub wq_b: Linear<'s>,
    /// `indexer.wk` `[id, H]`.
    pub wk: Linear<'s>,
    /// `indexer.k_norm.weight`, f32 `[id]`.
    pub k_norm_weight: Vec<f32>,
    /// `indexer.k_norm.bias`, f32 `[id]`.
    pub k_norm_bias: Vec<f32>,
    /// `indexer.weights_proj` `[ih, H]`.
    pub weights_proj: Linear<'s>,
    /// ih.
    pub n_heads: usize,
    /// id.
    pub head_dim: usize,
    /// dr: leading dims of each head rotated.
    pub rope_dim: usize,
    /// `index_topk`.
    pub topk: usize,
}

/// `(x - mean) / sqrt(var + eps) * w + b` over one row, f32 (torch's `nn.LayerNorm`, biased
/// variance).
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mu = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / n;
    let r = 1.0 / (var + eps).sqrt();
    for ((v, w), b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mu) * r * w + b;
    }
}

/// Indices of the `k` largest `scores` (all of them when `k >= len`), ties broken by the lower
/// index first, returned in increasing index order.
pub fn top_k_lowest_first(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k, |&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

impl<'s> DsaIndexer<'s> {
    /// Loads `{prefix}.{wq_b,wk,k_norm,weights_proj}` (prefix `model.layers.{i}.self_attn.indexer`).
    ///
    /// # Errors
    /// Missing or misshapen tensors, named.
    pub fn load(
        store: &'s Store,
        prefix: &str,
        c: &DsaConfig,
        q_lora_rank: usize,
        hidden: usize,
        rope_dim: usize,
    ) -> Result<DsaIndexer<'s>> {
        let (ih, id) = (c.n_heads, c.head_dim);
        Ok(DsaIndexer {
            wq_b: Linear::load(
                store,
                &format!("{prefix}.wq_b"),
                ih * id,
                q_lora_rank,
                false,
            )?,
            wk: Linear::load(store, &format!("{prefix}.wk"), id, hidden, false)?,
            k_norm_weight: load_vector(
                store,
                &format!("{prefix}.k_norm.weight"),
                id,
                "indexer key LayerNorm weight",
            )?,
            k_norm_bias: load_vector(
                store,
                &format!("{prefix}.k_norm.bias"),
                id,
                "indexer key LayerNorm bias",
            )?,
            weights_proj: Linear::load(
                store,
                &format!("{prefix}.weights_proj"),
                ih,
                hidden,
                false,
            )?,
            n_heads: ih,
            head_dim: id,
            rope_dim,
            topk: c.topk,
        })
    }

    /// Indexer keys of `n` tokens: `wk(x)` (`x` `[n, H]`), LayerNorm, RoPE on the first dr
    /// values with `tables[t]` = (cos, sin) of token t. Returns `[n, id]` f32.
    pub fn keys(&self, x: &[f32], n: usize, tables: &[(Vec<f32>, Vec<f32>)]) -> Vec<f32> {
        let id = self.head_dim;
        let mut k = vec![0f32; n * id];
        self.wk.forward(x, n, &mut k);
        for (row, (cos, sin)) in k.chunks_exact_mut(id).zip(tables) {
            layer_norm(row, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS);
            rope_apply(&mut row[..self.rope_dim], cos, sin, true);
        }
        k
    }

    /// Top-k selection for `n` queries at positions `pos0..pos0+n` from the normalized q latent
    /// `q_lat` (`[n, q_lora_rank]`), the attention input `x` (`[n, H]`) and the indexer keys of
    /// positions `0..pos0+n`, `keys = (cache, stride, offset)`: key `j` is
    /// `cache[j * stride + offset..][..id]`. `tables[t]` = (cos, sin) of query t.
    pub fn select(
        &self,
        q_lat: &[f32],
        x: &[f32],
        n: usize,
        pos0: usize,
        tables: &[(Vec<f32>, Vec<f32>)],
        keys: (&[f32], usize, usize),
    ) -> Selection {
        let (cache, stride, offset) = keys;
        let (ih, id) = (self.n_heads, self.head_dim);
        let mut q = vec![0f32; n * ih * id];
        self.wq_b.forward(q_lat, n, &mut q);
        for (t, (cos, sin)) in tables.iter().enumerate().take(n) {
            for h in 0..ih {
                let s = (t * ih + h) * id;
                rope_apply(&mut q[s..s + self.rope_dim], cos, sin, true);
            }
        }
        let mut w = vec![0f32; n * ih];
        self.weights_proj.forward(x, n, &mut w);
        let (wscale, sscale) = ((ih as f32).powf(-0.5), (id as f32).powf(-0.5));
        (0..n)
            .into_par_iter()
            .map(|t| {
                let keys = pos0 + t + 1;
                if keys <= self.topk {
                    return (0..keys).collect();
                }
                let qt = &q[t * ih * id..(t + 1) * ih * id];
                let wt = &w[t * ih..(t + 1) * ih];
                let scores: Vec<f32> = (0..keys)
                    .map(|j| {
                        let k = &cache[j * stride + offset..j * stride + offset + id];
                        qt.chunks_exact(id)
                            .zip(wt)
                            .map(|(qh, &wh)| {
                                wh * wscale * (coli_kernels::dot(qh, k) * sscale).max(0.0)
                            })
                            .sum()
                    })
                    .collect();
                top_k_lowest_first(&scores, self.topk)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn top_k_breaks_ties_by_lowest_position() {
        assert_eq!(
            top_k_lowest_first(&[1.0, 3.0, 3.0, 2.0, 3.0], 2),
            vec![1, 2]
        );
        assert_eq!(top_k_lowest_first(&[0.0, 0.0, 0.0, 0.0], 3), vec![0, 1, 2]);
        assert_eq!(top_k_lowest_first(&[5.0, 1.0], 4), vec![0, 1]);
        assert_eq!(
            top_k_lowest_first(&[0.5, 2.0, -1.0, 2.0, 7.0], 3),
            vec![1, 3, 4]
        );
    }

    #[test]
    fn layer_norm_matches_torch_definition() {
        let mut x = vec![1.0, 2.0, 3.0, 6.0];
        layer_norm(&mut x, &[1.0, 2.0, 1.0, 1.0], &[0.0, 0.0, 0.5, 0.0], 0.0);
        // mean 3, var (4 + 1 + 0 + 9) / 4 = 3.5
        let r = 1.0 / 3.5f32.sqrt();
        let want = [-2.0 * r, -2.0 * r, 0.5, 3.0 * r];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{x:?}");
        }
    }

    #[test]
    fn indexer_types_as_transformers_derives_them() {
        let base = json!({"index_n_heads": 4, "index_head_dim": 16, "index_topk": 8});
        let c = DsaConfig::from_json(&base, 3, 8).unwrap();
        assert_eq!(c.full, vec![true; 3]);
        assert!(c.is_full(3));
        let mut v = base.clone();
        v["index_topk_freq"] = json!(2);
        v["index_skip_topk_offset"] = json!(1);
        // full iff max(i - 1 + 1, 0) % 2 == 0
        assert_eq!(
            DsaConfig::from_json(&v, 4, 8).unwrap().full,
            vec![true, false, true, false]
        );
        let mut v = base.clone();
        v["index_topk_pattern"] = json!("FSSF");
        assert_eq!(
            DsaConfig::from_json(&v, 4, 8).unwrap().full,
            vec![true, false, false, true]
        );
        v["indexer_types"] = json!(["full", "shared"]);
        assert_eq!(
            DsaConfig::from_json(&v, 2, 8).unwrap().full,
            vec![true, false]
        );
        v["indexer_types"] = json!(["shared", "full"]);
        assert!(DsaConfig::from_json(&v, 2, 8).is_err());
        v["indexer_types"] = json!(["full", "sparse"]);
        let e = DsaConfig::from_json(&v, 2, 8).unwrap_err().to_string();
        assert!(e.contains("sparse"), "{e}");
        let mut v = base.clone();
        v["layer_types"] = json!(["indexed_attention", "full_attention"]);
        let e = DsaConfig::from_json(&v, 2, 8).unwrap_err().to_string();
        assert!(e.contains("full_attention"), "{e}");
        let mut v = base;
        v["index_head_dim"] = json!(4);
        assert!(DsaConfig::from_json(&v, 2, 8).is_err());
    }
}
