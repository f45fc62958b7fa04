//! The SwiGLU feed-forward `down(silu(gate x) * up x)`, over dense weights (Qwen3-MoE dense
//! layers) or over one routed expert's matrices.

use crate::layers::Linear;
use coli_format::MatrixView;

/// `silu(g) * u` elementwise into `g` (f32, torch's `act_fn(gate) * up`), or with `limit`
/// GLM-5.3-Flash's clamped form `silu(min(g, limit)) * clamp(u, -limit, limit)`
/// (`Glm5NextTextMLP` / `Glm5NextTextExperts._apply_gate`).
pub(crate) fn swiglu_inplace(g: &mut [f32], u: &[f32], limit: Option<f32>) {
    match limit {
        None => {
            for (a, b) in g.iter_mut().zip(u) {
                *a = coli_kernels::silu(*a) * b;
            }
        }
        Some(l) => {
            for (a, b) in g.iter_mut().zip(u) {
                *a = coli_kernels::silu(a.min(l)) * b.clamp(-l, l);
            }
        }
    }
}

/// `y[n, H] = down(silu(gate x) * up x)` for `n` rows of `x` `[n, H]`, with gate/up `[I, H]` and
/// down `[H, I]` in any store encoding; `limit` clamps as [`swiglu_inplace`] says.
pub(crate) fn swiglu(
    gate: &MatrixView<'_>,
    up: &MatrixView<'_>,
    down: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    limit: Option<f32>,
    y: &mut [f32],
) {
    let inter = gate.rows();
    let mut g = vec![0f32; n * inter];
    let mut u = vec![0f32; n * inter];
    if n == 1 {
        coli_kernels::matvec(gate, x, &mut g);
        coli_kernels::matvec(up, x, &mut u);
        swiglu_inplace(&mut g, &u, limit);
        coli_kernels::matvec(down, &g, y);
    } else {
        coli_kernels::matmul(gate, x, n, &mut g);
        coli_kernels::matmul(up, x, n, &mut u);
        swiglu_inplace(&mut g, &u, limit);
        coli_kernels::matmul(down, &g, n, y);
    }
}

/// A dense SwiGLU MLP (`mlp.gate_proj`, `mlp.up_proj`, `mlp.down_proj`).
pub struct Mlp<'s> {
    /// `[I, H]`.
    pub gate: Linear<'s>,
    /// `[I, H]`.
    pub up: Linear<'s>,
    /// `[H, I]`.
    pub down: Linear<'s>,
    /// GLM-5.3-Flash's `swiglu_limit` (None: no clamp).
    pub limit: Option<f32>,
}

impl Mlp<'_> {
    /// `y[n, H] = down(silu(gate x) * up x)`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        swiglu(&self.gate.w, &self.up.w, &self.down.w, x, n, self.limit, y);
    }
}
