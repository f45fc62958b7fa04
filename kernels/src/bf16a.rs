//! bf16-activation products (numerics `q8a`, revision 4): a bf16 matrix multiplied by its
//! activations rounded to bf16, pairs of products summed into 16 f32 lanes in the order of the
//! x86 `vdpbf16ps` instruction (AVX-512 BF16), so that a CPU with that instruction runs the
//! rule at twice the multiply rate of f32 FMAs and every other instruction set gives the same
//! bits by emulating it (the scalar twin below; `bf16a_x86` for AVX2).
//!
//! ## The rule (docs/ENGINE.md, "Precision")
//! Applies under `q8a` to bf16 matrices with `cols` a multiple of 32 (every other bf16 matrix
//! keeps its f32 kernel). Below, `daz(v)` is `v` with a subnormal replaced by the zero of its
//! sign, and `F(a, b, c)` is the fused multiply-add `a * b + c` of `daz(a)`, `daz(b)`,
//! `daz(c)`, rounded to nearest even in f32, except that a tiny result becomes the zero of its
//! sign, tininess as IEEE 754 defines it after rounding: the exact value rounded to 24 bits with
//! an unbounded exponent is below `2^-126` (so `2^-126 - 2^-150` is flushed, `2^-126 - 2^-151`
//! and `2^-126 - 2^-180` give `2^-126`). That is `vdpbf16ps` (Intel: denormals in are zero,
//! out are flushed, MXCSR not used) as this project's AMD EPYC (Zen 4) computes it: 32 million
//! random lanes and those boundary cases agree bit for bit (`bf16a_x86`'s unit test repeats
//! the check wherever the instruction runs).
//!
//! 1. **Activations**, per token and column: `x` rounded to bf16, nearest even (a subnormal
//!    f32 becomes the zero of its sign first; infinities stay; a NaN stays a NaN, quieted):
//!    [`round_bf16`].
//! 2. **Lanes.** Each chunk of 32 columns `k` splits into 16 lanes of 2 columns: lane `i` holds
//!    columns `2i` and `2i + 1` (the 32-bit word `i` of the chunk's 64 bytes of weights).
//! 3. **Per lane**, accumulator `i` (of 16, from `+0.0`) becomes
//!    `acc = F(w[2i+1], x[2i+1], acc)`, then `acc = F(w[2i], x[2i], acc)` (odd column first),
//!    chunks in column order. (The product of two bf16 values is exact in f32 when it is
//!    normal, so each step rounds once.)
//! 4. **Sum**: the 16 accumulators as the integer rule sums them ([`crate::q8a::sum16`]:
//!    `v8_i = a_i + a_{i+8}`, `v4_i = v8_i + v8_{i+4}`, `v2_i = v4_i + v4_{i+2}`,
//!    `v2_0 + v2_1`), plain f32 additions.
//!
//! The rule changes a product by the activation rounding (each value moves by at most 2^-8 of
//! itself) and the f32 summation order; the oracle (tests/fixtures/make_q8a_expected.py)
//! rounds the inputs of the same linears to bf16 (step 1) and multiplies in f32.

use coli_format::{Encoding, MatrixView};

use crate::q8a::{sum16, LANES};

/// Columns per chunk (16 lanes of 2).
pub(crate) const CHUNK: usize = 32;

/// Whether the rule applies to `w`: bf16, row-major, `cols` a multiple of [`CHUNK`].
pub(crate) fn applies(w: &MatrixView<'_>) -> bool {
    w.encoding() == Encoding::Bf16
        && !w.is_interleaved()
        && w.cols() > 0
        && w.cols().is_multiple_of(CHUNK)
}

/// Step 1: `x` rounded to bf16 (its bit pattern), nearest even; a subnormal becomes the zero
/// of its sign, a NaN a quiet NaN.
#[inline]
pub fn round_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    if x.is_subnormal() {
        return ((b >> 16) as u16) & 0x8000;
    }
    // Nearest even: add just under half an ulp of bf16, plus the kept part's lowest bit.
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// Step 1 for `[n, cols]` activations: `[n, cols]` bf16 bit patterns.
pub(crate) fn round_activations(x: &[f32]) -> Vec<u16> {
    x.iter().map(|&v| round_bf16(v)).collect()
}

/// The f32 value of a bf16 bit pattern.
#[inline]
pub(crate) fn bf16_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `v` with a subnormal replaced by the zero of its sign.
#[inline]
fn daz(v: f32) -> f32 {
    if v.is_subnormal() {
        0f32.copysign(v)
    } else {
        v
    }
}

/// `T = 2^-126 - 2^-151`: an exact result of magnitude below `T` rounds, at f32's 24 bits with
/// an unbounded exponent, below `2^-126` (tiny); from `T` up it rounds to `2^-126` or more.
const TINY_BELOW: f64 = 33_554_431.0 * f64::from_bits((1023 - 151) << 52); // (2^25 - 1) 2^-151

/// `F(a, b, c)` of the rule: the fused multiply-add of the operands with subnormals read as
/// zero; a result that is tiny (IEEE 754's tininess after rounding: below `2^-126` once rounded
/// to 24 bits with an unbounded exponent) becomes the zero of its sign.
#[inline]
pub(crate) fn fma_daz_ftz(a: f32, b: f32, c: f32) -> f32 {
    let (a, b, c) = (daz(a), daz(b), daz(c));
    let r = a.mul_add(b, c);
    if r.abs() > f32::MIN_POSITIVE || r == 0.0 || !r.is_finite() {
        // Not tiny: an exact value below `T` rounds to `2^-126` at most.
        return r;
    }
    // |r| <= 2^-126: decide on the exact value `c + a b`, held as `s + e` (the product of two
    // bf16 values is exact in f64; Knuth's two-sum gives the rounding error `e` of `s` exactly).
    let p = a as f64 * b as f64;
    let c = c as f64;
    let s = c + p;
    let bp = s - c;
    let e = (c - (s - bp)) + (p - bp);
    // |exact| < T: |s| < T (rounding is monotonic and T is an f64), or |s| == T with the
    // error pointing towards zero.
    let tiny =
        s.abs() < TINY_BELOW || (s.abs() == TINY_BELOW && e != 0.0 && (e < 0.0) != (s < 0.0));
    if tiny {
        0f32.copysign(r)
    } else {
        r
    }
}

/// Steps 2-4 for one bf16 row (`row`: `2 * cols` bytes, little-endian) and one token's rounded
/// activations (`x`: `cols` bf16 patterns): the scalar twin every kernel agrees with.
pub(crate) fn dot_scalar(row: &[u8], x: &[u16]) -> f32 {
    debug_assert_eq!(row.len(), 2 * x.len());
    let mut acc = [0f32; LANES];
    for (wk, xk) in row.chunks_exact(2 * CHUNK).zip(x.chunks_exact(CHUNK)) {
        for (i, a) in acc.iter_mut().enumerate() {
            let w = |c: usize| bf16_f32(u16::from_le_bytes([wk[2 * c], wk[2 * c + 1]]));
            let odd = fma_daz_ftz(w(2 * i + 1), bf16_f32(xk[2 * i + 1]), *a);
            *a = fma_daz_ftz(w(2 * i), bf16_f32(xk[2 * i]), odd);
        }
    }
    sum16(&acc)
}

/// Row `r` of the bf16 matrix `w`: its `2 * cols` bytes.
#[inline]
pub(crate) fn row_bytes<'a>(w: &MatrixView<'a>, r: usize) -> &'a [u8] {
    let cols = w.cols();
    &w.data()[2 * r * cols..2 * (r + 1) * cols]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_nearest_even_with_flushed_subnormals() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even (1) wins; 1 + 3 * 2^-8 rounds up.
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(round_bf16(-1.0 - 2f32.powi(-9)), 0xbf80);
        assert_eq!(round_bf16(f32::from_bits(0x007f_ffff)), 0x0000);
        assert_eq!(round_bf16(f32::from_bits(0x807f_ffff)), 0x8000);
        assert_eq!(round_bf16(f32::MAX), 0x7f80);
        assert_eq!(round_bf16(f32::NEG_INFINITY), 0xff80);
        assert!(bf16_f32(round_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn tininess_after_rounding_with_an_unbounded_exponent() {
        // 2^-126 - 2^-150 has 24 bits: tiny, flushed (IEEE rounding to the subnormal grid would
        // give 2^-126); 2^-126 - 2^-151 and 2^-126 - 2^-180 round to 2^-126: kept. As
        // vdpbf16ps does on this project's machine.
        let t = 2f32.powi(-75);
        assert_eq!(fma_daz_ftz(t, -t, f32::MIN_POSITIVE).to_bits(), 0);
        assert_eq!(
            fma_daz_ftz(t, -t / 2.0, f32::MIN_POSITIVE),
            f32::MIN_POSITIVE
        );
        assert_eq!(
            fma_daz_ftz(t, -1.5 * t / 2.0, f32::MIN_POSITIVE).to_bits(),
            0
        );
        let u = 2f32.powi(-90);
        assert_eq!(fma_daz_ftz(u, -u, f32::MIN_POSITIVE), f32::MIN_POSITIVE);
        assert_eq!(fma_daz_ftz(t, t, -f32::MIN_POSITIVE).to_bits(), 0x8000_0000);
        assert_eq!(fma_daz_ftz(-t, t, -f32::MIN_POSITIVE), -f32::MIN_POSITIVE);
        // Exactly 2^-126 stays; a subnormal accumulator is read as zero.
        assert_eq!(fma_daz_ftz(0.0, 1.0, f32::MIN_POSITIVE), f32::MIN_POSITIVE);
        assert_eq!(fma_daz_ftz(1.0, 1.0, f32::from_bits(1)), 1.0);
        // x + (-x) is +0, as in IEEE arithmetic.
        assert_eq!(fma_daz_ftz(1.0, -1.0, 1.0).to_bits(), 0);
    }
}
