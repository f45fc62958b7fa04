//! The RAM expert cache (`--ram-budget`): a pinned tier that is never evicted plus a
//! least-recently-used tier, both bounded together in bytes, shared by the engine's compute
//! thread and its prefetch thread.
//!
//! One job per file:
//! - [`lru`]: [`LruCache`], a generic byte-bounded LRU (hash map + doubly linked list in a
//!   slab: every operation O(1)).
//! - `inflight`: the reads in flight, so that an expert is never read twice at once (a
//!   request for an expert being read waits for that read).
//! - [`stats`]: [`CacheStats`], the counters (hits by tier, misses, demand and prefetch bytes,
//!   prediction precision and recall, I/O wait).
//! - [`expert_cache`]: [`ExpertCache`], which puts them together over a [`coli_store::Store`]:
//!   the pinned set ([`ExpertCache::pin`], chosen by [`crate::placement`] from the usage
//!   history) and the LRU tier whose capacity is the budget minus the pinned bytes.
//!   [`ExpertCache::get_many`] serves a request from RAM, waits for experts whose read is
//!   already in flight (issued by [`ExpertCache::prefetch`]) and reads every other miss with ONE
//!   [`coli_store::Store::fetch`] call. [`ExpertCache::set_prediction`] records the experts the
//!   lookahead router predicted for a layer; the next demand request of that layer counts how
//!   many of them it used (precision) and how many of its experts were predicted (recall).
//!
//! Which experts are pinned, how large the budget is and whether a forward pass prefetches is
//! decided by [`crate::placement`]; this module only keeps what it is given.
//!
//! Memory outside the budget: the experts of the request being computed (a request larger than
//! the budget keeps its experts alive until the layer is done), prefetched experts that did not
//! fit the LRU tier without evicting and wait for their layer (at most the two outstanding
//! prefetch requests, each capped by the LRU capacity and [`PREFETCH_MAX_BYTES`]), and the
//! store's fetch buffer pool (up to `fetch_threads` idle record buffers).

pub mod expert_cache;
pub(crate) mod inflight;
pub mod lru;
pub mod stats;

pub use expert_cache::{ExpertCache, Residency, OVERLAP_MIN_READY_BYTES, PREFETCH_MAX_BYTES};
pub use lru::LruCache;
pub use stats::CacheStats;
