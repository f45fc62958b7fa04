//! The SwiGLU feed-forward `down(silu(gate x) * up x)`, over dense weights (Qwen3-MoE dense
//! layers) or over one routed expert's matrices.

use crate::layers::Linear;
use coli_format::MatrixView;

/// `silu(g) * u` elementwise into `g` (f32, torch's `act_fn(gate) * up`).
pub(crate) fn swiglu_inplace(g: &mut [f32], u: &[f32]) {
    for (a, b) in g.iter_mut().zip(u) {
        *a = coli_kernels::silu(*a) * b;
    }
}

/// `y[n, H] = down(silu(gate x) * up x)` for `n` rows of `x` `[n, H]`, with gate/up `[I, H]` and
/// down `[H, I]` in any store encoding.
pub(crate) fn swiglu(
    gate: &MatrixView<'_>,
    up: &MatrixView<'_>,
    down: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let inter = gate.rows();
    let mut g = vec![0f32; n * inter];
    let mut u = vec![0f32; n * inter];
    if n == 1 {
        coli_kernels::matvec(gate, x, &mut g);
        coli_kernels::matvec(up, x, &mut u);
        swiglu_inplace(&mut g, &u);
        coli_kernels::matvec(down, &g, y);
    } else {
        coli_kernels::matmul(gate, x, n, &mut g);
        coli_kernels::matmul(up, x, n, &mut u);
        swiglu_inplace(&mut g, &u);
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
}

impl Mlp<'_> {
    /// `y[n, H] = down(silu(gate x) * up x)`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        swiglu(&self.gate.w, &self.up.w, &self.down.w, x, n, y);
    }
}
