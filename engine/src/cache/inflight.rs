//! Reads in flight: the table that makes sure an expert is never read twice at once.
//!
//! A request that is about to read a key registers it ([`InFlight::start`]) and gets a
//! [`ReadSlot`]; any other request for that key meanwhile takes the same slot
//! ([`InFlight::waiter`]) and blocks on it ([`ReadSlot::wait`]) instead of reading again. The
//! reader removes the key from the table ([`InFlight::finish`], under the cache's lock, in the
//! same step that stores the result) and then hands the outcome to the waiters
//! ([`ReadSlot::complete`]). A failed read wakes the waiters with `None`: each then reads on its
//! own, so one failed prefetch never fails a demand request that could succeed. A reader that
//! panics must still finish and fail its slots (the expert cache does it in a drop guard), or
//! its waiters would block for ever.
//!
//! The table itself takes no lock: it lives inside the expert cache's state, behind the
//! cache's mutex. Only [`ReadSlot`] synchronizes, so waiting never holds the cache's lock.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The outcome of one read, shared by the reader and the requests waiting for it.
pub struct ReadSlot<V> {
    state: Mutex<Option<Outcome<V>>>,
    done: Condvar,
}

enum Outcome<V> {
    Done(V),
    Failed,
}

/// Locks a mutex; a panic in another holder leaves the value consistent (it is written in one
/// step), so the poison is ignored.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<V: Clone> ReadSlot<V> {
    fn new() -> Arc<ReadSlot<V>> {
        Arc::new(ReadSlot {
            state: Mutex::new(None),
            done: Condvar::new(),
        })
    }

    /// Publishes the outcome of the read (`Some(value)` when it succeeded, `None` when it
    /// failed) and wakes every waiter. Called once per slot.
    pub fn complete(&self, outcome: Option<V>) {
        *lock(&self.state) = Some(match outcome {
            Some(v) => Outcome::Done(v),
            None => Outcome::Failed,
        });
        self.done.notify_all();
    }

    /// Blocks until the read completes: the value, or `None` when the read failed (the caller
    /// then reads the key itself).
    pub fn wait(&self) -> Option<V> {
        let mut g = lock(&self.state);
        loop {
            match &*g {
                None => g = self.done.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(Outcome::Done(v)) => return Some(v.clone()),
                Some(Outcome::Failed) => return None,
            }
        }
    }
}

/// Completes every slot of a failed read with `None`.
pub fn fail_all<V: Clone>(slots: &[Arc<ReadSlot<V>>]) {
    for slot in slots {
        slot.complete(None);
    }
}

/// The keys being read right now, each with the slot its waiters block on.
pub struct InFlight<K, V> {
    reads: HashMap<K, Arc<ReadSlot<V>>>,
}

impl<K: Hash + Eq + Copy, V: Clone> InFlight<K, V> {
    /// No read in flight.
    pub fn new() -> Self {
        InFlight {
            reads: HashMap::new(),
        }
    }

    /// Whether `key` is being read.
    pub fn contains(&self, key: &K) -> bool {
        self.reads.contains_key(key)
    }

    /// The slot of the read of `key` in flight, to wait on; None when none is.
    pub fn waiter(&self, key: &K) -> Option<Arc<ReadSlot<V>>> {
        self.reads.get(key).cloned()
    }

    /// Registers a read of `key` by the caller, who must later [`InFlight::finish`] it and
    /// complete the returned slot. A key already in flight is a caller bug (it should have
    /// waited on [`InFlight::waiter`]); in release builds the new read replaces the old entry
    /// and both slots still complete.
    pub fn start(&mut self, key: K) -> Arc<ReadSlot<V>> {
        let slot = ReadSlot::new();
        let old = self.reads.insert(key, Arc::clone(&slot));
        debug_assert!(old.is_none(), "a key was read twice at once");
        slot
    }

    /// Removes `key` from the table once its read, the one of `slot`, has ended (the result is
    /// stored where the next request finds it, or the read failed). An entry of another read
    /// of `key` (started after this one was removed) is left alone.
    pub fn finish(&mut self, key: &K, slot: &Arc<ReadSlot<V>>) {
        if self.reads.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            self.reads.remove(key);
        }
    }

    /// Reads in flight.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.reads.len()
    }

    /// True when nothing is in flight.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }
}

impl<K: Hash + Eq + Copy, V: Clone> Default for InFlight<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// An in-memory "source": reading key k gives `k * 10` after a short delay, counting reads.
    /// Each request either waits on a read in flight or starts (and completes) its own.
    fn get(
        table: &Mutex<InFlight<u32, Arc<u64>>>,
        store: &Mutex<HashMap<u32, Arc<u64>>>,
        reads: &AtomicUsize,
        k: u32,
    ) -> Arc<u64> {
        let slot = {
            let mut t = lock(table);
            if let Some(v) = lock(store).get(&k) {
                return Arc::clone(v);
            }
            match t.waiter(&k) {
                Some(w) => Err(w),
                None => Ok(t.start(k)),
            }
        };
        match slot {
            Err(w) => w.wait().expect("reads do not fail here"),
            Ok(mine) => {
                reads.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
                let v = Arc::new(k as u64 * 10);
                {
                    let mut t = lock(table);
                    lock(store).insert(k, Arc::clone(&v));
                    t.finish(&k, &mine);
                }
                mine.complete(Some(Arc::clone(&v)));
                v
            }
        }
    }

    #[test]
    fn concurrent_requests_for_one_key_read_it_once() {
        let table = Mutex::new(InFlight::new());
        let store = Mutex::new(HashMap::new());
        let reads = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..8u32 {
                let (table, store, reads) = (&table, &store, &reads);
                s.spawn(move || {
                    for k in 0..4u32 {
                        let k = (k + i) % 4;
                        assert_eq!(*get(table, store, reads, k), k as u64 * 10);
                    }
                });
            }
        });
        assert_eq!(
            reads.load(Ordering::SeqCst),
            4,
            "each key read exactly once"
        );
        assert!(lock(&table).is_empty());
    }

    #[test]
    fn a_failed_read_wakes_every_waiter_with_none() {
        let mut table: InFlight<u32, u64> = InFlight::new();
        let slot = table.start(7);
        assert!(table.contains(&7) && table.len() == 1);
        let waiters: Vec<_> = (0..3).map(|_| table.waiter(&7).unwrap()).collect();
        assert!(table.waiter(&8).is_none());
        std::thread::scope(|s| {
            let hs: Vec<_> = waiters.iter().map(|w| s.spawn(|| w.wait())).collect();
            std::thread::sleep(Duration::from_millis(5));
            table.finish(&7, &slot);
            fail_all(std::slice::from_ref(&slot));
            for h in hs {
                assert_eq!(h.join().unwrap(), None);
            }
        });
        assert!(table.is_empty());
        // The key can be read again afterwards, and a completed slot answers at once. Finishing
        // with an older read's slot leaves the newer read in the table.
        let again = table.start(7);
        table.finish(&7, &slot);
        assert!(table.contains(&7));
        again.complete(Some(70));
        assert_eq!(again.wait(), Some(70));
        assert_eq!(table.waiter(&7).unwrap().wait(), Some(70));
        table.finish(&7, &again);
        assert!(table.is_empty());
    }
}
