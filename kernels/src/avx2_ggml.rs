//! AVX2 chunk sources of the common ggml block types (q8_0, q4_k, q6_k): 8 decoded weights per
//! `next`, exactly the values of the reference decode in `coli_format::encoding::ggml` (the same
//! f32 products and differences, unfused), so a product over them equals the product over the
//! decoded f32 row bit for bit (`kernels/tests/kernels.rs`). The other ggml types go through the
//! reference decode of the whole row (`avx2::with_src`).

use crate::avx2::Chunks;
use coli_format::encoding::ggml::{f16_at, q4_k_scale_min};
use std::arch::x86_64::*;

/// The 8 bytes at `b[at..at + 8]` zero-extended to 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8x8(b: &[u8], at: usize) -> __m256i {
    let v: [u8; 8] = b[at..at + 8].try_into().expect("8 bytes");
    _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(v)))
}

/// `(v >> s) & mask` per i32 lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits(v: __m256i, s: u32, mask: i32) -> __m256i {
    _mm256_and_si256(
        _mm256_srl_epi32(v, _mm_cvtsi32_si128(s as i32)),
        _mm256_set1_epi32(mask),
    )
}

/// q8_0 (34-byte blocks of 32): `q * d`.
pub(crate) struct Q80Src<'a> {
    pub(crate) row: &'a [u8],
    pub(crate) b: usize,
    pub(crate) c: usize,
}

impl Chunks for Q80Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let blk = &self.row[self.b * 34..self.b * 34 + 34];
        let d = _mm256_set1_ps(f16_at(blk, 0));
        let v: [u8; 8] = blk[2 + 8 * self.c..10 + 8 * self.c]
            .try_into()
            .expect("8 bytes");
        let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
            v,
        ))));
        self.c += 1;
        if self.c == 4 {
            self.c = 0;
            self.b += 1;
        }
        _mm256_mul_ps(q, d)
    }
}

/// q4_k (144-byte blocks of 256, 8 groups of 32): `(d * sc) * q - dmin * m`.
pub(crate) struct Q4KSrc<'a> {
    pub(crate) row: &'a [u8],
    pub(crate) b: usize,
    pub(crate) c: usize,
    pub(crate) dl: [f32; 8],
    pub(crate) ml: [f32; 8],
}

impl<'a> Q4KSrc<'a> {
    pub(crate) fn new(row: &'a [u8]) -> Self {
        Q4KSrc {
            row,
            b: 0,
            c: 0,
            dl: [0.0; 8],
            ml: [0.0; 8],
        }
    }
}

impl Chunks for Q4KSrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let blk = &self.row[self.b * 144..self.b * 144 + 144];
        if self.c == 0 {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (sc, m) = q4_k_scale_min(&blk[4..16]);
            for g in 0..8 {
                self.dl[g] = d * sc[g] as f32;
                self.ml[g] = dmin * m[g] as f32;
            }
        }
        let (g, j) = (self.c / 4, self.c % 4);
        let q = bits(
            u8x8(blk, 16 + 32 * (g / 2) + 8 * j),
            4 * (g as u32 % 2),
            0x0F,
        );
        self.c += 1;
        if self.c == 32 {
            self.c = 0;
            self.b += 1;
        }
        _mm256_sub_ps(
            _mm256_mul_ps(_mm256_set1_ps(self.dl[g]), _mm256_cvtepi32_ps(q)),
            _mm256_set1_ps(self.ml[g]),
        )
    }
}

/// q6_k (210-byte blocks of 256, 16 groups of 16): `(d * sc) * (q - 32)`.
pub(crate) struct Q6KSrc<'a> {
    pub(crate) row: &'a [u8],
    pub(crate) b: usize,
    pub(crate) c: usize,
    pub(crate) sc: [f32; 16],
}

impl<'a> Q6KSrc<'a> {
    pub(crate) fn new(row: &'a [u8]) -> Self {
        Q6KSrc {
            row,
            b: 0,
            c: 0,
            sc: [0.0; 16],
        }
    }
}

impl Chunks for Q6KSrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let blk = &self.row[self.b * 210..self.b * 210 + 210];
        if self.c == 0 {
            let d = f16_at(blk, 208);
            for g in 0..16 {
                self.sc[g] = d * (blk[192 + g] as i8) as f32;
            }
        }
        let e0 = 8 * self.c;
        let (h, k) = (e0 / 128, e0 % 128);
        let lo = bits(u8x8(blk, 64 * h + k % 64), 4 * (k as u32 / 64), 0x0F);
        let hi = bits(u8x8(blk, 128 + 32 * h + k % 32), 2 * (k as u32 / 32), 3);
        let q = _mm256_sub_epi32(
            _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)),
            _mm256_set1_epi32(32),
        );
        let s = self.sc[e0 / 16];
        self.c += 1;
        if self.c == 32 {
            self.c = 0;
            self.b += 1;
        }
        _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(q))
    }
}
