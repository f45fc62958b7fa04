//! Attention's per-key helpers: one query head against a head's keys and values in a KV cache
//! (rows of `kv_dim` f32), one call per key (`dot`, `axpy`, what attention did) against the
//! strided helpers (`dot_strided`, `axpy_strided`), which give the same bits.
//!
//! A second table times whole rows: a block of query rows (a prefill chunk's tokens times the
//! query heads sharing one KV head) against one head of a long KV cache, each row alone as the
//! engine did before blocking (scores, softmax, values; the keys and values read once per row)
//! against [`attend_block`] (tiles of keys read once per block); the same bits.
//!
//! Run: `cargo bench -p coli-kernels --bench attention` (argument `blocks`: the second table
//! only). Prints, per head dimension and number of keys, the nanoseconds per key of each and
//! the ratio, single-threaded (best of batches: the least disturbed by other processes on a
//! shared machine).

mod timing;

use std::hint::black_box;
use std::time::Duration;

use coli_kernels::attend::{attend_block, Keys, Row, StridedHead};
use coli_kernels::{axpy, axpy_strided, dot, dot_strided, softmax_inplace};
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
    if std::env::args().nth(1).as_deref() != Some("blocks") {
        keys_table(&mut rng);
    }
    blocks_table(&mut rng);
}

/// Rows of a prefill chunk (`tokens` consecutive positions ending at `keys - 1`, each with
/// `group` query heads) against one KV head of `keys` cached positions: per-row against
/// blocked, nanoseconds per (row, key).
fn blocks_table(rng: &mut StdRng) {
    println!();
    println!(
        "{:>4} {:>7} {:>6} {:>6} {:>6} | {:>12} {:>12} {:>6}",
        "hd", "kv_dim", "keys", "tokens", "group", "per-row ns", "blocked ns", "x"
    );
    // OLMoE (16 KV heads of 128, no grouping), Qwen3-30B-A3B (4 KV heads of 128, 8 query heads
    // each), a decode step of OLMoE (one token).
    for (hd, kvd, tokens, group) in [
        (128usize, 2048usize, 32usize, 1usize),
        (128, 512, 4, 8),
        (128, 2048, 1, 1),
    ] {
        for keys in [1024usize, 8192] {
            let k: Vec<f32> = (0..keys * kvd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let v: Vec<f32> = (0..keys * kvd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let rows = tokens * group;
            let q: Vec<f32> = (0..rows * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let off = kvd - hd;
            let scale = (hd as f32).powf(-0.5);
            let pos = |r: usize| keys - tokens + r / group;
            let mut per_row = vec![0f32; rows * hd];
            let t_row = time(|| {
                for (r, o) in per_row.chunks_exact_mut(hd).enumerate() {
                    let mut s = vec![0f32; pos(r) + 1];
                    dot_strided(&q[r * hd..(r + 1) * hd], &k, kvd, off, &mut s);
                    for x in &mut s {
                        *x *= scale;
                    }
                    softmax_inplace(&mut s);
                    o.fill(0.0);
                    axpy_strided(&s, &v, kvd, off, o);
                }
                black_box(&per_row);
            });
            let mut head = StridedHead::new(
                q.chunks_exact(hd).collect(),
                &k,
                &v,
                kvd,
                off,
                off,
                hd,
                0,
                scale,
            );
            let spec: Vec<Row> = (0..rows)
                .map(|r| Row {
                    keys: Keys::Range {
                        lo: 0,
                        hi: pos(r) + 1,
                    },
                    sink: None,
                })
                .collect();
            let mut blocked = vec![0f32; rows * hd];
            let t_block = time(|| {
                attend_block(&mut head, &spec, hd, &mut blocked);
                black_box(&blocked);
            });
            assert_eq!(
                per_row.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                blocked.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "blocked attention must give the per-row bits"
            );
            let ns = |t: f64| t * 1e9 / (rows * keys) as f64;
            println!(
                "{hd:>4} {kvd:>7} {keys:>6} {tokens:>6} {group:>6} | {:>12.2} {:>12.2} {:>6.2}",
                ns(t_row),
                ns(t_block),
                t_row / t_block
            );
        }
    }
}

/// The per-key helpers, one call per key against the strided ones.
fn keys_table(rng: &mut StdRng) {
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
