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

fn main() {
    let mut rng = StdRng::seed_from_u64(11);
    println!("head dk dv  tokens  step us/token  chunk us/token  step/chunk");
    for (dk, dv, n) in [
        (128usize, 128usize, 2048usize),
        (128, 128, 512),
        (64, 64, 2048),
    ] {
        let mut q: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut k: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for t in 0..n {
            let (qs, ks) = (&mut q[t * dk..(t + 1) * dk], &mut k[t * dk..(t + 1) * dk]);
            normalize_qk(qs, ks);
        }
        let v: Vec<f32> = (0..n * dv).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let g: Vec<f32> = (0..n).map(|_| -rng.gen_range(0.01..0.5f32)).collect();
        let beta: Vec<f32> = (0..n).map(|_| rng.gen_range(0.1..0.9f32)).collect();
        let mut o = vec![0f32; n * dv];
        let t_step = timing::best_seconds(BUDGET, || {
            let mut s = vec![0f32; dk * dv];
            for t in 0..n {
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
            black_box(&s);
        });
        let mut sc = ChunkScratch::default();
        let t_chunk = timing::best_seconds(BUDGET, || {
            let mut s = vec![0f32; dk * dv];
            let mut t = 0;
            while t < n {
                let e = (t + CHUNK).min(n);
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
            black_box(&s);
        });
        println!(
            "     {dk:>3} {dv:>3} {n:>6}  {:>13.2}  {:>14.2}  {:>10.2}",
            t_step * 1e6 / n as f64,
            t_chunk * 1e6 / n as f64,
            t_step / t_chunk
        );
    }
    println!("KDA  dk dv  tokens  step us/token  chunk us/token  step/chunk");
    for (dk, dv, n) in [(128usize, 128usize, 2048usize), (128, 128, 512)] {
        let mut q: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut k: Vec<f32> = (0..n * dk).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for t in 0..n {
            let (qs, ks) = (&mut q[t * dk..(t + 1) * dk], &mut k[t * dk..(t + 1) * dk]);
            kda::normalize_qk(qs, ks);
        }
        let v: Vec<f32> = (0..n * dv).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let g: Vec<f32> = (0..n * dk).map(|_| -rng.gen_range(0.01..0.5f32)).collect();
        let beta: Vec<f32> = (0..n).map(|_| rng.gen_range(0.1..0.9f32)).collect();
        let mut o = vec![0f32; n * dv];
        let t_step = timing::best_seconds(BUDGET, || {
            let mut s = vec![0f32; dk * dv];
            for t in 0..n {
                kda::step(
                    &mut s,
                    &q[t * dk..(t + 1) * dk],
                    &k[t * dk..(t + 1) * dk],
                    &v[t * dv..(t + 1) * dv],
                    &g[t * dk..(t + 1) * dk],
                    beta[t],
                    &mut o[t * dv..(t + 1) * dv],
                );
            }
            black_box(&s);
        });
        let mut sc = kda::ChunkScratch::default();
        let t_chunk = timing::best_seconds(BUDGET, || {
            let mut s = vec![0f32; dk * dv];
            let mut t = 0;
            while t < n {
                let e = (t + kda::CHUNK).min(n);
                kda::chunk(
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
            black_box(&s);
        });
        println!(
            "     {dk:>3} {dv:>3} {n:>6}  {:>13.2}  {:>14.2}  {:>10.2}",
            t_step * 1e6 / n as f64,
            t_chunk * 1e6 / n as f64,
            t_step / t_chunk
        );
    }
}
