//! The machinery of the thread-pool engines (`pread.rs`, `mmap.rs`): requests run on a rayon
//! pool, one blocking piece read per thread in flight, each request's pieces in order (so a
//! progress observer sees the buffer fill), up to the queue depth per queue.

use super::engine::{
    check_pieces, invalid, Completion, EngineConfig, FileId, IoEngine, IoQueue, Prefix, ReadError,
    ReadRequest, DEFAULT_VERIFY_PIECE_BYTES,
};
use super::{AlignedBuf, BufPool};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

/// How a thread-pool engine reads one piece: what a thread-pool engine file (`pread.rs`,
/// `mmap.rs`) implements.
pub(crate) trait PieceReader: Send + Sync + 'static {
    /// The engine's name ([`IoEngine::name`]).
    const NAME: &'static str;
    /// Whether a lone verified record is read in pieces too ([`IoEngine::verify_lone_records_in_pieces`]).
    const VERIFY_LONE_RECORDS_IN_PIECES: bool = false;
    /// Reads exactly `dst.len()` bytes at `offset` of file `file` into `dst`.
    ///
    /// # Errors
    /// The OS error; `UnexpectedEof` when the file ends first.
    fn read_piece(&self, file: FileId, offset: u64, dst: &mut [u8]) -> std::io::Result<()>;
    /// Called on the submitting thread when a request is queued (mmap: start readahead).
    fn prepare(&self, _req: &ReadRequest) {}
}

/// A thread-pool engine over a [`PieceReader`].
pub(crate) struct PoolEngine<R: PieceReader> {
    reader: Arc<R>,
    paths: Arc<Vec<PathBuf>>,
    queue_depth: usize,
    threads: usize,
    /// `None` when reads run on the waiting thread (one thread, or queue depth 1).
    pool: Option<rayon::ThreadPool>,
    bufs: Arc<BufPool>,
}

impl<R: PieceReader> PoolEngine<R> {
    pub(crate) fn new(
        reader: R,
        paths: Vec<PathBuf>,
        cfg: &EngineConfig,
        bufs: Arc<BufPool>,
    ) -> std::io::Result<PoolEngine<R>> {
        let queue_depth = cfg.queue_depth.max(1);
        let threads = cfg.threads.max(1).min(queue_depth);
        let pool = if threads > 1 {
            let name = R::NAME;
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("coli-{name}-{i}"))
                    .build()
                    .map_err(|e| std::io::Error::other(e.to_string()))?,
            )
        } else {
            None
        };
        Ok(PoolEngine {
            reader: Arc::new(reader),
            paths: Arc::new(paths),
            queue_depth,
            threads,
            pool,
            bufs,
        })
    }
}

/// Reads the pieces of `req` in order with `reader`, telling its progress observer after each.
fn run_request<R: PieceReader>(reader: &R, paths: &[PathBuf], req: ReadRequest) -> Completion {
    let ReadRequest {
        tag,
        mut buf,
        pieces,
        mut progress,
    } = req;
    let mut prefix = Prefix::default();
    let mut result = Ok(());
    for p in &pieces {
        let dst = &mut buf.as_mut_slice()[p.buf_offset..p.buf_offset + p.len];
        if let Err(source) = reader.read_piece(p.file, p.file_offset, dst) {
            result = Err(ReadError {
                path: paths[p.file as usize].clone(),
                offset: p.file_offset,
                len: p.len,
                tag,
                error: source,
            });
            break;
        }
        if let (Some(valid), Some(pr)) = (
            prefix.add(p.buf_offset, p.buf_offset + p.len),
            progress.as_mut(),
        ) {
            pr.advance(buf.as_slice(), valid);
        }
    }
    Completion {
        tag,
        buf,
        progress,
        result,
    }
}

impl<R: PieceReader> IoEngine for PoolEngine<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }
    fn concurrent_pieces(&self) -> bool {
        false
    }
    fn verify_piece_bytes(&self) -> usize {
        DEFAULT_VERIFY_PIECE_BYTES
    }
    fn verify_lone_records_in_pieces(&self) -> bool {
        R::VERIFY_LONE_RECORDS_IN_PIECES
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
    fn describe(&self) -> String {
        format!(
            "{}: queue depth {}, {} thread{}",
            R::NAME,
            self.queue_depth,
            self.threads,
            if self.threads == 1 {
                " (reads on the calling thread)"
            } else {
                "s"
            }
        )
    }
    fn path(&self, file: FileId) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }
    fn buffer(&self, len: usize, align: usize) -> AlignedBuf {
        self.bufs.get(len, align)
    }
    fn queue(&self) -> std::io::Result<Box<dyn IoQueue + '_>> {
        let (tx, rx) = mpsc::channel();
        Ok(Box::new(PoolQueue {
            engine: self,
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            in_flight: 0,
            tx,
            rx,
        }))
    }
}

/// A queue on a [`PoolEngine`].
struct PoolQueue<'e, R: PieceReader> {
    engine: &'e PoolEngine<R>,
    pending: VecDeque<ReadRequest>,
    ready: VecDeque<Completion>,
    in_flight: usize,
    tx: mpsc::Sender<Completion>,
    rx: mpsc::Receiver<Completion>,
}

impl<R: PieceReader> PoolQueue<'_, R> {
    /// Starts pending requests on the pool while fewer than the queue depth are in flight.
    fn pump(&mut self) {
        let Some(pool) = &self.engine.pool else {
            return;
        };
        while self.in_flight < self.engine.queue_depth {
            let Some(req) = self.pending.pop_front() else {
                break;
            };
            let (reader, paths, tx) = (
                self.engine.reader.clone(),
                self.engine.paths.clone(),
                self.tx.clone(),
            );
            pool.spawn(move || {
                // The receiver is gone only when the queue was dropped; the buffer then just
                // returns to its pool.
                let _ = tx.send(run_request(&*reader, &paths, req));
            });
            self.in_flight += 1;
        }
    }
}

impl<R: PieceReader> IoQueue for PoolQueue<'_, R> {
    fn submit(&mut self, req: ReadRequest) {
        match check_pieces(&req, self.engine.paths.len()) {
            Ok(()) => {
                self.engine.reader.prepare(&req);
                self.pending.push_back(req);
                self.pump();
            }
            Err(msg) => {
                let path = req
                    .pieces
                    .first()
                    .and_then(|p| self.engine.path(p.file))
                    .map_or_else(PathBuf::new, Path::to_path_buf);
                self.ready.push_back(invalid(req, path, msg));
            }
        }
    }

    fn wait(&mut self) -> Option<Completion> {
        if let Some(c) = self.ready.pop_front() {
            return Some(c);
        }
        if self.engine.pool.is_none() {
            let req = self.pending.pop_front()?;
            return Some(run_request(&*self.engine.reader, &self.engine.paths, req));
        }
        self.pump();
        if self.in_flight == 0 {
            return None;
        }
        let c = self
            .rx
            .recv()
            .expect("the queue holds a sender, so the channel stays open");
        self.in_flight -= 1;
        self.pump();
        Some(c)
    }

    fn outstanding(&self) -> usize {
        self.ready.len() + self.pending.len() + self.in_flight
    }
}
