//! [`MatrixView`]: a borrowed, checked view of one encoded matrix.

use crate::{Encoding, FormatError};

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
}

impl<'a> MatrixView<'a> {
    /// A view of a `[rows, cols]` matrix of `encoding` with weight section `data`
    /// (`encoding.weight_bytes(rows, cols)` bytes) and scales `scales`
    /// (`encoding.scale_count(rows, cols)` f32 values).
    ///
    /// # Errors
    /// [`FormatError::Format`] (with an empty file name, for the caller to fill) when a
    /// section has another length, or an int4 group size is odd or below 2.
    pub fn new(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: &'a [u8],
        scales: &'a [f32],
    ) -> Result<MatrixView<'a>, FormatError> {
        if let Encoding::Int4 { group_size } = encoding {
            if group_size < 2 || !group_size.is_multiple_of(2) {
                return Err(FormatError::format(
                    "",
                    format!("int4 group size must be even and >= 2, found {group_size}"),
                ));
            }
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
        if scales.len() != sc {
            return Err(FormatError::format(
                "",
                format!(
                    "{} [{rows}, {cols}] matrix: {} scales, expected {sc}",
                    encoding.name(),
                    scales.len()
                ),
            ));
        }
        Ok(MatrixView {
            encoding,
            rows,
            cols,
            data,
            scales,
        })
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

    /// The weight section, `encoding.weight_bytes(rows, cols)` bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The scales, `encoding.scale_count(rows, cols)` f32 values (empty for f32 and bf16).
    pub fn scales(&self) -> &'a [f32] {
        self.scales
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
        self.encoding.decode_cols(self, r, c0, c1, out);
    }

    /// Reference (scalar) dequantization of row `r` into `out` (`out.len() == cols`).
    /// Kernels are tested against this.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() == self.cols);
        self.encoding.decode_cols(self, r, 0, self.cols, out);
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
    }
}
