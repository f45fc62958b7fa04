//! The attention helpers [`crate::dot_strided`] and [`crate::axpy_strided`] compiled for AVX2
//! and AVX-512F: the portable bodies (`ops.rs`) inlined into functions with those target
//! features, so the compiler holds their eight-lane sums and 32-output blocks in vector
//! registers. The arithmetic is unchanged: each lane multiplies, rounds, adds and rounds as the
//! portable code does (Rust never contracts a multiply and an add into an FMA), in the same
//! order, so every instruction set gives the same bits (`kernels/tests/attend.rs`).

use crate::ops::{axpy_strided_portable, dot_strided_portable};
use crate::Isa;

#[target_feature(enable = "avx2")]
fn dot_avx2(q: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
    dot_strided_portable(q, m, stride, offset, out)
}

#[target_feature(enable = "avx512f,avx2")]
fn dot_avx512(q: &[f32], m: &[f32], stride: usize, offset: usize, out: &mut [f32]) {
    dot_strided_portable(q, m, stride, offset, out)
}

#[target_feature(enable = "avx2")]
fn axpy_avx2(p: &[f32], m: &[f32], stride: usize, offset: usize, y: &mut [f32]) {
    axpy_strided_portable::<64>(p, m, stride, offset, y)
}

#[target_feature(enable = "avx512f,avx2")]
fn axpy_avx512(p: &[f32], m: &[f32], stride: usize, offset: usize, y: &mut [f32]) {
    axpy_strided_portable::<128>(p, m, stride, offset, y)
}

/// `dot_strided` for `isa` (AVX2 or AVX-512; the caller checked [`Isa::supported`]).
pub(crate) fn dot_strided(
    isa: Isa,
    q: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    out: &mut [f32],
) {
    match isa {
        // SAFETY: the caller checked that this CPU supports `isa` (AVX-512F implies AVX2 on
        // every CPU `Isa::supported` accepts for Avx512); the body is safe code.
        Isa::Avx512 => unsafe { dot_avx512(q, m, stride, offset, out) },
        // SAFETY: as above, AVX2.
        Isa::Avx2Fma => unsafe { dot_avx2(q, m, stride, offset, out) },
        Isa::Scalar => dot_strided_portable(q, m, stride, offset, out),
    }
}

/// `axpy_strided` for `isa` (AVX2 or AVX-512; the caller checked [`Isa::supported`]).
pub(crate) fn axpy_strided(
    isa: Isa,
    p: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    y: &mut [f32],
) {
    match isa {
        // SAFETY: as in `dot_strided`.
        Isa::Avx512 => unsafe { axpy_avx512(p, m, stride, offset, y) },
        // SAFETY: as in `dot_strided`.
        Isa::Avx2Fma => unsafe { axpy_avx2(p, m, stride, offset, y) },
        Isa::Scalar => axpy_strided_portable::<32>(p, m, stride, offset, y),
    }
}
