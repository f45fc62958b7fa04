//! The I/O engine trait: reads of whole records (or of pieces of them, from one or several files)
//! into aligned buffers, several in flight at once. See `docs/IO.md`. Engines implement it, one
//! file each (`uring.rs`, `pread.rs`, `mmap.rs`); `open.rs` lists them; callers see only this
//! trait.

use super::{AlignedBuf, BufPool};
use std::any::Any;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
#[error("{path}: reading {len} bytes at offset {offset} (request {tag}): {error}")]
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
    /// In the message, not also a `source()`.
    pub error: std::io::Error,
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
    /// The engine's name, as `--io` takes it and stats print it (`uring`, `pread`, `mmap`).
    fn name(&self) -> &'static str;
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
    /// Whether the pieces of one request are read concurrently (io_uring submits them
    /// together). When false, a caller that wants pieces in flight together (a record striped
    /// over several drives) submits one request per piece.
    fn concurrent_pieces(&self) -> bool;
    /// Size of the pieces in which a record that is verified as it lands is best read, bytes
    /// (0: read whole records and hash each once it lands). Hashing piece by piece overlaps the
    /// checksum with the reads of an engine that reads one piece after the other
    /// ([`DEFAULT_VERIFY_PIECE_BYTES`] for the thread-pool engines).
    fn verify_piece_bytes(&self) -> usize;
    /// Whether a lone record (not only a batch) is read in verify pieces (mmap: its copies are
    /// CPU work that hashing can follow).
    fn verify_lone_records_in_pieces(&self) -> bool;
}

/// Default size of the pieces in which a verified record is read by engines that read pieces
/// one after the other, bytes (rounded up to the store alignment by the reader): each piece is
/// hashed while the rest of the batch is read, so that little hashing remains once the last
/// read lands.
pub const DEFAULT_VERIFY_PIECE_BYTES: usize = 1 << 20;

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

/// What an engine's constructor returns: the engine, or the error with the files handed back
/// (so that the next engine can use them), or an empty list when they are spent.
pub(crate) type OpenResult = Result<Arc<dyn IoEngine>, (Vec<EngineFile>, std::io::Error)>;

/// One I/O engine of the table.
pub(crate) struct EngineFactory {
    /// Its name (`--io NAME`, [`IoEngine::name`]).
    pub(crate) name: &'static str,
    /// Whether it reads with O_DIRECT when the files are opened so (else always through the
    /// page cache, and [`crate::IoPreference::Direct`] is refused with it).
    pub(crate) direct_io: bool,
    /// Whether [`super::IoEngineChoice::Auto`] tries it (in table order).
    pub(crate) auto: bool,
    /// Builds it over `files` (already opened, with or without O_DIRECT).
    pub(crate) open: fn(Vec<EngineFile>, &EngineConfig, Arc<BufPool>) -> OpenResult,
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
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
        }),
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
