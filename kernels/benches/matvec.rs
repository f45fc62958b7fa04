//! Matrix-vector / small matrix-matrix throughput per encoding, scalar vs AVX2+FMA.
//!
//! Run: `cargo bench -p coli-kernels --bench matvec` (optional argument: a filter on the
//! encoding name, e.g. `int4`). Prints, per encoding and shape, the weight bandwidth in GB/s
//! (weight + scale bytes / time) and GFLOP/s (2 * rows * cols * tokens / time), single-threaded
//! and on all threads, and the AVX2 / scalar speed ratio.

mod timing;

use std::time::Duration;

use coli_format::encoding::GgmlType;
use coli_format::{Encoding, MatrixView};
use coli_kernels::{matmul_with, matvec_with, Isa};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Seconds spent timing one configuration.
const BUDGET: Duration = Duration::from_millis(250);

/// Best-of-batches seconds per call of `f` (`timing::best_seconds` over [`BUDGET`]).
fn time(f: impl FnMut()) -> f64 {
    timing::best_seconds(BUDGET, f)
}

/// Weight bytes and the scale section's bytes (f32 scales as little-endian bytes; mxfp4's and
/// mxfp8's e8m0 bytes in 120..=129).
fn data_for(enc: Encoding, rows: usize, cols: usize, rng: &mut StdRng) -> (Vec<u8>, Vec<u8>) {
    let nb = enc.weight_bytes(rows, cols);
    let data: Vec<u8> = match enc {
        Encoding::F32 => (0..rows * cols)
            .flat_map(|_| rng.gen_range(-1.0f32..1.0).to_le_bytes())
            .collect(),
        Encoding::Bf16 => (0..rows * cols)
            .flat_map(|_| ((rng.gen_range(-1.0f32..1.0).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        Encoding::Fp8 | Encoding::Mxfp8 => (0..nb).map(|_| rng.gen::<u8>() & 0x77).collect(),
        // ggml blocks: gguf-py's test vectors (finite f16 scales of realistic size), tiled.
        Encoding::Ggml(t) => {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fixtures/gguf/vectors/"
            );
            let blocks = std::fs::read(format!("{path}{}.blocks", t.name())).expect("vectors");
            blocks.iter().copied().cycle().take(nb).collect()
        }
        _ => (0..nb).map(|_| rng.gen()).collect(),
    };
    let scales = if matches!(enc, Encoding::Mxfp4 | Encoding::Mxfp8) {
        (0..enc.scale_count(rows, cols))
            .map(|_| rng.gen_range(120u8..=129))
            .collect()
    } else {
        (0..enc.scale_count(rows, cols))
            .flat_map(|_| rng.gen_range(0.01f32..0.1).to_le_bytes())
            .collect()
    };
    (data, scales)
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512]
        .into_iter()
        .filter(|i| i.supported())
        .collect();
    let threads = rayon::current_num_threads();
    let pool1 = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let encs = [
        Encoding::F32,
        Encoding::Bf16,
        Encoding::Fp8,
        Encoding::Int8,
        Encoding::Int4 { group_size: 32 },
        Encoding::Int4 { group_size: 64 },
        Encoding::Mxfp4,
        Encoding::Mxfp8,
        Encoding::Ggml(GgmlType::Q8_0),
        Encoding::Ggml(GgmlType::Q4_K),
        Encoding::Ggml(GgmlType::Q6_K),
    ];
    // (rows, cols, tokens, label)
    let cases: &[(usize, usize, usize, &str)] = &[
        (1536, 576, 1, "expert gate/up 1536x576"),
        (576, 1536, 1, "down 576x1536"),
        (6144, 2048, 1, "6144x2048"),
        (2048, 1024, 1, "expert down 2048x1024"),
        (1024, 2048, 1, "expert gate/up 1024x2048"),
        (576, 1536, 2, "matmul n=2 576x1536"),
        (576, 1536, 3, "matmul n=3 576x1536"),
        (576, 1536, 4, "matmul n=4 576x1536"),
        (576, 1536, 8, "matmul n=8 576x1536"),
        (1536, 576, 8, "matmul n=8 1536x576"),
        (576, 1536, 16, "matmul n=16 576x1536"),
        // Qwen3.6-35B-A3B's Gated DeltaNet projections in a prefill chunk of 64 tokens
        // (in_proj_qkv 8192x2048, out_proj 2048x4096).
        (8192, 2048, 64, "matmul n=64 8192x2048"),
        (2048, 4096, 64, "matmul n=64 2048x4096"),
        (49152, 576, 1, "lm_head 49152x576"),
        (49152, 576, 8, "lm_head n=8 49152x576"),
    ];
    println!("threads available: {threads}");
    println!(
        "{:<26} {:<9} {:<9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "shape", "encoding", "isa", "1t GB/s", "1t GF/s", "Nt GB/s", "Nt GF/s", "x scalar"
    );
    let mut rng = StdRng::seed_from_u64(1);
    for &(rows, cols, n, label) in cases {
        for enc in encs {
            if let Some(f) = &filter {
                if !enc.name().contains(f.as_str()) {
                    continue;
                }
            }
            if rows == 49152 && !matches!(enc, Encoding::Bf16 | Encoding::Int8) {
                continue;
            }
            if !cols.is_multiple_of(enc.col_multiple()) {
                continue;
            }
            let (data, scale_bytes) = data_for(enc, rows, cols, &mut rng);
            // f32 scale sections are copied into f32 storage (aligned) before viewing.
            let f32_scales: Vec<f32> = scale_bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .collect();
            let w = if matches!(enc, Encoding::Mxfp4 | Encoding::Mxfp8) {
                MatrixView::from_sections(enc, rows, cols, &data, &scale_bytes)
            } else {
                MatrixView::new(enc, rows, cols, &data, &f32_scales)
            }
            .expect("valid sections");
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let mut y = vec![0f32; n * rows];
            let bytes = (data.len() + scale_bytes.len()) as f64;
            let flops = 2.0 * (rows * cols * n) as f64;
            let mut scalar_1t = None;
            for &isa in &isas {
                let mut run = || {
                    if n == 1 {
                        matvec_with(isa, &w, &x, &mut y)
                    } else {
                        matmul_with(isa, &w, &x, n, &mut y)
                    }
                };
                let t1 = pool1.install(|| time(&mut run));
                let tn = time(&mut run);
                let ratio = match isa {
                    Isa::Scalar => {
                        scalar_1t = Some(t1);
                        1.0
                    }
                    Isa::Avx2Fma | Isa::Avx512 => scalar_1t.map_or(f64::NAN, |s| s / t1),
                };
                println!(
                    "{:<26} {:<9} {:<9} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.2}",
                    label,
                    enc.name(),
                    isa.name(),
                    bytes / t1 / 1e9,
                    flops / t1 / 1e9,
                    bytes / tn / 1e9,
                    flops / tn / 1e9,
                    ratio
                );
            }
        }
    }
}
