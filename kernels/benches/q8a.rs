//! Integer activations (`Numerics::Q8a`) against the exact f32-activation kernels, same run,
//! interleaved: per encoding, OLMoE-1B-7B's expert shapes (gate/up `[1024, 2048]`, down
//! `[2048, 1024]`) and a dense `[2048, 2048]`, tokens per product 1 (decode), 4, 16, 64
//! (prefill chunks), one thread and all threads. Prints microseconds per product, weight GB/s
//! and the exact / q8a time ratio (> 1: q8a faster).
//!
//! Run: `cargo bench -p coli-kernels --bench q8a` (optional argument: a filter on the
//! encoding name, e.g. `int8`, `ggml`; ggml blocks come from gguf-py's test vectors). Results: kernels/benches/results/q8a_*.txt.

mod timing;

use std::time::Duration;

use coli_format::encoding::GgmlType;
use coli_format::{Encoding, MatrixView};
use coli_kernels::{detected_isa, integer_kernel, matmul_num, Numerics};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zerocopy::IntoBytes;

const BUDGET: Duration = Duration::from_millis(300);

/// `n` bf16 weights of a trained model's range (|w| < 0.1; random bits would be mostly huge,
/// NaN or infinite), little-endian bytes.
fn bf16_weights(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| {
            let v: f32 = rng.gen_range(-0.1f32..0.1);
            ((v.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

/// One token against each matrix of each run in turn (so the weights come from RAM), runs
/// alternated twice; the best seconds per product of each run.
fn from_ram(
    threads: usize,
    runs: &[(Numerics, &Vec<MatrixView<'_>>)],
    x: &[f32],
    y: &mut [f32],
) -> Vec<f64> {
    let isa = detected_isa();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut i = 0;
    let mut t = vec![f64::INFINITY; runs.len()];
    for _ in 0..2 {
        for (k, &(num, vs)) in runs.iter().enumerate() {
            t[k] = t[k].min(pool.install(|| {
                timing::best_seconds(BUDGET, || {
                    i = (i + 1) % vs.len();
                    matmul_num(isa, num, &vs[i], x, 1, y)
                })
            }));
        }
    }
    t
}

fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let isa = detected_isa();
    let all = rayon::current_num_threads();
    println!(
        "isa {} (integer kernel {}), {} threads available",
        isa.name(),
        integer_kernel(isa),
        all
    );
    let mut rng = StdRng::seed_from_u64(7);
    // The activation quantization alone: a product with 4 rows.
    {
        let enc = Encoding::Int4 { group_size: 64 };
        let data = vec![0x88u8; enc.weight_bytes(4, 2048)];
        let scales = vec![0.01f32; enc.scale_count(4, 2048)];
        let w = MatrixView::new(enc, 4, 2048, &data, &scales).unwrap();
        let x: Vec<f32> = (0..2048).map(|i| (i as f32).sin()).collect();
        let mut y = vec![0f32; 4];
        let t = timing::best_seconds(BUDGET, || matmul_num(isa, Numerics::Q8a, &w, &x, 1, &mut y));
        println!(
            "q8a product of 4 x 2048 (mostly the activation quantization): {:.2} us",
            t * 1e6
        );
    }
    // Weights streamed from RAM (as a decode over experts does): 128 matrices of 1024 x 2048
    // int4-g64 (128 MiB), each product on the next one.
    {
        let enc = Encoding::Int4 { group_size: 64 };
        let (rows, cols, count) = (1024, 2048, 128);
        let mats: Vec<(Vec<u8>, Vec<f32>)> = (0..count)
            .map(|_| {
                (
                    (0..enc.weight_bytes(rows, cols))
                        .map(|_| rng.gen())
                        .collect(),
                    (0..enc.scale_count(rows, cols))
                        .map(|_| rng.gen_range(0.01f32..0.1))
                        .collect(),
                )
            })
            .collect();
        let views: Vec<MatrixView<'_>> = mats
            .iter()
            .map(|(d, s)| MatrixView::new(enc, rows, cols, d, s).unwrap())
            .collect();
        // The same matrices in the interleaved row order (how the engine keeps them resident
        // under q8a).
        let inter: Vec<(Vec<u8>, Vec<f32>)> = mats
            .iter()
            .map(|(d, s)| {
                let (mut d, mut b) = (d.clone(), s.as_bytes().to_vec());
                MatrixView::interleave(enc, rows, cols, &mut d, &mut b);
                let s = b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                (d, s)
            })
            .collect();
        let iviews: Vec<MatrixView<'_>> = inter
            .iter()
            .map(|(d, s)| {
                MatrixView::new(enc, rows, cols, d, s)
                    .unwrap()
                    .as_interleaved()
                    .unwrap()
            })
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut y = vec![0f32; rows];
        for threads in [1, all] {
            let t = from_ram(
                threads,
                &[
                    (Numerics::Exact, &views),
                    (Numerics::Q8a, &views),
                    (Numerics::Q8a, &iviews),
                ],
                &x,
                &mut y,
            );
            println!(
                "from RAM: int4-g64 1024x2048, {threads} threads: exact {:.1} us, q8a {:.1} us, q8a interleaved {:.1} us, exact/q8a {:.2}, q8a/interleaved {:.2}",
                t[0] * 1e6,
                t[1] * 1e6,
                t[2] * 1e6,
                t[0] / t[1],
                t[1] / t[2]
            );
        }
    }
    // bf16 weights streamed from RAM, one token (a bf16-dense model's decode): 64 matrices of
    // 1024 x 2048 (256 MiB), each product on the next one; exact against q8a's bf16 rule.
    if filter.as_ref().is_none_or(|f| "bf16".contains(f.as_str())) {
        let (rows, cols, count) = (1024, 2048, 64);
        let mats: Vec<Vec<u8>> = (0..count)
            .map(|_| bf16_weights(&mut rng, rows * cols))
            .collect();
        let views: Vec<MatrixView<'_>> = mats
            .iter()
            .map(|d| MatrixView::new(Encoding::Bf16, rows, cols, d, &[]).unwrap())
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut y = vec![0f32; rows];
        for threads in [1, all] {
            let t = from_ram(
                threads,
                &[(Numerics::Exact, &views), (Numerics::Q8a, &views)],
                &x,
                &mut y,
            );
            println!(
                "from RAM: bf16 1024x2048, {threads} threads: exact {:.1} us, q8a {:.1} us ({:.1} GB/s), exact/q8a {:.2}",
                t[0] * 1e6,
                t[1] * 1e6,
                (rows * cols * 2) as f64 / t[1] / 1e9,
                t[0] / t[1]
            );
        }
    }
    println!(
        "encoding      shape       tokens threads  exact_us   q8a_us  q8a_GB/s  exact/q8a  q8a_il_us"
    );
    for enc in [
        Encoding::Bf16,
        Encoding::Int4 { group_size: 64 },
        Encoding::Int4 { group_size: 32 },
        Encoding::Int8,
        Encoding::Mxfp4,
        Encoding::Ggml(GgmlType::Q8_0),
        Encoding::Ggml(GgmlType::Q4_0),
        Encoding::Ggml(GgmlType::Q4_K),
        Encoding::Ggml(GgmlType::Q6_K),
        Encoding::Ggml(GgmlType::IQ2_XXS),
        Encoding::Ggml(GgmlType::IQ2_XS),
        Encoding::Ggml(GgmlType::IQ2_S),
        Encoding::Ggml(GgmlType::IQ3_XXS),
        Encoding::Ggml(GgmlType::IQ3_S),
        Encoding::Ggml(GgmlType::IQ4_XS),
        Encoding::Ggml(GgmlType::IQ1_S),
    ] {
        let name = enc.name();
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        for (rows, cols) in [(1024, 2048), (2048, 1024), (2048, 2048)] {
            let data: Vec<u8> = match enc {
                // ggml blocks: gguf-py's test vectors (finite f16 scales), tiled.
                Encoding::Ggml(t) => {
                    let path = concat!(
                        env!("CARGO_MANIFEST_DIR"),
                        "/../tests/fixtures/gguf/vectors/"
                    );
                    let blocks =
                        std::fs::read(format!("{path}{}.blocks", t.name())).expect("vectors");
                    blocks
                        .iter()
                        .copied()
                        .cycle()
                        .take(enc.weight_bytes(rows, cols))
                        .collect()
                }
                Encoding::Bf16 => bf16_weights(&mut rng, rows * cols),
                _ => (0..enc.weight_bytes(rows, cols))
                    .map(|_| rng.gen())
                    .collect(),
            };
            // f32 scales, or mxfp4's e8m0 bytes (2^-7 .. 2^2).
            let mx = enc == Encoding::Mxfp4;
            let count = enc.scale_count(rows, cols);
            let scales: Vec<f32> = (0..if mx { 0 } else { count })
                .map(|_| rng.gen_range(0.01f32..0.1))
                .collect();
            let e8m0: Vec<u8> = (0..if mx { count } else { 0 })
                .map(|_| rng.gen_range(120u8..=129))
                .collect();
            let w = if mx {
                MatrixView::from_sections(enc, rows, cols, &data, &e8m0).unwrap()
            } else {
                MatrixView::new(enc, rows, cols, &data, &scales).unwrap()
            };
            // The interleaved row order the engine keeps resident int4/int8/mxfp4 weights in
            // under q8a (weights and scales reordered).
            let inter = MatrixView::can_interleave(enc, rows, cols).then(|| {
                let mut d = data.clone();
                let mut b = if mx {
                    e8m0.clone()
                } else {
                    scales.as_bytes().to_vec()
                };
                MatrixView::interleave(enc, rows, cols, &mut d, &mut b);
                (d, b)
            });
            let inter = inter.map(|(d, b)| {
                let f: Vec<f32> = if mx {
                    vec![]
                } else {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                };
                (d, b, f)
            });
            let wi = inter.as_ref().map(|(d, b, f)| {
                let v = if mx {
                    MatrixView::from_sections(enc, rows, cols, d, b).unwrap()
                } else {
                    MatrixView::new(enc, rows, cols, d, f).unwrap()
                };
                v.as_interleaved().unwrap()
            });
            let bytes = (data.len() + 4 * scales.len() + e8m0.len()) as f64;
            for n in [1usize, 4, 16, 64] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let mut y = vec![0f32; n * rows];
                for threads in [1, all] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let (mut te, mut tq, mut ti) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
                    // Interleaved: exact, q8a, exact, q8a; best of each.
                    for _ in 0..2 {
                        if let Some(wi) = &wi {
                            ti = ti.min(pool.install(|| {
                                timing::best_seconds(BUDGET, || {
                                    matmul_num(isa, Numerics::Q8a, wi, &x, n, &mut y)
                                })
                            }));
                        }
                        te = te.min(pool.install(|| {
                            timing::best_seconds(BUDGET, || {
                                matmul_num(isa, Numerics::Exact, &w, &x, n, &mut y)
                            })
                        }));
                        tq = tq.min(pool.install(|| {
                            timing::best_seconds(BUDGET, || {
                                matmul_num(isa, Numerics::Q8a, &w, &x, n, &mut y)
                            })
                        }));
                    }
                    let il = if ti.is_finite() {
                        format!("{:>10.1}", ti * 1e6)
                    } else {
                        format!("{:>10}", "-")
                    };
                    println!(
                        "{name:<12} {rows:>5}x{cols:<5} {n:>6} {threads:>7} {:>9.1} {:>8.1} {:>9.2} {:>10.2} {il}",
                        te * 1e6,
                        tq * 1e6,
                        bytes / tq / 1e9,
                        te / tq
                    );
                }
            }
        }
    }
}
