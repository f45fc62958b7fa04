//! `coli plan --store DIR [--ram-budget SIZE] [--json]`: where a RAM budget goes and the decode
//! speed bound it implies.
//!
//! - dense bytes resident: `dense.bin` (memory-mapped, read whole at load); KV cache:
//!   `context * kv_bytes_per_token`;
//! - budget: `--ram-budget`, else the engine's default (MemAvailable minus dense, KV and
//!   512 MiB; `coli_engine::placement::default_ram_budget`);
//! - pinned set: the hottest experts of the usage history (as `coli run` would pin them) that
//!   fit `--pin-share` of the budget; the LRU tier gets the rest, in experts of the mean record
//!   size;
//! - expected disk bytes per decoded token: with a usage history, `p(l,e) = count(l,e) /
//!   tokens` is the chance a token routes to expert e of layer l; the pinned experts and then
//!   the hottest others that fit the LRU tier are taken as resident (an ideal frequency cache:
//!   a real LRU does somewhat worse), and the bytes are `sum p(l,e) * record_bytes(l,e)` over
//!   the other experts. Without a history, routing is assumed uniform: each layer routes
//!   `top_k` of its `E` experts, a resident share `r` of the layer hits, so the bytes are
//!   `sum_l top_k * mean_record_bytes * (1 - r)` (for uniform routing an LRU of C of N experts
//!   hits C/N). Prefill batches read each expert once per batch and need less per token.
//! - disk bandwidth: a short probe reading expert records of the store through `Store::fetch`
//!   with O_DIRECT (checksums off), `queue_depth` records at a time, until `--probe-mib` MiB
//!   or 3 s; the records are spread over the store so the probe does not read one region;
//! - decode bound: bandwidth / expected bytes per token (compute time not included).

use anyhow::{Context, Result};
use coli_engine::{Engine, EngineOptions};
use coli_store::{ExpertKey, IoPreference, OpenOptions, Store};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `coli plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Store directory.
    #[arg(long, value_name = "DIR")]
    pub store: PathBuf,
    /// Expert budget (as `coli run --ram-budget`); default from the available memory.
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_budget)]
    pub ram_budget: Option<u64>,
    /// Share of the budget the pinned hot set may take.
    #[arg(long, value_name = "F", default_value_t = coli_engine::placement::DEFAULT_PIN_SHARE)]
    pub pin_share: f64,
    /// Plan without the pinned hot set.
    #[arg(long)]
    pub no_pin: bool,
    /// Usage-history file (default: the state directory's file for this store).
    #[arg(long, value_name = "FILE")]
    pub usage: Option<PathBuf>,
    /// KV-cache tokens to plan for (default: max_position_embeddings, capped at 4096).
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,
    /// Most MiB the disk probe reads (0: no probe).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub probe_mib: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The plan's figures (the JSON output).
#[derive(serde::Serialize, Debug)]
struct Plan {
    store: String,
    store_id: String,
    experts: usize,
    expert_bytes_total: u64,
    mean_expert_bytes: f64,
    dense_bytes: u64,
    kv_bytes: u64,
    context: usize,
    budget: u64,
    budget_from_available_memory: bool,
    pinned_experts: usize,
    pinned_bytes: u64,
    cache_capacity_bytes: u64,
    cache_capacity_experts: f64,
    resident_share: f64,
    usage_history: Option<String>,
    usage_tokens: f64,
    routing_model: &'static str,
    expected_disk_bytes_per_token: f64,
    probe_bytes: u64,
    probe_s: f64,
    probe_io_mode: String,
    disk_gib_s: Option<f64>,
    decode_tok_s_bound: Option<f64>,
    ram_total_bytes: u64,
}

/// Runs `coli plan`.
///
/// # Errors
/// A store that does not open, a model the engine cannot load, a failed probe read.
pub fn run(a: &PlanArgs) -> Result<()> {
    let store = Store::open_with(
        &a.store,
        &OpenOptions {
            verify_checksums: false,
            ..OpenOptions::default()
        },
    )
    .with_context(|| format!("opening store {}", a.store.display()))?;
    let eng = Engine::new(
        &store,
        &EngineOptions {
            ram_budget: a.ram_budget,
            context: a.context,
            pin: false,
            prefetch: false,
            usage: None,
            ..EngineOptions::default()
        },
    )
    .with_context(|| format!("loading the model of {}", a.store.display()))?;
    let m = store.manifest();
    let index = store.index();
    let expert_bytes_total: u64 = index.iter().map(|r| r.length.get()).sum();
    let mean = expert_bytes_total as f64 / index.len().max(1) as f64;
    let budget = eng.placement().budget;
    let context = eng.context();
    let kv_bytes = eng.kv_bytes_per_token() * context as u64;
    let top_k = eng.spec().top_k as f64;
    let step_bytes =
        coli_engine::placement::decode_step_bytes(&store, eng.spec().num_layers, eng.spec().top_k);
    drop(eng);

    let usage_path = a
        .usage
        .clone()
        .or_else(|| coli_engine::usage::default_usage_path(m.store_id));
    let history = match &usage_path {
        Some(p) => match coli_engine::usage::UsageHistory::load_locked(p, m.store_id) {
            Ok(h) => h.filter(|h| h.tokens > 0.0),
            Err(e) => {
                eprintln!("warning: {e}");
                None
            }
        },
        None => None,
    };
    let len = |k: ExpertKey| store.record(k).map_or(0, |r| r.length.get());

    // Pinned set: as Engine::new picks it.
    let mut pinned = Vec::new();
    let mut pinned_bytes = 0u64;
    if let (Some(h), false) = (&history, a.no_pin) {
        let share = coli_engine::placement::pin_bytes(budget, a.pin_share, step_bytes);
        for (k, _) in h.hottest() {
            let l = len(k);
            if l == 0 {
                continue;
            }
            if pinned_bytes + l > share {
                break;
            }
            pinned_bytes += l;
            pinned.push(k);
        }
    }
    let cache_bytes = budget.saturating_sub(pinned_bytes);
    let (routing_model, bytes_per_token, resident_share) = match &history {
        Some(h) => {
            // Resident: pinned, then the hottest others that fit the LRU tier.
            let mut room = cache_bytes;
            let mut disk = 0f64;
            let mut resident = pinned.len();
            for (k, c) in h.hottest() {
                if pinned.contains(&k) {
                    continue;
                }
                let l = len(k);
                if l <= room {
                    room -= l;
                    resident += 1;
                } else {
                    disk += c / h.tokens * l as f64;
                }
            }
            let share = resident as f64 / index.len().max(1) as f64;
            ("usage history", disk, share.min(1.0))
        }
        None => {
            let resident =
                ((pinned_bytes + cache_bytes) as f64 / mean.max(1.0)).min(index.len() as f64);
            let r = resident / index.len().max(1) as f64;
            let layers = m.expert_layers.len() as f64;
            ("uniform routing", layers * top_k * mean * (1.0 - r), r)
        }
    };

    let (probe_bytes, probe_s, probe_io_mode) = probe(&a.store, a.probe_mib)?;
    let gib_s = (probe_s > 0.0 && probe_bytes > 0)
        .then(|| probe_bytes as f64 / probe_s / (1u64 << 30) as f64);
    let bound = match gib_s {
        Some(g) if bytes_per_token > 0.0 => Some(g * (1u64 << 30) as f64 / bytes_per_token),
        _ => None,
    };
    let plan = Plan {
        store: a.store.display().to_string(),
        store_id: m.store_id.to_string(),
        experts: index.len(),
        expert_bytes_total,
        mean_expert_bytes: mean,
        dense_bytes: m.dense_file.length,
        kv_bytes,
        context,
        budget,
        budget_from_available_memory: a.ram_budget.is_none(),
        pinned_experts: pinned.len(),
        pinned_bytes,
        cache_capacity_bytes: cache_bytes,
        cache_capacity_experts: (cache_bytes as f64 / mean.max(1.0)).min(index.len() as f64),
        resident_share,
        usage_history: history
            .as_ref()
            .and(usage_path.as_ref())
            .map(|p| p.display().to_string()),
        usage_tokens: history.as_ref().map_or(0.0, |h| h.tokens),
        routing_model,
        expected_disk_bytes_per_token: bytes_per_token,
        probe_bytes,
        probe_s,
        probe_io_mode,
        disk_gib_s: gib_s,
        decode_tok_s_bound: bound,
        ram_total_bytes: m.dense_file.length + kv_bytes + budget.min(expert_bytes_total),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print_table(&plan);
    }
    Ok(())
}

/// Reads expert records spread over the store with O_DIRECT (checksums off), `queue_depth`
/// at a time, until `mib` MiB or 3 s. Returns bytes, seconds and the I/O mode used.
fn probe(dir: &std::path::Path, mib: u64) -> Result<(u64, f64, String)> {
    if mib == 0 {
        return Ok((0, 0.0, "none".into()));
    }
    let store = Store::open_with(
        dir,
        &OpenOptions {
            verify_checksums: false,
            io: IoPreference::Auto,
            ..OpenOptions::default()
        },
    )
    .with_context(|| format!("opening store {} for the disk probe", dir.display()))?;
    let mode = match store.io_mode() {
        coli_store::IoMode::Direct => "direct",
        coli_store::IoMode::Buffered => "buffered (page cache: the figure is not the disk's)",
    };
    let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
    if keys.is_empty() {
        return Ok((0, 0.0, mode.into()));
    }
    // A stride coprime with the count visits records all over the store, each once.
    let n = keys.len();
    let mut stride = (n / 2 + 1).max(1);
    while gcd(stride, n) != 1 {
        stride += 1;
    }
    let order: Vec<ExpertKey> = (0..n).map(|i| keys[(i * stride) % n]).collect();
    let batch = 4;
    let limit = mib << 20;
    let t0 = Instant::now();
    let mut bytes = 0u64;
    for chunk in order.chunks(batch) {
        let bufs = store.fetch(chunk).context("disk probe read")?;
        bytes += bufs.iter().map(|b| b.len_bytes() as u64).sum::<u64>();
        if bytes >= limit || t0.elapsed().as_secs_f64() > 3.0 {
            break;
        }
    }
    Ok((bytes, t0.elapsed().as_secs_f64(), mode.into()))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn print_table(p: &Plan) {
    let mib = |b: f64| format!("{:.1} MiB", b / (1u64 << 20) as f64);
    let budget = if p.budget == u64::MAX {
        "unbounded".to_string()
    } else {
        mib(p.budget as f64)
    };
    let rows: Vec<(&str, String)> = vec![
        ("store", format!("{} ({})", p.store, p.store_id)),
        (
            "experts",
            format!(
                "{} records, {} in all, {} mean",
                p.experts,
                mib(p.expert_bytes_total as f64),
                mib(p.mean_expert_bytes)
            ),
        ),
        ("dense bytes resident", mib(p.dense_bytes as f64)),
        (
            "KV cache",
            format!("{} at {} tokens", mib(p.kv_bytes as f64), p.context),
        ),
        (
            "expert budget",
            format!(
                "{budget}{}",
                if p.budget_from_available_memory {
                    " (from MemAvailable)"
                } else {
                    ""
                }
            ),
        ),
        (
            "pinned set",
            format!(
                "{} experts, {}",
                p.pinned_experts,
                mib(p.pinned_bytes as f64)
            ),
        ),
        (
            "cache capacity",
            format!(
                "{:.1} experts ({})",
                p.cache_capacity_experts,
                mib(p.cache_capacity_bytes as f64)
            ),
        ),
        (
            "resident share",
            format!("{:.1}% of the experts", p.resident_share * 100.0),
        ),
        (
            "routing model",
            match &p.usage_history {
                Some(f) => format!("{} ({f}, {:.0} tokens)", p.routing_model, p.usage_tokens),
                None => p.routing_model.to_string(),
            },
        ),
        (
            "expected disk per token",
            mib(p.expected_disk_bytes_per_token),
        ),
        (
            "disk bandwidth",
            match p.disk_gib_s {
                Some(g) => format!(
                    "{g:.3} GiB/s ({} in {:.2} s, {})",
                    mib(p.probe_bytes as f64),
                    p.probe_s,
                    p.probe_io_mode
                ),
                None => "not measured".into(),
            },
        ),
        (
            "decode bound",
            match p.decode_tok_s_bound {
                Some(t) => format!("{t:.1} tok/s (disk only)"),
                None if p.expected_disk_bytes_per_token == 0.0 => {
                    "not disk bound (every routed expert resident)".into()
                }
                None => "unknown (no disk probe)".into(),
            },
        ),
    ];
    let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<w$}  {v}");
    }
}
