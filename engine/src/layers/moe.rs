//! The sparse MoE block: router (softmax over all experts in f32, top-k, optional
//! renormalization; or gpt-oss's top-k of the logits then a softmax over the k) and the routed
//! experts (SwiGLU, or gpt-oss's clamped SwiGLU with biases), read through the
//! [`ExpertCache`].
//!
//! For a batch of tokens the block routes every token first, takes the UNION of the selected
//! experts, gets them all with one cache request (one `Store::fetch` for all the misses, read
//! while the experts already in RAM compute; a union larger than the cache's LRU tier in
//! groups that fit it, one after another), then runs each expert once over the tokens routed
//! to it (`coli_kernels::matmul`). Each token's
//! output is summed in ascending expert index, starting from zero, as transformers'
//! `index_add_` loop over `expert_hit` does: `out += w_e * expert_e(x)`.

use crate::cache::ExpertCache;
use crate::error::{EngineError, Result};
use crate::layers::mlp::{swiglu, Glu};
use crate::layers::Linear;
use coli_format::spec::ExpertActivation;
use coli_format::{ExpertKey, MatrixView};
use coli_store::{ExpertBuf, Store};
use rayon::prelude::*;

/// One token's routing: `(expert, weight)` by rank (highest probability first).
pub type Routing = Vec<(u32, f32)>;

/// A sparse MoE block of one decoder layer.
pub struct MoeBlock<'s> {
    /// Decoder layer index (the expert keys' layer).
    pub layer: u32,
    /// Router `[num_experts, hidden]`.
    pub router: Linear<'s>,
    /// Experts in this layer.
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalize the top-k weights to sum to 1.
    pub norm_topk: bool,
    /// gpt-oss routing: top-k of the logits, then a softmax over those k (`norm_topk` unused).
    pub topk_then_softmax: bool,
    /// The experts' activation (their biases come with their records).
    pub activation: ExpertActivation,
    /// Hidden size H.
    pub hidden: usize,
    /// Expert intermediate size I.
    pub inter: usize,
    /// Qwen3-Next's shared expert, added to the routed experts' sum (None elsewhere).
    pub shared: Option<GatedShared<'s>>,
}

/// A shared expert scaled by a learned sigmoid gate: `sigmoid(gate . x) * mlp(x)`
/// (`Qwen3NextSparseMoeBlock`: `shared_expert`, `shared_expert_gate`).
pub struct GatedShared<'s> {
    /// `mlp.shared_expert.{gate,up,down}_proj`.
    pub mlp: crate::layers::Mlp<'s>,
    /// `mlp.shared_expert_gate.weight` as f32 `[H]`.
    pub gate: Vec<f32>,
}

/// Selects the top-k of `probs`: highest first, ties broken by lower index (torch.topk does not
/// document its tie order; this choice is deterministic).
pub fn top_k(probs: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..probs.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        probs[b as usize]
            .partial_cmp(&probs[a as usize])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx.into_iter().map(|i| (i, probs[i as usize])).collect()
}

/// The union of the experts chosen by `routes`, most wanted first: by the number of tokens
/// routed to it (descending), then the sum of their weights (descending), then expert index.
/// Used to order lookahead prefetch reads.
pub fn rank_union(routes: &[Routing]) -> Vec<u32> {
    let mut agg: std::collections::HashMap<u32, (u32, f32)> = std::collections::HashMap::new();
    for r in routes {
        for &(e, w) in r {
            let a = agg.entry(e).or_insert((0, 0.0));
            a.0 += 1;
            a.1 += w;
        }
    }
    let mut v: Vec<(u32, (u32, f32))> = agg.into_iter().collect();
    v.sort_by(|a, b| {
        b.1 .0
            .cmp(&a.1 .0)
            .then(b.1 .1.total_cmp(&a.1 .1))
            .then(a.0.cmp(&b.0))
    });
    v.into_iter().map(|x| x.0).collect()
}

/// Routing of one token from its router logits: softmax (f32), top-k, and when `norm_topk`
/// each weight divided by the sum of the k weights (summed by rank).
pub fn route(logits: &[f32], k: usize, norm_topk: bool) -> Routing {
    let mut p = logits.to_vec();
    coli_kernels::softmax_inplace(&mut p);
    let mut sel = top_k(&p, k);
    if norm_topk {
        let s: f32 = sel.iter().map(|x| x.1).sum();
        for x in &mut sel {
            x.1 /= s;
        }
    }
    sel
}

/// gpt-oss routing of one token (`GptOssTopKRouter`): top-k of the router logits (bias
/// included), then a softmax (f32) over those k logits, by rank.
pub fn route_topk_softmax(logits: &[f32], k: usize) -> Routing {
    let mut sel = top_k(logits, k);
    let mut w: Vec<f32> = sel.iter().map(|x| x.1).collect();
    coli_kernels::softmax_inplace(&mut w);
    for (x, p) in sel.iter_mut().zip(w) {
        x.1 = p;
    }
    sel
}

/// gpt-oss's expert (`GptOssExperts.forward`, transformers 5.23): `g = gate x + b_g`,
/// `u = up x + b_u`, `g = min(g, limit)`, `u = clamp(u, -limit, limit)`,
/// `y = down(((u + 1) * g * sigmoid(alpha * g))) + b_d`, for `n` rows of `x` `[n, H]`.
#[allow(clippy::too_many_arguments)]
fn clamped_swiglu(
    mats: [&MatrixView<'_>; 3],
    biases: [Option<&[f32]>; 3],
    alpha: f32,
    limit: f32,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let [gate, up, down] = mats;
    let (inter, hidden) = (gate.rows(), down.rows());
    let mut g = vec![0f32; n * inter];
    let mut u = vec![0f32; n * inter];
    coli_kernels::matmul(gate, x, n, &mut g);
    coli_kernels::matmul(up, x, n, &mut u);
    let add_bias = |v: &mut [f32], b: Option<&[f32]>, width: usize| {
        if let Some(b) = b {
            for row in v.chunks_exact_mut(width) {
                for (o, bb) in row.iter_mut().zip(b) {
                    *o += bb;
                }
            }
        }
    };
    add_bias(&mut g, biases[0], inter);
    add_bias(&mut u, biases[1], inter);
    for (gv, uv) in g.iter_mut().zip(&u) {
        let gc = gv.min(limit);
        let uc = uv.clamp(-limit, limit);
        let glu = gc * (1.0 / (1.0 + (-(gc * alpha)).exp()));
        *gv = (uc + 1.0) * glu;
    }
    coli_kernels::matmul(down, &g, n, y);
    add_bias(y, biases[2], hidden);
}

impl MoeBlock<'_> {
    /// Routes `n` tokens of `x` (`[n, H]`, post-attention-normalized).
    pub fn route(&self, x: &[f32], n: usize) -> Vec<Routing> {
        let mut logits = vec![0f32; n * self.num_experts];
        self.router.forward_kept(x, n, &mut logits);
        logits
            .chunks_exact(self.num_experts)
            .map(|l| {
                if self.topk_then_softmax {
                    route_topk_softmax(l, self.top_k)
                } else {
                    route(l, self.top_k, self.norm_topk)
                }
            })
            .collect()
    }

    /// `out[n, H]` = `sum_e w_e SwiGLU_e(x)` for `x[n, H]` with the given per-token routing
    /// (`routes[t]` = `(expert, weight)` pairs), experts fetched through `cache`.
    ///
    /// # Errors
    /// A failed expert fetch, or an expert whose shape differs from the config.
    pub fn forward_routes(
        &self,
        x: &[f32],
        n: usize,
        routes: &[Routing],
        store: &Store,
        cache: &mut ExpertCache,
        out: &mut [f32],
    ) -> Result<()> {
        debug_assert_eq!(routes.len(), n);
        let h = self.hidden;
        // Tokens (and weights) per expert, tokens ascending.
        let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.num_experts];
        for (t, r) in routes.iter().enumerate() {
            for &(e, w) in r {
                per_expert[e as usize].push((t, w));
            }
        }
        let keys: Vec<ExpertKey> = (0..self.num_experts)
            .filter(|&e| !per_expert[e].is_empty())
            .map(|e| ExpertKey::new(self.layer, e as u32))
            .collect();
        let shape_ok = |key: &ExpertKey, buf: &ExpertBuf| -> Result<()> {
            if buf.hidden != h || buf.intermediate != self.inter {
                return Err(EngineError::Shape {
                    name: key.to_string(),
                    expected: vec![self.inter, h],
                    found: vec![buf.intermediate, buf.hidden],
                });
            }
            Ok(())
        };
        let run = |key: &ExpertKey, buf: &ExpertBuf| -> Result<Vec<f32>> {
            shape_ok(key, buf)?;
            let toks = &per_expert[key.expert as usize];
            let m = toks.len();
            let mut xs = Vec::with_capacity(m * h);
            for &(t, _) in toks {
                xs.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            let mut ys = vec![0f32; m * h];
            match (self.activation, Glu::of(self.activation)) {
                (ExpertActivation::ClampedSwiglu { alpha, limit }, _) => clamped_swiglu(
                    [&buf.gate(), &buf.up(), &buf.down()],
                    [buf.gate_bias(), buf.up_bias(), buf.down_bias()],
                    alpha,
                    limit,
                    &xs,
                    m,
                    &mut ys,
                ),
                (_, Some(act)) if !buf.has_biases() => {
                    swiglu(&buf.gate(), &buf.up(), &buf.down(), &xs, m, act, &mut ys)
                }
                _ => {
                    return Err(EngineError::Config {
                        file: "config.json".into(),
                        what: format!(
                            "{key} has biases, which this model's SwiGLU experts do not take"
                        ),
                    })
                }
            }
            Ok(ys)
        };
        // The experts run concurrently (one rayon task each, their products parallel inside
        // when threads are idle): one fork per layer instead of one per product keeps the
        // threads busy in decode. The experts already in RAM run while the misses are read
        // (`get_group_while`), the rest when they land. A union larger than the cache's LRU
        // tier (a long prefill chunk under a small budget) is fetched and computed in groups
        // that fit it, each group's buffers let go before the next is read, so the request
        // holds at most one group beyond the budget (docs/ENGINE.md "Budget"). Each expert's
        // output is computed by the same kernels whatever the thread count, the grouping or
        // the order they became ready in, and the sums below run in a fixed order, so the
        // result depends on none of them.
        let groups = cache.request_groups(store, &keys);
        cache.score_prediction(&keys);
        let mut expert_out: Vec<Option<Vec<f32>>> = vec![None; keys.len()];
        for (g, at) in groups.iter().enumerate() {
            let ks: Vec<ExpertKey> = at.iter().map(|&i| keys[i]).collect();
            let (bufs, first) =
                cache.get_group_while(store, &ks, g + 1 == groups.len(), |ready| {
                    ks.par_iter()
                        .zip(ready)
                        .map(|(key, buf)| buf.as_ref().map(|b| run(key, b)).transpose())
                        .collect::<Result<Vec<Option<Vec<f32>>>>>()
                })?;
            let mut part = first?;
            let rest: Vec<(usize, Vec<f32>)> = (0..ks.len())
                .filter(|&i| part[i].is_none())
                .collect::<Vec<usize>>()
                .into_par_iter()
                .map(|i| Ok((i, run(&ks[i], &bufs[i])?)))
                .collect::<Result<_>>()?;
            for (i, ys) in rest {
                part[i] = Some(ys);
            }
            for (&i, ys) in at.iter().zip(part) {
                expert_out[i] = ys;
            }
        }
        out.fill(0.0);
        for (key, ys) in keys.iter().zip(&expert_out) {
            let ys = ys.as_ref().expect("every expert computed above");
            let toks = &per_expert[key.expert as usize];
            for (i, &(t, w)) in toks.iter().enumerate() {
                for (o, y) in out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(&ys[i * h..(i + 1) * h])
                {
                    *o += y * w;
                }
            }
        }
        if let Some(sh) = &self.shared {
            // expert_output + sigmoid(shared_expert_gate(x)) * shared_expert(x).
            let mut ys = vec![0f32; n * h];
            sh.mlp.forward(x, n, &mut ys);
            for t in 0..n {
                let gl = coli_kernels::dot(&sh.gate, &x[t * h..(t + 1) * h]);
                let g = 1.0 / (1.0 + (-gl).exp());
                for (o, y) in out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(&ys[t * h..(t + 1) * h])
                {
                    *o += g * y;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_ties_lowest_index_first() {
        assert_eq!(
            top_k(&[0.25, 0.25, 0.25, 0.25], 2),
            vec![(0, 0.25), (1, 0.25)]
        );
        assert_eq!(
            top_k(&[0.1, 0.5, 0.1, 0.3], 3),
            vec![(1, 0.5), (3, 0.3), (0, 0.1)]
        );
    }

    #[test]
    fn rank_union_orders_by_tokens_then_weight() {
        let routes = vec![
            vec![(3, 0.6), (1, 0.4)],
            vec![(1, 0.7), (2, 0.3)],
            vec![(2, 0.5), (0, 0.5)],
        ];
        // 1 and 2 have two tokens each (weights 1.1 and 0.8), then 3 (0.6) and 0 (0.5).
        assert_eq!(rank_union(&routes), vec![1, 2, 3, 0]);
        assert!(rank_union(&[]).is_empty());
    }

    #[test]
    fn route_renormalizes_only_when_asked() {
        let r = route(&[0.0, 1.0, 2.0, 3.0], 2, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        let s: f32 = r.iter().map(|x| x.1).sum();
        assert!(s < 0.95);
        let r = route(&[0.0, 1.0, 2.0, 3.0], 2, true);
        let s: f32 = r.iter().map(|x| x.1).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!((r[0].1 - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
