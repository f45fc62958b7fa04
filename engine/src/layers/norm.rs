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

/// An RMSNorm without weight, in place: each `d`-long row of `x` times
/// `1 / sqrt(mean(row^2) + eps)`, summed in row order in f32 (DeepSeek-V4's query heads,
/// `DeepseekV4UnweightedRMSNorm`; the hyper-connections' norm over a token's streams).
pub fn unit_rms_rows(x: &mut [f32], d: usize, eps: f32) {
    for r in x.chunks_exact_mut(d) {
        let ms = r.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let f = 1.0 / (ms + eps).sqrt();
        for v in r {
            *v *= f;
        }
    }
}
