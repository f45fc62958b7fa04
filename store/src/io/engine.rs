//! The I/O engine trait: reads of whole records (or of pieces of them, from one or several files)
//! into aligned buffers, several in flight at once. See `docs/IO.md`.

use super::{AlignedBuf, BufPool};
use std::any::Any;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which I/O engine reads expert records (see `docs/IO.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoEngineKind {
    /// io_uring (Linux 5.6+): reads submitted to a ring, up to the queue depth in flight from one
    /// thread; registered files, and registered buffers where `RLIMIT_MEMLOCK` allows.
    Uring,
    /// Positional reads (`pread`) on a thread pool, one blocking read per thread in flight.
    Pread,
    /// Copies out of a read-only memory map of each file (always through the page cache).
    Mmap,
}

impl IoEngineKind {
    /// The name used on the command line and in stats: `uring`, `pread` or `mmap`.
    pub fn name(self) -> &'static str {
        match self {
            IoEngineKind::Uring => "uring",
            IoEngineKind::Pread => "pread",
            IoEngineKind::Mmap => "mmap",
        }
    }
}

impl std::fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The I/O engine asked for at open ([`crate::OpenOptions::engine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoEngineChoice {
    /// io_uring; when the kernel refuses to set one up (`EPERM`/`ENOSYS`, e.g. a container's
    /// seccomp profile, or `COLI_IO_URING=off` in the environment) the pread engine, with one
    /// note on stderr per process.
    #[default]
    Auto,
    /// io_uring or an error at open.
    Uring,
    /// The pread thread pool.
    Pread,
    /// The mmap engine (buffered only: incompatible with [`crate::IoPreference::Direct`]).
    Mmap,
}

impl std::str::FromStr for IoEngineChoice {
    type Err = String;
    /// Parses `auto`, `uring`, `pread` or `mmap`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoEngineChoice::Auto),
            "uring" | "io_uring" => Ok(IoEngineChoice::Uring),
            "pread" => Ok(IoEngineChoice::Pread),
            "mmap" => Ok(IoEngineChoice::Mmap),
            _ => Err(format!(
                "unknown I/O engine {s:?}: expected auto, uring, pread or mmap"
            )),
        }
    }
}

/// Index of a file in an engine's file table (the order of the files given at construction).
pub type FileId = u32;

/// One piece of a read: `len` bytes at `file_offset` of file `file` into bytes
/// `buf_offset..buf_offset + len` of the request's buffer. With O_DIRECT, offsets and lengths
/// must be multiples of the direct-I/O alignment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    /// File to read from.
    pub file: FileId,
    /// Byte offset in the file.
    pub file_offset: u64,
    /// Byte offset in the request's buffer.
    pub buf_offset: usize,
    /// Bytes to read.
    pub len: usize,
}

/// Observer of a read's progress: told each time a longer prefix of the buffer is final.
///
/// Engines call [`ReadProgress::advance`] only while no write into the buffer is in flight (the
/// pread and mmap engines after each piece, which they read one after the other; io_uring reads
/// the pieces of a request that has a progress observer one after the other too, and calls it
/// from the thread that waits on the queue). A checksum fed this way hashes each piece while the
/// other requests' reads keep the device busy.
pub trait ReadProgress: Any + Send {
    /// `buf` is the whole buffer; its first `valid` bytes are final (they grow monotonically).
    fn advance(&mut self, buf: &[u8], valid: usize);
    /// The observer as `Any`, to take it back by its concrete type after completion.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

/// One read: fill `buf` from `pieces`, then hand it back in a [`Completion`] carrying `tag`.
///
/// The pieces must lie inside the buffer and not overlap; they usually cover it all (a whole
/// record is one piece; a record split over several drives is several). The engine owns the
/// buffer while the read is in flight. Pieces are read in any order, concurrently where the
/// engine can, unless `progress` is set (then in order, see [`ReadProgress`]).
pub struct ReadRequest {
    /// Caller's identifier, returned in the completion (e.g. the position in a batch).
    pub tag: u64,
    /// What is read into (from [`IoEngine::buffer`] for the engine's registered buffers).
    pub buf: AlignedBuf,
    /// What is read.
    pub pieces: Vec<ReadPiece>,
    /// Told as the buffer fills, in piece order.
    pub progress: Option<Box<dyn ReadProgress>>,
}

impl ReadRequest {
    /// A request reading all of `buf` from `file` at `offset`, as `pieces` pieces of at most
    /// `piece_len` bytes each (one piece when `piece_len` is 0 or at least the buffer's length).
    pub fn whole(
        tag: u64,
        buf: AlignedBuf,
        file: FileId,
        offset: u64,
        piece_len: usize,
    ) -> ReadRequest {
        let len = buf.len();
        let step = if piece_len == 0 {
            len.max(1)
        } else {
            piece_len
        };
        let pieces = (0..len)
            .step_by(step)
            .map(|p| ReadPiece {
                file,
                file_offset: offset + p as u64,
                buf_offset: p,
                len: step.min(len - p),
            })
            .collect();
        ReadRequest {
            tag,
            buf,
            pieces,
            progress: None,
        }
    }
}

/// A read that failed, naming the file, the piece and the request.
#[derive(Debug, thiserror::Error)]
#[error("{path}: reading {len} bytes at offset {offset} (request {tag}): {source}")]
pub struct ReadError {
    /// The file.
    pub path: PathBuf,
    /// Byte offset in the file of the piece that failed (after any completed short read).
    pub offset: u64,
    /// Bytes that were still to be read from there.
    pub len: usize,
    /// The request's tag.
    pub tag: u64,
    /// The OS error; `UnexpectedEof` when the file ends before the piece does (short file).
    #[source]
    pub source: std::io::Error,
}

/// A finished read: the buffer back, and the result.
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The buffer (filled when `result` is `Ok`; unspecified bytes otherwise).
    pub buf: AlignedBuf,
    /// The request's progress observer, back.
    pub progress: Option<Box<dyn ReadProgress>>,
    /// `Ok` when every piece was read in full.
    pub result: Result<(), ReadError>,
}

/// A submission/completion queue of one caller on an engine: up to the engine's queue depth
/// requests in flight; requests submitted beyond that wait in the queue and start as earlier
/// ones complete. A queue is used by one thread at a time; dropping it waits for the reads in
/// flight (their buffers are the engine's until then).
pub trait IoQueue {
    /// Queues a read. Never blocks; problems show up in its completion.
    fn submit(&mut self, req: ReadRequest);
    /// The next completion (in completion order, not submission order), blocking until one is
    /// there; `None` when nothing submitted is outstanding.
    fn wait(&mut self) -> Option<Completion>;
    /// Requests submitted and not yet returned by [`IoQueue::wait`].
    fn outstanding(&self) -> usize;
}

/// An I/O engine over a fixed table of open files (see `docs/IO.md`).
///
/// Engines are `Send + Sync`; each thread that reads takes its own [`IoQueue`].
pub trait IoEngine: Send + Sync {
    /// Which engine this is.
    fn kind(&self) -> IoEngineKind;
    /// Requests in flight at once per queue.
    fn queue_depth(&self) -> usize;
    /// A one-line description (engine, registration, threads) for logs and stats.
    fn describe(&self) -> String;
    /// Path of a file in the table (for messages).
    fn path(&self, file: FileId) -> Option<&Path>;
    /// A buffer of `len` bytes aligned to `align` for a request on this engine: one of the
    /// engine's registered buffers when one is free (io_uring), else a pooled one.
    fn buffer(&self, len: usize, align: usize) -> AlignedBuf;
    /// A new queue for the calling thread.
    ///
    /// # Errors
    /// When the engine cannot make one (io_uring: ring setup failed, e.g. out of memory).
    fn queue(&self) -> std::io::Result<Box<dyn IoQueue + '_>>;
}

/// One file of an engine's table: its path (for messages) and the open file (opened with or
/// without O_DIRECT by the caller).
pub(crate) struct EngineFile {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
}

/// How to build an engine.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    /// Requests in flight per queue (at least 1).
    pub(crate) queue_depth: usize,
    /// Threads of the pread and mmap engines' pool (at least 1).
    pub(crate) threads: usize,
    /// Idle buffers kept for reuse.
    pub(crate) pooled_buffers: usize,
    /// Buffer alignment, bytes (for the io_uring probe read).
    pub(crate) buf_align: usize,
    /// Bytes of the io_uring probe read of file 0 (the store's alignment; 0 = no probe read).
    pub(crate) probe_len: usize,
}

/// Checks a request's pieces against its buffer and the file table; the error names the bad
/// piece.
pub(crate) fn check_pieces(req: &ReadRequest, files: usize) -> Result<(), String> {
    for (i, p) in req.pieces.iter().enumerate() {
        if p.file as usize >= files {
            return Err(format!(
                "piece {i}: file {} not in the engine's table of {files}",
                p.file
            ));
        }
        if p.buf_offset
            .checked_add(p.len)
            .is_none_or(|e| e > req.buf.len())
        {
            return Err(format!(
                "piece {i}: bytes {}..+{} outside the {}-byte buffer",
                p.buf_offset,
                p.len,
                req.buf.len()
            ));
        }
    }
    Ok(())
}

/// A completion failing `req` with `msg` (an invalid request).
pub(crate) fn invalid(req: ReadRequest, path: PathBuf, msg: String) -> Completion {
    let (offset, len) = req
        .pieces
        .first()
        .map_or((0, 0), |p| (p.file_offset, p.len));
    Completion {
        tag: req.tag,
        buf: req.buf,
        progress: req.progress,
        result: Err(ReadError {
            path,
            offset,
            len,
            tag: req.tag,
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
        }),
    }
}

/// Why io_uring is not used even when asked for automatically: `Some(reason)` when the
/// environment says `COLI_IO_URING=off` (for containers whose seccomp profile lets
/// `io_uring_setup` hang or kill, and for tests of the fallback).
fn uring_disabled_by_env() -> Option<String> {
    match std::env::var("COLI_IO_URING") {
        Ok(v) if v.eq_ignore_ascii_case("off") || v == "0" => Some("COLI_IO_URING=off".into()),
        _ => None,
    }
}

/// An engine and, when it is not the one asked for, why (the fallback note).
pub(crate) type OpenedEngine = (Arc<dyn IoEngine>, Option<String>);

/// Builds the engine asked for. With [`IoEngineChoice::Auto`], io_uring is set up and probed
/// with one read of file 0; when that fails, the pread engine is used, one note per process
/// says why (naming `context`, e.g. the store directory), and the reason is returned.
///
/// # Errors
/// When a forced engine cannot be built (io_uring refused, a file that cannot be mapped).
pub(crate) fn open_engine(
    choice: IoEngineChoice,
    files: Vec<EngineFile>,
    cfg: &EngineConfig,
    context: &Path,
) -> std::io::Result<OpenedEngine> {
    let pool = BufPool::new(cfg.pooled_buffers.max(1));
    match choice {
        IoEngineChoice::Pread => Ok((
            Arc::new(super::pread::pread_engine(files, cfg, pool)?),
            None,
        )),
        IoEngineChoice::Mmap => Ok((Arc::new(super::mmap::mmap_engine(files, cfg, pool)?), None)),
        IoEngineChoice::Uring | IoEngineChoice::Auto => {
            let uring = match uring_disabled_by_env() {
                Some(why) => Err((
                    files,
                    std::io::Error::new(std::io::ErrorKind::Unsupported, why),
                )),
                None => super::uring::UringEngine::new(files, cfg, pool.clone()),
            };
            match uring {
                Ok(e) => Ok((Arc::new(e), None)),
                Err((_, e)) if choice == IoEngineChoice::Uring => Err(std::io::Error::new(
                    e.kind(),
                    format!("io_uring requested but unavailable: {e}"),
                )),
                Err((files, e)) => {
                    let why = format!("io_uring unavailable ({e}); using the pread engine");
                    static NOTE: std::sync::Once = std::sync::Once::new();
                    NOTE.call_once(|| eprintln!("coli-store: note: {}: {why}", context.display()));
                    Ok((
                        Arc::new(super::pread::pread_engine(files, cfg, pool)?),
                        Some(why),
                    ))
                }
            }
        }
    }
}

/// The longest prefix of a buffer covered by the pieces read so far.
#[derive(Default)]
pub(crate) struct Prefix {
    /// Pieces read beyond the prefix, as (start, end) byte ranges.
    beyond: Vec<(usize, usize)>,
    prefix: usize,
}

impl Prefix {
    /// Notes that bytes `start..end` are read; returns the new prefix length when it grew.
    pub(crate) fn add(&mut self, start: usize, end: usize) -> Option<usize> {
        self.beyond.push((start, end));
        let before = self.prefix;
        loop {
            let p = self.prefix;
            let Some(i) = self.beyond.iter().position(|&(s, _)| s <= p) else {
                break;
            };
            let (_, e) = self.beyond.swap_remove(i);
            self.prefix = self.prefix.max(e);
        }
        (self.prefix > before).then_some(self.prefix)
    }
}
