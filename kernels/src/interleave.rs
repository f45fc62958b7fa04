//! The interleaved row order of a matrix held in memory (`MatrixView::interleave`, the
//! definition: 16 rows' 4-byte words side by side), made with AVX-512 16 x 16 word transposes
//! where the CPU has them: records enter an engine's cache in this order under q8a, so the
//! reorder runs once per read and must cost little next to the read and its checksum
//! (`MatrixView::interleave`'s scalar moves: 6 GB/s on this project's machine), and the integer
//! kernels pack row-major rows the same way (`q8a_x86::Packed`).

use coli_format::{Encoding, MatrixView, INTERLEAVE_ROWS};

/// [`MatrixView::interleave`] of the weight and scale sections, the same bytes (what engines
/// hand the store to reorder with: `ExpertBuf::interleave`, `Store::dense_ordered`).
///
/// # Panics
/// As [`MatrixView::interleave`].
pub fn interleave_sections(
    encoding: Encoding,
    rows: usize,
    cols: usize,
    data: &mut [u8],
    scales: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let words = encoding.weight_bytes(1, cols) / 4;
        if std::is_x86_feature_detected!("avx512f")
            && MatrixView::can_interleave(encoding, rows, cols)
            && data.len() == encoding.weight_bytes(rows, cols)
            && scales.len() == encoding.scale_count(rows, cols) * encoding.scale_width()
            && words.is_multiple_of(16)
        {
            let group = INTERLEAVE_ROWS * words * 4;
            let mut tmp = vec![0u8; group];
            for g in data[..rows / INTERLEAVE_ROWS * group].chunks_exact_mut(group) {
                tmp.copy_from_slice(g);
                let rows: [&[u8]; INTERLEAVE_ROWS] =
                    std::array::from_fn(|u| &tmp[u * 4 * words..(u + 1) * 4 * words]);
                // SAFETY: AVX-512F detected above; 16 rows of `words` words into a group.
                unsafe { x86::group(rows, g, words) };
            }
            MatrixView::interleave_scales(encoding, rows, cols, scales);
            return;
        }
    }
    MatrixView::interleave(encoding, rows, cols, data, scales);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Bytes ahead of the tile being read that [`group`] prefetches in each row.
    const PREFETCH: usize = 512;

    /// One group: 16 rows of `words` 4-byte words each to `dst` word-major (`[words, 16]`), 16
    /// words of the 16 rows per transpose.
    ///
    /// # Safety
    /// AVX-512F is available.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn group(rows: [&[u8]; 16], dst: &mut [u8], words: usize) {
        assert!(
            words.is_multiple_of(16)
                && dst.len() == 64 * words
                && rows.iter().all(|r| r.len() == 4 * words),
            "a group of 16 rows of {words} words"
        );
        for j0 in (0..words).step_by(16) {
            // SAFETY: each row's words j0 .. j0 + 16 lie within it (checked lengths); the 16
            // stores write words j0 .. j0 + 16 of `dst` (64 bytes each).
            unsafe {
                // 16 row streams at once outrun the hardware prefetcher: ask for each row's
                // bytes a few tiles ahead (a prefetch never faults).
                for r in &rows {
                    _mm_prefetch::<_MM_HINT_T0>(r.as_ptr().wrapping_add(4 * j0 + PREFETCH).cast());
                }
                let a: [__m512i; 16] = std::array::from_fn(|u| {
                    _mm512_loadu_si512(rows[u].as_ptr().add(4 * j0).cast())
                });
                let t = transpose16(a);
                for (i, v) in t.iter().enumerate() {
                    _mm512_storeu_si512(dst.as_mut_ptr().add(64 * (j0 + i)).cast(), *v);
                }
            }
        }
    }

    /// A 16 x 16 transpose of 32-bit elements: `out[j]` lane `u` = `a[u]` lane `j`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16(a: [__m512i; 16]) -> [__m512i; 16] {
        // Pairs of rows: per 128-bit lane L, b[2p] = (a[2p][4L], a[2p+1][4L], a[2p][4L+1],
        // a[2p+1][4L+1]), b[2p+1] the same for 4L+2, 4L+3.
        let mut b = [_mm512_setzero_si512(); 16];
        for p in 0..8 {
            b[2 * p] = _mm512_unpacklo_epi32(a[2 * p], a[2 * p + 1]);
            b[2 * p + 1] = _mm512_unpackhi_epi32(a[2 * p], a[2 * p + 1]);
        }
        // Quads of rows: c[4q + i] lane L = column 4L + i of rows 4q .. 4q + 4.
        let mut c = [_mm512_setzero_si512(); 16];
        for q in 0..4 {
            let u = 4 * q;
            c[u] = _mm512_unpacklo_epi64(b[u], b[u + 2]);
            c[u + 1] = _mm512_unpackhi_epi64(b[u], b[u + 2]);
            c[u + 2] = _mm512_unpacklo_epi64(b[u + 1], b[u + 3]);
            c[u + 3] = _mm512_unpackhi_epi64(b[u + 1], b[u + 3]);
        }
        // Column 4L + i gathers lane L of c[i], c[4 + i], c[8 + i], c[12 + i].
        let mut out = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            let d0 = _mm512_shuffle_i32x4::<0x44>(c[i], c[4 + i]);
            let d1 = _mm512_shuffle_i32x4::<0xEE>(c[i], c[4 + i]);
            let d2 = _mm512_shuffle_i32x4::<0x44>(c[8 + i], c[12 + i]);
            let d3 = _mm512_shuffle_i32x4::<0xEE>(c[8 + i], c[12 + i]);
            out[i] = _mm512_shuffle_i32x4::<0x88>(d0, d2);
            out[4 + i] = _mm512_shuffle_i32x4::<0xDD>(d0, d2);
            out[8 + i] = _mm512_shuffle_i32x4::<0x88>(d1, d3);
            out[12 + i] = _mm512_shuffle_i32x4::<0xDD>(d1, d3);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same bytes as `MatrixView::interleave` (the definition), for every encoding that has
    /// the order, with whole 16-word tiles and without (the scalar path), tails included.
    #[test]
    fn same_bytes_as_the_definition() {
        for (e, rows, cols) in [
            (Encoding::Int4 { group_size: 64 }, 37, 256),
            (Encoding::Int4 { group_size: 32 }, 16, 2048),
            (Encoding::Int4 { group_size: 64 }, 48, 64),
            (Encoding::Int8, 35, 192),
            (Encoding::Mxfp4, 50, 384),
        ] {
            let data: Vec<u8> = (0..e.weight_bytes(rows, cols))
                .map(|i| (i * 131 % 251) as u8)
                .collect();
            let sec: Vec<u8> = (0..e.scale_count(rows, cols) * e.scale_width())
                .map(|i| (i * 17 % 253) as u8)
                .collect();
            let (mut a, mut sa) = (data.clone(), sec.clone());
            let (mut b, mut sb) = (data.clone(), sec.clone());
            MatrixView::interleave(e, rows, cols, &mut a, &mut sa);
            interleave_sections(e, rows, cols, &mut b, &mut sb);
            assert!(a == b && sa == sb, "{e:?} [{rows}, {cols}]");
            assert_ne!(a, data);
        }
    }
}
