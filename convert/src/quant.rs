//! Decoding source tensors to f32 and encoding them into the store's encodings.
//!
//! The arithmetic is exactly docs/FORMAT.md section 6 ("Quantization"), all in f32:
//!
//! - FP8 source: `w = fp8_e4m3_to_f32(q) * (scale as f32)` where the scale is the source's
//!   `<name>_scale_inv` block `[r / 128][c / 128]` (F32, BF16 or F16, widened exactly).
//! - **int4, group g**: per row, per group of `g` consecutive columns (the last group of a row
//!   is shorter when `g` does not divide `cols`): `absmax = max |w|`, `s = max(absmax / 7, 1e-8)`,
//!   `q = clip(round_half_even(w / s), -8, 7)`; stored as nibble `q + 8`, column `2j` in the low
//!   nibble of byte `j` of the row, column `2j+1` in the high nibble; for odd `cols` the last
//!   high nibble is 8 (q = 0). Scales f32, `[rows, ceil(cols / g)]`.
//! - **int8**: per row, `s = max(absmax / 127, 1e-8)`, `q = clip(round_half_even(w / s), -128, 127)`.
//! - **bf16**: round to nearest, ties to even (`coli_format::encoding::bf16::f32_to_bf16_rne`).
//! - **fp8**: the source's bytes and block scales, unchanged (scales widened to f32 exactly).
//! - **f32**: the values (F16 and F32 sources widen exactly).
//!
//! The encoders are `coli_format`'s (one module per encoding), with the SIMD twins of
//! `coli-kernels` where they exist (FP8 row decoding, int4 quantization), bit-identical to them.
//! NaN and infinities (including the e4m3 NaN codes 0x7F/0xFF) are refused with the tensor name
//! and position. Rows are processed in parallel with rayon; each row's output depends only on
//! that row, and statistics are summed in row order, so results do not depend on the number of
//! threads.

use crate::error::{ConvertError, Result};
use crate::safetensors::Dtype;
use coli_format::encoding::fp8::has_nan;
use coli_format::encoding::{bf16_to_f32, fp8_e4m3_to_f32, FP8_BLOCK};
use coli_format::{Encoding, MatrixView};
use coli_store::EncodedMatrix;
use rayon::prelude::*;
use std::path::Path;

/// A source tensor's FP8 block scales (`<name>_scale_inv`), `[ceil(rows/128), ceil(cols/128)]`.
#[derive(Clone, Copy, Debug)]
pub struct ScaleSource<'a> {
    /// Tensor name of the scale (`..._scale_inv`).
    pub name: &'a str,
    /// Shard holding it.
    pub file: &'a Path,
    /// F32, BF16 or F16.
    pub dtype: Dtype,
    /// Raw little-endian bytes, unaligned.
    pub data: &'a [u8],
}

/// A source matrix as stored in the checkpoint. 1-D tensors are seen as one row.
#[derive(Clone, Copy, Debug)]
pub struct SourceMatrix<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Shard holding it.
    pub file: &'a Path,
    /// Element type.
    pub dtype: Dtype,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// Raw little-endian bytes (`rows * cols * dtype.size()`), unaligned.
    pub data: &'a [u8],
    /// Block scales, required when `dtype` is F8_E4M3.
    pub scales: Option<ScaleSource<'a>>,
}

/// Squared-error sums of one encoded tensor, for the relative RMS error
/// `sqrt(sum (w_q - w)^2 / sum w^2)` against the f32 source values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrStats {
    /// `sum (w_q - w)^2`, in f64.
    pub sum_err2: f64,
    /// `sum w^2`, in f64.
    pub sum_w2: f64,
}

impl ErrStats {
    /// Adds another tensor's sums.
    pub fn add(&mut self, o: ErrStats) {
        self.sum_err2 += o.sum_err2;
        self.sum_w2 += o.sum_w2;
    }
    /// `sqrt(sum_err2 / sum_w2)`; 0 when there is no error; `None` when nothing was measured.
    pub fn rel_rms(&self) -> Option<f64> {
        if self.sum_err2 == 0.0 {
            if self.sum_w2 == 0.0 {
                return None;
            }
            return Some(0.0);
        }
        Some((self.sum_err2 / self.sum_w2.max(f64::MIN_POSITIVE)).sqrt())
    }
}

/// Decodes an f16 bit pattern to f32 exactly.
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Decodes element `i` of a little-endian buffer of `dtype` (FP8 without its scale; U8 as its
/// integer value, never a weight: callers refuse U8 weights before decoding).
#[inline]
pub(crate) fn decode(dtype: Dtype, data: &[u8], i: usize) -> f32 {
    match dtype {
        Dtype::F8E4M3 => fp8_e4m3_to_f32(data[i]),
        Dtype::Bf16 => bf16_to_f32(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])),
        Dtype::F16 => f16_to_f32(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])),
        Dtype::F32 => f32::from_le_bytes([
            data[4 * i],
            data[4 * i + 1],
            data[4 * i + 2],
            data[4 * i + 3],
        ]),
        Dtype::U8 => data[i] as f32,
        Dtype::I64 => {
            let b: [u8; 8] = data[8 * i..8 * i + 8].try_into().expect("8 bytes");
            i64::from_le_bytes(b) as f32
        }
        Dtype::I8 => data[i] as i8 as f32,
        Dtype::F8E8M0 => e8m0_to_f32(data[i]),
    }
}

/// An e8m0 code as f32: `2^(code - 127)`, exact (code 0 is the subnormal 2^-127); 0xFF is NaN.
pub fn e8m0_to_f32(code: u8) -> f32 {
    match code {
        0xFF => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        c => f32::from_bits((c as u32) << 23),
    }
}

/// The largest integer a lookup table may hold: every integer up to 2^24 is an exact f32.
pub const MAX_TABLE_VALUE: i64 = 1 << 24;

fn non_finite(tensor: &str, file: &Path, position: String, v: f32) -> ConvertError {
    ConvertError::NonFinite {
        tensor: tensor.to_string(),
        file: file.to_path_buf(),
        position,
        value: format!("{v}"),
    }
}

impl<'a> SourceMatrix<'a> {
    /// Number of FP8 scale blocks along rows and columns.
    pub fn scale_blocks(&self) -> (usize, usize) {
        (self.rows.div_ceil(FP8_BLOCK), self.cols.div_ceil(FP8_BLOCK))
    }

    /// The block scales widened to f32, `[ceil(rows/128) * ceil(cols/128)]` row-major
    /// (empty for non-FP8 sources).
    ///
    /// # Errors
    /// [`ConvertError::Tensor`] when an FP8 tensor has no scale or the scale has the wrong
    /// size; [`ConvertError::NonFinite`] for a NaN or infinite scale.
    pub fn scales_f32(&self) -> Result<Vec<f32>> {
        if self.dtype != Dtype::F8E4M3 {
            return Ok(Vec::new());
        }
        let s = self.scales.ok_or_else(|| ConvertError::Tensor {
            tensor: self.name.to_string(),
            what: format!(
                "F8_E4M3 weight without its block scale {}_scale_inv",
                self.name.trim_end_matches(".weight")
            ),
        })?;
        let (br, bc) = self.scale_blocks();
        if s.data.len() != br * bc * s.dtype.size() {
            return Err(ConvertError::Tensor {
                tensor: s.name.to_string(),
                what: format!(
                    "scale has {} bytes, expected [{br}, {bc}] {} for weight [{}, {}]",
                    s.data.len(),
                    s.dtype.name(),
                    self.rows,
                    self.cols
                ),
            });
        }
        let out: Vec<f32> = (0..br * bc).map(|i| decode(s.dtype, s.data, i)).collect();
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(non_finite(
                s.name,
                s.file,
                format!("[{}, {}]", i / bc.max(1), i % bc.max(1)),
                out[i],
            ));
        }
        Ok(out)
    }

    /// Decodes row `r` into `out` (`cols` values) in f32, FP8 times its block scale.
    /// Returns the first column holding a NaN/infinite value (or an e4m3 NaN code).
    fn row_f32(&self, scales: &[f32], r: usize, out: &mut [f32]) -> Option<usize> {
        let base = r * self.cols;
        match self.dtype {
            Dtype::F8E4M3 => {
                let view = MatrixView::new(Encoding::Fp8, self.rows, self.cols, self.data, scales)
                    .expect("FP8 source lengths checked by encode and scales_f32");
                coli_kernels::dequantize_row(&view, r, out);
            }
            dt => {
                for (c, o) in out.iter_mut().enumerate() {
                    *o = decode(dt, self.data, base + c);
                }
            }
        }
        out.iter().position(|v| !v.is_finite())
    }

    fn row_error(&self, scales: &[f32], r: usize, c: usize) -> ConvertError {
        let mut row = vec![0f32; self.cols];
        self.row_f32(scales, r, &mut row);
        if self.dtype == Dtype::F8E4M3 && self.data[r * self.cols + c] & 0x7F == 0x7F {
            return ConvertError::NonFinite {
                tensor: self.name.to_string(),
                file: self.file.to_path_buf(),
                position: format!(
                    "[{r}, {c}] (e4m3 NaN code 0x{:02X})",
                    self.data[r * self.cols + c]
                ),
                value: "NaN".into(),
            };
        }
        non_finite(self.name, self.file, format!("[{r}, {c}]"), row[c])
    }
}

/// Per-row outcome, summed in row order afterwards.
#[derive(Clone, Copy, Default)]
struct RowOut {
    err2: f64,
    w2: f64,
    bad: Option<usize>,
}

/// An MX matrix (`native`: mxfp4 or mxfp8; `data` its codes, `scales` its e8m0 bytes, as
/// published) in `enc`: kept bit for bit when `enc` is `native`, else each row decoded exactly
/// by the native encoding's reference decode (FORMAT.md section 6) and encoded as an f32 source
/// named `name` in `file` (gpt-oss's MXFP4 and Inkling 2's MXFP8 experts, `fused.rs`;
/// DeepSeek-V4's FP4 experts, [`encode`]).
///
/// # Errors
/// As [`encode`] of an f32 source (fp8, mxfp8 and ggml targets keep only their own sources).
///
/// # Panics
/// When `data` and `scales` do not make a `[rows, cols]` matrix (callers check the shapes).
pub(crate) fn encode_mx(
    name: &str,
    file: &Path,
    native: Encoding,
    (rows, cols): (usize, usize),
    data: Vec<u8>,
    scales: Vec<u8>,
    enc: Encoding,
) -> Result<(EncodedMatrix, ErrStats)> {
    if enc == native {
        let mut em = EncodedMatrix::new(native, rows, cols, data, vec![]);
        em.e8m0_scales = scales;
        return Ok((em, ErrStats::default()));
    }
    let view = MatrixView::from_sections(native, rows, cols, &data, &scales)
        .expect("MX sections of the checked shapes");
    let mut row = vec![0f32; cols];
    let mut f = Vec::with_capacity(rows * cols * 4);
    for r in 0..rows {
        view.dequantize_row(r, &mut row);
        f.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    encode(
        &SourceMatrix {
            name,
            file,
            dtype: Dtype::F32,
            rows,
            cols,
            data: &f,
            scales: None,
        },
        enc,
    )
}

/// An FP4 source (DeepSeek-V4's experts: I8 codes `[rows, cols / 2]`, e8m0 scales per 32
/// columns; `plan::source_matrix` checked the shapes and NaN scales) into `enc`, as MXFP4's
/// bits ([`encode_mx`]).
///
/// # Errors
/// [`ConvertError::Tensor`] for a missing or misshapen scale, or an encoding that keeps only
/// its own sources (fp8, mxfp8, ggml).
fn encode_fp4(src: &SourceMatrix<'_>, enc: Encoding) -> Result<(EncodedMatrix, ErrStats)> {
    let (rows, cols) = (src.rows, src.cols);
    let scales = src.scales.as_ref().map_or(&[][..], |s| s.data);
    if MatrixView::from_sections(Encoding::Mxfp4, rows, cols, src.data, scales).is_err() {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!(
                "FP4 codes of {} bytes with {} scale bytes do not make a [{rows}, {cols}] matrix (cols / 2 and cols / 32 per row)",
                src.data.len(),
                scales.len()
            ),
        });
    }
    if matches!(enc, Encoding::Fp8 | Encoding::Mxfp8 | Encoding::Ggml(_)) {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!(
                "is FP4 (I8 codes) in {}; the {} encoding keeps its own sources only: choose mxfp4 (lossless), int4-g64, int8 or bf16 for experts",
                src.file.display(),
                enc.name()
            ),
        });
    }
    encode_mx(
        src.name,
        src.file,
        Encoding::Mxfp4,
        (rows, cols),
        src.data.to_vec(),
        scales.to_vec(),
        enc,
    )
}

/// Encodes `src` into `enc` and measures the quantization error.
///
/// # Errors
/// [`ConvertError::Tensor`] when `enc` is fp8 and the source is not F8_E4M3, or a scale is
/// missing/misshapen; [`ConvertError::NonFinite`] for NaN/Inf values (first in row order).
pub fn encode(src: &SourceMatrix<'_>, enc: Encoding) -> Result<(EncodedMatrix, ErrStats)> {
    if src.dtype == Dtype::I8 {
        return encode_fp4(src, enc);
    }
    let (rows, cols) = (src.rows, src.cols);
    let expect = rows * cols * src.dtype.size();
    if src.data.len() != expect {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!("has {} bytes, expected {expect}", src.data.len()),
        });
    }
    if src.dtype == Dtype::U8 {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!(
                "is U8 in {}: raw bytes are not weights (MXFP4 experts are read from their \
                 *_blocks and *_scales tensors)",
                src.file.display()
            ),
        });
    }
    if src.dtype == Dtype::I64 {
        if enc != Encoding::F32 {
            return Err(ConvertError::Tensor {
                tensor: src.name.to_string(),
                what: format!(
                    "is I64 in {}: an integer table is stored as exact f32 values, not {}",
                    src.file.display(),
                    enc.name()
                ),
            });
        }
        for (i, b) in src.data.chunks_exact(8).enumerate() {
            let v = i64::from_le_bytes(b.try_into().expect("8 bytes"));
            if !(0..=MAX_TABLE_VALUE).contains(&v) {
                return Err(ConvertError::Tensor {
                    tensor: src.name.to_string(),
                    what: format!(
                        "holds {v} at [{}, {}] in {}: a lookup table's values must be ids in 0..=2^24",
                        i / cols.max(1),
                        i % cols.max(1),
                        src.file.display()
                    ),
                });
            }
        }
    }
    if let Encoding::Ggml(t) = enc {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!(
                "is {} in {}; the {} encoding keeps a GGUF's blocks only (copied as \
                 published): choose int4-g64, int8 or bf16",
                src.dtype.name(),
                src.file.display(),
                t.name()
            ),
        });
    }
    if matches!(enc, Encoding::Mxfp4 | Encoding::Mxfp8) {
        return Err(ConvertError::Tensor {
            tensor: src.name.to_string(),
            what: format!(
                "is {} in {}; the {e} encoding keeps {E} experts only (copied as \
                 published): choose int4-g64, int8 or bf16",
                src.dtype.name(),
                src.file.display(),
                e = enc.name(),
                E = enc.name().to_uppercase(),
            ),
        });
    }
    let scales = src.scales_f32()?;
    let mut out = EncodedMatrix::new(
        enc,
        rows,
        cols,
        vec![0u8; enc.weight_bytes(rows, cols)],
        vec![0f32; enc.scale_count(rows, cols)],
    );
    if rows == 0 || cols == 0 {
        return Ok((out, ErrStats::default()));
    }
    let mut per_row = vec![RowOut::default(); rows];
    match enc {
        Encoding::Mxfp4 | Encoding::Mxfp8 | Encoding::Ggml(_) => unreachable!("refused above"),
        Encoding::Fp8 => {
            if src.dtype != Dtype::F8E4M3 {
                return Err(ConvertError::Tensor {
                    tensor: src.name.to_string(),
                    what: format!(
                        "is {} in the source ({}); the fp8 encoding keeps FP8 weights only: \
                         choose bf16 or int8 for this class of tensors",
                        src.dtype.name(),
                        src.file.display()
                    ),
                });
            }
            out.data
                .par_chunks_mut(cols)
                .zip(per_row.par_iter_mut())
                .enumerate()
                .for_each(|(r, (dst, ro))| {
                    let row = &src.data[r * cols..(r + 1) * cols];
                    if has_nan(row) {
                        ro.bad = row.iter().position(|&b| b & 0x7F == 0x7F);
                    }
                    dst.copy_from_slice(row);
                });
            out.scales.copy_from_slice(&scales);
        }
        Encoding::Bf16 | Encoding::F32 => {
            let esz = if enc == Encoding::Bf16 { 2 } else { 4 };
            out.data
                .par_chunks_mut(cols * esz)
                .zip(per_row.par_iter_mut())
                .enumerate()
                .for_each_init(
                    || vec![0f32; cols],
                    |buf, (r, (dst, ro))| {
                        ro.bad = src.row_f32(&scales, r, buf);
                        if ro.bad.is_some() {
                            return;
                        }
                        let e = enc.encode_row(buf, dst, &mut []).expect("bf16/f32 encode");
                        ro.err2 = e.err2;
                        ro.w2 = e.w2;
                    },
                );
        }
        Encoding::Int8 => {
            out.data
                .par_chunks_mut(cols)
                .zip(out.scales.par_iter_mut())
                .zip(per_row.par_iter_mut())
                .enumerate()
                .for_each_init(
                    || vec![0f32; cols],
                    |buf, (r, ((dst, s_out), ro))| {
                        ro.bad = src.row_f32(&scales, r, buf);
                        if ro.bad.is_some() {
                            return;
                        }
                        let e = Encoding::Int8
                            .encode_row(buf, dst, std::slice::from_mut(s_out))
                            .expect("int8 encode");
                        ro.err2 = e.err2;
                        ro.w2 = e.w2;
                    },
                );
        }
        Encoding::Int4 { group_size } => {
            let g = group_size as usize;
            let stride = cols.div_ceil(2);
            let ng = cols.div_ceil(g);
            out.data
                .par_chunks_mut(stride)
                .zip(out.scales.par_chunks_mut(ng))
                .zip(per_row.par_iter_mut())
                .enumerate()
                .for_each_init(
                    || vec![0f32; cols],
                    |buf, (r, ((dst, s_out), ro))| {
                        ro.bad = src.row_f32(&scales, r, buf);
                        if ro.bad.is_some() {
                            return;
                        }
                        let e = coli_kernels::quantize_int4_row(buf, g, dst, s_out);
                        ro.err2 = e.err2;
                        ro.w2 = e.w2;
                    },
                );
        }
    }
    let mut stats = ErrStats::default();
    for (r, ro) in per_row.iter().enumerate() {
        if let Some(c) = ro.bad {
            return Err(src.row_error(&scales, r, c));
        }
        stats.sum_err2 += ro.err2;
        stats.sum_w2 += ro.w2;
    }
    Ok((out, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use coli_format::encoding::bf16::f32_to_bf16_rne;
    use coli_format::encoding::fp8::FP8_LUT;
    use coli_format::encoding::int4::int4_q;
    use coli_format::encoding::int8::int8_q;
    use coli_format::encoding::MIN_SCALE;

    fn fp8_lut() -> &'static [f32; 256] {
        &FP8_LUT
    }

    /// The converter's int4 row quantizer (kernels' SIMD twin where it applies): (err2, w2).
    fn quantize_int4_row(w: &[f32], g: usize, d: &mut [u8], s: &mut [f32]) -> (f64, f64) {
        let e = coli_kernels::quantize_int4_row(w, g, d, s);
        (e.err2, e.w2)
    }

    /// The reference int4 encoder of coli-format: (err2, w2).
    fn quantize_int4_row_scalar(w: &[f32], g: usize, d: &mut [u8], s: &mut [f32]) -> (f64, f64) {
        let e = Encoding::Int4 {
            group_size: g as u16,
        }
        .encode_row(w, d, s)
        .unwrap();
        (e.err2, e.w2)
    }

    /// The reference int8 encoder of coli-format: (scale, err2, w2).
    fn quantize_int8_row(w: &[f32], d: &mut [u8]) -> (f32, f64, f64) {
        let mut s = [0f32];
        let e = Encoding::Int8.encode_row(w, d, &mut s).unwrap();
        (s[0], e.err2, e.w2)
    }

    fn has_fp8_nan(b: &[u8]) -> bool {
        has_nan(b)
    }

    fn mat<'a>(
        name: &'a str,
        dtype: Dtype,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> SourceMatrix<'a> {
        SourceMatrix {
            name,
            file: Path::new("x.safetensors"),
            dtype,
            rows,
            cols,
            data,
            scales: None,
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn int4_round_half_even_and_layout() {
        // absmax 7 -> s = 1: w / s are exact halves.
        let w = [2.5f32, -2.5, 3.5, 7.0, -0.5, 0.5, 1.5, -7.0];
        let mut d = [0u8; 4];
        let mut s = [0f32; 1];
        quantize_int4_row(&w, 64, &mut d, &mut s);
        assert_eq!(s[0], 1.0);
        // q = [2, -2, 4, 7, -0, 0, 2, -7] -> nibbles [10, 6, 12, 15, 8, 8, 10, 1]
        assert_eq!(
            d,
            [10 | (6 << 4), 12 | (15 << 4), 8 | (8 << 4), 10 | (1 << 4)]
        );
    }

    #[test]
    fn fast_rounding_matches_round_ties_even() {
        let mut x = -300.0f32;
        while x < 300.0 {
            for s in [1.0f32, 0.37, 3.0, 1e-3] {
                let v = x / s;
                let want4 = v.round_ties_even().clamp(-8.0, 7.0) as i8;
                let want8 = v.round_ties_even().clamp(-128.0, 127.0) as i8;
                assert_eq!(int4_q(x, s), want4, "{x} / {s}");
                assert_eq!(int8_q(x, s), want8, "{x} / {s}");
            }
            x += 0.0625 / 3.0;
        }
        for b in 0..=255u8 {
            let (a, l) = (fp8_e4m3_to_f32(b), fp8_lut()[b as usize]);
            assert!(a.to_bits() == l.to_bits() || (a.is_nan() && l.is_nan()));
        }
    }

    #[test]
    fn clipping_at_the_code_range() {
        assert_eq!(int4_q(9.0, 1.0), 7);
        assert_eq!(int4_q(7.5, 1.0), 7); // rounds to 8 (even), clipped
        assert_eq!(int4_q(-8.4, 1.0), -8);
        assert_eq!(int4_q(-30.0, 1.0), -8);
        assert_eq!(int4_q(-7.5, 1.0), -8); // ties to even: -8
        assert_eq!(int4_q(6.5, 1.0), 6);
        assert_eq!(int8_q(200.0, 1.0), 127);
        assert_eq!(int8_q(-128.5, 1.0), -128);
        assert_eq!(int8_q(-300.0, 1.0), -128);
        assert_eq!(int8_q(126.5, 1.0), 126);
        // With absmax scaling the extreme value lands on +-7 exactly.
        let w = [-7.0f32, 7.0];
        let mut d = [0u8; 1];
        let mut s = [0f32; 1];
        quantize_int4_row(&w, 2, &mut d, &mut s);
        assert_eq!(d[0], 1 | (15 << 4));
    }

    #[test]
    fn int4_short_last_group_and_odd_cols() {
        // 5 columns, groups of 4: group 0 = 4 values, group 1 = 1 value.
        let w = [1.0f32, -2.0, 3.5, 7.0, 0.25];
        let mut d = [0u8; 3];
        let mut s = [0f32; 2];
        quantize_int4_row(&w, 4, &mut d, &mut s);
        assert_eq!(s, [1.0, 0.25 / 7.0]);
        // group 0 q = [1, -2, 4, 7]; group 1: 0.25 / (0.25/7) = 7 (f32: check it rounds to 7)
        let q4 = (0.25f32 / (0.25f32 / 7.0)).round_ties_even();
        assert_eq!(q4, 7.0);
        assert_eq!(d[0], 9 | (6 << 4));
        assert_eq!(d[1], 12 | (15 << 4));
        // odd cols: last high nibble is 8.
        assert_eq!(d[2], 15 | (8 << 4));
    }

    #[test]
    fn tiny_absmax_uses_floor() {
        let w = [0.0f32, 0.0, 1e-12, -1e-12];
        let mut d = [0u8; 2];
        let mut s = [0f32; 1];
        quantize_int4_row(&w, 64, &mut d, &mut s);
        assert_eq!(s[0], MIN_SCALE);
        assert_eq!(d, [8 | (8 << 4), 8 | (8 << 4)]);
        let mut d8 = [0u8; 4];
        let (s8, _, _) = quantize_int8_row(&w, &mut d8);
        assert_eq!(s8, MIN_SCALE);
        assert_eq!(d8, [0; 4]);
    }

    #[test]
    fn int8_round_half_even_and_clip() {
        // absmax 127 -> s = 1
        let w = [127.0f32, 2.5, -2.5, 3.5, -127.0, 0.5];
        let mut d = [0u8; 6];
        let (s, e2, _) = quantize_int8_row(&w, &mut d);
        assert_eq!(s, 1.0);
        let q: Vec<i8> = d.iter().map(|&b| b as i8).collect();
        assert_eq!(q, [127, 2, -2, 4, -127, 0]);
        assert_eq!(e2, 0.25 * 4.0);
    }

    #[test]
    fn bf16_rne_matches_half_and_ties_to_even() {
        // 1 + 2^-8 is halfway between 1.0 and 1 + 2^-7: ties to even -> 1.0
        assert_eq!(f32_to_bf16_rne(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up
        assert_eq!(f32_to_bf16_rne(1.0 + 3.0 / 256.0), 0x3F82);
        for &x in &[0.1f32, -3.3, 1e-30, 6.5e4, 123.456, -0.0, 3.4e38] {
            assert_eq!(f32_to_bf16_rne(x), half::bf16::from_f32(x).to_bits(), "{x}");
        }
    }

    #[test]
    fn encode_fp8_dequantizes_with_block_scales_and_int4() {
        // 2 x 130 fp8 matrix: two column blocks with scales 2.0 and 0.5.
        let rows = 2;
        let cols = 130;
        let data = vec![0x38u8; rows * cols]; // e4m3 0x38 = 1.0
        let sc = f32_bytes(&[2.0, 0.5]);
        let mut m = mat("w", Dtype::F8E4M3, rows, cols, &data);
        m.scales = Some(ScaleSource {
            name: "w_scale_inv",
            file: Path::new("s"),
            dtype: Dtype::F32,
            data: &sc,
        });
        let (e, st) = encode(&m, Encoding::F32).unwrap();
        let v: Vec<f32> = e
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(v[0], 2.0);
        assert_eq!(v[128], 0.5);
        assert_eq!(st.sum_err2, 0.0);
        let (e4, _) = encode(&m, Encoding::Int4 { group_size: 64 }).unwrap();
        assert_eq!(e4.scales.len(), 2 * 3);
        assert_eq!(e4.scales[0], 2.0 / 7.0);
        assert_eq!(e4.scales[2], 0.5 / 7.0);
        let (ef, _) = encode(&m, Encoding::Fp8).unwrap();
        assert_eq!(ef.data, data);
        assert_eq!(ef.scales, vec![2.0, 0.5]);
    }

    #[test]
    fn nan_and_inf_refused_with_position() {
        let mut data = vec![0x38u8; 6];
        data[4] = 0x7F;
        let sc = f32_bytes(&[1.0]);
        let mut m = mat("w", Dtype::F8E4M3, 2, 3, &data);
        m.scales = Some(ScaleSource {
            name: "w_scale_inv",
            file: Path::new("s"),
            dtype: Dtype::F32,
            data: &sc,
        });
        let e = encode(&m, Encoding::Int8).unwrap_err().to_string();
        assert!(e.contains("[1, 1]") && e.contains("0x7F"), "{e}");
        let e = encode(&m, Encoding::Fp8).unwrap_err().to_string();
        assert!(e.contains("[1, 1]"), "{e}");
        let sc = f32_bytes(&[f32::INFINITY]);
        m.scales = Some(ScaleSource {
            name: "w_scale_inv",
            file: Path::new("s"),
            dtype: Dtype::F32,
            data: &sc,
        });
        let e = encode(&m, Encoding::Int8).unwrap_err().to_string();
        assert!(e.contains("w_scale_inv") && e.contains("inf"), "{e}");
        let bf: Vec<u8> = [0x3F80u16, 0x7FC0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let m = mat("b", Dtype::Bf16, 1, 2, &bf);
        let e = encode(&m, Encoding::Bf16).unwrap_err().to_string();
        assert!(e.contains("[0, 1]") && e.contains("NaN"), "{e}");
    }

    #[test]
    fn fp8_refuses_non_fp8_source() {
        let bf: Vec<u8> = [0x3F80u16, 0x3F80]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let m = mat(
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::Bf16,
            1,
            2,
            &bf,
        );
        let e = encode(&m, Encoding::Fp8).unwrap_err().to_string();
        assert!(e.contains("q_proj") && e.contains("BF16"), "{e}");
    }

    #[test]
    fn bf16_source_kept_exactly() {
        let vals = [0x3F81u16, 0xC2F7, 0x0001, 0x8000];
        let bf: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let m = mat("b", Dtype::Bf16, 2, 2, &bf);
        let (e, st) = encode(&m, Encoding::Bf16).unwrap();
        assert_eq!(e.data, bf);
        assert_eq!(st.sum_err2, 0.0);
    }

    /// Deterministic xorshift64* generator for the SIMD-vs-scalar tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn f32(&mut self) -> f32 {
            // Mixed magnitudes: uniform in [-1, 1) times 2^[-30, 10], some exact zeros.
            let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let e = (self.next() % 41) as i32 - 30;
            if self.next().is_multiple_of(17) {
                0.0
            } else {
                u * 2f32.powi(e)
            }
        }
    }

    /// Scalar FP8 row decoding (the reference of the AVX2 twin): LUT times block scale.
    fn fp8_row_scalar(src: &[u8], srow: &[f32], out: &mut [f32]) {
        for (c, (o, &b)) in out.iter_mut().zip(src).enumerate() {
            *o = fp8_lut()[b as usize] * srow[c / FP8_BLOCK];
        }
    }

    fn same_f32(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    #[test]
    fn fp8_decode_simd_equals_scalar_all_codes_and_tails() {
        // Every non-NaN code (incl. subnormals 0x01..0x07, +-0, +-448), several scales incl.
        // ones that make products subnormal; lengths with partial 8-lanes and 128-blocks.
        let codes: Vec<u8> = (0..=255u8).filter(|b| b & 0x7F != 0x7F).collect();
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        for cols in [1usize, 7, 8, 9, 127, 128, 130, 254, 300, 2048] {
            let src: Vec<u8> = (0..cols)
                .map(|i| {
                    if i < codes.len() {
                        codes[i]
                    } else {
                        codes[(rng.next() % codes.len() as u64) as usize]
                    }
                })
                .collect();
            for s0 in [1.0f32, 0.002, 3.7e-39, 1e-30, 65504.0] {
                let srow: Vec<f32> = (0..cols.div_ceil(FP8_BLOCK))
                    .map(|k| s0 * (1.0 + k as f32 * 0.37))
                    .collect();
                let mut want = vec![0f32; cols];
                fp8_row_scalar(&src, &srow, &mut want);
                let m = SourceMatrix {
                    name: "w",
                    file: Path::new("x"),
                    dtype: Dtype::F8E4M3,
                    rows: 1,
                    cols,
                    data: &src,
                    scales: None,
                };
                let mut got = vec![0f32; cols];
                assert_eq!(m.row_f32(&srow, 0, &mut got), None);
                assert!(same_f32(&got, &want), "cols {cols} scale {s0}");
            }
        }
        // NaN codes and overflowing products are still found, at the right column.
        for (code, scale, col) in [
            (0x7Fu8, 1.0f32, 5usize),
            (0xFF, 1.0, 129),
            (0x7E, 1e38, 200),
        ] {
            let mut src = vec![0x38u8; 256];
            src[col] = code;
            let mut srow = [1.0f32, 1.0];
            srow[col / FP8_BLOCK] = scale;
            let m = SourceMatrix {
                name: "w",
                file: Path::new("x"),
                dtype: Dtype::F8E4M3,
                rows: 1,
                cols: 256,
                data: &src,
                scales: None,
            };
            let mut got = vec![0f32; 256];
            assert_eq!(m.row_f32(&srow, 0, &mut got), Some(col), "code {code:#x}");
        }
    }

    #[test]
    fn int4_simd_equals_scalar_on_random_and_edge_rows() {
        let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for len in [
            1usize, 2, 7, 8, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 768, 2048,
        ] {
            rows.push((0..len).map(|_| rng.f32()).collect());
        }
        // Ties at .5 after division: absmax 7 (s = 1) and halves; absmax 0; subnormals;
        // groups that are exact multiples of the scale.
        rows.push(
            (0..128)
                .map(|i| [7.0f32, -7.0, 2.5, -2.5, 0.5, -0.5, 3.5, 6.5, -7.5][i % 9])
                .collect(),
        );
        rows.push(vec![0.0; 96]);
        rows.push(vec![-0.0; 70]);
        rows.push(
            (0..64)
                .map(|i| f32::from_bits(1 + i as u32 * 3) * if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
        );
        rows.push((0..200).map(|i| (i as f32 - 100.0) * 1e-9).collect());
        rows.push((0..72).map(|i| (i % 15) as f32 - 7.0).collect());
        for w in &rows {
            for g in [32usize, 64, 8, 24] {
                let nb = w.len().div_ceil(2);
                let ng = w.len().div_ceil(g);
                let (mut d1, mut s1) = (vec![0xAAu8; nb], vec![0f32; ng]);
                let (mut d2, mut s2) = (vec![0x55u8; nb], vec![0f32; ng]);
                let r1 = quantize_int4_row(w, g, &mut d1, &mut s1);
                let r2 = quantize_int4_row_scalar(w, g, &mut d2, &mut s2);
                assert_eq!(d1, d2, "len {} g {g}", w.len());
                assert!(same_f32(&s1, &s2), "len {} g {g}", w.len());
                assert_eq!(r1.0.to_bits(), r2.0.to_bits(), "err2 len {} g {g}", w.len());
                assert_eq!(r1.1.to_bits(), r2.1.to_bits(), "w2 len {} g {g}", w.len());
                // And both equal the per-element definition.
                for (gi, grp) in w.chunks(g).enumerate() {
                    let absmax = grp.iter().fold(0f32, |m, &x| m.max(x.abs()));
                    let s = (absmax / 7.0).max(MIN_SCALE);
                    assert_eq!(s2[gi].to_bits(), s.to_bits());
                    for (k, &x) in grp.iter().enumerate() {
                        let c = gi * g + k;
                        let q = (x / s).round_ties_even().clamp(-8.0, 7.0) as i8;
                        let nib = (d2[c / 2] >> (4 * (c % 2))) & 0xF;
                        assert_eq!(nib as i8 - 8, q, "col {c} x {x} s {s}");
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_nan_scan_finds_every_position() {
        let mut b = vec![0x7Eu8; 67];
        assert!(!has_fp8_nan(&b));
        for i in 0..b.len() {
            for code in [0x7Fu8, 0xFF] {
                b[i] = code;
                assert!(has_fp8_nan(&b), "{i} {code:#x}");
                b[i] = 0xFE;
                assert!(!has_fp8_nan(&b));
            }
        }
        assert!(!has_fp8_nan(&[]));
    }
}
