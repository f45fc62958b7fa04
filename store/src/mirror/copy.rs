//! Full, byte-identical copies of primary segment files into a mirror directory.

use super::set::{check_copy, PrimaryInfo};
use super::status::MirrorStatus;
use super::{drop_cache, free_bytes, fsync_dir, io_err, require_mirror_dir};
use crate::{Store, StoreError};
use coli_format::disk::names::{segment_path, segment_rel};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// What [`copy_segments`] did with one primary segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyOutcome {
    /// Copied and verified: (relative path, bytes).
    Copied(String, u64),
    /// An admitted copy was already there: left as is.
    Present(String),
    /// A damaged or mismatched file is in the way: left as is (mirror files are never deleted
    /// or overwritten by copy); (relative path, why).
    Blocked(String, String),
}

/// Copies every primary segment that `mirror` lacks into `mirror/segments/`, byte for byte:
/// into `seg-NNNNN.bin.tmp`, fsync, cached pages dropped, header compared with the primary's
/// and the body re-read and checked against the header's body xxh3, then renamed into place and
/// the directory fsynced. Admitted copies are kept; damaged or mismatched files are left as
/// they are and reported ([`CopyOutcome::Blocked`]). Refused before anything is written when
/// the file system would keep less than `reserve` bytes free afterwards.
///
/// # Errors
/// [`StoreError::Io`] naming the file, [`StoreError::Writer`] when space is short (needed and
/// free bytes), [`StoreError::Checksum`] when a copy reads back differently (its temporary
/// file is removed).
pub fn copy_segments(
    store: &Store,
    mirror: &Path,
    reserve: u64,
) -> Result<Vec<CopyOutcome>, StoreError> {
    let primary = PrimaryInfo::of(store)?;
    require_mirror_dir(mirror)?;
    let mut todo = Vec::new();
    let mut out = Vec::new();
    for seg in &primary.segments {
        let rel = segment_rel(seg.id);
        match check_copy(mirror, seg, &primary) {
            (MirrorStatus::Admitted, ..) => out.push(CopyOutcome::Present(rel)),
            (MirrorStatus::Missing, ..) => todo.push(*seg),
            (_, d, _) => out.push(CopyOutcome::Blocked(rel, d.unwrap_or_default())),
        }
    }
    let need: u64 = todo.iter().map(|s| s.file_len).sum();
    if need > 0 {
        let free = free_bytes(mirror).map_err(|e| io_err(mirror, e))?;
        if free < need.saturating_add(reserve) {
            return Err(StoreError::Writer(format!(
                "{}: copying {} segment files needs {need} bytes plus the {reserve}-byte reserve, {free} bytes are free",
                mirror.display(),
                todo.len()
            )));
        }
    }
    let sdir = mirror.join("segments");
    if !todo.is_empty() && !sdir.exists() {
        std::fs::create_dir_all(&sdir).map_err(|e| io_err(&sdir, e))?;
        fsync_dir(mirror)?;
    }
    for seg in todo {
        let rel = segment_rel(seg.id);
        let dst = mirror.join(&rel);
        let tmp = mirror.join(format!("{rel}.tmp"));
        let _ = std::fs::remove_file(&tmp); // a leftover of an interrupted copy
        let src = segment_path(store.dir(), seg.id);
        if let Err(e) = copy_one(&src, &tmp, seg.id, seg.body_xxh3, primary.alignment) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &dst).map_err(|e| io_err(&dst, e))?;
        fsync_dir(&sdir)?;
        out.push(CopyOutcome::Copied(rel, seg.file_len));
    }
    Ok(out)
}

fn copy_one(src: &Path, tmp: &Path, id: u32, body: u64, alignment: u64) -> Result<(), StoreError> {
    const CHUNK: u64 = 8 << 20;
    let s = File::open(src).map_err(|e| io_err(src, e))?;
    let len = s.metadata().map_err(|e| io_err(src, e))?.len();
    let d = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| io_err(tmp, e))?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(CHUNK) as usize;
        s.read_exact_at(&mut buf[..n], pos)
            .map_err(|e| io_err(src, e))?;
        d.write_all_at(&buf[..n], pos).map_err(|e| io_err(tmp, e))?;
        pos += n as u64;
    }
    d.sync_all().map_err(|e| io_err(tmp, e))?;
    drop_cache(&d);
    drop(d);
    // Re-read: the header bytes must equal the primary's, the body its checksum.
    let d = File::open(tmp).map_err(|e| io_err(tmp, e))?;
    let mut hp = vec![0u8; alignment as usize];
    let mut hm = vec![0u8; alignment as usize];
    s.read_exact_at(&mut hp, 0).map_err(|e| io_err(src, e))?;
    d.read_exact_at(&mut hm, 0).map_err(|e| io_err(tmp, e))?;
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(id as u64);
    let mut pos = alignment;
    while pos < len {
        let n = (len - pos).min(CHUNK) as usize;
        d.read_exact_at(&mut buf[..n], pos)
            .map_err(|e| io_err(tmp, e))?;
        h.update(&buf[..n]);
        pos += n as u64;
    }
    let found = h.digest();
    if hp != hm || found != body {
        return Err(StoreError::Checksum {
            what: format!("copy of {} (header equal: {})", segment_rel(id), hp == hm),
            file: tmp.display().to_string(),
            offset: alignment,
            expected: body,
            found,
        });
    }
    Ok(())
}
