//! A generic least-recently-used map bounded by the bytes of its entries (hash map + doubly
//! linked list in a slab: every operation O(1)). The expert cache's LRU tier is one.

use std::collections::HashMap;
use std::hash::Hash;

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

    /// The value for `key`, mutable, marked most recently used.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.map.get(key)?;
        self.unlink(i);
        self.push_front(i);
        self.nodes[i].value.as_mut()
    }

    /// The value for `key` without changing its recency.
    pub fn peek_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = *self.map.get(key)?;
        self.nodes[i].value.as_mut()
    }

    /// Sets the capacity to `capacity` bytes, evicting least-recently-used entries until the
    /// held bytes fit.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
        while self.used > self.capacity {
            self.evict_lru();
        }
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
}
