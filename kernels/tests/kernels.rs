//! Kernel tests: every encoding and odd shapes, SIMD vs scalar twin vs an f64 reference built
//! from `MatrixView::dequantize_row`; matmul rows bit-identical to matvec; results identical
//! in rayon pools of 1 and 2 threads.

use coli_format::encoding::FP8_BLOCK;
use coli_format::{Encoding, MatrixView};
use coli_kernels::{matmul_with, matvec_with, Isa};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An owned encoded matrix with random content.
struct Mat {
    encoding: Encoding,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    scales: Vec<f32>,
    /// mxfp4's e8m0 scale bytes.
    e8m0: Vec<u8>,
}

impl Mat {
    fn random(encoding: Encoding, rows: usize, cols: usize, seed: u64) -> Mat {
        let mut rng = StdRng::seed_from_u64(seed);
        let nbytes = encoding.weight_bytes(rows, cols);
        let data: Vec<u8> = match encoding {
            Encoding::F32 => (0..rows * cols)
                .flat_map(|_| rng.gen_range(-2.0f32..2.0).to_le_bytes())
                .collect(),
            Encoding::Bf16 => (0..rows * cols)
                .flat_map(|_| {
                    let v: f32 = rng.gen_range(-2.0f32..2.0);
                    ((v.to_bits() >> 16) as u16).to_le_bytes()
                })
                .collect(),
            // Any byte except the two NaN codes 0x7F / 0xFF.
            Encoding::Fp8 | Encoding::Mxfp8 => (0..nbytes)
                .map(|_| loop {
                    let b: u8 = rng.gen();
                    if b & 0x7F != 0x7F {
                        break b;
                    }
                })
                .collect(),
            // int8 and int4: any byte (for odd cols the padding nibble is random too and must
            // be ignored).
            _ => (0..nbytes).map(|_| rng.gen()).collect(),
        };
        assert_eq!(data.len(), nbytes);
        if matches!(encoding, Encoding::Mxfp4 | Encoding::Mxfp8) {
            // Block scales 2^-7 .. 2^2 (e8m0 120..=129); the extremes are tested in coli-format.
            let e8m0 = (0..encoding.scale_count(rows, cols))
                .map(|_| rng.gen_range(120u8..=129))
                .collect();
            return Mat {
                encoding,
                rows,
                cols,
                data,
                scales: vec![],
                e8m0,
            };
        }
        let scales = (0..encoding.scale_count(rows, cols))
            .map(|_| rng.gen_range(0.001f32..0.1) * if rng.gen() { 1.0 } else { -1.0 })
            .collect();
        Mat {
            encoding,
            rows,
            cols,
            data,
            scales,
            e8m0: vec![],
        }
    }

    fn view(&self) -> MatrixView<'_> {
        if matches!(self.encoding, Encoding::Mxfp4 | Encoding::Mxfp8) {
            return MatrixView::from_sections(
                self.encoding,
                self.rows,
                self.cols,
                &self.data,
                &self.e8m0,
            )
            .expect("sections of the encoding's sizes");
        }
        MatrixView::new(
            self.encoding,
            self.rows,
            self.cols,
            &self.data,
            &self.scales,
        )
        .expect("sections of the encoding's sizes")
    }
}

fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    if Isa::Avx2Fma.supported() {
        v.push(Isa::Avx2Fma);
        if Isa::Avx512.supported() {
            v.push(Isa::Avx512);
        } else {
            eprintln!(
                "AVX-512F not available: the AVX-512 int4, int8 and mxfp4 kernels are not tested here"
            );
        }
    } else {
        eprintln!("AVX2+FMA not available: testing the scalar kernels only");
    }
    v
}

fn encodings() -> Vec<Encoding> {
    vec![
        Encoding::F32,
        Encoding::Bf16,
        Encoding::Fp8,
        Encoding::Int8,
        Encoding::Int4 { group_size: 32 },
        Encoding::Int4 { group_size: 64 },
        Encoding::Int4 { group_size: 128 },
        Encoding::Int4 { group_size: 2 },
        Encoding::Int4 { group_size: 6 },
        Encoding::Int4 { group_size: 24 },
        Encoding::Mxfp4,
        Encoding::Mxfp8,
    ]
}

/// (rows, cols): tiny, odd, not multiples of 8 / group sizes / 128 (fp8 edge blocks).
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 7),
    (5, 8),
    (2, 9),
    (17, 33),
    (4, 64),
    (9, 100),
    (130, 257),
    (129, 128),
    (7, 300),
    // Multiples of 32 and of the int4 group sizes: the AVX2 int4 fast path (group scale
    // applied once per group).
    (6, 192),
    (3, 576),
    (2, 1024),
];

/// Reference `y = W x` in f64 from the store's `dequantize_row`, plus `sum |w x|` per row.
fn reference(w: &MatrixView<'_>, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut row = vec![0f32; w.cols()];
    let mut y = Vec::with_capacity(w.rows());
    let mut mag = Vec::with_capacity(w.rows());
    for r in 0..w.rows() {
        w.dequantize_row(r, &mut row);
        let (mut s, mut m) = (0f64, 0f64);
        for (&a, &b) in row.iter().zip(x) {
            s += a as f64 * b as f64;
            m += (a as f64 * b as f64).abs();
        }
        y.push(s);
        mag.push(m);
    }
    (y, mag)
}

/// Tolerance of an f32 dot product of `cols` terms relative to `sum |w x|`. Every kernel decodes
/// each weight exactly as `dequantize_row` (one f32 rounding of code * scale, checked by
/// `unit_vectors_extract_exact_weights`), so the only error is f32 summation: at most
/// about `depth * 2^-24 * sum |w x|`, with depth < cols / 8 + 16 for the blocked sums used.
/// A tolerance of `(cols + 16) * 2^-24` relative is therefore safe and still tight.
fn tolerance(cols: usize) -> f64 {
    (cols as f64 + 16.0) * (2.0f64).powi(-24)
}

#[test]
fn matvec_matches_reference_for_every_encoding_and_isa() {
    for (ei, &enc) in encodings().iter().enumerate() {
        for (si, &(rows, cols)) in SHAPES.iter().enumerate() {
            let m = Mat::random(enc, rows, cols, (ei * 100 + si) as u64);
            let w = m.view();
            let x = random_vec(cols, 7 + si as u64);
            let (yref, mag) = reference(&w, &x);
            for isa in isas() {
                let mut y = vec![f32::NAN; rows];
                matvec_with(isa, &w, &x, &mut y);
                for r in 0..rows {
                    let err = (y[r] as f64 - yref[r]).abs();
                    let tol = tolerance(cols) * mag[r] + 1e-30;
                    assert!(
                        err <= tol,
                        "{} {isa:?} [{rows}, {cols}] row {r}: got {}, reference {}, err {err:e} > tol {tol:e}",
                        enc.name(),
                        y[r],
                        yref[r]
                    );
                }
            }
        }
    }
}

#[test]
fn unit_vectors_extract_exact_weights() {
    // W e_j = column j: exercises each column's decode exactly (including group / block
    // boundaries, the last partial chunk and the int4 padding nibble) against dequantize_row.
    for (ei, &enc) in encodings().iter().enumerate() {
        for &(rows, cols) in &[(3usize, 37usize), (130, 139), (2, 8), (3, 256)] {
            let m = Mat::random(enc, rows, cols, 1000 + ei as u64);
            let w = m.view();
            let mut dense = vec![0f32; rows * cols];
            for r in 0..rows {
                w.dequantize_row(r, &mut dense[r * cols..(r + 1) * cols]);
            }
            for isa in isas() {
                for j in 0..cols {
                    let mut x = vec![0f32; cols];
                    x[j] = 1.0;
                    let mut y = vec![f32::NAN; rows];
                    matvec_with(isa, &w, &x, &mut y);
                    for r in 0..rows {
                        assert_eq!(
                            y[r],
                            dense[r * cols + j],
                            "{} {isa:?} [{rows}, {cols}] W[{r}, {j}]",
                            enc.name()
                        );
                    }
                }
            }
        }
    }
}

/// The MXFP4 fast paths (cols a multiple of 32) over every e8m0 exponent whose products stay
/// finite (0..=250: `6 * 2^123` at most; 0 gives `2^-127`, a subnormal scale) and every e2m1
/// code: `W e_j` is column j exactly as the reference decodes it (`e2m1 * 2^(e - 127)`), on
/// every instruction set; then random activations within the f64 reference's bound.
#[test]
fn mxfp4_every_exponent_and_code() {
    let (rows, cols) = (9usize, 256usize);
    let mut m = Mat::random(Encoding::Mxfp4, rows, cols, 4242);
    for (k, e) in m.e8m0.iter_mut().enumerate() {
        *e = ((k * 37) % 251) as u8;
    }
    m.e8m0[0] = 0;
    m.e8m0[1] = 250;
    // Every code appears in every row: byte j of a row holds codes (j % 16, (j / 16) % 16).
    for (j, b) in m.data.iter_mut().enumerate() {
        let j = j % (cols / 2);
        *b = ((j % 16) | (((j / 16) % 16) << 4)) as u8;
    }
    let w = m.view();
    let mut dense = vec![0f32; rows * cols];
    for r in 0..rows {
        w.dequantize_row(r, &mut dense[r * cols..(r + 1) * cols]);
    }
    for isa in isas() {
        for j in 0..cols {
            let mut x = vec![0f32; cols];
            x[j] = 1.0;
            let mut y = vec![f32::NAN; rows];
            matvec_with(isa, &w, &x, &mut y);
            for r in 0..rows {
                // Value equality: a sum starting at +0 turns the code -0 into +0.
                assert_eq!(
                    y[r],
                    dense[r * cols + j],
                    "{isa:?} W[{r}, {j}] (e8m0 {})",
                    m.e8m0[r * (cols / 32) + j / 32]
                );
            }
        }
    }
    // Random activations on scales near 2^0 (the exponents above span 2^-127..2^123, whose
    // products no f32 sum holds in one row).
    for e in m.e8m0.iter_mut() {
        *e = 120 + *e % 10;
    }
    let w = m.view();
    let x = random_vec(cols, 5);
    let (yref, mag) = reference(&w, &x);
    for isa in isas() {
        let mut y = vec![f32::NAN; rows];
        matvec_with(isa, &w, &x, &mut y);
        for r in 0..rows {
            let err = (y[r] as f64 - yref[r]).abs();
            assert!(
                err <= tolerance(cols) * mag[r],
                "{isa:?} row {r}: err {err:e}"
            );
        }
    }
}

#[test]
fn matmul_rows_are_bit_identical_to_matvec() {
    for (ei, &enc) in encodings().iter().enumerate() {
        // Wide matrices make the AVX-512 kernels take smaller token tiles (an L1 budget for
        // the activations): 2048 columns give int4 tiles of 3, 6400 tiles of 1.
        for &(rows, cols) in &[
            (5usize, 37usize),
            (19, 128),
            (130, 257),
            (7, 384),
            (3, 2048),
            (2, 6400),
            // Token tiles of 2 and 6 with a remaining 8-column chunk and a 5-column tail; the
            // second with 19 rows per parallel task.
            (37, 2085),
            (150, 1005),
        ] {
            let m = Mat::random(enc, rows, cols, 2000 + ei as u64);
            let w = m.view();
            for isa in isas() {
                for n in [1usize, 2, 3, 4, 5, 7, 8, 9, 11, 16] {
                    let x = random_vec(n * cols, 50 + n as u64);
                    let mut y = vec![f32::NAN; n * rows];
                    matmul_with(isa, &w, &x, n, &mut y);
                    for t in 0..n {
                        let mut yv = vec![f32::NAN; rows];
                        matvec_with(isa, &w, &x[t * cols..(t + 1) * cols], &mut yv);
                        for r in 0..rows {
                            assert_eq!(
                                y[t * rows + r].to_bits(),
                                yv[r].to_bits(),
                                "{} {isa:?} [{rows}, {cols}] n={n} token {t} row {r}",
                                enc.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The AVX-512 bf16, fp8 and mxfp8 kernels hold AVX2's four 8-lane accumulators as two
/// 16-lane ones: their results are the AVX2 kernels' bit for bit, matvec and matmul alike.
#[test]
fn avx512_bf16_fp8_mxfp8_equal_avx2_bit_for_bit() {
    if !Isa::Avx512.supported() {
        eprintln!("AVX-512F not available: the AVX-512 bf16/fp8/mxfp8 kernels are not tested here");
        return;
    }
    // cols / 8 % 4 (the 8-column chunks after the last group of four) is 0..=3 across these.
    for &(rows, cols) in &[
        (5usize, 37usize),
        (6, 48),
        (4, 56),
        (3, 90),
        (9, 100),
        (130, 257),
        (7, 576),
        (3, 2056),
        (40, 3080),
        // fp8: rows past one 128-row block, columns past one 128-column block.
        (133, 300),
    ] {
        for enc in [Encoding::Bf16, Encoding::Fp8, Encoding::Mxfp8] {
            let m = Mat::random(enc, rows, cols, 4000 + cols as u64);
            let w = m.view();
            let name = enc.name();
            for n in [1usize, 2, 5, 8, 13] {
                let x = random_vec(n * cols, 70 + n as u64);
                let mut a = vec![f32::NAN; n * rows];
                let mut b = vec![f32::NAN; n * rows];
                matmul_with(Isa::Avx2Fma, &w, &x, n, &mut a);
                matmul_with(Isa::Avx512, &w, &x, n, &mut b);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{name} [{rows}, {cols}] n={n}");
                let (mut va, mut vb) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                matvec_with(Isa::Avx2Fma, &w, &x[..cols], &mut va);
                matvec_with(Isa::Avx512, &w, &x[..cols], &mut vb);
                assert_eq!(bits(&va), bits(&vb), "{name} matvec [{rows}, {cols}]");
            }
        }
    }
}

/// Runs `f` inside a dedicated rayon pool of `k` threads.
fn in_pool<R: Send>(k: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(k)
        .build()
        .expect("rayon pool")
        .install(f)
}

#[test]
fn results_do_not_depend_on_thread_count() {
    // Big enough to take the parallel path (several row chunks).
    for (rows, cols, n) in [(300usize, 515usize, 6usize), (300, 512, 5)] {
        for (ei, enc) in [
            Encoding::Bf16,
            Encoding::Fp8,
            Encoding::Int8,
            Encoding::Int4 { group_size: 32 },
            Encoding::Int4 { group_size: 64 },
            Encoding::F32,
            Encoding::Mxfp4,
        ]
        .into_iter()
        .enumerate()
        {
            let m = Mat::random(enc, rows, cols, 3000 + ei as u64);
            let w = m.view();
            let x = random_vec(n * cols, 99);
            for isa in isas() {
                let run = || {
                    let mut yv = vec![0f32; rows];
                    matvec_with(isa, &w, &x[..cols], &mut yv);
                    let mut ym = vec![0f32; n * rows];
                    matmul_with(isa, &w, &x, n, &mut ym);
                    (yv, ym)
                };
                let one = in_pool(1, run);
                let two = in_pool(2, run);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&one.0), bits(&two.0), "{} {isa:?} matvec", enc.name());
                assert_eq!(bits(&one.1), bits(&two.1), "{} {isa:?} matmul", enc.name());
                assert_eq!(
                    bits(&one.0),
                    bits(&one.1[..rows]),
                    "{} {isa:?} matmul row 0",
                    enc.name()
                );
            }
        }
    }
}

#[test]
fn degenerate_shapes() {
    for isa in isas() {
        // cols = 0: every output is an empty sum.
        let w = MatrixView::new(Encoding::Int8, 3, 0, &[], &[1.0, 2.0, 3.0]).unwrap();
        let mut y = vec![f32::NAN; 3];
        matvec_with(isa, &w, &[], &mut y);
        assert_eq!(y, vec![0.0; 3]);
        // n = 0 tokens.
        let m = Mat::random(Encoding::Bf16, 4, 9, 1);
        matmul_with(isa, &m.view(), &[], 0, &mut []);
    }
}

#[test]
fn fp8_nan_codes_propagate() {
    let rows = 2;
    let cols = 20;
    let mut m = Mat::random(Encoding::Fp8, rows, cols, 5);
    m.data[cols + 17] = 0x7F; // row 1, column 17 (in the last partial chunk)
    m.data[3] = 0xFF; // row 0, column 3 (in a full chunk)
    assert_eq!(m.scales.len(), 1);
    assert_eq!(FP8_BLOCK, 128);
    let x = random_vec(cols, 3);
    for isa in isas() {
        let mut y = vec![0f32; rows];
        matvec_with(isa, &m.view(), &x, &mut y);
        assert!(y[0].is_nan() && y[1].is_nan(), "{isa:?}: {y:?}");
    }
}

#[test]
#[should_panic(expected = "x has")]
fn matvec_rejects_wrong_x_length() {
    let m = Mat::random(Encoding::Bf16, 4, 9, 1);
    let mut y = vec![0f32; 4];
    matvec_with(Isa::Scalar, &m.view(), &[0.0; 8], &mut y);
}

/// Malformed sections never reach a kernel: the view's constructor refuses them.
#[test]
fn views_with_wrong_section_lengths_are_refused() {
    let m = Mat::random(Encoding::Int4 { group_size: 32 }, 4, 9, 1);
    let e = MatrixView::new(m.encoding, 4, 9, &m.data[..m.data.len() - 1], &m.scales)
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight section"), "{e}");
    let m = Mat::random(Encoding::Fp8, 130, 9, 1);
    let e = MatrixView::new(m.encoding, 130, 9, &m.data, &m.scales[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("scales"), "{e}");
}

#[test]
fn default_entry_points_use_the_detected_isa() {
    let isa = coli_kernels::detected_isa();
    assert!(isa.supported());
    let (rows, cols, n) = (40usize, 77usize, 3usize);
    let m = Mat::random(Encoding::Int4 { group_size: 32 }, rows, cols, 77);
    let w = m.view();
    let x = random_vec(n * cols, 78);
    let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
    coli_kernels::matvec(&w, &x[..cols], &mut a);
    matvec_with(isa, &w, &x[..cols], &mut b);
    assert_eq!(a, b);
    let (mut c, mut d) = (vec![0f32; n * rows], vec![0f32; n * rows]);
    coli_kernels::matmul(&w, &x, n, &mut c);
    matmul_with(isa, &w, &x, n, &mut d);
    assert_eq!(c, d);
}

/// Every token of a matmul of many tokens (several blocks of the result's untransposition, the
/// last partial, large enough to run it on the pool) is its own matvec bit for bit, under both
/// numerics.
#[test]
fn matmul_of_many_tokens_is_each_tokens_matvec() {
    use coli_kernels::{matmul_num, matvec_num, Numerics};
    let (rows, cols, n) = (2048usize, 64usize, 37usize);
    for (ei, enc) in [
        Encoding::Bf16,
        Encoding::Int8,
        Encoding::Int4 { group_size: 64 },
    ]
    .into_iter()
    .enumerate()
    {
        let m = Mat::random(enc, rows, cols, 7000 + ei as u64);
        let w = m.view();
        let x = random_vec(n * cols, 17);
        for isa in isas() {
            for num in [Numerics::Exact, Numerics::Q8a] {
                let mut ym = vec![0f32; n * rows];
                matmul_num(isa, num, &w, &x, n, &mut ym);
                let mut yv = vec![0f32; rows];
                for t in 0..n {
                    matvec_num(isa, num, &w, &x[t * cols..(t + 1) * cols], &mut yv);
                    let row = &ym[t * rows..(t + 1) * rows];
                    assert!(
                        row.iter().zip(&yv).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} {isa:?} {num:?} token {t}",
                        enc.name()
                    );
                }
            }
        }
    }
}

/// A `[rows, cols]` ggml matrix tiled from gguf-py's test blocks (finite f16 scales), and the
/// same matrix decoded to f32 by the reference decode.
fn ggml_pair(t: coli_format::encoding::GgmlType, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/gguf/vectors/"
    );
    let blocks = std::fs::read(format!("{path}{}.blocks", t.name())).expect("vectors");
    let enc = Encoding::Ggml(t);
    let data: Vec<u8> = blocks
        .iter()
        .copied()
        .cycle()
        .take(enc.weight_bytes(rows, cols))
        .collect();
    let w = MatrixView::new(enc, rows, cols, &data, &[]).unwrap();
    let mut f = Vec::with_capacity(rows * cols * 4);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        w.dequantize_row(r, &mut row);
        f.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    (data, f)
}

#[test]
fn ggml_types_give_the_products_of_their_decoded_rows_on_every_isa() {
    // Each instruction set sums a ggml matrix's weights exactly as it sums the same weights
    // stored as f32 (the AVX2 sources of q8_0, q4_0, q4_k and q6_k decode in registers; the other
    // types decode the row first): bit for bit, matvec and matmul.
    for t in coli_format::encoding::ggml::ALL {
        let (rows, cols) = (5, 512);
        let (data, f) = ggml_pair(t, rows, cols);
        let w = MatrixView::new(Encoding::Ggml(t), rows, cols, &data, &[]).unwrap();
        let wf = MatrixView::new(Encoding::F32, rows, cols, &f, &[]).unwrap();
        for isa in isas() {
            for n in [1usize, 3, 8] {
                let x = random_vec(n * cols, 11 + n as u64);
                let (mut y, mut yf) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                coli_kernels::matmul_with(isa, &w, &x, n, &mut y);
                coli_kernels::matmul_with(isa, &wf, &x, n, &mut yf);
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    y.iter().map(|v| v.to_bits()).collect(),
                    yf.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(a, b, "{} {isa:?} n={n}", t.name());
            }
            // Unit vectors pick out single weights: each equals the reference decode.
            for c in [0, 7, 31, 32, 100, 255, 256, 300, 511] {
                let mut x = vec![0f32; cols];
                x[c] = 1.0;
                let mut y = vec![0f32; rows];
                matvec_with(isa, &w, &x, &mut y);
                for r in 0..rows {
                    let want = f32::from_le_bytes(f[(r * cols + c) * 4..][..4].try_into().unwrap());
                    assert_eq!(
                        y[r].to_bits(),
                        (want + 0.0).to_bits(),
                        "{} {isa:?} [{r}][{c}]",
                        t.name()
                    );
                }
            }
        }
    }
}
