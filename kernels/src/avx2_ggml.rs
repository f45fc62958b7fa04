//! AVX2 chunk sources of the common ggml block types (q8_0, q4_0, q4_k, q6_k): 8 decoded weights per
//! `next`, exactly the values of the reference decode in `coli_format::encoding::ggml` (the same
//! f32 products and differences, unfused), so a product over them equals the product over the
//! decoded f32 row bit for bit (`kernels/tests/kernels.rs`). The other ggml types go through the
//! reference decode of the whole row (`avx2::with_src`).

use crate::avx2::Chunks;
use coli_format::encoding::ggml::q4_k_scale_min;
use std::arch::x86_64::*;

/// The little-endian f16 at `b[at..at + 2]` widened exactly to f32 (F16C; the value of
/// `coli_format::encoding::ggml::f16_at`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    let h = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

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

/// q8_0 (34-byte blocks of 32): `q * d`. `next4` is one whole block (the product loops take
/// quads of chunks from the row's start, and a block is 4 chunks).
pub(crate) struct Q80Src<'a> {
    pub(crate) row: &'a [u8],
    pub(crate) b: usize,
    pub(crate) c: usize,
}

impl Q80Src<'_> {
    /// 8 codes of the current block's chunk `j`, times its `d`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk(blk: &[u8], d: __m256, j: usize) -> __m256 {
        let v: [u8; 8] = blk[2 + 8 * j..10 + 8 * j].try_into().expect("8 bytes");
        let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(
            v,
        ))));
        _mm256_mul_ps(q, d)
    }
}

impl Chunks for Q80Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let blk = &self.row[self.b * 34..self.b * 34 + 34];
        let v = Self::chunk(
            blk,
            _mm256_set1_ps(coli_format::encoding::ggml::f16_at(blk, 0)),
            self.c,
        );
        self.c += 1;
        if self.c == 4 {
            self.c = 0;
            self.b += 1;
        }
        v
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        debug_assert_eq!(self.c, 0);
        let blk = &self.row[self.b * 34..self.b * 34 + 34];
        let d = _mm256_set1_ps(coli_format::encoding::ggml::f16_at(blk, 0));
        self.b += 1;
        [
            Self::chunk(blk, d, 0),
            Self::chunk(blk, d, 1),
            Self::chunk(blk, d, 2),
            Self::chunk(blk, d, 3),
        ]
    }
}

/// q4_0 (18-byte blocks of 32): `d * (q - 8)`, weight `j < 16` the low nibble of byte `j`,
/// `j + 16` its high nibble. `next4` is one whole block.
pub(crate) struct Q40Src<'a> {
    pub(crate) row: &'a [u8],
    pub(crate) b: usize,
    pub(crate) c: usize,
}

impl Q40Src<'_> {
    /// Chunk `j` (0..4: columns `8 j .. 8 j + 8`) of a block: nibbles of bytes `8 (j % 2) ..`,
    /// low for `j < 2`, high otherwise, minus 8, times `d`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk(blk: &[u8], d: __m256, j: usize) -> __m256 {
        let v = bits(u8x8(blk, 2 + 8 * (j % 2)), 4 * (j / 2) as u32, 0x0F);
        let q = _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8)));
        _mm256_mul_ps(d, q)
    }
}

impl Chunks for Q40Src<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        let blk = &self.row[self.b * 18..self.b * 18 + 18];
        let v = Self::chunk(blk, _mm256_set1_ps(f16_at(blk, 0)), self.c);
        self.c += 1;
        if self.c == 4 {
            self.c = 0;
            self.b += 1;
        }
        v
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        debug_assert_eq!(self.c, 0);
        let blk = &self.row[self.b * 18..self.b * 18 + 18];
        let d = _mm256_set1_ps(f16_at(blk, 0));
        self.b += 1;
        [
            Self::chunk(blk, d, 0),
            Self::chunk(blk, d, 1),
            Self::chunk(blk, d, 2),
            Self::chunk(blk, d, 3),
        ]
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

    /// The current block's 8 `(d * sc, dmin * m)` (kept out of line: once per 32 chunks).
    #[inline(never)]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load_block(&mut self) {
        let blk = &self.row[self.b * 144..self.b * 144 + 144];
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        let (sc, m) = q4_k_scale_min(&blk[4..16]);
        for g in 0..8 {
            self.dl[g] = d * sc[g] as f32;
            self.ml[g] = dmin * m[g] as f32;
        }
    }

    /// Chunk `j` (0..4) of group `g` of the current block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk(&self, g: usize, j: usize) -> __m256 {
        let at = self.b * 144 + 16 + 32 * (g / 2) + 8 * j;
        let q = bits(u8x8(self.row, at), 4 * (g as u32 % 2), 0x0F);
        _mm256_sub_ps(
            _mm256_mul_ps(_mm256_set1_ps(self.dl[g]), _mm256_cvtepi32_ps(q)),
            _mm256_set1_ps(self.ml[g]),
        )
    }

    fn advance(&mut self, n: usize) {
        self.c += n;
        if self.c == 32 {
            self.c = 0;
            self.b += 1;
        }
    }
}

impl Chunks for Q4KSrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        if self.c == 0 {
            self.load_block();
        }
        let v = self.chunk(self.c / 4, self.c % 4);
        self.advance(1);
        v
    }

    /// One group of 32 (the quads start at group boundaries): its 32 bytes loaded once, the
    /// group's nibble taken by one shift, scale and min splat once.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        debug_assert_eq!(self.c % 4, 0);
        if self.c == 0 {
            self.load_block();
        }
        let g = self.c / 4;
        let at = self.b * 144 + 16 + 32 * (g / 2);
        let b: &[u8; 32] = self.row[at..at + 32].try_into().expect("32 bytes");
        // SAFETY: `b` is 32 readable bytes (unaligned load).
        let v = unsafe { _mm256_loadu_si256(b.as_ptr().cast()) };
        let v = _mm256_and_si256(
            _mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (g as i32 % 2))),
            _mm256_set1_epi8(0x0F),
        );
        let (d, m) = (_mm256_set1_ps(self.dl[g]), _mm256_set1_ps(self.ml[g]));
        let lo = _mm256_castsi256_si128(v);
        let hi = _mm256_extracti128_si256::<1>(v);
        let f = |x: __m128i| {
            _mm256_sub_ps(
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x))),
                m,
            )
        };
        self.advance(4);
        [
            f(lo),
            f(_mm_srli_si128::<8>(lo)),
            f(hi),
            f(_mm_srli_si128::<8>(hi)),
        ]
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

    /// The current block's 16 `d * scales[g]` (kept out of line: once per 32 chunks).
    #[inline(never)]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load_block(&mut self) {
        let blk = &self.row[self.b * 210..self.b * 210 + 210];
        let d = f16_at(blk, 208);
        for g in 0..16 {
            self.sc[g] = d * (blk[192 + g] as i8) as f32;
        }
    }

    /// Chunk `c` (0..32) of the current block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn chunk(&self, c: usize) -> __m256 {
        let base = self.b * 210;
        let e0 = 8 * c;
        let (h, k) = (e0 / 128, e0 % 128);
        let lo = bits(
            u8x8(self.row, base + 64 * h + k % 64),
            4 * (k as u32 / 64),
            0x0F,
        );
        let hi = bits(
            u8x8(self.row, base + 128 + 32 * h + k % 32),
            2 * (k as u32 / 32),
            3,
        );
        let q = _mm256_sub_epi32(
            _mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)),
            _mm256_set1_epi32(32),
        );
        _mm256_mul_ps(_mm256_set1_ps(self.sc[e0 / 16]), _mm256_cvtepi32_ps(q))
    }

    fn advance(&mut self, n: usize) {
        self.c += n;
        if self.c == 32 {
            self.c = 0;
            self.b += 1;
        }
    }
}

impl Chunks for Q6KSrc<'_> {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next(&mut self) -> __m256 {
        if self.c == 0 {
            self.load_block();
        }
        let v = self.chunk(self.c);
        self.advance(1);
        v
    }

    /// 32 weights (the quads start at multiples of 32): their 32 `ql` and 32 `qh` bytes loaded
    /// once, the codes built bytewise, two group scales.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn next4(&mut self) -> [__m256; 4] {
        debug_assert_eq!(self.c % 4, 0);
        if self.c == 0 {
            self.load_block();
        }
        let e0 = 8 * self.c;
        let (h, k) = (e0 / 128, e0 % 128);
        let base = self.b * 210;
        let ql: &[u8; 32] = self.row[base + 64 * h + k % 64..][..32]
            .try_into()
            .expect("32 bytes");
        let qh: &[u8; 32] = self.row[base + 128 + 32 * h..][..32]
            .try_into()
            .expect("32 bytes");
        // SAFETY: `ql` and `qh` are 32 readable bytes each (unaligned loads).
        let (ql, qh) = unsafe {
            (
                _mm256_loadu_si256(ql.as_ptr().cast()),
                _mm256_loadu_si256(qh.as_ptr().cast()),
            )
        };
        let lo = _mm256_and_si256(
            _mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (k as i32 / 64))),
            _mm256_set1_epi8(0x0F),
        );
        let hi = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * (k as i32 / 32))),
            _mm256_set1_epi8(3),
        );
        let q = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(hi));
        let (s0, s1) = (
            _mm256_set1_ps(self.sc[e0 / 16]),
            _mm256_set1_ps(self.sc[e0 / 16 + 1]),
        );
        let f = |x: __m128i, s: __m256| {
            let v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(x), _mm256_set1_epi32(32));
            _mm256_mul_ps(s, _mm256_cvtepi32_ps(v))
        };
        let (a, b) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
        self.advance(4);
        [
            f(a, s0),
            f(_mm_srli_si128::<8>(a), s0),
            f(b, s1),
            f(_mm_srli_si128::<8>(b), s1),
        ]
    }
}
