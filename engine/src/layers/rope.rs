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
}

impl Rope {
    /// Frequencies for `head_dim` (even) and base `theta`.
    pub fn new(head_dim: usize, theta: f64) -> Rope {
        let base = theta as f32;
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Rope { inv_freq }
    }

    /// `(cos, sin)` tables of `head_dim / 2` values for position `pos`.
    pub fn tables(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        self.inv_freq
            .iter()
            .map(|&f| {
                let a = p * f;
                (a.cos(), a.sin())
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
