//! DeepSeek-V4's attention, as transformers 5.25 `modeling_deepseek_v4.py` computes it
//! (`DeepseekV4Attention`, `DeepseekV4HCACompressor`, `DeepseekV4CSACompressor`,
//! `DeepseekV4Indexer`; tensors and config in `coli_format::spec::deepseek_v4`). For a row `x`
//! (the layer's normalized input) at position `p`, all in f32:
//!
//! ```text
//! qr = rmsnorm(wq_a x) * q_norm              [q_lora_rank]
//! q_h = rope(unit_rmsnorm((wq_b qr)_h), p)   per head, [head_dim]
//! kv = rope(rmsnorm(wkv x) * kv_norm, p)     one head, [head_dim]: key and value
//! keys(p) = kv of positions p-window+1..=p, then compressed entries (below)
//! o_h = sum_j softmax_j(q_h . key_j / sqrt(head_dim) ; sink_h) key_j      (the sink's share dropped)
//! o_h = rope(o_h, p)^-1                      rotated back at the query's position
//! out = wo_b concat_g(wo_a_g concat(o_h of group g))
//! ```
//!
//! RoPE rotates the trailing `rope_dim` values of a head in interleaved pairs
//! (`apply_rotary_pos_emb`: `(a, b) -> (a cos - b sin, b cos + a sin)`), with `rope_theta` on
//! sliding layers and `compress_rope_theta` (with its YaRN) on compressed layers.
//!
//! **Compressed entries.** A compressed layer projects each position to `c = wkv_c x` and
//! `z = wgate_c x` (width `w`). Block `b` (positions `b r..(b + 1) r`, `r` the layer's rate)
//! closes at position `(b + 1) r - 1` and gives one entry: per channel a softmax over the
//! block's slots of `z + ape[slot]`, weighting `c`; then the compressor's RMSNorm and RoPE at
//! position `b r`. On HCA layers (`w = head_dim`) every closed block is attended. On CSA layers
//! (`w = 2 head_dim`) the softmax runs over `2r` slots: the previous block's first halves (none
//! for block 0) and the block's own second halves; the lightning indexer (the same pooling at
//! `index_head_dim` gives its keys `k_b`; queries `iq_h = rope(iwq_b qr)_h`, weights
//! `w_h = weights_proj(x)_h / sqrt(index_heads)`) scores closed blocks
//! `s_b = sum_h w_h relu(iq_h . k_b) / sqrt(index_head_dim)` and the query attends to the
//! `index_topk` best (ties to the lower block).
//!
//! **State** (per layer, per sequence, [`LayerKv`]): the window's rows in `k` (trimmed as
//! Inkling's sliding layers), each position's raw `c`/`z` rows (and the indexer's) in `conv`
//! for the open block and, on CSA layers, the block before it, and one row per closed block in
//! `blocks` (the entry, then the indexer key on CSA layers), never dropped, cut with the
//! positions: every prefix of a sequence is exact from what it holds.

use crate::layers::inkling::trim;
use crate::layers::norm::unit_rms_rows;
use crate::layers::{LayerKv, Linear, RmsNorm, Rope, Span};
use rayon::prelude::*;

/// Rotates the trailing `cos.len() * 2` values of `x` in interleaved pairs at the tables'
/// position (`sign` -1: the inverse rotation).
fn rope_tail(x: &mut [f32], cos: &[f32], sin: &[f32], sign: f32) {
    let o = x.len() - 2 * cos.len();
    for (i, (&c, &s)) in cos.iter().zip(sin).enumerate() {
        let s = s * sign;
        let (a, b) = (x[o + 2 * i], x[o + 2 * i + 1]);
        x[o + 2 * i] = a * c + (-b) * s;
        x[o + 2 * i + 1] = b * c + a * s;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A compressor (`attn.compressor` or `attn.indexer.compressor`).
pub struct Compressor<'s> {
    /// `wkv` `[w, H]`.
    pub kv: Linear<'s>,
    /// `wgate` `[w, H]`.
    pub gate: Linear<'s>,
    /// `ape`, f32 `[rate, w]`.
    pub ape: Vec<f32>,
    /// The pooled entry's RMSNorm (`[d]`).
    pub norm: RmsNorm,
    /// Entry width d (`w = d`, or `2d` when `overlap`).
    pub dim: usize,
    /// CSA: entries pool the previous block's first halves with the block's second halves.
    pub overlap: bool,
}

impl Compressor<'_> {
    /// f32 values per position of its raw rows (`c` then `z`).
    fn raw_width(&self) -> usize {
        2 * self.width()
    }

    fn width(&self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }

    /// The entry of block `b` (rate `rate`) from the raw rows `raw(position)` (each
    /// [`Compressor::raw_width`] wide): pooled, normalized, rotated at `b * rate` by `rope`.
    fn entry<'a>(
        &self,
        b: usize,
        rate: usize,
        raw: impl Fn(usize) -> &'a [f32],
        rope: &Rope,
        out: &mut [f32],
    ) {
        let (d, w) = (self.dim, self.width());
        // (slot value, slot logit) sources: (position, ape row, channel offset).
        let mut slots: Vec<(usize, usize, usize)> = Vec::with_capacity(2 * rate);
        if self.overlap && b > 0 {
            slots.extend((0..rate).map(|j| ((b - 1) * rate + j, j, 0)));
        }
        let own = if self.overlap { d } else { 0 };
        slots.extend((0..rate).map(|j| (b * rate + j, j, own)));
        let mut pooled = vec![0f32; d];
        let mut logits = vec![0f32; slots.len()];
        for (ch, o) in pooled.iter_mut().enumerate() {
            let mut max = f32::NEG_INFINITY;
            for (l, &(p, j, off)) in logits.iter_mut().zip(&slots) {
                *l = raw(p)[w + off + ch] + self.ape[j * w + off + ch];
                max = max.max(*l);
            }
            let mut sum = 0f32;
            for l in logits.iter_mut() {
                *l = (*l - max).exp();
                sum += *l;
            }
            let mut acc = 0f32;
            for (l, &(p, _, off)) in logits.iter().zip(&slots) {
                acc += raw(p)[off + ch] * (l / sum);
            }
            *o = acc;
        }
        self.norm.forward(&pooled, out);
        let (cos, sin) = rope.tables(b * rate);
        rope_tail(out, &cos, &sin, 1.0);
    }
}

/// The grouped output projection `wo_a` `[groups * rank, heads * head_dim / groups]`: group `g`'s
/// rows `g * rank..(g + 1) * rank` project its heads' outputs (`DeepseekV4GroupedLinear`).
pub enum GroupedLinear<'s> {
    /// One view of each group's rows (every encoding but FP8 cut inside a block of 128 rows).
    Views(Vec<Linear<'s>>),
    /// The whole matrix, each group's input multiplied by all of it and its rows kept: FP8
    /// whose group rows cut through its 128-row scale blocks, or an interleaved view (q8a)
    /// whose groups cut through its 16-row groups (tiny models; the releases' rank of 1024 cuts
    /// whole groups). The same products, `groups` times the work.
    Whole {
        /// `wo_a`.
        w: Linear<'s>,
        /// Groups.
        groups: usize,
    },
}

impl GroupedLinear<'_> {
    fn groups(&self) -> usize {
        match self {
            GroupedLinear::Views(v) => v.len(),
            GroupedLinear::Whole { groups, .. } => *groups,
        }
    }

    /// Rows per group.
    fn rank(&self) -> usize {
        match self {
            GroupedLinear::Views(v) => v[0].rows(),
            GroupedLinear::Whole { w, groups } => w.rows() / groups,
        }
    }

    /// Group `g` of `n` rows `x` (`[n, cols]`) into `y` (`[n, rank]`).
    fn forward(&self, g: usize, x: &[f32], n: usize, y: &mut [f32]) {
        match self {
            GroupedLinear::Views(v) => v[g].forward(x, n, y),
            GroupedLinear::Whole { w, .. } => {
                let (rows, rank) = (w.rows(), self.rank());
                let mut full = vec![0f32; n * rows];
                w.forward(x, n, &mut full);
                for (o, f) in y.chunks_exact_mut(rank).zip(full.chunks_exact(rows)) {
                    o.copy_from_slice(&f[g * rank..(g + 1) * rank]);
                }
            }
        }
    }
}

/// A CSA layer's lightning indexer.
pub struct Indexer<'s> {
    /// `wq_b` `[heads * dim, q_lora_rank]`.
    pub q_b: Linear<'s>,
    /// `weights_proj` `[heads, H]`.
    pub weights: Linear<'s>,
    /// Its compressor (width `2 dim`, overlapping).
    pub compressor: Compressor<'s>,
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_topk`.
    pub topk: usize,
}

/// One DeepSeek-V4 attention block (see the module doc).
pub struct DeepseekV4Attention<'s> {
    /// `wq_a` `[q_lora_rank, H]`.
    pub q_a: Linear<'s>,
    /// `q_norm` `[q_lora_rank]`.
    pub q_norm: RmsNorm,
    /// `wq_b` `[heads * head_dim, q_lora_rank]`.
    pub q_b: Linear<'s>,
    /// `wkv` `[head_dim, H]`.
    pub kv: Linear<'s>,
    /// `kv_norm` `[head_dim]`.
    pub kv_norm: RmsNorm,
    /// `wo_a` by group of heads.
    pub o_a: GroupedLinear<'s>,
    /// `wo_b` `[H, groups * o_lora_rank]`.
    pub o_b: Linear<'s>,
    /// `attn_sink`, f32 `[heads]`.
    pub sinks: Vec<f32>,
    /// The compressor of a CSA / HCA layer.
    pub compressor: Option<Compressor<'s>>,
    /// The indexer of a CSA layer.
    pub indexer: Option<Indexer<'s>>,
    /// Positions per compressed entry (0 on a sliding layer).
    pub rate: usize,
    /// The layer's RoPE (`rope_dim / 2` frequencies): the main one on sliding layers, the
    /// compressed layers' elsewhere (also the compressors' and the indexer's).
    pub rope: Rope,
    /// Query heads.
    pub num_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// `sliding_window`.
    pub window: usize,
    /// `rms_norm_eps` (the queries' unweighted norm).
    pub eps: f32,
}

impl DeepseekV4Attention<'_> {
    /// f32 values per position of `LayerKv::k`: the key-value head.
    pub fn kv_dim(&self) -> usize {
        self.head_dim
    }

    /// f32 values per position of `LayerKv::conv`: the raw compressor rows (0 on a sliding
    /// layer).
    pub fn conv_dim(&self) -> usize {
        self.compressor.as_ref().map_or(0, Compressor::raw_width)
            + self
                .indexer
                .as_ref()
                .map_or(0, |i| i.compressor.raw_width())
    }

    /// f32 values per compressed entry (`LayerKv::blocks` row).
    pub fn block_dim(&self) -> usize {
        self.compressor.as_ref().map_or(0, |c| c.dim)
            + self.indexer.as_ref().map_or(0, |i| i.compressor.dim)
    }

    /// The conv rows a position reads back: the open block and, on CSA layers, the one before
    /// it (as Inkling's convolution `kernel`: `kernel - 1` rows before the position).
    pub fn kernel(&self) -> usize {
        match &self.compressor {
            Some(c) if c.overlap => 2 * self.rate,
            Some(_) => self.rate,
            None => 1,
        }
    }

    /// Attention for the rows of `spans` (`x` `[N, H]`, the normalized input; span `i` at
    /// positions `pos0..pos0+n` of the sequence whose state is `kvs[i]`): appends each
    /// position's key-value row, raw compressor rows and the entries of the blocks its rows
    /// close, and writes the `wo_b` output to `out` (`[N, H]`). Each (row, head) is computed on
    /// its own in a fixed order: results depend neither on the thread count nor on the other
    /// spans.
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        let n = Span::rows(spans);
        let (hd, nh) = (self.head_dim, self.num_heads);
        let qd = nh * hd;
        let rq = self.q_a.rows();
        let mut qr = vec![0f32; n * rq];
        self.q_a.forward(x, n, &mut qr);
        self.q_norm.forward_inplace(&mut qr);
        let mut q = vec![0f32; n * qd];
        self.q_b.forward(&qr, n, &mut q);
        unit_rms_rows(&mut q, hd, self.eps);
        let mut kv = vec![0f32; n * hd];
        self.kv.forward(x, n, &mut kv);
        self.kv_norm.forward_inplace(&mut kv);
        let rows = Span::row_positions(spans);
        let tables: Vec<(Vec<f32>, Vec<f32>)> =
            rows.iter().map(|&(_, p)| self.rope.tables(p)).collect();
        for (r, (cos, sin)) in tables.iter().enumerate() {
            for h in q[r * qd..(r + 1) * qd].chunks_exact_mut(hd) {
                rope_tail(h, cos, sin, 1.0);
            }
            rope_tail(&mut kv[r * hd..(r + 1) * hd], cos, sin, 1.0);
        }
        // Raw compressor rows, then the entries of the blocks the rows close.
        let cd = self.conv_dim();
        let bd = self.block_dim();
        if let Some(c) = &self.compressor {
            let mut raw = vec![0f32; n * cd];
            let w = c.width();
            let mut tmp = vec![0f32; n * w];
            c.kv.forward_kept(x, n, &mut tmp);
            put_cols(&mut raw, cd, 0, &tmp, w);
            c.gate.forward_kept(x, n, &mut tmp);
            put_cols(&mut raw, cd, w, &tmp, w);
            if let Some(ix) = &self.indexer {
                let iw = ix.compressor.width();
                let mut t = vec![0f32; n * iw];
                ix.compressor.kv.forward_kept(x, n, &mut t);
                put_cols(&mut raw, cd, 2 * w, &t, iw);
                ix.compressor.gate.forward_kept(x, n, &mut t);
                put_cols(&mut raw, cd, 2 * w + iw, &t, iw);
            }
            let mut r0 = 0;
            for (s, st) in spans.iter().zip(kvs.iter_mut()) {
                st.conv_dim = cd;
                st.block_dim = bd;
                st.block_rate = self.rate;
                debug_assert_eq!(st.conv_first + st.conv.len() / cd, s.pos0);
                st.conv.extend_from_slice(&raw[r0 * cd..(r0 + s.n) * cd]);
                for p in s.pos0..s.pos0 + s.n {
                    if (p + 1) % self.rate != 0 {
                        continue;
                    }
                    let b = (p + 1) / self.rate - 1;
                    debug_assert_eq!(st.blocks.len(), b * bd);
                    let (first, conv) = (st.conv_first, &st.conv);
                    let row = |pos: usize| &conv[(pos - first) * cd..(pos - first + 1) * cd];
                    let mut entry = vec![0f32; bd];
                    c.entry(b, self.rate, row, &self.rope, &mut entry[..c.dim]);
                    if let Some(ix) = &self.indexer {
                        let off = 2 * w;
                        let irow = |pos: usize| {
                            let r = &conv[(pos - first) * cd..(pos - first + 1) * cd];
                            &r[off..]
                        };
                        ix.compressor
                            .entry(b, self.rate, irow, &self.rope, &mut entry[c.dim..]);
                    }
                    st.blocks.extend_from_slice(&entry);
                }
                r0 += s.n;
            }
        }
        // The window's rows.
        let mut r0 = 0;
        for (s, st) in spans.iter().zip(kvs.iter_mut()) {
            debug_assert_eq!(st.positions(hd), s.pos0);
            st.k.extend_from_slice(&kv[r0 * hd..(r0 + s.n) * hd]);
            r0 += s.n;
        }
        // The compressed entries each row attends to.
        let picks: Vec<Vec<usize>> = match &self.indexer {
            Some(ix) => self.index(ix, x, &qr, &rows, &tables, kvs),
            None if self.rate > 0 => rows
                .iter()
                .map(|&(_, p)| (0..(p + 1) / self.rate).collect())
                .collect(),
            None => vec![Vec::new(); n],
        };
        let scale = (hd as f32).powf(-0.5);
        let states: Vec<&LayerKv> = kvs.iter().map(|kv| &**kv).collect();
        let mut ctx = vec![0f32; n * qd];
        ctx.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
            let (r, h) = (i / nh, i % nh);
            let (span, p) = rows[r];
            let st = states[span];
            let qh = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
            let lo = (p + 1).saturating_sub(self.window);
            let key = |j: usize| -> &[f32] {
                if j <= p {
                    &st.k[(j - st.first) * hd..(j - st.first + 1) * hd]
                } else {
                    let b = picks[r][j - p - 1];
                    &st.blocks[b * bd..b * bd + hd]
                }
            };
            let keys: Vec<usize> = (lo..=p)
                .chain((0..picks[r].len()).map(|i| p + 1 + i))
                .collect();
            let scores: Vec<f32> = keys.iter().map(|&j| dot(qh, key(j)) * scale).collect();
            let sink = self.sinks[h];
            let max = scores.iter().fold(sink, |m, &s| m.max(s));
            let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let denom = e.iter().sum::<f32>() + (sink - max).exp();
            for (&j, &ej) in keys.iter().zip(&e) {
                let pj = ej / denom;
                for (a, v) in o.iter_mut().zip(key(j)) {
                    *a += pj * v;
                }
            }
            let (cos, sin) = &tables[r];
            rope_tail(o, cos, sin, -1.0);
        });
        // The grouped output projection.
        let groups = self.o_a.groups();
        let (gin, gout) = (qd / groups, self.o_a.rank());
        let mut mid = vec![0f32; n * groups * gout];
        let mut xin = vec![0f32; n * gin];
        let mut y = vec![0f32; n * gout];
        for g in 0..groups {
            for r in 0..n {
                xin[r * gin..(r + 1) * gin]
                    .copy_from_slice(&ctx[r * qd + g * gin..r * qd + (g + 1) * gin]);
            }
            self.o_a.forward(g, &xin, n, &mut y);
            for r in 0..n {
                mid[r * groups * gout + g * gout..r * groups * gout + (g + 1) * gout]
                    .copy_from_slice(&y[r * gout..(r + 1) * gout]);
            }
        }
        self.o_b.forward(&mid, n, out);
    }

    /// The lightning indexer's pick for each row: the closed blocks it may see
    /// (`b < (p + 1) / rate`), the `topk` best by score (ties to the lower block), ascending.
    fn index(
        &self,
        ix: &Indexer<'_>,
        x: &[f32],
        qr: &[f32],
        rows: &[(usize, usize)],
        tables: &[(Vec<f32>, Vec<f32>)],
        kvs: &[&mut LayerKv],
    ) -> Vec<Vec<usize>> {
        let n = rows.len();
        let (ih, id) = (ix.heads, ix.compressor.dim);
        let mut iq = vec![0f32; n * ih * id];
        ix.q_b.forward(qr, n, &mut iq);
        let mut wts = vec![0f32; n * ih];
        ix.weights.forward_kept(x, n, &mut wts);
        let ws = (ih as f32).powf(-0.5);
        let ss = (id as f32).powf(-0.5);
        let bd = self.block_dim();
        let kd = self.compressor.as_ref().map_or(0, |c| c.dim);
        rows.par_iter()
            .enumerate()
            .map(|(r, &(span, p))| {
                let (cos, sin) = &tables[r];
                let mut qh = iq[r * ih * id..(r + 1) * ih * id].to_vec();
                for h in qh.chunks_exact_mut(id) {
                    rope_tail(h, cos, sin, 1.0);
                }
                let visible = (p + 1) / self.rate;
                let blocks = &kvs[span].blocks;
                let scores: Vec<f32> = (0..visible)
                    .map(|b| {
                        let k = &blocks[b * bd + kd..(b + 1) * bd];
                        qh.chunks_exact(id)
                            .zip(&wts[r * ih..(r + 1) * ih])
                            .map(|(q, &w)| (dot(q, k).max(0.0) * ss) * (w * ws))
                            .sum()
                    })
                    .collect();
                let mut pick: Vec<usize> = crate::layers::moe::top_k(&scores, ix.topk)
                    .into_iter()
                    .map(|(b, _)| b as usize)
                    .collect();
                pick.sort_unstable();
                pick
            })
            .collect()
    }

    /// Drops the window's and the compressor's rows no later position reads (Inkling's
    /// [`trim`]; the entries stay).
    pub fn trim_spans(&self, spans: &[Span], kvs: &mut [&mut LayerKv]) {
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            trim(
                kv,
                s.pos0 + s.n,
                self.kv_dim(),
                Some(self.window),
                self.kernel(),
            );
        }
    }
}

/// Copies `src` (`[n, w]`) into columns `off..off + w` of `dst` (`[n, width]`).
fn put_cols(dst: &mut [f32], width: usize, off: usize, src: &[f32], w: usize) {
    for (d, s) in dst.chunks_exact_mut(width).zip(src.chunks_exact(w)) {
        d[off..off + w].copy_from_slice(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_rotation_and_its_inverse() {
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        let (c, s) = ([0.6f32], [0.8f32]);
        rope_tail(&mut x, &c, &s, 1.0);
        // Only the trailing pair (3, 4) turns: (3*0.6 - 4*0.8, 4*0.6 + 3*0.8).
        assert_eq!(x[..2], [1.0, 2.0]);
        assert!((x[2] - (1.8 - 3.2)).abs() < 1e-6 && (x[3] - (2.4 + 2.4)).abs() < 1e-6);
        rope_tail(&mut x, &c, &s, -1.0);
        assert!(
            (x[2] - 3.0).abs() < 1e-6 && (x[3] - 4.0).abs() < 1e-6,
            "{x:?}"
        );
    }
}
