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
    /// The weight and scale sections are in the interleaved row order
    /// ([`MatrixView::interleave`]), not the row-major one.
    interleaved: bool,
}

/// Rows per group of the interleaved row order ([`MatrixView::interleave`]).
pub const INTERLEAVE_ROWS: usize = 16;
/// The interleaved row order needs `cols` a multiple of this (the integer kernels' chunks).
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
    /// of a row) and slices anywhere, except an interleaved view, which cuts between its groups
    /// of [`INTERLEAVE_ROWS`] rows only (`r0` a multiple of 16, `r1` one too or the last row).
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

    /// Reorders the row-major sections of a `[rows, cols]` matrix of `encoding` (one that
    /// [`MatrixView::can_interleave`]) into the interleaved row order, in place: within each
    /// group of [`INTERLEAVE_ROWS`] (16) consecutive rows, the weight section's 4-byte words
    /// (8 columns of int4 or mxfp4, 4 of int8) go word by word, each word's 16 rows one after
    /// another (row `u` of group `g`, word `j` at `g * 16 * S + (j * 16 + u) * 4` with `S` a
    /// row's bytes), and the scale section's values the same way (the group's `[16, n]` scales
    /// as `[n, 16]`, `n = encoding.scale_count(1, cols)`: int4's groups, mxfp4's e8m0 blocks;
    /// int8's one scale per row keeps its place). Rows after the last whole group stay
    /// row-major at the end of each section. The same bytes, in the order a kernel that keeps
    /// 16 rows in the 16 lanes of a vector reads them: one sequential stream, each load a word
    /// of 16 rows, each scale load the 16 rows' scales (llama.cpp's repacking of resident
    /// weights). Format version 7 stores such matrices in this order (docs/FORMAT.md section 5).
    ///
    /// # Panics
    /// If the matrix cannot be interleaved or `data` / `scales` are not its weight and scale
    /// sections (`scales` as bytes: little-endian f32 or e8m0).
    pub fn interleave(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &mut [u8],
        scales: &mut [u8],
    ) {
        Self::reorder(encoding, rows, cols, data, scales, true);
    }

    /// The inverse of [`MatrixView::interleave`]: back to the row-major order.
    ///
    /// # Panics
    /// As [`MatrixView::interleave`].
    pub fn deinterleave(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &mut [u8],
        scales: &mut [u8],
    ) {
        Self::reorder(encoding, rows, cols, data, scales, false);
    }

    fn reorder(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &mut [u8],
        scales: &mut [u8],
        to: bool,
    ) {
        let sw = encoding.scale_width();
        assert!(
            Self::can_interleave(encoding, rows, cols)
                && data.len() == encoding.weight_bytes(rows, cols)
                && scales.len() == encoding.scale_count(rows, cols) * sw,
            "interleave: a [{rows}, {cols}] {} matrix of {} weight and {} scale bytes",
            encoding.name(),
            data.len(),
            scales.len()
        );
        transpose_groups(data, rows, encoding.weight_bytes(1, cols) / 4, 4, to);
        transpose_groups(scales, rows, encoding.scale_count(1, cols), sw, to);
    }

    /// The scale-section half of [`MatrixView::interleave`] (for a caller that reorders the
    /// weight section itself, e.g. with wider registers; the bytes must be the same).
    ///
    /// # Panics
    /// As [`MatrixView::interleave`].
    pub fn interleave_scales(encoding: Encoding, rows: usize, cols: usize, scales: &mut [u8]) {
        let sw = encoding.scale_width();
        assert!(
            Self::can_interleave(encoding, rows, cols)
                && scales.len() == encoding.scale_count(rows, cols) * sw,
            "interleave: a [{rows}, {cols}] {} matrix of {} scale bytes",
            encoding.name(),
            scales.len()
        );
        transpose_groups(scales, rows, encoding.scale_count(1, cols), sw, true);
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

    /// Row `r`'s weight bytes in the row-major order (`encoding.weight_bytes(1, cols)`):
    /// borrowed from a row-major view (or a tail row), gathered from an interleaved one.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row_bytes(&self, r: usize) -> std::borrow::Cow<'a, [u8]> {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let stride = self.encoding.weight_bytes(1, self.cols);
        if !self.interleaved {
            // Any row length (a ggml row need not be whole 4-byte words).
            return std::borrow::Cow::Borrowed(&self.data[r * stride..(r + 1) * stride]);
        }
        gather_row(self.data, true, self.rows, r, stride / 4, 4)
    }

    /// Row `r`'s f32 scales (`encoding.scale_count(1, cols)` of them; empty for mxfp4), in
    /// either row order.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row_scales(&self, r: usize) -> std::borrow::Cow<'a, [f32]> {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        if self.scales.is_empty() {
            return std::borrow::Cow::Borrowed(&[]);
        }
        let n = self.encoding.scale_count(1, self.cols);
        match gather_row(self.scales.as_bytes(), self.interleaved, self.rows, r, n, 4) {
            std::borrow::Cow::Borrowed(_) => {
                std::borrow::Cow::Borrowed(&self.scales[r * n..(r + 1) * n])
            }
            std::borrow::Cow::Owned(b) => std::borrow::Cow::Owned(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
        }
    }

    /// Row `r`'s e8m0 scale bytes (mxfp4: `ceil(cols / 32)`; empty for every other encoding),
    /// in either row order.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row_e8m0(&self, r: usize) -> std::borrow::Cow<'a, [u8]> {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        if self.e8m0_scales.is_empty() {
            return std::borrow::Cow::Borrowed(&[]);
        }
        let n = self.encoding.scale_count(1, self.cols);
        gather_row(self.e8m0_scales, self.interleaved, self.rows, r, n, 1)
    }

    /// A row-major copy of this matrix's two sections (for code that reads
    /// [`MatrixView::data`] and the scales as row-major); [`RowMajorCopy::view`] views it.
    pub fn row_major_copy(&self) -> RowMajorCopy {
        let mut data = self.data.to_vec();
        let mut scales = self.scale_section().to_vec();
        if self.interleaved {
            Self::deinterleave(self.encoding, self.rows, self.cols, &mut data, &mut scales);
        }
        // f32 scales as f32 values (the view borrows them 4-byte aligned).
        let f32s = if self.e8m0_scales.is_empty() {
            scales
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        } else {
            Vec::new()
        };
        let e8m0 = if self.e8m0_scales.is_empty() {
            Vec::new()
        } else {
            scales
        };
        RowMajorCopy {
            encoding: self.encoding,
            rows: self.rows,
            cols: self.cols,
            data,
            scales: f32s,
            e8m0,
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

    /// The e8m0 scale bytes of an mxfp4 matrix, `[rows, ceil(cols / 32)]` in the view's order
    /// (row-major, or interleaved with the weights: [`MatrixView::is_interleaved`]; empty for
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
            let (row, sc, e8) = (self.row_bytes(r), self.row_scales(r), self.row_e8m0(r));
            let one = MatrixView::checked(self.encoding, 1, self.cols, &row, &sc, &e8)
                .expect("a row of a checked view");
            return one.decode_cols(0, c0, c1, out);
        }
        self.encoding.decode_cols(self, r, c0, c1, out);
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

/// An owned, row-major copy of a matrix's sections ([`MatrixView::row_major_copy`]).
#[derive(Clone, Debug)]
pub struct RowMajorCopy {
    encoding: Encoding,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    scales: Vec<f32>,
    e8m0: Vec<u8>,
}

impl RowMajorCopy {
    /// The copy as a row-major view.
    pub fn view(&self) -> MatrixView<'_> {
        MatrixView::checked(
            self.encoding,
            self.rows,
            self.cols,
            &self.data,
            &self.scales,
            &self.e8m0,
        )
        .expect("a copy of a checked view")
    }
}

/// Within each whole group of [`INTERLEAVE_ROWS`] rows of `buf` (`rows` rows of `n` elements
/// of `width` bytes, row-major), `[16, n]` to `[n, 16]` (`to`) or back; the tail rows stay.
fn transpose_groups(buf: &mut [u8], rows: usize, n: usize, width: usize, to: bool) {
    match width {
        4 => transpose_groups_of::<4>(buf, rows, n, to),
        1 => transpose_groups_of::<1>(buf, rows, n, to),
        _ => unreachable!("sections of 4-byte words, f32 or e8m0 scales"),
    }
}

/// [`transpose_groups`] for elements of `W` bytes.
fn transpose_groups_of<const W: usize>(buf: &mut [u8], rows: usize, n: usize, to: bool) {
    let group = INTERLEAVE_ROWS * n * W;
    if group == 0 {
        return;
    }
    let mut tmp = vec![0u8; group];
    for g in buf[..rows / INTERLEAVE_ROWS * group].chunks_exact_mut(group) {
        tmp.copy_from_slice(g);
        for u in 0..INTERLEAVE_ROWS {
            for j in 0..n {
                let major = (u * n + j) * W;
                let inter = (j * INTERLEAVE_ROWS + u) * W;
                let (dst, src) = if to { (inter, major) } else { (major, inter) };
                let v: [u8; W] = tmp[src..src + W].try_into().expect("W bytes");
                g[dst..dst + W].copy_from_slice(&v);
            }
        }
    }
}

/// Row `r` (of `rows`, `n` elements of `width` bytes each) of a section in the row-major
/// order (`interleaved` false, or a tail row: borrowed) or the interleaved one (gathered).
fn gather_row(
    buf: &[u8],
    interleaved: bool,
    rows: usize,
    r: usize,
    n: usize,
    width: usize,
) -> std::borrow::Cow<'_, [u8]> {
    let whole = rows / INTERLEAVE_ROWS * INTERLEAVE_ROWS;
    let stride = n * width;
    if !interleaved || r >= whole {
        return std::borrow::Cow::Borrowed(&buf[r * stride..(r + 1) * stride]);
    }
    let (g, u) = (r / INTERLEAVE_ROWS, r % INTERLEAVE_ROWS);
    let base = g * INTERLEAVE_ROWS * stride;
    let mut row = Vec::with_capacity(stride);
    for j in 0..n {
        let at = base + (j * INTERLEAVE_ROWS + u) * width;
        row.extend_from_slice(&buf[at..at + width]);
    }
    std::borrow::Cow::Owned(row)
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
        for (e, rows) in [
            (Encoding::Int4 { group_size: 64 }, 37),
            (Encoding::Int4 { group_size: 32 }, 16),
            (Encoding::Int8, 35),
            (Encoding::Mxfp4, 48),
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
            let sec: Vec<u8> = if e == Encoding::Mxfp4 {
                e8.clone()
            } else {
                f.as_bytes().to_vec()
            };
            let (mut inter, mut isec) = (major.clone(), sec.clone());
            MatrixView::interleave(e, rows, cols, &mut inter, &mut isec);
            assert_ne!(inter, major, "{e:?}");
            // Word 0 of the first group is the first 4 bytes of rows 0..16, one after another;
            // word 1 of row 2 follows 16 + 2 words in.
            let stride = e.weight_bytes(1, cols);
            for u in 0..16 {
                assert_eq!(&inter[4 * u..4 * u + 4], &major[u * stride..u * stride + 4]);
            }
            assert_eq!(
                &inter[4 * 18..4 * 19],
                &major[2 * stride + 4..2 * stride + 8]
            );
            // Scales: the group's [16, n] as [n, 16] (int8's one per row keeps its place).
            let (n, w) = (e.scale_count(1, cols), e.scale_width());
            if n == 1 {
                assert_eq!(isec, sec);
            } else {
                assert_eq!(&isec[w * 16..w * 17], &sec[w..2 * w], "{e:?}");
            }
            let a = MatrixView::from_sections(e, rows, cols, &major, &sec).unwrap();
            let b = MatrixView::from_sections(e, rows, cols, &inter, &isec)
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
                assert_eq!(a.row_scales(r), b.row_scales(r));
                assert_eq!(a.row_e8m0(r), b.row_e8m0(r));
            }
            let c = b.row_major_copy();
            assert_eq!(c.view().data(), &major[..]);
            assert_eq!(c.view().scale_section(), &sec[..]);
            // Cuts between groups keep the order; others are refused.
            if rows > 16 {
                let c = b.row_range(16, rows).unwrap();
                assert_eq!(c.is_interleaved(), rows - 16 >= 16);
                c.dequantize_row(0, &mut rb);
                a.dequantize_row(16, &mut ra);
                assert_eq!(ra, rb);
            }
            assert!(b.row_range(1, 16).is_none());
            let (mut back, mut bsec) = (inter.clone(), isec.clone());
            MatrixView::deinterleave(e, rows, cols, &mut back, &mut bsec);
            assert_eq!((back, bsec), (major, sec));
        }
        assert!(!MatrixView::can_interleave(Encoding::Bf16, 8, 128));
        assert!(!MatrixView::can_interleave(Encoding::Int8, 8, 96));
        assert!(!MatrixView::can_interleave(Encoding::Int8, 3, 128));
    }
}
