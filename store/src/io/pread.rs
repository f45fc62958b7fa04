//! The pread engine: positional reads (`pread`) on a thread pool, one blocking read per pool
//! thread in flight (`pool.rs`). Works with and without O_DIRECT on any file system.

use super::engine::{EngineConfig, EngineFactory, EngineFile, FileId, IoEngine, OpenResult};
use super::pool::{PieceReader, PoolEngine};
use super::BufPool;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// The pread engine's entry in the engine table (`open.rs`).
pub(crate) const FACTORY: EngineFactory = EngineFactory {
    name: "pread",
    direct_io: true,
    auto: true,
    open: open_pread,
};

fn open_pread(files: Vec<EngineFile>, cfg: &EngineConfig, bufs: Arc<BufPool>) -> OpenResult {
    let (paths, files): (Vec<PathBuf>, Vec<File>) =
        files.into_iter().map(|f| (f.path, f.file)).unzip();
    match PoolEngine::new(PreadReader { files }, paths, cfg, bufs) {
        Ok(e) => Ok(Arc::new(e) as Arc<dyn IoEngine>),
        Err(e) => Err((Vec::new(), e)),
    }
}

/// Positional reads on the engine's files.
pub(crate) struct PreadReader {
    files: Vec<File>,
}

/// Reads exactly `dst.len()` bytes at `offset` of `file`, retrying short reads and `EINTR`.
///
/// # Errors
/// The OS error; `UnexpectedEof` naming the byte where the file ended.
pub(crate) fn pread_exact(file: &File, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        match file.read_at(&mut dst[done..], offset + done as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file ends at byte {} of the {} to read (short or truncated file)",
                        done,
                        dst.len()
                    ),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl PieceReader for PreadReader {
    const NAME: &'static str = "pread";
    fn read_piece(&self, file: FileId, offset: u64, dst: &mut [u8]) -> std::io::Result<()> {
        pread_exact(&self.files[file as usize], offset, dst)
    }
}
