//! # coli-format: what every coli crate agrees on
//!
//! A leaf crate (it depends on no other coli crate) that owns the shared vocabulary of the
//! data flow checkpoint -> convert -> store -> fetch -> cache -> engine -> tokens:
//!
//! - [`ExpertKey`]: the identity of a routed expert;
//! - [`encoding`]: the weight encodings, one module per encoding behind one [`Codec`] trait
//!   (id, byte sizes, the scalar decode/encode of a row that define it), dispatched by
//!   [`Encoding`]; [`MatrixView`], a checked view of an encoded matrix; [`RecordLayout`], the
//!   byte layout of an expert record;
//! - [`disk`]: the store's on-disk structures (docs/FORMAT.md), each in one module that parses
//!   and writes it, with typed checksums and store ids;
//! - [`spec`]: the model spec, the one reader of a checkpoint's config.json, one file per
//!   family, listing every tensor the model needs;
//! - [`cpu`]: the one CPU feature detection (honouring `COLI_ISA`).
//!
//! docs/ARCHITECTURE.md shows where this crate sits and how to add an encoding or a family.

#![forbid(unsafe_code)]

pub mod cpu;
pub mod disk;
pub mod encoding;
mod error;
mod key;
mod matrix;
mod record;
pub mod size;
pub mod spec;

pub use encoding::{Codec, Encoding, ErrSums};
pub use error::FormatError;
pub use key::ExpertKey;
pub use matrix::{matrix_dims, MatrixView, RowMajorCopy, INTERLEAVE_COLS, INTERLEAVE_ROWS};
pub use record::RecordLayout;
pub use size::parse_size;
pub use spec::{Family, ModelSpec};

/// `v` with every object's keys in sorted (code point) order, recursively, arrays in their
/// order: a JSON document whose bytes do not depend on the order its keys were inserted in
/// (serde_json keeps insertion order in this workspace), as Python's `sort_keys` / Kimi K3's
/// `deep_sort_dict` give it.
pub fn json_sorted_keys(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Json::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), json_sorted_keys(&m[k])))
                    .collect(),
            )
        }
        Json::Array(a) => Json::Array(a.iter().map(json_sorted_keys).collect()),
        other => other.clone(),
    }
}
