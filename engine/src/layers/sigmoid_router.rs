//! DeepSeek-V3 MoE block (`topk_method: noaux_tc`, `scoring_func: sigmoid`), as transformers
//! 5.23 `DeepseekV3MoE` / `DeepseekV3TopkRouter`:
//!
//! ```text
//! s = sigmoid(x @ gate^T) (f32) ; c = s + e_score_correction_bias      (c for the choice only)
//! group score = sum of the top-2 c of each of n_group consecutive groups; keep topk_group groups
//! top = k largest c among kept groups ; w = s[top] ; if norm_topk_prob: w /= sum(w) + 1e-20
//! w *= routed_scaling_factor ; out = sum_e w_e SwiGLU_e(x) + shared_experts(x)
//! ```
//! Ties (groups and experts) go to the lower index.
//!
//! DeepSeek-V4 (`DeepseekV4TopKRouter`, `DeepseekV4HashRouter`) runs the same block with
//! `s = sqrt(softplus(x @ gate^T))` ([`Score::SqrtSoftplus`]), one group, the weights always
//! renormalized, and on its hash-routed layers the experts read from `tid2eid[token id]`
//! instead of the top-k (the weights are still the chosen experts' scores).

use crate::cache::ExpertCache;
use crate::error::{EngineError, Result};
use crate::layers::moe::{top_k, Routing};
use crate::layers::{Linear, Mlp, MoeBlock, RmsNorm};
use coli_store::Store;

/// The router's score function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// `sigmoid(logit)` (DeepSeek-V3).
    Sigmoid,
    /// `sqrt(softplus(logit))` (DeepSeek-V4's `sqrtsoftplus`; softplus as torch's, `x` itself
    /// above 20).
    SqrtSoftplus,
}

impl Score {
    fn apply(self, l: f32) -> f32 {
        match self {
            Score::Sigmoid => 1.0 / (1.0 + (-l).exp()),
            Score::SqrtSoftplus => {
                let sp = if l > 20.0 { l } else { l.exp().ln_1p() };
                sp.sqrt()
            }
        }
    }
}

/// A hash-routed layer's expert table (DeepSeek-V4's `ffn.gate.tid2eid`).
pub struct HashTable {
    /// Row `t` (`top_k` expert ids) for token id `t`, `[vocab * top_k]`.
    pub experts: Vec<u32>,
    /// Ids per row (top-k).
    pub k: usize,
}

/// Grouped sigmoid routing parameters.
pub struct SigmoidRouting {
    /// `mlp.gate.e_score_correction_bias`, f32 `[E]`.
    pub bias: Vec<f32>,
    /// `n_group`.
    pub n_group: usize,
    /// `topk_group`.
    pub topk_group: usize,
    /// `routed_scaling_factor`.
    pub scaling: f32,
    /// The score function.
    pub score: Score,
    /// A hash-routed layer's table (None: the top-k chooses).
    pub hash: Option<HashTable>,
}

impl SigmoidRouting {
    /// Routing of one token from its router logits `[E]` (see the module doc); `id` is its
    /// token id (read by a hash-routed layer only).
    pub fn route(&self, logits: &[f32], k: usize, norm_topk: bool, id: u32) -> Routing {
        let e = logits.len();
        let s: Vec<f32> = logits.iter().map(|&l| self.score.apply(l)).collect();
        if let Some(h) = &self.hash {
            let row = &h.experts[id as usize * h.k..(id as usize + 1) * h.k];
            let mut sel: Routing = row.iter().map(|&x| (x, s[x as usize])).collect();
            let sum: f32 = sel.iter().map(|x| x.1).sum::<f32>() + 1e-20;
            for x in &mut sel {
                x.1 = x.1 / sum * self.scaling;
            }
            return sel;
        }
        let mut c: Vec<f32> = s.iter().zip(&self.bias).map(|(a, b)| a + b).collect();
        if self.n_group > 1 {
            let gsize = e / self.n_group;
            let gs: Vec<f32> = c
                .chunks_exact(gsize)
                .map(|g| top_k(g, 2.min(gsize)).iter().map(|x| x.1).sum())
                .collect();
            let keep = top_k(&gs, self.topk_group);
            for (g, chunk) in c.chunks_exact_mut(gsize).enumerate() {
                if !keep.iter().any(|x| x.0 as usize == g) {
                    chunk.fill(f32::NEG_INFINITY);
                }
            }
        }
        let mut sel: Routing = top_k(&c, k)
            .into_iter()
            .map(|(i, _)| (i, s[i as usize]))
            .collect();
        if norm_topk {
            let sum: f32 = sel.iter().map(|x| x.1).sum::<f32>() + 1e-20;
            for x in &mut sel {
                x.1 /= sum;
            }
        }
        for x in &mut sel {
            x.1 *= self.scaling;
        }
        sel
    }
}

/// A DeepSeek-V3 MoE layer: routed experts (through the expert cache) plus shared experts.
pub struct SigmoidMoe<'s> {
    /// Router weight and routed experts (its `norm_topk` is `norm_topk_prob`).
    pub experts: MoeBlock<'s>,
    /// Grouped sigmoid routing.
    pub routing: SigmoidRouting,
    /// `mlp.shared_experts` (None when `n_shared_experts` is 0).
    pub shared: Option<Mlp<'s>>,
    /// Kimi K3's latent MoE (None: the routed experts read `x`).
    pub latent: Option<LatentMoe<'s>>,
}

/// Kimi K3's latent MoE (`KimiSparseMoeBlock` with `routed_expert_hidden_size` L): the router
/// reads `x` (`[n, H]`), the routed experts `down(x)` (`[n, L]`); their weighted sum is
/// normalized (`routed_expert_norm`, epsilon `rms_norm_eps`) and projected back by `up`, and
/// the shared experts, which read `x`, are added after.
pub struct LatentMoe<'s> {
    /// `routed_expert_down_proj` `[L, H]`.
    pub down: Linear<'s>,
    /// `routed_expert_up_proj` `[H, L]`.
    pub up: Linear<'s>,
    /// `routed_expert_norm` `[L]` (`latent_moe_use_norm`).
    pub norm: Option<RmsNorm>,
}

impl SigmoidMoe<'_> {
    /// Routes `n` tokens of `x` (`[n, H]`) whose token ids are `ids` (`[n]`; read by a
    /// hash-routed layer only).
    ///
    /// # Errors
    /// [`EngineError::Invalid`] for a hash-routed layer given no id per row, or an id outside
    /// its table.
    pub fn route(&self, x: &[f32], n: usize, ids: &[u32]) -> Result<Vec<Routing>> {
        if let Some(h) = &self.routing.hash {
            let rows = h.experts.len() / h.k.max(1);
            if ids.len() != n || ids.iter().any(|&t| t as usize >= rows) {
                return Err(EngineError::Invalid(format!(
                    "hash-routed layer {}: {} token ids for {n} rows (table of {rows})",
                    self.experts.layer,
                    ids.len()
                )));
            }
        }
        let ne = self.experts.num_experts;
        let mut logits = vec![0f32; n * ne];
        self.experts.router.forward_kept(x, n, &mut logits);
        Ok(logits
            .chunks_exact(ne)
            .enumerate()
            .map(|(t, l)| {
                let id = ids.get(t).copied().unwrap_or(0);
                self.routing
                    .route(l, self.experts.top_k, self.experts.norm_topk, id)
            })
            .collect())
    }

    /// `out[n, H]` = routed experts + shared experts of `x[n, H]`, with the routing
    /// computed by [`SigmoidMoe::route`] (`routes[t]` for token `t`).
    ///
    /// # Errors
    /// A failed expert fetch, or an expert whose shape differs from the config.
    pub fn forward_routes(
        &self,
        x: &[f32],
        n: usize,
        routes: &[crate::layers::moe::Routing],
        store: &Store,
        cache: &mut ExpertCache,
        out: &mut [f32],
    ) -> Result<()> {
        match &self.latent {
            None => self
                .experts
                .forward_routes(x, n, routes, store, cache, out)?,
            Some(l) => {
                let lw = self.experts.hidden;
                let mut xl = vec![0f32; n * lw];
                l.down.forward(x, n, &mut xl);
                let mut yl = vec![0f32; n * lw];
                self.experts
                    .forward_routes(&xl, n, routes, store, cache, &mut yl)?;
                if let Some(norm) = &l.norm {
                    norm.forward(&yl, &mut xl);
                    std::mem::swap(&mut xl, &mut yl);
                }
                l.up.forward(&yl, n, out);
            }
        }
        if let Some(sh) = &self.shared {
            let mut y = vec![0f32; out.len()];
            sh.forward(x, n, &mut y);
            for (o, v) in out.iter_mut().zip(&y) {
                *o += v;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_restrict_choice_and_bias_only_chooses() {
        let r = SigmoidRouting {
            bias: vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0],
            n_group: 4,
            topk_group: 2,
            scaling: 2.0,
            score: Score::Sigmoid,
            hash: None,
        };
        // Group scores (top-2 sums): g0 low, g1 high, g2 low, g3 high via the bias of expert 6.
        let logits = [-3.0, -3.0, 2.0, 1.0, -3.0, -2.0, -5.0, -5.0];
        let sel = r.route(&logits, 2, true, 0);
        let ids: Vec<u32> = sel.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![6, 2]);
        let s = |l: f32| 1.0 / (1.0 + (-l).exp());
        let (a, b) = (s(-5.0), s(2.0));
        assert!((sel[0].1 - 2.0 * a / (a + b)).abs() < 1e-6);
        assert!((sel[1].1 - 2.0 * b / (a + b)).abs() < 1e-6);
    }
}
