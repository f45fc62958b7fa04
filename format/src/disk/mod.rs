//! The store's on-disk structures (docs/FORMAT.md), each in one module that both parses and
//! writes it: [`manifest`] (MANIFEST, section 2), [`index`] (INDEX, section 3), [`segment`]
//! (segment headers, section 4), [`staged`] (staged mirror segments, section 13) and [`names`]
//! (every file name). Checksums and the store id are typed values ([`Xxh3Sum`], [`StoreId`]):
//! parsed once from their hex form, compared as integers.
//!
//! All integers on disk are little-endian. Parsers check every field they read and name the
//! file and field in their errors ([`crate::FormatError`]); reading files is the store's job.

pub mod hex;
pub mod index;
pub mod manifest;
pub mod names;
pub mod segment;
pub mod staged;

pub use hex::{StoreId, Xxh3Sum};

/// Newest format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// MANIFEST magic.
pub const MANIFEST_MAGIC: [u8; 8] = *b"COLIMAN\0";
/// INDEX magic.
pub const INDEX_MAGIC: [u8; 8] = *b"COLIIDX\0";
/// Segment file magic.
pub const SEGMENT_MAGIC: [u8; 8] = *b"COLISEG\0";
/// Size of one INDEX record and of the INDEX header, bytes.
pub const INDEX_RECORD_SIZE: usize = 64;
/// Bytes of a segment header that carry fields (the rest of the first `alignment` bytes is zero).
pub const SEGMENT_HEADER_FIELDS: usize = 64;
