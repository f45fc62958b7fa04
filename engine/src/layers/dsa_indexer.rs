//! The DeepSeek Sparse Attention (DSA) lightning indexer of GLM-5 (`glm_moe_dsa`) and
//! DeepSeek-V3.2 (`deepseek_v32`), as transformers 5.23 `GlmMoeDsaIndexer` /
//! `DeepseekV32Indexer` compute it (written up in `docs/MLA.md`); they differ only in the RoPE
//! layout of the indexer (GLM-5 interleaved pairs, DeepSeek-V3.2 `rotate_half` halves):
//!
//! ```text
//! iq = wq_b(q_lat)                         [T, ih, id]   q_lat = q_a_layernorm(q_a_proj(x)), shared with MLA
//! ik = LayerNorm_1e-6(wk(x), k_norm.weight, k_norm.bias)   [T, id]   one key head, cached per token
//! RoPE (the attention's frequencies; GLM-5 interleaved pairs, V3.2 halves) on the FIRST dr dims of every iq head and of ik
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

use crate::error::Result;
use crate::layers::mla::rope_apply;
use crate::layers::Linear;
use crate::weights::Weights;
use coli_format::spec::{DsaSpec, IndexerSpec};
use rayon::prelude::*;

/// Keys per tile of the indexer's scores (their dot products with every head's query are held
/// at once: `n_heads * TILE` f32).
const TILE: usize = 64;

/// Eps of `indexer.k_norm` (`nn.LayerNorm(head_dim, eps=1e-6)` in transformers).
pub const K_NORM_EPS: f32 = 1e-6;

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
    /// RoPE on interleaved pairs (GLM-5) or on halves (DeepSeek-V3.2).
    pub rope_interleave: bool,
    /// GLM-5.3-Flash's k-pool scoring (None: every key is scored).
    pub kpool: Option<KPoolIndexer<'s>>,
}

/// GLM-5.3-Flash's k-pool compression (`Glm5NextTextIndexer.get_pooled_states`): the keys of
/// positions `p K .. p K + K - 1` form pool p once all K are there; its key is, per channel
/// c, `sum_j softmax_j(gate[pK+j][c] + ape[j][c]) k[pK+j][c]`. A query at position i scores
/// its complete pools (those ending at or before i) like keys, keeps the
/// `index_topk / K` best (all when there are no more), and attends to their positions plus the
/// positions of its own incomplete pool (`index_kpool_always_select_tail`): every position
/// `<= i` while `(i + 1) / K <= index_topk / K`.
pub struct KPoolIndexer<'s> {
    /// Positions per pool K.
    pub size: usize,
    /// `index_kpool_compress_gate` `[id, H]`: per-token pooling logits `gate = x W^T`.
    pub gate: Linear<'s>,
    /// `index_kpool_compress_ape` f32 `[K, id]`.
    pub ape: Vec<f32>,
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
    /// Loads the indexer `ix` of a layer with DSA parameters `c`; `rope_dim` is the
    /// attention's `qk_rope_head_dim`.
    ///
    /// # Errors
    /// Missing or misshapen tensors, named.
    pub fn load(
        w: &mut Weights<'s>,
        ix: &IndexerSpec,
        c: &DsaSpec,
        rope_dim: usize,
    ) -> Result<DsaIndexer<'s>> {
        let kpool = match (&c.kpool, &ix.kpool) {
            (Some(k), Some(t)) => Some(KPoolIndexer {
                size: k.size,
                gate: w.linear(&coli_format::spec::LinearSpec {
                    weight: t.gate.clone(),
                    bias: None,
                })?,
                ape: w.vector(&t.ape)?,
            }),
            _ => None,
        };
        Ok(DsaIndexer {
            kpool,
            wq_b: w.linear(&ix.wq_b)?,
            wk: w.linear(&ix.wk)?,
            k_norm_weight: w.vector(&ix.k_norm_weight)?,
            k_norm_bias: w.vector(&ix.k_norm_bias)?,
            weights_proj: w.linear(&ix.weights_proj)?,
            n_heads: c.n_heads,
            head_dim: c.head_dim,
            rope_dim,
            topk: c.topk,
            rope_interleave: c.rope_interleave,
        })
    }

    /// f32 values the indexer keeps per position: its key (`id`), and with k-pools the
    /// position's pooling logits and a slot for the key of the pool it closes (two more `id`;
    /// [`DsaIndexer::close_pools`]).
    pub fn cached_dim(&self) -> usize {
        match self.kpool {
            Some(_) => 3 * self.head_dim,
            None => self.head_dim,
        }
    }

    /// Indexer keys of `n` tokens: `wk(x)` (`x` `[n, H]`), LayerNorm, RoPE on the first dr
    /// values with `tables[t]` = (cos, sin) of token t; with k-pools each followed by the
    /// token's pooling logits `gate(x)`. Returns `[n, cached_dim()]` f32.
    pub fn keys(&self, x: &[f32], n: usize, tables: &[(Vec<f32>, Vec<f32>)]) -> Vec<f32> {
        let id = self.head_dim;
        let mut k = vec![0f32; n * id];
        self.wk.forward(x, n, &mut k);
        for (row, (cos, sin)) in k.chunks_exact_mut(id).zip(tables) {
            layer_norm(row, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS);
            rope_apply(&mut row[..self.rope_dim], cos, sin, self.rope_interleave);
        }
        let Some(kp) = &self.kpool else {
            return k;
        };
        let mut g = vec![0f32; n * id];
        kp.gate.forward_kept(x, n, &mut g);
        let mut out = Vec::with_capacity(3 * n * id);
        for (kr, gr) in k.chunks_exact(id).zip(g.chunks_exact(id)) {
            out.extend_from_slice(kr);
            out.extend_from_slice(gr);
            // The pool key slot, filled by `close_pools` when this position closes a pool.
            out.resize(out.len() + id, 0.0);
        }
        out
    }

    /// Writes the key of every pool that positions `pos0..pos0+n` close (position `p` closes
    /// pool `p / K` when `(p + 1) % K == 0`) into that position's pool-key slot, from the rows
    /// `keys = (cache, stride, offset)` (key, pooling logits, slot at `offset`) of the pool's K
    /// positions, all present. A pool's key is computed once, when its last position is
    /// appended; truncating that position drops it with the row.
    pub fn close_pools(
        &self,
        cache: &mut [f32],
        stride: usize,
        offset: usize,
        pos0: usize,
        n: usize,
    ) {
        let Some(kp) = &self.kpool else {
            return;
        };
        let (id, k) = (self.head_dim, kp.size);
        let mut logits = vec![0f32; k];
        let mut key = vec![0f32; id];
        for p in (pos0..pos0 + n).filter(|p| (p + 1) % k == 0) {
            let first = p + 1 - k;
            for (c, o) in key.iter_mut().enumerate() {
                for (j, l) in logits.iter_mut().enumerate() {
                    let row = (first + j) * stride + offset;
                    *l = cache[row + id + c] + kp.ape[j * id + c];
                }
                let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = logits.iter().map(|l| (l - mx).exp()).sum();
                *o = (0..k)
                    .map(|j| {
                        (logits[j] - mx).exp() / sum * cache[(first + j) * stride + offset + c]
                    })
                    .sum();
            }
            let slot = p * stride + offset + 2 * id;
            cache[slot..slot + id].copy_from_slice(&key);
        }
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
                rope_apply(&mut q[s..s + self.rope_dim], cos, sin, self.rope_interleave);
            }
        }
        let mut w = vec![0f32; n * ih];
        self.weights_proj.forward_kept(x, n, &mut w);
        let (wscale, sscale) = ((ih as f32).powf(-0.5), (id as f32).powf(-0.5));
        if let Some(kp) = &self.kpool {
            return self.select_pools(kp, &q, &w, n, pos0, keys);
        }
        (0..n)
            .into_par_iter()
            .map(|t| {
                let keys = pos0 + t + 1;
                if keys <= self.topk {
                    return (0..keys).collect();
                }
                let qt = &q[t * ih * id..(t + 1) * ih * id];
                let wt = &w[t * ih..(t + 1) * ih];
                // score_j = sum over heads h, in order, of w_h * ih^-0.5 * relu(q_h . k_j *
                // id^-0.5). The dot products of a tile of keys come head by head from
                // `dot_strided` (four keys per pass; each the bits of `dot`), then each key's
                // sum is folded over the heads as the per-key form did.
                let mut scores = vec![0f32; keys];
                let mut dots = vec![0f32; ih * TILE];
                for j0 in (0..keys).step_by(TILE) {
                    let m = TILE.min(keys - j0);
                    for (h, qh) in qt.chunks_exact(id).enumerate() {
                        coli_kernels::dot_strided(
                            qh,
                            &cache[j0 * stride..],
                            stride,
                            offset,
                            &mut dots[h * TILE..h * TILE + m],
                        );
                    }
                    for (i, s) in scores[j0..j0 + m].iter_mut().enumerate() {
                        *s = wt
                            .iter()
                            .enumerate()
                            .map(|(h, &wh)| wh * wscale * (dots[h * TILE + i] * sscale).max(0.0))
                            .sum();
                    }
                }
                top_k_lowest_first(&scores, self.topk)
            })
            .collect()
    }
}

impl DsaIndexer<'_> {
    /// The k-pool selection of `n` queries at positions `pos0..pos0+n` (their indexer queries
    /// `q` `[n, ih id]` and head weights `w` `[n, ih]`), see [`KPoolIndexer`].
    fn select_pools(
        &self,
        kp: &KPoolIndexer<'_>,
        q: &[f32],
        w: &[f32],
        n: usize,
        pos0: usize,
        keys: (&[f32], usize, usize),
    ) -> Selection {
        let (ih, id, k) = (self.n_heads, self.head_dim, kp.size);
        let budget = self.topk / k;
        // Pool p's key sits in the slot of its last position, `(p K + K - 1)`.
        let (cache, stride, offset) = keys;
        let (pool_stride, pool_offset) = (k * stride, (k - 1) * stride + offset + 2 * id);
        let (wscale, sscale) = ((ih as f32).powf(-0.5), (id as f32).powf(-0.5));
        (0..n)
            .into_par_iter()
            .map(|t| {
                let i = pos0 + t;
                let visible = (i + 1) / k;
                if visible <= budget {
                    return (0..=i).collect();
                }
                let qt = &q[t * ih * id..(t + 1) * ih * id];
                let wt = &w[t * ih..(t + 1) * ih];
                // The pools' scores as the keys' (the same sum over heads in order).
                let mut dots = vec![0f32; ih * visible];
                for (h, qh) in qt.chunks_exact(id).enumerate() {
                    coli_kernels::dot_strided(
                        qh,
                        cache,
                        pool_stride,
                        pool_offset,
                        &mut dots[h * visible..(h + 1) * visible],
                    );
                }
                let scores: Vec<f32> = (0..visible)
                    .map(|p| {
                        wt.iter()
                            .enumerate()
                            .map(|(h, &wh)| wh * wscale * (dots[h * visible + p] * sscale).max(0.0))
                            .sum()
                    })
                    .collect();
                let mut sel: Vec<usize> = top_k_lowest_first(&scores, budget)
                    .into_iter()
                    .flat_map(|p| p * k..(p + 1) * k)
                    .collect();
                // The query's own incomplete pool.
                sel.extend(visible * k..=i);
                sel
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
