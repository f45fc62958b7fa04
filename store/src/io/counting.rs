//! [`CountingEngine`]: wraps any I/O engine and counts what it reads (requests completed,
//! bytes, failures), so that engines themselves keep no counters (as foyer's `monitor.rs`
//! wraps its engines).

use super::engine::{Completion, IoEngine, IoQueue, ReadRequest};
use super::layer::EngineLayer;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Reads an engine completed since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests completed without error.
    pub requests: u64,
    /// Bytes of those requests (their buffers' lengths).
    pub bytes: u64,
    /// Requests completed with an error (I/O error, short file, invalid piece).
    pub failed: u64,
}

/// An engine with counters around it ([`EngineLayer`]: everything else is the inner engine's).
pub struct CountingEngine {
    inner: Arc<dyn IoEngine>,
    requests: AtomicU64,
    bytes: AtomicU64,
    failed: AtomicU64,
}

impl CountingEngine {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn IoEngine>) -> CountingEngine {
        CountingEngine {
            inner,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    fn count(&self, c: &Completion) {
        if c.result.is_ok() {
            self.requests.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(c.buf.len() as u64, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct CountingQueue<'e> {
    engine: &'e CountingEngine,
    inner: Box<dyn IoQueue + 'e>,
}

impl IoQueue for CountingQueue<'_> {
    fn submit(&mut self, req: ReadRequest) {
        self.inner.submit(req)
    }
    fn wait(&mut self) -> Option<Completion> {
        let c = self.inner.wait()?;
        self.engine.count(&c);
        Some(c)
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }
}

impl EngineLayer for CountingEngine {
    fn inner(&self) -> &dyn IoEngine {
        &*self.inner
    }
    fn wrap_queue<'a>(&'a self, inner: Box<dyn IoQueue + 'a>) -> Box<dyn IoQueue + 'a> {
        Box::new(CountingQueue {
            engine: self,
            inner,
        })
    }
}
