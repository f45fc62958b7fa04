//! The RAM expert cache: a least-recently-used map from [`ExpertKey`] to fetched experts,
//! bounded in bytes (`--ram-budget`).
//!
//! [`LruCache`] is a generic byte-bounded LRU (hash map + doubly linked list in a slab: every
//! operation O(1)); [`ExpertCache`] specializes it to `Arc<ExpertBuf>` and fetches all misses of
//! a request with ONE [`Store::fetch`] call.

use crate::error::{store_err, Result};
use coli_store::{ExpertBuf, ExpertKey, Store};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

const NIL: usize = usize::MAX;

struct Node<K, V> {
    key: K,
    value: Option<V>,
    bytes: u64,
    prev: usize,
    next: usize,
}

/// A least-recently-used cache bounded by the sum of its entries' sizes in bytes.
///
/// Inserting evicts least-recently-used entries until the new entry fits; an entry larger than
/// the whole capacity is not kept. `get` and `insert` are O(1).
pub struct LruCache<K, V> {
    capacity: u64,
    used: u64,
    map: HashMap<K, usize>,
    nodes: Vec<Node<K, V>>,
    free: Vec<usize>,
    head: usize, // most recently used
    tail: usize, // least recently used
    evictions: u64,
}

impl<K: Hash + Eq + Clone, V> LruCache<K, V> {
    /// An empty cache holding at most `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        LruCache {
            capacity,
            used: 0,
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            evictions: 0,
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries evicted since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev != NIL {
            self.nodes[prev].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// The value for `key`, marked most recently used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let i = *self.map.get(key)?;
        self.unlink(i);
        self.push_front(i);
        self.nodes[i].value.as_ref()
    }

    /// Whether `key` is held (does not change recency).
    pub fn contains(&self, key: &K) -> bool {
        self.map.contains_key(key)
    }

    fn evict_lru(&mut self) {
        let i = self.tail;
        debug_assert!(i != NIL);
        self.unlink(i);
        let node = &mut self.nodes[i];
        node.value = None;
        self.used -= node.bytes;
        let key = node.key.clone();
        self.map.remove(&key);
        self.free.push(i);
        self.evictions += 1;
    }

    /// Inserts `value` of `bytes` bytes as most recently used, evicting least-recently-used
    /// entries until it fits. Returns false (and keeps nothing) when `bytes > capacity`.
    pub fn insert(&mut self, key: K, value: V, bytes: u64) -> bool {
        if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            self.used -= self.nodes[i].bytes;
            self.map.remove(&key);
            self.nodes[i].value = None;
            self.free.push(i);
        }
        if bytes > self.capacity {
            return false;
        }
        while self.used + bytes > self.capacity {
            self.evict_lru();
        }
        let node = Node {
            key: key.clone(),
            value: Some(value),
            bytes,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.push_front(i);
        self.map.insert(key, i);
        self.used += bytes;
        true
    }
}

/// Counters of the expert cache since the engine was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Expert lookups served from RAM.
    pub hits: u64,
    /// Expert lookups that needed a fetch from the store.
    pub misses: u64,
    /// Experts dropped to make room.
    pub evictions: u64,
    /// Bytes of expert records fetched from the store (sum of `ExpertBuf::len_bytes`).
    pub bytes_fetched: u64,
    /// `Store::fetch` calls made.
    pub fetch_calls: u64,
}

impl CacheStats {
    /// hits / (hits + misses); 1.0 before any lookup.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            1.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// The engine's expert cache: [`LruCache`] of `Arc<ExpertBuf>` keyed by [`ExpertKey`], with
/// hit/miss/fetch counters.
pub struct ExpertCache {
    lru: LruCache<ExpertKey, Arc<ExpertBuf>>,
    stats: CacheStats,
}

impl ExpertCache {
    /// An empty cache of `capacity` bytes (`u64::MAX`: unbounded).
    pub fn new(capacity: u64) -> ExpertCache {
        ExpertCache {
            lru: LruCache::new(capacity),
            stats: CacheStats::default(),
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.lru.capacity()
    }

    /// Bytes of experts held.
    pub fn used(&self) -> u64 {
        self.lru.used()
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            evictions: self.lru.evictions(),
            ..self.stats
        }
    }

    /// The experts `keys` (no duplicates), in the order given: hits from RAM, every miss read with
    /// ONE `store.fetch` call and inserted (evicting least-recently-used experts). The returned
    /// `Arc`s keep every expert of the request alive even when the budget is smaller than the
    /// request.
    ///
    /// # Errors
    /// [`crate::EngineError::Store`] when the fetch fails (I/O, checksum, missing record).
    pub fn get_many(&mut self, store: &Store, keys: &[ExpertKey]) -> Result<Vec<Arc<ExpertBuf>>> {
        let mut out: Vec<Option<Arc<ExpertBuf>>> = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for k in keys {
            match self.lru.get(k) {
                Some(v) => {
                    self.stats.hits += 1;
                    out.push(Some(Arc::clone(v)));
                }
                None => {
                    self.stats.misses += 1;
                    missing.push(*k);
                    out.push(None);
                }
            }
        }
        if !missing.is_empty() {
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
            let bufs = store.fetch(&missing).map_err(store_err(what))?;
            self.stats.fetch_calls += 1;
            let mut fetched: HashMap<ExpertKey, Arc<ExpertBuf>> =
                HashMap::with_capacity(bufs.len());
            for b in bufs {
                self.stats.bytes_fetched += b.len_bytes() as u64;
                fetched.insert(b.key, Arc::new(b));
            }
            for (slot, k) in out.iter_mut().zip(keys) {
                if slot.is_none() {
                    let b = fetched
                        .get(k)
                        .cloned()
                        .ok_or_else(|| crate::EngineError::Store {
                            what: format!("fetching {k}"),
                            source: coli_store::StoreError::NotFound(format!(
                                "{k} (fetch returned other experts)"
                            )),
                        })?;
                    self.lru.insert(*k, Arc::clone(&b), b.len_bytes() as u64);
                    *slot = Some(b);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|s| s.expect("every slot filled above"))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent_by_bytes() {
        let mut c: LruCache<u32, String> = LruCache::new(10);
        assert!(c.insert(1, "a".into(), 4));
        assert!(c.insert(2, "b".into(), 4));
        assert_eq!(c.get(&1).map(String::as_str), Some("a")); // 1 is now most recent
        assert!(c.insert(3, "c".into(), 4)); // evicts 2
        assert!(c.contains(&1) && !c.contains(&2) && c.contains(&3));
        assert_eq!(c.evictions(), 1);
        assert_eq!(c.used(), 8);
        assert!(!c.insert(4, "big".into(), 11));
        assert!(!c.contains(&4));
        assert!(c.insert(5, "e".into(), 10)); // evicts both
        assert_eq!(c.len(), 1);
        assert_eq!(c.evictions(), 3);
        // Reinserting an existing key replaces it without counting an eviction.
        assert!(c.insert(5, "f".into(), 6));
        assert_eq!((c.len(), c.used(), c.evictions()), (1, 6, 3));
        assert_eq!(c.get(&5).map(String::as_str), Some("f"));
    }

    #[test]
    fn lru_many_ops_keep_invariants() {
        let mut c: LruCache<u32, u32> = LruCache::new(50);
        for i in 0..1000u32 {
            c.insert(i % 37, i, (i % 7 + 1) as u64);
            if i % 3 == 0 {
                c.get(&(i % 11));
            }
            assert!(c.used() <= 50);
        }
        let total: u64 = c.map.values().map(|&i| c.nodes[i].bytes).sum();
        assert_eq!(total, c.used());
        // Walk the list: every linked node is in the map.
        let (mut n, mut i) = (0, c.head);
        while i != NIL {
            n += 1;
            i = c.nodes[i].next;
        }
        assert_eq!(n, c.len());
    }

    #[test]
    fn hit_rate() {
        let s = CacheStats {
            hits: 3,
            misses: 1,
            ..Default::default()
        };
        assert_eq!(s.hit_rate(), 0.75);
        assert_eq!(CacheStats::default().hit_rate(), 1.0);
    }
}
