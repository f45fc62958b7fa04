//! AVX2 twin of the int4 row quantizer of `coli_format::encoding::int4` (used by
//! [`crate::quantize`]). It computes exactly the same IEEE f32/f64 operations, in the same
//! order per accumulator lane, as the scalar reference, so bytes, scales and error sums are
//! bit-identical:
//!
//! - `_mm256_div_ps`, `_mm256_mul_ps`, `_mm256_add_pd`, `_mm256_mul_pd` are correctly rounded
//!   IEEE operations like their scalar counterparts (no FMA contraction is used);
//! - `_mm256_round_ps` with `_MM_FROUND_TO_NEAREST_INT` is round-half-to-even, which is what the
//!   scalar `rne_small` computes for the clamped range `[-9, 8]`.

use coli_format::encoding::MIN_SCALE;
use std::arch::x86_64::*;

/// Quantizes the full groups of `g` (a positive multiple of 8) columns of row `w` into `dst`
/// (zeroed by the caller) and `scales`, adding the error sums to the 8 lanes; returns the
/// number of columns done (the caller quantizes the rest with the reference).
///
/// # Panics
/// If the CPU lacks AVX2, or `dst` / `scales` are too short for the full groups.
pub(crate) fn int4_full_groups(
    w: &[f32],
    g: usize,
    dst: &mut [u8],
    scales: &mut [f32],
    e2: &mut [f64; 8],
    w2: &mut [f64; 8],
) -> usize {
    assert!(
        coli_format::cpu::Isa::Avx2Fma.supported(),
        "the AVX2 int4 quantizer needs AVX2"
    );
    // SAFETY: AVX2 support was just checked.
    unsafe { int4_full_groups_avx2(w, g, dst, scales, e2, w2) }
}

/// Maximum of the 8 lanes (exact; inputs are non-negative and not NaN).
#[target_feature(enable = "avx2")]
fn hmax(m: __m256) -> f32 {
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_max_ss(h, _mm_shuffle_ps::<0b01>(h, h));
    _mm_cvtss_f32(h)
}

/// AVX2 twin of `coli_format::encoding::int4::quantize_groups` over the full groups of a row:
/// same bytes, scales and lane sums.
/// Requires `g % 8 == 0`; `e2`/`w2` are the 8 per-lane (column mod 8) f64 accumulators,
/// continued from their current values; full groups only are handled here, the caller
/// finishes a short last group with the scalar code. Returns the number of columns done.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn int4_full_groups_avx2(
    w: &[f32],
    g: usize,
    dst: &mut [u8],
    scales: &mut [f32],
    e2: &mut [f64; 8],
    w2: &mut [f64; 8],
) -> usize {
    assert!(g.is_multiple_of(8) && g > 0);
    let full = w.len() / g;
    assert!(dst.len() * 2 >= full * g && scales.len() >= full);
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let (lo9, hi8) = (_mm256_set1_ps(-9.0), _mm256_set1_ps(8.0));
    let (lo8, hi7) = (_mm256_set1_ps(-8.0), _mm256_set1_ps(7.0));
    let eight = _mm256_set1_epi32(8);
    #[rustfmt::skip]
    let shuf = _mm256_setr_epi8(
        0, 8, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
        -128, -128, 0, 8, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
    );
    // SAFETY: e2/w2 are [f64; 8]: two unaligned 4-lane loads each.
    let (mut e_lo, mut e_hi, mut w_lo, mut w_hi) = unsafe {
        (
            _mm256_loadu_pd(e2.as_ptr()),
            _mm256_loadu_pd(e2.as_ptr().add(4)),
            _mm256_loadu_pd(w2.as_ptr()),
            _mm256_loadu_pd(w2.as_ptr().add(4)),
        )
    };
    for gi in 0..full {
        let grp = &w[gi * g..(gi + 1) * g];
        let mut m = _mm256_setzero_ps();
        for k in (0..g).step_by(8) {
            // SAFETY: k + 8 <= g == grp.len().
            let x = unsafe { _mm256_loadu_ps(grp.as_ptr().add(k)) };
            m = _mm256_max_ps(m, _mm256_and_ps(x, absmask));
        }
        let s = (hmax(m) / 7.0).max(MIN_SCALE);
        scales[gi] = s;
        let sv = _mm256_set1_ps(s);
        let out = &mut dst[gi * g / 2..(gi + 1) * g / 2];
        for k in (0..g).step_by(8) {
            // SAFETY: k + 8 <= g == grp.len().
            let x = unsafe { _mm256_loadu_ps(grp.as_ptr().add(k)) };
            let v = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(x, sv), lo9), hi8);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            let r = _mm256_min_ps(_mm256_max_ps(r, lo8), hi7);
            let qi = _mm256_cvtps_epi32(r);
            // Nibbles: (q + 8) of columns 2j (low) and 2j+1 (high) into byte j.
            let nib = _mm256_add_epi32(qi, eight);
            let t = _mm256_or_si256(nib, _mm256_srli_epi64::<28>(nib));
            let t = _mm256_shuffle_epi8(t, shuf);
            let p = _mm_or_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            let word = (_mm_cvtsi128_si32(p) as u32).to_le_bytes();
            out[k / 2..k / 2 + 4].copy_from_slice(&word);
            // Error sums: err = (q * s) as f64 - x as f64, per lane = column mod 8.
            let qs = _mm256_mul_ps(_mm256_cvtepi32_ps(qi), sv);
            let (q_lo, q_hi) = (
                _mm256_cvtps_pd(_mm256_castps256_ps128(qs)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(qs)),
            );
            let (x_lo, x_hi) = (
                _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
            );
            let (d_lo, d_hi) = (_mm256_sub_pd(q_lo, x_lo), _mm256_sub_pd(q_hi, x_hi));
            e_lo = _mm256_add_pd(e_lo, _mm256_mul_pd(d_lo, d_lo));
            e_hi = _mm256_add_pd(e_hi, _mm256_mul_pd(d_hi, d_hi));
            w_lo = _mm256_add_pd(w_lo, _mm256_mul_pd(x_lo, x_lo));
            w_hi = _mm256_add_pd(w_hi, _mm256_mul_pd(x_hi, x_hi));
        }
    }
    // SAFETY: e2/w2 are [f64; 8]: two unaligned 4-lane stores each.
    unsafe {
        _mm256_storeu_pd(e2.as_mut_ptr(), e_lo);
        _mm256_storeu_pd(e2.as_mut_ptr().add(4), e_hi);
        _mm256_storeu_pd(w2.as_mut_ptr(), w_lo);
        _mm256_storeu_pd(w2.as_mut_ptr().add(4), w_hi);
    }
    full * g
}
