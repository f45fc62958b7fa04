//! Staged segments (docs/FORMAT.md section 13): a record-granular partial mirror file
//! `MIRROR/staged/stg-NNNNN.bin` holding any subset of a store's expert records, byte-identical
//! to the primary's, behind its own header and checksummed index:
//!
//! ```text
//! [0, A)                      header: 64 bytes of fields, zero to A (= the store alignment)
//! [A, A + 64 n)               n index entries (INDEX record layout; offset = offset in THIS file)
//! [A + 64 n, D)               zero, D = A + round_up(64 n, A)
//! [D, file length)            the n records, contiguous, in index order ((layer, expert))
//! ```
//!
//! This module writes the header and index ([`staged_head`]) and defines the layout; the
//! store's mirror code admits a staged file against its primary.

use super::hex::StoreId;
use super::index::IndexRecord;
use super::INDEX_RECORD_SIZE;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Staged segment magic, `COLISTG\0`.
pub const STAGED_MAGIC: [u8; 8] = *b"COLISTG\0";
/// Newest staged segment version this code writes and reads.
pub const STAGED_VERSION: u32 = 1;

/// Staged segment header fields; zero-padded to the alignment on disk.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, PartialEq, Eq)]
#[repr(C)]
pub struct StagedHeader {
    /// `COLISTG\0`.
    pub magic: [u8; 8],
    /// Staged segment version (1).
    pub version: U32,
    /// The store's alignment, bytes (MANIFEST `alignment`).
    pub alignment: U32,
    /// Store id of the primary, raw 16 bytes.
    pub store_id: [u8; 16],
    /// Total file length, bytes.
    pub file_len: U64,
    /// Number of index entries (records held), at least 1.
    pub count: U64,
    /// xxh3 (seed 0) of the `64 * count` index entry bytes.
    pub index_xxh3: U64,
    /// Zero.
    pub reserved: U32,
    /// crc32 of bytes 0..60.
    pub crc: U32,
}

const _: () = assert!(std::mem::size_of::<StagedHeader>() == 64);

/// Where the records of a staged segment with `count` entries start: `A + round_up(64 count, A)`.
pub fn data_start(count: u64, alignment: u64) -> u64 {
    alignment + (count * INDEX_RECORD_SIZE as u64).next_multiple_of(alignment)
}

/// The first [`data_start`] bytes of a staged segment holding `records` (the primary's INDEX
/// records, sorted by key, each `length` bytes) for store `store_id` of alignment `alignment`:
/// header, then the entries with offsets in this file (contiguous from [`data_start`]), zero
/// padded. Returns the bytes and the whole file's length.
pub fn staged_head(records: &[IndexRecord], store_id: StoreId, alignment: u64) -> (Vec<u8>, u64) {
    let start = data_start(records.len() as u64, alignment);
    let mut index = Vec::with_capacity(records.len() * INDEX_RECORD_SIZE);
    let mut pos = start;
    for r in records {
        let mut e = *r;
        e.offset = U64::new(pos);
        e.crc = U32::new(e.compute_crc());
        index.extend_from_slice(e.as_bytes());
        pos += r.length.get();
    }
    let mut h = StagedHeader {
        magic: STAGED_MAGIC,
        version: U32::new(STAGED_VERSION),
        alignment: U32::new(alignment as u32),
        store_id: store_id.0,
        file_len: U64::new(pos),
        count: U64::new(records.len() as u64),
        index_xxh3: U64::new(xxhash_rust::xxh3::xxh3_64_with_seed(&index, 0)),
        reserved: U32::new(0),
        crc: U32::new(0),
    };
    h.crc = U32::new(crc32fast::hash(&h.as_bytes()[..60]));
    let a = alignment as usize;
    let mut head = vec![0u8; start as usize];
    head[..64].copy_from_slice(h.as_bytes());
    head[a..a + index.len()].copy_from_slice(&index);
    (head, pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(data_start(1, 4096), 8192);
        assert_eq!(data_start(64, 4096), 8192);
        assert_eq!(data_start(65, 4096), 12288);
        assert_eq!(data_start(9, 512), 512 + 1024);
    }
}
