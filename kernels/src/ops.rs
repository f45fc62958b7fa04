//! Small f32 vector helpers used by the engine (portable code, fixed evaluation order).

#![forbid(unsafe_code)]

use crate::scalar::dot_lanes;

/// Dot product `sum_i a[i] * b[i]` of two equal-length f32 vectors.
///
/// Summation order is fixed (eight interleaved running sums combined pairwise), so the result
/// depends only on the inputs, never on threads or on the CPU's instruction set.
///
/// # Panics
/// If `a.len() != b.len()`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: length mismatch");
    dot_lanes(a, b)
}

/// RMS normalization: `out[i] = weight[i] * (x[i] / sqrt(mean(x^2) + eps))`.
///
/// Follows Hugging Face transformers' `LlamaRMSNorm` computed in f32: the mean of squares is
/// accumulated in f64 and rounded to f32, then `inv = 1 / sqrt(mean + eps)` in f32, and each
/// output is `weight[i] * (x[i] * inv)`. An empty `x` leaves `out` untouched.
///
/// # Panics
/// If `weight.len()` or `out.len()` differs from `x.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), weight.len(), "rms_norm: weight length mismatch");
    assert_eq!(x.len(), out.len(), "rms_norm: output length mismatch");
    if x.is_empty() {
        return;
    }
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (ss / x.len() as f64) as f32;
    let inv = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(weight) {
        *o = g * (v * inv);
    }
}

/// Softmax in place: `x[i] = exp(x[i] - max) / sum_j exp(x[j] - max)`.
///
/// Subtracting the maximum keeps `exp` in range; the sum is accumulated in f64. An empty slice
/// is left as is. If every element is `-inf` (or any is NaN) the result is NaN, as in PyTorch.
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Dot products of `q` with `out.len()` vectors spaced `stride` apart: `out[j] = dot(q,
/// &m[j * stride + offset..][..q.len()])`, each bit-identical to [`dot`] (the same eight lanes,
/// the same pairwise combination). Attention scores of one query against a head's keys in a
/// KV cache (`stride` = f32 per position, `offset` = the head's first column).
///
/// Four vectors go through the loop together: one dot's lanes wait on a chain of additions
/// (four cycles each), four chains overlap. Speed only; the order of every sum is [`dot`]'s.
///
/// # Panics
/// If `m` is shorter than `(out.len() - 1) * stride + offset + q.len()` (for a non-empty `out`).
pub fn dot_strided(q: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
    dot_strided_with(crate::detected_isa(), q, m, stride, offset, out)
}

/// [`dot_strided`] compiled for `isa` (tests and benches): the same bits on every instruction
/// set (each lane's products and sums are the portable code's; AVX2 holds the eight lanes in
/// one register, with a multiply and an add, never a fused multiply-add).
///
/// # Panics
/// As [`dot_strided`]; also if `isa` is not supported by this CPU.
pub fn dot_strided_with(
    isa: crate::Isa,
    q: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    assert!(
        isa.supported(),
        "dot_strided: {} is not supported here",
        isa.name()
    );
    #[cfg(target_arch = "x86_64")]
    if isa != crate::Isa::Scalar {
        crate::strided_x86::dot_strided(isa, q, m, stride, offset, out);
        return;
    }
    dot_strided_portable(q, m, stride, offset, out)
}

/// The body of [`dot_strided`], inlined into each instruction set's copy.
#[inline(always)]
pub(crate) fn dot_strided_portable(
    q: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    let d = q.len();
    let n = out.len();
    if n == 0 {
        return;
    }
    assert!(
        m.len() >= (n - 1) * stride + offset + d,
        "dot_strided: {} f32 hold fewer than {n} vectors of {d} at stride {stride} + {offset}",
        m.len()
    );
    let row = |j: usize| &m[j * stride + offset..j * stride + offset + d];
    let (qc, qt) = q.as_chunks::<8>();
    let mut j = 0;
    while j + 4 <= n {
        let (a, b, c, e) = (row(j), row(j + 1), row(j + 2), row(j + 3));
        let (ac, at) = a.as_chunks::<8>();
        let (bc, bt) = b.as_chunks::<8>();
        let (cc, ct) = c.as_chunks::<8>();
        let (ec, et) = e.as_chunks::<8>();
        let mut s = [[0f32; 8]; 4];
        for ((((x, ya), yb), yc), ye) in qc.iter().zip(ac).zip(bc).zip(cc).zip(ec) {
            for l in 0..8 {
                s[0][l] += x[l] * ya[l];
                s[1][l] += x[l] * yb[l];
                s[2][l] += x[l] * yc[l];
                s[3][l] += x[l] * ye[l];
            }
        }
        for (k, tail) in [at, bt, ct, et].into_iter().enumerate() {
            for (l, (x, y)) in qt.iter().zip(tail).enumerate() {
                s[k][l] += x * y;
            }
            out[j + k] = combine_lanes(&s[k]);
        }
        j += 4;
    }
    for (k, o) in out.iter_mut().enumerate().skip(j) {
        *o = dot_lanes(q, row(k));
    }
}

/// `dot_lanes`'s final combination of its eight running sums.
fn combine_lanes(s: &[f32; 8]) -> f32 {
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// `y += sum_j p[j] * m[j * stride + offset..][..y.len()]`, the terms added in the order of `j`:
/// bit-identical to calling [`axpy`]`(p[j], row j, y)` for `j = 0, 1, ...` (each product
/// rounded, then added; no fused multiply-add). The attention output of one query and head from
/// its probabilities `p` and the head's values in a KV cache.
///
/// Each block of 32 outputs stays in registers while a tile of 64 rows adds its terms to it,
/// instead of being loaded and stored once per row.
///
/// # Panics
/// If `m` is shorter than `(p.len() - 1) * stride + offset + y.len()` (for a non-empty `p`).
pub fn axpy_strided(p: &[f32], m: &[f32], stride: usize, offset: usize, y: &mut [f32]) {
    axpy_strided_with(crate::detected_isa(), p, m, stride, offset, y)
}

/// [`axpy_strided`] compiled for `isa` (tests and benches): the same bits on every instruction
/// set (each output's products and sums are the portable code's, in the same order; AVX2 and
/// AVX-512 hold a block of 32 outputs in four or two registers, multiply then add).
///
/// # Panics
/// As [`axpy_strided`]; also if `isa` is not supported by this CPU.
pub fn axpy_strided_with(
    isa: crate::Isa,
    p: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    y: &mut [f32],
) {
    assert!(
        isa.supported(),
        "axpy_strided: {} is not supported here",
        isa.name()
    );
    #[cfg(target_arch = "x86_64")]
    if isa != crate::Isa::Scalar {
        crate::strided_x86::axpy_strided(isa, p, m, stride, offset, y);
        return;
    }
    axpy_strided_portable::<32>(p, m, stride, offset, y)
}

/// The body of [`axpy_strided`], inlined into each instruction set's copy: blocks of `BLOCK`
/// outputs held in registers (32 in the portable copy's eight SSE registers; 64 and 128 in the
/// AVX2 and AVX-512 copies, so that a 128-wide head's row is read in one or two contiguous
/// pieces: a KV cache's rows of one head lie a whole position apart, and reading each in four
/// pieces of 128 bytes ran 2-3x slower there). The block size changes no sum: every output
/// takes the rows in the order of `j`.
#[inline(always)]
pub(crate) fn axpy_strided_portable<const BLOCK: usize>(
    p: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    y: &mut [f32],
) {
    let d = y.len();
    let n = p.len();
    if n == 0 {
        return;
    }
    assert!(
        m.len() >= (n - 1) * stride + offset + d,
        "axpy_strided: {} f32 hold fewer than {n} vectors of {d} at stride {stride} + {offset}",
        m.len()
    );
    // Rows in tiles of KEY_TILE (their bytes stay in cache while each block of outputs takes
    // their terms); within and across tiles every output takes the rows in the order of `j`.
    const KEY_TILE: usize = 64;
    let mut j0 = 0;
    while j0 < n {
        let rows = &p[j0..(j0 + KEY_TILE).min(n)];
        let mut c0 = 0;
        while c0 < d {
            let left = d - c0;
            c0 += if BLOCK >= 128 && left >= 128 {
                axpy_block::<128>(rows, j0, m, stride, offset + c0, &mut y[c0..c0 + 128])
            } else if BLOCK >= 64 && left >= 64 {
                axpy_block::<64>(rows, j0, m, stride, offset + c0, &mut y[c0..c0 + 64])
            } else if left >= 32 {
                axpy_block::<32>(rows, j0, m, stride, offset + c0, &mut y[c0..c0 + 32])
            } else {
                for (j, &pj) in (j0..).zip(rows) {
                    let at = j * stride + offset + c0;
                    axpy(pj, &m[at..at + left], &mut y[c0..]);
                }
                left
            };
        }
        j0 += rows.len();
    }
}

/// `y += sum p[i] * m[(j0 + i) * stride + offset..][..B]` over `rows` = `p[j0..]`, the terms in
/// order, `y` (B outputs) held in registers meanwhile. Returns B.
#[inline(always)]
fn axpy_block<const B: usize>(
    rows: &[f32],
    j0: usize,
    m: &[f32],
    stride: usize,
    offset: usize,
    y: &mut [f32],
) -> usize {
    let mut acc: [f32; B] = y[..B].try_into().expect("block");
    for (j, &pj) in (j0..).zip(rows) {
        let at = j * stride + offset;
        let v: &[f32; B] = m[at..at + B].try_into().expect("block");
        for l in 0..B {
            acc[l] += pj * v[l];
        }
    }
    y[..B].copy_from_slice(&acc);
    B
}

/// `x.exp()` (the C library's `expf`), with arguments below -104 answered 0 without the call:
/// `e^-104 < 2^-150`, which `expf` rounds to +0 (glibc takes a slow underflow path for
/// them, 0.9% of a chunked Gated DeltaNet prefill, where decays of a long chunk underflow).
/// Same bits as `x.exp()` for every `x`, -inf and NaN included.
#[inline(always)]
pub fn exp_flush(x: f32) -> f32 {
    if x < -104.0 {
        0.0
    } else {
        x.exp()
    }
}

/// SiLU (swish) activation: `x * sigmoid(x) = x / (1 + exp(-x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `y[i] += alpha * x[i]` (product rounded, then added; no fused multiply-add).
///
/// # Panics
/// If `x.len() != y.len()`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    for (yo, &v) in y.iter_mut().zip(x) {
        *yo += alpha * v;
    }
}

#[cfg(test)]
mod tests {
    use super::exp_flush;

    /// Every f32 from -200 to -100 (and the ends of the range, -inf, NaN, 0): the shortcut
    /// gives `x.exp()`'s bits, so the rule's results do not change.
    #[test]
    fn exp_flush_is_exp() {
        let mut x = -200f32;
        let mut checked = 0u64;
        while x < -100.0 {
            assert_eq!(exp_flush(x).to_bits(), x.exp().to_bits(), "{x}");
            x = f32::from_bits(x.to_bits() - 1);
            checked += 1;
        }
        assert!(checked > 1_000_000);
        for x in [f32::NEG_INFINITY, f32::MIN, -104.0, -103.97, 0.0, -0.0, 1.0] {
            assert_eq!(exp_flush(x).to_bits(), x.exp().to_bits(), "{x}");
        }
        assert!(exp_flush(f32::NAN).is_nan());
    }
}
