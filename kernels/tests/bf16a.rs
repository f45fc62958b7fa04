//! The bf16-activation rule (`Numerics::Q8a` on bf16 matrices, kernels/src/bf16a.rs, revision 4
//! of the numerics): every instruction set (AVX-512 BF16 `vdpbf16ps`, the AVX2 emulation, the
//! scalar twin) gives the same bits, equal to the rule as docs/ENGINE.md writes it, evaluated
//! here independently (each fused step in f64, tininess decided on the exact value); a
//! token's result is the same in any tile and with any thread count; subnormal, tiny, zero,
//! infinite and NaN operands included.

use coli_format::{Encoding, MatrixView};
use coli_kernels::{matmul_num, matvec_num, Isa, Numerics};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A bf16 pattern: mostly values of magnitude 2^-8 .. 2^2, now and then the cases the rule
/// names (zeros of both signs, subnormals, values near the 2^-126 boundary, large values).
fn pattern(rng: &mut StdRng, special: bool) -> u16 {
    let sign = if rng.gen() { 0x8000 } else { 0 };
    let mant: u16 = rng.gen_range(0..128);
    let exp: u16 = if special && rng.gen_range(0..6) == 0 {
        match rng.gen_range(0..5) {
            0 => 0,                     // zero or subnormal
            1 => rng.gen_range(1..4),   // just above 2^-126
            2 => rng.gen_range(55..70), // products near 2^-126
            3 => rng.gen_range(180..200),
            _ => return sign, // a signed zero
        }
    } else {
        rng.gen_range(119..129)
    };
    sign | (exp << 7) | mant
}

fn bf16_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The rule as docs/ENGINE.md writes it, evaluated in f64.
mod rule {
    use super::bf16_f32;

    /// Step 1 by comparing the two bf16 neighbours of `x` (ties to the even one).
    pub fn round(x: f32) -> u16 {
        if x.is_nan() {
            return ((x.to_bits() >> 16) as u16) | 0x40;
        }
        if x.is_subnormal() {
            return ((x.to_bits() >> 16) as u16) & 0x8000;
        }
        let lo = (x.to_bits() >> 16) as u16;
        if x.is_infinite() || (x.to_bits() & 0xffff) == 0 {
            return lo;
        }
        let hi = lo + 1; // the next bf16 away from zero (may be infinity)
                         // Past the largest finite bf16, the next value is 2^128 (rounding there gives
                         // infinity).
        let hv = if bf16_f32(hi).is_infinite() {
            2f64.powi(128).copysign(x as f64)
        } else {
            bf16_f32(hi) as f64
        };
        let (dl, dh) = (
            (x as f64 - bf16_f32(lo) as f64).abs(),
            (hv - x as f64).abs(),
        );
        if dl < dh || (dl == dh && lo.is_multiple_of(2)) {
            lo
        } else {
            hi
        }
    }

    fn daz(v: f32) -> f32 {
        if v != 0.0 && v.abs() < f32::MIN_POSITIVE {
            0f32.copysign(v)
        } else {
            v
        }
    }

    /// One fused step: the exact `c + a b`, zero of its sign if tiny, else rounded once.
    fn step(a: f32, b: f32, c: f32) -> f32 {
        let (a, b, c) = (daz(a), daz(b), daz(c));
        let exact = c as f64 + a as f64 * b as f64;
        let r = a.mul_add(b, c);
        if r.is_nan() || r.is_infinite() {
            return r;
        }
        if exact != 0.0 && exact.abs() < f32::MIN_POSITIVE as f64 {
            return 0f32.copysign(exact as f32);
        }
        r
    }

    /// Steps 2-4 for one row (bf16 patterns) and one token (rounded patterns).
    pub fn dot(w: &[u16], x: &[u16]) -> f32 {
        let mut acc = [0f32; 16];
        for (wk, xk) in w.chunks_exact(32).zip(x.chunks_exact(32)) {
            for (i, a) in acc.iter_mut().enumerate() {
                let o = step(bf16_f32(wk[2 * i + 1]), bf16_f32(xk[2 * i + 1]), *a);
                *a = step(bf16_f32(wk[2 * i]), bf16_f32(xk[2 * i]), o);
            }
        }
        let v8: Vec<f32> = (0..8).map(|i| acc[i] + acc[i + 8]).collect();
        let v4: Vec<f32> = (0..4).map(|i| v8[i] + v8[i + 4]).collect();
        let v2: Vec<f32> = (0..2).map(|i| v4[i] + v4[i + 2]).collect();
        v2[0] + v2[1]
    }
}

struct Case {
    rows: usize,
    cols: usize,
    w: Vec<u16>,
    bytes: Vec<u8>,
}

impl Case {
    fn new(rows: usize, cols: usize, seed: u64, special: bool) -> Case {
        let mut rng = StdRng::seed_from_u64(seed);
        let w: Vec<u16> = (0..rows * cols)
            .map(|_| pattern(&mut rng, special))
            .collect();
        let bytes = w.iter().flat_map(|b| b.to_le_bytes()).collect();
        Case {
            rows,
            cols,
            w,
            bytes,
        }
    }

    fn view(&self) -> MatrixView<'_> {
        MatrixView::new(Encoding::Bf16, self.rows, self.cols, &self.bytes, &[]).unwrap()
    }
}

/// Activations: mostly of magnitude 2^-8 .. 2^2 (as f32, rounded by the rule), with the
/// special cases in some tokens (`special`), an all-zero token, and a NaN / infinity token.
fn activations(n: usize, cols: usize, seed: u64, special: bool) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut x: Vec<f32> = (0..n * cols)
        .map(|_| {
            let sp = special && rng.gen_range(0..3) == 0;
            let b = pattern(&mut rng, sp);
            // Low bits below bf16's, so the rounding matters (ties included).
            let low: u32 = match rng.gen_range(0..4) {
                0 => 0x8000,
                1 => 0,
                _ => rng.gen_range(0..0x10000),
            };
            f32::from_bits(((b as u32) << 16) | low)
        })
        .collect();
    if special && n >= 3 {
        x[cols..2 * cols].fill(0.0);
        x[2 * cols + 3] = f32::NAN;
        x[2 * cols + 40] = f32::INFINITY;
        // Subnormal f32 activations, one of which rounds up to the smallest normal bf16 when
        // it is not flushed first.
        x[7] = f32::from_bits(0x007f_ffff);
        x[8] = f32::from_bits(0x8000_0001);
    }
    x
}

fn isas() -> Vec<Isa> {
    let v: Vec<Isa> = [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512]
        .into_iter()
        .filter(|i| i.supported())
        .collect();
    eprintln!(
        "bf16 kernels tested: {:?}",
        v.iter()
            .map(|&i| coli_kernels::bf16_kernel(i))
            .collect::<Vec<_>>()
    );
    v
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn every_isa_gives_the_rules_bits() {
    // Shapes: 4-row tiles and remainders, token tiles of 6 and remainders, one chunk of 32.
    let shapes = [
        (13, 64, 1),
        (13, 64, 7),
        (9, 32, 13),
        (8, 256, 6),
        (6, 2048, 2),
        (40, 1024, 11),
    ];
    for (si, &(rows, cols, n)) in shapes.iter().enumerate() {
        for special in [false, true] {
            let c = Case::new(rows, cols, 100 + si as u64, special);
            let w = c.view();
            let x = activations(n, cols, 200 + si as u64, special);
            let xr: Vec<u16> = x.iter().map(|&v| rule::round(v)).collect();
            let want: Vec<f32> = (0..n)
                .flat_map(|t| {
                    let xt = &xr[t * cols..(t + 1) * cols];
                    (0..rows)
                        .map(|r| rule::dot(&c.w[r * cols..(r + 1) * cols], xt))
                        .collect::<Vec<_>>()
                })
                .collect();
            for isa in isas() {
                let mut y = vec![0f32; n * rows];
                matmul_num(isa, Numerics::Q8a, &w, &x, n, &mut y);
                let mut y1 = vec![0f32; rows];
                for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        same(*a, *b),
                        "{isa:?} {rows}x{cols} n={n} special={special} token {} row {}: {a:e} ({:08x}) != rule {b:e} ({:08x})",
                        i / rows,
                        i % rows,
                        a.to_bits(),
                        b.to_bits()
                    );
                }
                for t in 0..n {
                    matvec_num(
                        isa,
                        Numerics::Q8a,
                        &w,
                        &x[t * cols..(t + 1) * cols],
                        &mut y1,
                    );
                    for (r, a) in y1.iter().enumerate() {
                        assert!(
                            same(*a, y[t * rows + r]),
                            "{isa:?} {rows}x{cols}: matvec of token {t} row {r} differs from the matmul"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_flush_boundary_and_signed_zeros() {
    // One row, one token, built so each lane hits a case: 2^-126 - 2^-150 (flushed: tiny
    // before rounding), x - x (+0), -0 products into a -0 accumulator (-0), a subnormal weight
    // (read as zero).
    let cols = 32;
    let t75 = ((127 - 75) << 7) as u16; // 2^-75
    let mut w = vec![0u16; cols];
    let mut x = vec![0f32; cols];
    // lane 0: odd column 1 = 2^-63 * 2^-63 = 2^-126; even column 0 = 2^-75 * -2^-75.
    let t63 = ((127 - 63) << 7) as u16;
    w[1] = t63;
    x[1] = bf16_f32(t63);
    w[0] = t75;
    x[0] = -bf16_f32(t75);
    // lane 1: 1 * 1 then 1 * -1: +0.
    w[3] = 0x3f80;
    x[3] = 1.0;
    w[2] = 0x3f80;
    x[2] = -1.0;
    // lane 2: -0 weight times 1, then 0 times -1: -0 + (-0) = -0.
    w[5] = 0x8000;
    x[5] = 1.0;
    w[4] = 0x0000;
    x[4] = -1.0;
    // lane 3: a subnormal weight (0x0001) times 2^100: zero, not 2^-33.
    w[7] = 0x0001;
    x[7] = 2f32.powi(100);
    // Row 1: the same without the subnormal weight (every weight normal or zero).
    let mut w1 = w.clone();
    w1[7] = 0;
    w.extend_from_slice(&w1);
    let bytes: Vec<u8> = w.iter().flat_map(|b| b.to_le_bytes()).collect();
    let m = MatrixView::new(Encoding::Bf16, 2, cols, &bytes, &[]).unwrap();
    let xr: Vec<u16> = x.iter().map(|&v| rule::round(v)).collect();
    for r in 0..2 {
        let want = rule::dot(&w[r * cols..(r + 1) * cols], &xr);
        assert_eq!(want.to_bits(), 0, "the rule's own value, row {r}");
    }
    for isa in isas() {
        let mut y = [1f32; 2];
        matvec_num(isa, Numerics::Q8a, &m, &x, &mut y);
        assert_eq!([y[0].to_bits(), y[1].to_bits()], [0, 0], "{isa:?}");
    }
    // Without the flush, lane 0 would hold 2^-126 and the sum would not be zero.
    let mut x2 = x.clone();
    x2[0] = 0.0;
    let mut y = [0f32; 2];
    matvec_num(Isa::Scalar, Numerics::Q8a, &m, &x2, &mut y);
    assert_eq!(y, [f32::MIN_POSITIVE; 2]);
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let c = Case::new(300, 1024, 7, false);
    let w = c.view();
    let x = activations(9, 1024, 8, false);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut y = vec![0f32; 9 * 300];
            matmul_num(
                coli_kernels::detected_isa(),
                Numerics::Q8a,
                &w,
                &x,
                9,
                &mut y,
            );
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        })
    };
    assert_eq!(run(1), run(2));
}

#[test]
fn close_to_the_exact_product_and_other_bf16_shapes_unchanged() {
    let isa = coli_kernels::detected_isa();
    let c = Case::new(64, 2048, 3, false);
    let w = c.view();
    let mut rng = StdRng::seed_from_u64(4);
    let x: Vec<f32> = (0..2048).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let (mut a, mut b) = (vec![0f32; 64], vec![0f32; 64]);
    matvec_num(isa, Numerics::Exact, &w, &x, &mut a);
    matvec_num(isa, Numerics::Q8a, &w, &x, &mut b);
    let norm = a.iter().map(|v| v * v).sum::<f32>().sqrt();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).powi(2))
        .sum::<f32>()
        .sqrt();
    // Activations move by at most 2^-9 of themselves.
    assert!(
        diff > 0.0 && diff / norm < 4e-3,
        "relative change {}",
        diff / norm
    );
    // cols not a multiple of 32: the f32 kernel.
    let c = Case::new(5, 48, 5, false);
    let w = c.view();
    let x = activations(1, 48, 6, false);
    let (mut a, mut b) = (vec![0f32; 5], vec![0f32; 5]);
    matvec_num(isa, Numerics::Exact, &w, &x, &mut a);
    matvec_num(isa, Numerics::Q8a, &w, &x, &mut b);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn rounding_matches_the_rule() {
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..200_000 {
        let v = f32::from_bits(rng.gen());
        let (a, b) = (coli_kernels::round_bf16(v), rule::round(v));
        assert!(
            a == b || (bf16_f32(a).is_nan() && bf16_f32(b).is_nan()),
            "{v:e} ({:08x}): {a:04x} != {b:04x}",
            v.to_bits()
        );
    }
}
