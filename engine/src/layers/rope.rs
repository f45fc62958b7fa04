//! Rotary position embeddings, default RoPE type, `rotate_half` (non-interleaved) layout, as
//! transformers' `compute_default_rope_parameters` and `apply_rotary_pos_emb`:
//!
//! - `inv_freq[i] = 1 / theta^((2i) / d)` for `i < d/2`, computed in f32 (the exponent is an f32
//!   arange divided by `d`, theta is cast to f32 by `base ** tensor`);
//! - `freq = (pos as f32) * inv_freq[i]`, `cos`/`sin` in f32, duplicated for both halves;
//! - `x' = x * cos + rotate_half(x) * sin` with `rotate_half(x) = cat(-x2, x1)`.

/// Precomputed inverse frequencies for one head dimension.
pub struct Rope {
    /// `inv_freq`, f32 `[head_dim / 2]`.
    pub inv_freq: Vec<f32>,
    /// Multiplier of the cos/sin tables (transformers' `attention_scaling`: YaRN's
    /// `attention_factor` for GQA models, 1 for the default RoPE).
    pub attention_scaling: f32,
}

impl Rope {
    /// Frequencies for `head_dim` (even) and base `theta`.
    pub fn new(head_dim: usize, theta: f64) -> Rope {
        let base = theta as f32;
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Rope {
            inv_freq,
            attention_scaling: 1.0,
        }
    }

    /// No rotation (NoPE: Kimi-Linear's MLA): every frequency 0, so the tables are cos 1 and
    /// sin 0 at every position and [`Rope::apply`] returns each value as it was
    /// (`x * 1 + y * 0`: exact for finite values). MLA's interleaved form would also permute
    /// the pairs (the same way in queries and keys); Kimi-Linear's MLA is not interleaved.
    pub fn none(head_dim: usize) -> Rope {
        Rope {
            inv_freq: vec![0.0; head_dim / 2],
            attention_scaling: 1.0,
        }
    }

    /// YaRN frequencies and attention factor (`modeling_rope_utils._compute_yarn_parameters`,
    /// transformers 5.23; YaRN paper, Peng et al. 2023, section 3): the default frequencies
    /// blended with `freq / factor` by a linear ramp over the correction range
    /// `[low, high]` of dimensions (`find_correction_range` of `beta_fast`/`beta_slow`,
    /// floored/ceiled when `truncate`); attention factor `get_mscale(factor, mscale) /
    /// get_mscale(factor, mscale_all_dim)` when both are set, else `get_mscale(factor)`.
    /// Returns the rope with `attention_scaling` 1 and the attention factor separately (MLA
    /// applies it itself; [`Rope::yarn_scaled`] folds it into the tables).
    pub fn yarn(head_dim: usize, theta: f64, y: &coli_format::spec::Yarn) -> (Rope, f32) {
        use coli_format::spec::mla::yarn_mscale;
        let d = head_dim;
        let base = Rope::new(d, theta);
        let attention_factor = match (y.mscale, y.mscale_all_dim) {
            (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                yarn_mscale(y.factor, m) / yarn_mscale(y.factor, ma)
            }
            _ => yarn_mscale(y.factor, 1.0),
        };
        let cd = |r: f64| {
            d as f64 * (y.original_max_position_embeddings / (r * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (cd(y.beta_fast), cd(y.beta_slow));
        if y.truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let mut high = high.min(d as f64 - 1.0);
        if low == high {
            high += 0.001;
        }
        let factor = y.factor as f32;
        let inv_freq = base
            .inv_freq
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let ramp = (((i as f64 - low) / (high - low)).clamp(0.0, 1.0)) as f32;
                let extrapolation = 1.0 - ramp;
                (f / factor) * (1.0 - extrapolation) + f * extrapolation
            })
            .collect();
        (
            Rope {
                inv_freq,
                attention_scaling: 1.0,
            },
            attention_factor as f32,
        )
    }

    /// [`Rope::yarn`] with the attention factor folded into the cos/sin tables, as GQA models
    /// apply it (`cos = emb.cos() * attention_scaling`).
    pub fn yarn_scaled(head_dim: usize, theta: f64, y: &coli_format::spec::Yarn) -> Rope {
        let (mut r, af) = Rope::yarn(head_dim, theta, y);
        r.attention_scaling = af;
        r
    }

    /// `(cos, sin)` tables of `head_dim / 2` values for position `pos`, times
    /// `attention_scaling`.
    pub fn tables(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        let s = self.attention_scaling;
        self.inv_freq
            .iter()
            .map(|&f| {
                let a = p * f;
                if s == 1.0 {
                    (a.cos(), a.sin())
                } else {
                    (a.cos() * s, a.sin() * s)
                }
            })
            .unzip()
    }

    /// Rotates one head vector `x` (`head_dim` values) in place with tables from [`Rope::tables`].
    pub fn apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = x.len() / 2;
        for i in 0..half {
            let (x1, x2) = (x[i], x[i + half]);
            x[i] = x1 * cos[i] + (-x2) * sin[i];
            x[i + half] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_preserved() {
        let r = Rope::new(8, 10_000.0);
        assert_eq!(r.inv_freq[0], 1.0);
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let (c, s) = r.tables(0);
        Rope::apply(&mut x, &c, &s);
        assert_eq!(x, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let (c, s) = r.tables(5);
        Rope::apply(&mut x, &c, &s);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 204.0).abs() < 1e-3);
        // First pair rotates by angle 5 (inv_freq 1): (x1, x5) = (1, 5).
        assert!((x[0] - (5f32.cos() - 5.0 * 5f32.sin())).abs() < 1e-5);
    }
}
