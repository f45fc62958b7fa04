//! The io_uring engine: each queue takes a ring from the engine's pool (rings are made on demand,
//! one per concurrent caller, and kept), submits every piece of up to `queue_depth` requests at
//! once, and reaps completions on the calling thread. Short reads are resubmitted for the rest;
//! a read that returns 0 bytes before the piece's end is an `UnexpectedEof` error (short file).
//!
//! Registration: each ring registers the engine's files (fixed files) and a sparse table of
//! buffers. The engine keeps a fixed pool of `queue_depth` buffers that are never freed
//! while it lives; a request whose buffer comes from it ([`IoEngine::buffer`]) is registered in
//! the ring at its first use and read with `READ_FIXED` (no page pinning per read). When the
//! kernel refuses a registration (`RLIMIT_MEMLOCK` too small, `ENOMEM`), the engine stops
//! registering and reads into unregistered buffers; [`IoEngine::describe`] says which.

use super::engine::{
    check_pieces, invalid, Completion, EngineConfig, EngineFactory, EngineFile, FileId, IoEngine,
    IoQueue, OpenResult, Prefix, ReadError, ReadRequest,
};
use super::{AlignedBuf, BufPool};
use io_uring::{opcode, types, IoUring};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The io_uring engine's entry in the engine table (`open.rs`): first choice of
/// [`crate::IoEngineChoice::Auto`].
pub(crate) const FACTORY: EngineFactory = EngineFactory {
    name: "uring",
    direct_io: true,
    auto: true,
    open: open_uring,
};

/// Why io_uring is not used even when asked for automatically: `Some(reason)` when the
/// environment says `COLI_IO_URING=off` (for containers whose seccomp profile lets
/// `io_uring_setup` hang or kill, and for tests of the fallback).
fn disabled_by_env() -> Option<String> {
    match std::env::var("COLI_IO_URING") {
        Ok(v) if v.eq_ignore_ascii_case("off") || v == "0" => Some("COLI_IO_URING=off".into()),
        _ => None,
    }
}

fn open_uring(files: Vec<EngineFile>, cfg: &EngineConfig, bufs: Arc<BufPool>) -> OpenResult {
    if let Some(why) = disabled_by_env() {
        return Err((
            files,
            std::io::Error::new(std::io::ErrorKind::Unsupported, why),
        ));
    }
    let e = UringEngine::new(files, cfg, bufs)?;
    Ok(Arc::new(e) as Arc<dyn IoEngine>)
}

/// Largest single read submitted (the SQE length field is 32 bits), bytes.
const MAX_OP: usize = 1 << 30;

/// One ring and what is registered in it.
struct Ring {
    ring: IoUring,
    /// Submission queue entries.
    entries: usize,
    fixed_files: bool,
    /// Registered buffer slots: allocation start address -> slot index.
    slots: HashMap<usize, u16>,
    /// Slots in the sparse table (0 when buffer registration is unavailable in this ring).
    slot_cap: usize,
}

/// The io_uring engine.
struct UringEngine {
    files: Vec<File>,
    paths: Vec<PathBuf>,
    queue_depth: usize,
    rings: Mutex<Vec<Ring>>,
    bufs: Arc<BufPool>,
    /// Buffers that may be registered (never freed while the engine lives).
    fixed: Arc<BufPool>,
    fixed_count: usize,
    /// Buffers registered, summed over rings.
    registered: AtomicUsize,
    /// Why buffers are not registered, once the kernel refused.
    refused: Mutex<Option<String>>,
}

impl UringEngine {
    /// Sets up an engine and probes it with one read of `cfg.probe_len` bytes of file 0. On
    /// failure the files are handed back with the error.
    #[allow(clippy::result_large_err)]
    pub(crate) fn new(
        files: Vec<EngineFile>,
        cfg: &EngineConfig,
        bufs: Arc<BufPool>,
    ) -> Result<UringEngine, (Vec<EngineFile>, std::io::Error)> {
        let queue_depth = cfg.queue_depth.max(1);
        let fixed_count = queue_depth;
        let (paths, files): (Vec<PathBuf>, Vec<File>) =
            files.into_iter().map(|f| (f.path, f.file)).unzip();
        let engine = UringEngine {
            files,
            paths,
            queue_depth,
            rings: Mutex::new(Vec::new()),
            bufs,
            fixed: BufPool::fixed(fixed_count),
            fixed_count,
            registered: AtomicUsize::new(0),
            refused: Mutex::new(None),
        };
        match engine.probe(cfg) {
            Ok(()) => Ok(engine),
            Err(e) => {
                let UringEngine { files, paths, .. } = engine;
                let files = paths
                    .into_iter()
                    .zip(files)
                    .map(|(path, file)| EngineFile { path, file })
                    .collect();
                Err((files, e))
            }
        }
    }

    /// Makes the first ring and reads the start of file 0 through it.
    fn probe(&self, cfg: &EngineConfig) -> std::io::Result<()> {
        let ring = self.new_ring()?;
        self.rings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ring);
        if self.files.is_empty() || cfg.probe_len == 0 {
            return Ok(());
        }
        let mut q = self.queue()?;
        let buf = self.bufs.get(cfg.probe_len, cfg.buf_align);
        q.submit(ReadRequest::whole(0, buf, 0, 0, 0));
        let c = q.wait().expect("one request outstanding");
        c.result
            .map_err(|e| std::io::Error::new(e.error.kind(), format!("probe read: {e}")))
    }

    fn new_ring(&self) -> std::io::Result<Ring> {
        let entries = (self.queue_depth * 4).clamp(8, 4096).next_power_of_two();
        let ring = IoUring::builder().build(entries as u32)?;
        let fds: Vec<i32> = self.files.iter().map(|f| f.as_raw_fd()).collect();
        let fixed_files = !fds.is_empty() && ring.submitter().register_files(&fds).is_ok();
        let slot_cap = if self.refused_reason().is_none()
            && ring
                .submitter()
                .register_buffers_sparse(self.fixed_count as u32)
                .is_ok()
        {
            self.fixed_count
        } else {
            0
        };
        Ok(Ring {
            ring,
            entries,
            fixed_files,
            slots: HashMap::new(),
            slot_cap,
        })
    }

    fn refused_reason(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The registered slot of `buf` in `ring`, registering it there on first use; `None` when
    /// the buffer is not one of the engine's fixed buffers or registration is unavailable.
    fn slot_for(&self, ring: &mut Ring, buf: &AlignedBuf) -> Option<u16> {
        if !buf.is_from(&self.fixed) {
            return None;
        }
        let (start, size) = buf.allocation();
        if let Some(&s) = ring.slots.get(&(start as usize)) {
            return Some(s);
        }
        if ring.slots.len() >= ring.slot_cap || self.refused_reason().is_some() {
            return None;
        }
        let slot = ring.slots.len() as u16;
        let iov = libc::iovec {
            iov_base: start.cast(),
            iov_len: size,
        };
        // SAFETY: the allocation belongs to the engine's fixed pool, which frees none of its
        // buffers while it lives; the pool outlives every ring (rings are dropped with the
        // engine, which holds the pool), so the registered range stays valid memory for as long
        // as it is registered.
        match unsafe {
            ring.ring
                .submitter()
                .register_buffers_update(slot as u32, &[iov], None)
        } {
            Ok(()) => {
                ring.slots.insert(start as usize, slot);
                self.registered.fetch_add(1, Ordering::Relaxed);
                Some(slot)
            }
            Err(e) => {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: getrlimit writes into the valid out-pointer.
                unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                    "buffer registration refused ({e}; RLIMIT_MEMLOCK {} bytes)",
                    lim.rlim_cur
                ));
                None
            }
        }
    }
}

impl IoEngine for UringEngine {
    fn name(&self) -> &'static str {
        "uring"
    }
    /// The pieces of a request are submitted together: a striped read is one request.
    fn concurrent_pieces(&self) -> bool {
        true
    }
    /// Whole records: the ring keeps the device busy, a record is hashed once it lands.
    fn verify_piece_bytes(&self) -> usize {
        0
    }
    fn verify_lone_records_in_pieces(&self) -> bool {
        false
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
    fn describe(&self) -> String {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let fixed_files = rings.iter().any(|r| r.fixed_files);
        let regs = match self.refused_reason() {
            Some(why) => format!("unregistered buffers: {why}"),
            None => format!(
                "{} registered buffers (up to {} per ring)",
                self.registered.load(Ordering::Relaxed),
                self.fixed_count
            ),
        };
        format!(
            "uring: queue depth {}, {} ring{}, {} files, {regs}",
            self.queue_depth,
            rings.len().max(1),
            if rings.len() > 1 { "s" } else { "" },
            if fixed_files { "registered" } else { "plain" },
        )
    }
    fn path(&self, file: FileId) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }
    fn buffer(&self, len: usize, align: usize) -> AlignedBuf {
        if self.refused_reason().is_none() {
            if let Some(b) = self.fixed.try_get(len, align) {
                return b;
            }
        }
        self.bufs.get(len, align)
    }
    fn queue(&self) -> std::io::Result<Box<dyn IoQueue + '_>> {
        let ring = self.rings.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let ring = match ring {
            Some(r) => r,
            None => self.new_ring()?,
        };
        Ok(Box::new(UringQueue {
            engine: self,
            ring: Some(ring),
            active: Vec::new(),
            free: Vec::new(),
            n_active: 0,
            ops_slab: Vec::new(),
            ops_free: Vec::new(),
            ops: VecDeque::new(),
            pending: VecDeque::new(),
            ready: VecDeque::new(),
            sq_in_flight: 0,
            poisoned: false,
        }))
    }
}

/// A request being read.
struct Active {
    req: ReadRequest,
    fixed: Option<u16>,
    /// Pieces read one after the other (the request has a progress observer).
    sequential: bool,
    /// Next piece to enqueue when sequential.
    next_piece: usize,
    /// Bytes still to read per piece.
    left: Vec<usize>,
    pieces_done: usize,
    prefix: Prefix,
    in_flight: usize,
    error: Option<ReadError>,
}

/// One read submitted (a piece, the rest of a short read, or a 1 GiB part of a longer piece).
#[derive(Clone, Copy)]
struct Op {
    slot: usize,
    piece: usize,
    file: FileId,
    file_offset: u64,
    buf_offset: usize,
    len: usize,
}

/// A queue on the io_uring engine.
struct UringQueue<'e> {
    engine: &'e UringEngine,
    ring: Option<Ring>,
    active: Vec<Option<Active>>,
    free: Vec<usize>,
    n_active: usize,
    /// Ops in flight, by user_data.
    ops_slab: Vec<Option<Op>>,
    ops_free: Vec<usize>,
    /// Ops waiting for room in the submission queue.
    ops: VecDeque<Op>,
    pending: VecDeque<ReadRequest>,
    ready: VecDeque<Completion>,
    sq_in_flight: usize,
    /// Waiting on the ring failed: it is not returned to the engine's pool.
    poisoned: bool,
}

impl UringQueue<'_> {
    fn ring(&mut self) -> &mut Ring {
        self.ring
            .as_mut()
            .expect("the ring is returned only on drop")
    }

    /// Queues the ops of piece `piece` of the request in `slot`.
    fn enqueue_piece(&mut self, slot: usize, piece: usize) {
        let a = self.active[slot].as_ref().expect("active slot");
        let p = a.req.pieces[piece];
        let mut done = 0;
        while done < p.len {
            let n = (p.len - done).min(MAX_OP);
            self.ops.push_back(Op {
                slot,
                piece,
                file: p.file,
                file_offset: p.file_offset + done as u64,
                buf_offset: p.buf_offset + done,
                len: n,
            });
            done += n;
        }
    }

    /// Starts pending requests while fewer than the queue depth are active.
    fn start_pending(&mut self) {
        while self.n_active < self.engine.queue_depth {
            let Some(req) = self.pending.pop_front() else {
                break;
            };
            if let Err(msg) = check_pieces(&req, self.engine.files.len()) {
                let path = req
                    .pieces
                    .first()
                    .and_then(|p| self.engine.path(p.file))
                    .map_or_else(PathBuf::new, Path::to_path_buf);
                self.ready.push_back(invalid(req, path, msg));
                continue;
            }
            let engine = self.engine;
            let fixed = engine.slot_for(self.ring(), &req.buf);
            let sequential = req.progress.is_some();
            let n_pieces = req.pieces.len();
            let left = req.pieces.iter().map(|p| p.len).collect();
            let a = Active {
                req,
                fixed,
                sequential,
                next_piece: 0,
                left,
                pieces_done: 0,
                prefix: Prefix::default(),
                in_flight: 0,
                error: None,
            };
            let slot = match self.free.pop() {
                Some(s) => {
                    self.active[s] = Some(a);
                    s
                }
                None => {
                    self.active.push(Some(a));
                    self.active.len() - 1
                }
            };
            self.n_active += 1;
            if n_pieces == 0 {
                self.finish(slot);
            } else if sequential {
                self.active[slot].as_mut().expect("just set").next_piece = 1;
                self.enqueue_piece(slot, 0);
            } else {
                for p in 0..n_pieces {
                    self.enqueue_piece(slot, p);
                }
            }
        }
    }

    /// Pushes queued ops into the submission queue while it has room, and submits.
    fn flush(&mut self) -> std::io::Result<()> {
        let mut pushed = false;
        loop {
            if self.sq_in_flight >= self.ring().entries {
                break;
            }
            let Some(op) = self.ops.pop_front() else {
                break;
            };
            let id = match self.ops_free.pop() {
                Some(i) => {
                    self.ops_slab[i] = Some(op);
                    i
                }
                None => {
                    self.ops_slab.push(Some(op));
                    self.ops_slab.len() - 1
                }
            };
            let a = self.active[op.slot].as_mut().expect("op of an active slot");
            a.in_flight += 1;
            let fixed = a.fixed;
            // SAFETY: the buffer is owned by `self.active[op.slot]` and stays there, unmoved
            // (its heap allocation does not move when the Vec of slots grows), until this op's
            // completion is reaped; bytes buf_offset..buf_offset+len are inside it
            // (check_pieces) and no reference to them is created while the op is in flight.
            let ptr = unsafe { a.req.buf.as_mut_ptr().add(op.buf_offset) };
            let ring = self.ring.as_mut().expect("ring");
            let entry = match (ring.fixed_files, fixed) {
                (true, Some(bi)) => {
                    opcode::ReadFixed::new(types::Fixed(op.file), ptr, op.len as u32, bi)
                        .offset(op.file_offset)
                        .build()
                }
                (false, Some(bi)) => {
                    let fd = self.engine.files[op.file as usize].as_raw_fd();
                    opcode::ReadFixed::new(types::Fd(fd), ptr, op.len as u32, bi)
                        .offset(op.file_offset)
                        .build()
                }
                (true, None) => opcode::Read::new(types::Fixed(op.file), ptr, op.len as u32)
                    .offset(op.file_offset)
                    .build(),
                (false, None) => {
                    let fd = self.engine.files[op.file as usize].as_raw_fd();
                    opcode::Read::new(types::Fd(fd), ptr, op.len as u32)
                        .offset(op.file_offset)
                        .build()
                }
            }
            .user_data(id as u64);
            // SAFETY: see above for the buffer; the file descriptors are the engine's, open for
            // its lifetime, which outlives this queue. The queue has room (sq_in_flight counts
            // every entry pushed and not yet completed, and is below the ring's size).
            unsafe {
                ring.ring
                    .submission()
                    .push(&entry)
                    .expect("the submission queue has room");
            }
            self.sq_in_flight += 1;
            pushed = true;
        }
        if pushed {
            self.ring().ring.submit()?;
        }
        Ok(())
    }

    /// Handles one completion entry.
    fn complete(&mut self, user_data: u64, res: i32) {
        let id = user_data as usize;
        let op = self.ops_slab[id].take().expect("known op");
        self.ops_free.push(id);
        self.sq_in_flight -= 1;
        let path = &self.engine.paths[op.file as usize];
        let a = self.active[op.slot].as_mut().expect("op of an active slot");
        a.in_flight -= 1;
        let mut next = None;
        let fail = |a: &mut Active, source: std::io::Error| {
            a.error.get_or_insert(ReadError {
                path: path.clone(),
                offset: op.file_offset,
                len: op.len,
                tag: a.req.tag,
                error: source,
            });
        };
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            if matches!(-res, libc::EINTR | libc::EAGAIN) && a.error.is_none() {
                self.ops.push_front(op);
            } else {
                fail(a, e);
            }
        } else if res == 0 {
            fail(
                a,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file ends before the piece's end (short or truncated file)",
                ),
            );
        } else if (res as usize) < op.len {
            // Short read: read the rest.
            let n = res as usize;
            if a.error.is_none() {
                self.ops.push_front(Op {
                    file_offset: op.file_offset + n as u64,
                    buf_offset: op.buf_offset + n,
                    len: op.len - n,
                    ..op
                });
            }
            a.left[op.piece] -= n;
        } else {
            a.left[op.piece] -= op.len;
            if a.left[op.piece] == 0 {
                a.pieces_done += 1;
                let p = a.req.pieces[op.piece];
                let grew = a.prefix.add(p.buf_offset, p.buf_offset + p.len);
                if a.sequential && a.error.is_none() {
                    // Nothing of this request is in flight: its pieces are read one by one.
                    if let (Some(valid), Some(pr)) = (grew, a.req.progress.as_mut()) {
                        pr.advance(a.req.buf.as_slice(), valid);
                    }
                    if a.next_piece < a.req.pieces.len() {
                        next = Some(a.next_piece);
                        a.next_piece += 1;
                    }
                }
            }
        }
        if let Some(piece) = next {
            self.enqueue_piece(op.slot, piece);
        }
        let a = self.active[op.slot].as_ref().expect("active");
        if a.error.is_some() {
            // Drop this request's ops not yet submitted; finish once none is in flight.
            self.ops.retain(|o| o.slot != op.slot);
        }
        let a = self.active[op.slot].as_ref().expect("active");
        let queued = self.ops.iter().any(|o| o.slot == op.slot);
        if a.in_flight == 0 && !queued && (a.error.is_some() || a.pieces_done == a.left.len()) {
            self.finish(op.slot);
        }
    }

    /// Moves the request in `slot` to the ready list.
    fn finish(&mut self, slot: usize) {
        let a = self.active[slot].take().expect("active");
        self.free.push(slot);
        self.n_active -= 1;
        let result = match a.error {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.ready.push_back(Completion {
            tag: a.req.tag,
            buf: a.req.buf,
            progress: a.req.progress,
            result,
        });
    }

    /// Reaps every completion in the completion queue.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring()
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in done {
            self.complete(ud, res);
        }
    }

    /// Fails every active request with `e` once nothing of it is in flight (the ring broke).
    fn fail_all(&mut self, e: &std::io::Error) {
        self.ops.clear();
        for slot in 0..self.active.len() {
            if let Some(a) = self.active[slot].as_mut() {
                let (path, off, len) = a.req.pieces.first().map_or((PathBuf::new(), 0, 0), |p| {
                    (
                        self.engine.paths[p.file as usize].clone(),
                        p.file_offset,
                        p.len,
                    )
                });
                a.error.get_or_insert(ReadError {
                    path,
                    offset: off,
                    len,
                    tag: a.req.tag,
                    error: std::io::Error::new(e.kind(), format!("io_uring: {e}")),
                });
                if a.in_flight == 0 {
                    self.finish(slot);
                }
            }
        }
    }
}

impl UringQueue<'_> {
    /// The ring cannot be waited on: completes every active request with `e` now. Buffers that
    /// the kernel may still write into are leaked (their completions carry an empty buffer), and
    /// the ring is not reused.
    fn abandon(&mut self, e: &std::io::Error) {
        self.fail_all(e);
        for slot in 0..self.active.len() {
            if let Some(mut a) = self.active[slot].take() {
                self.free.push(slot);
                self.n_active -= 1;
                let buf = std::mem::replace(&mut a.req.buf, AlignedBuf::new(0, 4096));
                std::mem::forget(buf);
                self.ready.push_back(Completion {
                    tag: a.req.tag,
                    buf: a.req.buf,
                    progress: a.req.progress,
                    result: Err(a.error.expect("fail_all set every error")),
                });
            }
        }
        self.ops.clear();
        self.ops_slab.clear();
        self.ops_free.clear();
        self.sq_in_flight = 0;
        self.poisoned = true;
    }
}

impl IoQueue for UringQueue<'_> {
    fn submit(&mut self, req: ReadRequest) {
        self.pending.push_back(req);
        self.start_pending();
        if let Err(e) = self.flush() {
            self.fail_all(&e);
        }
    }

    fn wait(&mut self) -> Option<Completion> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Some(c);
            }
            if self.n_active == 0 && self.pending.is_empty() {
                return None;
            }
            self.start_pending();
            if let Err(e) = self.flush() {
                self.fail_all(&e);
                continue;
            }
            if !self.ready.is_empty() {
                continue;
            }
            if self.sq_in_flight == 0 {
                // Active requests with nothing in flight and nothing to submit cannot happen;
                // fail them rather than wait forever.
                self.fail_all(&std::io::Error::other("no read in flight"));
                continue;
            }
            match self.ring().ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.abandon(&e);
                    continue;
                }
            }
            self.reap();
        }
    }

    fn outstanding(&self) -> usize {
        self.ready.len() + self.pending.len() + self.n_active
    }
}

impl Drop for UringQueue<'_> {
    fn drop(&mut self) {
        self.ops.clear();
        self.pending.clear();
        while self.sq_in_flight > 0 {
            let ring = self.ring.as_mut().expect("ring");
            match ring.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // The kernel may still write into the buffers in flight: leak them and the
                    // ring rather than free memory that is being written.
                    std::mem::forget(std::mem::take(&mut self.active));
                    std::mem::forget(self.ring.take());
                    return;
                }
            }
            let n = ring.ring.completion().count();
            self.sq_in_flight -= n;
        }
        if self.poisoned {
            // Reads abandoned by `abandon` may still land in leaked buffers; closing the ring
            // is safe (the kernel holds its own references to the pages).
            return;
        }
        if let Some(ring) = self.ring.take() {
            self.engine
                .rings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ring);
        }
    }
}
