//! Multi-head latent attention (MLA) of DeepSeek-V3 / Kimi-K2, as transformers 5.23
//! `modeling_deepseek_v3.py` (`DeepseekV3Attention`) computes it, with YaRN RoPE
//! (`modeling_rope_utils._compute_yarn_parameters`). Written up in `docs/MLA.md`.
//!
//! ```text
//! q      = q_b(RMSNorm_1e-6(q_a(x)))   (or q_proj(x))          [T, nh, dn + dr]  nope first
//! ckv    = kv_a_proj_with_mqa(x)                               [T, rkv + dr]
//! c      = RMSNorm_1e-6(ckv[:, :rkv])                          [T, rkv]   cached
//! k_pe   = RoPE(ckv[:, rkv:])                                  [T, dr]    cached, one head
//! kv     = kv_b(c)                                             [T, nh, dn + dv]
//! score  = (q_nope . k_nope + q_pe . k_pe) * softmax_scale, causal softmax (f32), o = p v
//! ```
//!
//! The KV cache holds `rkv + dr` f32 values per token (`c` then the rotated `k_pe`), plus the
//! GLM-5 DSA indexer key ([`crate::layers::dsa_indexer`]) on layers that run an indexer.
//! Prefill re-expands keys and values through `kv_b` (the "expanded" form); decode (one token)
//! uses the "absorbed" form, folding `kv_b`'s key rows into the query and its value rows into
//! the output so that attention runs directly over the cached latents (DeepSeek's reference
//! `attn_impl="absorb"`). GLM-5 (`glm_moe_dsa`) restricts each query to the keys its indexer
//! selects.

use crate::layers::attention::BLOCK_ROWS;
use crate::layers::dsa_indexer::{DsaIndexer, Selection};
use crate::layers::{LayerKv, Linear, RmsNorm, Rope, Span};
use coli_format::spec::MlaSpec;
use coli_kernels::attend::{self, KeyValues, Run};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// The rotary frequencies (`qk_rope_head_dim / 2` values, f32) and the cos/sin multiplier
/// (`attention_factor`), as `_compute_yarn_parameters` (YaRN) or the default RoPE.
/// A NoPE model (`m.nope`, Kimi-Linear) gets [`Rope::none`].
pub fn mla_rope(m: &MlaSpec) -> (Rope, f32) {
    if m.nope {
        return (Rope::none(m.qk_rope_head_dim), 1.0);
    }
    match &m.yarn {
        None => (Rope::new(m.qk_rope_head_dim, m.rope_theta), 1.0),
        Some(y) => Rope::yarn(m.qk_rope_head_dim, m.rope_theta, y),
    }
}

/// The DSA part of a GLM-5 attention block: a `"full"` layer runs its indexer and publishes
/// the selection in `slot`; a `"shared"` layer reads the selection its full layer published for
/// the same batch (layers run in order, so the slot always holds the current batch).
pub enum Dsa<'s> {
    /// Runs its own indexer (its keys are cached after the MLA latent).
    Full {
        /// The indexer.
        indexer: Box<DsaIndexer<'s>>,
        /// Where this layer's selection is published for following shared layers.
        slot: SelectionSlot,
    },
    /// Reuses the selection of the previous full layer.
    Shared {
        /// The slot of that full layer.
        slot: SelectionSlot,
    },
}

/// The selection of the current batch, shared between a full DSA layer and its shared layers.
pub type SelectionSlot = Arc<Mutex<Selection>>;

/// One MLA attention block.
pub struct Mla<'s> {
    /// `q_a_proj` `[rq, H]` and `q_a_layernorm` (eps 1e-6), when `q_lora_rank` is set.
    pub q_a: Option<(Linear<'s>, RmsNorm)>,
    /// `q_b_proj` `[nh * (dn + dr), rq]` or `q_proj` `[nh * (dn + dr), H]`.
    pub q_b: Linear<'s>,
    /// `kv_a_proj_with_mqa` `[rkv + dr, H]`.
    pub kv_a: Linear<'s>,
    /// `kv_a_layernorm` `[rkv]` (eps 1e-6).
    pub kv_norm: RmsNorm,
    /// `kv_b_proj` `[nh * (dn + dv), rkv]`, fused or split ([`KvB`]).
    pub kv_b: KvB<'s>,
    /// `o_proj` `[H, nh * dv]`.
    pub o: Linear<'s>,
    /// Kimi K3's output gate `g_proj` `[nh * dv, H]`: the attention output (`[nh * dv]` per
    /// row) is multiplied by `sigmoid(g_proj(x))` before `o_proj`, `x` the layer's normalized
    /// input (`KimiMLAAttention` with `mla_use_output_gate`). None elsewhere.
    pub gate: Option<Linear<'s>>,
    /// Heads nh.
    pub num_heads: usize,
    /// dn.
    pub nope: usize,
    /// dr.
    pub rope_dim: usize,
    /// dv.
    pub v_dim: usize,
    /// rkv.
    pub kv_lora_rank: usize,
    /// Score multiplier.
    pub softmax_scale: f32,
    /// cos/sin multiplier (YaRN `attention_factor`).
    pub attention_factor: f32,
    /// Interleaved RoPE pairs.
    pub interleave: bool,
    /// GLM-5 sparse attention (None: every causal key).
    pub dsa: Option<Dsa<'s>>,
    /// One-token calls (decode) use the absorbed form (default true); false forces the
    /// expanded form everywhere (to check one against the other).
    pub absorb_decode: bool,
}

/// MLA's key/value up-projection as the store holds it
/// ([`coli_format::spec::MlaKvBSpec`]). Both forms are multiplied with f32 activations under
/// any numerics (the absorbed decode never multiplies a quantized latent by it).
pub enum KvB<'s> {
    /// `kv_b_proj` `[nh * (dn + dv), rkv]`: per head, dn key rows then dv value rows.
    Fused(Linear<'s>),
    /// llama.cpp's split of a deepseek2 GGUF: `k` = `k_b_proj` `[nh * rkv, dn]` (head h's key
    /// rows transposed: row `h rkv + c` is column c of them), `v` = `v_b_proj` `[nh * dv, rkv]`.
    Split {
        /// `k_b_proj`.
        k: Linear<'s>,
        /// `v_b_proj`.
        v: Linear<'s>,
    },
}

impl KvB<'_> {
    /// Expands latents `lat` (`[rows, rkv]`) to `[rows, nh * (dn + dv)]` (per head dn key
    /// values then dv values) in f32. Every row's bits depend on that row alone (the kernels'
    /// matmul rows equal their matvec), so a position expanded alone or with others agrees.
    /// Split: values through `v_b`; keys per head through `W_kb = k_b[h]^T` (`[dn, rkv]`,
    /// dequantized and transposed once per call) as an f32 matrix.
    fn expand(
        &self,
        lat: &[f32],
        rows: usize,
        dims: (usize, usize, usize, usize),
        out: &mut [f32],
    ) {
        let (nh, dn, dv, rkv) = dims;
        let (k, v) = match self {
            KvB::Fused(l) => return l.forward_exact(lat, rows, out),
            KvB::Split { k, v } => (k, v),
        };
        let mut vals = vec![0f32; rows * nh * dv];
        v.forward_exact(lat, rows, &mut vals);
        let keys: Vec<Vec<f32>> = (0..nh)
            .into_par_iter()
            .map(|h| {
                let mut wt = vec![0f32; dn * rkv];
                let mut row = vec![0f32; dn];
                for c in 0..rkv {
                    k.w.dequantize_row(h * rkv + c, &mut row);
                    for (d, x) in row.iter().enumerate() {
                        wt[d * rkv + c] = *x;
                    }
                }
                let bytes: Vec<u8> = wt.iter().flat_map(|x| x.to_le_bytes()).collect();
                let view =
                    coli_format::MatrixView::new(coli_format::Encoding::F32, dn, rkv, &bytes, &[])
                        .expect("an f32 matrix of its own size");
                let mut kh = vec![0f32; rows * dn];
                let exact = coli_kernels::Numerics::Exact;
                if rows == 1 {
                    coli_kernels::matvec_num(
                        coli_kernels::detected_isa(),
                        exact,
                        &view,
                        lat,
                        &mut kh,
                    );
                } else {
                    coli_kernels::matmul_num(
                        coli_kernels::detected_isa(),
                        exact,
                        &view,
                        lat,
                        rows,
                        &mut kh,
                    );
                }
                kh
            })
            .collect();
        let w = dn + dv;
        for j in 0..rows {
            for (h, kh) in keys.iter().enumerate() {
                let o = &mut out[(j * nh + h) * w..(j * nh + h + 1) * w];
                o[..dn].copy_from_slice(&kh[j * dn..(j + 1) * dn]);
                o[dn..].copy_from_slice(&vals[(j * nh + h) * dv..(j * nh + h + 1) * dv]);
            }
        }
    }

    /// The absorbed query of head h: `q_abs = W_kb^T q_nope` (`[rkv]`, W_kb head h's `[dn,
    /// rkv]` key rows), summed over the dn key rows in order (fused) or as one dot product per
    /// latent channel (split, whose rows are W_kb's columns).
    fn absorb_query(
        &self,
        h: usize,
        q_nope: &[f32],
        dims: (usize, usize, usize, usize),
    ) -> Vec<f32> {
        let (_, dn, dv, rkv) = dims;
        let mut q_abs = vec![0f32; rkv];
        match self {
            KvB::Fused(l) => {
                let mut row = vec![0f32; rkv];
                for (d, &qd) in q_nope.iter().enumerate() {
                    l.w.dequantize_row(h * (dn + dv) + d, &mut row);
                    coli_kernels::axpy(qd, &row, &mut q_abs);
                }
            }
            KvB::Split { k, .. } => {
                let mut row = vec![0f32; dn];
                for (c, o) in q_abs.iter_mut().enumerate() {
                    k.w.dequantize_row(h * rkv + c, &mut row);
                    *o = coli_kernels::dot(&row, q_nope);
                }
            }
        }
        q_abs
    }

    /// Value row e of head h (`[rkv]`, f32) into `row`.
    fn value_row(&self, h: usize, e: usize, dims: (usize, usize, usize, usize), row: &mut [f32]) {
        let (_, dn, dv, _) = dims;
        match self {
            KvB::Fused(l) => l.w.dequantize_row(h * (dn + dv) + dn + e, row),
            KvB::Split { v, .. } => v.w.dequantize_row(h * dv + e, row),
        }
    }
}

/// Rotates `x` (`dr` values) in place at the angles of `cos`/`sin` (already scaled by the
/// attention factor). Interleaved: pair i = `(x[2i], x[2i+1])`, written de-interleaved
/// (`[rotated evens, rotated odds]`) as transformers' `apply_rotary_pos_emb_interleave`;
/// otherwise the rotate_half form of [`Rope::apply`].
pub fn rope_apply(x: &mut [f32], cos: &[f32], sin: &[f32], interleave: bool) {
    if interleave {
        let half = x.len() / 2;
        let tmp: Vec<f32> = (0..half)
            .map(|i| x[2 * i])
            .chain((0..half).map(|i| x[2 * i + 1]))
            .collect();
        x.copy_from_slice(&tmp);
    }
    Rope::apply(x, cos, sin);
}

impl Mla<'_> {
    /// f32 values per token in the KV cache: `kv_lora_rank + qk_rope_head_dim`, plus
    /// `index_head_dim` on a layer that runs a DSA indexer. Row layout `[c | k_pe | ik]`.
    pub fn kv_dim(&self) -> usize {
        self.kv_lora_rank + self.rope_dim + self.index_dim()
    }

    /// Indexer key values per token (0 without an own indexer).
    fn index_dim(&self) -> usize {
        match &self.dsa {
            Some(Dsa::Full { indexer, .. }) => indexer.cached_dim(),
            _ => 0,
        }
    }

    /// Projects `x` (`[n, H]`) to queries `[n, nh * (dn + dr)]` (RoPE applied to each head's
    /// last dr values) and to the latent cache rows `[n, rkv + dr]` (`c` normalized, `k_pe`
    /// rotated); returns them with the normalized q latent (`[n, rq]`, when q_lora). Row `t`
    /// is rotated with `tables[t]`.
    fn project(
        &self,
        x: &[f32],
        n: usize,
        tables: &[(Vec<f32>, Vec<f32>)],
    ) -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
        let (nh, dn, dr, rkv) = (self.num_heads, self.nope, self.rope_dim, self.kv_lora_rank);
        let qd = nh * (dn + dr);
        let mut q = vec![0f32; n * qd];
        let q_lat = match &self.q_a {
            Some((qa, norm)) => {
                let mut lat = vec![0f32; n * qa.rows()];
                qa.forward(x, n, &mut lat);
                norm.forward_inplace(&mut lat);
                self.q_b.forward(&lat, n, &mut q);
                Some(lat)
            }
            None => {
                self.q_b.forward(x, n, &mut q);
                None
            }
        };
        let kvd = rkv + dr;
        let mut ckv = vec![0f32; n * kvd];
        self.kv_a.forward(x, n, &mut ckv);
        let mut tmp = vec![0f32; rkv];
        for (t, (cos, sin)) in tables.iter().enumerate() {
            let row = &mut ckv[t * kvd..(t + 1) * kvd];
            coli_kernels::rms_norm(
                &row[..rkv],
                &self.kv_norm.weight,
                self.kv_norm.eps,
                &mut tmp,
            );
            row[..rkv].copy_from_slice(&tmp);
            rope_apply(&mut row[rkv..], cos, sin, self.interleave);
            for h in 0..nh {
                let s = t * qd + h * (dn + dr) + dn;
                rope_apply(&mut q[s..s + dr], cos, sin, self.interleave);
            }
        }
        (q, q_lat, ckv)
    }

    /// Attention for `n` tokens at positions `pos0..pos0+n` (normalized hidden states `x`,
    /// `[n, H]`): appends their latent rows to `kv` and writes the o_proj output to `out`
    /// (`[n, H]`). One span of [`Mla::forward_spans`].
    pub fn forward(
        &self,
        x: &[f32],
        n: usize,
        pos0: usize,
        rope: &Rope,
        kv: &mut LayerKv,
        out: &mut [f32],
    ) {
        self.forward_spans(x, &[Span::new(pos0, n)], rope, &mut [kv], out);
    }

    /// Attention for several sequences in one pass (row layout as
    /// [`crate::layers::Attention::forward_spans`]: `x` `[N, H]` holds span 0's rows, then span
    /// 1's, ...; `kvs[i]` is span i's cache, holding `pos0` rows; `out` `[N, H]`). The q/kv/o
    /// projections run once over all N rows; each span then appends its latent rows (and GLM-5
    /// indexer keys), runs its DSA selection and attends over its own cache: a span of one
    /// token (decode), and every row of a span marked `as_decode`, in the absorbed form when
    /// `absorb_decode`, otherwise the expanded form
    /// (`kv_b` applied to every cached latent). Each row's result is bit-identical to running
    /// its sequence alone. A full DSA layer publishes the selections of all N rows for the
    /// shared layers that follow.
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        rope: &Rope,
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        debug_assert_eq!(spans.len(), kvs.len());
        let n = Span::rows(spans);
        let tables: Vec<(Vec<f32>, Vec<f32>)> = Span::row_positions(spans)
            .into_iter()
            .map(|(_, pos)| {
                let (mut cos, mut sin) = rope.tables(pos);
                for v in cos.iter_mut().chain(sin.iter_mut()) {
                    *v *= self.attention_factor;
                }
                (cos, sin)
            })
            .collect();
        let (q, q_lat, ckv) = self.project(x, n, &tables);
        let (nh, dn, dr, dv) = (self.num_heads, self.nope, self.rope_dim, self.v_dim);
        let (qd, kvd, h) = (nh * (dn + dr), self.kv_lora_rank + dr, x.len() / n.max(1));
        let stride = self.kv_dim();
        let shared: Option<Selection> = match &self.dsa {
            Some(Dsa::Shared { slot }) => {
                Some(slot.lock().unwrap_or_else(|e| e.into_inner()).clone())
            }
            _ => None,
        };
        let mut published: Selection = Vec::new();
        let mut ctx = Vec::with_capacity(n * nh * dv);
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            let rows = r0..r0 + s.n;
            let xs = &x[rows.start * h..rows.end * h];
            let span_tables = &tables[rows.clone()];
            debug_assert_eq!(kv.k.len(), s.pos0 * stride);
            let new_rows = &ckv[rows.start * kvd..rows.end * kvd];
            let sel: Option<Selection> = match &self.dsa {
                None => {
                    kv.k.extend_from_slice(new_rows);
                    None
                }
                Some(Dsa::Full { indexer, .. }) => {
                    let ik = indexer.keys(xs, s.n, span_tables);
                    let id = indexer.cached_dim();
                    for t in 0..s.n {
                        kv.k.extend_from_slice(&new_rows[t * kvd..(t + 1) * kvd]);
                        kv.k.extend_from_slice(&ik[t * id..(t + 1) * id]);
                    }
                    indexer.close_pools(&mut kv.k, stride, kvd, s.pos0, s.n);
                    // load_mla refuses an indexer without q_lora_rank, so q_lat is present.
                    let lat = q_lat.as_deref().unwrap_or(&[]);
                    let rq = lat.len() / n.max(1);
                    let sel = indexer.select(
                        &lat[rows.start * rq..rows.end * rq],
                        xs,
                        s.n,
                        s.pos0,
                        span_tables,
                        (&kv.k, stride, self.kv_lora_rank + dr),
                    );
                    published.extend(sel.iter().cloned());
                    Some(sel)
                }
                Some(Dsa::Shared { .. }) => {
                    kv.k.extend_from_slice(new_rows);
                    shared.as_ref().map(|all| all[rows.clone()].to_vec())
                }
            };
            let qs = &q[rows.start * qd..rows.end * qd];
            if (s.n == 1 || s.as_decode) && self.absorb_decode {
                // Decode form: each row alone against the cache (it reads positions <= its
                // own, so the rows after it in this span do not matter).
                for t in 0..s.n {
                    let keys = sel.as_ref().map(|s| s[t].as_slice());
                    let qt = &qs[t * qd..(t + 1) * qd];
                    ctx.extend_from_slice(&self.attend_absorbed(qt, s.pos0 + t, keys, &kv.k));
                }
            } else {
                let LayerKv { k, expanded, .. } = &mut **kv;
                ctx.extend_from_slice(&self.attend_expanded(
                    qs,
                    s.n,
                    s.pos0,
                    sel.as_ref(),
                    k,
                    expanded.as_mut(),
                ));
            }
            r0 += s.n;
        }
        if let Some(Dsa::Full { slot, .. }) = &self.dsa {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = published;
        }
        if let Some(g) = &self.gate {
            let mut gv = vec![0f32; ctx.len()];
            g.forward(x, n, &mut gv);
            for (c, g) in ctx.iter_mut().zip(&gv) {
                *c *= 1.0 / (1.0 + (-g).exp());
            }
        }
        self.o.forward(&ctx, n, out);
    }

    /// Expanded form: `k_nope`/`v` of every cached position from `kv_b`, then per (token,
    /// head) softmax over the allowed keys. Returns `[n, nh * dv]`. With `expanded` (a
    /// layer-major prefill, [`LayerKv::expanded`]) the expansion of the first `pos0` positions
    /// is taken from it and only the `n` new rows are expanded and appended: the same bits, as
    /// `kv_b` computes every row alone (a matmul row equals the matvec).
    fn attend_expanded(
        &self,
        q: &[f32],
        n: usize,
        pos0: usize,
        sel: Option<&Selection>,
        cache: &[f32],
        expanded: Option<&mut Vec<f32>>,
    ) -> Vec<f32> {
        let (nh, dn, dr, dv, rkv) = (
            self.num_heads,
            self.nope,
            self.rope_dim,
            self.v_dim,
            self.kv_lora_rank,
        );
        let stride = self.kv_dim();
        let total = pos0 + n;
        let w = dn + dv;
        let expand = |from: usize, to: &mut Vec<f32>| {
            let rows = total - from;
            let mut lat = Vec::with_capacity(rows * rkv);
            for j in from..total {
                lat.extend_from_slice(&cache[j * stride..j * stride + rkv]);
            }
            let start = to.len();
            to.resize(start + rows * nh * w, 0.0);
            // f32 activations under any numerics: the absorbed decode never multiplies a
            // quantized latent by kv_b, and the two forms must agree.
            self.kv_b
                .expand(&lat, rows, (nh, dn, dv, rkv), &mut to[start..]);
        };
        let mut own = Vec::new();
        let kvx: &Vec<f32> = match expanded {
            Some(e) => {
                // Anything but exactly the first pos0 positions is expanded again.
                if e.len() != pos0 * nh * w {
                    e.clear();
                }
                let from = e.len() / (nh * w);
                expand(from, e);
                e
            }
            None => {
                expand(0, &mut own);
                &own
            }
        };
        let qd = nh * (dn + dr);
        let scale = self.softmax_scale;
        // Blocked (coli_kernels::attend): one block per (head, tile of BLOCK_ROWS tokens); each
        // row's bits are the per-row form's.
        let blocks: Vec<(usize, std::ops::Range<usize>)> = (0..nh)
            .flat_map(|h| {
                (0..n)
                    .step_by(BLOCK_ROWS)
                    .map(move |t| (h, t..(t + BLOCK_ROWS).min(n)))
            })
            .collect();
        let outs: Vec<Vec<f32>> = blocks
            .par_iter()
            .map(|(h, tokens)| {
                let h = *h;
                let mut spec = Vec::with_capacity(tokens.len());
                let (mut q_nope, mut q_pe) = (Vec::new(), Vec::new());
                for t in tokens.clone() {
                    let qh = &q[t * qd + h * (dn + dr)..t * qd + (h + 1) * (dn + dr)];
                    q_nope.push(&qh[..dn]);
                    q_pe.push(&qh[dn..]);
                    spec.push(attend::Row {
                        keys: match sel {
                            Some(s) => attend::Keys::List(&s[t]),
                            None => attend::Keys::Range {
                                lo: 0,
                                hi: pos0 + t + 1,
                            },
                        },
                        sink: None,
                    });
                }
                let mut head = ExpandedHead {
                    nope: attend::StridedHead::new(
                        q_nope,
                        kvx,
                        kvx,
                        nh * w,
                        h * w,
                        h * w + dn,
                        dv,
                        0,
                        1.0,
                    ),
                    pe: attend::StridedHead::new(q_pe, cache, cache, stride, rkv, 0, 0, 0, 1.0),
                    scale,
                };
                let mut o = vec![0f32; tokens.len() * dv];
                attend::attend_block(&mut head, &spec, dv, &mut o);
                o
            })
            .collect();
        let mut ctx = vec![0f32; n * nh * dv];
        for ((h, tokens), o) in blocks.iter().zip(&outs) {
            for (t, ot) in tokens.clone().zip(o.chunks_exact(dv)) {
                ctx[(t * nh + h) * dv..(t * nh + h + 1) * dv].copy_from_slice(ot);
            }
        }
        ctx
    }

    /// Absorbed form for one query at `pos` (DeepSeek's `attn_impl="absorb"`): per head h,
    /// with `W_kb = kv_b[h*(dn+dv) .. h*(dn+dv)+dn]` (`[dn, rkv]`) and `W_vb` the next dv rows,
    /// `q_abs = q_nope W_kb` (`[rkv]`), `score_j = (q_abs . c_j + q_pe . k_pe_j) * scale`,
    /// `o = W_vb (sum_j p_j c_j)`: attention runs directly over the cached latents, nothing is
    /// expanded. Returns `[nh * dv]`.
    fn attend_absorbed(
        &self,
        q: &[f32],
        pos: usize,
        keys: Option<&[usize]>,
        cache: &[f32],
    ) -> Vec<f32> {
        let (nh, dn, dr, dv, rkv) = (
            self.num_heads,
            self.nope,
            self.rope_dim,
            self.v_dim,
            self.kv_lora_rank,
        );
        let stride = self.kv_dim();
        let all: Vec<usize>;
        let keys: &[usize] = match keys {
            Some(k) => k,
            None => {
                all = (0..=pos).collect();
                &all
            }
        };
        let scale = self.softmax_scale;
        let dims = (nh, dn, dv, rkv);
        let mut ctx = vec![0f32; nh * dv];
        ctx.par_chunks_mut(dv).enumerate().for_each(|(h, o)| {
            let qh = &q[h * (dn + dr)..(h + 1) * (dn + dr)];
            let mut row = vec![0f32; rkv];
            let q_abs = self.kv_b.absorb_query(h, &qh[..dn], dims);
            let mut scores: Vec<f32> = keys
                .iter()
                .map(|&j| {
                    let c = &cache[j * stride..j * stride + rkv];
                    let kp = &cache[j * stride + rkv..j * stride + rkv + dr];
                    (coli_kernels::dot(&q_abs, c) + coli_kernels::dot(&qh[dn..], kp)) * scale
                })
                .collect();
            coli_kernels::softmax_inplace(&mut scores);
            let mut lat = vec![0f32; rkv];
            for (&j, p) in keys.iter().zip(&scores) {
                coli_kernels::axpy(*p, &cache[j * stride..j * stride + rkv], &mut lat);
            }
            for (e, oe) in o.iter_mut().enumerate() {
                self.kv_b.value_row(h, e, dims, &mut row);
                *oe = coli_kernels::dot(&row, &lat);
            }
        });
        ctx
    }
}

/// One head of MLA's expanded form for a block of rows: score `(q_nope . k_nope_j + q_pe .
/// k_pe_j) * scale` (the two dot products as [`coli_kernels::dot`]), value `v_j`, both `k_nope`
/// and `v` from the `kv_b` expansion and `k_pe` from the cache.
struct ExpandedHead<'a> {
    /// `q_nope` against the expansion's `k_nope`, its values `v` (scale 1: the bare dot).
    nope: attend::StridedHead<'a>,
    /// `q_pe` against the cache's `k_pe` (scale 1; no values).
    pe: attend::StridedHead<'a>,
    scale: f32,
}

impl KeyValues for ExpandedHead<'_> {
    fn load_keys(&mut self, lo: usize, hi: usize) {
        self.nope.load_keys(lo, hi);
        self.pe.load_keys(lo, hi);
    }

    fn load_values(&mut self, lo: usize, hi: usize) {
        self.nope.load_values(lo, hi);
    }

    fn scores(&self, row: usize, run: Run<'_>, out: &mut [f32]) {
        self.nope.scores(row, run, out);
        let mut pe = [0f32; attend::KEY_TILE];
        let mut long = Vec::new();
        let pe = if out.len() <= pe.len() {
            &mut pe[..out.len()]
        } else {
            long.resize(out.len(), 0.0);
            &mut long[..]
        };
        self.pe.scores(row, run, pe);
        for (s, p) in out.iter_mut().zip(pe.iter()) {
            *s = (*s + p) * self.scale;
        }
    }

    fn accumulate(&self, row: usize, run: Run<'_>, p: &[f32], out: &mut [f32]) {
        self.nope.accumulate(row, run, p, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yarn_ramp_and_mscale_match_the_notes() {
        let v = json!({"model_type": "deepseek_v3", "vocab_size": 10, "hidden_size": 16,
            "num_attention_heads": 2, "n_routed_experts": 16, "moe_intermediate_size": 8,
            "num_experts_per_tok": 2, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16, "kv_lora_rank": 32, "num_hidden_layers": 2, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}});
        let spec = coli_format::ModelSpec::from_config(&v, None).unwrap();
        let c = spec.mla.as_ref().unwrap();
        let m = 0.1 * 4f64.ln() + 1.0;
        assert!((c.softmax_scale as f64 - 24f64.powf(-0.5) * m * m).abs() < 1e-6);
        let (r, af) = mla_rope(c);
        assert_eq!(af, 1.0);
        let base = Rope::new(8, 1e4);
        // Ramp [0, .5, 1, 1]: i=0 keeps the frequency, i>=2 are divided by the factor.
        assert_eq!(r.inv_freq[0], base.inv_freq[0]);
        assert!((r.inv_freq[1] - base.inv_freq[1] * (0.5 + 0.5 / 4.0)).abs() < 1e-7);
        assert!((r.inv_freq[3] - base.inv_freq[3] / 4.0).abs() < 1e-9);
    }

    #[test]
    fn interleaved_rope_rotates_adjacent_pairs() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        let (c, s) = (vec![0.0, 1.0], vec![1.0, 0.0]);
        rope_apply(&mut x, &c, &s, true);
        // pair 0 = (1, 2) rotated by 90 degrees -> (-2, 1); pair 1 = (3, 4) unchanged.
        assert_eq!(x, vec![-2.0, 3.0, 1.0, 4.0]);
    }
}
