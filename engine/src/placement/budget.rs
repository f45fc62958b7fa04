//! How many bytes the expert cache may hold and how many of them the pinned hot set may take.

use coli_format::ExpertKey;
use coli_store::Store;
use std::collections::HashMap;

/// Default share of the expert budget given to the pinned hot set (`--pin-share`).
pub const DEFAULT_PIN_SHARE: f64 = 0.5;

/// RAM left out of the default expert budget for everything else (activations, buffers in
/// flight, the tokenizer, the allocator's slack), bytes.
pub const BUDGET_RESERVE_BYTES: u64 = 512 << 20;

/// `MemAvailable` of /proc/meminfo in bytes; None when it cannot be read or parsed.
pub fn mem_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The expert budget left by `available` bytes of RAM: `available` minus the dense set
/// (`dense_bytes`, dense.bin, memory-mapped and read whole at load), the KV cache at full
/// context (`kv_bytes`) and [`BUDGET_RESERVE_BYTES`], and at least `largest_record` bytes (one
/// expert must fit). Bytes.
pub fn expert_budget(available: u64, dense_bytes: u64, kv_bytes: u64, largest_record: u64) -> u64 {
    available
        .saturating_sub(dense_bytes)
        .saturating_sub(kv_bytes)
        .saturating_sub(BUDGET_RESERVE_BYTES)
        .max(largest_record)
}

/// The default expert budget of `store` ([`expert_budget`] of [`mem_available_bytes`]) with a
/// KV cache of `kv_bytes` at full context. None when /proc/meminfo cannot be read (the budget
/// is then unbounded).
pub fn default_ram_budget(store: &Store, kv_bytes: u64) -> Option<u64> {
    let largest = store
        .index()
        .iter()
        .map(|r| r.length.get())
        .max()
        .unwrap_or(0);
    let dense = store.manifest().dense_file.length;
    Some(expert_budget(
        mem_available_bytes()?,
        dense,
        kv_bytes,
        largest,
    ))
}

/// Bytes the pinned hot set may take: `pin_share` of `budget`, capped at `budget - step_bytes`
/// when the budget exceeds one decode step ([`decode_step_bytes`]), so the LRU tier keeps at
/// least one step (a smaller LRU evicts within every step; measured in
/// engine/bench/PLACEMENT.md). At or below one step the share applies as asked.
pub fn pin_bytes(budget: u64, pin_share: f64, step_bytes: u64) -> u64 {
    let share = (budget as f64 * pin_share.clamp(0.0, 1.0)).min(u64::MAX as f64) as u64;
    if budget > step_bytes {
        share.min(budget - step_bytes)
    } else {
        share
    }
}

/// The pinned hot set: `hottest` (most used first) taken in order while their bytes (INDEX
/// record lengths) fit in `max_bytes` (see [`pin_bytes`]); keys not in the store and repeats
/// are skipped, the first expert that does not fit ends the set. Returns the experts and their
/// bytes. `coli plan` and [`crate::placement::PlacementPolicy`] both choose with it.
pub fn pinned_set(
    store: &Store,
    hottest: impl IntoIterator<Item = ExpertKey>,
    max_bytes: u64,
) -> (Vec<ExpertKey>, u64) {
    let mut set: Vec<ExpertKey> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for k in hottest {
        let Some(r) = store.record(k) else { continue };
        if !seen.insert(k) {
            continue;
        }
        let len = r.length.get();
        if total + len > max_bytes {
            break;
        }
        total += len;
        set.push(k);
    }
    (set, total)
}

/// Bytes of the routed experts one decode step may read: for each expert layer of the decoder
/// (layers `0..num_layers`; the MTP layer excluded), `top_k` times the layer's largest record.
pub fn decode_step_bytes(store: &Store, num_layers: usize, top_k: usize) -> u64 {
    let mut largest: HashMap<u32, u64> = HashMap::new();
    for r in store.index() {
        let layer = r.layer.get();
        if (layer as usize) < num_layers {
            let m = largest.entry(layer).or_default();
            *m = (*m).max(r.length.get());
        }
    }
    largest.values().sum::<u64>() * top_k as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_what_is_left_but_at_least_one_expert() {
        let gib = 1u64 << 30;
        assert_eq!(
            expert_budget(8 * gib, 2 * gib, gib, 1 << 20),
            5 * gib - BUDGET_RESERVE_BYTES
        );
        assert_eq!(expert_budget(gib, 2 * gib, gib, 1 << 20), 1 << 20);
        assert!(mem_available_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn pin_bytes_leave_one_decode_step_to_the_lru_tier() {
        assert_eq!(pin_bytes(100, 0.5, 10), 50);
        assert_eq!(pin_bytes(100, 1.0, 10), 90);
        assert_eq!(pin_bytes(100, 0.95, 30), 70);
        // At or below one step the share applies as asked.
        assert_eq!(pin_bytes(10, 0.5, 10), 5);
        assert_eq!(pin_bytes(8, 1.0, 10), 8);
        assert_eq!(pin_bytes(100, 0.0, 10), 0);
        assert_eq!(pin_bytes(u64::MAX, 0.5, 10), u64::MAX / 2 + 1);
    }
}
