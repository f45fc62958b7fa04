//! `coli plan --store DIR [--ram-budget SIZE] [--json]` (and any other option of `coli run`):
//! where a RAM budget goes and the decode speed bound it implies, for a run with the same
//! options.
//!
//! - dense bytes resident: `dense.bin` (memory-mapped, read whole at load);
//! - KV cache: `kv_bytes_per_token` (`Engine::kv_bytes_per_token`: f32 keys and values of
//!   every layer, or the MLA latent and rope key) and per sequence `context * kv_bytes_per_token`
//!   at `--context`;
//! - memory limit: what the process may still use when the engine is set up, MemAvailable
//!   capped by the memory cgroup's limit minus its usage
//!   (`coli_engine::placement::memory_limit_bytes`);
//! - budget: `--ram-budget`, else the engine's default (the memory limit minus dense, one
//!   sequence's KV and 512 MiB; `coli_engine::placement::default_ram_budget`);
//! - sequences that fit: how many sequences' KV caches at `--context` fit in the memory limit
//!   beside the dense set, the budget (at most the experts' total) and the 512 MiB reserve
//!   (`coli_engine::placement::sequences_that_fit`; at most 4096), as `coli serve` counts
//!   them for `--max-batch`. A default budget was computed leaving room for one sequence, so it
//!   reports about 1 (`coli serve`'s default budget leaves room for `--max-batch` sequences);
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
//! - disk bandwidth: a short probe reading expert records of the store through `Store::fetch`,
//!   the store opened as the run would open it (`--io`, `--direct`, mirrors; O_DIRECT by
//!   default) with checksums off, 4 records at a time, until `--probe-mib` MiB or 3 s; the
//!   records are spread over the store so the probe does not read one region;
//! - decode bound: bandwidth / expected bytes per token (compute time not included).

use crate::options::EngineOptions;
use anyhow::{Context, Result};
use coli_engine::{Engine, EngineOptions as CoreOptions};
use coli_store::{ExpertKey, OpenOptions, Store};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `coli plan`: the options of `coli run` (so that a plan describes the run
/// with the same command line; only the store, budget, pinning, usage and context options
/// change the figures, and the I/O options how the probe reads), plus the probe size and JSON.
#[derive(clap::Args, Debug)]
#[command(mut_arg("store", |a| a
    .required(false)
    .required_unless_present_any(["checkpoint", "config", "gguf"])
    .default_value(".")
    .hide_default_value(true)))]
pub struct PlanArgs {
    /// The options `coli run` takes.
    #[command(flatten)]
    pub engine: EngineOptions,
    /// Most MiB the disk probe reads (0: no probe).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub probe_mib: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Plan from a checkpoint directory instead of a store: config.json and the safetensors
    /// headers (no weights read); one row per dense encoding.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["store", "config"])]
    pub checkpoint: Option<PathBuf>,
    /// Plan from a config.json alone (dtypes assumed as published).
    #[arg(long, value_name = "FILE", conflicts_with = "store")]
    pub config: Option<PathBuf>,
    /// Plan from a GGUF file (the first of a split GGUF's): its header only, the tensors in
    /// their own types as `coli-convert FILE.gguf` keeps them. Takes --total-ram, --disk-gib-s
    /// and --context as --checkpoint does.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["store", "config", "checkpoint", "experts"])]
    pub gguf: Option<PathBuf>,
    /// With --checkpoint/--config: all the RAM the run may use (dense, KV, expert cache,
    /// runtime), e.g. 25G. Default: this machine's memory limit.
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_budget)]
    pub total_ram: Option<u64>,
    /// With --checkpoint/--config: disk read bandwidth for the decode bound, GiB/s.
    #[arg(long, value_name = "GIB_S")]
    pub disk_gib_s: Option<f64>,
    /// With --checkpoint/--config: the routed experts' encoding (default as coli-convert's:
    /// mxfp4 when config.json declares MXFP4 experts, else int4-g64).
    #[arg(long, value_name = "ENC")]
    pub experts: Option<String>,
    /// With --checkpoint/--config: the MTP layer's encoding (default int8, as coli-convert's);
    /// `none`: without the MTP layer (coli-convert --mtp none).
    #[arg(long, value_name = "ENC", default_value = "int8")]
    pub mtp: String,
}

/// The plan's figures (the JSON output). Bytes unless named otherwise.
#[derive(serde::Serialize, Debug)]
pub struct Plan {
    /// The store directory.
    pub store: String,
    /// Its store id (32 hex digits).
    pub store_id: String,
    /// Expert records in the store.
    pub experts: usize,
    /// Bytes of all expert records.
    pub expert_bytes_total: u64,
    /// Mean expert record, bytes.
    pub mean_expert_bytes: f64,
    /// dense.bin, bytes (resident).
    pub dense_bytes: u64,
    /// KV cache per token of context (`Engine::kv_bytes_per_token`: f32), bytes.
    pub kv_bytes_per_token: u64,
    /// KV cache of one sequence at full context (`Engine::kv_bytes_per_sequence`:
    /// `kv_bytes_per_token * context`, plus Inkling's bounded windows), bytes.
    pub kv_bytes: u64,
    /// RAM the prefix cache of chat and serve may keep finished conversations' KV states in
    /// (`--kv-cache-budget`; default one sequence's KV cache), bytes.
    pub kv_cache_budget_bytes: u64,
    /// Context, tokens.
    pub context: usize,
    /// Expert budget (pinned + LRU), bytes.
    pub budget: u64,
    /// Whether the budget came from the available memory.
    pub budget_from_available_memory: bool,
    /// The memory the process may use (MemAvailable capped by the memory cgroup) when the
    /// engine was set up, bytes; None when it cannot be read.
    pub memory_limit_bytes: Option<u64>,
    /// Sequences whose KV cache at full context (`kv_bytes` each) fit in `memory_limit_bytes`
    /// beside the dense set, the budget, the prefix cache and the 512 MiB reserve (at most 4096); None when the
    /// memory limit cannot be read.
    pub sequences_fit: Option<usize>,
    /// Prompt tokens per prefill pass the engine would run: `--prefill-batch`, or the chunk its
    /// memory plan chooses (`placement::budget::prefill_chunk`).
    pub prefill_batch: usize,
    /// Experts the engine would pin at start.
    pub pinned_experts: usize,
    /// Their bytes.
    pub pinned_bytes: u64,
    /// LRU tier, bytes.
    pub cache_capacity_bytes: u64,
    /// LRU tier in mean experts.
    pub cache_capacity_experts: f64,
    /// Share of the experts resident (pinned, or hottest in the LRU tier), 0..=1.
    pub resident_share: f64,
    /// The usage-history file used, when it holds tokens.
    pub usage_history: Option<String>,
    /// Tokens in the usage history (decayed).
    pub usage_tokens: f64,
    /// `usage history` or `uniform routing`.
    pub routing_model: &'static str,
    /// Expected expert bytes read from disk per decode token.
    pub expected_disk_bytes_per_token: f64,
    /// Expert bytes one decode token routes to at most (each layer's largest record times
    /// top-k, summed over the layers): a budget below it re-reads experts within one token.
    pub decode_step_bytes: u64,
    /// Bytes the disk probe read.
    pub probe_bytes: u64,
    /// Seconds it took.
    pub probe_s: f64,
    /// Whether it read with O_DIRECT.
    pub probe_io_mode: String,
    /// Probe throughput, GiB/s.
    pub disk_gib_s: Option<f64>,
    /// Decode tok/s if the disk were the only limit.
    pub decode_tok_s_bound: Option<f64>,
    /// dense + KV + prefix cache + budget (capped at the experts' total), bytes.
    pub ram_total_bytes: u64,
}

/// Runs `coli plan`: prints [`plan`]'s figures as a table or JSON.
///
/// # Errors
/// As [`plan`].
pub fn run(a: &PlanArgs) -> Result<()> {
    if a.checkpoint.is_some() || a.config.is_some() || a.gguf.is_some() {
        let enc = |s: &str, flag: &str| {
            coli_convert::parse_encoding(
                s,
                &[
                    "mxfp4", "mxfp8", "int4-g64", "int4-g32", "int8", "fp8", "bf16",
                ],
                flag,
            )
            .map_err(anyhow::Error::from)
        };
        let total_ram = match a.total_ram {
            Some(t) => t,
            None => coli_engine::placement::memory_limit_bytes().context(
                "neither /proc/meminfo nor a memory cgroup limit is readable: give --total-ram",
            )?,
        };
        let p = coli_convert::memory_plan::plan_from_config(
            &coli_convert::memory_plan::ConfigPlanArgs {
                checkpoint: a.checkpoint.as_deref(),
                config: a.config.as_deref(),
                gguf: a.gguf.as_deref(),
                total_ram,
                context: a.engine.context,
                disk_gib_s: a.disk_gib_s,
                experts: a
                    .experts
                    .as_deref()
                    .map(|e| enc(e, "experts"))
                    .transpose()?,
                mtp: match a.mtp.as_str() {
                    "none" => None,
                    m => Some(enc(m, "mtp")?),
                },
                chosen: None,
            },
        )?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&p)?);
        } else {
            print!("{}", coli_convert::memory_plan::render(&p));
        }
        return Ok(());
    }
    if a.total_ram.is_some() || a.disk_gib_s.is_some() || a.experts.is_some() {
        anyhow::bail!(
            "--total-ram, --disk-gib-s and --experts plan from --checkpoint or --config; with \
             --store the plan uses --ram-budget and measures the disk (--probe-mib)"
        );
    }
    let plan = plan(a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
    } else {
        print_table(&plan);
    }
    Ok(())
}

/// The plan of a run with `a.engine`'s options: budget and context as the engine sets them up,
/// the pinned set as it would choose it from the usage history
/// ([`coli_engine::placement::pinned_set`]), the expected disk bytes per token, and a disk
/// probe through the store opened as the run would open it (checksums off).
///
/// # Errors
/// A store that does not open, a model the engine cannot load, a failed probe read.
pub fn plan(a: &PlanArgs) -> Result<Plan> {
    // The run's numerics (an unknown COLI_NUMERICS refused, as by run).
    crate::options::apply_numerics(a.engine.numerics)?;
    plan_for(&a.engine, a.probe_mib)
}

/// [`plan`] for `opts` with a disk probe of at most `probe_mib` MiB (0: none).
///
/// # Errors
/// As [`plan`].
pub fn plan_for(opts: &EngineOptions, probe_mib: u64) -> Result<Plan> {
    let store = crate::options::open_store(
        &opts.store,
        &OpenOptions {
            verify_checksums: false,
            ..opts.open_options()?
        },
    )?;
    // The engine only for its budget, context and KV size: nothing pinned or prefetched.
    let eng = Engine::new(
        &store,
        &CoreOptions {
            pin: false,
            prefetch: false,
            usage: None,
            ..opts.core_options(&store)
        },
    )
    .with_context(|| format!("loading the model of {}", opts.store.display()))?;
    let m = store.manifest();
    let index = store.index();
    let expert_bytes_total: u64 = index.iter().map(|r| r.length.get()).sum();
    // What every expert holds in the cache (page-rounded buffers): a budget above it never fills.
    let expert_held = coli_engine::placement::store_held_bytes(&store);
    let mean = expert_bytes_total as f64 / index.len().max(1) as f64;
    let budget = eng.placement().budget;
    let context = eng.context();
    let kv_bytes_per_token = eng.kv_bytes_per_token();
    let kv_bytes = eng.kv_bytes_per_sequence();
    let kv_cache_budget = eng.kv_cache_budget();
    let prefill_batch = eng.prefill_batch();
    // Measured when the engine started, before the model loaded.
    let memory_limit = eng.placement().memory_limit;
    let sequences_fit = memory_limit.map(|avail| {
        coli_engine::placement::sequences_that_fit(
            avail.saturating_sub(kv_cache_budget),
            store.manifest().dense_file.length,
            // A budget above the experts' total never fills (as coli serve counts it).
            budget.min(expert_held),
            kv_bytes,
        )
    });
    let top_k = eng.spec().top_k as f64;
    let step_bytes =
        coli_engine::placement::decode_step_bytes(&store, eng.spec().num_layers, eng.spec().top_k);
    drop(eng);

    let usage_path = opts.usage_path(&store);
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

    // Pinned set: as the engine's placement policy picks it.
    let (pinned, pinned_bytes) = match (&history, opts.no_pin) {
        (Some(h), false) => coli_engine::placement::pinned_set(
            &store,
            h.hottest().into_iter().map(|x| x.0),
            coli_engine::placement::pin_bytes(budget, opts.pin_share, step_bytes),
        ),
        _ => (Vec::new(), 0),
    };
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

    let (probe_bytes, probe_s, probe_io_mode) = probe(&store, probe_mib)?;
    let gib_s = (probe_s > 0.0 && probe_bytes > 0)
        .then(|| probe_bytes as f64 / probe_s / (1u64 << 30) as f64);
    let bound = match gib_s {
        Some(g) if bytes_per_token > 0.0 => Some(g * (1u64 << 30) as f64 / bytes_per_token),
        _ => None,
    };
    Ok(Plan {
        store: opts.store.display().to_string(),
        store_id: m.store_id.to_string(),
        experts: index.len(),
        expert_bytes_total,
        mean_expert_bytes: mean,
        dense_bytes: m.dense_file.length,
        kv_bytes_per_token,
        kv_bytes,
        kv_cache_budget_bytes: kv_cache_budget,
        context,
        budget,
        budget_from_available_memory: opts.ram_budget.is_none(),
        memory_limit_bytes: memory_limit,
        sequences_fit,
        prefill_batch,
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
        decode_step_bytes: step_bytes,
        probe_bytes,
        probe_s,
        probe_io_mode,
        disk_gib_s: gib_s,
        decode_tok_s_bound: bound,
        ram_total_bytes: m.dense_file.length + kv_bytes + kv_cache_budget + budget.min(expert_held),
    })
}

/// Reads expert records spread over `store` (opened as the run would, checksums off),
/// 4 at a time, until `mib` MiB or 3 s. Returns bytes, seconds and the I/O mode.
fn probe(store: &Store, mib: u64) -> Result<(u64, f64, String)> {
    if mib == 0 {
        return Ok((0, 0.0, "none".into()));
    }
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
            {
                // A recurrent model's states and Inkling's windows do not grow with the context.
                let fixed = p
                    .kv_bytes
                    .saturating_sub(p.kv_bytes_per_token * p.context as u64);
                let fixed = if fixed > 0 {
                    format!(
                        " ({} of it state that does not grow with the context)",
                        mib(fixed as f64)
                    )
                } else {
                    String::new()
                };
                format!(
                    "{} bytes per token, {} per sequence of {} tokens{fixed}",
                    p.kv_bytes_per_token,
                    mib(p.kv_bytes as f64),
                    p.context
                )
            },
        ),
        (
            "prefix cache (RAM)",
            format!(
                "{} for finished conversations' KV states (chat, serve; --kv-cache-budget)",
                mib(p.kv_cache_budget_bytes as f64)
            ),
        ),
        (
            "memory limit",
            match p.memory_limit_bytes {
                Some(b) => format!(
                    "{} (the lesser of MemAvailable and what the memory cgroup leaves)",
                    mib(b as f64)
                ),
                None => "unknown (neither /proc/meminfo nor a cgroup limit readable)".into(),
            },
        ),
        (
            "expert budget",
            format!(
                "{budget}{}",
                if p.budget_from_available_memory {
                    " (from the memory limit)"
                } else {
                    ""
                }
            ),
        ),
        (
            "sequences that fit",
            match p.sequences_fit {
                Some(n) => format!(
                    "{n}{} of {} tokens beside the dense set, the expert budget, the prefix cache and 512 MiB",
                    if n == coli_engine::placement::MAX_SEQUENCES {
                        " (the most reported)"
                    } else {
                        ""
                    },
                    p.context
                ),
                None => "unknown (memory limit unknown)".into(),
            },
        ),
        (
            "prefill chunk",
            format!("{} tokens per pass", p.prefill_batch),
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
            if p.cache_capacity_experts >= p.experts as f64 {
                // The tier holds more than the whole store: say so rather than print a count
                // capped at the store's size beside the whole tier.
                format!(
                    "{} (every one of the {} experts fits; they take {})",
                    mib(p.cache_capacity_bytes as f64),
                    p.experts,
                    mib(p.expert_bytes_total as f64)
                )
            } else {
                format!(
                    "{:.1} experts of the mean size ({})",
                    p.cache_capacity_experts,
                    mib(p.cache_capacity_bytes as f64)
                )
            },
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_converter_plans_with_the_engines_runtime_reserve() {
        assert_eq!(
            coli_convert::memory_plan::RUNTIME_RESERVE_BYTES,
            coli_engine::placement::BUDGET_RESERVE_BYTES
        );
    }
}
