//! The integer-activation rule (`q8a.rs`) on x86-64: AVX-512 VNNI (`vpdpbusd`, 16 lanes in one
//! register) and AVX2 (`vpmaddubsw` + `vpmaddwd`, the 16 lanes as two registers of 8). Both
//! compute every lane's integer sum exactly and then the rule's f32 steps in its order, so
//! their results are the scalar twin's bit for bit.
//!
//! - VNNI multiplies unsigned by signed bytes: int4 codes (0..15) as they are, the offset
//!   applied as `-8 * sum q` per lane (the lane's `qsum`) added to the integer sum; int8 codes
//!   as `code + 128` (`xor 0x80`) and `-128 * sum q`; mxfp4 codes looked up (`vpshufb`) as
//!   `E2M1_DOUBLED + 12` (0..=24) and `-12 * sum q`.
//! - AVX2: int4 and mxfp4 codes as for VNNI; int8 as `|code|` times `q` with the code's sign
//!   (`vpsignb`), so a pair of products stays within i16 (128 * 127 * 2 < 2^15; mxfp4:
//!   24 * 127 * 2).

use crate::avx2_ggml::f16_at;
use crate::q8a::{group_of, Kind, QAct, BLOCK, LANES, MXFP4_OFFSET};
use coli_format::encoding::ggml::IqTables;
use coli_format::encoding::mxfp4::{e8m0_half, E2M1_DOUBLED};
use coli_format::encoding::GgmlType;
use coli_format::{MatrixView, INTERLEAVE_ROWS};
use std::arch::x86_64::*;

/// Bytes ahead of the chunk being read that the VNNI kernel prefetches.
/// `$m!(SRC)` with the in-place source constant of the i-quant type `$t` (one that
/// [`iq_source`] admits): the const generic the tiles and [`iq_chunk`] take.
macro_rules! with_iq_source {
    ($t:expr, $m:ident) => {
        match $t {
            GgmlType::IQ2_XXS => $m!(FROM_IQ2_XXS),
            GgmlType::IQ2_XS => $m!(FROM_IQ2_XS),
            GgmlType::IQ2_S => $m!(FROM_IQ2_S),
            GgmlType::IQ3_XXS => $m!(FROM_IQ3_XXS),
            GgmlType::IQ3_S => $m!(FROM_IQ3_S),
            GgmlType::IQ4_XS => $m!(FROM_IQ4_XS),
            _ => unreachable!("an i-quant with an in-place source"),
        }
    };
}

const PREFETCH: usize = 1024;
/// Tokens per pass over a weight row in the matmul kernels.
const TILE: usize = 4;
/// Rows per pass in the matmul kernels.
const TILE_ROWS: usize = 2;
/// Tokens per pass over an interleaved block of 4 rows ([`block_vnni`]).
const BLOCK_TILE: usize = 4;

/// Step 4 of the rule over two 8-lane halves (`lo` = lanes 0..8).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sum16_halves(lo: __m256, hi: __m256) -> f32 {
    let v8 = _mm256_add_ps(lo, hi);
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1)))
}

/// `group_of(g, k, _)` for a group size `g` that is a multiple of 64, without a division for
/// the common `g == 64` (a division per chunk costs as much as reading the chunk from RAM).
#[inline]
fn wide_group(g: usize, k: usize) -> usize {
    if g == 64 {
        k
    } else {
        group_of(g, k, 0)
    }
}

/// The 16 lanes' multipliers' group scales for chunk `k` of an int4 row: 8-lane vectors
/// (lanes 0..8 and 8..16 have the same pattern).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn int4_scales8(srow: &[f32], g: usize, k: usize) -> __m256 {
    if g == 32 {
        _mm256_blend_ps(
            _mm256_set1_ps(srow[group_of(g, k, 0)]),
            _mm256_set1_ps(srow[group_of(g, k, 4)]),
            0xF0,
        )
    } else {
        _mm256_set1_ps(srow[wide_group(g, k)])
    }
}

/// The 16 mxfp4 codes' unsigned integer form `E2M1_DOUBLED + MXFP4_OFFSET`, twice (a `vpshufb`
/// table for each 128-bit half of a 256-bit register).
const MXFP4_LUT: [i8; 32] = {
    let mut t = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = E2M1_DOUBLED[i % 16] + MXFP4_OFFSET as i8;
        i += 1;
    }
    t
};

/// The 16 lanes' multipliers' block scales for chunk `k` of an mxfp4 row (`e`: the row's e8m0
/// scales): lanes 0..4 of each 8-lane half take block `2k`, lanes 4..8 block `2k + 1`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn mxfp4_scales8(e: &[u8], k: usize) -> __m256 {
    _mm256_blend_ps(
        _mm256_set1_ps(e8m0_half(e[group_of(BLOCK, k, 0)])),
        _mm256_set1_ps(e8m0_half(e[group_of(BLOCK, k, 4)])),
        0xF0,
    )
}

/// An int4 or mxfp4 chunk's 32 packed bytes as two registers of 32 unsigned codes: the low
/// nibbles (the chunk's even columns) and the high ones (odd columns); mxfp4's looked up as
/// `E2M1_DOUBLED + 12`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn nibbles<const MX: bool>(packed: __m256i) -> (__m256i, __m256i) {
    let m0f = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(packed, m0f);
    let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m0f);
    if MX {
        // SAFETY: 32 readable bytes in `MXFP4_LUT`.
        let lut = unsafe { _mm256_loadu_si256(MXFP4_LUT.as_ptr().cast()) };
        (_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi))
    } else {
        (lo, hi)
    }
}

/// A token's quantized activations in lane order: `(q, d, corr)` ([`QAct::token`]).
type Tok<'a> = (&'a [i8], &'a [f32], &'a [i32]);
/// A row of a matrix: its codes by 64-column chunks, its f32 scales (int8, int4) and its e8m0
/// scales (mxfp4).
#[derive(Clone, Copy)]
struct Row<'a> {
    /// From the row's first chunk on: chunk `k` (32 bytes for int4 and mxfp4, 64 for int8)
    /// at `k * step`.
    codes: &'a [u8],
    /// Bytes from one chunk of the row to the next: one chunk (row-major) or
    /// `INTERLEAVE_ROWS` chunks (an interleaved view's whole blocks).
    step: usize,
    scales: &'a [f32],
    e8m0: &'a [u8],
}

/// Bytes of a 64-column chunk of `kind`.
fn chunk_bytes(kind: Kind) -> usize {
    match kind {
        Kind::Int8 => 64,
        _ => 32,
    }
}

/// The number of 64-column chunks of the rows and tokens, after asserting that every row and
/// token has the lengths of one (the kernels' loads rely on it).
fn checked_chunks(kind: Kind, rows: &[Row<'_>], toks: &[Tok<'_>]) -> usize {
    let chunks = toks[0].0.len() / 64;
    for (q, d, c) in toks {
        assert!(q.len() == 64 * chunks && d.len() == LANES * chunks && c.len() == LANES * chunks);
    }
    if matches!(kind, Kind::Ggml(_)) {
        unreachable!("ggml kinds run ggml_rows (q8a_chunk)");
    }
    let cb = chunk_bytes(kind);
    for row in rows {
        assert!(chunks > 0 && row.step >= cb && row.codes.len() >= (chunks - 1) * row.step + cb);
        assert!(kind != Kind::Mxfp4 || row.e8m0.len() == 2 * chunks);
    }
    chunks
}

/// AVX2: `R` rows against `T` tokens (`R * T` independent accumulator chains, each in the
/// rule's order).
///
/// # Safety
/// AVX2 and FMA are available; the rows and tokens have the lengths of rows of a `kind` matrix
/// with `toks[_].0.len()` columns (checked by assertions).
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<const R: usize, const T: usize, const MX: bool>(
    kind: Kind,
    rows: [Row<'_>; R],
    toks: [Tok<'_>; T],
) -> [[f32; T]; R] {
    let chunks = checked_chunks(kind, &rows, &toks);
    let ones = _mm256_set1_epi16(1);
    let mut lo = [[_mm256_setzero_ps(); T]; R];
    let mut hi = [[_mm256_setzero_ps(); T]; R];
    for k in 0..chunks {
        let q0 = 64 * k;
        let l0 = LANES * k;
        for r in 0..R {
            let Row {
                codes,
                step,
                scales,
                e8m0,
            } = rows[r];
            match kind {
                Kind::Ggml(_) => unreachable!("ggml kinds run ggml_rows (q8a_chunk)"),
                Kind::Int4 { .. } | Kind::Mxfp4 => {
                    // SAFETY: 32 readable bytes at `k * step` (asserted above).
                    let packed = unsafe { _mm256_loadu_si256(codes.as_ptr().add(k * step).cast()) };
                    let (wl, wh) = nibbles::<MX>(packed);
                    let s = match kind {
                        Kind::Int4 { group } if !MX => int4_scales8(scales, group, k),
                        _ => mxfp4_scales8(e8m0, k),
                    };
                    for t in 0..T {
                        let (q, d, c) = toks[t];
                        // SAFETY: the loads read within `q`, `d` and `c` (asserted above).
                        unsafe {
                            let ql = _mm256_loadu_si256(q.as_ptr().add(q0).cast());
                            let qh = _mm256_loadu_si256(q.as_ptr().add(q0 + 32).cast());
                            let cl = _mm256_loadu_si256(c.as_ptr().add(l0).cast());
                            let ch = _mm256_loadu_si256(c.as_ptr().add(l0 + 8).cast());
                            let pl = _mm256_add_epi32(
                                _mm256_madd_epi16(_mm256_maddubs_epi16(wl, ql), ones),
                                cl,
                            );
                            let ph = _mm256_add_epi32(
                                _mm256_madd_epi16(_mm256_maddubs_epi16(wh, qh), ones),
                                ch,
                            );
                            let ml = _mm256_mul_ps(_mm256_loadu_ps(d.as_ptr().add(l0)), s);
                            let mh = _mm256_mul_ps(_mm256_loadu_ps(d.as_ptr().add(l0 + 8)), s);
                            lo[r][t] = _mm256_fmadd_ps(ml, _mm256_cvtepi32_ps(pl), lo[r][t]);
                            hi[r][t] = _mm256_fmadd_ps(mh, _mm256_cvtepi32_ps(ph), hi[r][t]);
                        }
                    }
                }
                Kind::Int8 => {
                    // SAFETY: 64 readable bytes at `k * step` (asserted above).
                    let (wl, wh) = unsafe {
                        (
                            _mm256_loadu_si256(codes.as_ptr().add(k * step).cast()),
                            _mm256_loadu_si256(codes.as_ptr().add(k * step + 32).cast()),
                        )
                    };
                    let (al, ah) = (_mm256_abs_epi8(wl), _mm256_abs_epi8(wh));
                    for t in 0..T {
                        let (q, d, _) = toks[t];
                        // SAFETY: the loads read within `q` and `d` (asserted above).
                        unsafe {
                            let ql =
                                _mm256_sign_epi8(_mm256_loadu_si256(q.as_ptr().add(q0).cast()), wl);
                            let qh = _mm256_sign_epi8(
                                _mm256_loadu_si256(q.as_ptr().add(q0 + 32).cast()),
                                wh,
                            );
                            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(al, ql), ones);
                            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(ah, qh), ones);
                            let dl = _mm256_loadu_ps(d.as_ptr().add(l0));
                            let dh = _mm256_loadu_ps(d.as_ptr().add(l0 + 8));
                            lo[r][t] = _mm256_fmadd_ps(dl, _mm256_cvtepi32_ps(pl), lo[r][t]);
                            hi[r][t] = _mm256_fmadd_ps(dh, _mm256_cvtepi32_ps(ph), hi[r][t]);
                        }
                    }
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            let v = sum16_halves(lo[r][t], hi[r][t]);
            out[r][t] = match kind {
                Kind::Ggml(_) => unreachable!("ggml kinds run ggml_rows (q8a_chunk)"),
                Kind::Int8 => v * rows[r].scales[0],
                Kind::Int4 { .. } | Kind::Mxfp4 => v,
            };
        }
    }
    out
}

/// AVX-512 VNNI: as [`dot_avx2`], 16 lanes per register.
///
/// # Safety
/// AVX-512F, AVX-512 VNNI, AVX2 and FMA are available; lengths as [`dot_avx2`].
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512vnni,avx2,fma")]
unsafe fn dot_vnni<const R: usize, const T: usize, const MX: bool>(
    kind: Kind,
    rows: [Row<'_>; R],
    toks: [Tok<'_>; T],
) -> [[f32; T]; R] {
    let chunks = checked_chunks(kind, &rows, &toks);
    let m0f = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for k in 0..chunks {
        let q0 = 64 * k;
        let l0 = LANES * k;
        // The tokens' vectors of this chunk, shared by the R rows.
        let mut qv = [_mm512_setzero_si512(); T];
        let mut cv = [_mm512_setzero_si512(); T];
        let mut dv = [_mm512_setzero_ps(); T];
        for t in 0..T {
            let (q, d, c) = toks[t];
            // SAFETY: the loads read within `q`, `d` and `c` (asserted above).
            unsafe {
                qv[t] = _mm512_loadu_si512(q.as_ptr().add(q0).cast());
                cv[t] = _mm512_loadu_si512(c.as_ptr().add(l0).cast());
                dv[t] = _mm512_loadu_ps(d.as_ptr().add(l0));
            }
        }
        for r in 0..R {
            let Row {
                codes,
                step,
                scales,
                e8m0,
            } = rows[r];
            let at = k * step;
            // The 64 codes as unsigned bytes (int4 as they are, int8 plus 128, mxfp4 looked up
            // plus 12: `corr` holds the matching `-8`, `-128` or `-12` times each lane's sum of
            // q) and the group scales.
            let (w, s) = if MX {
                // SAFETY: 32 readable bytes at `at` (asserted above); a prefetch of any address
                // is allowed (it never faults).
                let packed = unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(codes.as_ptr().wrapping_add(at + PREFETCH).cast());
                    _mm256_loadu_si256(codes.as_ptr().add(at).cast())
                };
                let (lo, hi) = nibbles::<true>(packed);
                let both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                (both, Some(dup256(mxfp4_scales8(e8m0, k))))
            } else {
                match kind {
                    Kind::Ggml(_) | Kind::Mxfp4 => {
                        unreachable!("ggml kinds run ggml_rows, mxfp4 with MX")
                    }
                    Kind::Int4 { group } => {
                        // SAFETY: 32 readable bytes at `at` (asserted above); a prefetch never
                        // faults.
                        let packed = unsafe {
                            _mm_prefetch::<_MM_HINT_T0>(
                                codes.as_ptr().wrapping_add(at + PREFETCH).cast(),
                            );
                            _mm256_loadu_si256(codes.as_ptr().add(at).cast())
                        };
                        let both = _mm512_inserti64x4(
                            _mm512_castsi256_si512(packed),
                            _mm256_srli_epi16(packed, 4),
                            1,
                        );
                        let s = if group == 32 {
                            dup256(int4_scales8(scales, group, k))
                        } else {
                            _mm512_set1_ps(scales[wide_group(group, k)])
                        };
                        (_mm512_and_si512(both, m0f), Some(s))
                    }
                    Kind::Int8 => {
                        // SAFETY: 64 readable bytes at `at` (asserted above); a prefetch
                        // never faults.
                        let w = unsafe {
                            _mm_prefetch::<_MM_HINT_T0>(
                                codes.as_ptr().wrapping_add(at + PREFETCH).cast(),
                            );
                            _mm512_loadu_si512(codes.as_ptr().add(at).cast())
                        };
                        (_mm512_xor_si512(w, flip), None)
                    }
                }
            };
            for t in 0..T {
                let p = _mm512_dpbusd_epi32(cv[t], w, qv[t]);
                let m = match s {
                    Some(s) => _mm512_mul_ps(dv[t], s),
                    None => dv[t],
                };
                acc[r][t] = _mm512_fmadd_ps(m, _mm512_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            let a = acc[r][t];
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
            let v = sum16_halves(lo, hi);
            out[r][t] = match kind {
                Kind::Ggml(_) => unreachable!("ggml kinds run ggml_rows (q8a_chunk)"),
                Kind::Int8 => v * rows[r].scales[0],
                Kind::Int4 { .. } | Kind::Mxfp4 => v,
            };
        }
    }
    out
}

/// An 8-lane vector repeated in both halves of a 16-lane one.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn dup256(v: __m256) -> __m512 {
    let d = _mm256_castps_pd(v);
    _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(d), d, 1))
}

/// Tokens `t0 .. t0 + T` against the block of [`INTERLEAVE_ROWS`] rows that starts at row `r`
/// of an interleaved view (`r` a multiple of 4, the block whole): the block's chunks are one
/// sequential stream, the tokens' vectors of a chunk are loaded once for its four rows, and the
/// `4 T` accumulator chains run side by side. Each (row, token)'s arithmetic is [`dot_vnni`]'s
/// (the rule's order): the same bits. `out[u][t]` is row `r + u`, token `t0 + t`.
///
/// # Safety
/// AVX-512F, AVX-512 VNNI, AVX2 and FMA are available; `w` is an interleaved view of `kind`
/// (not ggml; mxfp4 exactly when `MX`), `qa` was quantized for it with at least `t0 + T`
/// tokens.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vnni,avx2,fma")]
unsafe fn block_vnni<const MX: bool, const T: usize>(
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    r: usize,
    t0: usize,
) -> [[f32; T]; INTERLEAVE_ROWS] {
    const U: usize = INTERLEAVE_ROWS;
    let toks: [Tok<'_>; T] = std::array::from_fn(|t| qa.token(t0 + t));
    let (cols, cb) = (w.cols(), chunk_bytes(kind));
    let chunks = cols / 64;
    for (q, d, c) in toks {
        assert!(q.len() == 64 * chunks && d.len() == LANES * chunks && c.len() == LANES * chunks);
    }
    assert!(w.is_interleaved() && r.is_multiple_of(U) && r + U <= w.rows());
    // The block: chunk k of row r + u at `(k U + u) cb`.
    let block = &w.data()[r * chunks * cb..(r + U) * chunks * cb];
    let rows: [Row<'_>; U] = std::array::from_fn(|u| row_of(kind, w, r + u));
    let group = match kind {
        Kind::Int4 { group } => group,
        _ => 0,
    };
    // The rows' scales: f32 per group (int4; int8: one per row, applied at the end) or e8m0
    // bytes per 32 columns (mxfp4), `chunks * 64 / group` or `2 * chunks` of them (row_of).
    let fs: [*const f32; U] = std::array::from_fn(|u| rows[u].scales.as_ptr());
    let es: [*const u8; U] = std::array::from_fn(|u| rows[u].e8m0.as_ptr());
    let m0f = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [[_mm512_setzero_ps(); T]; U];
    for k in 0..chunks {
        // The group scale index of chunk k (int4 with groups of 64 or more).
        let g = if group > 32 { wide_group(group, k) } else { 0 };
        // SAFETY: chunk k of the tokens (asserted lengths); chunk k of the block's rows lies in
        // `block`, its scales at `g` (or `2k`, `2k + 1`) within the rows' scale slices (row_of
        // sliced them whole); a prefetch never faults.
        unsafe {
            let mut qv = [_mm512_setzero_si512(); T];
            let mut cv = [_mm512_setzero_si512(); T];
            let mut dv = [_mm512_setzero_ps(); T];
            for t in 0..T {
                let (q, d, c) = toks[t];
                qv[t] = _mm512_loadu_si512(q.as_ptr().add(64 * k).cast());
                cv[t] = _mm512_loadu_si512(c.as_ptr().add(LANES * k).cast());
                dv[t] = _mm512_loadu_ps(d.as_ptr().add(LANES * k));
            }
            let at = block.as_ptr().add(k * U * cb);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH).cast());
            for u in 0..U {
                let p = at.add(u * cb);
                // The 64 codes as unsigned bytes and the lanes' scale (None: int8, whose row
                // scale comes last).
                let (wv, s) = if MX {
                    let (lo, hi) = nibbles::<true>(_mm256_loadu_si256(p.cast()));
                    let wv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                    let e = es[u];
                    let s8 = _mm256_blend_ps(
                        _mm256_set1_ps(e8m0_half(*e.add(2 * k))),
                        _mm256_set1_ps(e8m0_half(*e.add(2 * k + 1))),
                        0xF0,
                    );
                    (wv, Some(dup256(s8)))
                } else if group != 0 {
                    let packed = _mm256_loadu_si256(p.cast());
                    let both = _mm512_inserti64x4(
                        _mm512_castsi256_si512(packed),
                        _mm256_srli_epi16(packed, 4),
                        1,
                    );
                    let f = fs[u];
                    let s = if group == 32 {
                        dup256(_mm256_blend_ps(
                            _mm256_set1_ps(*f.add(2 * k)),
                            _mm256_set1_ps(*f.add(2 * k + 1)),
                            0xF0,
                        ))
                    } else {
                        _mm512_set1_ps(*f.add(g))
                    };
                    (_mm512_and_si512(both, m0f), Some(s))
                } else {
                    (_mm512_xor_si512(_mm512_loadu_si512(p.cast()), flip), None)
                };
                for t in 0..T {
                    let m = match s {
                        Some(s) => _mm512_mul_ps(dv[t], s),
                        None => dv[t],
                    };
                    let pr = _mm512_dpbusd_epi32(cv[t], wv, qv[t]);
                    acc[u][t] = _mm512_fmadd_ps(m, _mm512_cvtepi32_ps(pr), acc[u][t]);
                }
            }
        }
    }
    // Plain loops: a closure over `acc` made the compiler keep the accumulators in memory
    // through the loop above.
    let mut out = [[0f32; T]; U];
    for u in 0..U {
        for t in 0..T {
            let a = acc[u][t];
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
            let v = sum16_halves(lo, hi);
            out[u][t] = if group == 0 && !MX {
                v * rows[u].scales[0]
            } else {
                v
            };
        }
    }
    out
}

/// One token, row by row, in one target-feature function (so that the dot product inlines);
/// an interleaved view's whole blocks four rows at a time ([`block_vnni`]).
///
/// # Safety
/// AVX-512F, AVX-512 VNNI, AVX2 and FMA are available; as [`rows`] with `n == 1`.
#[target_feature(enable = "avx512f,avx512vnni,avx2,fma")]
unsafe fn matvec_vnni<const MX: bool>(
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    r0: usize,
    y: &mut [f32],
) {
    let tok = qa.token(0);
    let mut i = 0;
    while i < y.len() {
        let r = r0 + i;
        if whole_block(w, r, y.len() - i) {
            // SAFETY: features available (caller); a whole block of an interleaved view.
            let out = unsafe { block_vnni::<MX, 1>(kind, w, qa, r, 0) };
            for (u, o) in out.iter().enumerate() {
                y[i + u] = o[0];
            }
            i += INTERLEAVE_ROWS;
            continue;
        }
        let row = row_of(kind, w, r);
        // SAFETY: features available (caller); the row and token have matching lengths.
        y[i] = unsafe { dot_vnni::<1, 1, MX>(kind, [row], [tok]) }[0][0];
        i += 1;
    }
}

/// [`matvec_vnni`] with the AVX2 kernel.
///
/// # Safety
/// AVX2 and FMA are available; as [`rows`] with `n == 1`.
#[target_feature(enable = "avx2,fma")]
unsafe fn matvec_avx2<const MX: bool>(
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    r0: usize,
    y: &mut [f32],
) {
    let tok = qa.token(0);
    let mut i = 0;
    while i < y.len() {
        let r = r0 + i;
        if whole_block(w, r, y.len() - i) {
            // A whole block of an interleaved view: its four rows side by side read it as one
            // stream.
            let rows: [Row<'_>; INTERLEAVE_ROWS] = std::array::from_fn(|u| row_of(kind, w, r + u));
            // SAFETY: features available (caller); the rows and token have matching lengths.
            let out = unsafe { dot_avx2::<INTERLEAVE_ROWS, 1, MX>(kind, rows, [tok]) };
            for (u, o) in out.iter().enumerate() {
                y[i + u] = o[0];
            }
            i += INTERLEAVE_ROWS;
            continue;
        }
        let row = row_of(kind, w, r);
        // SAFETY: features available (caller); the row and token have matching lengths.
        y[i] = unsafe { dot_avx2::<1, 1, MX>(kind, [row], [tok]) }[0][0];
        i += 1;
    }
}

/// True when row `r` of `w` starts a whole block of an interleaved view and `left` (the rows
/// still to compute from `r` on) covers it: [`block_vnni`] (or the AVX2 4-row tile) can take it.
fn whole_block(w: &MatrixView<'_>, r: usize, left: usize) -> bool {
    let whole = w.rows() / INTERLEAVE_ROWS * INTERLEAVE_ROWS;
    w.is_interleaved()
        && r.is_multiple_of(INTERLEAVE_ROWS)
        && r + INTERLEAVE_ROWS <= whole
        && left >= INTERLEAVE_ROWS
}

/// Row `r` of `w` (of `kind`): its chunks in either row order, its scales.
fn row_of<'a>(kind: Kind, w: &'a MatrixView<'_>, r: usize) -> Row<'a> {
    let cols = w.cols();
    let (cb, chunks) = (chunk_bytes(kind), cols / 64);
    let whole = w.rows() / INTERLEAVE_ROWS * INTERLEAVE_ROWS;
    let (start, step) = if w.is_interleaved() && r < whole {
        let (b, u) = (r / INTERLEAVE_ROWS, r % INTERLEAVE_ROWS);
        (
            (b * chunks * INTERLEAVE_ROWS + u) * cb,
            INTERLEAVE_ROWS * cb,
        )
    } else {
        (r * chunks * cb, cb)
    };
    let codes = &w.data()[start..start + (chunks - 1) * step + cb];
    match kind {
        Kind::Ggml(_) => unreachable!("ggml kinds run ggml_rows (q8a_chunk)"),
        Kind::Int8 => Row {
            codes,
            step,
            scales: &w.scales()[r..r + 1],
            e8m0: &[],
        },
        Kind::Int4 { group } => {
            let ng = cols / group;
            Row {
                codes,
                step,
                scales: &w.scales()[r * ng..(r + 1) * ng],
                e8m0: &[],
            }
        }
        Kind::Mxfp4 => {
            let nb = cols / BLOCK;
            Row {
                codes,
                step,
                scales: &[],
                e8m0: &w.e8m0_scales()[r * nb..(r + 1) * nb],
            }
        }
    }
}

/// `yt[i * n + t] = row (r0 + i) . token t` for `n` tokens of `qa`: one row at a time for one
/// token (decode), [`TILE_ROWS`] rows x [`TILE`] tokens for several; `vnni` picks the AVX-512 VNNI kernel, else AVX2. Every output is the
/// rule's value for its row and token whatever the tile it ran in.
///
/// # Safety
/// AVX2 and FMA are available, and with `vnni` AVX-512F and AVX-512 VNNI; `w` is of `kind`
/// with checked sections; `qa` was quantized for `kind` with `w.cols()` columns and `n` tokens.
pub(crate) unsafe fn rows(
    vnni: bool,
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    // mxfp4 gets its own instances of the kernels (its code lookup and e8m0 scales stay out of
    // the int4 and int8 loops).
    // SAFETY: the caller's guarantees.
    unsafe {
        if kind == Kind::Mxfp4 {
            rows_of::<true>(vnni, kind, w, qa, n, r0, yt)
        } else {
            rows_of::<false>(vnni, kind, w, qa, n, r0, yt)
        }
    }
}

/// [`rows`] with `MX` = (`kind` is mxfp4).
///
/// # Safety
/// As [`rows`].
unsafe fn rows_of<const MX: bool>(
    vnni: bool,
    kind: Kind,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    macro_rules! tile {
        ($r:literal, $t:literal, $i:expr, $tok0:expr) => {{
            let rows: [Row<'_>; $r] = std::array::from_fn(|u| row_of(kind, w, r0 + $i + u));
            let toks: [Tok<'_>; $t] = std::array::from_fn(|u| qa.token($tok0 + u));
            // SAFETY: the caller's guarantees; the rows and tokens have matching lengths.
            let out = unsafe {
                if vnni {
                    dot_vnni::<$r, $t, MX>(kind, rows, toks)
                } else {
                    dot_avx2::<$r, $t, MX>(kind, rows, toks)
                }
            };
            for (u, o) in out.iter().enumerate() {
                let at = ($i + u) * n + $tok0;
                yt[at..at + $t].copy_from_slice(o);
            }
        }};
    }
    let nrows = yt.len() / n;
    let mut i = 0;
    // One token (decode): a row-major view row by row, so the weights stream from RAM in one
    // sequential run (2 or 4 rows read side by side, from 4 places of the row-major section,
    // cut the rate from RAM by a third: 1024 x 2048 int4-g64, 106 us one row at a time, 164-180
    // us side by side, exact 126 us); an interleaved view block by block (its 4 rows are one
    // stream there: `block_vnni`, 1.5x a row at a time; kernels/benches/q8a.rs). Several tokens:
    // 2 rows x 4 tokens, whose 8 accumulator chains the weights are reused by (an interleaved
    // view's blocks: 4 rows x 4 tokens).
    if n == 1 {
        // SAFETY: the caller's guarantees.
        unsafe {
            if vnni {
                matvec_vnni::<MX>(kind, w, qa, r0, yt);
            } else {
                matvec_avx2::<MX>(kind, w, qa, r0, yt);
            }
        }
        return;
    }
    if vnni && w.is_interleaved() {
        // Whole blocks of an interleaved view: 4 rows x TILE tokens, one stream per block.
        while i < nrows {
            let r = r0 + i;
            if !whole_block(w, r, nrows - i) {
                let mut t = 0;
                while t + TILE <= n {
                    tile!(1, 4, i, t);
                    t += TILE;
                }
                while t < n {
                    tile!(1, 1, i, t);
                    t += 1;
                }
                i += 1;
                continue;
            }
            let mut t = 0;
            while t < n {
                let at = |u: usize| (i + u) * n + t;
                if t + BLOCK_TILE <= n {
                    // SAFETY: the caller's guarantees; a whole block of an interleaved view.
                    let out = unsafe { block_vnni::<MX, BLOCK_TILE>(kind, w, qa, r, t) };
                    for (u, o) in out.iter().enumerate() {
                        yt[at(u)..at(u) + BLOCK_TILE].copy_from_slice(o);
                    }
                    t += BLOCK_TILE;
                } else {
                    // SAFETY: as above.
                    let out = unsafe { block_vnni::<MX, 1>(kind, w, qa, r, t) };
                    for (u, o) in out.iter().enumerate() {
                        yt[at(u)] = o[0];
                    }
                    t += 1;
                }
            }
            i += INTERLEAVE_ROWS;
        }
        return;
    }
    {
        while i + TILE_ROWS <= nrows {
            let mut t = 0;
            while t + TILE <= n {
                tile!(2, 4, i, t);
                t += TILE;
            }
            while t < n {
                tile!(2, 1, i, t);
                t += 1;
            }
            i += TILE_ROWS;
        }
    }
    while i < nrows {
        let mut t = 0;
        while t + TILE <= n {
            tile!(1, 4, i, t);
            t += TILE;
        }
        while t < n {
            tile!(1, 1, i, t);
            t += 1;
        }
        i += 1;
    }
}

/// 32 bytes of `b` from `at` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(b: &[u8], at: usize) -> __m256i {
    let v = &b[at..at + 32];
    // SAFETY: `v` holds 32 readable bytes.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Stores 32 codes into `q[at..at + 32]` (bounds checked).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store32(q: &mut [i8], at: usize, v: __m256i) {
    let o = &mut q[at..at + 32];
    // SAFETY: `o` holds 32 writable bytes.
    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) }
}

/// `GgmlType::codes` of a q8_0 block (the same values; AVX2 + F16C).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    a[0] = f16_at(b, 0);
    store32(q, 0, load32(b, 2));
}

/// `GgmlType::codes` of a q4_0 block: low nibbles are columns 0..16, high ones 16..32, each
/// minus 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    a[0] = f16_at(b, 0);
    let v = &b[2..18];
    // SAFETY: `v` holds 16 readable bytes.
    let x = unsafe { _mm_loadu_si128(v.as_ptr().cast()) };
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(x, m);
    let hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    store32(
        q,
        0,
        _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8)),
    );
}

/// `GgmlType::codes` of a q4_k block: groups of 32, `a = d * sc`, `m = -(dmin * mn)` (the
/// reference's f32 operations); group `2i` the low nibbles of bytes `16 + 32 i ..`, `2i + 1`
/// the high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_codes(b: &[u8], q: &mut [i8], a: &mut [f32], m: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = coli_format::encoding::ggml::q4_k_scale_min(&b[4..16]);
    for g in 0..8 {
        a[g] = d * sc[g] as f32;
        m[g] = -(dmin * mn[g] as f32);
    }
    let mask = _mm256_set1_epi8(0x0F);
    for i in 0..4 {
        let x = load32(b, 16 + 32 * i);
        store32(q, 64 * i, _mm256_and_si256(x, mask));
        store32(
            q,
            64 * i + 32,
            _mm256_and_si256(_mm256_srli_epi16(x, 4), mask),
        );
    }
}

/// `GgmlType::codes` of a q6_k block: groups of 16, `a = d * scale`; column `e` (half
/// `h = e / 128`, `k = e % 128`) takes 4 low bits from byte `64 h + k % 64` (shifted by
/// `4 (k / 64)`) and 2 high bits from byte `128 + 32 h + k % 32` (shifted by `2 (k / 32)`),
/// minus 32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_codes(b: &[u8], q: &mut [i8], a: &mut [f32]) {
    let d = f16_at(b, 208);
    for (g, v) in a.iter_mut().enumerate().take(16) {
        *v = d * (b[192 + g] as i8) as f32;
    }
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    for h in 0..2 {
        let qh = load32(b, 128 + 32 * h);
        for p in 0..4 {
            // Columns 128 h + 32 p .. + 32: k = 32 p + 0..32.
            let ql = load32(b, 64 * h + 32 * (p % 2));
            let lo = _mm256_and_si256(
                _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (p / 2) as i32)),
                m4,
            );
            let hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p as i32)), m2);
            let code = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            store32(
                q,
                128 * h + 32 * p,
                _mm256_sub_epi8(code, _mm256_set1_epi8(32)),
            );
        }
    }
}

/// The ggml block types under the rule (step 3's ggml form), AVX2: `yt[i * n + t] = row
/// (r0 + i) . token t`, [`GGML_TILE`] rows at a time. Each row's blocks are unpacked once into their integer form
/// (`GgmlType::codes`: int8 codes, per group the scale `a_g` and offset `m_g`; q8_0, q4_0,
/// q4_k and q6_k with AVX2 here, the same values; q8_0, and for up to 4 tokens q4_0 and (VNNI)
/// q4_k and q6_k, are read in place from the row's blocks instead), then every
/// token runs over it 32 columns (8 lanes) at a time: `p` as `|code|` times `q` with the
/// code's sign (`vpmaddubsw` + `vpmaddwd`; a pair of products stays within i16: 128 * 127 * 2),
/// `s = sum q` likewise against ones, and per lane `acc = fma(d * a_g, p, acc)` then (types
/// with offsets) `acc = fma(d * m_g, s, acc)`: the scalar twin's order, so its bits.
///
/// # Safety
/// AVX2, FMA and F16C are available, and with `vnni` AVX-512F, AVX-512BW and AVX-512 VNNI (then each
/// 64-column chunk runs as one `vpdpbusd`: [`ggml_tile_vnni`]); `w` is a row-major ggml matrix
/// of type `t` (with checked
/// sections) whose `cols` is a multiple of 64; `qa` was quantized for it with `n` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn ggml_rows(
    vnni: bool,
    t: GgmlType,
    w: &MatrixView<'_>,
    qa: &QAct,
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let (bs, ts) = (t.block_size(), t.type_size());
    let stride = t.bytes_of(cols);
    let g = t.code_group().expect("kind() admits integer types only");
    assert!(
        (g == 16 || g == 32) && cols.is_multiple_of(64) && cols.is_multiple_of(bs),
        "ggml rows: group {g}, {cols} columns"
    );
    assert!(!w.is_interleaved(), "ggml matrices stay row-major");
    let per_block = bs / g;
    // Per row of a tile: its codes, and its group scales and offsets (16 spare values: a
    // block's `codes` writes at least 16).
    let gs = cols / g + 16;
    // q8_0's codes and scales are read in place from the row's bytes, and q4_0's (and with
    // VNNI q4_k's, q6_k's and the i-quants' of `iq_source`: `iq_in_place_tokens`) for a few
    // tokens (decode, verification; for more their blocks are unpacked once into the buffer,
    // which the tokens then share).
    let in_place = t == GgmlType::Q8_0
        || (t == GgmlType::Q4_0 && n <= 4)
        || (matches!(t, GgmlType::Q4_K | GgmlType::Q6_K) && n <= 4 && vnni)
        || (iq_source(t).is_some() && n <= iq_in_place_tokens(t) && vnni);
    let iq_tabs = coli_format::encoding::ggml::iq_tables();
    let mut un = Unpacked {
        rows: [&[]; GGML_TILE],
        codes: if in_place {
            Vec::new()
        } else {
            vec![0i8; GGML_TILE * cols]
        },
        a: vec![0f32; GGML_TILE * gs],
        m: vec![0f32; GGML_TILE * gs],
        cols,
        gs,
        g,
        offset: t.has_offset(),
    };
    let nrows = yt.len() / n;
    // One token (decode): one row at a time, so that the weights stream from RAM in one
    // sequential run (as the int4 kernels found, 4 rows read side by side from 4 places of a
    // row-major section are slower from RAM); several: 4 rows per pass.
    let tile = if n == 1 { 1 } else { GGML_TILE };
    for i0 in (0..nrows).step_by(tile) {
        let rows = tile.min(nrows - i0);
        for u in 0..rows {
            let r = r0 + i0 + u;
            let row = &w.data()[r * stride..(r + 1) * stride];
            if in_place {
                // Every in-place source (`FROM_Q8_0`, `FROM_Q4_0`, `FROM_Q4_K`, `FROM_Q6_K`, the
                // `FROM_IQ*`): one pass over the row's bytes per token.
                un.rows[u] = row;
                continue;
            }
            for blk in 0..cols / bs {
                let b = &row[blk * ts..(blk + 1) * ts];
                let q = &mut un.codes[u * cols + blk * bs..u * cols + (blk + 1) * bs];
                let at = u * gs + blk * per_block;
                let (ab, mb) = (&mut un.a[at..], &mut un.m[at..]);
                match t {
                    // The block's integer form with AVX2 (this function's features), the
                    // same values as `GgmlType::codes`.
                    GgmlType::Q8_0 => q8_0_codes(b, q, ab),
                    GgmlType::Q4_0 => q4_0_codes(b, q, ab),
                    GgmlType::Q4_K => q4_k_codes(b, q, ab, mb),
                    GgmlType::Q6_K => q6_k_codes(b, q, ab),
                    // The i-quants decoded in registers, 64 columns at a time.
                    t if vnni && iq_source(t).is_some() => {
                        // SAFETY: `vnni` only where the CPU has AVX-512F, AVX-512BW and
                        // AVX-512 VNNI (the caller's guarantee); `b` is a whole block of `t`.
                        unsafe { iq_unpack(t, b, q, ab, &iq_tabs) }
                    }
                    _ => t.codes(b, q, ab, mb),
                }
            }
        }
        let out = &mut yt[i0 * n..(i0 + rows) * n];
        macro_rules! tiles {
            ($src:expr) => {
                if vnni {
                    // SAFETY: `vnni` only where the CPU has AVX-512F, AVX-512BW and AVX-512 VNNI (the
                    // caller's guarantee).
                    unsafe {
                        match rows {
                            4 => ggml_tile_vnni::<4, { $src }>(&un, qa, n, out),
                            3 => ggml_tile_vnni::<3, { $src }>(&un, qa, n, out),
                            2 => ggml_tile_vnni::<2, { $src }>(&un, qa, n, out),
                            _ => ggml_tile_vnni::<1, { $src }>(&un, qa, n, out),
                        }
                    }
                } else {
                    match rows {
                        4 => ggml_tile::<4, { $src }>(&un, qa, n, out),
                        3 => ggml_tile::<3, { $src }>(&un, qa, n, out),
                        2 => ggml_tile::<2, { $src }>(&un, qa, n, out),
                        _ => ggml_tile::<1, { $src }>(&un, qa, n, out),
                    }
                }
            };
        }
        match t {
            GgmlType::Q8_0 => tiles!(FROM_Q8_0),
            GgmlType::Q4_0 if in_place => tiles!(FROM_Q4_0),
            // SAFETY: `in_place` holds `vnni` for q4_k and q6_k: AVX-512F, AVX-512BW and
            // AVX-512 VNNI are there.
            GgmlType::Q4_K if in_place => unsafe {
                match rows {
                    4 => ggml_tile_vnni::<4, FROM_Q4_K>(&un, qa, n, out),
                    3 => ggml_tile_vnni::<3, FROM_Q4_K>(&un, qa, n, out),
                    2 => ggml_tile_vnni::<2, FROM_Q4_K>(&un, qa, n, out),
                    _ => ggml_tile_vnni::<1, FROM_Q4_K>(&un, qa, n, out),
                }
            },
            // SAFETY: as for q4_k.
            GgmlType::Q6_K if in_place => unsafe {
                match rows {
                    4 => ggml_tile_vnni::<4, FROM_Q6_K>(&un, qa, n, out),
                    3 => ggml_tile_vnni::<3, FROM_Q6_K>(&un, qa, n, out),
                    2 => ggml_tile_vnni::<2, FROM_Q6_K>(&un, qa, n, out),
                    _ => ggml_tile_vnni::<1, FROM_Q6_K>(&un, qa, n, out),
                }
            },
            // SAFETY: as for q4_k.
            t if in_place && iq_source(t).is_some() => unsafe {
                macro_rules! iq {
                    ($src:expr) => {
                        match rows {
                            4 => ggml_tile_vnni::<4, { $src }>(&un, qa, n, out),
                            3 => ggml_tile_vnni::<3, { $src }>(&un, qa, n, out),
                            2 => ggml_tile_vnni::<2, { $src }>(&un, qa, n, out),
                            _ => ggml_tile_vnni::<1, { $src }>(&un, qa, n, out),
                        }
                    };
                }
                with_iq_source!(t, iq)
            },
            _ => tiles!(FROM_BUF),
        }
    }
}

/// Tokens up to which [`ggml_rows`] decodes an i-quant's blocks in registers for every token
/// instead of unpacking them once into the buffer the tokens share (measured:
/// `kernels/benches/results/q8a_iquant_in_place_2026-12-06.txt`; iq4_xs's nibbles cost little
/// to decode again, the lattice gathers of the others more).
fn iq_in_place_tokens(t: GgmlType) -> usize {
    if t == GgmlType::IQ4_XS {
        4
    } else {
        1
    }
}

/// One i-quant block `b` of type `t` (with an in-place source) unpacked into its integer form
/// with [`iq_chunk`]: its 256 codes into `q`, its group scales into `a` (the values
/// `GgmlType::codes` writes).
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn iq_unpack(t: GgmlType, b: &[u8], q: &mut [i8], a: &mut [f32], tabs: &IqTables) {
    macro_rules! unpack {
        ($src:expr) => {{
            let per = 64 / iq_block($src).1;
            assert!(q.len() >= 256 && a.len() >= 4 * per);
            for c in 0..4 {
                // SAFETY: this function's features are `iq_chunk`'s; `b` is a whole block.
                let (s, codes) = unsafe { iq_chunk::<{ $src }>(b, c, tabs) };
                let mut sv = [0f32; 4];
                // SAFETY: 4 floats into `sv`; 64 bytes at 64 c of `q` (asserted above).
                unsafe {
                    _mm_storeu_ps(sv.as_mut_ptr(), s);
                    _mm512_storeu_si512(q.as_mut_ptr().add(64 * c).cast(), codes);
                }
                a[per * c..per * (c + 1)].copy_from_slice(&sv[..per]);
            }
        }};
    }
    with_iq_source!(t, unpack)
}

/// Rows of a ggml matrix per pass of [`ggml_rows`]: each token's activation codes and scales
/// are loaded once for them, and their accumulator chains interleave.
const GGML_TILE: usize = 4;

/// Up to [`GGML_TILE`] rows of a ggml matrix in their integer form (row `u` at `u * cols` in
/// `codes`, at `u * gs` in `a` and `m`; a q8_0 row's codes are read from its blocks in `rows`).
struct Unpacked<'a> {
    /// q8_0: the rows' bytes (34-byte blocks, codes at 2..34 of each).
    rows: [&'a [u8]; GGML_TILE],
    codes: Vec<i8>,
    a: Vec<f32>,
    m: Vec<f32>,
    cols: usize,
    /// Group scales (and offsets) per row, with spare room.
    gs: usize,
    /// Columns per group: 16 or 32.
    g: usize,
    /// The type has offsets `m`.
    offset: bool,
}

impl Unpacked<'_> {
    /// Asserts what [`ggml_tile`] and [`ggml_tile_vnni`] read of `R` rows from `SRC` for `n`
    /// tokens into an output of `out_len` values: each row's scales and codes (the buffer, or
    /// whole q8_0 / q4_0 blocks of `cols` columns).
    fn check<const R: usize, const SRC: u8>(&self, n: usize, out_len: usize) {
        let (cols, gs, g) = (self.cols, self.gs, self.g);
        assert!(self.a.len() >= R * gs && self.m.len() >= R * gs && out_len == R * n);
        assert!(SRC != FROM_BUF || self.codes.len() >= R * cols);
        let (block, per) = match SRC {
            FROM_Q8_0 => (34, 32),
            FROM_Q4_0 => (18, 32),
            FROM_Q4_K => (144, 256),
            FROM_Q6_K => (210, 256),
            _ if SRC >= FROM_IQ2_XXS => (iq_block(SRC).0, 256),
            _ => return,
        };
        let group = match SRC {
            FROM_Q6_K => 16,
            _ if SRC >= FROM_IQ2_XXS => iq_block(SRC).1,
            _ => 32,
        };
        assert!(
            g == group
                && cols.is_multiple_of(per)
                && self.rows[..R].iter().all(|r| r.len() == cols / per * block)
        );
    }
}

/// Where [`ggml_tile`] reads a row's codes: the unpacked buffer.
const FROM_BUF: u8 = 0;
/// In place from q8_0 blocks (34 bytes: f16 `d`, 32 int8 codes).
const FROM_Q8_0: u8 = 1;
/// In place from q4_0 blocks (18 bytes: f16 `d`, 16 bytes of nibbles: columns 0..16 low,
/// 16..32 high; the code is the nibble minus 8, taken as `-8 * sum q` off the unsigned sum).
const FROM_Q4_0: u8 = 2;
/// In place from q4_k blocks (144 bytes: f16 `d` and `dmin`, 12 bytes of 6-bit scales and
/// mins, 128 bytes of nibbles: 64-column chunk `i` of the block is bytes `16 + 32 i ..`, its
/// first 32 columns the low nibbles, the next 32 the high ones); the codes are the nibbles
/// (unsigned, no offset), each block's `a_g = d * sc_g` and `m_g = -(dmin * m_g)` computed as
/// `GgmlType::codes` computes them. VNNI only.
const FROM_Q4_K: u8 = 3;
/// In place from q6_k blocks (210 bytes: 128 bytes `ql`, 64 bytes `qh`, 16 signed scales, f16
/// `d`): 64-column chunk `c` of the block (half `h = c / 2`, `s = c % 2`) has the low nibbles
/// `(ql[64 h ..][..64] >> 4 s) & 15` and the high bits `(qh[32 h ..][..32] >> 4 s) & 3` (its
/// first 32 columns), `>> (4 s + 2)` (the next 32); the code `lo | hi << 4` is unsigned, its
/// offset -32 taken as `-32 * sum q`; `a_g = d * scales[g]` per 16 columns, as
/// `GgmlType::codes` computes it. VNNI only.
const FROM_Q6_K: u8 = 4;
/// In place from i-quant blocks ([`iq_chunk`]): iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s,
/// iq4_xs (every `FROM_IQ*` is at least [`FROM_IQ2_XXS`]). VNNI only.
const FROM_IQ2_XXS: u8 = 5;
const FROM_IQ2_XS: u8 = 6;
const FROM_IQ2_S: u8 = 7;
const FROM_IQ3_XXS: u8 = 8;
const FROM_IQ3_S: u8 = 9;
const FROM_IQ4_XS: u8 = 10;

/// The in-place source of an i-quant type, if it has one.
fn iq_source(t: GgmlType) -> Option<u8> {
    Some(match t {
        GgmlType::IQ2_XXS => FROM_IQ2_XXS,
        GgmlType::IQ2_XS => FROM_IQ2_XS,
        GgmlType::IQ2_S => FROM_IQ2_S,
        GgmlType::IQ3_XXS => FROM_IQ3_XXS,
        GgmlType::IQ3_S => FROM_IQ3_S,
        GgmlType::IQ4_XS => FROM_IQ4_XS,
        _ => return None,
    })
}

/// Block bytes and group size of an i-quant source.
const fn iq_block(src: u8) -> (usize, usize) {
    match src {
        FROM_IQ2_XXS => (66, 32),
        FROM_IQ2_XS => (74, 16),
        FROM_IQ2_S => (82, 16),
        FROM_IQ3_XXS => (98, 32),
        FROM_IQ3_S => (110, 32),
        _ => (136, 32),
    }
}

/// 64-column chunk `c` (`0..4`) of the 256-column i-quant block `b`, decoded in registers: the
/// group scales of its 4 groups of 16 (iq2_xs, iq2_s) or 2 groups of 32 (the others; lanes 2, 3
/// zero) and its 64 signed codes in column order, the values and f32 steps of
/// `GgmlType::codes` (ggml's layouts, `format/src/encoding/ggml/*.rs`): lattice points
/// gathered from [`IqTables`] by their indices (iq2_*: 8 points of 8 values, iq3_*: 16 of 4),
/// signed by a byte mask (`(p ^ m) - m`: the 7-bit `KSIGNS` index's mask, or the sign bytes
/// as they are for iq2_s and iq3_s), iq4_xs's nibbles looked up in its 16 levels.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available; `b` is a whole block
/// of `SRC`'s type.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn iq_chunk<const SRC: u8>(b: &[u8], c: usize, t: &IqTables) -> (__m128, __m512i) {
    assert!(b.len() == iq_block(SRC).0 && c < 4);
    let d = f16_at(b, 0);
    let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    // Byte masks of 8 seven-bit sign indices, the bits of `s0` (entries 0..4) and `s1`.
    let ksigns = |s0: u32, s1: u32| {
        let v = _mm512_set_epi64(
            s1 as i64, s1 as i64, s1 as i64, s1 as i64, s0 as i64, s0 as i64, s0 as i64, s0 as i64,
        );
        let at = _mm512_and_si512(
            _mm512_srlv_epi64(v, _mm512_set_epi64(21, 14, 7, 0, 21, 14, 7, 0)),
            _mm512_set1_epi64(127),
        );
        // SAFETY: indices below 128, the table's length.
        unsafe { _mm512_i64gather_epi64::<8>(at, t.ksign_masks.as_ptr().cast()) }
    };
    let sign = |p: __m512i, m: __m512i| _mm512_sub_epi8(_mm512_xor_si512(p, m), m);
    // 16-column groups' `d * (0.5 + ls) * 0.25` of the nibbles of bytes `at`, `at + 1`.
    let nibble_scales = |at: usize| {
        let (s0, s1) = (b[at], b[at + 1]);
        let ls = _mm_setr_ps(
            (s0 & 15) as f32,
            (s0 >> 4) as f32,
            (s1 & 15) as f32,
            (s1 >> 4) as f32,
        );
        _mm_mul_ps(
            _mm_mul_ps(_mm_set1_ps(d), _mm_add_ps(_mm_set1_ps(0.5), ls)),
            _mm_set1_ps(0.25),
        )
    };
    match SRC {
        FROM_IQ2_XXS | FROM_IQ3_XXS => {
            // Groups 2c and 2c + 1: each 8 bytes of indices (iq2_xxs: 4, then its u32; iq3_xxs:
            // 8) and a u32 of 4 sign indices and the scale.
            let (s0, s1) = if SRC == FROM_IQ2_XXS {
                (u32_at(2 + 16 * c + 4), u32_at(2 + 16 * c + 12))
            } else {
                (u32_at(66 + 8 * c), u32_at(66 + 8 * c + 4))
            };
            let f = if SRC == FROM_IQ2_XXS { 0.25 } else { 0.5 };
            let a = |s: u32| d * (0.5 + (s >> 28) as f32) * f;
            let p = if SRC == FROM_IQ2_XXS {
                let idx = (u32_at(2 + 16 * c) as u64) | (u32_at(2 + 16 * c + 8) as u64) << 32;
                let at = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(idx as i64));
                // SAFETY: indices below 256, the grid's length.
                unsafe { _mm512_i64gather_epi64::<8>(at, t.iq2xxs_grid.as_ptr().cast()) }
            } else {
                // SAFETY: 16 bytes at 2 + 16 c lie within the 98-byte block.
                let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
                // SAFETY: indices below 256, the grid's length.
                unsafe {
                    _mm512_i32gather_epi32::<4>(
                        _mm512_cvtepu8_epi32(x),
                        t.iq3xxs_grid.as_ptr().cast(),
                    )
                }
            };
            (_mm_setr_ps(a(s0), a(s1), 0.0, 0.0), sign(p, ksigns(s0, s1)))
        }
        FROM_IQ2_XS => {
            // SAFETY: 16 bytes of qs at 2 + 16 c lie within the 74-byte block.
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
            let v = _mm512_cvtepu16_epi64(x);
            // SAFETY: indices below 512 and 128, the tables' lengths.
            let (p, m) = unsafe {
                (
                    _mm512_i64gather_epi64::<8>(
                        _mm512_and_si512(v, _mm512_set1_epi64(511)),
                        t.iq2xs_grid.as_ptr().cast(),
                    ),
                    _mm512_i64gather_epi64::<8>(
                        _mm512_srli_epi64::<9>(v),
                        t.ksign_masks.as_ptr().cast(),
                    ),
                )
            };
            (nibble_scales(66 + 2 * c), sign(p, m))
        }
        FROM_IQ2_S => {
            // Entries 8c .. 8c + 8: qs bytes, 2 high bits each from qh bytes 2c, 2c + 1.
            let lo = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128(u64_at(2 + 8 * c) as i64));
            let qh = u16::from_le_bytes([b[66 + 2 * c], b[67 + 2 * c]]) as i64;
            let hi = _mm512_and_si512(
                _mm512_srlv_epi64(
                    _mm512_set1_epi64(qh),
                    _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0),
                ),
                _mm512_set1_epi64(3),
            );
            let at = _mm512_or_si512(lo, _mm512_slli_epi64::<8>(hi));
            // SAFETY: indices below 1024, the grid's length.
            let p = unsafe { _mm512_i64gather_epi64::<8>(at, t.iq2s_grid.as_ptr().cast()) };
            let m = _mm512_movm_epi8(u64_at(34 + 8 * c));
            (nibble_scales(74 + 2 * c), sign(p, m))
        }
        FROM_IQ3_S => {
            // Entries 16c .. 16c + 16: qs bytes, a high bit each from qh bytes 2c, 2c + 1.
            // SAFETY: 16 bytes at 2 + 16 c lie within the 110-byte block.
            let x = unsafe { _mm_loadu_si128(b.as_ptr().add(2 + 16 * c).cast()) };
            let qh = u16::from_le_bytes([b[66 + 2 * c], b[67 + 2 * c]]) as i32;
            let hi = _mm512_and_si512(
                _mm512_srlv_epi32(
                    _mm512_set1_epi32(qh),
                    _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                ),
                _mm512_set1_epi32(1),
            );
            let at = _mm512_or_si512(_mm512_cvtepu8_epi32(x), _mm512_slli_epi32::<8>(hi));
            // SAFETY: indices below 512, the grid's length.
            let p = unsafe { _mm512_i32gather_epi32::<4>(at, t.iq3s_grid.as_ptr().cast()) };
            let m = _mm512_movm_epi8(u64_at(74 + 8 * c));
            let s = b[106 + c];
            let a = |ls: u8| d * (1 + 2 * ls) as f32;
            (_mm_setr_ps(a(s & 15), a(s >> 4), 0.0, 0.0), sign(p, m))
        }
        _ => {
            // iq4_xs: groups 2c, 2c + 1, 16 bytes of nibbles each (low: columns 0..16).
            let sh = u16::from_le_bytes([b[2], b[3]]);
            let a = |g: usize| {
                let lo = (b[4 + g / 2] >> (4 * (g % 2))) & 0x0F;
                let hi = ((sh >> (2 * g)) & 3) as u8;
                d * ((lo | hi << 4) as i32 - 32) as f32
            };
            // SAFETY: 32 bytes at 8 + 32 c lie within the 136-byte block.
            let (x0, x1) = unsafe {
                (
                    _mm_loadu_si128(b.as_ptr().add(8 + 32 * c).cast()),
                    _mm_loadu_si128(b.as_ptr().add(24 + 32 * c).cast()),
                )
            };
            let mut z = _mm512_castsi128_si512(x0);
            z = _mm512_inserti32x4(z, _mm_srli_epi16(x0, 4), 1);
            z = _mm512_inserti32x4(z, x1, 2);
            z = _mm512_inserti32x4(z, _mm_srli_epi16(x1, 4), 3);
            let nib = _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
            // SAFETY: 16 bytes.
            let lut =
                _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(t.iq4_values.as_ptr().cast()) });
            (
                _mm_setr_ps(a(2 * c), a(2 * c + 1), 0.0, 0.0),
                _mm512_shuffle_epi8(lut, nib),
            )
        }
    }
}

/// The first `R` rows of `un` against every token of `qa`: `out[u * n + t]`, each (row,
/// token) in the rule's order. `SRC`: where the codes are read ([`FROM_BUF`], [`FROM_Q8_0`],
/// [`FROM_Q4_0`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ggml_tile<const R: usize, const SRC: u8>(
    un: &Unpacked<'_>,
    qa: &QAct,
    n: usize,
    out: &mut [f32],
) {
    let (cols, gs, g) = (un.cols, un.gs, un.g);
    un.check::<R, SRC>(n, out.len());
    let arows: [&[f32]; R] = std::array::from_fn(|u| &un.a[u * gs..(u + 1) * gs]);
    let mrows: [&[f32]; R] = std::array::from_fn(|u| &un.m[u * gs..(u + 1) * gs]);
    let ones16 = _mm256_set1_epi16(1);
    let m4 = _mm_set1_epi8(0x0F);
    for tk in 0..n {
        let (q, d, sums) = qa.token(tk);
        assert!(q.len() == cols && d.len() == cols / 4 && sums.len() == cols / 4);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for c in (0..cols).step_by(32) {
            // SAFETY: c + 32 <= cols = q.len(), and the 8 lanes' scales c / 4 .. c / 4 + 8
            // lie within d (asserted above).
            let (qx, dv) = unsafe {
                (
                    _mm256_loadu_si256(q.as_ptr().add(c).cast()),
                    _mm256_loadu_ps(d.as_ptr().add(c / 4)),
                )
            };
            // The lanes' sums of activation codes (offsets; q4_0's -8), from `quantize`.
            // SAFETY: c / 4 + 8 <= cols / 4 = sums.len().
            let sq = unsafe { _mm256_loadu_si256(sums.as_ptr().add(c / 4).cast()) };
            let s = _mm256_cvtepi32_ps(sq);
            let h = (c / 32) % 2;
            for u in 0..R {
                let (a, m) = (arows[u], mrows[u]);
                // Group scales of the 8 lanes (columns c .. c + 32): in place, the block's f16
                // `d`.
                let (av, mv) = if SRC == FROM_Q8_0 {
                    (
                        _mm256_set1_ps(f16_at(un.rows[u], c / 32 * 34)),
                        _mm256_setzero_ps(),
                    )
                } else if SRC == FROM_Q4_0 {
                    (
                        _mm256_set1_ps(f16_at(un.rows[u], c / 32 * 18)),
                        _mm256_setzero_ps(),
                    )
                } else if g == 32 {
                    (_mm256_set1_ps(a[c / 32]), _mm256_set1_ps(m[c / 32]))
                } else {
                    let lo = c / 16;
                    (
                        _mm256_blend_ps(_mm256_set1_ps(a[lo]), _mm256_set1_ps(a[lo + 1]), 0xF0),
                        _mm256_blend_ps(_mm256_set1_ps(m[lo]), _mm256_set1_ps(m[lo + 1]), 0xF0),
                    )
                };
                // SAFETY: row u's codes are u * cols .. (u + 1) * cols of `codes`, or bytes
                // 2..34 (q8_0) / 2..18 (q4_0) of block c / 32 of its `cols / 32` blocks in
                // `rows[u]` (asserted above); c + 32 <= cols.
                let p = unsafe {
                    match SRC {
                        FROM_Q4_0 => {
                            let x =
                                _mm_loadu_si128(un.rows[u].as_ptr().add(c / 32 * 18 + 2).cast());
                            let nib = _mm256_set_m128i(
                                _mm_and_si128(_mm_srli_epi16(x, 4), m4),
                                _mm_and_si128(x, m4),
                            );
                            _mm256_sub_epi32(
                                _mm256_madd_epi16(_mm256_maddubs_epi16(nib, qx), ones16),
                                _mm256_slli_epi32(sq, 3),
                            )
                        }
                        _ => {
                            let wc = if SRC == FROM_Q8_0 {
                                _mm256_loadu_si256(un.rows[u].as_ptr().add(c / 32 * 34 + 2).cast())
                            } else {
                                _mm256_loadu_si256(un.codes.as_ptr().add(u * cols + c).cast())
                            };
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(_mm256_abs_epi8(wc), _mm256_sign_epi8(qx, wc)),
                                ones16,
                            )
                        }
                    }
                };
                acc[u][h] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dv, av), _mm256_cvtepi32_ps(p), acc[u][h]);
                if un.offset {
                    acc[u][h] = _mm256_fmadd_ps(_mm256_mul_ps(dv, mv), s, acc[u][h]);
                }
            }
        }
        for (u, acc) in acc.iter().enumerate() {
            out[u * n + tk] = sum16_halves(acc[0], acc[1]);
        }
    }
}

/// [`ggml_tile`] with AVX-512 VNNI: a 64-column chunk (the rule's 16 lanes) per step,
/// `vpdpbusd` of the codes as unsigned bytes (q4_0's nibbles as they are, taken `-8 * sum q`
/// off; int8 codes plus 128, `-128 * sum q`) with the activation codes. The same lanes, integer
/// sums and f32 steps as [`ggml_tile`], so the same bits.
///
/// # Safety
/// AVX-512F, AVX-512BW, AVX-512 VNNI, AVX2, FMA and F16C are available.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn ggml_tile_vnni<const R: usize, const SRC: u8>(
    un: &Unpacked<'_>,
    qa: &QAct,
    n: usize,
    out: &mut [f32],
) {
    let (cols, gs, g) = (un.cols, un.gs, un.g);
    un.check::<R, SRC>(n, out.len());
    // Lane j's group within a chunk's 4 (g = 16) or 2 (g = 32) groups.
    let idx = if g == 32 {
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    } else {
        _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0)
    };
    let flip = _mm512_set1_epi8(-128);
    let m0f = _mm512_set1_epi8(0x0F);
    let m0f_256 = _mm256_set1_epi8(0x0F);
    let m03 = _mm512_set1_epi8(0x03);
    let iq_tabs = coli_format::encoding::ggml::iq_tables();
    // FROM_Q4_K: row u's current block's 8 group scales and offsets; FROM_Q6_K: its 16
    // `d * scales[g]`.
    let mut blk_a = [[0f32; 8]; R];
    let mut blk_m = [[0f32; 8]; R];
    let mut blk_6 = [[0f32; 16]; R];
    for tk in 0..n {
        let (q, d, sums) = qa.token(tk);
        assert!(q.len() == cols && d.len() == cols / 4 && sums.len() == cols / 4);
        let mut acc = [_mm512_setzero_ps(); R];
        for k in 0..cols / 64 {
            if SRC == FROM_Q4_K && k % 4 == 0 {
                for u in 0..R {
                    // The block's scales, as `GgmlType::codes` (q4_k) computes them.
                    let b = &un.rows[u][k / 4 * 144..k / 4 * 144 + 144];
                    let (dd, dmin) = (f16_at(b, 0), f16_at(b, 2));
                    let (sc, mn) = coli_format::encoding::ggml::q4_k_scale_min(&b[4..16]);
                    for g in 0..8 {
                        blk_a[u][g] = dd * sc[g] as f32;
                        blk_m[u][g] = -(dmin * mn[g] as f32);
                    }
                }
            }
            if SRC == FROM_Q6_K && k % 4 == 0 {
                for u in 0..R {
                    // The block's 16 products `d * scales[g]` at once: the same f32 products
                    // as one at a time.
                    let b = &un.rows[u][k / 4 * 210..k / 4 * 210 + 210];
                    // SAFETY: bytes 192..208 of the 210-byte block are its 16 scales; 16 floats
                    // fit `blk_6[u]`.
                    unsafe {
                        let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                            b.as_ptr().add(192).cast(),
                        )));
                        _mm512_storeu_ps(
                            blk_6[u].as_mut_ptr(),
                            _mm512_mul_ps(_mm512_set1_ps(f16_at(b, 208)), sc),
                        );
                    }
                }
            }
            // SAFETY: 64 k + 64 <= cols = q.len(), 16 k + 16 <= cols / 4 = d.len() =
            // sums.len().
            let (qx, dv, sq) = unsafe {
                (
                    _mm512_loadu_si512(q.as_ptr().add(64 * k).cast()),
                    _mm512_loadu_ps(d.as_ptr().add(16 * k)),
                    // The lanes' sums of activation codes, from `quantize`.
                    _mm512_loadu_si512(sums.as_ptr().add(16 * k).cast()),
                )
            };
            let g0 = 64 * k / g;
            for u in 0..R {
                let a = &un.a[u * gs..(u + 1) * gs];
                // An i-quant chunk: its scales and codes, decoded in registers.
                let iq = if SRC >= FROM_IQ2_XXS {
                    let (bb, _) = iq_block(SRC);
                    let b = &un.rows[u][k / 4 * bb..k / 4 * bb + bb];
                    _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                    // SAFETY: this function's features are `iq_chunk`'s; `b` is block k / 4 of
                    // the row (`check`: the row holds cols / 256 whole blocks).
                    unsafe { iq_chunk::<SRC>(b, k % 4, &iq_tabs) }
                } else {
                    (_mm_setzero_ps(), _mm512_setzero_si512())
                };
                // The lanes' group scales: in place, the two blocks' f16 `d`.
                let a4 = match SRC {
                    FROM_Q8_0 | FROM_Q4_0 => {
                        let ts = if SRC == FROM_Q8_0 { 34 } else { 18 };
                        let row = un.rows[u];
                        // A prefetch of any address is allowed (it never faults).
                        _mm_prefetch::<_MM_HINT_T0>(
                            row.as_ptr().wrapping_add(2 * k * ts + PREFETCH).cast(),
                        );
                        // SAFETY: blocks 2 k and 2 k + 1 lie within the row (`check`: the row
                        // holds cols / 32 blocks, 64 k + 64 <= cols); x86 is little-endian.
                        let pair = unsafe {
                            let at = row.as_ptr().add(2 * k * ts);
                            at.cast::<u16>().read_unaligned() as i32
                                | (at.add(ts).cast::<u16>().read_unaligned() as i32) << 16
                        };
                        _mm_cvtph_ps(_mm_cvtsi32_si128(pair))
                    }
                    // Groups 2 (k % 4) and 2 (k % 4) + 1 of the block (8 of them).
                    FROM_Q4_K => {
                        _mm_prefetch::<_MM_HINT_T0>(
                            un.rows[u].as_ptr().wrapping_add(k * 36 + PREFETCH).cast(),
                        );
                        let p = blk_a[u][2 * (k % 4)..2 * (k % 4) + 2].as_ptr();
                        // SAFETY: 2 floats at `p`.
                        _mm_castsi128_ps(unsafe { _mm_loadl_epi64(p.cast()) })
                    }
                    // The chunk's 4 groups of 16: their `d * scales[g]`, from the block's 16.
                    FROM_Q6_K => {
                        _mm_prefetch::<_MM_HINT_T0>(
                            un.rows[u]
                                .as_ptr()
                                .wrapping_add(k / 4 * 210 + PREFETCH)
                                .cast(),
                        );
                        // SAFETY: 4 floats of the 16 at 4 (k % 4).
                        unsafe { _mm_loadu_ps(blk_6[u].as_ptr().add(4 * (k % 4))) }
                    }
                    // The chunk's group scales, decoded with its codes.
                    _ if SRC >= FROM_IQ2_XXS => iq.0,
                    // SAFETY: groups g0 .. g0 + 4 lie within the row's `gs` (16 spare).
                    _ => unsafe { _mm_loadu_ps(a.as_ptr().add(g0)) },
                };
                let av = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(a4));
                // SAFETY: the codes of columns 64 k .. 64 k + 64 of row u, as in `ggml_tile`
                // (asserted above).
                let (w, corr) = unsafe {
                    match SRC {
                        FROM_Q4_0 => {
                            let b = un.rows[u].as_ptr().add(2 * k * 18 + 2);
                            let x0 = _mm_loadu_si128(b.cast());
                            let x1 = _mm_loadu_si128(b.add(18).cast());
                            let mut z = _mm512_castsi128_si512(x0);
                            z = _mm512_inserti32x4(z, _mm_srli_epi16(x0, 4), 1);
                            z = _mm512_inserti32x4(z, x1, 2);
                            z = _mm512_inserti32x4(z, _mm_srli_epi16(x1, 4), 3);
                            (_mm512_and_si512(z, m0f), _mm512_slli_epi32(sq, 3))
                        }
                        FROM_Q4_K => {
                            let x = _mm256_loadu_si256(
                                un.rows[u]
                                    .as_ptr()
                                    .add(k / 4 * 144 + 16 + 32 * (k % 4))
                                    .cast(),
                            );
                            let z = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_and_si256(x, m0f_256)),
                                _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f_256),
                                1,
                            );
                            (z, _mm512_setzero_si512())
                        }
                        FROM_Q6_K => {
                            let b = un.rows[u].as_ptr().add(k / 4 * 210);
                            let (h, sh) = (k % 4 / 2, 4 * (k % 2) as i64);
                            let lo = _mm512_and_si512(
                                _mm512_srl_epi16(
                                    _mm512_loadu_si512(b.add(64 * h).cast()),
                                    _mm_cvtsi64_si128(sh),
                                ),
                                m0f,
                            );
                            let qh = _mm256_loadu_si256(b.add(128 + 32 * h).cast());
                            let hi = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_srl_epi16(qh, _mm_cvtsi64_si128(sh))),
                                _mm256_srl_epi16(qh, _mm_cvtsi64_si128(sh + 2)),
                                1,
                            );
                            let hi = _mm512_slli_epi16(_mm512_and_si512(hi, m03), 4);
                            (_mm512_or_si512(lo, hi), _mm512_slli_epi32(sq, 5))
                        }
                        _ if SRC >= FROM_IQ2_XXS => {
                            (_mm512_xor_si512(iq.1, flip), _mm512_slli_epi32(sq, 7))
                        }
                        FROM_Q8_0 => {
                            let b = un.rows[u].as_ptr().add(2 * k * 34 + 2);
                            let z = _mm512_inserti64x4(
                                _mm512_castsi256_si512(_mm256_loadu_si256(b.cast())),
                                _mm256_loadu_si256(b.add(34).cast()),
                                1,
                            );
                            (_mm512_xor_si512(z, flip), _mm512_slli_epi32(sq, 7))
                        }
                        _ => {
                            let z =
                                _mm512_loadu_si512(un.codes.as_ptr().add(u * cols + 64 * k).cast());
                            (_mm512_xor_si512(z, flip), _mm512_slli_epi32(sq, 7))
                        }
                    }
                };
                let p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, qx), corr);
                acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, av), _mm512_cvtepi32_ps(p), acc[u]);
                if un.offset {
                    let m = &un.m[u * gs..(u + 1) * gs];
                    let m4 = if SRC == FROM_Q4_K {
                        let p = blk_m[u][2 * (k % 4)..2 * (k % 4) + 2].as_ptr();
                        // SAFETY: 2 floats at `p`.
                        _mm_castsi128_ps(unsafe { _mm_loadl_epi64(p.cast()) })
                    } else {
                        // SAFETY: as for `a`.
                        unsafe { _mm_loadu_ps(m.as_ptr().add(g0)) }
                    };
                    let mv = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(m4));
                    let s = _mm512_cvtepi32_ps(sq);
                    acc[u] = _mm512_fmadd_ps(_mm512_mul_ps(dv, mv), s, acc[u]);
                }
            }
        }
        for (u, a) in acc.iter().enumerate() {
            let lo = _mm512_castps512_ps256(*a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1));
            out[u * n + tk] = sum16_halves(lo, hi);
        }
    }
}

/// Step 1 of the integer rule for one block of 32 activations ([`crate::q8a::quantize_block`])
/// with AVX-512: the same operations on each value (`|x|`'s maximum, which no order changes;
/// `127 / amax` once; `(x inv + 1.5 2^23) - 1.5 2^23`, clamped to ±127), so the same codes
/// and `d`. None, with `q` untouched, when the block holds a NaN (the scalar step's `max`
/// skips NaN, which `vmaxps` does not do the same way) or its largest magnitude is so small
/// that `127 / amax` overflows (a zero then gives `0 * inf`, NaN): such a block takes the scalar
/// step.
///
/// # Safety
/// AVX-512F is available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn quantize_block_avx512(x: &[f32; BLOCK], q: &mut [i8; BLOCK]) -> Option<f32> {
    // SAFETY: `x` holds 32 values and `q` 32 bytes: two 16-lane loads, two 16-byte stores.
    unsafe {
        let v = [
            _mm512_loadu_ps(x.as_ptr()),
            _mm512_loadu_ps(x.as_ptr().add(16)),
        ];
        if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[0]) != 0
            || _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[1]) != 0
        {
            return None;
        }
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        if amax == 0.0 || !amax.is_finite() {
            q.fill(0);
            return Some(if amax == 0.0 { 0.0 } else { f32::NAN });
        }
        let inv = 127.0 / amax;
        if !inv.is_finite() {
            // amax below 127 / f32::MAX: `0 * inf` is NaN, which the scalar step's clamp keeps
            // (code 0) and `vmaxps` does not.
            return None;
        }
        let inv = _mm512_set1_ps(inv);
        let magic = _mm512_set1_ps(crate::q8a::ROUND_MAGIC);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        for (h, &vh) in v.iter().enumerate() {
            let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(vh, inv), magic), magic);
            let r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            // Whole numbers within ±127: the conversion and the narrowing are exact.
            let b = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(r));
            _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), b);
        }
        Some(amax / 127.0)
    }
}
