//! The SwiGLU feed-forward `down(silu(gate x) * up x)`, over dense weights (Qwen3-MoE dense
//! layers) or over one routed expert's matrices.

use crate::layers::Linear;
use coli_format::spec::ExpertActivation;
use coli_format::MatrixView;

/// The gated activation between a SwiGLU's gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Glu {
    /// `silu(g) * u` (torch's `act_fn(gate) * up`).
    Silu,
    /// GLM-5.3-Flash's clamped form `silu(min(g, l)) * clamp(u, -l, l)` (`Glm5NextTextMLP` /
    /// `Glm5NextTextExperts._apply_gate`).
    Clamped(f32),
    /// Inkling 2's `gate tanh(g / gate) * sigmoid(g) * up tanh(u / up)`
    /// (`Inkling2SoftcappedSwiGLU`), in that order; Kimi K3's SiTU (`SituAndMul`,
    /// `beta tanh(g / beta) sigmoid(g) * lb tanh(u / lb)`) is the same computation.
    Softcapped {
        /// `mlp_gate_softcap`.
        gate: f32,
        /// `mlp_up_softcap`.
        up: f32,
    },
}

impl Glu {
    /// No clamp (`None`) or GLM-5.3-Flash's (`Some(limit)`).
    pub(crate) fn clamped(limit: Option<f32>) -> Glu {
        limit.map_or(Glu::Silu, Glu::Clamped)
    }

    /// The form of `act` that takes no biases (None: gpt-oss's clamped SwiGLU, which does).
    pub(crate) fn of(act: ExpertActivation) -> Option<Glu> {
        match act {
            ExpertActivation::Silu => Some(Glu::Silu),
            ExpertActivation::SiluClamped { limit } => Some(Glu::Clamped(limit)),
            ExpertActivation::SoftcappedSwiglu { gate_cap, up_cap } => Some(Glu::Softcapped {
                gate: gate_cap,
                up: up_cap,
            }),
            ExpertActivation::ClampedSwiglu { .. } => None,
        }
    }
}

/// The activation `act` of `g` and `u` elementwise into `g` (f32).
pub(crate) fn swiglu_inplace(g: &mut [f32], u: &[f32], act: Glu) {
    match act {
        Glu::Silu => {
            for (a, b) in g.iter_mut().zip(u) {
                *a = coli_kernels::silu(*a) * b;
            }
        }
        Glu::Clamped(l) => {
            for (a, b) in g.iter_mut().zip(u) {
                *a = coli_kernels::silu(a.min(l)) * b.clamp(-l, l);
            }
        }
        Glu::Softcapped { gate, up } => {
            // An infinite cap leaves the up branch as is (K3's `SituAndMul` with no linear beta).
            let cap = |b: f32| {
                if up.is_finite() {
                    (b / up).tanh() * up
                } else {
                    b
                }
            };
            for (a, b) in g.iter_mut().zip(u) {
                let s = 1.0 / (1.0 + (-*a).exp());
                *a = (*a / gate).tanh() * gate * s * cap(*b);
            }
        }
    }
}

/// `y[n, H] = down(silu(gate x) * up x)` for `n` rows of `x` `[n, H]`, with gate/up `[I, H]` and
/// down `[H, I]` in any store encoding, the activation `act` ([`swiglu_inplace`]).
pub(crate) fn swiglu(
    gate: &MatrixView<'_>,
    up: &MatrixView<'_>,
    down: &MatrixView<'_>,
    x: &[f32],
    n: usize,
    act: Glu,
    y: &mut [f32],
) {
    let inter = gate.rows();
    let mut g = vec![0f32; n * inter];
    let mut u = vec![0f32; n * inter];
    if n == 1 {
        coli_kernels::matvec(gate, x, &mut g);
        coli_kernels::matvec(up, x, &mut u);
        swiglu_inplace(&mut g, &u, act);
        coli_kernels::matvec(down, &g, y);
    } else {
        coli_kernels::matmul(gate, x, n, &mut g);
        coli_kernels::matmul(up, x, n, &mut u);
        swiglu_inplace(&mut g, &u, act);
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
    /// The activation: SwiGLU, GLM-5.3-Flash's clamped form (`swiglu_limit`), Kimi K3's SiTU.
    pub act: Glu,
}

impl Mlp<'_> {
    /// `y[n, H] = down(act(gate x, up x))`.
    pub fn forward(&self, x: &[f32], n: usize, y: &mut [f32]) {
        swiglu(&self.gate.w, &self.up.w, &self.down.w, x, n, self.act, y);
    }
}
