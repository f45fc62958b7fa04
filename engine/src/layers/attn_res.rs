//! Block attention residuals (Kimi's "attention residuals", as Inkling 2 runs them: transformers
//! 5.25 `Inkling2BlockAttentionResidual` and the decoder layers around it). The residual stream
//! of a token is not one vector but the states of the blocks closed so far plus the running
//! partial sum of the current block; each sublayer reads a softmax-weighted mix of them:
//!
//! ```text
//! s_0..s_{b-1} = the closed blocks, s_b = the partial sum      (b = blocks before the layer)
//! n_i = s_i / sqrt(mean(s_i^2) + eps)                            (unweighted RMSNorm, f32)
//! input = sum_i softmax_i(q . n_i / sqrt(H)) n_i                 (q: the sublayer's query)
//! ```
//!
//! A layer whose index is a multiple of the block size closes a block: its input (the partial
//! sum it received) becomes block `layer / block`, and the partial sum restarts at its attention
//! output; other layers add their attention output to the partial sum. Both add their MLP
//! output. The output head reads the mix with `output_query` over every block and the partial
//! sum. Everything is per token: no state crosses positions.
//!
//! Kimi K3 (`_apply_attn_res` of the release's `modeling_kimi_linear.py`; [`Mix::Raw`]) runs the
//! same blocks and schedule, but its query (`res_norm.weight * res_proj.weight`) scores the
//! normalized sources without the `1/sqrt(H)` scale, and the mix sums the *raw* sources:
//! `input = sum_i softmax_i(q . n_i) s_i` (its epsilon `rms_norm_eps`).
//!
//! **Layout.** A token's residual row is `[slots + 1, H]` f32: block `j` in slot `j`, the
//! partial sum in slot `slots` (the last); a slot not closed yet holds zeros and is never read.

use crate::layers::RmsNorm;

/// What a mix scores and sums (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Inkling 2: scores `q . n_i / sqrt(H)`, sums the normalized sources `n_i`.
    Normalized,
    /// Kimi K3: scores `q . n_i`, sums the raw sources `s_i`.
    Raw,
}

/// The block residual stream of a model (see the module doc).
pub struct BlockStream {
    /// Hidden size H.
    pub hidden: usize,
    /// Blocks a forward pass closes: `ceil(layers / block)`.
    pub slots: usize,
    /// Layers per block.
    pub block: usize,
    /// The unweighted RMSNorm of the sources (weight 1; Inkling 2's `eps` 1e-6, Kimi K3's
    /// `rms_norm_eps`).
    pub norm: RmsNorm,
    /// What the mixes score and sum.
    pub mix: Mix,
}

impl BlockStream {
    /// The stream of `layers` layers in blocks of `block`, hidden size `hidden`, the sources
    /// normalized with epsilon `eps`.
    pub fn new(hidden: usize, layers: usize, block: usize, eps: f32) -> BlockStream {
        BlockStream::with_mix(hidden, layers, block, eps, Mix::Normalized)
    }

    /// [`BlockStream::new`] with the mixes `mix` computes.
    pub fn with_mix(hidden: usize, layers: usize, block: usize, eps: f32, mix: Mix) -> BlockStream {
        BlockStream {
            hidden,
            slots: layers.div_ceil(block),
            block,
            norm: RmsNorm {
                weight: vec![1.0; hidden],
                eps,
            },
            mix,
        }
    }

    /// f32 values of one token's residual row: `(slots + 1) * H`.
    pub fn width(&self) -> usize {
        (self.slots + 1) * self.hidden
    }

    /// Closed blocks the sublayers of `layer` read.
    pub fn blocks_before(&self, layer: usize) -> usize {
        layer.div_ceil(self.block)
    }

    /// Closed blocks the MLP of `layer` reads: those before it, plus the one it closes.
    pub fn blocks_after(&self, layer: usize) -> usize {
        self.blocks_before(layer) + usize::from(self.is_boundary(layer))
    }

    /// Whether `layer` closes a block.
    pub fn is_boundary(&self, layer: usize) -> bool {
        layer.is_multiple_of(self.block)
    }

    /// Residual rows of `n` tokens whose embeddings are `x` (`[n, H]`): the partial sum is the
    /// embedding, no block closed.
    pub fn from_embeddings(&self, x: &[f32], n: usize) -> Vec<f32> {
        let (h, w) = (self.hidden, self.width());
        let mut out = vec![0f32; n * w];
        for t in 0..n {
            out[t * w + w - h..(t + 1) * w].copy_from_slice(&x[t * h..(t + 1) * h]);
        }
        out
    }

    /// The partial sum of row `t` of `x` (`[n, width]`).
    pub fn partial<'x>(&self, x: &'x [f32], t: usize) -> &'x [f32] {
        let (h, w) = (self.hidden, self.width());
        &x[(t + 1) * w - h..(t + 1) * w]
    }

    /// The partial sum of row `t` of `x`, mutable.
    pub fn partial_mut<'x>(&self, x: &'x mut [f32], t: usize) -> &'x mut [f32] {
        let (h, w) = (self.hidden, self.width());
        &mut x[(t + 1) * w - h..(t + 1) * w]
    }

    /// Closes block `layer / block` of each of the `n` rows of `x`: copies the partial sum into
    /// its slot.
    pub fn close_block(&self, x: &mut [f32], n: usize, layer: usize) {
        let (h, w) = (self.hidden, self.width());
        let slot = layer / self.block;
        for t in 0..n {
            let row = &mut x[t * w..(t + 1) * w];
            let (blocks, partial) = row.split_at_mut(w - h);
            blocks[slot * h..(slot + 1) * h].copy_from_slice(partial);
        }
    }

    /// The mixes of `n` rows of `x` (`[n, width]`) over their first `blocks` closed blocks and
    /// the partial sum, one per query of `queries` (`[nq, H]`): `out[j]` is `[n, H]` for query
    /// `j` (see the module doc for the formula).
    pub fn mix(&self, x: &[f32], n: usize, blocks: usize, queries: &[f32]) -> Vec<Vec<f32>> {
        let (h, w) = (self.hidden, self.width());
        let nq = queries.len() / h;
        let scale = match self.mix {
            Mix::Normalized => Some((h as f32).powf(-0.5)),
            Mix::Raw => None,
        };
        let mut out = vec![vec![0f32; n * h]; nq];
        let mut normed = vec![0f32; (blocks + 1) * h];
        let mut p = vec![0f32; blocks + 1];
        for t in 0..n {
            let row = &x[t * w..(t + 1) * w];
            self.norm
                .forward(&row[..blocks * h], &mut normed[..blocks * h]);
            self.norm.forward(&row[w - h..], &mut normed[blocks * h..]);
            for (j, q) in queries.chunks_exact(h).enumerate() {
                for (i, s) in normed.chunks_exact(h).enumerate() {
                    let dot = q.iter().zip(s).map(|(a, b)| a * b).sum::<f32>();
                    p[i] = scale.map_or(dot, |c| dot * c);
                }
                coli_kernels::softmax_inplace(&mut p);
                let o = &mut out[j][t * h..(t + 1) * h];
                // The sources the mix sums: normalized (Inkling 2) or raw (Kimi K3): block i in
                // slot i, the partial sum (source `blocks`) in the row's last slot.
                for (i, s) in normed.chunks_exact(h).enumerate() {
                    let s = match self.mix {
                        Mix::Normalized => s,
                        Mix::Raw if i < blocks => &row[i * h..(i + 1) * h],
                        Mix::Raw => &row[w - h..],
                    };
                    for (o, v) in o.iter_mut().zip(s) {
                        *o += p[i] * v;
                    }
                }
            }
        }
        out
    }
}

/// One layer's attention-residual queries.
pub struct LayerAttnRes {
    /// The layer's index (which blocks it reads, whether it closes one).
    pub layer: usize,
    /// The attention input's queries, f32 `[nq, H]` (1 query, or 3 for separate query, key
    /// and value inputs); None: the layer reads the partial sum as is (layer 0).
    pub attn: Option<Vec<f32>>,
    /// The MLP input's query, f32 `[H]`.
    pub mlp: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_query_averages_the_normalized_sources() {
        let s = BlockStream::new(2, 3, 2, 1e-6);
        assert_eq!((s.slots, s.width()), (2, 6));
        // One row: block 0 = (3, 4), slot 1 unused, partial = (-1, 1).
        let x = [3.0, 4.0, 9.0, 9.0, -1.0, 1.0];
        let out = s.mix(&x, 1, 1, &[0.0, 0.0]);
        let n0 = [3.0 / 12.5f32.sqrt(), 4.0 / 12.5f32.sqrt()];
        let n1 = [-1.0f32, 1.0];
        for c in 0..2 {
            assert!(
                (out[0][c] - 0.5 * (n0[c] + n1[c])).abs() < 1e-6,
                "{:?}",
                out[0]
            );
        }
    }

    #[test]
    fn a_raw_mix_weighs_the_sources_themselves() {
        let s = BlockStream::with_mix(2, 3, 2, 1e-6, Mix::Raw);
        let x = [3.0, 4.0, 9.0, 9.0, -1.0, 1.0];
        // Query (1, 0): scores n0 . q = 3 / sqrt(12.5), n1 . q = -1, no 1/sqrt(H).
        let out = s.mix(&x, 1, 1, &[1.0, 0.0]);
        let (a, b) = ((3.0 / 12.5f32.sqrt()).exp(), (-1.0f32).exp());
        let (pa, pb) = (a / (a + b), b / (a + b));
        for (c, want) in [pa * 3.0 - pb, pa * 4.0 + pb].into_iter().enumerate() {
            assert!((out[0][c] - want).abs() < 1e-5, "{:?}", out[0]);
        }
    }

    #[test]
    fn closing_a_block_copies_the_partial_sum_into_its_slot() {
        let s = BlockStream::new(2, 4, 2, 1e-6);
        let mut x = s.from_embeddings(&[1.0, 2.0], 1);
        s.close_block(&mut x, 1, 2);
        assert_eq!(x, vec![0.0, 0.0, 1.0, 2.0, 1.0, 2.0]);
        assert_eq!(
            (s.blocks_before(0), s.blocks_before(1), s.blocks_before(3)),
            (0, 1, 2)
        );
        assert!(s.is_boundary(2) && !s.is_boundary(3));
    }
}
