//! [`MatrixView`]: a borrowed, checked view of one encoded matrix.

use crate::{Encoding, FormatError};
use zerocopy::{FromBytes, IntoBytes};

/// A borrowed view of one encoded matrix: weights and scales in the store's byte layout
/// (docs/FORMAT.md section 6), `[rows = output features, cols = input features]`.
///
/// Built only by [`MatrixView::new`], which checks that the sections have the lengths the
/// encoding and shape require, so every holder (kernels, engine) can index them without
/// re-checking. Produced by the store for expert records and dense tensors; consumed by
/// `coli-kernels`.
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a> {
    encoding: Encoding,
    rows: usize,
    cols: usize,
    data: &'a [u8],
    scales: &'a [f32],
    e8m0_scales: &'a [u8],
    /// The weight section is in the interleaved row order ([`MatrixView::interleave`]), not the
    /// store's row-major one.
    interleaved: bool,
}

/// Rows per block of the interleaved row order ([`MatrixView::interleave`]).
pub const INTERLEAVE_ROWS: usize = 4;
/// Columns per chunk of the interleaved row order.
pub const INTERLEAVE_COLS: usize = 64;

/// The `(rows, cols)` matrix view of a tensor of shape `shape`: `[n]` is one row `[1, n]`, a
/// 2-D `[rows, cols]` is itself, and an N-D shape `[d0, .., dk, cols]` is `[d0 * .. * dk, cols]`
/// (row-major, the last dimension contiguous: a stacked `[S, 2I, H]` tensor is its `S * 2I`
/// rows of `H`, a convolution weight `[C, 1, K]` its `C` rows of `K` taps). None for a 0-D
/// shape or one whose row count overflows.
pub fn matrix_dims(shape: &[usize]) -> Option<(usize, usize)> {
    let (&cols, lead) = shape.split_last()?;
    let rows = lead.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    Some((rows, cols))
}

impl<'a> MatrixView<'a> {
    /// Rows `r0..r1` of this matrix as a view of its own (borrowing the same sections), or
    /// None when the range is empty, out of bounds, or cuts through a block of scales: FP8's
    /// 128x128 blocks need `r0` a multiple of 128 and `r1` one too or the last row; every other
    /// encoding scales whole rows (int4 per group of a row, int8 per row, mxfp4 per 32 columns
    /// of a row) and slices anywhere, except an interleaved view, which cuts between its blocks
    /// of [`INTERLEAVE_ROWS`] rows only (`r0` a multiple of 4, `r1` one too or the last row).
    pub fn row_range(&self, r0: usize, r1: usize) -> Option<MatrixView<'a>> {
        if r0 >= r1 || r1 > self.rows {
            return None;
        }
        // An interleaved view cuts between blocks of rows only.
        if self.interleaved
            && (!r0.is_multiple_of(INTERLEAVE_ROWS)
                || !(r1.is_multiple_of(INTERLEAVE_ROWS) || r1 == self.rows))
        {
            return None;
        }
        let (e, c) = (self.encoding, self.cols);
        if e == Encoding::Fp8 {
            let b = crate::encoding::fp8::FP8_BLOCK;
            if !r0.is_multiple_of(b) || !(r1.is_multiple_of(b) || r1 == self.rows) {
                return None;
            }
        }
        let (w0, w1) = (e.weight_bytes(r0, c), e.weight_bytes(r1, c));
        let (s0, s1) = (e.scale_count(r0, c), e.scale_count(r1, c));
        let (scales, e8m0) = if self.e8m0_scales.is_empty() {
            (self.scales.get(s0..s1).unwrap_or(&[]), &[][..])
        } else {
            (&[][..], &self.e8m0_scales[s0..s1])
        };
        let v = Self::checked(e, r1 - r0, c, &self.data[w0..w1], scales, e8m0).ok()?;
        if self.interleaved && Self::can_interleave(e, r1 - r0, c) {
            return v.as_interleaved().ok();
        }
        // Fewer than a block of rows: the tail rows, row-major.
        Some(v)
    }

    /// A view of a `[rows, cols]` matrix of `encoding` with weight section `data`
    /// (`encoding.weight_bytes(rows, cols)` bytes) and scales `scales`
    /// (`encoding.scale_count(rows, cols)` f32 values). For mxfp4, whose scales are e8m0
    /// bytes, use [`MatrixView::from_sections`].
    ///
    /// # Errors
    /// [`FormatError::Format`] (with an empty file name, for the caller to fill) when a
    /// section has another length, an int4 group size is odd or below 2, or the encoding's
    /// scales are not f32 (mxfp4).
    pub fn new(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [f32],
    ) -> Result<MatrixView<'a>, FormatError> {
        if !encoding.has_f32_scales() {
            return Err(FormatError::format(
                "",
                format!(
                    "{} scales are not f32 values: build the view with MatrixView::from_sections",
                    encoding.name()
                ),
            ));
        }
        Self::checked(encoding, rows, cols, data, scales, &[])
    }

    /// A view of a `[rows, cols]` matrix from its two sections as stored (docs/FORMAT.md
    /// section 6): the weight section `data` and the scale section `scale_section`
    /// (`encoding.scale_bytes(rows, cols)` bytes: little-endian f32 values, 4-byte aligned in
    /// memory as the store's 64-byte section alignment guarantees, or mxfp4's e8m0 bytes).
    ///
    /// # Errors
    /// [`FormatError::Format`] (empty file name) as [`MatrixView::new`], or when an f32 scale
    /// section is not 4-byte aligned in memory.
    pub fn from_sections(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scale_section: &'a [u8],
    ) -> Result<MatrixView<'a>, FormatError> {
        if !encoding.has_f32_scales() {
            return Self::checked(encoding, rows, cols, data, &[], scale_section);
        }
        let scales: &[f32] = if scale_section.is_empty() {
            &[]
        } else {
            <[f32]>::ref_from_bytes(scale_section).map_err(|_| {
                FormatError::format(
                    "",
                    format!(
                        "{} [{rows}, {cols}] matrix: scale section of {} bytes is not whole, \
                         4-byte-aligned f32 values",
                        encoding.name(),
                        scale_section.len()
                    ),
                )
            })?
        };
        Self::checked(encoding, rows, cols, data, scales, &[])
    }

    fn checked(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [f32],
        e8m0_scales: &'a [u8],
    ) -> Result<MatrixView<'a>, FormatError> {
        if let Encoding::Int4 { group_size } = encoding {
            if group_size < 2 || !group_size.is_multiple_of(2) {
                return Err(FormatError::format(
                    "",
                    format!("int4 group size must be even and >= 2, found {group_size}"),
                ));
            }
        }
        let cm = encoding.col_multiple();
        if !cols.is_multiple_of(cm) {
            return Err(FormatError::format(
                "",
                format!(
                    "{} [{rows}, {cols}] matrix: cols must be a multiple of the block size {cm}",
                    encoding.name()
                ),
            ));
        }
        // At most 4 bytes per weight: a shape whose f32 size overflows is refused unchecked.
        let fits = (rows as u128) * (cols as u128) * 4 <= usize::MAX as u128;
        let wb = fits.then(|| encoding.weight_bytes(rows, cols));
        if wb != Some(data.len()) {
            return Err(FormatError::format(
                "",
                format!(
                    "{} [{rows}, {cols}] matrix: weight section is {} bytes, expected {}",
                    encoding.name(),
                    data.len(),
                    wb.map_or("an overflowing size".to_string(), |b| b.to_string())
                ),
            ));
        }
        let sc = encoding.scale_count(rows, cols);
        let found = scales.len() + e8m0_scales.len();
        if found != sc {
            return Err(FormatError::format(
                "",
                format!(
                    "{} [{rows}, {cols}] matrix: {found} scales, expected {sc}",
                    encoding.name(),
                ),
            ));
        }
        Ok(MatrixView {
            encoding,
            rows,
            cols,
            data,
            scales,
            e8m0_scales,
            interleaved: false,
        })
    }

    /// True when a `[rows, cols]` matrix of `encoding` has an interleaved row order
    /// ([`MatrixView::interleave`]): int4, int8 and mxfp4, whose 64-column chunks are whole
    /// bytes (32, 64 and 32), with `cols` a multiple of 64 and at least one block of rows.
    pub fn can_interleave(encoding: Encoding, rows: usize, cols: usize) -> bool {
        matches!(
            encoding,
            Encoding::Int4 { .. } | Encoding::Int8 | Encoding::Mxfp4
        ) && cols > 0
            && cols.is_multiple_of(INTERLEAVE_COLS)
            && rows >= INTERLEAVE_ROWS
    }

    /// Reorders a row-major weight section `data` of a `[rows, cols]` matrix of `encoding` (one
    /// that [`MatrixView::can_interleave`]) into the interleaved row order, in place: each
    /// block of [`INTERLEAVE_ROWS`] consecutive rows becomes its 64-column chunks in column
    /// order, each chunk the rows' bytes of those columns in row order (block `b`, chunk `k`,
    /// row `u` of the block at `(b * 4 * C + k * 4 + u) * cb`, with `C = cols / 64` chunks of
    /// `cb` bytes); rows after the last whole block stay row-major at the end. The same bytes,
    /// in the order a kernel reading four rows at a time consumes them (one sequential stream,
    /// llama.cpp's repacking of resident weights). Memory only: stores are row-major.
    ///
    /// # Panics
    /// If the matrix cannot be interleaved or `data` is not its weight section.
    pub fn interleave(encoding: Encoding, rows: usize, cols: usize, data: &mut [u8]) {
        Self::reorder(encoding, rows, cols, data, true);
    }

    /// The inverse of [`MatrixView::interleave`]: back to the row-major order.
    ///
    /// # Panics
    /// As [`MatrixView::interleave`].
    pub fn deinterleave(encoding: Encoding, rows: usize, cols: usize, data: &mut [u8]) {
        Self::reorder(encoding, rows, cols, data, false);
    }

    fn reorder(encoding: Encoding, rows: usize, cols: usize, data: &mut [u8], to: bool) {
        assert!(
            Self::can_interleave(encoding, rows, cols)
                && data.len() == encoding.weight_bytes(rows, cols),
            "interleave: a [{rows}, {cols}] {} matrix of {} bytes",
            encoding.name(),
            data.len()
        );
        let cb = encoding.weight_bytes(1, INTERLEAVE_COLS);
        let stride = encoding.weight_bytes(1, cols);
        let block = INTERLEAVE_ROWS * stride;
        let mut tmp = vec![0u8; block];
        for b in data[..rows / INTERLEAVE_ROWS * block].chunks_exact_mut(block) {
            tmp.copy_from_slice(b);
            for k in 0..cols / INTERLEAVE_COLS {
                for u in 0..INTERLEAVE_ROWS {
                    let major = u * stride + k * cb;
                    let inter = (k * INTERLEAVE_ROWS + u) * cb;
                    let (dst, src) = if to { (inter, major) } else { (major, inter) };
                    b[dst..dst + cb].copy_from_slice(&tmp[src..src + cb]);
                }
            }
        }
    }

    /// This view with its weight section read in the interleaved row order: for a section that
    /// [`MatrixView::interleave`] reordered.
    ///
    /// # Errors
    /// [`FormatError::Format`] (empty file name) when the matrix cannot be interleaved.
    pub fn as_interleaved(self) -> Result<MatrixView<'a>, FormatError> {
        if !Self::can_interleave(self.encoding, self.rows, self.cols) {
            return Err(FormatError::format(
                "",
                format!(
                    "a [{}, {}] {} matrix has no interleaved row order",
                    self.rows,
                    self.cols,
                    self.encoding.name()
                ),
            ));
        }
        Ok(MatrixView {
            interleaved: true,
            ..self
        })
    }

    /// True when the weight section is in the interleaved row order
    /// ([`MatrixView::interleave`]); [`MatrixView::data`] is then not row-major.
    pub fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// The bytes of 64-column chunk `k` of row `r` (`encoding.weight_bytes(1, 64)` of them),
    /// in either row order. Defined where `cols` is a multiple of 64.
    ///
    /// # Panics
    /// If `r >= rows`, `k >= cols / 64` or `cols` is not a multiple of 64.
    #[inline]
    pub fn chunk(&self, r: usize, k: usize) -> &'a [u8] {
        assert!(
            self.cols.is_multiple_of(INTERLEAVE_COLS),
            "chunk: {} columns are not whole chunks of 64",
            self.cols
        );
        let cb = self.encoding.weight_bytes(1, INTERLEAVE_COLS);
        let at = self.chunk_offset(r, k, cb);
        &self.data[at..at + cb]
    }

    /// Byte offset of chunk `k` of row `r` in the weight section, chunks of `cb` bytes.
    #[inline]
    fn chunk_offset(&self, r: usize, k: usize, cb: usize) -> usize {
        let chunks = self.cols / INTERLEAVE_COLS;
        assert!(r < self.rows && k < chunks, "chunk {k} of row {r}");
        let whole = self.rows / INTERLEAVE_ROWS * INTERLEAVE_ROWS;
        if self.interleaved && r < whole {
            let (b, u) = (r / INTERLEAVE_ROWS, r % INTERLEAVE_ROWS);
            ((b * chunks + k) * INTERLEAVE_ROWS + u) * cb
        } else {
            (r * chunks + k) * cb
        }
    }

    /// Row `r`'s weight bytes in the row-major order (`encoding.weight_bytes(1, cols)`):
    /// borrowed from a row-major view, gathered from an interleaved one.
    pub fn row_bytes(&self, r: usize) -> std::borrow::Cow<'a, [u8]> {
        let stride = self.encoding.weight_bytes(1, self.cols);
        if !self.interleaved {
            return std::borrow::Cow::Borrowed(&self.data[r * stride..(r + 1) * stride]);
        }
        let mut row = Vec::with_capacity(stride);
        for k in 0..self.cols / INTERLEAVE_COLS {
            row.extend_from_slice(self.chunk(r, k));
        }
        std::borrow::Cow::Owned(row)
    }

    /// A row-major copy of an interleaved view's weight section (for code that reads
    /// [`MatrixView::data`] as row-major); the section itself for a row-major view.
    pub fn row_major_data(&self) -> std::borrow::Cow<'a, [u8]> {
        if !self.interleaved {
            return std::borrow::Cow::Borrowed(self.data);
        }
        let mut d = self.data.to_vec();
        Self::deinterleave(self.encoding, self.rows, self.cols, &mut d);
        std::borrow::Cow::Owned(d)
    }

    /// This matrix with weight section `data` (row-major, the same length) instead of its own:
    /// the view of [`MatrixView::row_major_data`].
    ///
    /// # Panics
    /// If `data` has another length.
    pub fn with_row_major_data<'b>(&self, data: &'b [u8]) -> MatrixView<'b>
    where
        'a: 'b,
    {
        assert_eq!(data.len(), self.data.len());
        MatrixView {
            data,
            interleaved: false,
            ..*self
        }
    }

    /// The encoding of the weight section.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Output features (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features (columns).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The weight section, `encoding.weight_bytes(rows, cols)` bytes: row-major (FORMAT.md
    /// section 6), or interleaved when [`MatrixView::is_interleaved`].
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The f32 scales, `encoding.scale_count(rows, cols)` values (empty for f32, bf16 and
    /// mxfp4).
    pub fn scales(&self) -> &'a [f32] {
        self.scales
    }

    /// The e8m0 scale bytes of an mxfp4 matrix, `[rows, ceil(cols / 32)]` row-major (empty for
    /// every other encoding).
    pub fn e8m0_scales(&self) -> &'a [u8] {
        self.e8m0_scales
    }

    /// The scale section as stored: the f32 scales' bytes or the e8m0 bytes.
    pub fn scale_section(&self) -> &'a [u8] {
        if self.e8m0_scales.is_empty() {
            self.scales.as_bytes()
        } else {
            self.e8m0_scales
        }
    }

    /// Reference (scalar) decode of columns `c0..c1` of row `r` into `out[..c1 - c0]`, exactly
    /// as FORMAT.md section 6 defines each encoding ([`crate::encoding::Codec::decode_cols`]).
    ///
    /// # Panics
    /// If `r >= rows`, `c0 > c1`, `c1 > cols` or `out` is shorter than `c1 - c0`.
    pub fn decode_cols(&self, r: usize, c0: usize, c1: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && c0 <= c1 && c1 <= self.cols && out.len() >= c1 - c0,
            "decode_cols: row {r} columns {c0}..{c1} of a [{}, {}] matrix into {} values",
            self.rows,
            self.cols,
            out.len()
        );
        if self.interleaved {
            let row = self.row_bytes(r);
            return self.row_view(r, &row).decode_cols(0, c0, c1, out);
        }
        self.encoding.decode_cols(self, r, c0, c1, out);
    }

    /// Row `r` as a one-row, row-major view whose weight section is `row` (its bytes).
    fn row_view<'b>(&'b self, r: usize, row: &'b [u8]) -> MatrixView<'b> {
        let (e, c) = (self.encoding, self.cols);
        let (s0, s1) = (e.scale_count(r, c), e.scale_count(r + 1, c));
        let (scales, e8m0) = if self.e8m0_scales.is_empty() {
            (self.scales.get(s0..s1).unwrap_or(&[]), &[][..])
        } else {
            (&[][..], &self.e8m0_scales[s0..s1])
        };
        MatrixView::checked(e, 1, c, row, scales, e8m0).expect("a row of a checked view")
    }

    /// Reference (scalar) dequantization of row `r` into `out` (`out.len() == cols`).
    /// Kernels are tested against this.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols);
        self.decode_cols(r, 0, self.cols, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructor_checks_section_lengths() {
        let e = Encoding::Int4 { group_size: 64 };
        let d = vec![0u8; e.weight_bytes(2, 100)];
        let s = vec![0f32; e.scale_count(2, 100)];
        assert!(MatrixView::new(e, 2, 100, &d, &s).is_ok());
        let err = MatrixView::new(e, 2, 100, &d[1..], &s)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("weight section is 99 bytes, expected 100"),
            "{err}"
        );
        let err = MatrixView::new(e, 2, 100, &d, &s[1..])
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 scales, expected 4"), "{err}");
        let odd = Encoding::Int4 { group_size: 3 };
        assert!(MatrixView::new(odd, 2, 100, &d, &s).is_err());
        assert!(MatrixView::new(Encoding::Bf16, usize::MAX, 2, &d, &[]).is_err());
        // mxfp4: scales are bytes; `new` refuses, `from_sections` checks the byte count.
        let m4 = Encoding::Mxfp4;
        let d4 = vec![0u8; m4.weight_bytes(2, 100)];
        assert!(MatrixView::new(m4, 2, 100, &d4, &[]).is_err());
        assert!(MatrixView::from_sections(m4, 2, 100, &d4, &[127; 8]).is_ok());
        let err = MatrixView::from_sections(m4, 2, 100, &d4, &[127; 7])
            .unwrap_err()
            .to_string();
        assert!(err.contains("7 scales, expected 8"), "{err}");
        let f = [1f32, 2.0, 3.0, 4.0];
        let v = MatrixView::from_sections(e, 1, 200, &d[..100], f.as_bytes()).unwrap();
        assert_eq!(v.scales(), &f);
        assert_eq!(v.scale_section(), f.as_bytes());
    }

    #[test]
    fn interleaved_row_order_reads_the_same_matrix() {
        // int4 g64, int8 and mxfp4; 9 rows (two blocks and a row-major tail) of 128 columns.
        for (e, rows) in [
            (Encoding::Int4 { group_size: 64 }, 9),
            (Encoding::Int8, 8),
            (Encoding::Mxfp4, 6),
        ] {
            let cols = 128;
            let major: Vec<u8> = (0..e.weight_bytes(rows, cols))
                .map(|i| (i * 37 % 251) as u8)
                .collect();
            let f: Vec<f32> = (0..e.scale_count(rows, cols))
                .map(|i| 0.01 * (i + 1) as f32)
                .collect();
            let e8: Vec<u8> = (0..e.scale_count(rows, cols))
                .map(|i| 120 + (i % 9) as u8)
                .collect();
            let sec: &[u8] = if e == Encoding::Mxfp4 {
                &e8
            } else {
                f.as_bytes()
            };
            let mut inter = major.clone();
            MatrixView::interleave(e, rows, cols, &mut inter);
            assert_ne!(inter, major, "{e:?}");
            // The first block's chunk 0 is rows 0..4's first chunk, one after another.
            let cb = e.weight_bytes(1, 64);
            let stride = e.weight_bytes(1, cols);
            assert_eq!(&inter[cb..2 * cb], &major[stride..stride + cb], "{e:?}");
            let a = MatrixView::from_sections(e, rows, cols, &major, sec).unwrap();
            let b = MatrixView::from_sections(e, rows, cols, &inter, sec)
                .unwrap()
                .as_interleaved()
                .unwrap();
            assert!(b.is_interleaved() && !a.is_interleaved());
            let (mut ra, mut rb) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                a.dequantize_row(r, &mut ra);
                b.dequantize_row(r, &mut rb);
                assert_eq!(ra, rb, "{e:?} row {r}");
                assert_eq!(a.row_bytes(r), b.row_bytes(r));
                for k in 0..2 {
                    assert_eq!(a.chunk(r, k), b.chunk(r, k), "{e:?} row {r} chunk {k}");
                }
            }
            assert_eq!(&*b.row_major_data(), &major[..]);
            // Cuts between blocks keep the order; others are refused.
            let c = b.row_range(4, rows).unwrap();
            assert_eq!(c.is_interleaved(), rows - 4 >= 4);
            c.dequantize_row(0, &mut rb);
            a.dequantize_row(4, &mut ra);
            assert_eq!(ra, rb);
            assert!(b.row_range(1, 4).is_none());
            let mut back = inter.clone();
            MatrixView::deinterleave(e, rows, cols, &mut back);
            assert_eq!(back, major);
        }
        assert!(!MatrixView::can_interleave(Encoding::Bf16, 8, 128));
        assert!(!MatrixView::can_interleave(Encoding::Int8, 8, 96));
        assert!(!MatrixView::can_interleave(Encoding::Int8, 3, 128));
    }
}
