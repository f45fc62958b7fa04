//! TEST-ONLY throttling I/O engine: stands in for drives of given bandwidths over real files in
//! directories of one machine (issue 7, "Tests and measurements"). It wraps the store's real
//! engine (pread, io_uring) through [`coli_store::OpenOptions::engine_wrapper`] and never lives
//! in the product path; `store/tests/mirror_throttle.rs` and `store/examples/mirror_bench.rs`
//! include it.
//!
//! Each drive (a directory: the store, or a mirror) has a token bucket of `rate` bytes/s and
//! `burst` bytes. A request's bytes are taken from the buckets of the drives its pieces read
//! when it is submitted (a bucket may go into debt, which is how later requests queue behind
//! earlier ones, FIFO per drive as on a device); the request is read by the real engine at
//! once, and its completion is handed back only once every drive it read from has earned the
//! tokens for its bytes. So each drive delivers at most `rate` bytes/s (plus `burst` once after
//! idling), whatever the real device does, as long as the real device is faster.

#![allow(dead_code)] // each including target uses a different part

use coli_store::{Completion, EngineLayer, FileId, IoEngine, IoQueue, ReadRequest};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token bucket: `rate` bytes/s, at most `burst` bytes of credit.
pub struct Bucket {
    rate: f64,
    burst: f64,
    /// (tokens in bytes, possibly negative = debt; when they were last updated).
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// A full bucket of `rate` bytes/s and `burst` bytes.
    pub fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes `bytes` tokens now; returns when they are earned (now when the bucket held them).
    pub fn reserve(&self, bytes: u64) -> Instant {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let refill = now.duration_since(st.1).as_secs_f64() * self.rate;
        st.0 = (st.0 + refill).min(self.burst) - bytes as f64;
        st.1 = now;
        if st.0 >= 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-st.0 / self.rate)
        }
    }
}

/// One throttled drive: the directory its files are under, and its bucket.
pub struct Drive {
    /// Files under this directory belong to the drive (the longest matching one wins).
    pub dir: PathBuf,
    /// The drive's bandwidth.
    pub bucket: Bucket,
    /// Bytes read from the drive through the engine.
    pub bytes: AtomicU64,
}

/// The drives of a throttled store: `(directory, MiB/s)` each, burst `burst` bytes.
pub fn drives(spec: &[(PathBuf, f64)], burst: u64) -> Arc<Vec<Drive>> {
    Arc::new(
        spec.iter()
            .map(|(dir, mibps)| Drive {
                dir: dir.canonicalize().unwrap_or_else(|_| dir.clone()),
                bucket: Bucket::new(mibps * 1048576.0, burst as f64),
                bytes: AtomicU64::new(0),
            })
            .collect(),
    )
}

/// The type of [`coli_store::OpenOptions::engine_wrapper`]'s value.
pub type Wrapper = Arc<dyn Fn(Arc<dyn IoEngine>) -> Arc<dyn IoEngine> + Send + Sync>;

/// The wrapper to put in [`coli_store::OpenOptions::engine_wrapper`].
pub fn wrapper(drives: Arc<Vec<Drive>>) -> Wrapper {
    Arc::new(move |inner: Arc<dyn IoEngine>| -> Arc<dyn IoEngine> {
        Arc::new(ThrottledEngine::new(inner, drives.clone()))
    })
}

/// The throttling engine over a real one.
pub struct ThrottledEngine {
    inner: Arc<dyn IoEngine>,
    drives: Arc<Vec<Drive>>,
    /// Drive of each file id of the inner engine's table (`None`: under no drive, not throttled).
    drive_of: Vec<Option<usize>>,
}

fn drive_for(drives: &[Drive], path: &Path) -> Option<usize> {
    let p = path
        .parent()
        .and_then(|d| d.canonicalize().ok())
        .map(|d| d.join(path.file_name().unwrap_or_default()))
        .unwrap_or_else(|| path.to_path_buf());
    drives
        .iter()
        .enumerate()
        .filter(|(_, d)| p.starts_with(&d.dir))
        .max_by_key(|(_, d)| d.dir.as_os_str().len())
        .map(|(i, _)| i)
}

impl ThrottledEngine {
    /// Wraps `inner`, mapping each of its files to the drive whose directory holds it.
    pub fn new(inner: Arc<dyn IoEngine>, drives: Arc<Vec<Drive>>) -> ThrottledEngine {
        let mut drive_of = Vec::new();
        while let Some(p) = inner.path(drive_of.len() as FileId) {
            drive_of.push(drive_for(&drives, p));
        }
        ThrottledEngine {
            inner,
            drives,
            drive_of,
        }
    }

    /// Drive of each file of the table, for checks.
    pub fn drive_of(&self) -> &[Option<usize>] {
        &self.drive_of
    }
}

impl EngineLayer for ThrottledEngine {
    fn inner(&self) -> &dyn IoEngine {
        &*self.inner
    }
    fn describe_layer(&self) -> String {
        let rates: Vec<String> = self
            .drives
            .iter()
            .map(|d| format!("{:.0}", d.bucket.rate / 1048576.0))
            .collect();
        format!(
            "{} throttled to {} MiB/s per drive",
            self.inner.describe(),
            rates.join("/")
        )
    }
    fn wrap_queue<'a>(&'a self, inner: Box<dyn IoQueue + 'a>) -> Box<dyn IoQueue + 'a> {
        Box::new(ThrottledQueue {
            inner,
            engine: self,
            pending: HashMap::new(),
            held: Vec::new(),
            next: 0,
        })
    }
}

/// A queue of the throttling engine: the inner queue, and the completions waiting for tokens.
struct ThrottledQueue<'a> {
    inner: Box<dyn IoQueue + 'a>,
    engine: &'a ThrottledEngine,
    /// Submitted and not yet completed by the inner queue: our tag -> (caller's tag, due time).
    pending: HashMap<u64, (u64, Instant)>,
    /// Completed by the inner queue, waiting for their due time.
    held: Vec<(Instant, Completion)>,
    next: u64,
}

impl IoQueue for ThrottledQueue<'_> {
    fn submit(&mut self, mut req: ReadRequest) {
        let e = self.engine;
        let mut per_drive: Vec<u64> = vec![0; e.drives.len()];
        for p in &req.pieces {
            if let Some(Some(d)) = e.drive_of.get(p.file as usize) {
                per_drive[*d] += p.len as u64;
            }
        }
        let mut due = Instant::now();
        for (d, &n) in per_drive.iter().enumerate() {
            if n > 0 {
                e.drives[d].bytes.fetch_add(n, Ordering::Relaxed);
                due = due.max(e.drives[d].bucket.reserve(n));
            }
        }
        let tag = self.next;
        self.next += 1;
        self.pending.insert(tag, (req.tag, due));
        req.tag = tag;
        self.inner.submit(req);
    }

    fn wait(&mut self) -> Option<Completion> {
        loop {
            let now = Instant::now();
            let first = self
                .held
                .iter()
                .enumerate()
                .min_by_key(|(_, (due, _))| *due)
                .map(|(i, (due, _))| (i, *due));
            if let Some((i, due)) = first {
                if due <= now || self.inner.outstanding() == 0 {
                    std::thread::sleep(due.saturating_duration_since(now));
                    return Some(self.held.swap_remove(i).1);
                }
            }
            let mut c = match self.inner.wait() {
                Some(c) => c,
                None if self.held.is_empty() => return None,
                None => continue,
            };
            let (tag, due) = self
                .pending
                .remove(&c.tag)
                .expect("a completion of a request of this queue");
            c.tag = tag;
            if let Err(e) = &mut c.result {
                e.tag = tag;
            }
            self.held.push((due, c));
        }
    }

    fn outstanding(&self) -> usize {
        self.inner.outstanding() + self.held.len()
    }
}
