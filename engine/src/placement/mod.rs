//! Placement policy: where the experts live while the engine runs. Placement only changes
//! speed, never results (tests/tests/placement.rs checks every family).
//!
//! - [`budget`]: the expert budget (`--ram-budget`, else from `MemAvailable` capped by the
//!   memory cgroup), the share of it the pinned hot set may take, and how many sequences' KV
//!   caches fit beside it.
//! - [`gate`]: [`PrefetchGate`], whether a forward pass's lookahead reads what it predicts.
//! - [`PlacementPolicy`] puts them together for one engine: it builds the
//!   [`ExpertCache`] (budget; the hottest experts of the usage history pinned), decides before
//!   each forward pass what the lookahead does ([`Lookahead`]) and merges the routing counts
//!   back into the usage history ([`crate::usage`]) as tokens run.
//!
//! The mechanisms live elsewhere: the tiers and reads in [`crate::cache`], the lookahead and
//! its prefetch thread in [`crate::prefetch`], the history file in [`crate::usage`].

pub mod budget;
pub mod gate;

pub use budget::{
    decode_step_bytes, default_ram_budget, mem_available_bytes, memory_limit_bytes, pin_bytes,
    pinned_set, sequences_that_fit, store_expert_budget, store_held_bytes, BUDGET_RESERVE_BYTES,
    DEFAULT_PIN_SHARE, MAX_SEQUENCES,
};
pub use gate::{PrefetchGate, DEFAULT_PREFETCH_MIN_USE, PREFETCH_PROBE_EVERY};

use crate::cache::{CacheStats, ExpertCache};
use crate::error::Result;
use crate::options::EngineOptions;
use crate::usage::{UsageError, UsageHistory, SAVE_EVERY_TOKENS};
use coli_format::ExpertKey;
use coli_store::Store;
use std::collections::HashMap;
use std::path::PathBuf;

/// Where the expert budget goes, as set up by [`PlacementPolicy::new`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct Placement {
    /// The expert budget, bytes (pinned + LRU tiers; `u64::MAX` = unbounded).
    pub budget: u64,
    /// Whether the budget came from the available memory (no `ram_budget` given).
    pub budget_from_available_memory: bool,
    /// The memory this process could use when the engine started, before the model loaded
    /// ([`memory_limit_bytes`]; the default budget is derived from it), bytes; None when it
    /// could not be read.
    pub memory_limit: Option<u64>,
    /// Experts pinned at start.
    pub pinned_experts: usize,
    /// Bytes of the pinned experts.
    pub pinned_bytes: u64,
    /// Capacity of the LRU tier, bytes.
    pub lru_capacity: u64,
    /// Whether every expert of the store was read and pinned at start because the budget
    /// holds them all (`EngineOptions::preload`): decode then reads nothing.
    pub preloaded: bool,
    /// Router lookahead prefetch on.
    pub prefetch: bool,
    /// The usage-history file, if any.
    pub usage: Option<PathBuf>,
    /// Tokens merged into the usage history as read at start (decayed), 0 without one.
    pub usage_tokens: f64,
}

/// What the router lookahead does in one forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookahead {
    /// Nothing (`--no-prefetch`).
    Off,
    /// Predict each layer's experts and score the predictions, read nothing (the gate paused
    /// the reads).
    Predict,
    /// Predict, score and read the predicted experts that are not in RAM.
    PredictAndRead,
}

/// The placement decisions of one engine (see the module doc).
pub struct PlacementPolicy {
    placement: Placement,
    gate: PrefetchGate,
    /// Tokens run through the model since the usage counts were last merged into the file.
    unsaved_tokens: u64,
    warnings: Vec<String>,
}

impl PlacementPolicy {
    /// Sets up placement for a model over `store` whose KV cache takes `kv_bytes` at full
    /// context and whose decoder has `num_layers` layers routing `top_k` experts per token: the
    /// budget (`opts.ram_budget`, else [`default_ram_budget`], else unbounded), the usage
    /// history read from `opts.usage` (a corrupt file or one of another store becomes a
    /// warning and is neither used nor written), and, with `opts.pin`, the hottest experts of
    /// the history pinned within [`pin_bytes`]. Returns the policy and the cache it set up.
    ///
    /// # Errors
    /// [`crate::EngineError::Store`] when reading the experts to pin fails.
    pub fn new(
        store: &Store,
        opts: &EngineOptions,
        kv_bytes: u64,
        memory_limit: Option<u64>,
        num_layers: usize,
        top_k: usize,
    ) -> Result<(PlacementPolicy, ExpertCache)> {
        // As default_ram_budget, with the memory limit the caller measured before the model
        // loaded (under a memory cgroup the dense pages read at load count as usage, and the
        // budget subtracts them again).
        let budget = match (opts.ram_budget, memory_limit) {
            (Some(b), _) => b,
            (None, Some(available)) => store_expert_budget(store, available, kv_bytes),
            (None, None) => u64::MAX,
        };
        let cache = ExpertCache::new(budget);
        let mut policy = PlacementPolicy {
            placement: Placement {
                budget,
                budget_from_available_memory: opts.ram_budget.is_none(),
                memory_limit,
                pinned_experts: 0,
                pinned_bytes: 0,
                lru_capacity: budget,
                preloaded: false,
                prefetch: opts.prefetch,
                usage: opts.usage.clone(),
                usage_tokens: 0.0,
            },
            gate: PrefetchGate::new(opts.prefetch_min_use),
            unsaved_tokens: 0,
            warnings: Vec::new(),
        };
        if let Some(history) = policy.load_history(store) {
            policy.placement.usage_tokens = history.tokens;
            if opts.pin {
                let step = decode_step_bytes(store, num_layers, top_k);
                let hottest = history.hottest().into_iter().map(|x| x.0);
                let (set, _) = pinned_set(store, hottest, pin_bytes(budget, opts.pin_share, step));
                cache.pin(store, &set)?;
            }
        }
        if opts.preload {
            policy.placement.preloaded = preload_all(store, &cache, budget)?;
        }
        policy.warnings.extend(uncacheable_warning(store, &cache));
        let (n, bytes) = cache.pinned();
        policy.placement.pinned_experts = n;
        policy.placement.pinned_bytes = bytes;
        policy.placement.lru_capacity = cache.lru_capacity();
        Ok((policy, cache))
    }

    /// The usage history of the configured file; None without one, or with a warning when it
    /// cannot be read.
    fn load_history(&mut self, store: &Store) -> Option<UsageHistory> {
        let path = self.placement.usage.as_ref()?;
        match UsageHistory::load_locked(path, store.manifest().store_id) {
            Ok(h) => h,
            Err(err @ (UsageError::Corrupt { .. } | UsageError::OtherStore { .. })) => {
                // Not this store's history: never overwritten, so not updated either.
                self.placement.usage = None;
                self.warnings.push(format!(
                    "{err}: it is ignored and left unchanged, and this run keeps no usage \
                     history (delete the file or pass another --usage FILE)"
                ));
                None
            }
            Err(err) => {
                self.warnings.push(err.to_string());
                None
            }
        }
    }

    /// Where the expert budget went.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The prefetch gate (its estimate of the share of prefetched experts used, the passes
    /// it ran without reads).
    pub fn gate(&self) -> &PrefetchGate {
        &self.gate
    }

    /// What the lookahead of the next forward pass does, given the cache's counters so far.
    /// The lookahead predicts (and scores its predictions) on every pass; the gate decides
    /// whether the pass also reads the predicted experts.
    pub fn next_pass(&mut self, stats: &CacheStats) -> Lookahead {
        if !self.placement.prefetch {
            Lookahead::Off
        } else if self.gate.allow(stats.prefetch_reads, stats.prefetch_used) {
            Lookahead::PredictAndRead
        } else {
            Lookahead::Predict
        }
    }

    /// Notes that `tokens` more tokens ran through the model; merges the routing counts into
    /// the usage history every [`SAVE_EVERY_TOKENS`] tokens.
    pub fn tokens_ran(&mut self, tokens: u64, store: &Store, cache: &ExpertCache) {
        self.unsaved_tokens += tokens;
        if self.unsaved_tokens >= SAVE_EVERY_TOKENS {
            self.save_usage(store, cache);
        }
    }

    /// Merges the routing counts since the last save into the usage-history file (under its
    /// lock, atomically; see [`crate::usage`]). Nothing happens without a usage file or when no
    /// token ran since the last save. A failure becomes a warning and ends the saves of this
    /// policy.
    pub fn save_usage(&mut self, store: &Store, cache: &ExpertCache) {
        let Some(path) = self.placement.usage.clone() else {
            return;
        };
        let routed: HashMap<ExpertKey, u64> = cache.take_usage();
        let tokens = std::mem::take(&mut self.unsaved_tokens);
        if tokens == 0 && routed.is_empty() {
            return;
        }
        let id = store.manifest().store_id;
        if let Err(err) = UsageHistory::merge_into_file(&path, id, &routed, tokens) {
            self.placement.usage = None;
            self.warnings.push(format!(
                "saving the usage history: {err} (not saved again in this run)"
            ));
        }
    }

    /// Warnings since the last call (an unreadable or corrupt usage history, a failed save).
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }
}

/// Reads and pins every expert record of `store` when their buffers
/// ([`coli_store::held_bytes_for`] of each INDEX length) fit in `budget` together (the pinned
/// ones included), so that a model the budget holds never reads during decode (llama.cpp reads
/// its whole file at load for the same reason). Returns whether it did; an empty store or one
/// the budget cannot hold is left alone.
///
/// # Errors
/// [`crate::EngineError::Store`] when a read fails.
fn preload_all(store: &Store, cache: &ExpertCache, budget: u64) -> Result<bool> {
    let index = store.index();
    if index.is_empty() || budget::store_held_bytes(store) > budget {
        return Ok(false);
    }
    let keys: Vec<ExpertKey> = index.iter().map(|r| r.key()).collect();
    cache.pin(store, &keys)?;
    Ok(true)
}

/// A warning when some expert records cannot be cached at all: records that are not pinned
/// and take more than the LRU tier's capacity (by the bytes the cache charges,
/// [`coli_store::held_bytes_for`]) are read from disk every time a token uses them. Names how
/// many, in which layers, and the `--ram-budget` that caches the largest: its held bytes, with
/// `--no-pin` where a usage history's hot set is pinned (a larger budget pins more, in whole
/// records, so no single figure holds with pinning). None when every unpinned record fits.
fn uncacheable_warning(store: &Store, cache: &ExpertCache) -> Option<String> {
    let lru = cache.lru_capacity();
    let (pinned_n, pinned_bytes) = cache.pinned();
    let (mut unpinned, mut too_big) = (0usize, 0usize);
    let (mut smallest, mut largest) = (u64::MAX, 0u64);
    let mut layers = std::collections::BTreeSet::new();
    for r in store.index().iter().filter(|r| !cache.is_pinned(r.key())) {
        let held = coli_store::held_bytes_for(r.length.get());
        unpinned += 1;
        smallest = smallest.min(held);
        largest = largest.max(held);
        if held > lru {
            too_big += 1;
            layers.insert(r.layer.get());
        }
    }
    if too_big == 0 {
        return None;
    }
    let bytes = |n: u64| {
        if n == 1 {
            "1 byte".to_string()
        } else {
            format!("{n} bytes")
        }
    };
    let (pinned, need) = if pinned_n > 0 {
        (
            format!(
                " beside the pinned hot set ({pinned_n} {}, {})",
                if pinned_n == 1 { "expert" } else { "experts" },
                bytes(pinned_bytes)
            ),
            format!(
                "give --ram-budget at least {} with --no-pin, or a larger budget (the hot set \
                 takes up to --pin-share of it)",
                bytes(largest)
            ),
        )
    } else {
        (
            String::new(),
            format!("give --ram-budget at least {}", bytes(largest)),
        )
    };
    let held = if smallest == largest {
        format!("{} as held", bytes(largest))
    } else {
        format!("{smallest} to {} as held", bytes(largest))
    };
    Some(if too_big == unpinned {
        let (none, every) = if pinned_n > 0 {
            ("no expert outside the hot set", "every other")
        } else {
            ("no expert", "every")
        };
        format!(
            "the expert budget leaves {} for cached experts{pinned}, less than any expert record \
             ({held}): {none} is cached, {every} routed expert is read from disk each time a \
             token uses it; {need} to cache them",
            bytes(lru)
        )
    } else {
        let list: Vec<String> = layers.iter().take(8).map(u32::to_string).collect();
        let more = if layers.len() > 8 { ", ..." } else { "" };
        format!(
            "{too_big} of {unpinned} unpinned expert records (layers {}{more}; up to {} as held) \
             are larger than the {} the expert budget leaves for cached experts{pinned}: they \
             are read from disk each time a token uses them; {need} to cache them too",
            list.join(", "),
            bytes(largest),
            bytes(lru)
        )
    })
}
