//! Expert handles: fetches into library-owned or caller-provided buffers, record info and
//! per-matrix views.

use crate::error::{coli_status, guard, FfiError, FfiResult, COLI_ERR_BUFFER};
use crate::store::{need, put, record, store_ref, ColiStore};
use crate::views::{coli_matrix_view, matrix_view};
use coli_store::{Encoding, ExpertBuf, ExpertKey, RecordLayout, StoreError};

/// `which` value of [`coli_expert_matrix`]: the gate projection, [I, H].
pub const COLI_MATRIX_GATE: u32 = 0;
/// `which` value: the up projection, [I, H].
pub const COLI_MATRIX_UP: u32 = 1;
/// `which` value: the down projection, [H, I].
pub const COLI_MATRIX_DOWN: u32 = 2;

/// Bit of [`coli_expert_info::flags`]: the record carries an f32 bias per matrix (format
/// version 2, docs/FORMAT.md section 5; read them with [`coli_expert_bias`]).
pub const COLI_RECORD_FLAG_BIASES: u32 = 1;

/// Identity of one routed expert (C `coli_expert_key`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct coli_expert_key {
    /// Decoder layer index.
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

/// Description of a fetched expert (C `coli_expert_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct coli_expert_info {
    /// Decoder layer index.
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
    /// Encoding id (`COLI_ENC_*`).
    pub encoding: u32,
    /// Group size field (int4: columns per scale group; fp8: 128; else 0).
    pub group_size: u32,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    /// The record bytes (docs/FORMAT.md section 5), `record_len` bytes, with its matrices
    /// row-major: a record stored interleaved (format version 7) was reordered after its
    /// checksum was verified, so these bytes no longer hash to the INDEX checksum.
    pub record: *const u8,
    /// Record length, bytes (a multiple of the store alignment).
    pub record_len: usize,
    /// Bytes of the record before its zero padding.
    pub payload_len: usize,
    /// `COLI_RECORD_FLAG_*` bits of the record (ABI version 2).
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

// One per fetched expert handle: the size difference is not worth a Box.
#[allow(clippy::large_enum_variant)]
enum Mem {
    /// A record read into a library-owned aligned buffer.
    Owned(ExpertBuf),
    /// A record read into the caller's buffer (which the caller keeps alive and unmodified
    /// while the handle lives).
    Borrowed { ptr: *const u8, len: usize },
}

/// A fetched expert (C: the opaque `coli_expert`). Immutable after the fetch.
pub struct ColiExpert {
    key: ExpertKey,
    encoding: Encoding,
    /// Gate, up, down (a ggml record's may differ: format version 4).
    encodings: [Encoding; 3],
    hidden: usize,
    intermediate: usize,
    layout: RecordLayout,
    mem: Mem,
}

impl ColiExpert {
    /// The handle of a fetched record, its matrices in the row-major order (a record stored
    /// interleaved, format version 7, is reordered here, after its checksum was verified).
    fn from_buf(mut b: ExpertBuf) -> ColiExpert {
        b.deinterleave(|_| false);
        ColiExpert {
            key: b.key,
            encoding: b.encoding,
            encodings: b.encodings,
            hidden: b.hidden,
            intermediate: b.intermediate,
            layout: *b.layout(),
            mem: Mem::Owned(b),
        }
    }

    /// The record bytes.
    fn bytes(&self) -> &[u8] {
        match &self.mem {
            Mem::Owned(b) => b.bytes(),
            // SAFETY: `ptr` is the caller's buffer of at least `len` bytes into which the record
            // was read; the caller keeps it alive and unmodified until coli_expert_release
            // (documented contract of coli_fetch_expert_into).
            Mem::Borrowed { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

/// Borrows the expert behind a handle.
///
/// # Safety
/// `p` is NULL or a live handle from a fetch function.
unsafe fn expert_ref<'a>(p: *const ColiExpert, func: &str) -> FfiResult<&'a ColiExpert> {
    // SAFETY: NULL is rejected; otherwise the caller passes a live handle (Box::into_raw of a
    // ColiExpert not yet released).
    unsafe { p.as_ref() }.ok_or_else(|| FfiError::null("expert", func))
}

/// Reads one expert into a new library-owned buffer aligned to the store's buffer alignment,
/// verifying its xxh3 (when the store was opened with `verify_checksums`), and writes a new
/// handle to `*out`. Release it with [`coli_expert_release`]; it stays valid after the store is
/// closed.
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND`; `COLI_ERR_IO`; `COLI_ERR_CHECKSUM` (the
/// message names the expert, segment file and offset).
#[no_mangle]
pub unsafe extern "C" fn coli_fetch_expert(
    store: *const ColiStore,
    layer: u32,
    expert: u32,
    out: *mut *mut ColiExpert,
) -> coli_status {
    const F: &str = "coli_fetch_expert";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(out, "out", F)?;
        let b = s.store.fetch_one(ExpertKey::new(layer, expert))?;
        let h = Box::into_raw(Box::new(ColiExpert::from_buf(b)));
        // SAFETY: caller contract; non-null checked.
        unsafe { put(out, h, "out", F) }
    })
}

/// Reads `count` experts (up to the store's `fetch_threads` reads in flight) and writes one new
/// handle per key to `out[0..count]`, in the order of `keys`. All or nothing: on an error no
/// handle is returned and `out` is left unchanged. `keys` and `out` may be NULL when `count` is 0.
///
/// # Safety
/// `store` is NULL or a live handle; `keys` is NULL or points at `count` keys; `out` is NULL or
/// points at `count` writable pointers.
///
/// # Errors
/// As [`coli_fetch_expert`], for the first failing key.
#[no_mangle]
pub unsafe extern "C" fn coli_fetch_experts(
    store: *const ColiStore,
    keys: *const coli_expert_key,
    count: usize,
    out: *mut *mut ColiExpert,
) -> coli_status {
    const F: &str = "coli_fetch_experts";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        if count == 0 {
            return Ok(());
        }
        need(keys, "keys", F)?;
        need(out, "out", F)?;
        // SAFETY: non-null checked; the caller guarantees `count` readable keys.
        let keys = unsafe { std::slice::from_raw_parts(keys, count) };
        let ks: Vec<ExpertKey> = keys
            .iter()
            .map(|k| ExpertKey::new(k.layer, k.expert))
            .collect();
        let bufs = s.store.fetch(&ks)?;
        if bufs.len() != count {
            return Err(FfiError::new(
                crate::COLI_ERR_PANIC,
                format!(
                    "{F}: the store returned {} experts for {count} keys",
                    bufs.len()
                ),
            ));
        }
        // SAFETY: non-null checked; the caller guarantees `count` writable pointers. Nothing
        // can fail after this point, so the all-or-nothing promise holds.
        let outs = unsafe { std::slice::from_raw_parts_mut(out, count) };
        for (o, b) in outs.iter_mut().zip(bufs) {
            *o = Box::into_raw(Box::new(ColiExpert::from_buf(b)));
        }
        Ok(())
    })
}

/// Reads one expert into the caller's buffer `buf` (`buf_len` bytes) and writes to `*out` a
/// handle that views it. `buf` must be aligned to [`crate::coli_store_buffer_alignment`] and at
/// least [`crate::coli_expert_record_len`] bytes long. The record's xxh3 is verified when the
/// store was opened with `verify_checksums`. The handle borrows `buf`: keep the buffer alive and
/// unmodified until [`coli_expert_release`], then reuse it for the next fetch.
///
/// # Safety
/// `store` is NULL or a live handle; `buf` is NULL or valid for writes of `buf_len` bytes;
/// `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND`; `COLI_ERR_BUFFER` (too small or misaligned;
/// the message gives both sizes/alignments); `COLI_ERR_IO`; `COLI_ERR_CHECKSUM` (the buffer
/// then holds the bad bytes and no handle is returned).
#[no_mangle]
pub unsafe extern "C" fn coli_fetch_expert_into(
    store: *const ColiStore,
    layer: u32,
    expert: u32,
    buf: *mut u8,
    buf_len: usize,
    out: *mut *mut ColiExpert,
) -> coli_status {
    const F: &str = "coli_fetch_expert_into";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(buf, "buf", F)?;
        need(out, "out", F)?;
        let key = ExpertKey::new(layer, expert);
        let r = record(s, layer, expert, F)?;
        let len = r.length.get() as usize;
        let align = s.buffer_alignment();
        if buf_len < len {
            return Err(FfiError::new(
                COLI_ERR_BUFFER,
                format!("{F}: buffer of {buf_len} bytes is smaller than the {len}-byte record of {key} (see coli_expert_record_len)"),
            ));
        }
        if !(buf as usize).is_multiple_of(align) {
            return Err(FfiError::new(
                COLI_ERR_BUFFER,
                format!("{F}: buffer address {buf:p} is not aligned to {align} bytes (see coli_store_buffer_alignment)"),
            ));
        }
        // SAFETY: `buf` is non-null, valid for `buf_len >= len` bytes (caller contract) and not
        // aliased by any Rust reference during this call.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        // The store's one read path: its I/O engine and mirrors, its checksum and counters.
        s.store.fetch_into(key, dst)?;
        let encoding =
            Encoding::from_id(r.encoding.get(), r.group_size.get()).map_err(StoreError::from)?;
        let encodings = r
            .encodings()
            .map_err(|e| StoreError::from(coli_store::FormatError::format("INDEX", e)))?;
        let (hidden, intermediate) = (r.hidden.get() as usize, r.intermediate.get() as usize);
        // The matrices row-major, as every handle gives them (format version 7 stores some
        // interleaved): reordered in the caller's buffer after the checksum was verified.
        let layout = r.layout();
        for ((m, stored), (rows, cols)) in r
            .interleaved_sections()
            .into_iter()
            .enumerate()
            .zip(r.matrix_dims())
        {
            if stored {
                let (w_off, wb, s_off, sb) = layout.sections[m];
                let (w, sc) = dst.split_at_mut(s_off);
                coli_store::MatrixView::deinterleave(
                    encodings[m],
                    rows,
                    cols,
                    &mut w[w_off..w_off + wb],
                    &mut sc[..sb],
                );
            }
        }
        let h = ColiExpert {
            key,
            encoding,
            encodings,
            hidden,
            intermediate,
            layout,
            mem: Mem::Borrowed { ptr: buf, len },
        };
        // SAFETY: caller contract; non-null checked.
        unsafe { put(out, Box::into_raw(Box::new(h)), "out", F) }
    })
}

/// Releases an expert handle (frees a library-owned buffer; a caller buffer is the caller's to
/// free afterwards). NULL is ignored.
///
/// # Safety
/// `expert` is NULL or a handle from a fetch function, released only once and not used after.
#[no_mangle]
pub unsafe extern "C" fn coli_expert_release(expert: *mut ColiExpert) {
    if expert.is_null() {
        return;
    }
    let _ = guard("coli_expert_release", || {
        // SAFETY: the handle came from Box::into_raw in a fetch function and is released once
        // (caller contract).
        drop(unsafe { Box::from_raw(expert) });
        Ok(())
    });
}

/// Writes the description of a fetched expert to `*out` (ids, encoding, sizes, raw record
/// pointer valid while the handle lives).
///
/// # Safety
/// `expert` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_expert_get_info(
    expert: *const ColiExpert,
    out: *mut coli_expert_info,
) -> coli_status {
    const F: &str = "coli_expert_get_info";
    guard(F, || {
        // SAFETY: caller contract.
        let e = unsafe { expert_ref(expert, F)? };
        let bytes = e.bytes();
        let v = coli_expert_info {
            layer: e.key.layer,
            expert: e.key.expert,
            encoding: e.encoding.id() as u32,
            group_size: e.encoding.group_size() as u32,
            hidden: e.hidden,
            intermediate: e.intermediate,
            record: bytes.as_ptr(),
            record_len: bytes.len(),
            payload_len: e.layout.payload_len,
            flags: if e.layout.has_biases() {
                COLI_RECORD_FLAG_BIASES
            } else {
                0
            },
            reserved: 0,
        };
        // SAFETY: caller contract.
        unsafe { put(out, v, "out", F) }
    })
}

/// Parses a `which` argument: [`COLI_MATRIX_GATE`], [`COLI_MATRIX_UP`] or [`COLI_MATRIX_DOWN`].
fn matrix_index(which: u32, func: &str) -> FfiResult<usize> {
    match which {
        COLI_MATRIX_GATE | COLI_MATRIX_UP | COLI_MATRIX_DOWN => Ok(which as usize),
        w => Err(FfiError::invalid(format!(
            "{func}: which = {w}, expected COLI_MATRIX_GATE (0), COLI_MATRIX_UP (1) or COLI_MATRIX_DOWN (2)"
        ))),
    }
}

/// Writes a view of one matrix of a fetched expert to `*out`: `which` is
/// [`COLI_MATRIX_GATE`] ([I, H]), [`COLI_MATRIX_UP`] ([I, H]) or [`COLI_MATRIX_DOWN`] ([H, I]).
/// The pointers stay valid while the handle lives.
///
/// # Safety
/// `expert` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_INVALID_ARGUMENT` for another `which`.
#[no_mangle]
pub unsafe extern "C" fn coli_expert_matrix(
    expert: *const ColiExpert,
    which: u32,
    out: *mut coli_matrix_view,
) -> coli_status {
    const F: &str = "coli_expert_matrix";
    guard(F, || {
        // SAFETY: caller contract.
        let e = unsafe { expert_ref(expert, F)? };
        need(out, "out", F)?;
        let i = matrix_index(which, F)?;
        let (w_off, wb, s_off, sb) = e.layout.sections[i];
        let (rows, cols) = if i == 2 {
            (e.hidden, e.intermediate)
        } else {
            (e.intermediate, e.hidden)
        };
        let bytes = e.bytes();
        let v = matrix_view(
            e.encodings[i],
            rows,
            cols,
            &bytes[w_off..w_off + wb],
            &bytes[s_off..s_off + sb],
        );
        // SAFETY: caller contract; non-null checked.
        unsafe { put(out, v, "out", F) }
    })
}

/// Writes the bias of one matrix of a fetched expert: `*out` points to `*out_len` f32 values
/// (`[I]` for [`COLI_MATRIX_GATE`] and [`COLI_MATRIX_UP`], `[H]` for [`COLI_MATRIX_DOWN`]),
/// 64-byte aligned, valid while the handle lives. A record without biases
/// ([`COLI_RECORD_FLAG_BIASES`] clear; every format-version-1 record) gives `*out = NULL` and
/// `*out_len = 0`: the matrix adds no bias. ABI version 2.
///
/// # Safety
/// `expert` is NULL or a live handle; `out` and `out_len` are NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_INVALID_ARGUMENT` for another `which`.
#[no_mangle]
pub unsafe extern "C" fn coli_expert_bias(
    expert: *const ColiExpert,
    which: u32,
    out: *mut *const f32,
    out_len: *mut usize,
) -> coli_status {
    const F: &str = "coli_expert_bias";
    guard(F, || {
        // SAFETY: caller contract.
        let e = unsafe { expert_ref(expert, F)? };
        need(out, "out", F)?;
        need(out_len, "out_len", F)?;
        let i = matrix_index(which, F)?;
        let (off, len) = e.layout.biases[i];
        let ptr = if len == 0 {
            std::ptr::null()
        } else {
            // The section is inside the record (RecordLayout, checked at open) and starts at a
            // 64-byte section boundary of a buffer aligned to the store alignment.
            e.bytes()[off..off + len].as_ptr().cast::<f32>()
        };
        // SAFETY: caller contract; non-null checked.
        unsafe {
            put(out, ptr, "out", F)?;
            put(out_len, len / 4, "out_len", F)
        }
    })
}
