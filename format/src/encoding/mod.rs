//! Weight encodings of the store (docs/FORMAT.md section 6): one module per encoding, each a
//! [`Codec`] that states its on-disk id, its section sizes and the scalar decode/encode of a
//! row that DEFINE the encoding (kernels and the converter's SIMD paths are tested against
//! them). [`Encoding`] names an encoding (with its parameters) and dispatches to its codec.
//!
//! Adding an encoding: a new module with a [`Codec`], a variant of [`Encoding`] and its arms in
//! [`Encoding::from_id`] and `with_codec`, and its row in FORMAT.md section 6 (recipe in
//! docs/ARCHITECTURE.md).

pub mod bf16;
pub mod f32;
pub mod fp8;
pub mod ggml;
pub mod int4;
pub mod int8;
pub mod mxfp4;
pub mod mxfp8;

use crate::{FormatError, MatrixView};

pub use bf16::bf16_to_f32;
pub use fp8::{fp8_e4m3_to_f32, FP8_BLOCK};
pub use ggml::GgmlType;

/// Alignment of every weight and scale section inside a record or `dense.bin`, in bytes.
pub const SECTION_ALIGN: usize = 64;

/// Smallest quantization scale of the integer encodings (FORMAT.md section 6): avoids a
/// division by zero on all-zero groups and rows.
pub const MIN_SCALE: f32 = 1e-8;

/// Squared-error sums of an encoded row or tensor, against the f32 source values: the
/// relative RMS error is `sqrt(err2 / w2)`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrSums {
    /// `sum (w_q - w)^2`, in f64.
    pub err2: f64,
    /// `sum w^2`, in f64.
    pub w2: f64,
}

/// What one encoding is: its id, its section sizes, and its reference decode and encode.
///
/// Implemented once per encoding module ([`f32::F32`], [`bf16::Bf16`], [`fp8::Fp8`],
/// [`int8::Int8`], [`int4::Int4`], [`mxfp4::Mxfp4`], [`mxfp8::Mxfp8`]); reached through
/// [`Encoding`].
pub trait Codec {
    /// The on-disk encoding id (FORMAT.md section 6).
    fn id(&self) -> u16;
    /// The group size field stored next to the id (0 where the encoding has none).
    fn group_size_field(&self) -> u16;
    /// A short name (`int4-g64`), as the converter's options and `coli info` spell it.
    fn name(&self) -> String;
    /// Bytes of the weight section of a `[rows, cols]` matrix.
    fn weight_bytes(&self, rows: usize, cols: usize) -> usize;
    /// Number of scales of a `[rows, cols]` matrix (0 for f32 and bf16).
    fn scale_count(&self, rows: usize, cols: usize) -> usize;
    /// Bytes of one scale: 4 (f32) for every encoding but mxfp4, whose e8m0 scales are bytes.
    fn scale_width(&self) -> usize {
        4
    }
    /// Reference decode of columns `c0..c1` of row `r` of `m` into `out[..c1 - c0]`, exactly
    /// as FORMAT.md section 6 defines the values (one f32 rounding of `code * scale`).
    /// `m` has this encoding; `r < rows`, `c0 <= c1 <= cols` (checked by the caller).
    fn decode_cols(&self, m: &MatrixView<'_>, r: usize, c0: usize, c1: usize, out: &mut [f32]);
    /// Reference encode of one row of f32 values `w` (`cols` long, finite) into the row's
    /// weight bytes `dst` (`weight_bytes(1, cols)` long) and its scales `scales`
    /// (`scale_count(1, cols)` long); returns the row's error sums. `None` for an encoding
    /// that is never produced from f32 values (fp8 keeps a checkpoint's FP8 bytes as they are).
    fn encode_row(&self, w: &[f32], dst: &mut [u8], scales: &mut [f32]) -> Option<ErrSums>;
}

/// A weight encoding, with its explicit on-disk id (never guessed from byte counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Encoding {
    /// id 1: little-endian f32 ([`prim@f32`]).
    F32,
    /// id 2: bfloat16 bit patterns, u16 ([`bf16`]).
    Bf16,
    /// id 3: float8 e4m3fn with one f32 scale per 128x128 block ([`fp8`]).
    Fp8,
    /// id 4: i8 with one f32 scale per row ([`int8`]).
    Int8,
    /// id 5: symmetric int4, two per byte, one f32 scale per `group_size` columns of a row
    /// ([`int4`]).
    Int4 {
        /// Columns per scale group (32 or 64 in practice; even, at least 2).
        group_size: u16,
    },
    /// id 6 (format version 2): OCP MXFP4, e2m1 codes two per byte with one e8m0 scale byte per
    /// block of 32 columns of a row ([`mxfp4`]).
    Mxfp4,
    /// id 7 (format version 4): a llama.cpp block type kept bit for bit from a GGUF, the group
    /// size field holding its ggml type id ([`ggml`]).
    Ggml(GgmlType),
    /// id 8 (format version 5): OCP MXFP8, e4m3 codes one per byte with one e8m0 scale byte per
    /// block of 32 columns of a row ([`mxfp8`]).
    Mxfp8,
}

impl Encoding {
    /// Runs `f` on this encoding's codec.
    fn with_codec<R>(self, f: impl FnOnce(&dyn Codec) -> R) -> R {
        match self {
            Encoding::F32 => f(&f32::F32),
            Encoding::Bf16 => f(&bf16::Bf16),
            Encoding::Fp8 => f(&fp8::Fp8),
            Encoding::Int8 => f(&int8::Int8),
            Encoding::Int4 { group_size } => f(&int4::Int4 { group_size }),
            Encoding::Mxfp4 => f(&mxfp4::Mxfp4),
            Encoding::Ggml(t) => f(&ggml::Ggml(t)),
            Encoding::Mxfp8 => f(&mxfp8::Mxfp8),
        }
    }

    /// The on-disk id (FORMAT.md section 6).
    pub fn id(self) -> u16 {
        self.with_codec(|c| c.id())
    }

    /// The group size field written next to the id: int4 group size, 128 for fp8, 32 for
    /// mxfp4, else 0.
    pub fn group_size(self) -> u16 {
        self.with_codec(|c| c.group_size_field())
    }

    /// Rebuilds an encoding from its id and group size field.
    ///
    /// # Errors
    /// [`FormatError::Format`] (with an empty file name, for the caller to fill) for an
    /// unknown id, an int4 group size of 0 or odd, or an mxfp4 group size other than 32.
    pub fn from_id(id: u16, group_size: u16) -> Result<Encoding, FormatError> {
        Ok(match id {
            1 => Encoding::F32,
            2 => Encoding::Bf16,
            3 => Encoding::Fp8,
            4 => Encoding::Int8,
            5 if group_size >= 2 && group_size.is_multiple_of(2) => Encoding::Int4 { group_size },
            6 if group_size as usize == mxfp4::MXFP4_BLOCK => Encoding::Mxfp4,
            7 if GgmlType::from_id(group_size as u32).is_some() => {
                Encoding::Ggml(GgmlType::from_id(group_size as u32).expect("checked"))
            }
            8 if group_size as usize == mxfp8::MXFP8_BLOCK => Encoding::Mxfp8,
            _ => {
                return Err(FormatError::format(
                    "",
                    format!("unknown encoding id {id} with group size {group_size}"),
                ))
            }
        })
    }

    /// A short name: `f32`, `bf16`, `fp8`, `int8`, `int4-g64`, `mxfp4`, `mxfp8`, or a ggml type's
    /// (`q4_k`, `iq4_xs`, `f16`).
    pub fn name(self) -> String {
        self.with_codec(|c| c.name())
    }

    /// Bytes of the weight section of a `[rows, cols]` matrix.
    pub fn weight_bytes(self, rows: usize, cols: usize) -> usize {
        self.with_codec(|c| c.weight_bytes(rows, cols))
    }

    /// Number of scales of a `[rows, cols]` matrix (0 for f32 and bf16): f32 values, or e8m0
    /// bytes for mxfp4 ([`Encoding::scale_width`]).
    pub fn scale_count(self, rows: usize, cols: usize) -> usize {
        self.with_codec(|c| c.scale_count(rows, cols))
    }

    /// Bytes of one scale: 4 (f32), or 1 for mxfp4's and mxfp8's e8m0 scales.
    pub fn scale_width(self) -> usize {
        self.with_codec(|c| c.scale_width())
    }

    /// True when the scales are f32 values (every encoding with scales but mxfp4 and mxfp8).
    pub fn has_f32_scales(self) -> bool {
        self.scale_width() == 4
    }

    /// The oldest store format version that can hold this encoding: 2 for mxfp4, 4 for the
    /// ggml block types of version 4, 5 for mxfp8, 6 for the i-quants and GGUF's mxfp4
    /// ([`GgmlType::min_format_version`]), else 1 (docs/FORMAT.md section 12).
    pub fn min_format_version(self) -> u32 {
        match self {
            Encoding::Mxfp4 => 2,
            Encoding::Ggml(t) => t.min_format_version(),
            Encoding::Mxfp8 => 5,
            _ => 1,
        }
    }

    /// Columns a matrix of this encoding must be a multiple of: a ggml type's block size
    /// (32 or 256), else 1.
    pub fn col_multiple(self) -> usize {
        match self {
            Encoding::Ggml(t) => t.block_size(),
            _ => 1,
        }
    }

    /// Bytes of the scale section of a `[rows, cols]` matrix.
    pub fn scale_bytes(self, rows: usize, cols: usize) -> usize {
        self.scale_count(rows, cols) * self.scale_width()
    }

    /// The reference encode of one row ([`Codec::encode_row`]).
    pub fn encode_row(self, w: &[f32], dst: &mut [u8], scales: &mut [f32]) -> Option<ErrSums> {
        self.with_codec(|c| c.encode_row(w, dst, scales))
    }

    /// The reference decode of columns `c0..c1` of row `r` of `m` ([`Codec::decode_cols`]).
    pub(crate) fn decode_cols(
        self,
        m: &MatrixView<'_>,
        r: usize,
        c0: usize,
        c1: usize,
        out: &mut [f32],
    ) {
        self.with_codec(|c| c.decode_cols(m, r, c0, c1, out))
    }
}

/// Rounds `n` up to a multiple of `align` (any positive number).
pub fn align_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// `round_half_even(v)` for `|v| <= 2^22`, without a libm call: adding and subtracting
/// 1.5 * 2^23 rounds to an integer in the current (IEEE default: to nearest, ties to even)
/// rounding mode. Rust does not reassociate float arithmetic, so this is exact.
#[inline(always)]
pub(crate) fn rne_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for e in [
            Encoding::F32,
            Encoding::Bf16,
            Encoding::Fp8,
            Encoding::Int8,
            Encoding::Int4 { group_size: 64 },
            Encoding::Int4 { group_size: 32 },
            Encoding::Mxfp4,
            Encoding::Mxfp8,
            Encoding::Ggml(GgmlType::Q4_K),
            Encoding::Ggml(GgmlType::F16),
            Encoding::Ggml(GgmlType::IQ2_XXS),
            Encoding::Ggml(GgmlType::MXFP4),
        ] {
            assert_eq!(Encoding::from_id(e.id(), e.group_size()).unwrap(), e);
        }
        assert!(Encoding::from_id(7, 35).is_err()); // TQ2_0: not decoded
        assert_eq!(Encoding::Ggml(GgmlType::MXFP4).name(), "mxfp4_gguf");
        assert_eq!(Encoding::Ggml(GgmlType::Q6_K).name(), "q6_k");
        assert_eq!(
            Encoding::Ggml(GgmlType::Q4_K).weight_bytes(3, 512),
            3 * 2 * 144
        );
        assert!(Encoding::from_id(5, 0).is_err());
        assert!(Encoding::from_id(5, 3).is_err());
        assert!(Encoding::from_id(9, 0).is_err());
        assert!(Encoding::from_id(6, 16).is_err());
        assert_eq!(Encoding::Mxfp4.name(), "mxfp4");
        assert_eq!(Encoding::Mxfp8.name(), "mxfp8");
        assert!(Encoding::from_id(8, 16).is_err());
        assert_eq!(Encoding::Int4 { group_size: 64 }.name(), "int4-g64");
        assert_eq!(Encoding::Fp8.group_size(), 128);
    }

    #[test]
    fn section_sizes() {
        let g64 = Encoding::Int4 { group_size: 64 };
        assert_eq!(g64.weight_bytes(3, 129), 3 * 65);
        assert_eq!(g64.scale_count(3, 129), 3 * 3);
        assert_eq!(Encoding::Fp8.scale_count(129, 256), 2 * 2);
        assert_eq!(Encoding::Int8.scale_bytes(5, 7), 20);
        assert_eq!(Encoding::Bf16.weight_bytes(2, 3), 12);
        assert_eq!(Encoding::F32.scale_count(2, 3), 0);
        assert_eq!(Encoding::Mxfp4.weight_bytes(3, 65), 3 * 33);
        assert_eq!(Encoding::Mxfp4.scale_bytes(3, 65), 3 * 3);
    }
}
