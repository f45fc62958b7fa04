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

/// SiLU (swish) activation: `x * sigmoid(x) = x / (1 + exp(-x))`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `y[i] += alpha * x[i]` (product rounded, then added; no fused multiply-add).
///
/// # Panics
/// If `x.len() != y.len()`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: length mismatch");
    for (yo, &v) in y.iter_mut().zip(x) {
        *yo += alpha * v;
    }
}
