//! The gated delta rule: the recurrence of a Gated DeltaNet linear-attention head (Yang, Kautz,
//! Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule"), as Qwen3-Next
//! and Qwen3.5/3.6-MoE use it. Two forms of the same function, as transformers 5.25
//! (`models/qwen3_next/modeling_qwen3_next.py`) computes them:
//!
//! - [`step`], the recurrent form (`torch_recurrent_gated_delta_rule`), one token: with the
//!   head's state `S` (`[dk, dv]`), a query `q` and key `k` (`[dk]`, already L2-normalized, the
//!   query scaled by `dk^-0.5`: [`normalize_qk`]), a value `v` (`[dv]`), a log decay `g <= 0`
//!   and a write strength `beta` in `(0, 1)`:
//!   `S = exp(g) S; S += k ⊗ beta (v - Sᵀk); o = Sᵀq`.
//! - [`chunk`], the chunkwise-parallel form (`torch_chunk_gated_delta_rule`, the form of the
//!   fla kernels), up to [`CHUNK`] tokens at once: with `c_r` the running sum of `g` inside the
//!   chunk, `A[r][s] = beta_r (k_r·k_s) exp(c_r - c_s)` (s < r), the unit lower-triangular
//!   system `(I + A) [U | W] = [beta v | beta k exp(c)]` solved by forward substitution, then
//!   `v'_r = U_r - W_r S`, `o_r = exp(c_r) q_r S + Σ_{s<=r} (q_r·k_s) exp(c_r - c_s) v'_s`, and
//!   `S = exp(c_last) S + Σ_r exp(c_last - c_r) k_r ⊗ v'_r`. A chunk shorter than [`CHUNK`] is
//!   what transformers computes on its zero-padded chunk (padding rows contribute nothing).
//!
//! Both give the state and outputs of the same recurrence; they differ in f32 rounding (about
//! 1e-6 relative on the fixtures' heads, `kernels/tests/gated_delta.rs`).
//!
//! ## Numerics (rule `gdr-r1`)
//! Every sum of products is [`crate::dot`] (eight interleaved running sums combined pairwise)
//! or a sequence of [`crate::axpy`] updates in increasing index order (product rounded, then
//! added; no fused multiply-add), `exp` is Rust's `f32::exp`, and the running sum `c` adds the
//! chunk's `g` in order. No step depends on the instruction set, the thread count or what else
//! runs in the pass: a head's outputs and state are a function of its inputs and of how its
//! tokens were grouped into calls (a token run through [`step`] and the same token inside a
//! [`chunk`] round differently; the engine fixes the grouping by position, not by pass).

use crate::{axpy, dot, exp_flush};

/// The id of this rounding rule (module doc, "Numerics"): part of the KV cache identity, so a
/// saved recurrent state is reused only by kernels that compute it the same way.
pub const RULE_ID: &str = "gdr-r1";

/// Tokens per call of [`chunk`] (transformers' and fla's default `chunk_size`).
pub const CHUNK: usize = 64;

/// Epsilon of the L2 normalization of queries and keys (`l2norm(x, eps=1e-6)`, the fla
/// library's and transformers' `use_qk_l2norm_in_kernel`).
pub const L2_EPS: f32 = 1e-6;

/// Normalizes one head's query and key as `use_qk_l2norm_in_kernel` does:
/// `x * rsqrt(Σ x² + 1e-6)` (the sum by [`crate::dot`]), then multiplies the query by
/// `q.len()^-0.5` (transformers' chunk form: `query * scaling`).
///
/// # Panics
/// If `q` and `k` differ in length.
pub fn normalize_qk(q: &mut [f32], k: &mut [f32]) {
    assert_eq!(q.len(), k.len(), "normalize_qk: q and k lengths differ");
    let scale = (q.len() as f32).powf(-0.5);
    for (x, s) in [(q, scale), (k, 1.0)] {
        let inv = 1.0 / (dot(x, x) + L2_EPS).sqrt();
        for v in x.iter_mut() {
            *v *= inv;
            if s != 1.0 {
                *v *= s;
            }
        }
    }
}

/// The recurrent form, one token (see the module doc): updates `state` (`[dk, dv]` f32,
/// row-major, transformers' `[k_head_dim, v_head_dim]`) and writes the head's output `o`
/// (`[dv]`). `q` is normalized and scaled, `k` normalized ([`normalize_qk`]); `g` is the log
/// decay (`-exp(A_log) softplus(a + dt_bias)`), `beta` the write strength (`sigmoid(b)`).
///
/// # Panics
/// If the lengths do not match `dk = q.len()`, `dv = v.len()`, `state.len() == dk * dv`.
pub fn step(state: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, o: &mut [f32]) {
    let (dk, dv) = (q.len(), v.len());
    assert!(
        k.len() == dk && o.len() == dv && state.len() == dk * dv,
        "step: shape mismatch"
    );
    let decay = exp_flush(g);
    for s in state.iter_mut() {
        *s *= decay;
    }
    write_and_read(state, q, k, v, beta, o);
}

/// The delta rule's write and read after the decay, shared by both rules' recurrent steps
/// (this one and [`crate::kda::step`]): `S += k ⊗ beta (v - Sᵀk); o = Sᵀq`, every product
/// sum an [`crate::axpy`] sequence in key-index order. `state` is `[dk, dv]`, `o` `[dv]`.
#[inline]
pub(crate) fn write_and_read(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    let dv = v.len();
    // kv_mem = Sᵀk, in key-index order.
    o.fill(0.0);
    for (i, row) in state.chunks_exact(dv).enumerate() {
        axpy(k[i], row, o);
    }
    // delta = (v - kv_mem) beta, kept in `o` until the state is written.
    for (d, &x) in o.iter_mut().zip(v) {
        *d = (x - *d) * beta;
    }
    for (i, row) in state.chunks_exact_mut(dv).enumerate() {
        axpy(k[i], o, row);
    }
    o.fill(0.0);
    for (i, row) in state.chunks_exact(dv).enumerate() {
        axpy(q[i], row, o);
    }
}

/// Work space of [`chunk`] (and of [`crate::kda::chunk`]), reused between calls (allocated on
/// first use, for the largest head shape seen).
#[derive(Default)]
pub struct ChunkScratch {
    pub(crate) a: Vec<f32>,
    pub(crate) u: Vec<f32>,
    pub(crate) w: Vec<f32>,
    pub(crate) vnew: Vec<f32>,
    pub(crate) c: Vec<f32>,
    pub(crate) t: Vec<f32>,
    pub(crate) row: Vec<f32>,
    /// [`crate::kda::chunk`] only: scaled keys, factored decays, the intra-chunk products.
    pub(crate) x: Vec<f32>,
    pub(crate) scaled: Vec<f32>,
    pub(crate) p: Vec<f32>,
}

/// What both chunk forms (this rule's [`chunk`] and [`crate::kda::chunk`]) do after forming
/// `A` (`sc.a`, `[n, n]`, entries `s < r`): the forward substitution of the unit
/// lower-triangular system, `U_r = beta_r v_r - Σ_{s<r} A[r][s] U_s` (into `sc.u`) and
/// `W_r = w0_r - Σ_{s<r} A[r][s] W_s` (into `sc.w`, `init_w(r, W_r)` writing `w0_r`, `[dk]`),
/// row by row, each sum an [`crate::axpy`] sequence in increasing `s`; then
/// `v'_r = U_r - W_r S` (into `sc.vnew`). `dims` is `(n, dk, dv)`.
#[inline(always)]
pub(crate) fn substitute(
    sc: &mut ChunkScratch,
    state: &[f32],
    v: &[f32],
    beta: &[f32],
    (n, dk, dv): (usize, usize, usize),
    init_w: impl Fn(usize, &mut [f32]),
) {
    sc.u.clear();
    sc.u.resize(n * dv, 0.0);
    sc.w.clear();
    sc.w.resize(n * dk, 0.0);
    for r in 0..n {
        let (done, rest) = sc.u.split_at_mut(r * dv);
        let ur = &mut rest[..dv];
        for (x, &y) in ur.iter_mut().zip(&v[r * dv..(r + 1) * dv]) {
            *x = y * beta[r];
        }
        let (wdone, wrest) = sc.w.split_at_mut(r * dk);
        let wr = &mut wrest[..dk];
        init_w(r, wr);
        for s in 0..r {
            let a = -sc.a[r * n + s];
            axpy(a, &done[s * dv..(s + 1) * dv], ur);
            axpy(a, &wdone[s * dk..(s + 1) * dk], wr);
        }
    }
    sc.vnew.clear();
    sc.vnew.resize(n * dv, 0.0);
    sc.row.resize(dk.max(dv), 0.0);
    for r in 0..n {
        let ws = &mut sc.row[..dv];
        ws.fill(0.0);
        for (i, srow) in state.chunks_exact(dv).enumerate() {
            axpy(sc.w[r * dk + i], srow, ws);
        }
        for ((x, &u), &y) in sc.vnew[r * dv..(r + 1) * dv]
            .iter_mut()
            .zip(&sc.u[r * dv..(r + 1) * dv])
            .zip(ws.iter())
        {
            *x = u - y;
        }
    }
}

crate::avx2_twin! {
    /// The chunkwise form over `n = g.len() <= CHUNK` tokens (see the module doc): `q`, `k`
    /// (`[n, dk]`, normalized as for [`step`]), `v` (`[n, dv]`), `g` and `beta` (`[n]`); updates
    /// `state` (`[dk, dv]`) to the state after the last token and writes `o` (`[n, dv]`).
    ///
    /// # Panics
    /// If `n` is 0 or above [`CHUNK`], or a length does not match `n`, `dk`, `dv`.
    pub fn chunk(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        o: &mut [f32],
        scratch: &mut ChunkScratch,
    ) => chunk_body, chunk_avx2;
}

/// The body of [`chunk`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_body(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    o: &mut [f32],
    scratch: &mut ChunkScratch,
) {
    let n = g.len();
    assert!(n > 0 && n <= CHUNK, "chunk: {n} tokens (1..={CHUNK})");
    let dk = q.len() / n;
    let dv = v.len() / n;
    assert!(
        q.len() == n * dk
            && k.len() == n * dk
            && v.len() == n * dv
            && beta.len() == n
            && o.len() == n * dv
            && state.len() == dk * dv,
        "chunk: shape mismatch"
    );
    let sc = scratch;
    sc.c.clear();
    let mut acc = 0f32;
    for &x in g {
        acc += x;
        sc.c.push(acc);
    }
    // The running sums leave the scratch for the call (the helpers below borrow it).
    let cbuf = std::mem::take(&mut sc.c);
    let c = &cbuf;
    let last = c[n - 1];
    // A[r][s] = beta_r (k_r·k_s) exp(c_r - c_s), s < r (transformers: (k_beta @ kᵀ) * decay;
    // k_beta = k * beta rounds before the dot product).
    sc.row.resize(dk.max(dv), 0.0);
    sc.a.clear();
    sc.a.resize(n * n, 0.0);
    for r in 1..n {
        let kb = &mut sc.row[..dk];
        for (x, &y) in kb.iter_mut().zip(&k[r * dk..(r + 1) * dk]) {
            *x = y * beta[r];
        }
        for s in 0..r {
            sc.a[r * n + s] = dot(kb, &k[s * dk..(s + 1) * dk]) * exp_flush(c[r] - c[s]);
        }
    }
    // Forward substitution of the unit lower-triangular system: U_r = beta_r v_r - Σ_{s<r}
    // A[r][s] U_s, W_r = beta_r exp(c_r) k_r - Σ_{s<r} A[r][s] W_s; then v'_r = U_r - W_r S.
    substitute(sc, state, v, beta, (n, dk, dv), |r, wr| {
        let e = exp_flush(c[r]);
        for (x, &y) in wr.iter_mut().zip(&k[r * dk..(r + 1) * dk]) {
            *x = (y * beta[r]) * e;
        }
    });
    sc.t.clear();
    sc.t.resize(dv, 0.0);
    for r in 0..n {
        // inter = (q_r exp(c_r)) S
        let e = exp_flush(c[r]);
        let qr = &q[r * dk..(r + 1) * dk];
        let out = &mut o[r * dv..(r + 1) * dv];
        out.fill(0.0);
        for (i, srow) in state.chunks_exact(dv).enumerate() {
            axpy(qr[i] * e, srow, out);
        }
        // intra = Σ_{s<=r} (q_r·k_s) exp(c_r - c_s) v'_s
        let intra = &mut sc.t[..dv];
        intra.fill(0.0);
        for s in 0..=r {
            let p = dot(qr, &k[s * dk..(s + 1) * dk]) * exp_flush(c[r] - c[s]);
            axpy(p, &sc.vnew[s * dv..(s + 1) * dv], intra);
        }
        for (x, &y) in out.iter_mut().zip(intra.iter()) {
            *x += y;
        }
    }
    // S = exp(c_last) S + Σ_r (exp(c_last - c_r) k_r) ⊗ v'_r, the sum over r formed first.
    let kd = &mut sc.row[..dk];
    sc.a.clear();
    sc.a.resize(dk * dv, 0.0);
    for r in 0..n {
        let e = exp_flush(last - c[r]);
        for (x, &y) in kd.iter_mut().zip(&k[r * dk..(r + 1) * dk]) {
            *x = y * e;
        }
        let vr = &sc.vnew[r * dv..(r + 1) * dv];
        for (i, trow) in sc.a.chunks_exact_mut(dv).enumerate() {
            axpy(kd[i], vr, trow);
        }
    }
    let decay = exp_flush(last);
    for (s, &t) in state.iter_mut().zip(&sc.a) {
        *s = *s * decay + t;
    }
    sc.c = cbuf;
}
