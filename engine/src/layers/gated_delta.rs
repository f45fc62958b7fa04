//! A gated delta rule linear-attention layer: the Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6-MoE;
//! transformers 5.25 `Qwen3NextGatedDeltaNet`, `models/qwen3_next/modeling_qwen3_next.py`, and
//! `Qwen3_5MoeGatedDeltaNet`, `models/qwen3_5_moe/modeling_qwen3_5_moe.py`) and Kimi Delta
//! Attention (Kimi-Linear; `KimiLinearDeltaAttention`, `models/kimi_linear/modeling_kimi_linear.py`).
//! One layer, two rules ([`DeltaRule`]), the same state:
//!
//! 1. The input projections ([`GatedDeltaProjections`]) give, per position, the convolution's
//!    inputs `[q | k | v]`, the output gate `z` (`Hv dv`), `b` (`Hv`) and the decay input `a`
//!    (`Hv` for the Gated DeltaNet, `Hv dk` for KDA). Qwen3-Next's `in_proj_qkvz` and
//!    `in_proj_ba` group their rows per key head (`fix_query_key_value_ordering`): group g holds
//!    `q_g (dk) | k_g (dk) | v (r dv) | z (r dv)` and `b (r) | a (r)` of value heads
//!    `g r .. (g + 1) r` (`r = Hv / Hk`); Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
//!    `in_proj_a` give them in that order already (so do a `qwen3next` GGUF's `in_proj_qkv`
//!    and `in_proj_z`, beside the grouped `in_proj_ba`); KDA's `q_proj`, `k_proj`, `v_proj`,
//!    `b_proj` and its low-rank `f_b(f_a(x))` (decay) and `g_b(g_a(x))` (gate). Value head `h`
//!    reads key head `h / r`, or `h % Hk` in a `qwen35moe` GGUF's tiled order
//!    ([`GatedDeltaNet::tiled_value_heads`]).
//! 2. A causal depthwise convolution of `K` taps over the channels `[q | k | v]`
//!    (`C = 2 Hk dk + Hv dv`), then SiLU (`causal_conv1d_forward` / `causal_conv1d_update`:
//!    positions before 0 read zeros).
//! 3. q and k L2-normalized per head, q scaled by `dk^-0.5` (each rule's `normalize_qk`);
//!    `beta = sigmoid(b)`, the log decay `g = -exp(A_log) softplus(a + dt_bias)` (softplus as
//!    torch's: `x` above 20, else `ln_1p(exp(x))`; transformers' KDA forget gate writes
//!    `log(1 + exp(x))`, which rounds to 0 below about -17 where this gives about 1e-8: rounding
//!    only), one per head and token (Gated DeltaNet) or per key channel (KDA: `dt_bias` has
//!    `Hv dk` values, `A_log` one per head); GLM-5.3-Flash's safe KDA gate instead
//!    `g = lower_bound * sigmoid(exp(A_log) (f + dt_bias))` (`Glm5NextTextForgetGate`).
//! 4. The rule per value head ([`coli_kernels::gated_delta`], [`coli_kernels::kda`]) from the
//!    layer's recurrent state.
//! 5. The gated RMSNorm of each value head's output: `rms_norm(o) * w * act(z)` with
//!    `act = silu` (Gated DeltaNet) or `sigmoid` (KDA's `o_norm`); `out_proj` / `o_proj`.
//!
//! **State** (in the layer's [`LayerKv`]): the convolution's inputs per position (`conv`,
//! `C` f32 per row, trimmed like Inkling's to what later positions read) and the recurrent
//! state `[Hv, dk, dv]` after the last position (`recurrent`). The recurrent state is exact
//! only at that length (`min_len`), so going back needs a state kept for the length it goes
//! back to: a verification pass keeps its rows' states (`recurrent_history`: rejected drafts
//! roll back exactly), a prefill chunk's start and every [`CHECKPOINT_EVERY`]-th decode
//! position keep a checkpoint (`checkpoints`, at most [`MAX_CHECKPOINTS`]: forks, edited
//! prompts and reused prefixes resume at the nearest, [`crate::Sequence::exact_at_most`]), and
//! a long operation pins its start (the sequence's pin: a failed or stopped pass rolls back).
//!
//! **Which form runs.** A position runs in the chunkwise form when the whole aligned chunk of
//! [`CHUNK`] positions it belongs to (positions `64 c .. 64 (c + 1)`) lies inside one span of a
//! prefill pass; every other position (decode, verification rows (`Span::as_decode`), a
//! prompt's head or tail outside whole aligned chunks) runs the recurrent form. A position's
//! bits therefore depend on its position and on how passes split the prompt, never on the
//! batch, the threads, the cache or the other sequences in the pass.

use crate::layers::inkling::trim;
use crate::layers::{LayerKv, Linear, RecurrentCheckpoint, RmsNorm, Span};
use coli_kernels::gated_delta::{ChunkScratch, CHUNK};
use coli_kernels::{gated_delta, kda};
use rayon::prelude::*;

pub use coli_format::spec::qwen3_next::{CHECKPOINT_EVERY, MAX_CHECKPOINTS};
pub use coli_format::spec::DeltaRule;

// Both rules' chunkwise forms take the same chunk of positions.
const _: () = assert!(kda::CHUNK == CHUNK);

/// A Gated DeltaNet layer's input projections.
// One per layer, loaded once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum GatedDeltaProjections<'s> {
    /// Qwen3-Next: `in_proj_qkvz` `[2 Hk dk + 2 Hv dv, H]` and `in_proj_ba` `[2 Hv, H]`, rows
    /// grouped per key head (see the module doc).
    Fused {
        /// `in_proj_qkvz`.
        qkvz: Linear<'s>,
        /// `in_proj_ba`.
        ba: Linear<'s>,
    },
    /// Qwen3.5 / Qwen3.6: `in_proj_qkv` `[2 Hk dk + Hv dv, H]`, `in_proj_z` `[Hv dv, H]`,
    /// `in_proj_b` and `in_proj_a` `[Hv, H]`.
    Split {
        /// `in_proj_qkv`.
        qkv: Linear<'s>,
        /// `in_proj_z`.
        z: Linear<'s>,
        /// `in_proj_b`.
        b: Linear<'s>,
        /// `in_proj_a`.
        a: Linear<'s>,
    },
    /// Qwen3-Next as llama.cpp writes it: `in_proj_qkv` `[2 Hk dk + Hv dv, H]`, `in_proj_z`
    /// `[Hv dv, H]` and the grouped `in_proj_ba` `[2 Hv, H]`.
    SplitQkvz {
        /// `in_proj_qkv`.
        qkv: Linear<'s>,
        /// `in_proj_z`.
        z: Linear<'s>,
        /// `in_proj_ba`.
        ba: Linear<'s>,
    },
    /// Kimi Delta Attention: `q_proj`, `k_proj`, `v_proj` `[Hv d, H]`; the low-rank forget
    /// gate `f_a_proj` `[d, H]`, `f_b_proj` `[Hv d, d]`; `b_proj` `[Hv, H]`; the low-rank
    /// output gate `g_a_proj` `[d, H]`, `g_b_proj` `[Hv d, d]`, or Kimi K3's full-rank
    /// `g_proj` `[Hv d, H]` (in `g_b`, `g_a` None).
    Kda {
        /// `q_proj`.
        q: Linear<'s>,
        /// `k_proj`.
        k: Linear<'s>,
        /// `v_proj`.
        v: Linear<'s>,
        /// `f_a_proj`.
        f_a: Linear<'s>,
        /// `f_b_proj`.
        f_b: Linear<'s>,
        /// `b_proj`.
        b: Linear<'s>,
        /// `g_a_proj` (None: `g_b` is the full-rank `g_proj`).
        g_a: Option<Linear<'s>>,
        /// `g_b_proj`, or `g_proj`.
        g_b: Linear<'s>,
    },
}

/// One gated delta rule layer (see the module doc).
pub struct GatedDeltaNet<'s> {
    /// The rule (Gated DeltaNet or KDA).
    pub rule: DeltaRule,
    /// The input projections.
    pub input: GatedDeltaProjections<'s>,
    /// The convolution weights as f32 `[C, K]` (KDA's three concatenated).
    pub conv: Vec<f32>,
    /// `dt_bias`: `[Hv]` (Gated DeltaNet) or `[Hv dk]` (KDA).
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)` `[Hv]` (f32, as transformers computes it from the f32 `A_log`).
    pub neg_a: Vec<f32>,
    /// KDA's safe forget gate (GLM-5.3-Flash): `g = lower_bound * sigmoid(exp(A_log) (f +
    /// dt_bias))` instead of `-exp(A_log) softplus(f + dt_bias)`.
    pub gate_lower_bound: Option<f32>,
    /// The gated RMSNorm (`norm.weight` / `o_norm.weight` `[dv]`, used as is).
    pub norm: RmsNorm,
    /// `out_proj` / `o_proj` `[H, Hv dv]`.
    pub out: Linear<'s>,
    /// Key heads Hk.
    pub key_heads: usize,
    /// Value heads Hv.
    pub value_heads: usize,
    /// Value head `h` reads key head `h % Hk` (llama.cpp's tiled order) instead of
    /// `h / (Hv / Hk)` ([`coli_format::spec::GatedDeltaSpec::tiled_value_heads`]).
    pub tiled_value_heads: bool,
    /// Key head dimension dk.
    pub key_dim: usize,
    /// Value head dimension dv.
    pub value_dim: usize,
    /// Convolution taps K.
    pub kernel: usize,
}

/// `log(1 + exp(x))` as `torch.nn.functional.softplus` (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl GatedDeltaNet<'_> {
    /// Convolution channels C (`[q | k | v]`).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// The id of the rule's rounding (`gdr-r1`, `kda-r1`): part of the KV cache identity.
    pub fn rule_id(&self) -> &'static str {
        match self.rule {
            DeltaRule::GatedDeltaNet => gated_delta::RULE_ID,
            DeltaRule::Kda => kda::RULE_ID,
        }
    }

    /// Log decays per value head and token: 1 (Gated DeltaNet) or `dk` (KDA, one per key
    /// channel).
    fn decay_width(&self) -> usize {
        match self.rule {
            DeltaRule::GatedDeltaNet => 1,
            DeltaRule::Kda => self.key_dim,
        }
    }

    /// The layer's dimensions as the model spec states them.
    pub fn spec(&self) -> coli_format::spec::GatedDeltaSpec {
        coli_format::spec::GatedDeltaSpec {
            rule: self.rule,
            linear_layers: Vec::new(),
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_head_dim: self.key_dim,
            value_head_dim: self.value_dim,
            conv_kernel: self.kernel,
            gate_lower_bound: self.gate_lower_bound,
            full_rank_gate: matches!(self.input, GatedDeltaProjections::Kda { g_a: None, .. }),
            tiled_value_heads: self.tiled_value_heads,
            split_qkvz: matches!(self.input, GatedDeltaProjections::SplitQkvz { .. }),
        }
    }

    /// f32 values of the recurrent state (`Hv dk dv`).
    pub fn recurrent_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// The input projections of `n` rows `x` (`[n, H]`): the convolution's inputs `[n, C]`
    /// (`[q | k | v]`), `z` `[n, Hv dv]`, `b` `[n, Hv]` and `a` `[n, Hv decay_width]`.
    fn project(&self, x: &[f32], n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let (hk, hv, dk, dv) = (
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
        );
        let (kd, vd, c) = (hk * dk, hv * dv, self.conv_dim());
        let mut mixed = vec![0f32; n * c];
        let mut z = vec![0f32; n * vd];
        let mut b = vec![0f32; n * hv];
        let mut a = vec![0f32; n * hv * self.decay_width()];
        match &self.input {
            GatedDeltaProjections::Kda {
                q,
                k,
                v,
                f_a,
                f_b,
                b: bp,
                g_a,
                g_b,
            } => {
                // [q | k | v] per row: each projection into its own buffer, then interleaved.
                let mut part = vec![0f32; n * kd];
                for (i, l) in [q, k, v].into_iter().enumerate() {
                    l.forward(x, n, &mut part);
                    for (t, row) in part.chunks_exact(kd).enumerate() {
                        mixed[t * c + i * kd..t * c + (i + 1) * kd].copy_from_slice(row);
                    }
                }
                let mut low = vec![0f32; n * dk];
                f_a.forward(x, n, &mut low);
                f_b.forward(&low, n, &mut a);
                match g_a {
                    Some(g_a) => {
                        g_a.forward(x, n, &mut low);
                        g_b.forward(&low, n, &mut z);
                    }
                    None => g_b.forward(x, n, &mut z),
                }
                bp.forward(x, n, &mut b);
            }
            GatedDeltaProjections::Split {
                qkv,
                z: zp,
                b: bp,
                a: ap,
            } => {
                qkv.forward(x, n, &mut mixed);
                zp.forward(x, n, &mut z);
                bp.forward(x, n, &mut b);
                ap.forward(x, n, &mut a);
            }
            GatedDeltaProjections::SplitQkvz {
                qkv,
                z: zp,
                ba: bap,
            } => {
                qkv.forward(x, n, &mut mixed);
                zp.forward(x, n, &mut z);
                self.ungroup_ba(bap, x, n, &mut b, &mut a);
            }
            GatedDeltaProjections::Fused { qkvz: qp, ba: bap } => {
                let r = hv / hk;
                let mut qkvz = vec![0f32; n * (2 * kd + 2 * vd)];
                qp.forward(x, n, &mut qkvz);
                // Un-group the projection.
                let gw = 2 * dk + 2 * r * dv;
                for t in 0..n {
                    let row = &qkvz[t * (2 * kd + 2 * vd)..(t + 1) * (2 * kd + 2 * vd)];
                    let m = &mut mixed[t * c..(t + 1) * c];
                    for g in 0..hk {
                        let grp = &row[g * gw..(g + 1) * gw];
                        m[g * dk..(g + 1) * dk].copy_from_slice(&grp[..dk]);
                        m[kd + g * dk..kd + (g + 1) * dk].copy_from_slice(&grp[dk..2 * dk]);
                        m[2 * kd + g * r * dv..2 * kd + (g + 1) * r * dv]
                            .copy_from_slice(&grp[2 * dk..2 * dk + r * dv]);
                        z[t * vd + g * r * dv..t * vd + (g + 1) * r * dv]
                            .copy_from_slice(&grp[2 * dk + r * dv..]);
                    }
                }
                self.ungroup_ba(bap, x, n, &mut b, &mut a);
            }
        }
        (mixed, z, b, a)
    }

    /// Qwen3-Next's `in_proj_ba` of `n` rows `x`: `b` and `a` `[n, Hv]` from its rows grouped
    /// per key head (`[b (Hv/Hk) | a (Hv/Hk)]` each).
    fn ungroup_ba(&self, bap: &Linear<'_>, x: &[f32], n: usize, b: &mut [f32], a: &mut [f32]) {
        let (hk, hv) = (self.key_heads, self.value_heads);
        let r = hv / hk;
        let mut ba = vec![0f32; n * 2 * hv];
        bap.forward(x, n, &mut ba);
        for t in 0..n {
            for g in 0..hk {
                let bag = &ba[t * 2 * hv + g * 2 * r..t * 2 * hv + (g + 1) * 2 * r];
                b[t * hv + g * r..t * hv + (g + 1) * r].copy_from_slice(&bag[..r]);
                a[t * hv + g * r..t * hv + (g + 1) * r].copy_from_slice(&bag[r..]);
            }
        }
    }

    /// The layer for the rows of several sequences (`x`: `[N, H]`, the normalized rows of
    /// `spans[0]`, then `spans[1]`, ...; `kvs[i]`: span i's state, holding `pos0`
    /// positions). Appends each position's convolution inputs, advances the recurrent state,
    /// writes the layer's output to `out` (`[N, H]`).
    pub fn forward_spans(
        &self,
        x: &[f32],
        spans: &[Span],
        kvs: &mut [&mut LayerKv],
        out: &mut [f32],
    ) {
        let n = Span::rows(spans);
        let (hk, hv, dk, dv, kn) = (
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
            self.kernel,
        );
        let r = hv / hk;
        let (kd, vd, c) = (hk * dk, hv * dv, self.conv_dim());
        // Checkpoints first: the state and convolution rows at each span's start.
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            self.checkpoint(s, kv);
        }
        let (mixed, z, b, a) = self.project(x, n);
        // The causal convolution over each sequence's inputs, then SiLU.
        let mut conv = vec![0f32; n * c];
        let mut r0 = 0;
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            kv.conv_dim = c;
            kv.conv_tail = kn - 1;
            let first = kv.conv_first;
            debug_assert_eq!(kv.conv.len(), (s.pos0 - first) * c);
            kv.conv.extend_from_slice(&mixed[r0 * c..(r0 + s.n) * c]);
            for t in 0..s.n {
                let p = s.pos0 + t;
                let o = &mut conv[(r0 + t) * c..(r0 + t + 1) * c];
                for (ch, o) in o.iter_mut().enumerate() {
                    let w = &self.conv[ch * kn..(ch + 1) * kn];
                    let mut acc = 0f32;
                    for (j, wj) in w.iter().enumerate() {
                        // Input position p - (K - 1) + j.
                        if let Some(q) = (p + j + 1).checked_sub(kn) {
                            acc += wj * kv.conv[(q - first) * c + ch];
                        }
                    }
                    *o = acc * sigmoid(acc);
                }
            }
            r0 += s.n;
        }
        // Per value head: q, k normalized (q scaled), g (per head or per key channel) and beta.
        let gw = self.decay_width();
        let beta: Vec<f32> = b.iter().map(|&x| sigmoid(x)).collect();
        let g: Vec<f32> = a
            .chunks_exact(hv * gw)
            .flat_map(|row| {
                row.iter()
                    .zip(&self.dt_bias)
                    .enumerate()
                    .map(|(col, (&x, &bias))| match self.gate_lower_bound {
                        // `exp(A_log)` is `-neg_a` exactly.
                        Some(lb) => lb * sigmoid(-self.neg_a[col / gw] * (x + bias)),
                        None => self.neg_a[col / gw] * softplus(x + bias),
                    })
            })
            .collect();
        let mut qn = vec![0f32; n * kd];
        let mut knorm = vec![0f32; n * kd];
        for t in 0..n {
            qn[t * kd..(t + 1) * kd].copy_from_slice(&conv[t * c..t * c + kd]);
            knorm[t * kd..(t + 1) * kd].copy_from_slice(&conv[t * c + kd..t * c + 2 * kd]);
        }
        let normalize_qk = match self.rule {
            DeltaRule::GatedDeltaNet => gated_delta::normalize_qk,
            DeltaRule::Kda => kda::normalize_qk,
        };
        for (qh, kh) in qn.chunks_exact_mut(dk).zip(knorm.chunks_exact_mut(dk)) {
            normalize_qk(qh, kh);
        }
        // The recurrence, one task per (span, value head).
        let rule = self.rule;
        let rl = self.recurrent_len();
        let mut starts = Vec::with_capacity(spans.len());
        let mut r0 = 0;
        for s in spans {
            starts.push(r0);
            r0 += s.n;
        }
        let mut states: Vec<Vec<f32>> = kvs
            .iter_mut()
            .map(|kv| {
                kv.recurrent_history.clear();
                if kv.recurrent.is_empty() {
                    vec![0f32; rl]
                } else {
                    std::mem::take(&mut kv.recurrent)
                }
            })
            .collect();
        let mut core = vec![0f32; n * vd];
        {
            let tasks: Vec<(usize, usize, &mut [f32])> = states
                .iter_mut()
                .enumerate()
                .flat_map(|(si, st)| {
                    st.chunks_exact_mut(dk * dv)
                        .enumerate()
                        .map(move |(h, s)| (si, h, s))
                })
                .collect();
            #[allow(clippy::type_complexity)]
            let outs: Vec<(usize, usize, Vec<f32>, Vec<Vec<f32>>)> = tasks
                .into_par_iter()
                .map(|(si, h, state)| {
                    let s = spans[si];
                    let kh = if self.tiled_value_heads {
                        h % hk
                    } else {
                        h / r
                    };
                    let r0 = starts[si];
                    let gather_k = |src: &[f32], t0: usize, t1: usize| -> Vec<f32> {
                        (t0..t1)
                            .flat_map(|t| {
                                src[(r0 + t) * kd + kh * dk..(r0 + t) * kd + (kh + 1) * dk]
                                    .iter()
                                    .copied()
                            })
                            .collect()
                    };
                    let mut o = vec![0f32; s.n * dv];
                    let mut sc = ChunkScratch::default();
                    // Verification rows keep the head's state before each row (rollback).
                    let keep_history = s.as_decode && s.n > 1;
                    let mut history = Vec::new();
                    let mut t = 0;
                    while t < s.n {
                        if keep_history {
                            history.push(state.to_vec());
                        }
                        let p = s.pos0 + t;
                        let whole = !s.as_decode && p.is_multiple_of(CHUNK) && t + CHUNK <= s.n;
                        if whole {
                            let (t0, t1) = (t, t + CHUNK);
                            let qs = gather_k(&qn, t0, t1);
                            let ks = gather_k(&knorm, t0, t1);
                            let vs: Vec<f32> = (t0..t1)
                                .flat_map(|u| {
                                    let at = (r0 + u) * c + 2 * kd + h * dv;
                                    conv[at..at + dv].iter().copied()
                                })
                                .collect();
                            let gs: Vec<f32> = (t0..t1)
                                .flat_map(|u| {
                                    let at = ((r0 + u) * hv + h) * gw;
                                    g[at..at + gw].iter().copied()
                                })
                                .collect();
                            let bs: Vec<f32> = (t0..t1).map(|u| beta[(r0 + u) * hv + h]).collect();
                            let o = &mut o[t0 * dv..t1 * dv];
                            match rule {
                                DeltaRule::GatedDeltaNet => {
                                    gated_delta::chunk(state, &qs, &ks, &vs, &gs, &bs, o, &mut sc)
                                }
                                DeltaRule::Kda => {
                                    kda::chunk(state, &qs, &ks, &vs, &gs, &bs, o, &mut sc)
                                }
                            }
                            t = t1;
                        } else {
                            let row = r0 + t;
                            let at = row * c + 2 * kd + h * dv;
                            let (q, k, v, o) = (
                                &qn[row * kd + kh * dk..row * kd + (kh + 1) * dk],
                                &knorm[row * kd + kh * dk..row * kd + (kh + 1) * dk],
                                &conv[at..at + dv],
                                &mut o[t * dv..(t + 1) * dv],
                            );
                            let (gi, bi) = ((row * hv + h) * gw, beta[row * hv + h]);
                            match rule {
                                DeltaRule::GatedDeltaNet => {
                                    gated_delta::step(state, q, k, v, g[gi], bi, o)
                                }
                                DeltaRule::Kda => kda::step(state, q, k, v, &g[gi..gi + gw], bi, o),
                            }
                            t += 1;
                        }
                    }
                    (si, h, o, history)
                })
                .collect();
            for (si, h, o, history) in outs {
                let r0 = starts[si];
                for (t, ot) in o.chunks_exact(dv).enumerate() {
                    core[(r0 + t) * vd + h * dv..(r0 + t) * vd + (h + 1) * dv].copy_from_slice(ot);
                }
                let kv = &mut kvs[si];
                for (t, st) in history.into_iter().enumerate() {
                    if h == 0 {
                        kv.recurrent_history
                            .push((spans[si].pos0 + t, vec![0f32; rl]));
                    }
                    kv.recurrent_history[t].1[h * dk * dv..(h + 1) * dk * dv].copy_from_slice(&st);
                }
            }
        }
        for ((kv, st), s) in kvs.iter_mut().zip(states).zip(spans) {
            kv.recurrent = st;
            // Exact from here only (or from the pass's start, verification rows): said at
            // once, so a pass that fails in a later layer rolls this one back too.
            kv.min_len = if kv.recurrent_history.is_empty() {
                s.pos0 + s.n
            } else {
                s.pos0
            };
        }
        // The gated RMSNorm per value head, then out_proj.
        match self.rule {
            DeltaRule::GatedDeltaNet => self.gated_norm(&mut core, &z, |z| z * sigmoid(z)),
            DeltaRule::Kda => self.gated_norm(&mut core, &z, sigmoid),
        }
        self.out.forward(&core, n, out);
    }

    /// `o = rms_norm(o) * w * act(z)` per value head (`o`, `z`: `[N, Hv dv]`); generic over
    /// the activation so that each rule's loop has it inlined.
    fn gated_norm(&self, core: &mut [f32], z: &[f32], act: impl Fn(f32) -> f32) {
        let dv = self.value_dim;
        let mut normed = vec![0f32; dv];
        for (orow, zrow) in core.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            coli_kernels::rms_norm(orow, &self.norm.weight, self.norm.eps, &mut normed);
            for ((o, &y), &zz) in orow.iter_mut().zip(&normed).zip(zrow) {
                *o = y * act(zz);
            }
        }
    }

    /// Before span `s` runs: keeps the state at its start as a checkpoint when the start ends
    /// a prefill chunk or a pass of several rows (`s` is a prefill span), or is a multiple of
    /// [`CHECKPOINT_EVERY`]; at most [`MAX_CHECKPOINTS`] are kept (the oldest dropped).
    fn checkpoint(&self, s: &Span, kv: &mut LayerKv) {
        let p = s.pos0;
        if p == 0 || kv.recurrent.is_empty() {
            return;
        }
        debug_assert_eq!(
            kv.recurrent_held(),
            p,
            "the state is the one at the span's start"
        );
        if !((s.n > 1 && !s.as_decode) || p.is_multiple_of(CHECKPOINT_EVERY)) {
            return;
        }
        if kv.checkpoints.last().is_some_and(|c| c.len >= p) {
            return;
        }
        let c = self.conv_dim();
        let from = p.saturating_sub(self.kernel - 1).max(kv.conv_first);
        kv.checkpoints.push(RecurrentCheckpoint {
            len: p,
            recurrent: kv.recurrent.clone(),
            conv: kv.conv[(from - kv.conv_first) * c..(p - kv.conv_first) * c].to_vec(),
            conv_from: from,
        });
        if kv.checkpoints.len() > MAX_CHECKPOINTS {
            kv.checkpoints.remove(0);
        }
    }

    /// After a pass: drops the convolution inputs no later position reads (keeping Inkling's
    /// slack) and marks each state exact at its new length only, or, after verification
    /// rows, from the pass's start on (the states `recurrent_history` keeps).
    pub fn trim_spans(&self, spans: &[Span], kvs: &mut [&mut LayerKv]) {
        for (s, kv) in spans.iter().zip(kvs.iter_mut()) {
            let end = s.pos0 + s.n;
            trim(kv, end, 0, None, self.kernel);
            let from = if kv.recurrent_history.is_empty() {
                end
            } else {
                s.pos0
            };
            kv.min_len = kv.min_len.max(from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::softplus;

    #[test]
    fn softplus_follows_torch_threshold() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((softplus(-30.0) - (-30f32).exp()).abs() < 1e-20);
    }
}
