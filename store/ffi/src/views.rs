//! Matrix and dense-tensor views, and the reference dequantization of one row.

use crate::error::{coli_status, guard, FfiError, FfiResult, COLI_ERR_NOT_FOUND};
use crate::store::{need, put, store_ref, ColiStore};
use coli_store::{Encoding, MatrixView};
use std::ffi::{c_char, CStr};

/// Encoding id 1: little-endian f32 (docs/FORMAT.md section 6).
pub const COLI_ENC_F32: u32 = 1;
/// Encoding id 2: bfloat16 bit patterns.
pub const COLI_ENC_BF16: u32 = 2;
/// Encoding id 3: float8 e4m3fn with one f32 scale per 128x128 block.
pub const COLI_ENC_FP8: u32 = 3;
/// Encoding id 4: i8 with one f32 scale per row.
pub const COLI_ENC_INT8: u32 = 4;
/// Encoding id 5: symmetric int4 (two per byte, low nibble = even column), one f32 scale per
/// `group_size` columns of a row.
pub const COLI_ENC_INT4: u32 = 5;
/// Encoding id 6 (format version 2): MXFP4, e2m1 values (two per byte, low nibble = even
/// column) with one e8m0 byte scale (`2^(e - 127)`) per block of 32 columns of a row (OCP
/// Microscaling Formats v1.0); group size field 32. Its scales are in
/// [`coli_matrix_view::e8m0_scales`].
pub const COLI_ENC_MXFP4: u32 = 6;
/// Encoding id 7 (format version 4; the i-quants and GGUF's MXFP4, version 6): a llama.cpp block
/// type kept from a GGUF, the group size field holding its ggml type id (docs/FORMAT.md section
/// 6); no scale section. The matrices of
/// one expert may differ in type: read each view's `group_size`.
pub const COLI_ENC_GGML: u32 = 7;
/// Encoding id 8 (format version 5): MXFP8, one e4m3fn byte per weight with one e8m0 byte
/// scale (`2^(e - 127)`) per block of 32 columns of a row; group size field 32. Its scales are
/// in [`coli_matrix_view::e8m0_scales`], as MXFP4's.
pub const COLI_ENC_MXFP8: u32 = 8;

/// A view of one encoded matrix (C `coli_matrix_view`): weights and scales in the store's byte
/// layout (docs/FORMAT.md section 6), borrowed from an expert handle or the store.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct coli_matrix_view {
    /// Weight section: `data_len` bytes.
    pub data: *const u8,
    /// Bytes of the weight section.
    pub data_len: usize,
    /// f32 scales, `scale_count` values (NULL when `scale_count` is 0). 64-byte aligned.
    pub scales: *const f32,
    /// Number of f32 scales: fp8 ceil(rows/128)*ceil(cols/128) row-major; int8 rows; int4
    /// rows*ceil(cols/group_size); f32/bf16/mxfp4 0.
    pub scale_count: usize,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Encoding id (`COLI_ENC_*`).
    pub encoding: u32,
    /// Group size field (int4: columns per group; fp8: 128; mxfp4: 32; else 0).
    pub group_size: u32,
    /// e8m0 byte scales of an mxfp4 matrix, `e8m0_scale_count` bytes, [rows, ceil(cols/32)]
    /// row-major, 64-byte aligned (NULL for the other encodings). ABI version 2.
    pub e8m0_scales: *const u8,
    /// Number of e8m0 scales: mxfp4 rows*ceil(cols/32); 0 for the other encodings.
    pub e8m0_scale_count: usize,
}

/// A view of one dense tensor (C `coli_dense_view`), borrowed from the store's memory map of
/// `dense.bin`: valid until [`crate::coli_store_close`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct coli_dense_view {
    /// Tensor name (NUL-terminated, owned by the store).
    pub name: *const c_char,
    /// The tensor as a matrix: a 1-D `[n]` tensor as rows = 1, cols = n.
    pub matrix: coli_matrix_view,
    /// Number of dimensions, 1 or 2.
    pub ndim: u32,
    /// Zero.
    pub reserved: u32,
    /// Shape; `shape[1]` is 0 when `ndim` is 1.
    pub shape: [usize; 2],
}

/// Builds a C matrix view from the sections of one matrix: the scale section is f32 values
/// (`scales`) or, for mxfp4, e8m0 bytes (`e8m0_scales`).
pub(crate) fn matrix_view(
    enc: Encoding,
    rows: usize,
    cols: usize,
    data: &[u8],
    scale_bytes: &[u8],
) -> coli_matrix_view {
    let (f32_scales, byte_scales) = if enc.has_f32_scales() {
        (scale_bytes, &[][..])
    } else {
        (&[][..], scale_bytes)
    };
    let ptr_or_null = |b: &[u8]| {
        if b.is_empty() {
            std::ptr::null()
        } else {
            b.as_ptr()
        }
    };
    coli_matrix_view {
        data: data.as_ptr(),
        data_len: data.len(),
        scales: ptr_or_null(f32_scales).cast::<f32>(),
        scale_count: f32_scales.len() / 4,
        rows,
        cols,
        encoding: enc.id() as u32,
        group_size: enc.group_size() as u32,
        e8m0_scales: ptr_or_null(byte_scales),
        e8m0_scale_count: byte_scales.len(),
    }
}

/// Writes to `*out` the number of dense tensors in the store.
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_dense_count(store: *const ColiStore, out: *mut usize) -> coli_status {
    const F: &str = "coli_dense_count";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.dense_names.len(), "out", F) }
    })
}

/// Writes to `*out` the name of the `index`-th dense tensor (MANIFEST order), NUL-terminated and
/// owned by the store.
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_INVALID_ARGUMENT` when `index` is not below
/// [`coli_dense_count`].
#[no_mangle]
pub unsafe extern "C" fn coli_dense_name(
    store: *const ColiStore,
    index: usize,
    out: *mut *const c_char,
) -> coli_status {
    const F: &str = "coli_dense_name";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        let n = s.dense_names.get(index).ok_or_else(|| {
            FfiError::invalid(format!(
                "{F}: index {index} out of range ({} dense tensors)",
                s.dense_names.len()
            ))
        })?;
        // SAFETY: caller contract.
        unsafe { put(out, n.as_ptr(), "out", F) }
    })
}

/// Writes a view of the dense tensor `name` (e.g. `"model.norm.weight"`) to `*out`. The
/// tensor's xxh3 is verified at its first access when the store was opened with
/// `verify_checksums`. The view is row-major: a matrix stored interleaved (format version 7)
/// is viewed through a row-major copy the store keeps, made at the first access.
///
/// # Safety
/// `store` is NULL or a live handle; `name` is NULL or NUL-terminated; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND` for an unknown name; `COLI_ERR_CHECKSUM`.
#[no_mangle]
pub unsafe extern "C" fn coli_dense_get(
    store: *const ColiStore,
    name: *const c_char,
    out: *mut coli_dense_view,
) -> coli_status {
    const F: &str = "coli_dense_get";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(name, "name", F)?;
        need(out, "out", F)?;
        // SAFETY: non-null; the caller guarantees NUL termination.
        let name = unsafe { CStr::from_ptr(name) };
        let not_found = || {
            FfiError::new(
                COLI_ERR_NOT_FOUND,
                format!(
                    "{F}: no dense tensor {:?} in this store",
                    name.to_string_lossy()
                ),
            )
        };
        let name = name.to_str().map_err(|_| not_found())?;
        let &i = s.dense_index.get(name).ok_or_else(not_found)?;
        let t = s.store.dense(name)?;
        // Row-major, as every view this library gives (format version 7 stores some matrices
        // interleaved).
        let m = s.store.dense_ordered(name, false, MatrixView::interleave)?;
        let scale_bytes = m.scale_section();
        let (ndim, shape) = match *t.shape {
            [n] => (1, [n, 0]),
            [r, c] => (2, [r, c]),
            _ => {
                return Err(FfiError::new(
                    crate::COLI_ERR_FORMAT,
                    format!("{F}: dense tensor {name} has shape {:?}", t.shape),
                ))
            }
        };
        let v = coli_dense_view {
            name: s.dense_names[i].as_ptr(),
            matrix: matrix_view(m.encoding(), m.rows(), m.cols(), m.data(), scale_bytes),
            ndim,
            reserved: 0,
            shape,
        };
        // SAFETY: caller contract; non-null checked.
        unsafe { put(out, v, "out", F) }
    })
}

/// Rebuilds a borrowed [`MatrixView`] from a C view after checking its consistency.
///
/// # Safety
/// The view's pointers are valid for the lengths it states (a view returned by this library
/// whose handle or store is still alive).
unsafe fn rust_view<'a>(v: &coli_matrix_view, func: &str) -> FfiResult<MatrixView<'a>> {
    let enc = u16::try_from(v.encoding)
        .ok()
        .zip(u16::try_from(v.group_size).ok())
        .and_then(|(e, g)| Encoding::from_id(e, g).ok())
        .filter(|e| e.group_size() as u32 == v.group_size)
        .ok_or_else(|| {
            FfiError::invalid(format!(
                "{func}: view has encoding {} with group size {}, which is no valid encoding",
                v.encoding, v.group_size
            ))
        })?;
    // The scale count each field must hold: f32 scales, or e8m0 bytes for mxfp4.
    let (want_f32, want_e8m0) = if enc.has_f32_scales() {
        (enc.scale_count(v.rows, v.cols), 0)
    } else {
        (0, enc.scale_count(v.rows, v.cols))
    };
    let fits = v
        .rows
        .checked_mul(v.cols)
        .and_then(|n| n.checked_mul(4))
        .is_some();
    if !fits
        || enc.weight_bytes(v.rows, v.cols) != v.data_len
        || v.scale_count != want_f32
        || v.e8m0_scale_count != want_e8m0
    {
        return Err(FfiError::invalid(format!(
            "{func}: view of [{}, {}] {} has {} weight bytes, {} f32 scales and {} e8m0 scales, \
             which do not match the encoding",
            v.rows,
            v.cols,
            enc.name(),
            v.data_len,
            v.scale_count,
            v.e8m0_scale_count
        )));
    }
    need(v.data, "view->data", func)?;
    if v.scale_count > 0 {
        need(v.scales, "view->scales", func)?;
        if !v.scales.is_aligned() {
            return Err(FfiError::invalid(format!(
                "{func}: view->scales is not 4-byte aligned"
            )));
        }
    }
    if v.e8m0_scale_count > 0 {
        need(v.e8m0_scales, "view->e8m0_scales", func)?;
    }
    // SAFETY: non-null checked; the caller guarantees `data_len` readable bytes.
    let data = unsafe { std::slice::from_raw_parts(v.data, v.data_len) };
    let scale_section: &[u8] = if v.scale_count > 0 {
        // SAFETY: non-null and aligned (checked); the caller guarantees `scale_count` readable
        // f32 values, i.e. 4 * scale_count bytes.
        unsafe { std::slice::from_raw_parts(v.scales.cast::<u8>(), v.scale_count * 4) }
    } else if v.e8m0_scale_count > 0 {
        // SAFETY: non-null (checked); the caller guarantees `e8m0_scale_count` readable bytes.
        unsafe { std::slice::from_raw_parts(v.e8m0_scales, v.e8m0_scale_count) }
    } else {
        &[]
    };
    MatrixView::from_sections(enc, v.rows, v.cols, data, scale_section)
        .map_err(|e| FfiError::invalid(format!("{func}: {e}")))
}

/// Dequantizes row `row` of a matrix view to f32 into `out` (`out_len` must equal the view's
/// `cols`), exactly as docs/FORMAT.md section 6 defines each encoding (the store's reference
/// dequantization; engines may use their own kernels instead).
///
/// # Safety
/// `view` is NULL or a view returned by this library whose expert handle / store is still
/// alive; `out` is NULL or valid for writes of `out_len` floats.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_INVALID_ARGUMENT` when `row >= rows`, `out_len != cols`
/// or the view is inconsistent.
#[no_mangle]
pub unsafe extern "C" fn coli_dequantize_row(
    view: *const coli_matrix_view,
    row: usize,
    out: *mut f32,
    out_len: usize,
) -> coli_status {
    const F: &str = "coli_dequantize_row";
    guard(F, || {
        // SAFETY: NULL rejected; otherwise the caller passes a valid view.
        let v = unsafe { view.as_ref() }.ok_or_else(|| FfiError::null("view", F))?;
        need(out, "out", F)?;
        // SAFETY: caller contract (the view's handle is alive).
        let m = unsafe { rust_view(v, F)? };
        if row >= m.rows() {
            return Err(FfiError::invalid(format!(
                "{F}: row {row} out of range ({} rows)",
                m.rows()
            )));
        }
        if out_len != m.cols() {
            return Err(FfiError::invalid(format!(
                "{F}: out_len {out_len}, the row has {} columns",
                m.cols()
            )));
        }
        if !out.is_aligned() {
            return Err(FfiError::invalid(format!("{F}: out is not 4-byte aligned")));
        }
        // SAFETY: non-null and aligned (checked); the caller guarantees `out_len` writable
        // floats not aliased by the view.
        let o = unsafe { std::slice::from_raw_parts_mut(out, out_len) };
        m.dequantize_row(row, o);
        Ok(())
    })
}
