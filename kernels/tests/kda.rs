//! Kimi Delta Attention ([`coli_kernels::kda`]) against transformers 5.25's own
//! `chunk_kimi_delta_attention` / `recurrent_kimi_delta_attention`, computed in float64 by
//! `tests/fixtures/make_kda_expected.py` (`tests/fixtures/kda/`): both forms, a prefill split
//! into aligned chunks and a tail run token by token, a random initial state, strong decays,
//! Kimi-Linear's head dimension (128). The reference is the recurrent form's float64 run (the
//! chunk form's casts its decay mask to float32).

mod common;

use coli_kernels::kda::{chunk, normalize_qk, step, ChunkScratch, CHUNK};
use common::{check_split_rounding, check_splits, max_diff, oracles, Oracle};

struct Case {
    name: String,
    n: usize,
    h: usize,
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
        let (n, nh, dk, dv) = (self.n, self.h, self.dk, self.dv);
        let (qa, ka, va, ga) = (
            self.array("query"),
            self.array("key"),
            self.array("value"),
            self.array("g"),
        );
        let (mut q, mut k, mut v, mut g) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for t in 0..n {
            let mut qt = qa[(t * nh + h) * dk..][..dk].to_vec();
            let mut kt = ka[(t * nh + h) * dk..][..dk].to_vec();
            normalize_qk(&mut qt, &mut kt);
            q.extend(qt);
            k.extend(kt);
            v.extend_from_slice(&va[(t * nh + h) * dv..][..dv]);
            g.extend_from_slice(&ga[(t * nh + h) * dk..][..dk]);
        }
        let beta = (0..n).map(|t| self.array("beta")[t * nh + h]).collect();
        let s0 = self.array("initial_state")[h * dk * dv..][..dk * dv].to_vec();
        (q, k, v, g, beta, s0)
    }

    /// Runs every head with tokens `0..split` in chunks of [`CHUNK`] (the last one partial)
    /// and the rest token by token: `(outputs [n, h, dv], final states [h, dk, dv])`.
    fn run(&self, split: usize) -> (Vec<f32>, Vec<f32>) {
        let (n, nh, dk, dv) = (self.n, self.h, self.dk, self.dv);
        let mut out = vec![0f32; n * nh * dv];
        let mut states = Vec::new();
        let mut sc = ChunkScratch::default();
        for h in 0..nh {
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
                    &g[t * dk..e * dk],
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
                    &g[t * dk..(t + 1) * dk],
                    beta[t],
                    &mut o[t * dv..(t + 1) * dv],
                );
            }
            for t in 0..n {
                out[(t * nh + h) * dv..][..dv].copy_from_slice(&o[t * dv..][..dv]);
            }
            states.extend(s);
        }
        (out, states)
    }
}

fn cases() -> Vec<Case> {
    oracles("kda")
        .into_iter()
        .map(|o| Case {
            name: o.name().to_string(),
            n: o.dim("n"),
            h: o.dim("h"),
            dk: o.dim("dk"),
            dv: o.dim("dv"),
            oracle: o,
        })
        .collect()
}

/// Largest difference allowed from the float64 oracle: f32 rounding of sums of at most a few
/// hundred O(1) terms (transformers' own float32 chunk runs differ from float64 by up to
/// 6.1e-7 here).
const TOL: f32 = 2e-6;

#[test]
fn both_forms_and_mixed_splits_match_transformers_float64() {
    // transformers' KDA oracle is its recurrent form in float64 for every split.
    for c in cases() {
        let oracle = |_: &str| {
            (
                c.array("recurrent_out_f64"),
                c.array("recurrent_state_f64"),
                c.array("chunk_out_f32"),
            )
        };
        check_splits(&c.name, c.n, CHUNK, TOL, &|s| c.run(s), &oracle);
    }
}

#[test]
fn a_chunk_split_changes_rounding_only() {
    for c in cases() {
        check_split_rounding(&c.name, c.n, TOL, &|s| c.run(s));
    }
}

#[test]
fn per_channel_decay_and_zero_write_strength() {
    // beta = 0: nothing is written, row i of the state decays by exp(g_i), the output reads it;
    // equal channel decays give the gated delta rule's step bit for bit (same products, same
    // order) when the key is normalized the same way.
    let (dk, dv) = (8, 4);
    let s0: Vec<f32> = (0..dk * dv).map(|i| (i as f32 * 0.37).sin()).collect();
    let q: Vec<f32> = (0..dk).map(|i| 0.1 * i as f32 - 0.3).collect();
    let k: Vec<f32> = (0..dk).map(|i| (i as f32).cos() * 0.3).collect();
    let v = vec![3.0f32; dv];
    let g: Vec<f32> = (0..dk).map(|i| -0.05 * (i + 1) as f32).collect();
    let mut s = s0.clone();
    let mut o = vec![0f32; dv];
    step(&mut s, &q, &k, &v, &g, 0.0, &mut o);
    for (i, (row, row0)) in s.chunks(dv).zip(s0.chunks(dv)).enumerate() {
        for (x, y) in row.iter().zip(row0) {
            assert_eq!(*x, y * g[i].exp(), "row {i}");
        }
    }
    let mut sc = ChunkScratch::default();
    let mut s2 = s0.clone();
    let mut o2 = vec![0f32; dv];
    chunk(&mut s2, &q, &k, &v, &g, &[0.0], &mut o2, &mut sc);
    assert!(max_diff(&s, &s2) < 1e-6 && max_diff(&o, &o2) < 1e-6);
    // One decay for every channel: the gated delta rule's recurrent step.
    let gs = vec![-0.2f32; dk];
    let (mut a, mut b) = (s0.clone(), s0.clone());
    let (mut oa, mut ob) = (vec![0f32; dv], vec![0f32; dv]);
    step(&mut a, &q, &k, &v, &gs, 0.7, &mut oa);
    coli_kernels::gated_delta::step(&mut b, &q, &k, &v, -0.2, 0.7, &mut ob);
    assert_eq!(a, b);
    assert_eq!(oa, ob);
}

#[test]
fn extreme_decays_across_sub_blocks_stay_finite_and_agree() {
    // Log decays down to -60 per token: the running sums fall far below f32's exponent range
    // inside a chunk, so every factored decay across sub-blocks underflows (each factor is at
    // most 1: nothing overflows); the chunk form still gives the recurrent form's numbers.
    let (n, dk, dv) = (64, 16, 8);
    let f = |i: usize, a: f32| (i as f32 * a).sin() * 0.9;
    let mut q: Vec<f32> = (0..n * dk).map(|i| f(i, 0.37)).collect();
    let mut k: Vec<f32> = (0..n * dk).map(|i| f(i, 0.91)).collect();
    for t in 0..n {
        let (qs, ks) = (&mut q[t * dk..(t + 1) * dk], &mut k[t * dk..(t + 1) * dk]);
        normalize_qk(qs, ks);
    }
    let v: Vec<f32> = (0..n * dv).map(|i| f(i, 0.53)).collect();
    let g: Vec<f32> = (0..n * dk)
        .map(|i| {
            if i % 3 == 0 {
                -60.0
            } else {
                -0.01 * (i % 7) as f32
            }
        })
        .collect();
    let beta: Vec<f32> = (0..n).map(|t| 0.2 + 0.6 * f(t, 1.3).abs()).collect();
    let s0: Vec<f32> = (0..dk * dv).map(|i| f(i, 0.11)).collect();
    let (mut a, mut b) = (s0.clone(), s0);
    let (mut oa, mut ob) = (vec![0f32; n * dv], vec![0f32; n * dv]);
    chunk(
        &mut a,
        &q,
        &k,
        &v,
        &g,
        &beta,
        &mut oa,
        &mut ChunkScratch::default(),
    );
    for t in 0..n {
        step(
            &mut b,
            &q[t * dk..(t + 1) * dk],
            &k[t * dk..(t + 1) * dk],
            &v[t * dv..(t + 1) * dv],
            &g[t * dk..(t + 1) * dk],
            beta[t],
            &mut ob[t * dv..(t + 1) * dv],
        );
    }
    assert!(oa.iter().chain(&a).all(|x| x.is_finite()));
    assert!(max_diff(&oa, &ob) < 1e-5 && max_diff(&a, &b) < 1e-5);
}
