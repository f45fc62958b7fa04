//! The gated delta rule ([`coli_kernels::gated_delta`]) against transformers 5.25's own
//! `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`, computed in float64 by
//! `tests/fixtures/make_gated_delta_expected.py` (`tests/fixtures/gated_delta/`): both forms, a
//! prefill split into aligned chunks and a tail run token by token, grouped-value heads, a
//! random initial state, strong decays, the key dimension of the released models.

mod common;

use coli_kernels::gated_delta::{chunk, normalize_qk, step, ChunkScratch, CHUNK};
use common::{check_split_rounding, check_splits, max_diff, oracles, Oracle};

struct Case {
    name: String,
    n: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    oracle: Oracle,
}

impl Case {
    fn array(&self, key: &str) -> &[f32] {
        self.oracle.array(key)
    }

    /// Head `h`'s inputs, its query and key normalized: `(q, k, v, g, beta, state)`.
    #[allow(clippy::type_complexity)]
    fn head(&self, h: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let (n, hk, hv, dk, dv) = (self.n, self.hk, self.hv, self.dk, self.dv);
        let kh = h / (hv / hk);
        let (qa, ka, va) = (self.array("query"), self.array("key"), self.array("value"));
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for t in 0..n {
            let mut qt = qa[(t * hk + kh) * dk..][..dk].to_vec();
            let mut kt = ka[(t * hk + kh) * dk..][..dk].to_vec();
            normalize_qk(&mut qt, &mut kt);
            q.extend(qt);
            k.extend(kt);
            v.extend_from_slice(&va[(t * hv + h) * dv..][..dv]);
        }
        let g = (0..n).map(|t| self.array("g")[t * hv + h]).collect();
        let beta = (0..n).map(|t| self.array("beta")[t * hv + h]).collect();
        let s0 = self.array("initial_state")[h * dk * dv..][..dk * dv].to_vec();
        (q, k, v, g, beta, s0)
    }

    /// Runs every head with tokens `0..split` in chunks of [`CHUNK`] (the last one partial)
    /// and the rest token by token: `(outputs [n, hv, dv], final states [hv, dk, dv])`.
    fn run(&self, split: usize) -> (Vec<f32>, Vec<f32>) {
        let (n, hv, dk, dv) = (self.n, self.hv, self.dk, self.dv);
        let mut out = vec![0f32; n * hv * dv];
        let mut states = Vec::new();
        let mut sc = ChunkScratch::default();
        for h in 0..hv {
            let (q, k, v, g, beta, mut s) = self.head(h);
            let mut o = vec![0f32; n * dv];
            let mut t = 0;
            while t < split {
                let e = (t + CHUNK).min(split);
                chunk(
                    &mut s,
                    &q[t * dk..e * dk],
                    &k[t * dk..e * dk],
                    &v[t * dv..e * dv],
                    &g[t..e],
                    &beta[t..e],
                    &mut o[t * dv..e * dv],
                    &mut sc,
                );
                t = e;
            }
            for t in split..n {
                step(
                    &mut s,
                    &q[t * dk..(t + 1) * dk],
                    &k[t * dk..(t + 1) * dk],
                    &v[t * dv..(t + 1) * dv],
                    g[t],
                    beta[t],
                    &mut o[t * dv..(t + 1) * dv],
                );
            }
            for t in 0..n {
                out[(t * hv + h) * dv..][..dv].copy_from_slice(&o[t * dv..][..dv]);
            }
            states.extend(s);
        }
        (out, states)
    }
}

fn cases() -> Vec<Case> {
    oracles("gated_delta")
        .into_iter()
        .map(|o| Case {
            name: o.name().to_string(),
            n: o.dim("n"),
            hk: o.dim("hk"),
            hv: o.dim("hv"),
            dk: o.dim("dk"),
            dv: o.dim("dv"),
            oracle: o,
        })
        .collect()
}

/// Largest difference allowed from the float64 oracle: f32 rounding of sums of at most a few
/// hundred O(1) terms (transformers' own float32 runs differ from float64 by up to 3e-7 here;
/// this kernel by up to 2.7e-7).
const TOL: f32 = 2e-6;

#[test]
fn both_forms_and_mixed_splits_match_transformers_float64() {
    for c in cases() {
        let oracle = |form: &str| {
            (
                c.array(&format!("{form}_out_f64")),
                c.array(&format!("{form}_state_f64")),
                c.array(&format!("{form}_out_f32")),
            )
        };
        check_splits(&c.name, c.n, CHUNK, TOL, &|s| c.run(s), &oracle);
    }
}

#[test]
fn a_chunk_split_changes_rounding_only() {
    // The same tokens grouped differently give the same function (`check_split_rounding`).
    for c in cases() {
        check_split_rounding(&c.name, c.n, TOL, &|s| c.run(s));
    }
}

#[test]
fn a_zero_write_strength_only_decays_the_state() {
    // beta = 0: nothing is written, the state decays by exp(g), the output reads it.
    let (dk, dv) = (8, 4);
    let s0: Vec<f32> = (0..dk * dv).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut q = vec![0.5f32; dk];
    let mut k: Vec<f32> = (0..dk).map(|i| i as f32).collect();
    normalize_qk(&mut q, &mut k);
    let v = vec![3.0f32; dv];
    let g = -0.25f32;
    let mut s = s0.clone();
    let mut o = vec![0f32; dv];
    step(&mut s, &q, &k, &v, g, 0.0, &mut o);
    for (x, y) in s.iter().zip(&s0) {
        assert_eq!(*x, y * g.exp());
    }
    let mut sc = ChunkScratch::default();
    let mut s2 = s0.clone();
    let mut o2 = vec![0f32; dv];
    chunk(&mut s2, &q, &k, &v, &[g], &[0.0], &mut o2, &mut sc);
    assert!(max_diff(&s, &s2) < 1e-6 && max_diff(&o, &o2) < 1e-6);
}
