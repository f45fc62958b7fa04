//! The mmap engine: each file is mapped read-only once; a read COPIES its bytes out of the map
//! into the request's aligned buffer, on the engine's thread pool (a page fault blocks only the
//! thread that takes it, so the queue depth still gives that many reads in flight), after
//! `MADV_WILLNEED` on the range at submission so the kernel starts reading ahead.
//!
//! Copying (rather than handing out views of the map) keeps every engine's result the same
//! owned [`super::AlignedBuf`] (the engine cache holds them whatever the engine), makes the
//! checksum verify the bytes the caller will use (a view would keep reading shared page-cache
//! pages), and bounds the damage of a file truncated while open to an error: before each copy
//! the file's current length is checked (`fstat`), so a short file is reported instead of
//! raising `SIGBUS`. A truncation racing with the copy itself is outside the store's contract
//! (published files are immutable, FORMAT.md section 1). Reads always go through the page cache.
//! After a copy the whole pages copied from are unmapped from the process (`MADV_DONTNEED`; they
//! stay in the page cache), so the map does not add the records read to the process's RSS.

use super::engine::{
    EngineConfig, EngineFactory, EngineFile, FileId, IoEngine, OpenResult, ReadRequest,
};
use super::pool::{PieceReader, PoolEngine};
use super::BufPool;
use std::fs::File;
use std::sync::Arc;

/// The mmap engine's entry in the engine table (`open.rs`): reads through the page cache only,
/// never chosen automatically.
pub(crate) const FACTORY: EngineFactory = EngineFactory {
    name: "mmap",
    direct_io: false,
    auto: false,
    open: open_mmap,
};

fn open_mmap(files: Vec<EngineFile>, cfg: &EngineConfig, bufs: Arc<BufPool>) -> OpenResult {
    match mmap_engine(files, cfg, bufs) {
        Ok(e) => Ok(Arc::new(e) as Arc<dyn IoEngine>),
        Err(e) => Err((Vec::new(), e)),
    }
}

/// Copies out of read-only maps of the engine's files.
pub(crate) struct MmapReader {
    files: Vec<File>,
    /// `None` for an empty file (which cannot be mapped).
    maps: Vec<Option<memmap2::Mmap>>,
}

impl PieceReader for MmapReader {
    const NAME: &'static str = "mmap";
    /// Copies out of the map are CPU work: hashing each piece as it is copied overlaps them.
    const VERIFY_LONE_RECORDS_IN_PIECES: bool = true;
    fn read_piece(&self, file: FileId, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        let f = file as usize;
        let now = self.files[f].metadata()?.len();
        let mapped = self.maps[f].as_ref().map_or(0, |m| m.len() as u64);
        let end = offset.saturating_add(dst.len() as u64);
        if end > now.min(mapped) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the file is {now} bytes ({mapped} mapped), shorter than the piece's end at byte {end} (short or truncated file)"
                ),
            ));
        }
        let map = self.maps[f].as_ref().expect("end > 0 implies a mapping");
        dst.copy_from_slice(&map[offset as usize..end as usize]);
        // Unmap the whole pages just copied from this process (they stay in the page cache):
        // mapped file pages count in the process's RSS, and the copy is what the caller keeps.
        let page = 4096usize;
        let start = (offset as usize).next_multiple_of(page);
        let stop = end as usize / page * page;
        if stop > start {
            // SAFETY: [start, stop) lies inside the read-only shared file mapping (end <= its
            // length) and is page-aligned (mappings start page-aligned); MADV_DONTNEED on a
            // shared file mapping only drops page-table entries, so any later access (another
            // thread copying an overlapping range) faults the same file bytes back in.
            unsafe {
                libc::madvise(
                    map.as_ptr().add(start) as *mut libc::c_void,
                    stop - start,
                    libc::MADV_DONTNEED,
                );
            }
        }
        Ok(())
    }

    fn prepare(&self, req: &ReadRequest) {
        for p in &req.pieces {
            if let Some(Some(m)) = self.maps.get(p.file as usize) {
                if p.file_offset.saturating_add(p.len as u64) <= m.len() as u64 {
                    // A hint; its failure only loses readahead.
                    let _ =
                        m.advise_range(memmap2::Advice::WillNeed, p.file_offset as usize, p.len);
                }
            }
        }
    }
}

/// The mmap engine over `files`.
///
/// # Errors
/// When a file cannot be mapped or the thread pool cannot be started.
fn mmap_engine(
    files: Vec<EngineFile>,
    cfg: &EngineConfig,
    bufs: Arc<BufPool>,
) -> std::io::Result<PoolEngine<MmapReader>> {
    let mut paths = Vec::new();
    let mut fs = Vec::new();
    let mut maps = Vec::new();
    for f in files {
        let len = f.file.metadata()?.len();
        let map = if len > 0 {
            // SAFETY: the store's files are immutable once published (FORMAT.md section 1) and
            // the map is read-only; every copy checks the file's current length first, so a file
            // truncated while open gives an error rather than SIGBUS (a truncation racing with a
            // copy is outside the contract, as for dense.bin's map).
            let m = unsafe { memmap2::Mmap::map(&f.file) }.map_err(|e| {
                std::io::Error::new(e.kind(), format!("{}: mmap failed: {e}", f.path.display()))
            })?;
            // A hint against readahead of neighbouring records; WILLNEED covers each read.
            let _ = m.advise(memmap2::Advice::Random);
            Some(m)
        } else {
            None
        };
        paths.push(f.path);
        fs.push(f.file);
        maps.push(map);
    }
    PoolEngine::new(MmapReader { files: fs, maps }, paths, cfg, bufs)
}
