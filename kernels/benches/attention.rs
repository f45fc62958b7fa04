//! Attention's per-key helpers: one query head against a head's keys and values in a KV cache
//! (rows of `kv_dim` f32), one call per key (`dot`, `axpy`, what attention did) against the
//! strided helpers (`dot_strided`, `axpy_strided`), which give the same bits.
//!
//! Run: `cargo bench -p coli-kernels --bench attention`. Prints, per head dimension and number
//! of keys, the nanoseconds per key of each and the ratio, single-threaded (best of batches:
//! the least disturbed by other processes on a shared machine).

mod timing;

use std::hint::black_box;
use std::time::Duration;

use coli_kernels::{axpy, axpy_strided, dot, dot_strided};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Seconds spent timing one configuration.
const BUDGET: Duration = Duration::from_millis(300);

/// Best-of-batches seconds per call of `f` (`timing::best_seconds` over [`BUDGET`]).
fn time(f: impl FnMut()) -> f64 {
    timing::best_seconds(BUDGET, f)
}

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    println!(
        "{:>4} {:>6} {:>7} | {:>10} {:>10} {:>6} | {:>10} {:>10} {:>6}",
        "hd", "keys", "kv_dim", "dot ns/key", "strided", "x", "axpy ns/key", "strided", "x"
    );
    // (head_dim, kv_dim): SmolLM2 (3 KV heads of 64), OLMoE (16 of 128), GLM-5's MLA latent.
    for (hd, kvd) in [(64usize, 192usize), (128, 2048), (512, 576)] {
        for keys in [128usize, 1024, 8192] {
            let m: Vec<f32> = (0..keys * kvd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let p: Vec<f32> = (0..keys).map(|_| rng.gen_range(0.0..1e-3)).collect();
            let off = kvd - hd;
            let mut s = vec![0f32; keys];
            let t_dot = time(|| {
                for (j, o) in s.iter_mut().enumerate() {
                    *o = dot(&q, &m[j * kvd + off..j * kvd + off + hd]);
                }
                black_box(&s);
            });
            let t_dots = time(|| {
                dot_strided(&q, &m, kvd, off, &mut s);
                black_box(&s);
            });
            let mut y = vec![0f32; hd];
            let t_axpy = time(|| {
                y.fill(0.0);
                for (j, &pj) in p.iter().enumerate() {
                    axpy(pj, &m[j * kvd + off..j * kvd + off + hd], &mut y);
                }
                black_box(&y);
            });
            let t_axpys = time(|| {
                y.fill(0.0);
                axpy_strided(&p, &m, kvd, off, &mut y);
                black_box(&y);
            });
            let ns = |t: f64| t * 1e9 / keys as f64;
            println!(
                "{hd:>4} {keys:>6} {kvd:>7} | {:>10.2} {:>10.2} {:>6.2} | {:>10.2} {:>10.2} {:>6.2}",
                ns(t_dot),
                ns(t_dots),
                t_dot / t_dots,
                ns(t_axpy),
                ns(t_axpys),
                t_axpy / t_axpys
            );
        }
    }
}
