//! Blocked attention (`coli_kernels::attend`): a block of rows gives each row the bits of the
//! per-row, per-key form (random shapes, windows, sinks, DSA-style key lists, rows of several
//! sequences' worth of positions, caches that dropped their first rows), within f32 rounding
//! of an f64 softmax attention computed here from the definition; and the strided helpers give
//! the same bits on every instruction set this CPU has.

use coli_kernels::attend::{attend_block, attend_row_reference, Keys, Row, StridedHead, KEY_TILE};
use coli_kernels::{axpy_strided_with, dot_strided_with, Isa};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `softmax(q k^T * scale (+ sink)) v` of one row in f64, from the definition.
fn oracle(
    q: &[f32],
    keys: &[usize],
    sink: Option<f32>,
    kv: &Cache,
    off: usize,
    scale: f32,
) -> Vec<f64> {
    let d = q.len();
    let logits: Vec<f64> = keys
        .iter()
        .map(|&j| {
            let k = kv.key(j, off, d);
            q.iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale as f64
        })
        .collect();
    let max = logits
        .iter()
        .copied()
        .chain(sink.map(f64::from))
        .fold(f64::NEG_INFINITY, f64::max);
    let den: f64 = logits.iter().map(|l| (l - max).exp()).sum::<f64>()
        + sink.map_or(0.0, |s| (s as f64 - max).exp());
    let mut o = vec![0f64; kv.value_width];
    for (&j, l) in keys.iter().zip(&logits) {
        let p = (l - max).exp() / den;
        for (oe, &v) in o.iter_mut().zip(kv.value(j, off)) {
            *oe += p * v as f64;
        }
    }
    o
}

/// A KV cache holding positions `first..first + len`, rows of `stride` f32.
struct Cache {
    k: Vec<f32>,
    v: Vec<f32>,
    stride: usize,
    first: usize,
    value_width: usize,
}

impl Cache {
    fn key(&self, j: usize, off: usize, d: usize) -> &[f32] {
        let at = (j - self.first) * self.stride + off;
        &self.k[at..at + d]
    }
    /// The head at column `off` (keys and values alike) for `queries`.
    fn head<'a>(&'a self, queries: Vec<&'a [f32]>, off: usize, scale: f32) -> StridedHead<'a> {
        let (s, w, f) = (self.stride, self.value_width, self.first);
        StridedHead::new(queries, &self.k, &self.v, s, off, off, w, f, scale)
    }
    fn value(&self, j: usize, off: usize) -> &[f32] {
        let at = (j - self.first) * self.stride + off;
        &self.v[at..at + self.value_width]
    }
}

#[test]
fn a_block_gives_every_row_the_per_row_bits() {
    let mut rng = StdRng::seed_from_u64(43);
    for case in 0..60 {
        let hd = [1usize, 7, 16, 64, 128][case % 5];
        let vw = if case % 3 == 0 {
            hd
        } else {
            rng.gen_range(1..40)
        };
        let heads = rng.gen_range(1..4);
        let stride = heads * hd.max(vw) + rng.gen_range(0..5);
        let first = if case % 4 == 0 {
            rng.gen_range(0..200)
        } else {
            0
        };
        let len = rng.gen_range(1..3 * KEY_TILE + 7);
        let scale = (hd as f32).powf(-0.5);
        // Large logits in some cases: the softmax's max subtraction matters.
        let amp = if case % 7 == 0 { 30.0 } else { 1.0 };
        let kv = Cache {
            k: (0..len * stride)
                .map(|_| rng.gen_range(-amp..amp))
                .collect(),
            v: (0..len * stride)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect(),
            stride,
            first,
            value_width: vw,
        };
        let h = rng.gen_range(0..heads);
        let off = h * hd.max(vw);
        let nrows = rng.gen_range(1..40);
        let queries: Vec<Vec<f32>> = (0..nrows)
            .map(|_| (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        let end = first + len;
        // Sparse selections, and consecutive ones (DSA below `index_topk`: every key, which
        // runs as ranges).
        let lists: Vec<Vec<usize>> = (0..nrows)
            .map(|_| {
                if rng.gen_bool(0.5) {
                    let a = rng.gen_range(first..end);
                    (a..rng.gen_range(a + 1..=end)).collect()
                } else {
                    (first..end).filter(|_| rng.gen_bool(0.3)).collect()
                }
            })
            .collect();
        let rows: Vec<Row> = (0..nrows)
            .map(|i| {
                let hi = rng.gen_range(first + 1..=end);
                let lo = if rng.gen_bool(0.3) {
                    rng.gen_range(first..hi)
                } else {
                    first
                };
                Row {
                    keys: if case % 2 == 1 && i % 3 == 0 {
                        Keys::List(&lists[i])
                    } else {
                        Keys::Range { lo, hi }
                    },
                    sink: rng.gen_bool(0.3).then(|| rng.gen_range(-3.0..3.0)),
                }
            })
            .collect();
        let mut head = kv.head(queries.iter().map(|q| q.as_slice()).collect(), off, scale);
        let mut block = vec![f32::NAN; nrows * vw];
        attend_block(&mut head, &rows, vw, &mut block);
        // The same source object again, now as single rows (its tile holds the last values).
        for (i, r) in rows.iter().enumerate() {
            let mut want = vec![f32::NAN; vw];
            attend_row_reference(&head, i, r, &mut want);
            assert_eq!(
                bits(&block[i * vw..(i + 1) * vw]),
                bits(&want),
                "case {case} row {i} ({r:?}): the block's bits differ from the row's"
            );
            // Alone in a block of its own (row index 0 of a source holding only its query).
            let mut own = kv.head(vec![&queries[i]], off, scale);
            let mut alone = vec![f32::NAN; vw];
            attend_block(&mut own, std::slice::from_ref(r), vw, &mut alone);
            assert_eq!(bits(&alone), bits(&want), "case {case} row {i} alone");
            let keys: Vec<usize> = match r.keys {
                Keys::Range { lo, hi } => (lo..hi).collect(),
                Keys::List(l) => l.to_vec(),
            };
            if keys.is_empty() && r.sink.is_none() {
                assert!(want.iter().all(|&x| x == 0.0), "no keys: zeros");
                continue;
            }
            let o = oracle(&queries[i], &keys, r.sink, &kv, off, scale);
            for (c, (&got, &exp)) in want.iter().zip(&o).enumerate() {
                assert!(
                    (got as f64 - exp).abs() < 1e-5,
                    "case {case} row {i} col {c}: {got} vs the f64 definition {exp}"
                );
            }
        }
    }
}

#[test]
fn the_strided_helpers_give_the_scalar_bits_on_every_instruction_set() {
    let mut rng = StdRng::seed_from_u64(44);
    for &(d, stride, n) in &[
        (128usize, 2048usize, 200usize),
        (7, 9, 13),
        (64, 64, 5),
        (33, 100, 67),
    ] {
        let m: Vec<f32> = (0..n * stride).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let q: Vec<f32> = (0..d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let p: Vec<f32> = (0..n).map(|_| rng.gen_range(0.0..1.0)).collect();
        let off = stride - d;
        let mut want_s = vec![0f32; n];
        dot_strided_with(Isa::Scalar, &q, &m, stride, off, &mut want_s);
        let mut want_y: Vec<f32> = (0..d).map(|i| i as f32 * 0.01).collect();
        let y0 = want_y.clone();
        axpy_strided_with(Isa::Scalar, &p, &m, stride, off, &mut want_y);
        for isa in Isa::ALL.into_iter().filter(|i| i.supported()) {
            let mut s = vec![0f32; n];
            dot_strided_with(isa, &q, &m, stride, off, &mut s);
            assert_eq!(bits(&s), bits(&want_s), "dot_strided {} d {d}", isa.name());
            let mut y = y0.clone();
            axpy_strided_with(isa, &p, &m, stride, off, &mut y);
            assert_eq!(bits(&y), bits(&want_y), "axpy_strided {} d {d}", isa.name());
        }
    }
}
