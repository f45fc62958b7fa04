//! The integer-activation numerics (`Numerics::Q8a`, kernels/src/q8a.rs): every instruction
//! set gives the scalar twin's bits (matvec and matmul, any thread count); the results equal an
//! independent f64 evaluation of the rule (activations quantized here by the rule as written in
//! docs/ENGINE.md, weights decoded by `MatrixView::dequantize_row`) within f32 rounding; other
//! encodings and shapes keep their f32 kernels.

use coli_format::encoding::GgmlType;
use coli_format::{Encoding, MatrixView};
use coli_kernels::{matmul_num, matvec_num, Isa, Numerics};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod numerics;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[derive(Clone)]
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
        let data = match encoding {
            // ggml blocks: gguf-py's test vectors (finite f16 scales), tiled from a seeded
            // offset.
            Encoding::Ggml(t) => {
                let path = concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../tests/fixtures/gguf/vectors/"
                );
                let b = std::fs::read(format!("{path}{}.blocks", t.name())).expect("vectors");
                let skip = (seed as usize % 8) * t.type_size();
                b.iter()
                    .copied()
                    .cycle()
                    .skip(skip)
                    .take(encoding.weight_bytes(rows, cols))
                    .collect()
            }
            _ => (0..encoding.weight_bytes(rows, cols))
                .map(|_| rng.gen())
                .collect(),
        };
        if encoding == Encoding::Mxfp4 {
            // Block scales 2^-10 .. 2^3 (e8m0 117..=130), e8m0 0 (the subnormal 2^-127) now
            // and then.
            let e8m0 = (0..encoding.scale_count(rows, cols))
                .map(|i| {
                    if i % 37 == 5 {
                        0
                    } else {
                        rng.gen_range(117u8..=130)
                    }
                })
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
        if self.encoding == Encoding::Mxfp4 {
            return MatrixView::from_sections(
                self.encoding,
                self.rows,
                self.cols,
                &self.data,
                &self.e8m0,
            )
            .unwrap();
        }
        MatrixView::new(
            self.encoding,
            self.rows,
            self.cols,
            &self.data,
            &self.scales,
        )
        .unwrap()
    }
}

/// `m` in the interleaved row order (`MatrixView::interleave`: weights and scales).
fn interleaved(m: &Mat) -> Mat {
    let mut data = m.data.clone();
    let mx = m.encoding == Encoding::Mxfp4;
    let mut sec: Vec<u8> = if mx {
        m.e8m0.clone()
    } else {
        m.scales.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    MatrixView::interleave(m.encoding, m.rows, m.cols, &mut data, &mut sec);
    let scales = if mx {
        vec![]
    } else {
        sec.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    Mat {
        data,
        scales,
        e8m0: if mx { sec } else { vec![] },
        ..m.clone()
    }
}

/// Activations with the cases the rule names: an all-zero block, a block whose largest value
/// is far above the rest, exact halves after scaling, negative zeros.
fn activations(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
    for t in 0..n {
        let row = &mut x[t * cols..(t + 1) * cols];
        row[..32].fill(0.0);
        row[5] = -0.0;
        if cols >= 64 {
            row[40] = 1000.0;
        }
        if cols >= 128 {
            // amax 127: inv = 1, so 0.5 and 2.5 are exact ties (round to even: 0 and 2).
            let b = &mut row[64..96];
            b.fill(0.25);
            b[0] = 127.0;
            b[1] = 0.5;
            b[2] = 2.5;
            b[3] = -1.5;
        }
    }
    x
}

fn isas() -> Vec<Isa> {
    numerics::isas("integer", coli_kernels::integer_kernel)
}

fn kinds() -> Vec<Encoding> {
    vec![
        Encoding::Int8,
        Encoding::Int4 { group_size: 32 },
        Encoding::Int4 { group_size: 64 },
        Encoding::Int4 { group_size: 128 },
        Encoding::Mxfp4,
        Encoding::Ggml(GgmlType::Q8_0),
        Encoding::Ggml(GgmlType::Q4_0),
        Encoding::Ggml(GgmlType::Q4_1),
        Encoding::Ggml(GgmlType::Q5_0),
        Encoding::Ggml(GgmlType::Q5_1),
        Encoding::Ggml(GgmlType::IQ4_NL),
        Encoding::Ggml(GgmlType::Q2_K),
        Encoding::Ggml(GgmlType::Q3_K),
        Encoding::Ggml(GgmlType::Q4_K),
        Encoding::Ggml(GgmlType::Q5_K),
        Encoding::Ggml(GgmlType::Q6_K),
        Encoding::Ggml(GgmlType::IQ4_XS),
        Encoding::Ggml(GgmlType::IQ2_XXS),
        Encoding::Ggml(GgmlType::IQ2_XS),
        Encoding::Ggml(GgmlType::IQ2_S),
        Encoding::Ggml(GgmlType::IQ3_XXS),
        Encoding::Ggml(GgmlType::IQ3_S),
        Encoding::Ggml(GgmlType::IQ1_S),
        Encoding::Ggml(GgmlType::IQ1_M),
        Encoding::Ggml(GgmlType::MXFP4),
    ]
}

/// Step 1 of the rule, written out again from docs/ENGINE.md: `(d, q)` per block of 32.
fn quantize_rule(x: &[f32]) -> Vec<(f32, [i8; 32])> {
    x.chunks_exact(32)
        .map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let mut q = [0i8; 32];
            if amax == 0.0 {
                return (0.0, q);
            }
            let inv = 127.0f32 / amax;
            for (o, &v) in q.iter_mut().zip(b) {
                let s = v * inv;
                let r = s.round();
                // round half to even
                let r = if (s - s.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
                    r - s.signum()
                } else {
                    r
                };
                *o = r.clamp(-127.0, 127.0) as i8;
            }
            (amax / 127.0f32, q)
        })
        .collect()
}

/// The rule evaluated in f64: `sum_c w_c * d_B(c) * q_c`, and `sum |w_c d q_c|`.
fn reference(w: &MatrixView<'_>, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let qd: Vec<f64> = quantize_rule(x)
        .iter()
        .flat_map(|(d, q)| q.map(|v| *d as f64 * v as f64))
        .collect();
    let mut row = vec![0f32; w.cols()];
    let mut y = Vec::new();
    let mut a = Vec::new();
    for r in 0..w.rows() {
        w.dequantize_row(r, &mut row);
        y.push(row.iter().zip(&qd).map(|(&w, &v)| w as f64 * v).sum());
        a.push(
            row.iter()
                .zip(&qd)
                .map(|(&w, &v)| (w as f64 * v).abs())
                .sum(),
        );
    }
    (y, a)
}

#[test]
fn every_isa_gives_the_scalar_twins_bits_and_the_rules_value() {
    let isas = isas();
    let mut seed = 1;
    for enc in kinds() {
        for (rows, cols) in [
            (1, 64),
            (32, 64),
            (7, 128),
            (33, 576),
            (200, 1536),
            (3, 2048),
            (5, 512),
            (6, 768),
        ] {
            if let Encoding::Int4 { group_size } = enc {
                if cols % group_size as usize != 0 {
                    continue;
                }
            }
            if !cols.is_multiple_of(enc.col_multiple()) {
                continue;
            }
            seed += 1;
            let m = Mat::random(enc, rows, cols, seed);
            let w = m.view();
            // Token counts on both sides of the kernels' switches (one row at a time for one
            // token, q4_0, q4_k, q6_k and iq4_xs read in place up to 4 tokens, tiles of 4
            // tokens; the last two shapes have whole 256-column blocks for the k- and i-quants).
            let n = match rows {
                32 => 16,
                1 => 3,
                7 => 2,
                33 => 4,
                5 => 2,
                6 => 4,
                _ => 7,
            };
            let x = activations(n, cols, seed + 100);
            let mut want: Option<Vec<f32>> = None;
            for &isa in &isas {
                let what = format!("{enc:?} {rows}x{cols} {isa:?}");
                let mut mm = vec![0f32; n * rows];
                matmul_num(isa, Numerics::Q8a, &w, &x, n, &mut mm);
                for t in 0..n {
                    let mut y = vec![0f32; rows];
                    matvec_num(isa, Numerics::Q8a, &w, &x[t * cols..(t + 1) * cols], &mut y);
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        mm[t * rows..(t + 1) * rows]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>(),
                        "{what}: matmul row {t} differs from its matvec"
                    );
                    let (r, a) = reference(&w, &x[t * cols..(t + 1) * cols]);
                    for i in 0..rows {
                        let tol = a[i] * cols as f64 * 2f64.powi(-23) + 1e-30;
                        assert!(
                            (y[i] as f64 - r[i]).abs() <= tol,
                            "{what}: row {i} token {t}: {} vs rule {} (tol {tol})",
                            y[i],
                            r[i]
                        );
                    }
                }
                // The interleaved row order (how the engine keeps resident experts under q8a)
                // gives the same bits, in both numerics.
                if MatrixView::can_interleave(enc, rows, cols) {
                    let iv = interleaved(&m);
                    let wi = iv.view().as_interleaved().unwrap();
                    for num in [Numerics::Q8a, Numerics::Exact] {
                        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                        matmul_num(isa, num, &w, &x, n, &mut a);
                        matmul_num(isa, num, &wi, &x, n, &mut b);
                        assert_eq!(bits(&a), bits(&b), "{what} {num:?}: interleaved matmul");
                        for t in [0, n - 1] {
                            let xt = &x[t * cols..(t + 1) * cols];
                            let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
                            matvec_num(isa, num, &w, xt, &mut a);
                            matvec_num(isa, num, &wi, xt, &mut b);
                            assert_eq!(bits(&a), bits(&b), "{what} {num:?}: interleaved matvec");
                        }
                    }
                }
                match &want {
                    None => want = Some(mm),
                    Some(s) => assert_eq!(
                        s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        mm.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{what}: differs from the scalar twin"
                    ),
                }
            }
        }
    }
}

/// Rule step 2 (revision 5) written out again from docs/ENGINE.md for int8, int4 and mxfp4,
/// on the codes as FORMAT.md stores them: per block of 32 columns the exact integer sum, one
/// `acc = fma(d_B * s, p_B, acc)` block after block (int8: `d_B`, then the row scale at the
/// end). Every instruction set gives these bits, row-major and interleaved, for one token and
/// for several.
#[test]
fn block_accumulation_is_the_rules_order() {
    use coli_format::encoding::mxfp4::{e8m0_half, E2M1_DOUBLED};
    // Shapes: whole 16-word tiles (int4 256 columns: 32 words), a row count in two groups and
    // a tail, int4 and mxfp4 rows whose words are not a multiple of 16 (192 columns: 24), a
    // group of 192; exactly one group of 16 rows whose last 128 columns are 64 (one token of
    // a row-major matrix is reduced per 128 columns in place), a group of 192 and of 320 there.
    for (enc, rows, cols) in [
        (Encoding::Int8, 35, 256),
        (Encoding::Int4 { group_size: 32 }, 35, 256),
        (Encoding::Int4 { group_size: 64 }, 35, 256),
        (Encoding::Int4 { group_size: 128 }, 35, 256),
        (Encoding::Mxfp4, 35, 256),
        (Encoding::Int8, 20, 192),
        (Encoding::Int4 { group_size: 64 }, 20, 192),
        (Encoding::Int4 { group_size: 192 }, 33, 384),
        (Encoding::Mxfp4, 20, 192),
        (Encoding::Int8, 16, 64),
        (Encoding::Int4 { group_size: 192 }, 16, 576),
        (Encoding::Int4 { group_size: 320 }, 16, 320),
        (Encoding::Mxfp4, 16, 320),
    ] {
        let n = 6;
        let m = Mat::random(enc, rows, cols, 77 + rows as u64);
        let x = activations(n, cols, 78);
        let stride = enc.weight_bytes(1, cols);
        let mut want = vec![0f32; n * rows];
        for t in 0..n {
            let blocks = quantize_rule(&x[t * cols..(t + 1) * cols]);
            for r in 0..rows {
                let row = &m.data[r * stride..(r + 1) * stride];
                let w = |c: usize| -> i32 {
                    let nib = if c.is_multiple_of(2) {
                        row[c / 2] & 15
                    } else {
                        row[c / 2] >> 4
                    };
                    match enc {
                        Encoding::Int8 => row[c] as i8 as i32,
                        Encoding::Mxfp4 => E2M1_DOUBLED[nib as usize] as i32,
                        _ => nib as i32 - 8,
                    }
                };
                let mut acc = 0f32;
                for (b, (d, q)) in blocks.iter().enumerate() {
                    let p: i32 = (0..32).map(|i| w(32 * b + i) * q[i] as i32).sum();
                    let mult = match enc {
                        Encoding::Int4 { group_size: g } => {
                            let g = g as usize;
                            d * m.scales[r * (cols / g) + 32 * b / g]
                        }
                        Encoding::Mxfp4 => d * e8m0_half(m.e8m0[r * (cols / 32) + b]),
                        _ => *d,
                    };
                    acc = mult.mul_add(p as f32, acc);
                }
                want[t * rows + r] = if enc == Encoding::Int8 {
                    acc * m.scales[r]
                } else {
                    acc
                };
            }
        }
        let iv = interleaved(&m);
        for isa in isas() {
            for (what, w) in [
                ("row-major", m.view()),
                ("interleaved", iv.view().as_interleaved().unwrap()),
            ] {
                let mut y = vec![0f32; n * rows];
                matmul_num(isa, Numerics::Q8a, &w, &x, n, &mut y);
                assert_eq!(bits(&y), bits(&want), "{enc:?} {isa:?} {what} matmul");
                let mut y = vec![0f32; rows];
                matvec_num(isa, Numerics::Q8a, &w, &x[cols..2 * cols], &mut y);
                assert_eq!(
                    bits(&y),
                    bits(&want[rows..2 * rows]),
                    "{enc:?} {isa:?} {what} matvec"
                );
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let m = Mat::random(Encoding::Int4 { group_size: 64 }, 700, 1024, 9);
    let w = m.view();
    let x = activations(5, 1024, 10);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let isa = coli_kernels::detected_isa();
            let mut y = vec![0f32; 5 * 700];
            matmul_num(isa, Numerics::Q8a, &w, &x, 5, &mut y);
            let mut v = vec![0f32; 700];
            matvec_num(isa, Numerics::Q8a, &w, &x[..1024], &mut v);
            (y, v)
        })
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn close_to_the_exact_product_and_other_matrices_unchanged() {
    let isa = coli_kernels::detected_isa();
    // The integer rule changes results by the activation rounding only (~0.4% of |w||x|).
    let m = Mat::random(Encoding::Int4 { group_size: 64 }, 64, 2048, 3);
    let w = m.view();
    let mut rng = StdRng::seed_from_u64(4);
    let x: Vec<f32> = (0..2048).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let change = numerics::q8a_relative_change(isa, &w, &x);
    assert!(change > 0.0 && change < 0.02, "relative change {change}");
    // bf16 with cols not a multiple of 32 (bf16 otherwise takes bf16 activations:
    // tests/bf16a.rs), int4 with group 16, and cols not a multiple of 64 (int8, mxfp4) keep
    // their f32 kernels.
    for (enc, cols) in [
        (Encoding::Bf16, 48),
        (Encoding::Int4 { group_size: 16 }, 128),
        (Encoding::Int8, 96),
        (Encoding::Mxfp4, 96),
    ] {
        let m = Mat::random(enc, 9, cols, 5);
        let w = m.view();
        let x = activations(1, cols, 6);
        let (mut a, mut b) = (vec![0f32; 9], vec![0f32; 9]);
        matvec_num(isa, Numerics::Exact, &w, &x, &mut a);
        matvec_num(isa, Numerics::Q8a, &w, &x, &mut b);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{enc:?} cols {cols}");
    }
}

#[test]
fn numerics_ids_and_names() {
    for isa in [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512] {
        let e = coli_kernels::numerics_id_with(isa, Numerics::Exact);
        let q = coli_kernels::numerics_id_with(isa, Numerics::Q8a);
        assert_eq!(q, format!("{e}+q8a-r5"));
    }
    assert_eq!(Numerics::parse("q8a"), Ok(Numerics::Q8a));
    assert_eq!(Numerics::parse(" exact "), Ok(Numerics::Exact));
    assert_eq!(Numerics::parse("Q8A"), Ok(Numerics::Q8a));
    assert!(Numerics::parse("int8").unwrap_err().contains("exact"));
}
