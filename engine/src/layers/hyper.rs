//! Manifold-constrained hyper-connections (mHC, Xie et al. 2026), as transformers 5.25
//! `Glm5NextTextHyperConnection` computes them (GLM-5.3-Flash; DeepSeek-V4 has the same
//! module). The residual stream of one token is N streams of H values, `x` `[N, H]`. Around
//! each sublayer (attention, feed-forward) one hyper-connection does, per token, all in f32:
//!
//! ```text
//! m    = proj(x_flat * rsqrt(mean(x_flat^2) + rms_eps))        [(2+N) N]   x_flat = x as [N H]
//! pre  = sigmoid(m[0..N] * scale[0] + base[0..N]) + eps         [N]
//! post = 2 sigmoid(m[N..2N] * scale[1] + base[N..2N])           [N]
//! comb = softmax_row(m[2N..] * scale[2] + base[2N..]) + eps     [N, N] (row i: softmax over j)
//! comb = comb / (column sums + eps); then (iters - 1) times: rows / (row sums + eps),
//!        columns / (column sums + eps)                          (Sinkhorn-Knopp)
//! input = sum_i pre[i] x[i]                                     [H]  -> the sublayer
//! x'[j] = post[j] y + sum_i comb[i][j] x[i]                     y = the sublayer's output [H]
//! ```
//!
//! The final hidden state is the mean of the streams (GLM-5.3-Flash's `Glm5NextTextHyperHead`).
//! The projection runs on f32 activations whatever the numerics ([`Linear::forward_exact`]): a
//! row's result is the same whatever the batch.

use crate::layers::norm::unit_rms_rows;
use crate::layers::Linear;

/// One hyper-connection (`hc_attn_*` or `hc_ffn_*` of a layer).
pub struct HyperConn<'s> {
    /// `hc_*_fn` `[(2+N) N, N H]` (f32 in the published checkpoints).
    pub proj: Linear<'s>,
    /// `hc_*_base` `[(2+N) N]`.
    pub base: Vec<f32>,
    /// `hc_*_scale` `[3]`: pre, post, comb.
    pub scale: [f32; 3],
    /// Streams N.
    pub streams: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Sinkhorn iterations.
    pub iters: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// The unweighted RMSNorm's epsilon (`rms_norm_eps`).
    pub norm_eps: f32,
}

/// The weights one hyper-connection computed for `n` tokens: what [`HyperConn::expand`] needs.
pub struct Mix {
    /// `post` `[n, N]`.
    post: Vec<f32>,
    /// `comb` `[n, N, N]` (row i, column j).
    comb: Vec<f32>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl HyperConn<'_> {
    /// Mixes the streams of `n` tokens (`x` `[n, N H]`) into the sublayer's input (`[n, H]`),
    /// returning it with the weights [`HyperConn::expand`] applies after the sublayer.
    pub fn collapse(&self, x: &[f32], n: usize) -> (Mix, Vec<f32>) {
        let (s, h) = (self.streams, self.hidden);
        let w = s * h;
        let m_len = (2 + s) * s;
        debug_assert_eq!(x.len(), n * w);
        // The unweighted RMSNorm over all N H values of a token.
        let mut normed = x.to_vec();
        unit_rms_rows(&mut normed, w, self.norm_eps);
        let mut m = vec![0f32; n * m_len];
        self.proj.forward_exact(&normed, n, &mut m);
        let mut post = vec![0f32; n * s];
        let mut comb = vec![0f32; n * s * s];
        let mut input = vec![0f32; n * h];
        let mut pre = vec![0f32; s];
        for t in 0..n {
            let mt = &m[t * m_len..(t + 1) * m_len];
            for i in 0..s {
                pre[i] = sigmoid(mt[i] * self.scale[0] + self.base[i]) + self.eps;
                post[t * s + i] = 2.0 * sigmoid(mt[s + i] * self.scale[1] + self.base[s + i]);
            }
            let c = &mut comb[t * s * s..(t + 1) * s * s];
            for (k, cv) in c.iter_mut().enumerate() {
                *cv = mt[2 * s + k] * self.scale[2] + self.base[2 * s + k];
            }
            for row in c.chunks_exact_mut(s) {
                let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for v in row.iter_mut() {
                    *v = (*v - mx).exp();
                    sum += *v;
                }
                for v in row.iter_mut() {
                    *v = *v / sum + self.eps;
                }
            }
            normalize_columns(c, s, self.eps);
            for _ in 1..self.iters {
                for row in c.chunks_exact_mut(s) {
                    let sum: f32 = row.iter().sum();
                    for v in row.iter_mut() {
                        *v /= sum + self.eps;
                    }
                }
                normalize_columns(c, s, self.eps);
            }
            let xt = &x[t * w..(t + 1) * w];
            let it = &mut input[t * h..(t + 1) * h];
            for (d, o) in it.iter_mut().enumerate() {
                *o = (0..s).map(|i| pre[i] * xt[i * h + d]).sum();
            }
        }
        (Mix { post, comb }, input)
    }

    /// Replaces the streams `x` (`[n, N H]`) by `x'[j] = post[j] y + sum_i comb[i][j] x[i]`
    /// for the sublayer's output `y` (`[n, H]`).
    pub fn expand(&self, x: &mut [f32], mix: &Mix, y: &[f32]) {
        let (s, h) = (self.streams, self.hidden);
        let w = s * h;
        let mut out = vec![0f32; w];
        for (t, (xt, yt)) in x.chunks_exact_mut(w).zip(y.chunks_exact(h)).enumerate() {
            let post = &mix.post[t * s..(t + 1) * s];
            let comb = &mix.comb[t * s * s..(t + 1) * s * s];
            for j in 0..s {
                let o = &mut out[j * h..(j + 1) * h];
                for (d, ov) in o.iter_mut().enumerate() {
                    let mixed: f32 = (0..s).map(|i| comb[i * s + j] * xt[i * h + d]).sum();
                    *ov = post[j] * yt[d] + mixed;
                }
            }
            xt.copy_from_slice(&out);
        }
    }
}

/// DeepSeek-V4's final collapse of the streams (`DeepseekV4HyperHead`): per token
/// `pre = sigmoid(proj(rmsnorm(x_flat)) * scale + base) + eps` (`[N]`), hidden state
/// `sum_i pre[i] x[i]`.
pub struct HyperHead<'s> {
    /// `hc_head_fn` `[N, N H]`.
    pub proj: Linear<'s>,
    /// `hc_head_base` `[N]`.
    pub base: Vec<f32>,
    /// `hc_head_scale` (one value).
    pub scale: f32,
    /// Streams N.
    pub streams: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// The unweighted RMSNorm's epsilon (`rms_norm_eps`).
    pub norm_eps: f32,
}

impl HyperHead<'_> {
    /// The hidden states (`[n, H]`) of `n` tokens' streams `x` (`[n, N H]`).
    pub fn collapse(&self, x: &[f32], n: usize) -> Vec<f32> {
        let (s, h) = (self.streams, self.hidden);
        let w = s * h;
        let mut normed = x.to_vec();
        unit_rms_rows(&mut normed, w, self.norm_eps);
        let mut m = vec![0f32; n * s];
        self.proj.forward_exact(&normed, n, &mut m);
        let mut out = vec![0f32; n * h];
        for t in 0..n {
            let pre: Vec<f32> = (0..s)
                .map(|i| sigmoid(m[t * s + i] * self.scale + self.base[i]) + self.eps)
                .collect();
            let xt = &x[t * w..(t + 1) * w];
            for (d, o) in out[t * h..(t + 1) * h].iter_mut().enumerate() {
                *o = (0..s).map(|i| pre[i] * xt[i * h + d]).sum();
            }
        }
        out
    }
}

/// Divides each column of the `s x s` matrix `c` by its sum plus `eps`.
fn normalize_columns(c: &mut [f32], s: usize, eps: f32) {
    for j in 0..s {
        let sum: f32 = (0..s).map(|i| c[i * s + j]).sum();
        for i in 0..s {
            c[i * s + j] /= sum + eps;
        }
    }
}

/// The streams of `n` tokens (`x` `[n, N H]`) averaged into one hidden state each (`[n, H]`):
/// GLM-5.3-Flash's `Glm5NextTextHyperHead` (`mean` over the streams: a sum divided by N).
pub fn mean_streams(x: &[f32], n: usize, streams: usize, hidden: usize) -> Vec<f32> {
    let w = streams * hidden;
    let mut out = vec![0f32; n * hidden];
    for (xt, ot) in x.chunks_exact(w).zip(out.chunks_exact_mut(hidden)) {
        for (d, o) in ot.iter_mut().enumerate() {
            *o = (0..streams).map(|i| xt[i * hidden + d]).sum::<f32>() / streams as f32;
        }
    }
    out
}

/// The residual streams of `n` tokens from their embeddings (`[n, H]`): each copied to every
/// stream (`inputs_embeds.unsqueeze(2).expand(..., hc_mult, ...)`).
pub fn expand_embeddings(e: &[f32], hidden: usize, streams: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(e.len() * streams);
    for row in e.chunks_exact(hidden) {
        for _ in 0..streams {
            out.extend_from_slice(row);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_makes_comb_doubly_stochastic() {
        let mut c = vec![0.7, 0.1, 0.2, 0.05, 0.9, 0.05, 0.3, 0.3, 0.4];
        normalize_columns(&mut c, 3, 0.0);
        for _ in 0..30 {
            for row in c.chunks_exact_mut(3) {
                let s: f32 = row.iter().sum();
                row.iter_mut().for_each(|v| *v /= s);
            }
            normalize_columns(&mut c, 3, 0.0);
        }
        for k in 0..3 {
            let row: f32 = c[k * 3..k * 3 + 3].iter().sum();
            let col: f32 = (0..3).map(|i| c[i * 3 + k]).sum();
            assert!(
                (row - 1.0).abs() < 1e-4 && (col - 1.0).abs() < 1e-6,
                "{c:?}"
            );
        }
    }

    #[test]
    fn streams_expand_and_average_back() {
        let e = [1.0, 2.0, 3.0, 4.0];
        let x = expand_embeddings(&e, 2, 3);
        assert_eq!(
            x,
            vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0, 3.0, 4.0]
        );
        assert_eq!(mean_streams(&x, 2, 3, 2), e.to_vec());
    }
}
