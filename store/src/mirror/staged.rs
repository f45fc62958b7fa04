//! Staged segments: a record-granular partial mirror file (docs/FORMAT.md section 13).
//!
//! A staged segment `MIRROR/staged/stg-NNNNN.bin` holds any subset of a store's expert records,
//! byte-identical to the primary's (so each record's INDEX checksum, seeded with its
//! `(layer, expert)`, verifies it wherever it is read), behind its own header and checksummed
//! index:
//!
//! ```text
//! [0, A)                      header: 64 bytes of fields, zero to A (= the store alignment)
//! [A, A + 64 n)               n index entries (INDEX record layout; offset = offset in THIS file)
//! [A + 64 n, D)               zero, D = A + round_up(64 n, A)
//! [D, file length)            the n records, contiguous, in index order ((layer, expert))
//! ```

use super::primary::PrimaryInfo;
use crate::IndexRecord;
pub use coli_format::disk::names::{parse_staged_name, staged_rel, STAGED_DIR};
pub use coli_format::disk::staged::{
    data_start, parse_staged_index, staged_head, StagedHeader, StagedReject, STAGED_MAGIC,
    STAGED_VERSION,
};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// A parsed, admitted staged segment.
#[derive(Clone, Debug)]
pub struct StagedIndex {
    /// File length, bytes.
    pub file_len: u64,
    /// Index entries, sorted by (layer, expert); `offset` is the offset in this file.
    pub entries: Vec<IndexRecord>,
    /// For each entry, the position of the same expert in the primary INDEX.
    pub primary_pos: Vec<usize>,
}

/// Reads and checks the staged segment `file` (of `actual_len` bytes) against the primary:
/// header (magic, crc32, version, zero padding, alignment, store id, length), index (xxh3, each
/// entry's crc32, reserved fields, sorting, contiguous layout) and each entry against the
/// primary's INDEX record of the same expert (segment, encoding, group size, lengths, shape,
/// checksum). Record bytes are not read (per-record checksums check them on every read;
/// `coli-fsck` reads them all).
///
/// # Errors
/// [`StagedReject::Damaged`] / [`StagedReject::Mismatched`] with what differs (expected vs
/// found).
pub fn parse_staged(
    file: &File,
    actual_len: u64,
    primary: &PrimaryInfo,
) -> Result<StagedIndex, StagedReject> {
    use StagedReject::{Damaged, Mismatched};
    let a = primary.alignment;
    if actual_len < 64 {
        return Err(Damaged(format!(
            "{actual_len} bytes, shorter than the 64-byte header"
        )));
    }
    let mut hb = vec![0u8; a.min(actual_len) as usize];
    file.read_exact_at(&mut hb, 0)
        .map_err(|e| Damaged(format!("header cannot be read: {e}")))?;
    let h = StagedHeader::parse(
        &hb,
        actual_len,
        a,
        primary.store_id,
        primary.index.len() as u64,
    )?;
    let mut ib = vec![0u8; (data_start(h.count.get(), a) - a) as usize];
    file.read_exact_at(&mut ib, a)
        .map_err(|e| Damaged(format!("index cannot be read: {e}")))?;
    let entries = parse_staged_index(&h, &ib, a)?;
    let mut primary_pos = Vec::with_capacity(entries.len());
    for (i, r) in entries.iter().enumerate() {
        let key = r.key();
        let Ok(p) = primary.index.binary_search_by_key(&key, |x| x.key()) else {
            return Err(Mismatched(format!(
                "entry {i}: {key} is not in the primary store"
            )));
        };
        let pr = &primary.index[p];
        let same = pr.segment == r.segment
            && pr.encoding == r.encoding
            && pr.group_size == r.group_size
            && pr.length == r.length
            && pr.payload_len == r.payload_len
            && pr.hidden == r.hidden
            && pr.intermediate == r.intermediate
            && pr.checksum == r.checksum;
        if !same {
            return Err(Mismatched(format!(
                "entry {i} ({key}) differs from the primary's INDEX record (checksum {:016x} vs {:016x}, length {} vs {})",
                r.checksum.get(),
                pr.checksum.get(),
                r.length.get(),
                pr.length.get()
            )));
        }
        primary_pos.push(p);
    }
    Ok(StagedIndex {
        file_len: actual_len,
        entries,
        primary_pos,
    })
}
