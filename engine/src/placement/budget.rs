//! How many bytes the expert cache may hold and how many of them the pinned hot set may take;
//! the memory the process may use (MemAvailable capped by its memory cgroup) and how many
//! sequences' KV caches fit in it beside the dense set and the expert budget.

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

/// The memory this process may still use, bytes: [`mem_available_bytes`] capped by what its
/// memory cgroup leaves (the limit minus the usage, least over the process's cgroup and each
/// of its ancestors; cgroup v1 under /sys/fs/cgroup/memory, v2 under /sys/fs/cgroup). A cgroup
/// whose files cannot be read, or that has no limit, caps nothing. Conservative under a
/// cgroup: its usage includes page cache the kernel could reclaim (in cgroup v1
/// `memory.usage_in_bytes` counts the page cache charged to the group, the pages of a
/// memory-mapped dense.bin among them). None when neither /proc/meminfo nor a cgroup limit
/// can be read.
pub fn memory_limit_bytes() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_memory_left(&c, |p| std::fs::read_to_string(p).ok()));
    match (mem_available_bytes(), cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// A cgroup v1 `memory.limit_in_bytes` at or above this means no limit (the kernel writes
/// `PAGE_COUNTER_MAX` pages, about 2^63 bytes), bytes.
const CGROUP_V1_UNLIMITED: u64 = 1 << 60;

/// Bytes the memory cgroups of a process leave it, from `proc_self_cgroup` (the text of
/// /proc/self/cgroup) and `read` (a file's text by absolute path, None when unreadable): the
/// least `limit - usage` over the process's cgroup and its ancestors, in cgroup v1 (the line
/// whose controllers include `memory`: /sys/fs/cgroup/memory/PATH/memory.limit_in_bytes minus
/// memory.usage_in_bytes; a limit of 2^60 or more is none) and in cgroup v2 (the `0::PATH`
/// line: /sys/fs/cgroup/PATH/memory.max minus memory.current; `max` is none). A level whose
/// limit or usage cannot be read is skipped. None when no level has a limit. The ancestors
/// (up to the mount's root) also cover a container whose /proc/self/cgroup names a path of the
/// host while its own cgroup is mounted at the root.
fn cgroup_memory_left(
    proc_self_cgroup: &str,
    read: impl Fn(&str) -> Option<String>,
) -> Option<u64> {
    let number = |path: String| -> Option<u64> { read(&path)?.trim().parse().ok() };
    let mut least: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let v1 = controllers.split(',').any(|c| c == "memory");
        let v2 = id == "0" && controllers.is_empty();
        if !v1 && !v2 {
            continue;
        }
        let root = if v1 {
            "/sys/fs/cgroup/memory"
        } else {
            "/sys/fs/cgroup"
        };
        for dir in ancestors(path) {
            let dir = format!("{root}{dir}");
            let left = if v1 {
                let limit = number(format!("{dir}/memory.limit_in_bytes"));
                match limit {
                    Some(l) if l < CGROUP_V1_UNLIMITED => {
                        number(format!("{dir}/memory.usage_in_bytes")).map(|u| l.saturating_sub(u))
                    }
                    _ => None,
                }
            } else {
                let max = read(&format!("{dir}/memory.max"));
                match max.as_deref().map(str::trim) {
                    Some("max") | None => None,
                    Some(m) => match m.parse::<u64>() {
                        Ok(l) => {
                            number(format!("{dir}/memory.current")).map(|u| l.saturating_sub(u))
                        }
                        Err(_) => None,
                    },
                }
            };
            if let Some(left) = left {
                least = Some(least.map_or(left, |m| m.min(left)));
            }
        }
    }
    least
}

/// `path` (a cgroup path such as `/a/b`) and its ancestors, the root last, each without a
/// trailing slash (the root is the empty string): `/a/b`, `/a`, ``.
fn ancestors(path: &str) -> Vec<&str> {
    let mut dirs = Vec::new();
    let mut p = path.trim_end_matches('/');
    loop {
        dirs.push(p);
        match p.rfind('/') {
            Some(i) => p = &p[..i],
            None => break,
        }
        if p.is_empty() {
            dirs.push(p);
            break;
        }
    }
    dirs
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

/// Most sequences [`sequences_that_fit`] reports (what it reports when a sequence's KV cache
/// takes no bytes).
pub const MAX_SEQUENCES: usize = 4096;

/// How many sequences whose KV cache takes `kv_bytes_per_sequence` bytes each fit in
/// `available` bytes of RAM beside the dense set (`dense_bytes`), an expert budget of
/// `expert_budget` bytes and [`BUDGET_RESERVE_BYTES`] (the subtraction saturates at 0), at
/// most [`MAX_SEQUENCES`] (also the answer when `kv_bytes_per_sequence` is 0).
pub fn sequences_that_fit(
    available: u64,
    dense_bytes: u64,
    expert_budget: u64,
    kv_bytes_per_sequence: u64,
) -> usize {
    let room = available
        .saturating_sub(dense_bytes)
        .saturating_sub(expert_budget)
        .saturating_sub(BUDGET_RESERVE_BYTES);
    match room.checked_div(kv_bytes_per_sequence) {
        Some(n) => n.min(MAX_SEQUENCES as u64) as usize,
        None => MAX_SEQUENCES,
    }
}

/// The expert budget of `store` ([`expert_budget`]) within `available` bytes of RAM, with a
/// KV cache of `kv_bytes` at full context. Bytes.
pub fn store_expert_budget(store: &Store, available: u64, kv_bytes: u64) -> u64 {
    let largest = store.largest_record_len();
    let dense = store.manifest().dense_file.length;
    expert_budget(available, dense, kv_bytes, largest)
}

/// Bytes the expert cache holds with every expert record of `store` in it: the sum over the
/// INDEX of [`coli_store::held_bytes_for`] each record's length (what its buffer holds). A
/// budget above this is never used.
pub fn store_held_bytes(store: &Store) -> u64 {
    store
        .index()
        .iter()
        .map(|r| coli_store::held_bytes_for(r.length.get()))
        .sum()
}

/// The default expert budget of `store` ([`store_expert_budget`] within
/// [`memory_limit_bytes`]: MemAvailable capped by the memory cgroup) with a KV cache of
/// `kv_bytes` at full context, bytes. None when neither /proc/meminfo nor a cgroup limit can
/// be read (the budget is then unbounded).
pub fn default_ram_budget(store: &Store, kv_bytes: u64) -> Option<u64> {
    Some(store_expert_budget(store, memory_limit_bytes()?, kv_bytes))
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

    /// A `read` over literal files: (path, text) pairs.
    fn files<'a>(f: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |p| f.iter().find(|(q, _)| *q == p).map(|(_, t)| t.to_string())
    }

    #[test]
    fn cgroup_v1_limit_minus_usage_least_over_the_ancestors() {
        let gib = 1u64 << 30;
        let proc_cgroup = "12:pids:/a\n4:memory:/a/b\n3:cpu,cpuacct:/a\n0::/\n";
        let (two, one_half) = ((2 * gib).to_string(), (gib / 2).to_string());
        let unlimited = "9223372036854771712\n";
        let f = [
            (
                "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes",
                two.as_str(),
            ),
            (
                "/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes",
                one_half.as_str(),
            ),
            ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", unlimited),
            ("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", "123\n"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", unlimited),
            (
                "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                "99999999999\n",
            ),
        ];
        assert_eq!(
            cgroup_memory_left(proc_cgroup, files(&f)),
            Some(2 * gib - gib / 2)
        );
        // A parent with less room wins.
        let mut g = f.to_vec();
        g[2].1 = "1073741824";
        g[3].1 = "1000";
        assert_eq!(cgroup_memory_left(proc_cgroup, files(&g)), Some(gib - 1000));
        // Usage above the limit leaves nothing.
        g[3].1 = "2000000000";
        assert_eq!(cgroup_memory_left(proc_cgroup, files(&g)), Some(0));
        // A container: /proc/self/cgroup names the host's path, its own cgroup is the root.
        let h = [
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "1073741824\n",
            ),
            ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "73741824\n"),
        ];
        assert_eq!(
            cgroup_memory_left("5:memory:/docker/abc\n", files(&h)),
            Some(1_000_000_000)
        );
    }

    #[test]
    fn cgroup_v2_memory_max_minus_current() {
        let f = [
            ("/sys/fs/cgroup/user.slice/job/memory.max", "2147483648\n"),
            (
                "/sys/fs/cgroup/user.slice/job/memory.current",
                "147483648\n",
            ),
            ("/sys/fs/cgroup/user.slice/memory.max", "max\n"),
            ("/sys/fs/cgroup/user.slice/memory.current", "5000000000\n"),
        ];
        assert_eq!(
            cgroup_memory_left("0::/user.slice/job\n", files(&f)),
            Some(2_000_000_000)
        );
        // memory.max "max" everywhere: no limit.
        let g = [
            ("/sys/fs/cgroup/user.slice/job/memory.max", "max\n"),
            (
                "/sys/fs/cgroup/user.slice/job/memory.current",
                "147483648\n",
            ),
        ];
        assert_eq!(cgroup_memory_left("0::/user.slice/job\n", files(&g)), None);
    }

    #[test]
    fn cgroup_unlimited_or_unreadable_is_no_limit() {
        let v1 = "4:memory:/a\n0::/\n";
        let unlimited = [
            (
                "/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            ("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", "1000"),
        ];
        assert_eq!(cgroup_memory_left(v1, files(&unlimited)), None);
        // Nothing readable, a limit without its usage, garbage, no memory line at all.
        assert_eq!(cgroup_memory_left(v1, |_| None), None);
        let no_usage = [("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "1000")];
        assert_eq!(cgroup_memory_left(v1, files(&no_usage)), None);
        let garbage = [
            ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "lots"),
            ("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", "1000"),
        ];
        assert_eq!(cgroup_memory_left(v1, files(&garbage)), None);
        assert_eq!(cgroup_memory_left("3:cpu:/a\n", files(&unlimited)), None);
        assert_eq!(cgroup_memory_left("", files(&unlimited)), None);
        // The live figure of this machine: never above MemAvailable (read a moment later, so
        // other processes may have moved it by a little: 256 MiB of slack).
        let (limit, avail) = (memory_limit_bytes(), mem_available_bytes());
        assert!(limit.is_some());
        if let (Some(l), Some(a)) = (limit, avail) {
            assert!(l <= a + (256 << 20), "{l} > {a}");
        }
    }

    #[test]
    fn sequences_fit_beside_dense_experts_and_reserve() {
        let gib = 1u64 << 30;
        let r = BUDGET_RESERVE_BYTES;
        // 8 GiB - 1 dense - 4 experts - reserve = 3 GiB - 512 MiB: 2 sequences of 1 GiB.
        assert_eq!(sequences_that_fit(8 * gib, gib, 4 * gib, gib), 2);
        assert_eq!(sequences_that_fit(8 * gib, gib, 4 * gib, 3 * gib - r), 1);
        assert_eq!(
            sequences_that_fit(8 * gib, gib, 4 * gib, 3 * gib - r + 1),
            0
        );
        // Nothing left (the subtraction saturates), an unbounded budget.
        assert_eq!(sequences_that_fit(gib, 2 * gib, 0, 1), 0);
        assert_eq!(sequences_that_fit(8 * gib, gib, u64::MAX, 1), 0);
        // The cap, and no KV at all.
        assert_eq!(sequences_that_fit(8 * gib, 0, 0, 1), MAX_SEQUENCES);
        assert_eq!(sequences_that_fit(8 * gib, 0, 0, 0), MAX_SEQUENCES);
        assert_eq!(sequences_that_fit(0, 0, 0, 0), MAX_SEQUENCES);
        // A default budget leaves room for exactly the one sequence it counted.
        let kv = 300 << 20;
        let budget = expert_budget(8 * gib, gib, kv, 1 << 20);
        assert_eq!(sequences_that_fit(8 * gib, gib, budget, kv), 1);
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

/// Smallest prefill chunk the memory plan chooses, tokens: [`crate::prefill::ALIGN`], so that
/// the cuts between passes stay aligned (the gated delta rule's chunkwise form then runs on
/// the same positions whatever the chunk).
pub const MIN_AUTO_PREFILL_CHUNK: usize = crate::prefill::ALIGN;

/// Largest prefill chunk the memory plan chooses, tokens. The layer-major prefill reads a
/// layer's experts once per prompt whatever the chunk (when the budget holds one layer's
/// experts), so a larger chunk gains only rows per expert product, and measured it lost: a
/// 2048-token prompt of the GLM-5.3-Flash-shaped bench model prefilled at 36-40 tok/s in one
/// chunk of 2048, 44-48 in chunks of 128-512; the Qwen3.6 shape was flat from 128 to 2048
/// (engine/bench/results/2026-12-06-prefill-chunk-sweep.txt). `coli serve` also holds the
/// running streams for one chunk per step.
pub const MAX_AUTO_PREFILL_CHUNK: usize = 512;

/// Peak f32 activation bytes one prefill row (token) adds to a forward pass of `spec`: the
/// residual stream, norm output and layer delta (3 H); the attention projections and context
/// (GQA: q, k, v, context; MLA: q, the q/kv latents, context); the routed experts' inputs,
/// gate/up products and outputs for its top-k experts plus the shared experts' or dense MLP's
/// (2 H + 2 I each); a row of logits (`[vocab]`, for passes that return every row's); and,
/// for Inkling, the state rows a chunk appends before its layers drop what they no longer read
/// (`InklingSpec::kv_values_per_chunk_row`).
pub fn prefill_row_bytes(spec: &coli_format::ModelSpec) -> u64 {
    let state = spec
        .inkling
        .as_ref()
        .map_or(0, |ink| ink.kv_values_per_chunk_row(spec));
    let h = spec.hidden_size;
    let attn = match &spec.mla {
        Some(m) => {
            let q = spec.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
            q + m.q_lora_rank.unwrap_or(0)
                + m.kv_lora_rank
                + m.qk_rope_head_dim
                + spec.num_heads * m.v_head_dim
        }
        None => 2 * spec.num_heads * spec.head_dim + 2 * spec.num_kv_heads * spec.head_dim,
    };
    let shared = spec.n_shared_experts;
    let experts = spec.top_k * (2 * h + 2 * spec.moe_intermediate_size)
        + (2 * h
            + 2 * spec
                .intermediate_size
                .max(shared * spec.moe_intermediate_size));
    let residual = spec.residual_values();
    ((2 * h + residual + attn + experts + spec.vocab_size + state) * std::mem::size_of::<f32>())
        as u64
}

/// Activation bytes of a prefill that do not grow with its chunk: the layer-major prefill keeps
/// the residual stream of the whole prompt (`context` x `ModelSpec::residual_values` f32: the
/// hidden size, times the streams of hyper-connections or the blocks of attention residuals),
/// and MLA's expanded form
/// holds the `kv_b` expansion of every cached latent of the layer being run (`context`
/// positions x heads x (nope + v) f32; 0 for GQA).
pub fn prefill_fixed_bytes(spec: &coli_format::ModelSpec, context: usize) -> u64 {
    let residual = (context * spec.residual_values() * 4) as u64;
    residual
        + spec.mla.as_ref().map_or(0, |m| {
            (context * spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * 4) as u64
        })
}

/// The prefill chunk (tokens per forward pass of a prompt) the memory plan allows: the memory
/// left beside the dense set, the expert budget, the KV caches and [`BUDGET_RESERVE_BYTES`]
/// (`free_bytes`, None when the memory limit could not be read) over the bytes one row needs
/// (`row_bytes`, after `fixed_bytes`), clamped to [`MIN_AUTO_PREFILL_CHUNK`]..=
/// [`MAX_AUTO_PREFILL_CHUNK`], rounded down to a multiple of [`crate::prefill::ALIGN`], and
/// clamped to `context`. Results do not depend on the chunk size; the layer-major prefill reads
/// a layer's experts once per prompt whatever the chunk while the budget holds that layer's
/// experts (once per chunk below that).
pub fn prefill_chunk(
    free_bytes: Option<u64>,
    row_bytes: u64,
    fixed_bytes: u64,
    context: usize,
) -> usize {
    let rows = free_bytes.map_or(MIN_AUTO_PREFILL_CHUNK as u64, |f| {
        f.saturating_sub(fixed_bytes) / row_bytes.max(1)
    });
    let rows = (rows as usize).clamp(MIN_AUTO_PREFILL_CHUNK, MAX_AUTO_PREFILL_CHUNK);
    (rows / crate::prefill::ALIGN * crate::prefill::ALIGN).min(context.max(1))
}

#[cfg(test)]
mod prefill_chunk_tests {
    use super::*;

    #[test]
    fn chunk_follows_free_memory_within_bounds() {
        // 24 MiB free at 64 KiB per row: 384 rows.
        assert_eq!(prefill_chunk(Some(24 << 20), 64 << 10, 0, 4096), 384);
        // The fixed part comes off first.
        assert_eq!(prefill_chunk(Some(24 << 20), 64 << 10, 8 << 20, 4096), 256);
        assert_eq!(
            prefill_chunk(Some(1 << 40), 1, 0, 4096),
            MAX_AUTO_PREFILL_CHUNK
        );
        assert_eq!(
            prefill_chunk(Some(0), 1 << 20, 0, 4096),
            MIN_AUTO_PREFILL_CHUNK
        );
        assert_eq!(prefill_chunk(None, 1, 0, 4096), MIN_AUTO_PREFILL_CHUNK);
        assert_eq!(prefill_chunk(Some(1 << 40), 1, 0, 100), 100);
        // 100 rows' worth of memory: a chunk of 64, an aligned multiple.
        assert_eq!(prefill_chunk(Some(100 << 10), 1 << 10, 0, 4096), 64);
        assert_eq!(prefill_chunk(Some(200 << 10), 1 << 10, 0, 4096), 192);
    }
}
