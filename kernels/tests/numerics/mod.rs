//! What the numerics tests (`q8a.rs`, `bf16a.rs`) share.

use coli_format::MatrixView;
use coli_kernels::{matvec_num, Isa, Numerics};

/// How far the q8a product of `w` and `x` is from the exact one: `|y_q8a - y_exact| /
/// |y_exact|` (Euclidean norms over the rows).
pub fn q8a_relative_change(isa: Isa, w: &MatrixView<'_>, x: &[f32]) -> f32 {
    let (mut a, mut b) = (vec![0f32; w.rows()], vec![0f32; w.rows()]);
    matvec_num(isa, Numerics::Exact, w, x, &mut a);
    matvec_num(isa, Numerics::Q8a, w, x, &mut b);
    let norm = a.iter().map(|v| v * v).sum::<f32>().sqrt();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).powi(2))
        .sum::<f32>()
        .sqrt();
    diff / norm
}

/// The instruction sets this CPU runs, printing which kernel each one selects (`kernel`:
/// `coli_kernels::integer_kernel` or `bf16_kernel`).
pub fn isas(what: &str, kernel: fn(Isa) -> &'static str) -> Vec<Isa> {
    let v: Vec<Isa> = [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512]
        .into_iter()
        .filter(|i| i.supported())
        .collect();
    eprintln!(
        "{what} kernels tested: {:?}",
        v.iter().map(|&i| kernel(i)).collect::<Vec<_>>()
    );
    v
}
