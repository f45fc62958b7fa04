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

use super::set::PrimaryInfo;
use super::{drop_cache, fmt_err, free_bytes, fsync_dir, io_err};
use crate::format::INDEX_RECORD_SIZE;
use crate::{ExpertKey, IndexRecord, Store, StoreError};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64_with_seed;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Staged segment magic, `COLISTG\0`.
pub const STAGED_MAGIC: [u8; 8] = *b"COLISTG\0";
/// Newest staged segment version this code writes and reads.
pub const STAGED_VERSION: u32 = 1;
/// Directory of staged segments inside a mirror directory.
pub const STAGED_DIR: &str = "staged";

/// Staged segment header fields (FORMAT.md section 13); zero-padded to the alignment on disk.
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

/// Relative name of staged segment `id`: `staged/stg-NNNNN.bin`.
pub fn staged_rel(id: u32) -> String {
    format!("{STAGED_DIR}/stg-{id:05}.bin")
}

/// The id of a staged segment file name (`stg-NNNNN.bin`), `None` for any other name.
pub fn parse_staged_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("stg-")?.strip_suffix(".bin")?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Where the records of a staged segment with `count` entries start: `A + round_up(64 count, A)`.
pub fn data_start(count: u64, alignment: u64) -> u64 {
    alignment + (count * INDEX_RECORD_SIZE as u64).next_multiple_of(alignment)
}

/// Why a staged segment is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagedReject {
    /// Damaged or truncated: a check that covers the bytes failed.
    Damaged(String),
    /// Intact but of another store, alignment or version, or entries that differ from the
    /// primary's INDEX.
    Mismatched(String),
}

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
    if h.store_id != primary.store_id {
        return Err(Mismatched(format!(
            "store id {} differs from the primary's {}",
            crate::writer::hex128(&h.store_id),
            crate::writer::hex128(&primary.store_id)
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
    if count == 0 || count > primary.index.len() as u64 {
        return Err(Damaged(format!(
            "{count} entries: must be 1..={} (the primary's records)",
            primary.index.len()
        )));
    }
    let start = data_start(count, a);
    if start > actual_len {
        return Err(Damaged(format!(
            "index of {count} entries ends past the file's {actual_len} bytes"
        )));
    }
    let mut ib = vec![0u8; (start - a) as usize];
    file.read_exact_at(&mut ib, a)
        .map_err(|e| Damaged(format!("index cannot be read: {e}")))?;
    let nbytes = count as usize * INDEX_RECORD_SIZE;
    let found = xxh3_64_with_seed(&ib[..nbytes], 0);
    if found != h.index_xxh3.get() {
        return Err(Damaged(format!(
            "index xxh3 mismatch: header says {:016x}, entries give {found:016x}",
            h.index_xxh3.get()
        )));
    }
    if ib[nbytes..].iter().any(|&b| b != 0) {
        return Err(Damaged("index padding is not zero".into()));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut primary_pos = Vec::with_capacity(count as usize);
    let mut pos = start;
    for (i, chunk) in ib[..nbytes].chunks_exact(INDEX_RECORD_SIZE).enumerate() {
        let r = IndexRecord::read_from_bytes(chunk).expect("64 bytes");
        let key = r.key();
        if r.compute_crc() != r.crc.get() || r.reserved.get() != 0 {
            return Err(Damaged(format!(
                "index entry {i} ({key}): crc32 or reserved field wrong"
            )));
        }
        if let Some(prev) = entries.last().map(|p: &IndexRecord| p.key()) {
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
        pos = pos.saturating_add(r.length.get());
        entries.push(r);
        primary_pos.push(p);
    }
    if pos != actual_len {
        return Err(Damaged(format!(
            "records end at {pos}, file has {actual_len} bytes"
        )));
    }
    Ok(StagedIndex {
        file_len: actual_len,
        entries,
        primary_pos,
    })
}

/// What [`stage_records`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedWritten {
    /// The new file.
    pub path: PathBuf,
    /// Records it holds.
    pub records: usize,
    /// File length, bytes.
    pub bytes: u64,
}

/// Writes the records of `keys` (any order; duplicates are written once) from `store` into a
/// new staged segment `mirror/staged/stg-NNNNN.bin` (NNNNN one past the largest existing id).
/// Each record is fetched from the store with its checksum verified, written to
/// `stg-NNNNN.bin.tmp`, the file fsynced, its cached pages dropped and every record re-read
/// and verified against the primary's checksum, the header and index re-parsed; then the file
/// is renamed into place and the directory fsynced. Existing mirror files are never touched.
/// The write is refused before it starts when the file system would keep less than `reserve`
/// bytes free afterwards.
///
/// # Errors
/// [`StoreError::NotFound`] for a key not in the store (or no keys), [`StoreError::Io`]
/// naming the file, [`StoreError::Writer`] when space is short (with needed and free bytes),
/// [`StoreError::Checksum`] when a record read back differs, [`StoreError::Format`] when the
/// written file does not re-parse. The temporary file is removed on error.
pub fn stage_records(
    store: &Store,
    mirror: &Path,
    keys: &[ExpertKey],
    reserve: u64,
) -> Result<StagedWritten, StoreError> {
    let primary = PrimaryInfo::of(store)?;
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return Err(StoreError::NotFound("no records selected to stage".into()));
    }
    let mut recs = Vec::with_capacity(keys.len());
    for &k in &keys {
        let r = store
            .record(k)
            .ok_or_else(|| StoreError::NotFound(format!("expert {k}")))?;
        recs.push(*r);
    }
    let a = primary.alignment;
    let start = data_start(recs.len() as u64, a);
    let total = start + recs.iter().map(|r| r.length.get()).sum::<u64>();
    if !mirror.is_dir() {
        return Err(io_err(
            mirror,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "mirror directory does not exist (create it first)",
            ),
        ));
    }
    let free = free_bytes(mirror).map_err(|e| io_err(mirror, e))?;
    if free < total.saturating_add(reserve) {
        return Err(StoreError::Writer(format!(
            "{}: staging {} records needs {total} bytes plus the {reserve}-byte reserve, {free} bytes are free",
            mirror.display(),
            recs.len()
        )));
    }
    let sdir = mirror.join(STAGED_DIR);
    let created = !sdir.exists();
    std::fs::create_dir_all(&sdir).map_err(|e| io_err(&sdir, e))?;
    if created {
        fsync_dir(mirror)?;
    }
    let mut next = 0u32;
    for ent in std::fs::read_dir(&sdir).map_err(|e| io_err(&sdir, e))? {
        let ent = ent.map_err(|e| io_err(&sdir, e))?;
        if let Some(id) = ent.file_name().to_str().and_then(parse_staged_name) {
            next = next.max(id + 1);
        }
    }
    let rel = staged_rel(next);
    let path = mirror.join(&rel);
    let tmp = mirror.join(format!("{rel}.tmp"));
    let r = write_and_verify(store, &primary, &recs, &tmp, start, total);
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(&path, e)
    })?;
    fsync_dir(&sdir)?;
    Ok(StagedWritten {
        path,
        records: recs.len(),
        bytes: total,
    })
}

fn write_and_verify(
    store: &Store,
    primary: &PrimaryInfo,
    recs: &[IndexRecord],
    tmp: &Path,
    start: u64,
    total: u64,
) -> Result<(), StoreError> {
    let a = primary.alignment;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| io_err(tmp, e))?;
    // Index entries with offsets in this file.
    let mut index = Vec::with_capacity(recs.len() * INDEX_RECORD_SIZE);
    let mut pos = start;
    for r in recs {
        let mut e = *r;
        e.offset = U64::new(pos);
        e.crc = U32::new(e.compute_crc());
        index.extend_from_slice(e.as_bytes());
        pos += r.length.get();
    }
    let mut h = StagedHeader {
        magic: STAGED_MAGIC,
        version: U32::new(STAGED_VERSION),
        alignment: U32::new(a as u32),
        store_id: primary.store_id,
        file_len: U64::new(total),
        count: U64::new(recs.len() as u64),
        index_xxh3: U64::new(xxh3_64_with_seed(&index, 0)),
        reserved: U32::new(0),
        crc: U32::new(0),
    };
    h.crc = U32::new(crc32fast::hash(&h.as_bytes()[..60]));
    let mut head = vec![0u8; start as usize];
    head[..64].copy_from_slice(h.as_bytes());
    head[a as usize..a as usize + index.len()].copy_from_slice(&index);
    f.write_all_at(&head, 0).map_err(|e| io_err(tmp, e))?;
    let mut pos = start;
    for r in recs {
        let buf = store.fetch_one(r.key())?;
        f.write_all_at(buf.bytes(), pos)
            .map_err(|e| io_err(tmp, e))?;
        pos += r.length.get();
    }
    f.sync_all().map_err(|e| io_err(tmp, e))?;
    drop_cache(&f);
    drop(f);
    // Re-read from the device and verify everything before publishing.
    let f = File::open(tmp).map_err(|e| io_err(tmp, e))?;
    let len = f.metadata().map_err(|e| io_err(tmp, e))?.len();
    let si = parse_staged(&f, len, primary).map_err(|r| {
        fmt_err(
            tmp.display().to_string(),
            format!("written staged segment does not re-parse: {r:?}"),
        )
    })?;
    let mut buf = Vec::new();
    for e in &si.entries {
        buf.resize(e.length.get() as usize, 0);
        f.read_exact_at(&mut buf, e.offset.get())
            .map_err(|err| io_err(tmp, err))?;
        let found = crate::checksum::xxh3_64_with_seed(&buf, e.key().checksum_seed());
        if found != e.checksum.get() {
            return Err(StoreError::Checksum {
                what: e.key().to_string(),
                file: tmp.display().to_string(),
                offset: e.offset.get(),
                expected: e.checksum.get(),
                found,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_layout() {
        assert_eq!(staged_rel(3), "staged/stg-00003.bin");
        assert_eq!(parse_staged_name("stg-00003.bin"), Some(3));
        assert_eq!(parse_staged_name("stg-00003.bin.tmp"), None);
        assert_eq!(parse_staged_name("stg-3.bin"), None);
        assert_eq!(data_start(1, 4096), 8192);
        assert_eq!(data_start(64, 4096), 8192);
        assert_eq!(data_start(65, 4096), 12288);
        assert_eq!(data_start(9, 512), 512 + 1024);
    }
}
