//! Kimi Delta Attention (KDA): the gated delta rule with one decay per key channel instead of
//! one per head (Kimi-Linear, GLM-5.3-Flash, Kimi K3). Two forms of the same function, as
//! transformers 5.25 (`models/kimi_linear/modeling_kimi_linear.py`) computes them:
//!
//! - [`step`], the recurrent form (`recurrent_kimi_delta_attention`), one token: with the
//!   head's state `S` (`[dk, dv]`), a query `q` and key `k` (`[dk]`, L2-normalized, the query
//!   scaled by `dk^-0.5`: [`normalize_qk`]), a value `v` (`[dv]`), a log decay per key channel
//!   `g` (`[dk]`, each `<= 0`) and a write strength `beta` in `(0, 1)`:
//!   `S = diag(exp(g)) S; S += k ⊗ beta (v - Sᵀk); o = Sᵀq` (row `i` of `S` decays by
//!   `exp(g_i)`).
//! - [`chunk`], the chunkwise-parallel form (`chunk_kimi_delta_attention`), up to [`CHUNK`]
//!   tokens: with `c_r` the running sum of `g` inside the chunk (a `[dk]` vector per token) and
//!   `D_rs = exp(c_r - c_s)` (per channel, s <= r), `A[r][s] = Σ_i beta_r k_r[i] k_s[i] D_rs[i]`
//!   (s < r), the unit lower-triangular system `(I + A) [U | W] = [beta v | beta k ⊙ exp(c)]`
//!   solved by forward substitution, then `v'_r = U_r - W_r S`,
//!   `o_r = (q_r ⊙ exp(c_r)) S + Σ_{s<=r} (Σ_i q_r[i] k_s[i] D_rs[i]) v'_s`, and
//!   `S = diag(exp(c_last)) S + Σ_r (k_r ⊙ exp(c_last - c_r)) ⊗ v'_r`. A chunk shorter than
//!   [`CHUNK`] is what transformers computes on its zero-padded chunk.
//!
//! Both give the state and outputs of the same recurrence; they differ in f32 rounding
//! (`kernels/tests/kda.rs` checks both against transformers' functions in float64).
//!
//! ## Numerics (rule `kda-r1`)
//! As the gated delta rule's `gdr-r1` ([`crate::gated_delta`]): every sum of products is
//! [`crate::dot`] or a sequence of [`crate::axpy`] updates in increasing index order, `exp` is
//! Rust's `f32::exp`, the running sum adds the chunk's `g` in order. The channel-decayed
//! products of two tokens in one sub-block of [`SUB`] tokens are formed as `(x[i] * D[i])`
//! rounded, then dotted with the other vector (`dot(x ⊙ D, y)`); for tokens `s < r` in
//! different sub-blocks the decay is factored at the start `b` of `r`'s sub-block,
//! `dot(x_r ⊙ exp(c_r - c_b), y_s ⊙ exp(c_b - c_s))` (each factor at most 1, so nothing
//! overflows; one exponential per token and sub-block instead of one per pair); queries and keys are normalized by division, `x / sqrt(Σx² + 1e-6)`, as
//! transformers' KDA `l2norm` does (not the reciprocal square root of the Qwen3-Next rule).

use crate::gated_delta::substitute;
use crate::{axpy, dot, exp_flush};

/// The id of this rounding rule (module doc, "Numerics"): part of the KV cache identity.
pub const RULE_ID: &str = "kda-r1";

/// Tokens per call of [`chunk`] (transformers' and fla's default `chunk_size`).
pub const CHUNK: usize = 64;

/// Epsilon of the L2 normalization of queries and keys (transformers' KDA `l2norm`).
pub const L2_EPS: f32 = 1e-6;

/// Normalizes one head's query and key as `use_qk_l2norm_in_kernel` does in transformers' KDA
/// functions: `x / sqrt(Σ x² + 1e-6)` (the sum by [`crate::dot`]), then multiplies the query
/// by `q.len()^-0.5`.
///
/// # Panics
/// If `q` and `k` differ in length.
pub fn normalize_qk(q: &mut [f32], k: &mut [f32]) {
    assert_eq!(q.len(), k.len(), "normalize_qk: q and k lengths differ");
    let scale = 1.0 / (q.len() as f32).sqrt();
    for (x, s) in [(q, scale), (k, 1.0)] {
        let norm = (dot(x, x) + L2_EPS).sqrt();
        for v in x.iter_mut() {
            *v /= norm;
            if s != 1.0 {
                *v *= s;
            }
        }
    }
}

/// The recurrent form, one token (see the module doc): updates `state` (`[dk, dv]` f32,
/// row-major) and writes the head's output `o` (`[dv]`). `q` is normalized and scaled, `k`
/// normalized ([`normalize_qk`]); `g` (`[dk]`) the per-channel log decay, `beta` the write
/// strength.
///
/// # Panics
/// If the lengths do not match `dk = q.len()`, `dv = v.len()`, `state.len() == dk * dv`.
pub fn step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: f32,
    o: &mut [f32],
) {
    let (dk, dv) = (q.len(), v.len());
    assert!(
        k.len() == dk && g.len() == dk && o.len() == dv && state.len() == dk * dv,
        "kda::step: shape mismatch"
    );
    for (row, &gi) in state.chunks_exact_mut(dv).zip(g) {
        let decay = exp_flush(gi);
        for s in row.iter_mut() {
            *s *= decay;
        }
    }
    crate::gated_delta::write_and_read(state, q, k, v, beta, o);
}

/// Work space of [`chunk`]: the gated delta rule's.
pub use crate::gated_delta::ChunkScratch;

/// `dot(x ⊙ exp(cr - cs), y)` into `tmp` (`[dk]`), the channel-decayed product of the module
/// doc.
fn decayed_dot(x: &[f32], y: &[f32], cr: &[f32], cs: &[f32], tmp: &mut [f32]) -> f32 {
    for (((t, &a), &r), &s) in tmp.iter_mut().zip(x).zip(cr).zip(cs) {
        *t = a * exp_flush(r - s);
    }
    dot(tmp, y)
}

/// Tokens per sub-block of a chunk: a pair of tokens in different sub-blocks factors its decay
/// at the later one's sub-block start (module doc, "Numerics").
pub const SUB: usize = 16;

/// `m[r * n + s] = Σ_i x_r[i] y_s[i] exp(c_r[i] - c_s[i])` for `s < r` (`strict`) or
/// `s <= r`, over `n` tokens of `dk` channels (`x`, `y`, `c`: `[n, dk]`; other entries of `m`
/// untouched). Inside a sub-block of [`SUB`] tokens the decay is formed per pair
/// (`dot(x_r ⊙ exp(c_r - c_s), y_s)`); across sub-blocks it is factored at the start `b` of
/// `r`'s sub-block, `dot(x_r ⊙ exp(c_r - c_b), y_s ⊙ exp(c_b - c_s))`, both factors at most 1
/// (`c` falls with the position), so `n dk` exponentials per sub-block replace one per pair.
#[allow(clippy::too_many_arguments)]
fn decayed_products(
    x: &[f32],
    y: &[f32],
    c: &[f32],
    n: usize,
    dk: usize,
    strict: bool,
    m: &mut [f32],
    scaled: &mut Vec<f32>,
    tmp: &mut [f32],
) {
    for b in (0..n).step_by(SUB) {
        let cb = &c[b * dk..(b + 1) * dk];
        // y_s ⊙ exp(c_b - c_s) for every s before the sub-block.
        scaled.clear();
        for t in 0..b {
            let (yt, ct) = (&y[t * dk..(t + 1) * dk], &c[t * dk..(t + 1) * dk]);
            for ((&yv, &cv), &cbv) in yt.iter().zip(ct).zip(cb) {
                scaled.push(yv * exp_flush(cbv - cv));
            }
        }
        for r in b..(b + SUB).min(n) {
            let (xr, cr) = (&x[r * dk..(r + 1) * dk], &c[r * dk..(r + 1) * dk]);
            for ((t, &xv), (&cv, &cbv)) in tmp.iter_mut().zip(xr).zip(cr.iter().zip(cb)) {
                *t = xv * exp_flush(cv - cbv);
            }
            for t in 0..b {
                m[r * n + t] = dot(tmp, &scaled[t * dk..(t + 1) * dk]);
            }
            let end = if strict { r } else { r + 1 };
            for t in b..end {
                let (yt, ct) = (&y[t * dk..(t + 1) * dk], &c[t * dk..(t + 1) * dk]);
                m[r * n + t] = decayed_dot(xr, yt, cr, ct, tmp);
            }
        }
    }
}

crate::avx2_twin! {
    /// The chunkwise form over `n = beta.len() <= CHUNK` tokens (see the module doc): `q`, `k`
    /// (`[n, dk]`, normalized as for [`step`]), `v` (`[n, dv]`), `g` (`[n, dk]`) and `beta`
    /// (`[n]`); updates `state` (`[dk, dv]`) to the state after the last token and writes `o`
    /// (`[n, dv]`).
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
    let n = beta.len();
    assert!(n > 0 && n <= CHUNK, "kda::chunk: {n} tokens (1..={CHUNK})");
    let dk = q.len() / n;
    let dv = v.len() / n;
    assert!(
        q.len() == n * dk
            && k.len() == n * dk
            && g.len() == n * dk
            && v.len() == n * dv
            && o.len() == n * dv
            && state.len() == dk * dv,
        "kda::chunk: shape mismatch"
    );
    let sc = scratch;
    // c_r = g_0 + ... + g_r per channel, in token order.
    sc.c.clear();
    sc.c.extend_from_slice(&g[..dk]);
    for r in 1..n {
        for i in 0..dk {
            let x = sc.c[(r - 1) * dk + i] + g[r * dk + i];
            sc.c.push(x);
        }
    }
    // The running sums leave the scratch for the call (the helpers below borrow it).
    let cbuf = std::mem::take(&mut sc.c);
    let c = &cbuf;
    let cr = |r: usize| &c[r * dk..(r + 1) * dk];
    let last = cr(n - 1);
    sc.row.resize(dk.max(dv), 0.0);
    sc.t.resize(dk.max(dv), 0.0);
    // A[r][s] = Σ_i (beta_r k_r[i]) k_s[i] exp(c_r[i] - c_s[i]), s < r.
    sc.x.clear();
    for r in 0..n {
        sc.x.extend(k[r * dk..(r + 1) * dk].iter().map(|&y| y * beta[r]));
    }
    sc.a.clear();
    sc.a.resize(n * n, 0.0);
    decayed_products(
        &sc.x,
        k,
        c,
        n,
        dk,
        true,
        &mut sc.a,
        &mut sc.scaled,
        &mut sc.t[..dk],
    );
    // Forward substitution: U_r = beta_r v_r - Σ_{s<r} A[r][s] U_s,
    // W_r = (beta_r k_r) ⊙ exp(c_r) - Σ_{s<r} A[r][s] W_s; then v'_r = U_r - W_r S.
    substitute(sc, state, v, beta, (n, dk, dv), |r, wr| {
        for ((x, &y), &ci) in wr.iter_mut().zip(&k[r * dk..(r + 1) * dk]).zip(cr(r)) {
            *x = (y * beta[r]) * exp_flush(ci);
        }
    });
    // P[r][s] = Σ_i q_r[i] k_s[i] exp(c_r[i] - c_s[i]), s <= r.
    sc.p.clear();
    sc.p.resize(n * n, 0.0);
    decayed_products(
        q,
        k,
        c,
        n,
        dk,
        false,
        &mut sc.p,
        &mut sc.scaled,
        &mut sc.t[..dk],
    );
    let mut intra = vec![0f32; dv];
    for r in 0..n {
        // inter = (q_r ⊙ exp(c_r)) S
        let qr = &q[r * dk..(r + 1) * dk];
        let out = &mut o[r * dv..(r + 1) * dv];
        out.fill(0.0);
        for (i, srow) in state.chunks_exact(dv).enumerate() {
            axpy(qr[i] * exp_flush(cr(r)[i]), srow, out);
        }
        // intra = Σ_{s<=r} (Σ_i q_r[i] k_s[i] exp(c_r[i] - c_s[i])) v'_s
        intra.fill(0.0);
        for s in 0..=r {
            axpy(sc.p[r * n + s], &sc.vnew[s * dv..(s + 1) * dv], &mut intra);
        }
        for (x, &y) in out.iter_mut().zip(&intra) {
            *x += y;
        }
    }
    // S = diag(exp(c_last)) S + Σ_r (k_r ⊙ exp(c_last - c_r)) ⊗ v'_r, the sum formed first.
    sc.a.clear();
    sc.a.resize(dk * dv, 0.0);
    for r in 0..n {
        let kd = &mut sc.row[..dk];
        for (((x, &y), &l), &ci) in kd
            .iter_mut()
            .zip(&k[r * dk..(r + 1) * dk])
            .zip(last)
            .zip(cr(r))
        {
            *x = y * exp_flush(l - ci);
        }
        let vr = &sc.vnew[r * dv..(r + 1) * dv];
        for (i, trow) in sc.a.chunks_exact_mut(dv).enumerate() {
            axpy(kd[i], vr, trow);
        }
    }
    for ((srow, trow), &l) in state
        .chunks_exact_mut(dv)
        .zip(sc.a.chunks_exact(dv))
        .zip(last)
    {
        let decay = exp_flush(l);
        for (s, &t) in srow.iter_mut().zip(trow) {
            *s = *s * decay + t;
        }
    }
    sc.c = cbuf;
}
