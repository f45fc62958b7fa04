//! Writing staged segments (docs/FORMAT.md section 13): [`stage_records`] copies chosen records
//! of an open store into a new staged segment of a mirror directory, verified before it is
//! published. Reading and admitting staged segments is [`super::staged`]'s job.

use super::primary::PrimaryInfo;
use super::staged::parse_staged;
use super::{drop_cache, fmt_err, free_bytes, fsync_dir, io_err, require_mirror_dir};
use crate::{ExpertKey, IndexRecord, Store, StoreError};
use coli_format::disk::names::{parse_staged_name, staged_rel, STAGED_DIR};
use coli_format::disk::staged::{data_start, staged_head};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

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
    require_mirror_dir(mirror)?;
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
    let (head, file_len) = staged_head(recs, primary.store_id, a);
    debug_assert_eq!((head.len() as u64, file_len), (start, total));
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
