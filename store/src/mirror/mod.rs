//! Mirrors: read-only full or partial copies of a store's expert records on other drives.
//!
//! A mirror directory (docs/MIRRORS.md) holds segment files of two kinds:
//!
//! - `segments/seg-NNNNN.bin`: byte-identical copies of primary segment files, admitted when
//!   their header equals the primary's (store id, segment id, length, body checksum) and the
//!   file has the header's length ([`copy`] writes them);
//! - `staged/stg-NNNNN.bin`: staged segments holding any subset of the records, with their own
//!   header and checksummed index (format: docs/FORMAT.md section 13; [`staged`] writes and
//!   parses them), admitted when intact and their store id and every entry match the primary.
//!
//! [`set::admit`] builds, for every record of the primary INDEX, the list of drives that hold a
//! copy ([`set::MirrorSet`]); [`mod@assign`] maps every expert to one drive by weighted rendezvous
//! hashing and plans weighted striped reads; [`weights`] parses declared disk weights or
//! measures them with a short O_DIRECT probe, cached per store and device. Per-record checksums
//! (FORMAT.md section 3) hold for every copy, since records are byte-identical.

pub mod assign;
pub mod copy;
pub mod primary;
pub mod route;
pub mod set;
pub mod stage;
pub mod staged;
pub mod status;
pub mod weights;

pub use assign::{assign, stripe_plan, StripePiece};
pub use route::{DriveStats, MirrorStats, DEFAULT_STRIPE_THRESHOLD, MAX_FAULTS};
pub use set::{admit, MirrorFileInfo, MirrorFileKind, MirrorSet, PrimaryInfo, RecordCopy};
pub use stage::stage_records;
pub use staged::{StagedHeader, StagedIndex, STAGED_MAGIC, STAGED_VERSION};
pub use status::MirrorStatus;
pub use weights::{parse_disk_weights, DiskWeights};

use crate::StoreError;
use std::path::Path;

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

pub(crate) fn fmt_err(file: impl Into<String>, what: impl Into<String>) -> StoreError {
    StoreError::format(file, what)
}

/// fsyncs a directory (so that a rename or a new entry in it is durable).
/// `Ok` when `mirror` is a directory; else [`StoreError::Io`] (`NotFound`) naming it, for the
/// commands that write into a mirror (the directory is the user's to create).
pub(crate) fn require_mirror_dir(mirror: &Path) -> Result<(), StoreError> {
    if mirror.is_dir() {
        return Ok(());
    }
    Err(io_err(
        mirror,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "mirror directory does not exist (create it first)",
        ),
    ))
}

pub(crate) fn fsync_dir(path: &Path) -> Result<(), StoreError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err(path, e))
}

/// Bytes available to an unprivileged user on the file system holding `path` (statvfs).
pub(crate) fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is plain data; an all-zero value is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Asks the kernel to drop `file`'s cached pages (after an fsync), so that a re-read checks the
/// bytes on the device rather than the page cache. Advisory: failure is ignored.
pub(crate) fn drop_cache(file: &std::fs::File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: posix_fadvise only takes a valid descriptor (owned by `file`) and plain integers.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}
