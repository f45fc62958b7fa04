//! [`ExpertCache`]: the engine's expert cache, a pinned tier plus an LRU tier of
//! `Arc<ExpertBuf>` bounded together in bytes, with the reads in flight and the counters.
//! See the module map in [`crate::cache`].

use super::inflight::{fail_all, lock, InFlight, ReadSlot};
use super::lru::LruCache;
use super::stats::CacheStats;
use crate::error::{store_err, Result};
use crate::weights::reads_interleaved;
use coli_format::ExpertKey;
use coli_store::{ExpertBuf, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Upper bound of one prefetch request's bytes (on top of the LRU capacity bound), so that the
/// reads in flight stay a small, fixed amount of memory outside the budget.
pub const PREFETCH_MAX_BYTES: u64 = 64 << 20;

/// Threads [`ExpertCache::pin`] reads its chunks of 64 records with (at most the CPUs the
/// process may use).
pub const PIN_READERS: usize = 4;

/// [`ExpertCache::get_many_while`] reads the misses on a separate thread only when the experts
/// already in RAM hold at least this many bytes: below it their compute (at ~10 GB/s, < 0.4 ms)
/// is not worth a thread start, which on a loaded 2-core VM costs 1-2 ms of scheduling (the
/// demo model's 368 KiB experts: a thread per layer made a run 2x slower). Bytes.
pub const OVERLAP_MIN_READY_BYTES: u64 = 4 << 20;

/// A read in flight of one expert.
type Slot = ReadSlot<Arc<ExpertBuf>>;

/// Fails the reads of `keys` (their table entries removed, their waiters woken with `None`)
/// when dropped armed: a read that panics (in the store, or a test's engine) must not leave
/// requests blocked on its slots. Disarmed once the read returned; the caller then finishes
/// and completes the slots itself.
struct FailOnDrop<'a> {
    cache: &'a ExpertCache,
    keys: &'a [ExpertKey],
    slots: &'a [Arc<Slot>],
    armed: bool,
}

impl FailOnDrop<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for FailOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut s = self.cache.state();
            for (k, slot) in self.keys.iter().zip(self.slots) {
                s.inflight.finish(k, slot);
            }
            drop(s);
            fail_all(self.slots);
        }
    }
}

/// Where an expert is at one moment ([`ExpertCache::residency`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Residency {
    /// Only on disk: the next use reads it.
    Disk,
    /// A read of it is in flight (demand or prefetch).
    Reading,
    /// In RAM in the LRU tier (or read by prefetch and held for its layer).
    Cached,
    /// In RAM in the pinned tier (never evicted).
    Pinned,
}

/// An LRU entry: the expert and whether it was read by prefetch and not used yet.
struct Entry {
    buf: Arc<ExpertBuf>,
    prefetched: bool,
}

struct State {
    budget: u64,
    pinned: HashMap<ExpertKey, Arc<ExpertBuf>>,
    pinned_bytes: u64,
    lru: LruCache<ExpertKey, Entry>,
    inflight: InFlight<ExpertKey, Arc<ExpertBuf>>,
    /// Prefetched experts that did not fit the LRU tier without evicting: held outside the
    /// budget until their layer's demand request takes them (or drops them).
    ready: HashMap<ExpertKey, Arc<ExpertBuf>>,
    /// Per layer, the experts predicted and not yet matched by a demand request.
    predicted: HashMap<u32, Vec<u32>>,
    /// Per (layer, expert), tokens routed to it since the last [`ExpertCache::take_usage`].
    usage: HashMap<ExpertKey, u64>,
    /// Per (layer, expert), tokens routed to it since the cache was created (never emptied).
    routed_total: HashMap<ExpertKey, u64>,
    stats: CacheStats,
}

impl State {
    fn insert(&mut self, buf: &Arc<ExpertBuf>, prefetched: bool) {
        let entry = Entry {
            buf: Arc::clone(buf),
            prefetched,
        };
        self.lru.insert(buf.key, entry, buf.held_bytes() as u64);
    }

    /// Keeps a prefetched expert: in the LRU tier when it fits without evicting anything,
    /// else in `ready` (a prefetch never evicts).
    fn stash(&mut self, buf: Arc<ExpertBuf>) {
        let len = buf.held_bytes() as u64;
        if self.lru.used() + len <= self.lru.capacity() {
            self.insert(&buf, true);
        } else {
            self.ready.insert(buf.key, buf);
        }
    }

    /// Moves the `ready` experts that `keep` rejects into the LRU tier where they fit without
    /// evicting, and drops the others (unused prefetches).
    fn settle_ready(&mut self, keep: impl Fn(&ExpertKey) -> bool) {
        let stale: Vec<ExpertKey> = self.ready.keys().filter(|k| !keep(k)).copied().collect();
        for k in stale {
            if let Some(b) = self.ready.remove(&k) {
                if self.lru.used() + b.held_bytes() as u64 <= self.lru.capacity() {
                    self.insert(&b, true);
                }
            }
        }
    }
}

/// The engine's expert cache: a pinned tier plus an LRU tier of `Arc<ExpertBuf>` keyed by
/// [`ExpertKey`], bounded together by the budget in bytes, with the reads in flight and the
/// counters ([`CacheStats`]).
///
/// Cloning gives another handle to the SAME cache (the prefetch thread holds one). All methods
/// take `&self`; one mutex guards the state and is never held during a read.
#[derive(Clone)]
pub struct ExpertCache {
    shared: Arc<Mutex<State>>,
}

impl ExpertCache {
    /// An empty cache of `budget` bytes (`u64::MAX`: unbounded), nothing pinned.
    pub fn new(budget: u64) -> ExpertCache {
        ExpertCache {
            shared: Arc::new(Mutex::new(State {
                budget,
                pinned: HashMap::new(),
                pinned_bytes: 0,
                lru: LruCache::new(budget),
                inflight: InFlight::new(),
                ready: HashMap::new(),
                predicted: HashMap::new(),
                usage: HashMap::new(),
                routed_total: HashMap::new(),
                stats: CacheStats::default(),
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// The budget in bytes (pinned + LRU tiers).
    pub fn capacity(&self) -> u64 {
        self.state().budget
    }

    /// Bytes of experts held (pinned + LRU tiers).
    pub fn used(&self) -> u64 {
        let s = self.state();
        s.pinned_bytes + s.lru.used()
    }

    /// Capacity of the LRU tier in bytes: the budget minus the pinned bytes.
    pub fn lru_capacity(&self) -> u64 {
        self.state().lru.capacity()
    }

    /// Pinned experts and their bytes.
    pub fn pinned(&self) -> (usize, u64) {
        let s = self.state();
        (s.pinned.len(), s.pinned_bytes)
    }

    /// Whether `key` is pinned.
    pub fn is_pinned(&self, key: ExpertKey) -> bool {
        self.state().pinned.contains_key(&key)
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        let s = self.state();
        CacheStats {
            evictions: s.lru.evictions(),
            ..s.stats
        }
    }

    /// Reads `keys` and pins them (experts already pinned are skipped); which experts to pin
    /// is the placement policy's choice ([`crate::placement::pinned_set`]). The LRU tier
    /// shrinks to the budget minus the pinned bytes (evicting as needed). Returns the experts
    /// pinned by this call.
    ///
    /// # Errors
    /// [`crate::EngineError::Invalid`] when the keys' bytes (INDEX record lengths rounded up to
    /// the page size, [`coli_store::held_bytes_for`]: what their buffers hold) do not fit
    /// in the budget left, before anything is read; [`crate::EngineError::Store`] for a key not
    /// in the store or a failed read: nothing of the failed chunk (of up to 64) is pinned, the
    /// chunks read before it are, and so are those the other readers (up to [`PIN_READERS`]
    /// threads) had already started; no new chunk starts after a failure.
    pub fn pin(&self, store: &Store, keys: &[ExpertKey]) -> Result<usize> {
        let mut chosen: Vec<ExpertKey> = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        let mut total = 0u64;
        {
            let s = self.state();
            for &k in keys {
                if s.pinned.contains_key(&k) || !seen.insert(k) {
                    continue;
                }
                let len = store
                    .record(k)
                    .ok_or_else(|| crate::EngineError::Store {
                        what: format!("pinning {k}"),
                        error: coli_store::StoreError::NotFound(format!("expert {k}")),
                    })?
                    .length
                    .get();
                total += coli_store::held_bytes_for(len);
                chosen.push(k);
            }
            let room = s.budget.saturating_sub(s.pinned_bytes);
            if total > room {
                return Err(crate::EngineError::Invalid(format!(
                    "pinning {} experts of {total} bytes: only {room} bytes of the budget are left",
                    chosen.len()
                )));
            }
        }
        // Chunks of 64 read by up to PIN_READERS threads at once: the kernel zeroes every fresh
        // page of a record buffer when an O_DIRECT read into it is submitted (io_uring: in the
        // submitting thread), CPU work that one thread would do alone while the disk waits (a
        // whole model's preload), and the reorder of pinned records runs on each reader. A
        // chunk whose records are stored in the order the kernels read them (an interleaved
        // store under q8a, any row-major store under exact) is used in place in the page cache
        // instead (`Store::map_records`): no zeroed pages, no copy.
        let chunks: Vec<&[ExpertKey]> = chosen.chunks(64).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        // Stops the other readers when a reader panics (the panic is resumed after the join).
        struct StopOnPanic<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        let read = || -> Result<()> {
            use std::sync::atomic::Ordering::Relaxed;
            let _stop = StopOnPanic(&failed);
            while !failed.load(Relaxed) {
                let Some(chunk) = chunks.get(next.fetch_add(1, Relaxed)) else {
                    break;
                };
                let in_place = chunk
                    .iter()
                    .all(|&k| store.record(k).is_some_and(stored_as_read));
                let got = if in_place {
                    store.map_records(chunk)
                } else {
                    store.fetch(chunk)
                };
                let bufs = match got.map(interleaved) {
                    Ok(b) => b,
                    Err(e) => {
                        failed.store(true, Relaxed);
                        return Err(store_err(format!("pinning {} experts", chunk.len()))(e));
                    }
                };
                let mut s = self.state();
                s.stats.fetch_calls += 1;
                for b in bufs {
                    let len = b.len_bytes() as u64;
                    let held = b.held_bytes() as u64;
                    s.stats.pinned_reads += 1;
                    s.stats.bytes_fetched += len;
                    s.stats.demand_bytes += len;
                    if s.pinned.insert(b.key, Arc::new(b)).is_none() {
                        s.pinned_bytes += held;
                    }
                }
                let cap = s.budget.saturating_sub(s.pinned_bytes);
                s.lru.set_capacity(cap);
            }
            Ok(())
        };
        let readers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(PIN_READERS)
            .min(chunks.len());
        if readers <= 1 {
            read()?;
        } else {
            std::thread::scope(|sc| {
                let handles: Vec<_> = (0..readers).map(|_| sc.spawn(read)).collect();
                let mut first = Ok(());
                for h in handles {
                    let r = h
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    if first.is_ok() {
                        first = r;
                    }
                }
                first
            })?;
        }
        Ok(chosen.len())
    }

    /// Ends a forward pass: prefetched experts still held outside the budget go into the LRU
    /// tier where they fit without evicting, the others are dropped.
    pub fn settle(&self) {
        self.state().settle_ready(|_| false);
    }

    /// Bytes of prefetched experts held outside the budget, waiting for their layer.
    pub fn ready_bytes(&self) -> u64 {
        self.state()
            .ready
            .values()
            .map(|b| b.held_bytes() as u64)
            .sum()
    }

    /// Records the experts the lookahead router predicted for `layer`; the next demand request
    /// of that layer scores them (see [`CacheStats::prefetch_precision`]). A prediction not yet
    /// scored is replaced.
    pub fn set_prediction(&self, layer: u32, experts: Vec<u32>) {
        self.state().predicted.insert(layer, experts);
    }

    /// The experts of `keys` that a read would bring in: not pinned, not in the LRU tier, not
    /// held after a prefetch and not in flight (order kept). The lookahead uses it to skip
    /// waking the prefetch thread when everything predicted is already in RAM.
    pub fn absent(&self, keys: &[ExpertKey]) -> Vec<ExpertKey> {
        let s = self.state();
        keys.iter()
            .copied()
            .filter(|k| {
                !(s.pinned.contains_key(k)
                    || s.lru.contains(k)
                    || s.ready.contains_key(k)
                    || s.inflight.contains(k))
            })
            .collect()
    }

    /// Adds the tokens routed to each expert (`(key, tokens)` pairs) to the usage counts (see
    /// [`ExpertCache::take_usage`]).
    pub fn record_usage(&self, routed: impl IntoIterator<Item = (ExpertKey, u64)>) {
        let mut s = self.state();
        for (k, n) in routed {
            *s.usage.entry(k).or_insert(0) += n;
            *s.routed_total.entry(k).or_insert(0) += n;
        }
    }

    /// Tokens routed to each expert since the cache was created (what
    /// [`ExpertCache::record_usage`] added; [`ExpertCache::take_usage`] does not empty it).
    pub fn routed_totals(&self) -> HashMap<ExpertKey, u64> {
        self.state().routed_total.clone()
    }

    /// Where each of `keys` is now (order kept): pinned, in the LRU tier (or held after a
    /// prefetch), being read, or only on disk.
    pub fn residency(&self, keys: &[ExpertKey]) -> Vec<Residency> {
        let s = self.state();
        keys.iter()
            .map(|k| {
                if s.pinned.contains_key(k) {
                    Residency::Pinned
                } else if s.lru.contains(k) || s.ready.contains_key(k) {
                    Residency::Cached
                } else if s.inflight.contains(k) {
                    Residency::Reading
                } else {
                    Residency::Disk
                }
            })
            .collect()
    }

    /// The usage counts recorded since the last call (tokens routed per expert), emptied.
    pub fn take_usage(&self) -> HashMap<ExpertKey, u64> {
        std::mem::take(&mut self.state().usage)
    }

    /// Reads `keys` ahead of their use, most wanted first: experts pinned, held or in flight are
    /// skipped, the rest (cut where their bytes would pass the LRU capacity or
    /// [`PREFETCH_MAX_BYTES`]) are marked in flight and read with one `store.fetch`. Each read
    /// expert goes into the LRU tier if it fits without evicting anything, else it is held
    /// outside the budget until its layer's demand request takes it (a prefetch never evicts;
    /// see [`ExpertCache::settle`]). A demand request for one of them meanwhile waits for this
    /// read. Returns the experts read.
    ///
    /// # Errors
    /// [`crate::EngineError::Store`] when the read fails; the waiting requests then read the
    /// experts themselves, so a failed prefetch never changes results.
    pub fn prefetch(&self, store: &Store, keys: &[ExpertKey]) -> Result<usize> {
        let mut todo = Vec::new();
        let mut slots = Vec::new();
        {
            let mut s = self.state();
            let cap = s.lru.capacity().min(PREFETCH_MAX_BYTES);
            let mut total = 0u64;
            for &k in keys {
                if s.pinned.contains_key(&k)
                    || s.lru.contains(&k)
                    || s.ready.contains_key(&k)
                    || s.inflight.contains(&k)
                    || todo.contains(&k)
                {
                    continue;
                }
                let Some(r) = store.record(k) else { continue };
                let len = r.length.get();
                if total + len > cap {
                    break;
                }
                total += len;
                let slot = s.inflight.start(k);
                todo.push(k);
                slots.push(slot);
            }
        }
        if todo.is_empty() {
            return Ok(0);
        }
        let guard = FailOnDrop {
            cache: self,
            keys: &todo,
            slots: &slots,
            armed: true,
        };
        let res = store.fetch(&todo).map(as_read);
        guard.disarm();
        let mut s = self.state();
        s.stats.fetch_calls += 1;
        for (k, slot) in todo.iter().zip(&slots) {
            s.inflight.finish(k, slot);
        }
        match res {
            Ok(bufs) => {
                let mut done = Vec::with_capacity(bufs.len());
                for b in bufs {
                    let len = b.len_bytes() as u64;
                    s.stats.bytes_fetched += len;
                    s.stats.prefetch_bytes += len;
                    s.stats.prefetch_reads += 1;
                    let b = Arc::new(b);
                    s.stash(Arc::clone(&b));
                    done.push(b);
                }
                drop(s);
                let n = done.len();
                for (slot, b) in slots.iter().zip(done) {
                    slot.complete(Some(b));
                }
                Ok(n)
            }
            Err(e) => {
                drop(s);
                fail_all(&slots);
                Err(store_err(format!("prefetching {} experts", todo.len()))(e))
            }
        }
    }

    /// The experts `keys` (no duplicates, one layer), in the order given: pinned and LRU hits
    /// from RAM, experts whose read is in flight by waiting for that read, every other miss read
    /// with ONE `store.fetch` call and inserted (evicting least-recently-used experts). The
    /// returned `Arc`s keep every expert of the request alive even when the budget is smaller
    /// than the request. Scores the layer's pending prediction, if any.
    ///
    /// # Errors
    /// [`crate::EngineError::Store`] when the fetch fails (I/O, checksum, missing record).
    pub fn get_many(&self, store: &Store, keys: &[ExpertKey]) -> Result<Vec<Arc<ExpertBuf>>> {
        self.get_many_while(store, keys, |_| ())
            .map(|(bufs, ())| bufs)
    }

    /// [`ExpertCache::get_many`] that overlaps the demand read with the caller's work: the
    /// misses are read on a separate thread (`coli-demand-read`, one per request that has
    /// misses and at least [`OVERLAP_MIN_READY_BYTES`] of experts in RAM; otherwise they are
    /// read first on the calling thread) while `meanwhile` runs on the calling thread with the
    /// experts already in RAM (`Some` at the index of every pinned or LRU hit; `None` for a miss
    /// or a read in flight). Then the misses and the reads in flight are waited for, and every
    /// expert is returned with `meanwhile`'s result. A layer computes the experts it has while
    /// the others land.
    ///
    /// `io_wait_ns` counts only the time spent waiting after `meanwhile` returned (the read time
    /// it hid is `io_hidden_ns`). If the read thread cannot be started, the misses are read
    /// first on the calling thread (same results, no overlap).
    ///
    /// # Errors
    /// As [`ExpertCache::get_many`] (`meanwhile` has run; its result is dropped).
    pub fn get_many_while<R>(
        &self,
        store: &Store,
        keys: &[ExpertKey],
        meanwhile: impl FnOnce(&[Option<Arc<ExpertBuf>>]) -> R,
    ) -> Result<(Vec<Arc<ExpertBuf>>, R)> {
        self.score_prediction(keys);
        self.get_group_while(store, keys, true, meanwhile)
    }

    /// Scores the pending prediction of the layer of `keys` (one demand request's experts,
    /// all of them), if any, and drops it: [`CacheStats`] `predicted`, `predicted_used`,
    /// `demanded_after_prediction`. [`ExpertCache::get_many_while`] does it; a request split
    /// by [`ExpertCache::request_groups`] calls it once with the whole request.
    pub fn score_prediction(&self, keys: &[ExpertKey]) {
        let mut s = self.state();
        if let Some(first) = keys.first() {
            if let Some(pred) = s.predicted.remove(&first.layer) {
                let used = pred
                    .iter()
                    .filter(|&&e| keys.iter().any(|k| k.expert == e))
                    .count() as u64;
                s.stats.predicted += pred.len() as u64;
                s.stats.predicted_used += used;
                s.stats.demanded_after_prediction += keys.len() as u64;
            }
        }
    }

    /// Splits one demand request (`keys`, one layer) into groups (indices into `keys`) whose
    /// unpinned experts hold at most the LRU tier's capacity together (by
    /// [`coli_store::held_bytes_for`] of each INDEX record length; a group has at least one
    /// expert). One group, `keys` in order, when the request fits; else the experts in the
    /// pinned and LRU tiers come first, then those prefetched or being read, then those on
    /// disk (so that reading the later ones cannot evict the earlier ones before they are
    /// used), each part in the order of `keys`, and the caller gets and computes the groups one
    /// after another ([`ExpertCache::get_group_while`]), letting each group's buffers go before
    /// the next: a union larger than the cache (a long prefill chunk under a small budget)
    /// holds at most one group beyond the budget (its misses, read before the LRU tier makes
    /// room for them) instead of all of it. Pinned experts cost nothing (they are resident
    /// anyway). With an LRU tier smaller than one token's experts, decode is split too: more,
    /// smaller reads, in the memory asked for.
    pub fn request_groups(&self, store: &Store, keys: &[ExpertKey]) -> Vec<Vec<usize>> {
        let s = self.state();
        let cap = s.lru.capacity();
        let cost: Vec<u64> = keys
            .iter()
            .map(|k| {
                if s.pinned.contains_key(k) {
                    0
                } else {
                    store
                        .record(*k)
                        .map_or(0, |r| coli_store::held_bytes_for(r.length.get()))
                }
            })
            .collect();
        if cost.iter().fold(0u64, |a, &b| a.saturating_add(b)) <= cap {
            return vec![(0..keys.len()).collect()];
        }
        // 0: in a tier (pinned, LRU); 1: prefetched or being read (moving it into the LRU tier
        // may evict, so after the tiers' experts are used); 2: on disk.
        let rank = |k: &ExpertKey| {
            if s.pinned.contains_key(k) || s.lru.contains(k) {
                0
            } else if s.ready.contains_key(k) || s.inflight.contains(k) {
                1
            } else {
                2
            }
        };
        let ranks: Vec<u8> = keys.iter().map(rank).collect();
        let ranks = &ranks;
        let order = (0..3u8).flat_map(|r| (0..keys.len()).filter(move |&i| ranks[i] == r));
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut held = 0u64;
        for i in order {
            match groups.last_mut() {
                Some(g) if held.saturating_add(cost[i]) <= cap => g.push(i),
                _ => {
                    groups.push(vec![i]);
                    held = 0;
                }
            }
            held = held.saturating_add(cost[i]);
        }
        groups
    }

    /// [`ExpertCache::get_many_while`] for one group of a request split by
    /// [`ExpertCache::request_groups`], without scoring the prediction (the caller scores the
    /// whole request once: [`ExpertCache::score_prediction`]); `last`: the request's last group,
    /// after which the layer's prefetched experts that no group asked for are settled (put in
    /// the LRU tier where they fit without evicting, else dropped) as after a whole request.
    ///
    /// # Errors
    /// As [`ExpertCache::get_many`].
    pub fn get_group_while<R>(
        &self,
        store: &Store,
        keys: &[ExpertKey],
        last: bool,
        meanwhile: impl FnOnce(&[Option<Arc<ExpertBuf>>]) -> R,
    ) -> Result<(Vec<Arc<ExpertBuf>>, R)> {
        let mut out: Vec<Option<Arc<ExpertBuf>>> = Vec::with_capacity(keys.len());
        let mut pinned = vec![false; keys.len()];
        let mut missing = Vec::new();
        let mut missing_at = Vec::new();
        let mut own_slots = Vec::new();
        let mut waits = Vec::new();
        {
            let mut s = self.state();
            for (i, k) in keys.iter().enumerate() {
                if let Some(b) = s.pinned.get(k) {
                    let b = Arc::clone(b);
                    s.stats.hits += 1;
                    s.stats.pinned_hits += 1;
                    pinned[i] = true;
                    out.push(Some(b));
                } else if let Some(e) = s.lru.get_mut(k) {
                    let b = Arc::clone(&e.buf);
                    let was_prefetched = std::mem::take(&mut e.prefetched);
                    s.stats.hits += 1;
                    if was_prefetched {
                        s.stats.prefetch_used += 1;
                    }
                    out.push(Some(b));
                } else if let Some(b) = s.ready.remove(k) {
                    s.insert(&b, false);
                    s.stats.hits += 1;
                    s.stats.prefetch_used += 1;
                    out.push(Some(b));
                } else if let Some(slot) = s.inflight.waiter(k) {
                    waits.push((i, slot));
                    s.stats.hits += 1;
                    s.stats.inflight_waits += 1;
                    out.push(None);
                } else {
                    s.stats.misses += 1;
                    let slot = s.inflight.start(*k);
                    missing.push(*k);
                    missing_at.push(i);
                    own_slots.push(slot);
                    out.push(None);
                }
            }
        }
        // A reader thread only when there are misses and enough in RAM to overlap them with.
        let ready_bytes: u64 = out.iter().flatten().map(|b| b.len_bytes() as u64).sum();
        let overlap = !missing.is_empty() && ready_bytes >= OVERLAP_MIN_READY_BYTES;
        let (fetched, r, stalled, hidden) = std::thread::scope(|s| {
            let t0 = Instant::now();
            let reader = overlap
                .then(|| {
                    let (missing, own_slots) = (&missing, &own_slots);
                    std::thread::Builder::new()
                        .name("coli-demand-read".into())
                        .spawn_scoped(s, move || {
                            let r = self.read_missing(store, missing, own_slots);
                            (r, t0.elapsed())
                        })
                        .ok()
                })
                .flatten();
            match reader {
                Some(h) => {
                    let r = meanwhile(&out);
                    let t1 = Instant::now();
                    let (fetched, read_took) =
                        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                    let stalled = t1.elapsed();
                    let hidden = read_took.saturating_sub(stalled);
                    let ns = |d: std::time::Duration| d.as_nanos() as u64;
                    (fetched, r, ns(stalled), ns(hidden))
                }
                // No misses, too little to overlap with, or no thread: read first, here.
                None => {
                    let fetched = if missing.is_empty() {
                        Ok(Vec::new())
                    } else {
                        self.read_missing(store, &missing, &own_slots)
                    };
                    let stalled = t0.elapsed().as_nanos() as u64;
                    (fetched, meanwhile(&out), stalled, 0)
                }
            }
        });
        let t0 = Instant::now();
        let mut retry = Vec::new();
        for (&i, b) in missing_at.iter().zip(fetched?) {
            out[i] = Some(b);
        }
        for (i, slot) in waits {
            match slot.wait() {
                Some(b) => {
                    let mut s = self.state();
                    s.stats.prefetch_used += 1;
                    if let Some(e) = s.lru.peek_mut(&keys[i]) {
                        e.prefetched = false;
                    } else if let Some(b) = s.ready.remove(&keys[i]) {
                        s.insert(&b, false);
                    }
                    out[i] = Some(b);
                }
                None => retry.push(i),
            }
        }
        for i in retry {
            // The prefetch read failed: read it on demand (an error now is reported), or wait
            // for another request that already does.
            let k = keys[i];
            {
                let mut s = self.state();
                s.stats.hits -= 1;
                s.stats.inflight_waits -= 1;
                s.stats.misses += 1;
            }
            out[i] = Some(loop {
                let pending = {
                    let mut s = self.state();
                    match s.inflight.waiter(&k) {
                        Some(w) => Err(w),
                        None => Ok(s.inflight.start(k)),
                    }
                };
                match pending {
                    Err(w) => {
                        if let Some(b) = w.wait() {
                            break b;
                        }
                    }
                    Ok(slot) => {
                        let b = self.read_missing(store, &[k], std::slice::from_ref(&slot))?;
                        break b.into_iter().next().expect("one key, one expert");
                    }
                }
            });
        }
        let waited = stalled + t0.elapsed().as_nanos() as u64;
        let bufs: Vec<Arc<ExpertBuf>> = out
            .into_iter()
            .map(|s| s.expect("every slot filled above"))
            .collect();
        let held: u64 = bufs
            .iter()
            .zip(&pinned)
            .filter(|(_, &p)| !p)
            .map(|(b, _)| b.held_bytes() as u64)
            .sum();
        let mut s = self.state();
        s.stats.io_wait_ns += waited;
        s.stats.io_hidden_ns += hidden;
        s.stats.largest_request_bytes = s.stats.largest_request_bytes.max(held);
        // This layer's prefetched experts that it did not ask for are stale now.
        if let Some(layer) = keys.first().map(|k| k.layer).filter(|_| last) {
            s.settle_ready(|k| k.layer != layer);
        }
        drop(s);
        Ok((bufs, r))
    }

    /// Demand read of `missing` (registered in flight with `slots`): one `store.fetch`, results
    /// inserted in the LRU tier and handed to anyone waiting on the slots.
    fn read_missing(
        &self,
        store: &Store,
        missing: &[ExpertKey],
        slots: &[Arc<Slot>],
    ) -> Result<Vec<Arc<ExpertBuf>>> {
        let what = if missing.len() == 1 {
            format!("fetching {}", missing[0])
        } else {
            format!(
                "fetching {} experts ({} .. {})",
                missing.len(),
                missing[0],
                missing[missing.len() - 1]
            )
        };
        let guard = FailOnDrop {
            cache: self,
            keys: missing,
            slots,
            armed: true,
        };
        let res = store.fetch(missing).map(as_read);
        guard.disarm();
        let mut s = self.state();
        s.stats.fetch_calls += 1;
        for (k, slot) in missing.iter().zip(slots) {
            s.inflight.finish(k, slot);
        }
        let bufs = match res {
            Ok(b) => b,
            Err(e) => {
                drop(s);
                fail_all(slots);
                return Err(store_err(what)(e));
            }
        };
        let mut fetched: HashMap<ExpertKey, Arc<ExpertBuf>> = HashMap::with_capacity(bufs.len());
        for b in bufs {
            let len = b.len_bytes() as u64;
            s.stats.bytes_fetched += len;
            s.stats.demand_bytes += len;
            fetched.insert(b.key, Arc::new(b));
        }
        let mut out = Vec::with_capacity(missing.len());
        for k in missing {
            match fetched.get(k) {
                Some(b) => {
                    s.insert(b, false);
                    out.push(Arc::clone(b));
                }
                None => {
                    drop(s);
                    fail_all(slots);
                    return Err(crate::EngineError::Store {
                        what: format!("fetching {k}"),
                        error: coli_store::StoreError::NotFound(format!(
                            "{k} (fetch returned other experts)"
                        )),
                    });
                }
            }
        }
        drop(s);
        for (slot, b) in slots.iter().zip(&out) {
            slot.complete(Some(Arc::clone(b)));
        }
        Ok(out)
    }
}

/// `bufs` with the matrices the kernels multiply faster in the interleaved row order reordered
/// (`coli_kernels::prefers_interleaved`; the same numbers either way): for records pinned for
/// the whole run. Records read on demand stay row-major: the integer kernels pack a row-major
/// matrix 16 rows at a time as they multiply it (with VNNI, one token's rows are read in place),
/// which reads it from RAM once, where a reorder at the read writes it back and reads it again
/// (0.85x streamed decode when every record was reordered, docs/ENGINE.md). Outside the lock.
fn interleaved(mut bufs: Vec<ExpertBuf>) -> Vec<ExpertBuf> {
    for b in &mut bufs {
        b.deinterleave(reads_interleaved);
        b.interleave(
            coli_kernels::prefers_interleaved,
            coli_kernels::interleave_sections,
        );
    }
    bufs
}

/// `bufs` with the matrices stored interleaved (format version 7) that the kernels read
/// row-major (under `--numerics exact`, or an encoding the integer rule leaves to the f32
/// kernels) reordered back: for records read on demand. Outside the lock.
fn as_read(mut bufs: Vec<ExpertBuf>) -> Vec<ExpertBuf> {
    for b in &mut bufs {
        b.deinterleave(reads_interleaved);
    }
    bufs
}

/// True when each matrix of `r`'s record is stored in the order the kernels read it
/// (interleaved or row-major), so the record can be used as stored.
fn stored_as_read(r: &coli_store::IndexRecord) -> bool {
    let Ok(encs) = r.encodings() else {
        return false;
    };
    let stored = r.interleaved_sections();
    r.matrix_dims()
        .iter()
        .zip(encs)
        .zip(stored)
        .all(|((&(rows, cols), e), s)| s == coli_kernels::reads_interleaved(e, rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;

    /// A real store of one layer of `n` int4 experts (H = 64, I = 32) in a temp dir.
    fn tiny_store(n: u32) -> (tempfile::TempDir, Store) {
        store_of(n, 32, 64)
    }

    /// A store of `n` int4 experts of intermediate size `inter` and hidden size `hidden`.
    fn store_of(n: u32, inter: usize, hidden: usize) -> (tempfile::TempDir, Store) {
        use coli_format::Encoding;
        use coli_store::{EncodedMatrix, ExpertLayer, StoreSpec, StoreWriter};
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("s.coli");
        let enc = Encoding::Int4 { group_size: 32 };
        let spec = StoreSpec {
            family: "mixtral".into(),
            config_json: br#"{"model_type":"mixtral"}"#.to_vec(),
            num_layers: 1,
            expert_layers: vec![ExpertLayer {
                layer: 0,
                num_experts: n,
            }],
            expert_encoding: enc,
            alignment: 4096,
            segment_max_bytes: 1 << 20,
            matrix_order: Default::default(),
            converter_version: "0.1.0".into(),
            parameter_defaults: Default::default(),
            parameters: Default::default(),
            sources: vec![],
        };
        let mat = |rows: usize, cols: usize, v: u8| EncodedMatrix {
            encoding: enc,
            rows,
            cols,
            data: vec![v; enc.weight_bytes(rows, cols)],
            scales: vec![0.5; enc.scale_count(rows, cols)],
            e8m0_scales: Vec::new(),
            bias: None,
        };
        let coli_store::WriterStart::Fresh(mut w) =
            StoreWriter::create_or_resume(&target, spec).unwrap()
        else {
            panic!("new target");
        };
        for e in 0..n {
            let (g, u, d) = (
                mat(inter, hidden, e as u8),
                mat(inter, hidden, 1),
                mat(hidden, inter, 2),
            );
            w.add_expert(ExpertKey::new(0, e), hidden, inter, [&g, &u, &d])
                .unwrap();
        }
        w.finish().unwrap();
        let store = Store::open(&target).unwrap();
        (tmp, store)
    }

    /// Several chunks of 64 are read by several threads: every record pinned once, with the
    /// bytes a plain fetch gives, used in place in the page cache (a row-major store under the
    /// library's default exact numerics is in the order the kernels read); a record that fails
    /// its checksum fails the pin, and nothing of its chunk is pinned.
    #[test]
    fn pin_reads_chunks_on_several_threads() {
        let (tmp, store) = tiny_store(200);
        let keys: Vec<ExpertKey> = (0..200).map(|e| ExpertKey::new(0, e)).collect();
        let held: u64 = keys
            .iter()
            .map(|&k| coli_store::held_bytes_for(store.record(k).unwrap().length.get()))
            .sum();
        let cache = ExpertCache::new(held);
        assert_eq!(cache.pin(&store, &keys).unwrap(), 200);
        assert_eq!(cache.pinned(), (200, held));
        let s = cache.stats();
        assert_eq!((s.pinned_reads, s.fetch_calls), (200, 4));
        for &k in &keys {
            let want = store.fetch_one(k).unwrap();
            let got = cache.get_many(&store, &[k]).unwrap().pop().unwrap();
            assert_eq!(got.bytes(), want.bytes(), "{k}");
            assert!(got.is_mapped() && !want.is_mapped(), "{k}");
        }
        assert_eq!(cache.stats().misses, 0);

        // Expert 150 (the third chunk) corrupted on disk.
        let r = store.record(ExpertKey::new(0, 150)).unwrap();
        let path = coli_format::disk::names::segment_path(
            tmp.path().join("s.coli").as_path(),
            r.segment.get(),
        );
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[r.offset.get() as usize + 100] ^= 0xFF;
        std::fs::write(&path, bytes).unwrap();
        let store = Store::open(tmp.path().join("s.coli")).unwrap();
        let cache = ExpertCache::new(held);
        let err = cache.pin(&store, &keys).unwrap_err().to_string();
        assert!(
            err.contains("pinning 64 experts")
                && err.contains("checksum mismatch in layer 0 expert 150"),
            "{err}"
        );
        for e in 128..192 {
            assert!(
                !cache.is_pinned(ExpertKey::new(0, e)),
                "expert {e} of the failed chunk"
            );
        }
    }

    #[test]
    fn pinned_tier_prefetch_and_no_double_reads() {
        let (_tmp, store) = tiny_store(8);
        let keys: Vec<ExpertKey> = (0..8).map(|e| ExpertKey::new(0, e)).collect();
        let one = store.record(keys[0]).unwrap().length.get();
        let cache = ExpertCache::new(4 * one);
        // Pin two experts (twice: already pinned ones are skipped); the LRU tier gets the other
        // two experts' worth. More than the budget left is refused before any read.
        assert_eq!(cache.pin(&store, &keys[..2]).unwrap(), 2);
        assert_eq!(cache.pin(&store, &keys[..2]).unwrap(), 0);
        let reads = store.stats().reads;
        let err = cache.pin(&store, &keys[2..5]).unwrap_err().to_string();
        assert!(
            err.contains("3 experts") && err.contains("bytes of the budget"),
            "{err}"
        );
        assert_eq!(store.stats().reads, reads);
        assert_eq!(cache.pinned(), (2, 2 * one));
        assert_eq!(cache.lru_capacity(), 2 * one);
        // Prefetch stops at the LRU capacity and skips pinned experts.
        assert_eq!(cache.prefetch(&store, &keys).unwrap(), 2);
        let s = cache.stats();
        assert_eq!((s.prefetch_reads, s.pinned_reads), (2, 2));
        cache.set_prediction(0, vec![0, 2, 3, 7]);
        let got = cache.get_many(&store, &keys[..5]).unwrap();
        for (b, k) in got.iter().zip(&keys) {
            assert_eq!(b.key, *k);
        }
        let s = cache.stats();
        assert_eq!((s.pinned_hits, s.hits, s.misses), (2, 4, 1));
        assert_eq!(s.prefetch_used, 2);
        // Prediction {0, 2, 3, 7} against demand {0..5}: 3 of 4 used, 3 of 5 predicted.
        assert_eq!((s.predicted, s.predicted_used), (4, 3));
        assert_eq!(s.demanded_after_prediction, 5);
        assert!(cache.used() <= cache.capacity());
        // Where each expert is: the two pinned, the LRU tier's two (capacity 2 experts), the
        // rest on disk.
        let r = cache.residency(&keys);
        assert_eq!(&r[..2], &[Residency::Pinned; 2]);
        let cached = r[2..].iter().filter(|&&x| x == Residency::Cached).count();
        let disk = r[2..].iter().filter(|&&x| x == Residency::Disk).count();
        assert_eq!((cached, disk), (2, keys.len() - 4), "{r:?}");
        assert_eq!(
            store.stats().bytes_read,
            s.demand_bytes + s.prefetch_bytes,
            "{s:?}"
        );

        // Demand and prefetch racing on the same experts never read one twice.
        for round in 0..20 {
            let (_t, store) = tiny_store(8);
            let cache = ExpertCache::new(u64::MAX);
            std::thread::scope(|sc| {
                let c2 = cache.clone();
                let st = &store;
                let ks = &keys;
                sc.spawn(move || c2.prefetch(st, &ks[round % 8..]).unwrap());
                let got = cache.get_many(&store, &keys).unwrap();
                assert_eq!(got.len(), 8);
            });
            assert_eq!(store.stats().reads, 8, "round {round}");
            let s = cache.stats();
            assert_eq!(s.misses + s.prefetch_reads, 8, "{s:?}");
            assert_eq!(s.hits + s.misses, 8, "{s:?}");
        }
    }

    #[test]
    fn usage_counts_accumulate_and_drain() {
        let cache = ExpertCache::new(10);
        let k = ExpertKey::new(3, 1);
        cache.record_usage([(k, 2), (ExpertKey::new(3, 2), 1)]);
        cache.record_usage([(k, 5)]);
        let u = cache.take_usage();
        // The totals outlive take_usage.
        cache.record_usage([(k, 1)]);
        assert_eq!(cache.take_usage().get(&k), Some(&1));
        assert_eq!(cache.routed_totals().get(&k), Some(&8));
        assert_eq!(u[&k], 7);
        assert!(cache.take_usage().is_empty());
    }

    /// TEST-ONLY engine layer over the store's real engine: completions are handed back only
    /// once the gate is opened (or after 10 s, noted as a timeout so the test fails instead of
    /// hanging).
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
        timed_out: std::sync::atomic::AtomicBool,
        /// Completions still to be turned into read errors.
        fail_next: std::sync::atomic::AtomicUsize,
        /// Completions still to be turned into a panic of the reading thread.
        panic_next: std::sync::atomic::AtomicUsize,
    }

    impl Gate {
        fn set(&self, open: bool) {
            *lock(&self.open) = open;
            self.cv.notify_all();
        }
        fn pass(&self) {
            let g = lock(&self.open);
            let (_g, t) = self
                .cv
                .wait_timeout_while(g, std::time::Duration::from_secs(10), |open| !*open)
                .unwrap();
            if t.timed_out() {
                self.timed_out
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    struct GatedEngine {
        inner: Arc<dyn coli_store::IoEngine>,
        gate: Arc<Gate>,
    }

    struct GatedQueue<'a> {
        inner: Box<dyn coli_store::IoQueue + 'a>,
        gate: &'a Gate,
    }

    impl coli_store::IoQueue for GatedQueue<'_> {
        fn submit(&mut self, req: coli_store::ReadRequest) {
            self.inner.submit(req);
        }
        fn wait(&mut self) -> Option<coli_store::Completion> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.inner.outstanding() > 0 {
                self.gate.pass();
            }
            let mut c = self.inner.wait()?;
            let panic = &self.gate.panic_next;
            if panic
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                panic!("injected panic in a read");
            }
            let fail = &self.gate.fail_next;
            if fail
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                c.result = Err(coli_store::ReadError {
                    path: "injected".into(),
                    offset: 0,
                    len: c.buf.len(),
                    tag: c.tag,
                    error: std::io::Error::other("injected read error"),
                });
            }
            Some(c)
        }
        fn outstanding(&self) -> usize {
            self.inner.outstanding()
        }
    }

    impl coli_store::EngineLayer for GatedEngine {
        fn inner(&self) -> &dyn coli_store::IoEngine {
            &*self.inner
        }
        fn describe_layer(&self) -> String {
            format!("{} (gated)", self.inner.describe())
        }
        fn wrap_queue<'a>(
            &'a self,
            inner: Box<dyn coli_store::IoQueue + 'a>,
        ) -> Box<dyn coli_store::IoQueue + 'a> {
            Box::new(GatedQueue {
                inner,
                gate: &self.gate,
            })
        }
    }

    /// The store in `tmp` opened over its real I/O engine wrapped in a [`Gate`] (open).
    fn gated(tmp: &tempfile::TempDir) -> (Store, Arc<Gate>) {
        let gate = Arc::new(Gate {
            open: Mutex::new(true),
            cv: Condvar::new(),
            timed_out: Default::default(),
            fail_next: Default::default(),
            panic_next: Default::default(),
        });
        let g = Arc::clone(&gate);
        let wrapper = Arc::new(
            move |inner: Arc<dyn coli_store::IoEngine>| -> Arc<dyn coli_store::IoEngine> {
                Arc::new(GatedEngine {
                    inner,
                    gate: Arc::clone(&g),
                })
            },
        );
        let store = Store::open_with(
            tmp.path().join("s.coli"),
            &coli_store::OpenOptions {
                engine_wrapper: Some(wrapper),
                ..Default::default()
            },
        )
        .unwrap();
        (store, gate)
    }

    /// A prefetch of `keys` held at the (closed) gate, then a demand request for them that
    /// waits on the prefetch's read, then the gate opened: the prefetch thread's outcome (Err
    /// when it panicked) and the demand request's result.
    #[allow(clippy::type_complexity)]
    fn prefetch_then_demand(
        cache: &ExpertCache,
        store: &Store,
        gate: &Gate,
        keys: &[ExpertKey],
    ) -> (
        std::thread::Result<Result<usize>>,
        Result<Vec<Arc<ExpertBuf>>>,
    ) {
        gate.set(false);
        std::thread::scope(|s| {
            let prefetch = s.spawn(|| cache.prefetch(store, keys));
            // Once the prefetch read is in flight, the demand request waits for it.
            while cache.absent(keys).len() == keys.len() {
                std::thread::yield_now();
            }
            let demand = s.spawn(|| cache.get_many(store, keys));
            while cache.stats().inflight_waits == 0 {
                std::thread::yield_now();
            }
            gate.set(true);
            (prefetch.join(), demand.join().unwrap())
        })
    }

    #[test]
    fn a_demand_request_waiting_on_a_failed_prefetch_reads_the_expert_itself() {
        use std::sync::atomic::Ordering::SeqCst;
        let (tmp, _) = tiny_store(4);
        let (store, gate) = gated(&tmp);
        let keys = [ExpertKey::new(0, 0)];
        let cache = ExpertCache::new(u64::MAX);
        gate.fail_next.store(1, SeqCst);
        let (prefetched, got) = prefetch_then_demand(&cache, &store, &gate, &keys);
        let prefetched = prefetched.unwrap();
        assert!(!gate.timed_out.load(SeqCst));
        let err = prefetched.unwrap_err().to_string();
        assert!(err.contains("injected read error"), "{err}");
        let got = got.unwrap();
        assert_eq!(got[0].key, keys[0]);
        assert_eq!(got[0].bytes(), store.fetch_one(keys[0]).unwrap().bytes());
        // The failed wait became a miss read on demand, not a hit.
        let s = cache.stats();
        assert_eq!((s.hits, s.inflight_waits, s.misses), (0, 0, 1), "{s:?}");
        assert_eq!(
            (s.fetch_calls, s.demand_bytes),
            (2, got[0].len_bytes() as u64)
        );
        assert_eq!((s.prefetch_reads, s.prefetch_used), (0, 0), "{s:?}");
        assert_eq!(cache.absent(&keys), vec![]);
    }

    #[test]
    fn a_read_that_panics_fails_its_waiters_instead_of_blocking_them() {
        use std::sync::atomic::Ordering::SeqCst;
        let (tmp, _) = tiny_store(4);
        let (store, gate) = gated(&tmp);
        let keys = [ExpertKey::new(0, 1)];
        let cache = ExpertCache::new(u64::MAX);
        gate.panic_next.store(1, SeqCst);
        let (prefetched, got) = prefetch_then_demand(&cache, &store, &gate, &keys);
        assert!(prefetched.is_err(), "the prefetch read panicked");
        assert!(!gate.timed_out.load(SeqCst));
        let got = got.unwrap();
        assert_eq!(got[0].bytes(), store.fetch_one(keys[0]).unwrap().bytes());
        assert_eq!(cache.stats().misses, 1);
        // Nothing is left in flight: a new request reads nothing and waits for nothing.
        assert!(cache.absent(&keys).is_empty());
        assert_eq!(cache.get_many(&store, &keys).unwrap()[0].key, keys[0]);
    }

    #[test]
    fn demand_reads_run_while_the_experts_in_ram_are_used() {
        // 2 experts in RAM of 3 MiB each: above OVERLAP_MIN_READY_BYTES.
        let (tmp, _) = store_of(4, 1024, 2048);
        let (store, gate) = gated(&tmp);
        let keys: Vec<ExpertKey> = (0..4).map(|e| ExpertKey::new(0, e)).collect();
        let cache = ExpertCache::new(u64::MAX);
        cache.get_many(&store, &keys[1..3]).unwrap();
        // From now on a read completes only once `meanwhile` has seen the experts in RAM: a
        // cache that read its misses before calling it would wait 10 s and fail below.
        gate.set(false);
        let (bufs, seen) = cache
            .get_many_while(&store, &keys, |ready| {
                let seen: Vec<bool> = ready.iter().map(Option::is_some).collect();
                gate.set(true);
                seen
            })
            .unwrap();
        assert!(!gate.timed_out.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(seen, vec![false, true, true, false]);
        for (b, k) in bufs.iter().zip(&keys) {
            assert_eq!(b.key, *k);
            assert_eq!(b.bytes(), store.fetch_one(*k).unwrap().bytes());
        }
        let s = cache.stats();
        assert_eq!((s.hits, s.misses), (2, 4), "{s:?}");
        assert_eq!(store.stats().reads, 4 + 4);

        // A failed demand read is an error naming the experts, after `meanwhile` ran.
        let fresh = ExpertCache::new(u64::MAX);
        let bad = [ExpertKey::new(0, 9)];
        let mut ran = false;
        let Err(err) = fresh.get_many_while(&store, &bad, |_| ran = true) else {
            panic!("a key not in the store was served");
        };
        assert!(ran);
        assert!(err.to_string().contains("layer 0 expert 9"), "{err}");

        // Too little in RAM to overlap with: the misses are read before `meanwhile` runs.
        let (_t, small) = tiny_store(4);
        let cache = ExpertCache::new(u64::MAX);
        cache.get_many(&small, &keys[..1]).unwrap();
        let (_, reads_seen) = cache
            .get_many_while(&small, &keys, |_| small.stats().reads)
            .unwrap();
        assert_eq!(reads_seen, 4, "the three misses were read first");
        assert_eq!(cache.stats().io_hidden_ns, 0);
    }

    #[test]
    fn a_request_larger_than_the_lru_tier_is_split_in_groups_that_fit_it() {
        let (_tmp, store) = tiny_store(8);
        let keys: Vec<ExpertKey> = (0..8).map(|e| ExpertKey::new(0, e)).collect();
        let one = coli_store::held_bytes_for(store.record(keys[0]).unwrap().length.get());
        // Unbounded, or a request that fits: one group, in the order given.
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(
            ExpertCache::new(u64::MAX).request_groups(&store, &keys),
            std::slice::from_ref(&all)
        );
        assert_eq!(
            ExpertCache::new(8 * one).request_groups(&store, &keys),
            [all]
        );
        assert_eq!(
            ExpertCache::new(8 * one).request_groups(&store, &[]),
            [Vec::<usize>::new()]
        );
        // Pinned experts cost nothing; the tiers' experts come first, then the prefetched ones,
        // then those on disk; each group holds at most the LRU capacity (2 experts).
        let cache = ExpertCache::new(4 * one);
        cache.pin(&store, &keys[6..8]).unwrap();
        cache.get_many(&store, &keys[3..5]).unwrap();
        // The LRU tier is full: the prefetched expert waits outside it.
        assert_eq!(cache.prefetch(&store, &keys[1..2]).unwrap(), 1);
        assert_eq!(cache.lru_capacity(), 2 * one);
        let groups = cache.request_groups(&store, &keys);
        assert_eq!(groups, [vec![3, 4, 6, 7], vec![1, 0], vec![2, 5]]);
        // The groups give the same experts as one request, none holding more than the LRU
        // tier, and the prediction is scored once, for the whole request.
        cache.set_prediction(0, vec![0, 5]);
        cache.score_prediction(&keys);
        for (g, at) in groups.iter().enumerate() {
            let ks: Vec<ExpertKey> = at.iter().map(|&i| keys[i]).collect();
            let (bufs, ()) = cache
                .get_group_while(&store, &ks, g + 1 == groups.len(), |_| ())
                .unwrap();
            for (b, k) in bufs.iter().zip(&ks) {
                assert_eq!(b.key, *k);
            }
        }
        let s = cache.stats();
        assert_eq!(
            (s.predicted, s.predicted_used, s.demanded_after_prediction),
            (2, 2, 8)
        );
        assert!(s.largest_request_bytes <= 2 * one, "{s:?}");
        assert!(cache.used() <= cache.capacity());
        // An LRU tier of nothing (all pinned): one expert per group; an expert larger than
        // the tier gets a group of its own.
        let cache = ExpertCache::new(2 * one);
        cache.pin(&store, &keys[..2]).unwrap();
        assert_eq!(cache.lru_capacity(), 0);
        assert_eq!(
            cache.request_groups(&store, &keys[..4]),
            [vec![0, 1], vec![2], vec![3]]
        );
        let tiny = ExpertCache::new(one / 2);
        assert_eq!(
            tiny.request_groups(&store, &keys[..3]),
            [vec![0], vec![1], vec![2]]
        );
    }
}
