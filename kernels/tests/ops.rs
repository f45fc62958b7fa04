//! Tests of the small f32 helpers against f64 formulas.

use coli_kernels::{axpy, dot, rms_norm, silu, softmax_inplace};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect()
}

#[test]
fn dot_matches_f64_and_is_order_fixed() {
    for n in [0usize, 1, 7, 8, 9, 64, 1000] {
        let a = random_vec(n, 1 + n as u64);
        let b = random_vec(n, 2 + n as u64);
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        let d = dot(&a, &b);
        assert!(
            (d as f64 - exact).abs() <= (n as f64 + 16.0) * 2f64.powi(-24) * mag,
            "n={n}: {d} vs {exact}"
        );
        assert_eq!(d.to_bits(), dot(&a, &b).to_bits());
    }
}

#[test]
#[should_panic(expected = "length mismatch")]
fn dot_rejects_mismatched_lengths() {
    dot(&[1.0, 2.0], &[1.0]);
}

#[test]
fn rms_norm_matches_formula() {
    let x = random_vec(576, 3);
    let wt = random_vec(576, 4);
    let eps = 1e-5f32;
    let mut out = vec![0f32; 576];
    rms_norm(&x, &wt, eps, &mut out);
    let ms: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 576.0;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    for i in 0..576 {
        let e = wt[i] as f64 * x[i] as f64 * inv;
        assert!(
            (out[i] as f64 - e).abs() <= 1e-6 * (1.0 + e.abs()),
            "{i}: {} vs {e}",
            out[i]
        );
    }
    // A constant vector normalizes to +-1 (times weight).
    let ones = vec![2.0f32; 16];
    let w1 = vec![1.0f32; 16];
    let mut o = vec![0f32; 16];
    rms_norm(&ones, &w1, 0.0, &mut o);
    assert!(o.iter().all(|&v| (v - 1.0).abs() < 1e-6), "{o:?}");
}

#[test]
fn softmax_matches_formula_and_handles_large_values() {
    let mut x = vec![1000.0f32, 1001.0, 999.0, f32::NEG_INFINITY];
    softmax_inplace(&mut x);
    let e = [(-1.0f64).exp(), 1.0, (-2.0f64).exp()];
    let s: f64 = e.iter().sum();
    for i in 0..3 {
        assert!((x[i] as f64 - e[i] / s).abs() < 1e-6, "{x:?}");
    }
    assert_eq!(x[3], 0.0);
    let sum: f32 = x.iter().sum();
    assert!((sum - 1.0).abs() < 1e-6);
    let mut empty: Vec<f32> = vec![];
    softmax_inplace(&mut empty);
    let mut all_masked = vec![f32::NEG_INFINITY; 3];
    softmax_inplace(&mut all_masked);
    assert!(all_masked.iter().all(|v| v.is_nan()));
}

#[test]
fn silu_values() {
    assert_eq!(silu(0.0), 0.0);
    for &v in &[-10.0f32, -1.0, 0.5, 3.0, 20.0] {
        let e = v as f64 / (1.0 + (-(v as f64)).exp());
        assert!((silu(v) as f64 - e).abs() <= 1e-6 * (1.0 + e.abs()), "{v}");
    }
    assert_eq!(silu(-200.0), -0.0);
    assert_eq!(silu(200.0), 200.0);
}

#[test]
fn axpy_adds_scaled_vector() {
    let x = random_vec(13, 5);
    let y0 = random_vec(13, 6);
    let mut y = y0.clone();
    axpy(0.5, &x, &mut y);
    for i in 0..13 {
        assert_eq!(y[i], y0[i] + 0.5 * x[i]);
    }
}

#[test]
fn strided_dots_and_axpys_equal_one_call_per_row_bit_for_bit() {
    use coli_kernels::{axpy_strided, dot_strided};
    let mut seed = 100;
    for d in [1usize, 7, 8, 13, 32, 64, 100, 128, 200] {
        for n in [0usize, 1, 3, 4, 5, 8, 11, 64, 65, 130] {
            for (extra, offset) in [(0usize, 0usize), (5, 3), (d + 9, d + 1)] {
                let stride = d + extra;
                seed += 1;
                // Exactly long enough: the last row ends at the end of `m`.
                let m = random_vec(n.saturating_sub(1) * stride + offset + d, seed);
                let q = random_vec(d, seed + 1000);
                let row = |j: usize| &m[j * stride + offset..j * stride + offset + d];
                let mut got = vec![f32::NAN; n];
                dot_strided(&q, &m, stride, offset, &mut got);
                for (j, g) in got.iter().enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        dot(&q, row(j)).to_bits(),
                        "dot d={d} n={n} j={j}"
                    );
                }
                let p = random_vec(n, seed + 2000);
                let y0 = random_vec(d, seed + 3000);
                let mut want = y0.clone();
                for (j, &pj) in p.iter().enumerate() {
                    axpy(pj, row(j), &mut want);
                }
                let mut y = y0.clone();
                axpy_strided(&p, &m, stride, offset, &mut y);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "axpy d={d} n={n}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "dot_strided")]
fn strided_dot_rejects_a_short_matrix() {
    let mut out = [0f32; 3];
    coli_kernels::dot_strided(&[1.0; 8], &[0.0; 23], 8, 0, &mut out);
}

#[test]
#[should_panic(expected = "axpy_strided")]
fn strided_axpy_rejects_a_short_matrix() {
    let mut y = [0f32; 8];
    coli_kernels::axpy_strided(&[1.0; 3], &[0.0; 23], 8, 0, &mut y);
}
