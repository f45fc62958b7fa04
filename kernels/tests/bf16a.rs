//! The bf16-activation rule (`Numerics::Q8a` on bf16 matrices, kernels/src/bf16a.rs, revision 4
//! of the numerics): every instruction set (AVX-512 BF16 `vdpbf16ps`, the AVX2 emulation, the
//! scalar twin) gives the same bits, equal to the rule as docs/ENGINE.md writes it, evaluated
//! here independently (each fused step's tininess decided by exact integer arithmetic); a
//! token's result is the same in any tile and with any thread count; subnormal, tiny, zero,
//! infinite and NaN operands included.

use coli_format::{Encoding, MatrixView};
use coli_kernels::{matmul_num, matvec_num, Isa, Numerics};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod numerics;

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

    /// A nonzero finite normal f32 as `m * 2^e` (m a 24-bit integer with its sign).
    fn parts(v: f32) -> (i128, i32) {
        let b = v.to_bits();
        let m = ((b & 0x7f_ffff) | 0x80_0000) as i128;
        let e = ((b >> 23) & 0xff) as i32 - 150;
        (if v < 0.0 { -m } else { m }, e)
    }

    /// Whether the exact `c + a b` is tiny as IEEE 754 defines it after rounding: nonzero and,
    /// rounded to 24 significant bits (nearest even) with an unbounded exponent, below 2^-126.
    /// Exact integer arithmetic (the operands are normal or zero here).
    fn tiny(a: f32, b: f32, c: f32) -> bool {
        let mut terms = Vec::new();
        if a != 0.0 && b != 0.0 {
            let ((ma, ea), (mb, eb)) = (parts(a), parts(b));
            terms.push((ma * mb, ea + eb));
        }
        if c != 0.0 {
            terms.push(parts(c));
        }
        let (m, e) = match terms.as_slice() {
            [] => return false,
            [t] => *t,
            [(m1, e1), (m2, e2)] => {
                let e = (*e1).min(*e2);
                let (s1, s2) = (e1 - e, e2 - e);
                if s1.max(s2) > 60 {
                    // The smaller term (at most 48 bits) is below 2^-12 of the larger one's unit,
                    // less than half an ulp of it at 24 bits, and the larger has at most 24
                    // significant bits (a bf16 product has 16, an accumulator 24): the sum
                    // rounds back to the larger term.
                    let (big, eb) = if s1 > s2 { (*m1, *e1) } else { (*m2, *e2) };
                    let bits = 128 - big.unsigned_abs().leading_zeros() as i32;
                    // Rounded to 24 bits, the larger term's exponent is its top bit's (or one
                    // more when it rounds up to a power of two: still below 2^-126 only if
                    // the top bit is).
                    return bits - 1 + eb < -126;
                }
                (m1 * (1i128 << s1) + m2 * (1i128 << s2), e)
            }
            _ => unreachable!(),
        };
        if m == 0 {
            return false;
        }
        let mut q = m.unsigned_abs();
        let mut e = e;
        let bits = 128 - q.leading_zeros() as i32;
        if bits > 24 {
            let sh = (bits - 24) as u32;
            let rem = q & ((1u128 << sh) - 1);
            let half = 1u128 << (sh - 1);
            q >>= sh;
            e += sh as i32;
            if rem > half || (rem == half && q % 2 == 1) {
                q += 1;
            }
        }
        let top = 127 - q.leading_zeros() as i32;
        top + e < -126
    }

    /// One fused step: the IEEE fused multiply-add of the operands with subnormals read as
    /// zero, a tiny result (see `tiny`) replaced by the zero of its sign.
    fn step(a: f32, b: f32, c: f32) -> f32 {
        let (a, b, c) = (daz(a), daz(b), daz(c));
        let r = a.mul_add(b, c);
        if r.is_nan() || r.is_infinite() || !a.is_finite() || !b.is_finite() || !c.is_finite() {
            return r;
        }
        if tiny(a, b, c) {
            return 0f32.copysign(r);
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
    numerics::isas("bf16", coli_kernels::bf16_kernel)
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
    // One token, five rows, each row's nonzero weights picking lanes built for a case. Row 0:
    // lane 0 2^-126 - 2^-150 (24 bits below 2^-126: tiny, flushed), lane 1 x - x (+0), lane 2
    // signed zero products into the +0 accumulator (+0), lane 3 a subnormal weight (read as
    // zero). Row 1: the same without the subnormal weight (every weight normal or zero). Rows
    // 2-4: 2^-126 - 2^-180 and 2^-126 - 2^-151 (round to 2^-126 at 24 bits: kept),
    // 2^-126 - 1.5 * 2^-151 (rounds below: flushed). Row 5: only the subnormal weight (read as
    // zero, so 0 and not 2^-33).
    let cols = 32;
    let p2 = |e: i32| ((127 + e) as u16) << 7; // the bf16 pattern of 2^e
    let rows = 6;
    let mut w = vec![0u16; rows * cols];
    let mut x = vec![0f32; cols];
    let mut set = |r: usize, c: usize, wv: u16, xv: f32| {
        w[r * cols + c] = wv;
        x[c] = xv;
    };
    for r in 0..2 {
        set(r, 1, p2(-63), bf16_f32(p2(-63)));
        set(r, 0, p2(-75), -bf16_f32(p2(-75)));
        set(r, 3, 0x3f80, 1.0);
        set(r, 2, 0x3f80, -1.0);
        set(r, 5, 0x8000, 1.0);
        set(r, 4, 0x0000, -1.0);
    }
    set(0, 7, 0x0001, 2f32.powi(100));
    set(5, 7, 0x0001, 2f32.powi(100));
    for (r, lane, w_even, x_even) in [
        (2, 4, p2(-90), -bf16_f32(p2(-90))),
        (3, 5, p2(-75), -bf16_f32(p2(-76))),
        (4, 6, p2(-76) | 0x40, -bf16_f32(p2(-75))),
    ] {
        set(r, 2 * lane + 1, p2(-63), bf16_f32(p2(-63)));
        set(r, 2 * lane, w_even, x_even);
    }
    let bytes: Vec<u8> = w.iter().flat_map(|b| b.to_le_bytes()).collect();
    let m = MatrixView::new(Encoding::Bf16, rows, cols, &bytes, &[]).unwrap();
    let xr: Vec<u16> = x.iter().map(|&v| rule::round(v)).collect();
    let want: Vec<u32> = (0..rows)
        .map(|r| rule::dot(&w[r * cols..(r + 1) * cols], &xr).to_bits())
        .collect();
    let min = f32::MIN_POSITIVE.to_bits();
    assert_eq!(want, [0, 0, min, min, 0, 0], "the rule's own values");
    for isa in isas() {
        let mut y = vec![1f32; rows];
        matvec_num(isa, Numerics::Q8a, &m, &x, &mut y);
        let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{isa:?}");
    }
}

/// Rows in the AVX2 kernel's safe range with tokens in and out of it, side by side in one
/// product (the kernel takes its fast path per row and token).
#[test]
fn safe_and_unsafe_tokens_in_one_product() {
    let (rows, cols, n) = (9, 256, 7);
    let c = Case::new(rows, cols, 31, false);
    let w = c.view();
    let mut x = activations(n, cols, 32, false);
    // Tokens 1, 4 and 5 hold a value far below 2^-50 (4: also one just above 2^-126), the
    // others none.
    x[cols + 17] = 2f32.powi(-100);
    x[4 * cols + 3] = -2f32.powi(-120);
    x[4 * cols + 200] = 2f32.powi(-125);
    x[5 * cols + 255] = 2f32.powi(-60);
    let xr: Vec<u16> = x.iter().map(|&v| rule::round(v)).collect();
    for isa in isas() {
        let mut y = vec![0f32; n * rows];
        matmul_num(isa, Numerics::Q8a, &w, &x, n, &mut y);
        for t in 0..n {
            for r in 0..rows {
                let want = rule::dot(
                    &c.w[r * cols..(r + 1) * cols],
                    &xr[t * cols..(t + 1) * cols],
                );
                assert!(same(y[t * rows + r], want), "{isa:?} token {t} row {r}");
            }
        }
    }
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
    let change = numerics::q8a_relative_change(isa, &w, &x);
    // Activations move by at most 2^-8 of themselves.
    assert!(change > 0.0 && change < 4e-3, "relative change {change}");
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
