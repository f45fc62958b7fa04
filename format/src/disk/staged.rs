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
//! This module writes the header and index ([`staged_head`]) and parses them back
//! ([`StagedHeader::parse`], [`parse_staged_index`]); the store's mirror code reads the bytes and
//! admits the entries against its primary's INDEX.

use super::hex::StoreId;
use super::index::IndexRecord;
use super::INDEX_RECORD_SIZE;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Why a staged segment is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagedReject {
    /// Damaged or truncated: a check that covers the bytes failed.
    Damaged(String),
    /// Intact but of another store, alignment or version, or entries that differ from the
    /// primary's INDEX.
    Mismatched(String),
}

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

impl StagedHeader {
    /// Parses and checks the first `min(alignment, actual_len)` bytes `hb` of a staged segment
    /// of `actual_len` bytes, for a store `store_id` of `alignment` with `max_count` records:
    /// magic, crc32, version, store id, alignment, length, zero padding, entry count
    /// (`1..=max_count`) and that the index fits in the file.
    ///
    /// # Errors
    /// [`StagedReject::Damaged`] / [`StagedReject::Mismatched`] with expected and found values.
    pub fn parse(
        hb: &[u8],
        actual_len: u64,
        alignment: u64,
        store_id: StoreId,
        max_count: u64,
    ) -> Result<StagedHeader, StagedReject> {
        use StagedReject::{Damaged, Mismatched};
        let a = alignment;
        if actual_len < 64 || hb.len() < 64 {
            return Err(Damaged(format!(
                "{actual_len} bytes, shorter than the 64-byte header"
            )));
        }
        let h = StagedHeader::read_from_bytes(&hb[..64]).expect("64 bytes");
        if h.magic != STAGED_MAGIC {
            return Err(Damaged(format!(
                "magic {:02x?}, expected {:02x?} (COLISTG)",
                h.magic, STAGED_MAGIC
            )));
        }
        let crc = crc32fast::hash(&hb[..60]);
        if crc != h.crc.get() {
            return Err(Damaged(format!(
                "header crc32 mismatch: stored {:08x}, computed {crc:08x}",
                h.crc.get()
            )));
        }
        if h.version.get() != STAGED_VERSION {
            return Err(Mismatched(format!(
                "staged segment version {}, this code reads {STAGED_VERSION}",
                h.version.get()
            )));
        }
        if h.store_id != store_id.0 {
            return Err(Mismatched(format!(
                "store id {} differs from the primary's {store_id}",
                StoreId(h.store_id),
            )));
        }
        if h.alignment.get() as u64 != a {
            return Err(Mismatched(format!(
                "alignment {} differs from the store's {a}",
                h.alignment.get()
            )));
        }
        if h.file_len.get() != actual_len {
            return Err(Damaged(format!(
                "{actual_len} bytes, header says {} (truncated or extended)",
                h.file_len.get()
            )));
        }
        if actual_len < a || h.reserved.get() != 0 || hb[64..].iter().any(|&b| b != 0) {
            return Err(Damaged("header reserved bytes are not zero".into()));
        }
        let count = h.count.get();
        if count == 0 || count > max_count {
            return Err(Damaged(format!(
                "{count} entries: must be 1..={max_count} (the primary's records)"
            )));
        }
        let start = data_start(count, a);
        if start > actual_len {
            return Err(Damaged(format!(
                "index of {count} entries ends past the file's {actual_len} bytes"
            )));
        }
        Ok(h)
    }
}

/// Parses and checks the index of a staged segment with header `h` (already checked by
/// [`StagedHeader::parse`]): `ib` is the file's bytes `[A, data_start)`. Checks the index
/// xxh3, the zero padding, each entry's crc32 and reserved field, the sorting, that the
/// records are contiguous from [`data_start`] and end at the file's end. Returns the entries,
/// whose offsets are offsets in this file.
///
/// # Errors
/// [`StagedReject::Damaged`] naming the entry and what is wrong.
pub fn parse_staged_index(
    h: &StagedHeader,
    ib: &[u8],
    alignment: u64,
) -> Result<Vec<IndexRecord>, StagedReject> {
    use StagedReject::Damaged;
    let count = h.count.get();
    let start = data_start(count, alignment);
    let nbytes = count as usize * INDEX_RECORD_SIZE;
    if ib.len() as u64 != start - alignment {
        return Err(Damaged(format!(
            "index region is {} bytes, the header's {count} entries need {}",
            ib.len(),
            start - alignment
        )));
    }
    let found = xxhash_rust::xxh3::xxh3_64_with_seed(&ib[..nbytes], 0);
    if found != h.index_xxh3.get() {
        return Err(Damaged(format!(
            "index xxh3 mismatch: header says {:016x}, entries give {found:016x}",
            h.index_xxh3.get()
        )));
    }
    if ib[nbytes..].iter().any(|&b| b != 0) {
        return Err(Damaged("index padding is not zero".into()));
    }
    let mut entries: Vec<IndexRecord> = Vec::with_capacity(count as usize);
    let mut pos = start;
    for (i, chunk) in ib[..nbytes].chunks_exact(INDEX_RECORD_SIZE).enumerate() {
        let r = IndexRecord::read_from_bytes(chunk).expect("64 bytes");
        let key = r.key();
        // The primary's flags, copied (section 13): biases, the interleaved order, ggml types.
        let known = super::index::RECORD_FLAG_BIASES
            | super::index::RECORD_FLAG_INTERLEAVED
            | super::index::RECORD_FLAG_GGML_TYPES;
        if r.compute_crc() != r.crc.get() || r.flags.get() & !known != 0 {
            return Err(Damaged(format!(
                "index entry {i} ({key}): crc32 or flags field wrong"
            )));
        }
        if let Some(prev) = entries.last().map(|p| p.key()) {
            if key <= prev {
                return Err(Damaged(format!(
                    "index entry {i} ({key}) not sorted after {prev}"
                )));
            }
        }
        if r.offset.get() != pos {
            return Err(Damaged(format!(
                "index entry {i} ({key}): offset {}, the contiguous layout puts it at {pos}",
                r.offset.get()
            )));
        }
        pos = pos.saturating_add(r.length.get());
        entries.push(r);
    }
    let file_len = h.file_len.get();
    if pos != file_len {
        return Err(Damaged(format!(
            "records end at {pos}, file has {file_len} bytes"
        )));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::disk::index::RecordPlace;
    use crate::{Encoding, ExpertKey};

    #[test]
    fn head_round_trips_and_damage_is_classified() {
        let a = 4096u64;
        let rec = |e: u32| {
            IndexRecord::new(RecordPlace {
                key: ExpertKey::new(1, e),
                segment: 0,
                encodings: [Encoding::Int8; 3],
                offset: 4096 * (e as u64 + 1),
                length: 8192,
                payload_len: 8000,
                hidden: 64,
                intermediate: 32,
                biases: false,
                interleaved: false,
                checksum: 42 + e as u64,
            })
        };
        let recs = [rec(0), rec(3)];
        let id = StoreId([9; 16]);
        let (head, len) = staged_head(&recs, id, a);
        assert_eq!(len, data_start(2, a) + 2 * 8192);
        let h = StagedHeader::parse(&head[..a as usize], len, a, id, 5).unwrap();
        let e = parse_staged_index(&h, &head[a as usize..], a).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[1].offset.get(), data_start(2, a) + 8192);
        assert_eq!(e[1].checksum.get(), 45);
        assert!(matches!(
            StagedHeader::parse(&head[..a as usize], len, a, StoreId([8; 16]), 5),
            Err(StagedReject::Mismatched(_))
        ));
        assert!(matches!(
            StagedHeader::parse(&head[..a as usize], len + 1, a, id, 5),
            Err(StagedReject::Damaged(_))
        ));
        let mut bad = head.clone();
        bad[a as usize + 3] ^= 1;
        assert!(matches!(
            parse_staged_index(&h, &bad[a as usize..], a),
            Err(StagedReject::Damaged(_))
        ));
    }

    #[test]
    fn layout() {
        assert_eq!(data_start(1, 4096), 8192);
        assert_eq!(data_start(64, 4096), 8192);
        assert_eq!(data_start(65, 4096), 12288);
        assert_eq!(data_start(9, 512), 512 + 1024);
    }
}
