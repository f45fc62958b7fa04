//! The store handle: open/close, open options, manifest queries, stats.

use crate::error::{coli_status, guard, FfiError, FfiResult, COLI_ERR_NOT_FOUND};
use coli_store::{AlignedBuf, ExpertKey, IoMode, IoPreference, OpenOptions, Store};
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `io_mode` value: O_DIRECT when the file system supports it at the store's alignment, else
/// buffered reads (with one note on stderr). The default.
pub const COLI_IO_AUTO: u32 = 0;
/// `io_mode` value: O_DIRECT reads or an error at open ([`crate::COLI_ERR_IO`]).
pub const COLI_IO_DIRECT: u32 = 1;
/// `io_mode` value: buffered reads through the page cache.
pub const COLI_IO_BUFFERED: u32 = 2;

/// Options of [`coli_store_open`] (C `coli_open_options`). Fill with [`coli_open_options_init`]
/// first, then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct coli_open_options {
    /// `sizeof(coli_open_options)` as compiled by the caller (set by the init function); must be
    /// at least this version's size.
    pub struct_size: u32,
    /// Non-zero: verify each expert record's xxh3 on every fetch and each dense tensor's at its
    /// first access (default 1).
    pub verify_checksums: u32,
    /// [`COLI_IO_AUTO`], [`COLI_IO_DIRECT`] or [`COLI_IO_BUFFERED`].
    pub io_mode: u32,
    /// Reads in flight at once in a batch fetch (default 4; 0 or 1 = sequential).
    pub fetch_threads: u32,
    /// Mirror directories (array of `mirror_count` NUL-terminated paths; docs/MIRRORS.md):
    /// full or partial read-only copies of the store on other drives, drives 1, 2, ... in this
    /// order; disk weights are measured at open and cached.
    pub mirror_dirs: *const *const c_char,
    /// Number of entries in `mirror_dirs` (0: no mirrors).
    pub mirror_count: usize,
}

/// Read counters of a store (C `coli_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct coli_stats {
    /// Expert records read since open (library-owned and caller-buffer fetches).
    pub reads: u64,
    /// Bytes read from segment files by those fetches (record lengths, padding included).
    pub bytes_read: u64,
}

/// An open store (C: the opaque `coli_store`). Shared across threads freely.
pub struct ColiStore {
    pub(crate) store: Store,
    family: CString,
    store_id: CString,
    config_json: CString,
    pub(crate) dense_names: Vec<CString>,
    pub(crate) dense_index: HashMap<String, usize>,
}

// The C API promises that one store handle serves many threads at once.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ColiStore>();
};

/// A C string made from Rust text (NUL bytes, which a store's JSON cannot produce in names,
/// become spaces).
fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl ColiStore {
    /// Alignment a caller buffer must have, bytes: the store alignment, at least 4096.
    pub(crate) fn buffer_alignment(&self) -> usize {
        (self.store.manifest().alignment as usize).max(AlignedBuf::DEFAULT_ALIGN)
    }
}

/// Borrows the store behind a handle.
///
/// # Safety
/// `p` is NULL or a live handle from [`coli_store_open`].
pub(crate) unsafe fn store_ref<'a>(p: *const ColiStore, func: &str) -> FfiResult<&'a ColiStore> {
    // SAFETY: the caller passes NULL (rejected by as_ref) or a live handle from
    // coli_store_open, which points at a valid ColiStore until coli_store_close.
    unsafe { p.as_ref() }.ok_or_else(|| FfiError::null("store", func))
}

/// Checks that an out-pointer is not NULL.
pub(crate) fn need<T>(p: *const T, name: &str, func: &str) -> FfiResult<()> {
    if p.is_null() {
        Err(FfiError::null(name, func))
    } else {
        Ok(())
    }
}

/// Writes `v` through the out-pointer `p`.
///
/// # Safety
/// `p` is NULL (rejected) or valid and aligned for a write of `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T, name: &str, func: &str) -> FfiResult<()> {
    need(p, name, func)?;
    // SAFETY: non-null checked above; the caller guarantees validity and alignment.
    unsafe { p.write(v) };
    Ok(())
}

/// Fills `*opts` with the defaults: `struct_size = sizeof(coli_open_options)`,
/// `verify_checksums = 1`, `io_mode = COLI_IO_AUTO`, `fetch_threads = 4`, no mirrors.
///
/// # Safety
/// `opts` is NULL (an error) or points at writable memory for one `coli_open_options`.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT` when `opts` is NULL.
#[no_mangle]
pub unsafe extern "C" fn coli_open_options_init(opts: *mut coli_open_options) -> coli_status {
    const F: &str = "coli_open_options_init";
    guard(F, || {
        let d = OpenOptions::default();
        let v = coli_open_options {
            struct_size: std::mem::size_of::<coli_open_options>() as u32,
            verify_checksums: d.verify_checksums as u32,
            io_mode: COLI_IO_AUTO,
            fetch_threads: d.fetch_threads as u32,
            mirror_dirs: std::ptr::null(),
            mirror_count: 0,
        };
        // SAFETY: the caller guarantees `opts` is NULL or writable.
        unsafe { put(opts, v, "opts", F) }
    })
}

/// Opens and validates the store in directory `path` (MANIFEST, INDEX, every segment header,
/// completeness, dense table; docs/FORMAT.md) and writes a new handle to `*out`. Close it with
/// [`coli_store_close`]. `opts` may be NULL for the defaults.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or a valid `coli_open_options`
/// whose `mirror_dirs` (when `mirror_count > 0`) points at that many pointers; `out` is NULL or
/// writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT` (path/out NULL), `COLI_ERR_INVALID_ARGUMENT` (struct_size too small,
/// unknown io_mode), `COLI_ERR_NULL_ARGUMENT` (a NULL mirror directory), and the store's errors
/// (a mirror directory that does not exist is `COLI_ERR_IO`):
/// `COLI_ERR_IO`, `COLI_ERR_FORMAT`, `COLI_ERR_NEWER_VERSION`, `COLI_ERR_INCOMPLETE`,
/// `COLI_ERR_CHECKSUM` (INDEX whole-file checksum).
#[no_mangle]
pub unsafe extern "C" fn coli_store_open(
    path: *const c_char,
    opts: *const coli_open_options,
    out: *mut *mut ColiStore,
) -> coli_status {
    const F: &str = "coli_store_open";
    guard(F, || {
        need(path, "path", F)?;
        need(out, "out", F)?;
        // SAFETY: `path` is non-null and the caller guarantees NUL termination.
        let path = Path::new(std::ffi::OsStr::from_bytes(
            unsafe { CStr::from_ptr(path) }.to_bytes(),
        ));
        let mut o = OpenOptions::default();
        // SAFETY: `opts` is NULL or points at a valid coli_open_options (caller contract).
        if let Some(c) = unsafe { opts.as_ref() } {
            let need_size = std::mem::size_of::<coli_open_options>();
            if (c.struct_size as usize) < need_size {
                return Err(FfiError::invalid(format!(
                    "{F}: opts.struct_size is {}, expected at least {need_size}: fill the options with coli_open_options_init first",
                    c.struct_size
                )));
            }
            if c.mirror_count != 0 {
                if c.mirror_dirs.is_null() {
                    return Err(FfiError::new(
                        crate::COLI_ERR_NULL_ARGUMENT,
                        format!(
                            "{F}: opts.mirror_dirs is NULL but mirror_count is {}",
                            c.mirror_count
                        ),
                    ));
                }
                for i in 0..c.mirror_count {
                    // SAFETY: the caller guarantees `mirror_dirs` points at `mirror_count`
                    // pointers.
                    let p = unsafe { *c.mirror_dirs.add(i) };
                    if p.is_null() {
                        return Err(FfiError::new(
                            crate::COLI_ERR_NULL_ARGUMENT,
                            format!("{F}: opts.mirror_dirs[{i}] is NULL"),
                        ));
                    }
                    // SAFETY: non-null, NUL-terminated (caller contract).
                    let b = unsafe { CStr::from_ptr(p) }.to_bytes();
                    o.mirrors
                        .push(Path::new(std::ffi::OsStr::from_bytes(b)).to_path_buf());
                }
            }
            o.verify_checksums = c.verify_checksums != 0;
            o.io = match c.io_mode {
                COLI_IO_AUTO => IoPreference::Auto,
                COLI_IO_DIRECT => IoPreference::Direct,
                COLI_IO_BUFFERED => IoPreference::Buffered,
                m => {
                    return Err(FfiError::invalid(format!(
                        "{F}: io_mode {m} is not COLI_IO_AUTO (0), COLI_IO_DIRECT (1) or COLI_IO_BUFFERED (2)"
                    )))
                }
            };
            o.fetch_threads = c.fetch_threads as usize;
        }
        let store = Store::open_with(path, &o)?;
        let m = store.manifest();
        let config_json = serde_json::to_string(store.model_config())
            .map_err(|e| FfiError::new(crate::COLI_ERR_FORMAT, format!("MANIFEST config: {e}")))?;
        let handle = ColiStore {
            family: cstring(&m.family),
            store_id: cstring(&m.store_id.to_string()),
            config_json: cstring(&config_json),
            dense_names: m.dense.iter().map(|d| cstring(&d.name)).collect(),
            dense_index: m
                .dense
                .iter()
                .enumerate()
                .map(|(i, d)| (d.name.clone(), i))
                .collect(),
            store,
        };
        // SAFETY: `out` is non-null (checked) and writable (caller contract).
        unsafe { put(out, Box::into_raw(Box::new(handle)), "out", F) }
    })
}

/// Closes a store handle and frees it. NULL is ignored. Expert handles fetched into
/// library-owned buffers stay valid after the close; dense views and strings returned by the
/// store (family, names, config) do not.
///
/// # Safety
/// `store` is NULL or a handle from [`coli_store_open`] not closed before, and no other thread
/// uses it during or after the call.
#[no_mangle]
pub unsafe extern "C" fn coli_store_close(store: *mut ColiStore) {
    if store.is_null() {
        return;
    }
    let _ = guard("coli_store_close", || {
        // SAFETY: `store` came from Box::into_raw in coli_store_open and is closed once
        // (caller contract).
        drop(unsafe { Box::from_raw(store) });
        Ok(())
    });
}

/// Writes to `*out` the store's family (`model_type` of the source config, e.g. `"mixtral"`),
/// a NUL-terminated string owned by the store (valid until [`coli_store_close`]).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_family(
    store: *const ColiStore,
    out: *mut *const c_char,
) -> coli_status {
    const F: &str = "coli_store_family";
    guard(F, || {
        // SAFETY: caller contract (see the function's Safety section).
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.family.as_ptr(), "out", F) }
    })
}

/// Writes to `*out` the store id (32 lowercase hex digits, NUL-terminated, owned by the store).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_id(
    store: *const ColiStore,
    out: *mut *const c_char,
) -> coli_status {
    const F: &str = "coli_store_id";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.store_id.as_ptr(), "out", F) }
    })
}

/// Writes to `*out` the model's `config.json` as embedded in the MANIFEST, re-serialized as
/// compact JSON (NUL-terminated UTF-8, owned by the store).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_config_json(
    store: *const ColiStore,
    out: *mut *const c_char,
) -> coli_status {
    const F: &str = "coli_store_config_json";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.config_json.as_ptr(), "out", F) }
    })
}

/// Writes to `*out` the number of decoder layers of the model (MANIFEST `num_layers`; MTP layers
/// included when present).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_num_layers(
    store: *const ColiStore,
    out: *mut u32,
) -> coli_status {
    const F: &str = "coli_store_num_layers";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.store.manifest().num_layers, "out", F) }
    })
}

/// Writes to `*out` the number of layers that hold routed experts (entries of MANIFEST
/// `expert_layers`).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_expert_layer_count(
    store: *const ColiStore,
    out: *mut usize,
) -> coli_status {
    const F: &str = "coli_store_expert_layer_count";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.store.manifest().expert_layers.len(), "out", F) }
    })
}

/// Writes the `index`-th expert layer (in MANIFEST order, ascending layer id): its decoder
/// layer id to `*layer` and its number of experts to `*num_experts` (experts `0..num_experts`).
///
/// # Safety
/// `store` is NULL or a live handle; `layer` and `num_experts` are NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_INVALID_ARGUMENT` when `index` is not below
/// [`coli_store_expert_layer_count`].
#[no_mangle]
pub unsafe extern "C" fn coli_store_expert_layer(
    store: *const ColiStore,
    index: usize,
    layer: *mut u32,
    num_experts: *mut u32,
) -> coli_status {
    const F: &str = "coli_store_expert_layer";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(layer, "layer", F)?;
        need(num_experts, "num_experts", F)?;
        let ls = &s.store.manifest().expert_layers;
        let l = ls.get(index).ok_or_else(|| {
            FfiError::invalid(format!(
                "{F}: index {index} out of range ({} expert layers)",
                ls.len()
            ))
        })?;
        // SAFETY: caller contract; both checked non-null above.
        unsafe {
            put(layer, l.layer, "layer", F)?;
            put(num_experts, l.num_experts, "num_experts", F)
        }
    })
}

/// Writes to `*num_experts` the number of routed experts of decoder layer `layer`.
///
/// # Safety
/// `store` is NULL or a live handle; `num_experts` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND` when the layer holds no routed experts.
#[no_mangle]
pub unsafe extern "C" fn coli_store_layer_num_experts(
    store: *const ColiStore,
    layer: u32,
    num_experts: *mut u32,
) -> coli_status {
    const F: &str = "coli_store_layer_num_experts";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(num_experts, "num_experts", F)?;
        let l = s
            .store
            .manifest()
            .expert_layers
            .iter()
            .find(|l| l.layer == layer)
            .ok_or_else(|| {
                FfiError::new(
                    COLI_ERR_NOT_FOUND,
                    format!("{F}: layer {layer} holds no routed experts in this store"),
                )
            })?;
        // SAFETY: caller contract.
        unsafe { put(num_experts, l.num_experts, "num_experts", F) }
    })
}

/// Writes the expert encoding of the store: its id (`COLI_ENC_*`, docs/FORMAT.md section 6) to
/// `*encoding` and its group size field (int4: columns per scale group; fp8: 128; else 0) to
/// `*group_size`.
///
/// # Safety
/// `store` is NULL or a live handle; the out-pointers are NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_expert_encoding(
    store: *const ColiStore,
    encoding: *mut u32,
    group_size: *mut u32,
) -> coli_status {
    const F: &str = "coli_store_expert_encoding";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(encoding, "encoding", F)?;
        need(group_size, "group_size", F)?;
        let e = &s.store.manifest().expert_encoding;
        // SAFETY: caller contract; both checked non-null above.
        unsafe {
            put(encoding, e.id as u32, "encoding", F)?;
            put(group_size, e.group_size as u32, "group_size", F)
        }
    })
}

/// Looks up the INDEX record of an expert.
pub(crate) fn record<'a>(
    s: &'a ColiStore,
    layer: u32,
    expert: u32,
    func: &str,
) -> FfiResult<&'a coli_store::IndexRecord> {
    s.store
        .record(ExpertKey::new(layer, expert))
        .ok_or_else(|| {
            FfiError::new(
                COLI_ERR_NOT_FOUND,
                format!("{func}: layer {layer} expert {expert} is not in this store"),
            )
        })
}

/// Writes the sizes of one expert: hidden size H to `*hidden` and intermediate size I to
/// `*intermediate` (gate and up are [I, H], down is [H, I]).
///
/// # Safety
/// `store` is NULL or a live handle; the out-pointers are NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND` for an expert not in the store.
#[no_mangle]
pub unsafe extern "C" fn coli_store_expert_dims(
    store: *const ColiStore,
    layer: u32,
    expert: u32,
    hidden: *mut u32,
    intermediate: *mut u32,
) -> coli_status {
    const F: &str = "coli_store_expert_dims";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(hidden, "hidden", F)?;
        need(intermediate, "intermediate", F)?;
        let r = record(s, layer, expert, F)?;
        // SAFETY: caller contract; both checked non-null above.
        unsafe {
            put(hidden, r.hidden.get(), "hidden", F)?;
            put(intermediate, r.intermediate.get(), "intermediate", F)
        }
    })
}

/// Writes to `*len` the on-disk length in bytes of one expert's record (payload plus zero
/// padding to the store alignment): the size a buffer given to [`crate::coli_fetch_expert_into`]
/// needs at least.
///
/// # Safety
/// `store` is NULL or a live handle; `len` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`; `COLI_ERR_NOT_FOUND`.
#[no_mangle]
pub unsafe extern "C" fn coli_expert_record_len(
    store: *const ColiStore,
    layer: u32,
    expert: u32,
    len: *mut usize,
) -> coli_status {
    const F: &str = "coli_expert_record_len";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        need(len, "len", F)?;
        let r = record(s, layer, expert, F)?;
        // SAFETY: caller contract.
        unsafe { put(len, r.length.get() as usize, "len", F) }
    })
}

/// Writes to `*out` the alignment in bytes that a buffer given to
/// [`crate::coli_fetch_expert_into`] must have: the store's record alignment (MANIFEST
/// `alignment`), at least 4096. Allocate with e.g. `aligned_alloc(alignment, round_up(len,
/// alignment))`.
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_buffer_alignment(
    store: *const ColiStore,
    out: *mut usize,
) -> coli_status {
    const F: &str = "coli_store_buffer_alignment";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        // SAFETY: caller contract.
        unsafe { put(out, s.buffer_alignment(), "out", F) }
    })
}

/// Writes to `*out` how expert records are actually read: [`COLI_IO_DIRECT`] or
/// [`COLI_IO_BUFFERED`] (what [`COLI_IO_AUTO`] resolved to at open).
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_io_mode(store: *const ColiStore, out: *mut u32) -> coli_status {
    const F: &str = "coli_store_io_mode";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        let m = match s.store.io_mode() {
            IoMode::Direct => COLI_IO_DIRECT,
            IoMode::Buffered => COLI_IO_BUFFERED,
        };
        // SAFETY: caller contract.
        unsafe { put(out, m, "out", F) }
    })
}

/// Writes the store's read counters since open to `*out`: expert records read and bytes read
/// (both fetch kinds together). Safe to call while other threads fetch.
///
/// # Safety
/// `store` is NULL or a live handle; `out` is NULL or writable.
///
/// # Errors
/// `COLI_ERR_NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn coli_store_stats(
    store: *const ColiStore,
    out: *mut coli_stats,
) -> coli_status {
    const F: &str = "coli_store_stats";
    guard(F, || {
        // SAFETY: caller contract.
        let s = unsafe { store_ref(store, F)? };
        let st = s.store.stats();
        let v = coli_stats {
            reads: st.reads,
            bytes_read: st.bytes_read,
        };
        // SAFETY: caller contract.
        unsafe { put(out, v, "out", F) }
    })
}
