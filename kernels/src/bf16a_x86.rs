//! The bf16-activation rule (`bf16a.rs`) on x86-64: AVX-512 BF16 (`vdpbf16ps`: the rule's
//! step 3 is this instruction, 32 products per instruction) and AVX2 (the same steps as two
//! f32 FMAs per lane pair). Both give the scalar twin's bits.
//!
//! The AVX2 kernel skips the rule's subnormal handling where it cannot matter: if every nonzero
//! weight of a row and every nonzero activation of a token is at least `2^-50` in magnitude, each
//! product is a multiple of `2^-114` (a bf16 of exponent `e` is a multiple of `2^(e - 7)`), so is
//! every accumulator (a multiple of `2^-114` rounds to one in f32), and a nonzero multiple is
//! never below `2^-126`: no operand is subnormal and no result tiny, and a plain FMA is the
//! rule's `F`. A row or token outside that range (a gate's activation far below 1 can be) runs
//! a checked kernel that reads subnormal weights as zero and watches every result: only a
//! result `r` with `0 < |r| <= 2^-126` can differ from the rule, and where one occurs that row
//! and token run the scalar twin.

use crate::bf16a::{dot_scalar, row_bytes, CHUNK};
use crate::q8a::{sum16, LANES};
use coli_format::MatrixView;
use std::arch::x86_64::*;

/// Tokens per tile of the multi-token AVX-512 BF16 kernel.
const TILE_TOKENS: usize = 4;
/// Rows per tile of the multi-token AVX-512 BF16 kernel: 4 x 4 accumulators, 4 weight
/// registers and one activation register (4 x 5 and 4 x 6 tiles fit the 32 registers on paper,
/// but the compiler spilled accumulators to the stack in their loops: half the speed).
const TILE_ROWS: usize = 4;
/// Tokens per tile of the AVX2 kernel.
const AVX2_TOKENS: usize = 4;

/// Smallest biased exponent of a nonzero bf16 value the AVX2 kernel multiplies with plain FMAs
/// (`2^-50`; see the module note).
const SAFE_EXP: u16 = 127 - 50;

/// Whether every nonzero value of the bf16 patterns `v` is at least `2^-50` in magnitude (or
/// not finite).
pub(crate) fn safe_range(v: impl Iterator<Item = u16>) -> bool {
    // A fold without an early exit, so that it vectorizes.
    !v.fold(false, |bad, b| {
        bad | ((b & 0x7fff) != 0 && ((b >> 7) & 0xff) < SAFE_EXP)
    })
}

/// The bf16 patterns of a little-endian byte row.
fn patterns(row: &[u8]) -> impl Iterator<Item = u16> + '_ {
    row.chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// 64 bytes at `p` as 32 bf16 values.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 are available; 64 bytes at `p` are readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn load_bh(p: *const u8) -> __m512bh {
    // SAFETY: 64 readable bytes (caller); `__m512i` and `__m512bh` are both 64-byte vectors of
    // plain bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
}

/// Steps 2-4 for `R` rows (`w[u]`: `2 * cols` bytes each) and `T` tokens (`x[t]`: `cols` bf16
/// patterns each): `vdpbf16ps` per chunk of 32 columns into one 16-lane accumulator per (row,
/// token), then [`sum16`].
///
/// # Safety
/// AVX-512F and AVX-512 BF16 are available; every `w[u]` is `2 * cols` bytes and every `x[t]`
/// `cols` patterns, `cols` a multiple of 32.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_bf16<const R: usize, const T: usize>(
    w: [&[u8]; R],
    x: [&[u16]; T],
) -> [[f32; T]; R] {
    let chunks = x[0].len() / CHUNK;
    assert!(
        w.iter().all(|r| r.len() == 2 * CHUNK * chunks)
            && x.iter().all(|t| t.len() == CHUNK * chunks),
        "bf16a tile: rows and tokens disagree"
    );
    let wp: [*const u8; R] = std::array::from_fn(|u| w[u].as_ptr());
    let xp: [*const u8; T] = std::array::from_fn(|t| x[t].as_ptr().cast::<u8>());
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for k in 0..chunks {
        // SAFETY: chunk `k < chunks` is the 64 bytes at `64 k` of every row and token (lengths
        // checked above).
        let wv: [__m512bh; R] = std::array::from_fn(|u| unsafe { load_bh(wp[u].add(64 * k)) });
        for t in 0..T {
            // SAFETY: as above.
            let xv = unsafe { load_bh(xp[t].add(64 * k)) };
            for u in 0..R {
                acc[u][t] = _mm512_dpbf16_ps(acc[u][t], wv[u], xv);
            }
        }
    }
    // Plain loops (a closure over `acc` kept every accumulator in memory, stored after each
    // instruction of the loop above: a third of the speed).
    let mut out = [[0f32; T]; R];
    for u in 0..R {
        for t in 0..T {
            out[u][t] = sum16_zmm(acc[u][t]);
        }
    }
    out
}

/// Step 4 over one 16-lane accumulator ([`sum16`]'s order: halves, quarters, pairs).
#[inline]
#[target_feature(enable = "avx512f")]
fn sum16_zmm(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let v8 = _mm256_add_ps(lo, hi);
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    _mm_cvtss_f32(_mm_add_ss(v2, _mm_shuffle_ps::<1>(v2, v2)))
}

/// `yt[i * n + t] = row (r0 + i) of w . token t` under the rule with AVX-512 BF16: one row at a
/// time for one token (the weights stream from RAM in one run), tiles of 4 rows x 4 tokens
/// for more (the task's rows stay in L2 while the tokens pass).
///
/// # Safety
/// AVX-512F and AVX-512 BF16 are available; `bf16a::applies(w)`; `x` is `n` tokens of `cols`
/// rounded activations; `yt.len()` is a multiple of `n` and rows `r0 ..` exist.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn rows_bf16(w: &MatrixView<'_>, x: &[u16], n: usize, r0: usize, yt: &mut [f32]) {
    let cols = w.cols();
    let nrows = yt.len() / n;
    let tok = |t: usize| &x[t * cols..(t + 1) * cols];
    let row = |i: usize| row_bytes(w, r0 + i);
    macro_rules! tile {
        ($r:literal, $t:literal, $i:expr, $t0:expr) => {{
            let (i, t0) = ($i, $t0);
            // SAFETY: the caller's guarantees; rows and tokens have matching lengths.
            let out = unsafe {
                tile_bf16::<$r, $t>(
                    std::array::from_fn(|u| row(i + u)),
                    std::array::from_fn(|u| tok(t0 + u)),
                )
            };
            for (u, o) in out.iter().enumerate() {
                let at = (i + u) * n + t0;
                yt[at..at + $t].copy_from_slice(o);
            }
        }};
    }
    macro_rules! tokens {
        ($r:literal, $i:expr, $t0:expr, $m:expr) => {
            match $m {
                1 => tile!($r, 1, $i, $t0),
                2 => tile!($r, 2, $i, $t0),
                3 => tile!($r, 3, $i, $t0),
                _ => tile!($r, 4, $i, $t0),
            }
        };
    }
    if n == 1 {
        // One row at a time: two rows side by side (two instruction chains) ran 1.2-1.6x faster
        // from cache but 1.8x slower from RAM (13.8 against 24 GB/s on one thread,
        // kernels/benches/results/q8a_bf16a_one_token_rows_2026-12-06.txt), and a decode reads
        // its weights from RAM.
        for i in 0..nrows {
            tile!(1, 1, i, 0);
        }
        return;
    }
    let mut t0 = 0;
    while t0 < n {
        let m = (n - t0).min(TILE_TOKENS);
        let mut i = 0;
        while i + TILE_ROWS <= nrows {
            tokens!(4, i, t0, m);
            i += TILE_ROWS;
        }
        while i < nrows {
            tokens!(1, i, t0, m);
            i += 1;
        }
        t0 += m;
    }
}

/// Steps 2-4 with AVX2 FMAs for one row and `T` tokens, all in the safe range (module note):
/// lane `i`'s odd column (the word's high half, `w & 0xffff0000` as f32) then its even one
/// (`w << 16`), lanes 0-7 and 8-15 in two 8-lane accumulators per token.
///
/// # Safety
/// AVX2 and FMA are available; `w` is `2 * cols` bytes, every `x[t]` `cols` patterns, `cols` a
/// multiple of 32.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const T: usize>(w: &[u8], x: [&[u16]; T]) -> [f32; T] {
    let chunks = w.len() / (2 * CHUNK);
    assert!(
        x.iter().all(|t| t.len() == CHUNK * chunks),
        "bf16a avx2 tile: row and tokens disagree"
    );
    let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let split = |v: __m256i| {
        (
            _mm256_castsi256_ps(_mm256_and_si256(v, hi)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
        )
    };
    let xp: [*const u8; T] = std::array::from_fn(|t| x[t].as_ptr().cast::<u8>());
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    for k in 0..chunks {
        // SAFETY: chunk `k < chunks` is the 64 bytes at `64 k` of the row and of every token.
        let wv = unsafe {
            let p = w.as_ptr().add(64 * k).cast::<__m256i>();
            [
                split(_mm256_loadu_si256(p)),
                split(_mm256_loadu_si256(p.add(1))),
            ]
        };
        for t in 0..T {
            for h in 0..2 {
                // SAFETY: as above.
                let (xo, xe) =
                    split(unsafe { _mm256_loadu_si256(xp[t].add(64 * k + 32 * h).cast()) });
                acc[t][h] = _mm256_fmadd_ps(wv[h].0, xo, acc[t][h]);
                acc[t][h] = _mm256_fmadd_ps(wv[h].1, xe, acc[t][h]);
            }
        }
    }
    let mut out = [0f32; T];
    for t in 0..T {
        let mut a = [0f32; LANES];
        // SAFETY: `a` is 16 f32.
        unsafe {
            _mm256_storeu_ps(a.as_mut_ptr(), acc[t][0]);
            _mm256_storeu_ps(a.as_mut_ptr().add(8), acc[t][1]);
        }
        out[t] = sum16(&a);
    }
    out
}

/// Steps 2-4 with AVX2 FMAs for one row and one token in any range: subnormal weights read as
/// zero, and `None` when some step's plain FMA result `r` has `0 < |r| <= 2^-126` (only there
/// can the rule's flush differ from the plain FMA: an exact value below `2^-126 - 2^-151`
/// rounds to at most `2^-126`; activations are never subnormal after step 1, and an
/// accumulator never was where no such `r` occurred), for the caller to run the scalar twin.
///
/// # Safety
/// AVX2 and FMA are available; `w` is `2 * cols` bytes and `x` `cols` patterns, `cols` a
/// multiple of 32.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_checked(w: &[u8], x: &[u16]) -> Option<f32> {
    let chunks = w.len() / (2 * CHUNK);
    assert!(
        x.len() == CHUNK * chunks,
        "bf16a avx2 tile: row and token disagree"
    );
    let hi = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let exp = _mm256_set1_epi32(0x7f80_0000);
    let sign = _mm256_set1_epi32(0x8000_0000u32 as i32);
    let abs = _mm256_set1_epi32(0x7fff_ffff);
    let min = _mm256_set1_ps(f32::MIN_POSITIVE);
    let zero = _mm256_setzero_ps();
    // An f32 pattern with a subnormal replaced by the zero of its sign.
    let daz = |v: __m256i| {
        let sub = _mm256_cmpeq_epi32(_mm256_and_si256(v, exp), _mm256_setzero_si256());
        _mm256_castsi256_ps(_mm256_blendv_epi8(v, _mm256_and_si256(v, sign), sub))
    };
    let split = |v: __m256i| (_mm256_and_si256(v, hi), _mm256_slli_epi32::<16>(v));
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut bad = _mm256_setzero_ps();
    for k in 0..chunks {
        for h in 0..2 {
            // SAFETY: chunk `k < chunks` is the 64 bytes at `64 k` of the row and the token.
            let (wv, xv) = unsafe {
                (
                    _mm256_loadu_si256(w.as_ptr().add(64 * k + 32 * h).cast()),
                    _mm256_loadu_si256(x.as_ptr().cast::<u8>().add(64 * k + 32 * h).cast()),
                )
            };
            let ((wo, we), (xo, xe)) = (split(wv), split(xv));
            for (wp, xp) in [(wo, xo), (we, xe)] {
                let r = _mm256_fmadd_ps(daz(wp), _mm256_castsi256_ps(xp), acc[h]);
                let a = _mm256_and_ps(r, _mm256_castsi256_ps(abs));
                let near = _mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_LE_OQ>(a, min),
                    _mm256_cmp_ps::<_CMP_NEQ_OQ>(r, zero),
                );
                bad = _mm256_or_ps(bad, near);
                acc[h] = r;
            }
        }
    }
    if _mm256_movemask_ps(bad) != 0 {
        return None;
    }
    let mut a = [0f32; LANES];
    // SAFETY: `a` is 16 f32.
    unsafe {
        _mm256_storeu_ps(a.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(a.as_mut_ptr().add(8), acc[1]);
    }
    Some(sum16(&a))
}

/// [`rows_bf16`] with AVX2: one row at a time, tiles of 4 tokens where the row and the tokens
/// are in the safe range (module note; `safe_tokens[t]` is [`safe_range`] of token `t`), else
/// per token [`tile_avx2_checked`], and the scalar twin where that finds a result near
/// `2^-126`.
///
/// # Safety
/// AVX2 and FMA are available; otherwise as [`rows_bf16`]; `safe_tokens` has `n` entries.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rows_avx2(
    w: &MatrixView<'_>,
    x: &[u16],
    safe_tokens: &[bool],
    n: usize,
    r0: usize,
    yt: &mut [f32],
) {
    let cols = w.cols();
    let tok = |t: usize| &x[t * cols..(t + 1) * cols];
    for (i, yr) in yt.chunks_exact_mut(n).enumerate() {
        let row = row_bytes(w, r0 + i);
        let safe_row = safe_range(patterns(row));
        let mut t0 = 0;
        while t0 < n {
            let m = (n - t0).min(AVX2_TOKENS);
            let out = &mut yr[t0..t0 + m];
            if !safe_row || safe_tokens[t0..t0 + m].iter().any(|s| !s) {
                for (j, o) in out.iter_mut().enumerate() {
                    let xt = tok(t0 + j);
                    *o = if safe_row && safe_tokens[t0 + j] {
                        // SAFETY: the caller's guarantees; the row and token are `cols` long.
                        let v = unsafe { tile_avx2::<1>(row, [xt]) };
                        v[0]
                    } else {
                        // SAFETY: as above.
                        unsafe { tile_avx2_checked(row, xt) }.unwrap_or_else(|| dot_scalar(row, xt))
                    };
                }
            } else {
                // SAFETY: the caller's guarantees; every row and token is `cols` long.
                unsafe {
                    match m {
                        1 => out.copy_from_slice(&tile_avx2::<1>(row, [tok(t0)])),
                        2 => out.copy_from_slice(&tile_avx2::<2>(row, [tok(t0), tok(t0 + 1)])),
                        3 => out.copy_from_slice(&tile_avx2::<3>(
                            row,
                            [tok(t0), tok(t0 + 1), tok(t0 + 2)],
                        )),
                        _ => out.copy_from_slice(&tile_avx2::<4>(
                            row,
                            [tok(t0), tok(t0 + 1), tok(t0 + 2), tok(t0 + 3)],
                        )),
                    }
                }
            }
            t0 += m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16a::{bf16_f32, fma_daz_ftz};

    /// `vdpbf16ps` on one register of 16 lanes.
    ///
    /// # Safety
    /// AVX-512F and AVX-512 BF16 are available.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn hardware(acc: &[f32; 16], w: &[u32; 16], x: &[u32; 16]) -> [f32; 16] {
        // SAFETY: the arrays are 64 bytes each; `__m512i` and `__m512bh` are 64-byte vectors.
        unsafe {
            let r = _mm512_dpbf16_ps(
                _mm512_loadu_ps(acc.as_ptr()),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(w.as_ptr().cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(x.as_ptr().cast())),
            );
            let mut o = [0f32; 16];
            _mm512_storeu_ps(o.as_mut_ptr(), r);
            o
        }
    }

    /// The instruction is the rule's step 3 on this CPU: random lanes (every bf16 pattern,
    /// subnormal and near-2^-126 operands favoured) against `fma_daz_ftz` odd-first, bit for
    /// bit (NaN results compared as NaN). Skipped where the CPU lacks AVX-512 BF16.
    #[test]
    fn vdpbf16ps_is_the_rules_step() {
        if !(std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bf16"))
        {
            eprintln!("no AVX-512 BF16 here: skipped");
            return;
        }
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        // A bf16 pattern: any, or with a small exponent (0..4, 55..70: products near 2^-126),
        // or an ordinary one.
        let pat = |r: u64| -> u16 {
            let sm = (r & 0x807f) as u16;
            match (r >> 20) % 4 {
                0 => (r >> 32) as u16,
                1 => sm | ((((r >> 24) % 4) as u16) << 7),
                2 => sm | (((55 + (r >> 24) % 16) as u16) << 7),
                _ => sm | (((100 + (r >> 24) % 60) as u16) << 7),
            }
        };
        let mut checked = 0;
        for _ in 0..20_000 {
            let (mut acc, mut w, mut x) = ([0f32; 16], [0u32; 16], [0u32; 16]);
            for i in 0..16 {
                w[i] = pat(rnd()) as u32 | (pat(rnd()) as u32) << 16;
                x[i] = pat(rnd()) as u32 | (pat(rnd()) as u32) << 16;
                let r = rnd();
                acc[i] = match r % 4 {
                    0 => 0.0,
                    1 => f32::from_bits((r >> 32) as u32),
                    2 => f32::from_bits(
                        ((r >> 32) as u32 & 0x807f_ffff) | ((((r >> 8) % 4) as u32) << 23),
                    ),
                    _ => f32::MIN_POSITIVE * if r & 256 == 0 { 1.0 } else { -1.0 },
                };
            }
            // SAFETY: AVX-512F and AVX-512 BF16 detected above.
            let h = unsafe { hardware(&acc, &w, &x) };
            for i in 0..16 {
                let f = |v: u32, hi: bool| bf16_f32(if hi { (v >> 16) as u16 } else { v as u16 });
                let odd = fma_daz_ftz(f(w[i], true), f(x[i], true), acc[i]);
                let want = fma_daz_ftz(f(w[i], false), f(x[i], false), odd);
                assert!(
                    h[i].to_bits() == want.to_bits() || (h[i].is_nan() && want.is_nan()),
                    "acc {:08x} w {:08x} x {:08x}: vdpbf16ps {:08x}, rule {:08x}",
                    acc[i].to_bits(),
                    w[i],
                    x[i],
                    h[i].to_bits(),
                    want.to_bits()
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 320_000);
    }
}
