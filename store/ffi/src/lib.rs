//! # coli-store-ffi: the C ABI of the coli block store
//!
//! Engines written in C, C++ or any language with a C FFI read a coli store (format:
//! `docs/FORMAT.md`) through this library: open a store, query its manifest, fetch expert
//! records (into library-owned aligned buffers or into a caller-provided buffer), view each
//! matrix's weights and scales, and read dense tensors by name. The header is
//! `store/ffi/include/coli_store.h`; the API with a complete example is in `docs/C_API.md`.
//!
//! Conventions of every exported function (all named `coli_*`):
//!
//! - The return value is a status code ([`COLI_OK`] = 0 or one of the `COLI_ERR_*` codes);
//!   results come back through out-pointers, which are written only on success.
//! - A failed call stores a message for [`coli_last_error_message`] (per thread).
//! - A null pointer argument gives [`COLI_ERR_NULL_ARGUMENT`], never undefined behaviour.
//! - No Rust panic crosses the boundary: each body runs under `std::panic::catch_unwind` and a
//!   panic becomes [`COLI_ERR_PANIC`].
//! - A `coli_store` handle may be used from several threads at once (the underlying
//!   [`coli_store::Store`] is `Sync`); a `coli_expert` handle is immutable after the fetch and
//!   may be read from several threads, and is released exactly once.

// The C names of the ABI types (e.g. `coli_status`) are not Rust's CamelCase on purpose.
#![allow(non_camel_case_types)]

mod error;
mod expert;
mod store;
mod views;

pub use error::*;
pub use expert::*;
pub use store::*;
pub use views::*;

/// Version of this C ABI (bumped on any incompatible change of a struct or function).
///
/// Version 2 (format version 2): `coli_matrix_view` gained `e8m0_scales` and
/// `e8m0_scale_count` (mxfp4 views), `coli_expert_info` gained `flags` and `reserved`, and
/// [`coli_expert_bias`] is new. Version 1: the first release.
pub const COLI_ABI_VERSION: u32 = 2;

/// The version of the C ABI this library implements ([`COLI_ABI_VERSION`]); a program compiled
/// against `coli_store.h` compares it with the header's `COLI_ABI_VERSION`.
#[no_mangle]
pub extern "C" fn coli_abi_version() -> u32 {
    // Nothing here can panic; the guard keeps the rule "no panic crosses the boundary" literal.
    std::panic::catch_unwind(|| COLI_ABI_VERSION).unwrap_or(0)
}

/// The newest store format version this library reads (`docs/FORMAT.md`, currently 7).
#[no_mangle]
pub extern "C" fn coli_format_version() -> u32 {
    std::panic::catch_unwind(|| coli_store::FORMAT_VERSION).unwrap_or(0)
}
