//! RMSNorm as transformers' `MixtralRMSNorm` / `Qwen3MoeRMSNorm` / `OlmoeRMSNorm`:
//! `w * (x * rsqrt(mean(x^2) + eps))`, all in f32.

/// An RMSNorm over vectors of `weight.len()` values, weight kept as f32.
pub struct RmsNorm {
    /// Scale, f32 `[dim]`.
    pub weight: Vec<f32>,
    /// Epsilon added to the mean square.
    pub eps: f32,
}

impl RmsNorm {
    /// Normalizes each `dim`-long row of `x` into the same row of `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let d = self.weight.len();
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            coli_kernels::rms_norm(xr, &self.weight, self.eps, or);
        }
    }

    /// Normalizes each `dim`-long row of `x` in place.
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let d = self.weight.len();
        let mut tmp = vec![0f32; d];
        for xr in x.chunks_exact_mut(d) {
            coli_kernels::rms_norm(xr, &self.weight, self.eps, &mut tmp);
            xr.copy_from_slice(&tmp);
        }
    }
}
