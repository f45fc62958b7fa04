//! The file operations of the store writer, behind one trait ([`WriterFs`]): what a crash or
//! an I/O error can interrupt (data writes, journal appends, fsyncs, whole-file writes, the
//! publishing rename). [`OsFs`] does them; a test backend wraps it to fail or tear the N-th
//! operation in-process (as redb's fuzz backend fails the N-th write), and the writer must then
//! refuse further writes, and a resumed build must end byte-identical to an uninterrupted one.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The writer's file operations. Every method does one operation to completion or returns its
/// error; `path` names the file for messages and for backends that decide by file.
pub trait WriterFs: Send + Sync {
    /// Writes all of `buf` at byte `offset` of `file`.
    ///
    /// # Errors
    /// The OS error.
    fn write_at(&self, file: &File, path: &Path, buf: &[u8], offset: u64) -> std::io::Result<()>;
    /// Appends all of `buf` to `file` (opened for appending: the journal).
    ///
    /// # Errors
    /// The OS error.
    fn append(&self, file: &mut File, path: &Path, buf: &[u8]) -> std::io::Result<()>;
    /// Flushes `file`'s data and metadata to the device (fsync).
    ///
    /// # Errors
    /// The OS error.
    fn sync(&self, file: &File, path: &Path) -> std::io::Result<()>;
    /// Creates (or replaces) `path` with `bytes`; with `sync`, fsyncs it.
    ///
    /// # Errors
    /// The OS error.
    fn write_file(&self, path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()>;
    /// Renames `from` to `to` (atomic on one file system).
    ///
    /// # Errors
    /// The OS error.
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    /// Flushes a directory's entries to the device (so that a rename or a new file in it is
    /// durable).
    ///
    /// # Errors
    /// The OS error.
    fn sync_dir(&self, path: &Path) -> std::io::Result<()>;
}

/// The operating system's file operations.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl WriterFs for OsFs {
    fn write_at(&self, file: &File, _path: &Path, buf: &[u8], offset: u64) -> std::io::Result<()> {
        file.write_all_at(buf, offset)
    }
    fn append(&self, file: &mut File, _path: &Path, buf: &[u8]) -> std::io::Result<()> {
        file.write_all(buf)
    }
    fn sync(&self, file: &File, _path: &Path) -> std::io::Result<()> {
        file.sync_all()
    }
    fn write_file(&self, path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
        let mut f = File::create(path)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        File::open(path)?.sync_all()
    }
}
