//! The gated delta rule's two forms on one Gated DeltaNet head of the released shape
//! (dk = dv = 128): 2048 tokens through [`step`] one by one (decode, verification rows) against
//! [`chunk`] over the same tokens in chunks of 64 (what a prefill of whole aligned chunks runs).
//! Both compute the same recurrence (kernels/tests/gated_delta.rs); this prints microseconds per
//! token of each and the ratio, single-threaded (best of batches, `timing`). Then the same for
//! Kimi Delta Attention (`coli_kernels::kda`: one decay per key channel; Kimi-Linear's and
//! GLM-5.3-Flash's head dimension 128).
//!
//! Run: `cargo bench -p coli-kernels --bench gated_delta`.

mod timing;

use std::hint::black_box;
use std::time::Duration;

use coli_kernels::gated_delta::{chunk, normalize_qk, step, ChunkScratch, CHUNK};
use coli_kernels::kda;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BUDGET: Duration = Duration::from_millis(1500);

/// One head of `dk` x `dv` over `n` random tokens: the recurrent step token by token against
/// the chunk form in chunks of 64, for the gated delta rule (`per_channel` false: one decay per
/// token) or Kimi Delta Attention (`per_channel`: one per key channel). Prints one row.
fn compare(rng: &mut StdRng, dk: usize, dv: usize, n: usize, per_channel: bool) {
    let mut q: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut k: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
    for t in 0..n {
        let (qs, ks) = (&mut q[t * dk..(t + 1) * dk], &mut k[t * dk..(t + 1) * dk]);
        if per_channel {
            kda::normalize_qk(qs, ks);
        } else {
            normalize_qk(qs, ks);
        }
    }
    let v: Vec<f32> = (0..n * dv).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let gw = if per_channel { dk } else { 1 };
    let g: Vec<f32> = (0..n * gw).map(|_| -rng.gen_range(0.01..0.5f32)).collect();
    let beta: Vec<f32> = (0..n).map(|_| rng.gen_range(0.1..0.9f32)).collect();
    let mut o = vec![0f32; n * dv];
    let t_step = timing::best_seconds(BUDGET, || {
        let mut s = vec![0f32; dk * dv];
        for t in 0..n {
            let (qt, kt) = (&q[t * dk..(t + 1) * dk], &k[t * dk..(t + 1) * dk]);
            let (vt, ot) = (&v[t * dv..(t + 1) * dv], &mut o[t * dv..(t + 1) * dv]);
            if per_channel {
                kda::step(&mut s, qt, kt, vt, &g[t * dk..(t + 1) * dk], beta[t], ot);
            } else {
                step(&mut s, qt, kt, vt, g[t], beta[t], ot);
            }
        }
        black_box(&s);
    });
    let mut sc = ChunkScratch::default();
    let t_chunk = timing::best_seconds(BUDGET, || {
        let mut s = vec![0f32; dk * dv];
        let mut t = 0;
        while t < n {
            let e = (t + CHUNK).min(n);
            let (qc, kc, vc) = (&q[t * dk..e * dk], &k[t * dk..e * dk], &v[t * dv..e * dv]);
            let (gc, bc) = (&g[t * gw..e * gw], &beta[t..e]);
            let oc = &mut o[t * dv..e * dv];
            if per_channel {
                kda::chunk(&mut s, qc, kc, vc, gc, bc, oc, &mut sc);
            } else {
                chunk(&mut s, qc, kc, vc, gc, bc, oc, &mut sc);
            }
            t = e;
        }
        black_box(&s);
    });
    println!(
        "     {dk:>3} {dv:>3} {n:>6}  {:>13.2}  {:>14.2}  {:>10.2}",
        t_step * 1e6 / n as f64,
        t_chunk * 1e6 / n as f64,
        t_step / t_chunk
    );
}

fn main() {
    let mut rng = StdRng::seed_from_u64(11);
    println!("head dk dv  tokens  step us/token  chunk us/token  step/chunk");
    for (dk, dv, n) in [(128, 128, 2048), (128, 128, 512), (64, 64, 2048)] {
        compare(&mut rng, dk, dv, n, false);
    }
    println!("KDA  dk dv  tokens  step us/token  chunk us/token  step/chunk");
    for (dk, dv, n) in [(128, 128, 2048), (128, 128, 512)] {
        compare(&mut rng, dk, dv, n, true);
    }
}
