//! `coli tune`: measures instead of guessing. Short interleaved A/B runs on this machine and
//! store of the settings that only change speed (I/O engine, queue depth, prefetch and its
//! gate, pin share, threads, prefill batch), each against the default in the same rounds; keeps
//! the fastest, prints the table, and saves the result in the state directory keyed by store id
//! and machine (CPU model, cores, memory, the device holding the store). `run`, `chat`, `eval`
//! and `serve` then use the saved settings for every option not given on their command line,
//! and say so on stderr; `--no-tune` ignores them.
//!
//! Every configuration must produce the default's tokens (placement never changes the output);
//! a mismatch is a bug and ends the tune with an error naming the configuration and prompt.

use crate::options::EngineOptions;
use anyhow::{bail, Context, Result};
use coli_engine::{Engine, GenerateParams, SamplingParams, SpeculationParams};
use coli_store::{IoEngineChoice, Store};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `coli tune`.
#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// The options `coli run` takes: the starting point (the "default" configuration), and
    /// what the candidates vary from.
    #[command(flatten)]
    pub engine: EngineOptions,
    /// Prompts, one per line (default: four built-in prompts; token ids `1,2,3` for a store
    /// without a tokenizer).
    #[arg(long, value_name = "FILE")]
    pub prompts: Option<PathBuf>,
    /// Tokens generated per prompt (greedy, EOS ignored so every run decodes as many).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_tokens: usize,
    /// Rounds: each runs every configuration once, in turn; a configuration's time is its
    /// median over the rounds.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: usize,
    /// Do not save the result.
    #[arg(long)]
    pub no_save: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The settings tune chooses; `None` leaves the option as given (or its default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// `--io`: `uring` or `pread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<String>,
    /// `--queue-depth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u16>,
    /// `--no-prefetch` when false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<bool>,
    /// `--prefetch-min-use`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch_min_use: Option<f64>,
    /// `--pin-share`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_share: Option<f64>,
    /// `--threads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u16>,
    /// `--prefill-batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_batch: Option<usize>,
}

impl Settings {
    /// The speed options `opts` sets away from their defaults: the baseline a tune measures
    /// from, saved with what it keeps (a tune run with `--no-prefetch` measured its candidates
    /// without prefetch, so its result applies without prefetch).
    pub fn of_options(opts: &EngineOptions) -> Settings {
        let io = match opts.io {
            IoEngineChoice::Auto => None,
            IoEngineChoice::Engine(n) => Some(n.to_string()),
        };
        Settings {
            io,
            queue_depth: opts.queue_depth,
            prefetch: opts.no_prefetch.then_some(false),
            prefetch_min_use: (opts.prefetch_min_use
                != coli_engine::placement::DEFAULT_PREFETCH_MIN_USE)
                .then_some(opts.prefetch_min_use),
            pin_share: (opts.pin_share != coli_engine::placement::DEFAULT_PIN_SHARE)
                .then_some(opts.pin_share),
            threads: opts.threads,
            prefill_batch: opts.prefill_batch,
        }
    }

    /// These settings with `over`'s set values on top.
    pub fn overlaid(&self, over: &Settings) -> Settings {
        Settings {
            io: over.io.clone().or_else(|| self.io.clone()),
            queue_depth: over.queue_depth.or(self.queue_depth),
            prefetch: over.prefetch.or(self.prefetch),
            prefetch_min_use: over.prefetch_min_use.or(self.prefetch_min_use),
            pin_share: over.pin_share.or(self.pin_share),
            threads: over.threads.or(self.threads),
            prefill_batch: over.prefill_batch.or(self.prefill_batch),
        }
    }

    /// The settings as command-line options (`--queue-depth 8 --no-prefetch`); `default` when
    /// none is set.
    pub fn flags(&self) -> String {
        let mut f = Vec::new();
        if let Some(v) = &self.io {
            f.push(format!("--io {v}"));
        }
        if let Some(v) = self.queue_depth {
            f.push(format!("--queue-depth {v}"));
        }
        if self.prefetch == Some(false) {
            f.push("--no-prefetch".into());
        }
        if let Some(v) = self.prefetch_min_use {
            f.push(format!("--prefetch-min-use {v}"));
        }
        if let Some(v) = self.pin_share {
            f.push(format!("--pin-share {v}"));
        }
        if let Some(v) = self.threads {
            f.push(format!("--threads {v}"));
        }
        if let Some(v) = self.prefill_batch {
            f.push(format!("--prefill-batch {v}"));
        }
        if f.is_empty() {
            "default".into()
        } else {
            f.join(" ")
        }
    }

    /// Sets every option these settings hold on `opts`, except those `explicit` says the user
    /// gave (by clap argument id: `io`, `queue_depth`, `no_prefetch`, `prefetch_min_use`,
    /// `pin_share`, `threads`, `prefill_batch`). Returns the settings actually applied.
    pub fn apply(&self, opts: &mut EngineOptions, explicit: &dyn Fn(&str) -> bool) -> Settings {
        let mut used = Settings::default();
        if let Some(v) = self.io.as_deref().and_then(IoEngineChoice::named) {
            if !explicit("io") {
                opts.io = v;
                used.io.clone_from(&self.io);
            }
        }
        if let (Some(v), false) = (self.queue_depth, explicit("queue_depth")) {
            opts.queue_depth = Some(v);
            used.queue_depth = Some(v);
        }
        if let (Some(v), false) = (self.prefetch, explicit("no_prefetch")) {
            opts.no_prefetch = !v;
            used.prefetch = Some(v);
        }
        if let (Some(v), false) = (self.prefetch_min_use, explicit("prefetch_min_use")) {
            opts.prefetch_min_use = v;
            used.prefetch_min_use = Some(v);
        }
        if let (Some(v), false) = (self.pin_share, explicit("pin_share")) {
            opts.pin_share = v;
            used.pin_share = Some(v);
        }
        if let (Some(v), false) = (self.threads, explicit("threads")) {
            opts.threads = Some(v);
            used.threads = Some(v);
        }
        if let (Some(v), false) = (self.prefill_batch, explicit("prefill_batch")) {
            opts.prefill_batch = Some(v);
            used.prefill_batch = Some(v);
        }
        used
    }
}

/// What identifies the machine a tune result was measured on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// `/proc/cpuinfo` model name.
    pub cpu_model: String,
    /// CPUs available to this process.
    pub cores: usize,
    /// `/proc/meminfo` MemTotal, bytes.
    pub mem_total_bytes: u64,
    /// The block device holding the store (`major:minor` and its name when known).
    pub store_device: String,
}

impl Machine {
    /// This machine, for a store in `store_dir`.
    pub fn current(store_dir: &Path) -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024);
        let store_device = {
            use std::os::unix::fs::MetadataExt;
            match std::fs::metadata(store_dir) {
                Ok(m) => {
                    let dev = m.dev();
                    // Linux's encoding of dev_t (glibc's gnu_dev_major / gnu_dev_minor).
                    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff);
                    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
                    let name =
                        std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
                            .ok()
                            .and_then(|u| {
                                u.lines()
                                    .find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string))
                            });
                    match name {
                        Some(n) => format!("{major}:{minor} ({n})"),
                        None => format!("{major}:{minor}"),
                    }
                }
                Err(_) => "unknown".into(),
            }
        };
        Machine {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total_bytes,
            store_device,
        }
    }
}

/// One configuration's measurements.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// The configuration as options (`default` for the starting point).
    pub config: String,
    /// Median seconds over the rounds for the whole prompt set (load excluded).
    pub median_s: f64,
    /// The median over rounds of this configuration's time over the default's in the same
    /// round (below 1: faster).
    pub ratio: f64,
    /// Generated tokens per second at the median.
    pub tok_s: f64,
}

/// A saved tune (`<state dir>/tune-<store id>.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TuneResult {
    /// The store measured.
    pub store_id: String,
    /// The machine measured on.
    pub machine: Machine,
    /// The settings kept: the speed options `coli tune` was given (its baseline), with the
    /// change that won on top (empty: the defaults were fastest).
    pub settings: Settings,
    /// The kept settings' median over the default's (below 1: faster).
    pub ratio: f64,
    /// Every configuration measured, in order.
    pub table: Vec<Row>,
    /// Prompts, tokens per prompt and rounds.
    pub prompts: usize,
    /// Tokens generated per prompt.
    pub max_tokens: usize,
    /// Rounds.
    pub rounds: usize,
    /// When (Unix seconds).
    pub measured_at: u64,
}

/// Where the tune of store `store_id` is saved: the state directory
/// (`coli_engine::usage::default_state_dir`), file `tune-<store id>.json`.
pub fn tune_path(store_id: &str) -> Option<PathBuf> {
    coli_engine::usage::default_state_dir().map(|d| d.join(format!("tune-{store_id}.json")))
}

/// A setting must beat the default by this much (median paired ratio), and in every round, to
/// be kept: the machines are shared and noisy.
pub const KEEP_BELOW: f64 = 0.97;

const BUILTIN_PROMPTS: [&str; 4] = [
    "The history of the printing press begins",
    "Explain how a hash map works:",
    "def quicksort(items):",
    "Once upon a time, in a small village by the sea,",
];

/// The candidate configurations: the default, then one knob changed at a time.
fn candidates(
    store: &Store,
    opts: &EngineOptions,
    has_history: bool,
    long_prompts: bool,
) -> Vec<Settings> {
    let mut c = vec![Settings::default()];
    if store.io_engine() == "uring" && opts.io == IoEngineChoice::Auto {
        c.push(Settings {
            io: Some("pread".into()),
            ..Settings::default()
        });
    }
    let qd = store.queue_depth() as u16;
    for q in [2u16, 8, 16] {
        if q != qd {
            c.push(Settings {
                queue_depth: Some(q),
                ..Settings::default()
            });
        }
    }
    if !opts.no_prefetch {
        c.push(Settings {
            prefetch: Some(false),
            ..Settings::default()
        });
        if opts.prefetch_min_use != 0.0 {
            c.push(Settings {
                prefetch_min_use: Some(0.0),
                ..Settings::default()
            });
        }
    }
    if has_history && !opts.no_pin {
        for s in [0.0, 0.5] {
            if s != opts.pin_share {
                c.push(Settings {
                    pin_share: Some(s),
                    ..Settings::default()
                });
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = opts.threads.map_or(cores, usize::from);
    if threads >= 2 {
        c.push(Settings {
            threads: Some((threads / 2) as u16),
            ..Settings::default()
        });
    }
    if long_prompts {
        // Multiples of 64: the gated delta rule layers' bits do not depend on them
        // (docs/ENGINE.md, "Determinism"), so a tuned chunk keeps the default's tokens.
        for b in [64usize, 256] {
            c.push(Settings {
                prefill_batch: Some(b),
                ..Settings::default()
            });
        }
    }
    c
}

/// Runs every prompt once with `opts`: seconds (load excluded), the tokens of each prompt, and
/// the generated count.
fn measure(
    opts: &EngineOptions,
    usage: Option<&Path>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> Result<(f64, Vec<Vec<u32>>, usize)> {
    let store = crate::options::open_store(&opts.store, &opts.open_options()?)?;
    // A copy of the usage history per run: pins come from the same history every time, and
    // the runs do not add to it.
    let tmp = match usage {
        Some(u) => {
            let t = std::env::temp_dir().join(format!(
                "coli-tune-usage-{}-{}.json",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::copy(u, &t).with_context(|| format!("copying {}", u.display()))?;
            Some(t)
        }
        None => None,
    };
    let core = coli_engine::EngineOptions {
        usage: tmp.clone(),
        ..opts.core_options(&store)
    };
    let mut eng = Engine::new(&store, &core)
        .with_context(|| format!("loading the model of {}", opts.store.display()))?;
    let _ = eng.take_warnings();
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        },
        stop_on_eos: false,
        speculation: SpeculationParams::default(),
    };
    let t0 = Instant::now();
    let mut tokens = Vec::new();
    let mut generated = 0;
    for p in prompts {
        eng.reset();
        let g = eng
            .generate(p, &params, |_| Ok(true))
            .context("generating")?;
        generated += g.tokens.len();
        tokens.push(g.tokens);
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(eng);
    if let Some(t) = tmp {
        let _ = std::fs::remove_file(t.with_extension("json.lock"));
        let _ = std::fs::remove_file(t);
    }
    Ok((secs, tokens, generated))
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Errors unless `got` equals the default's tokens (a placement setting changed the output:
/// a bug).
pub fn same_tokens(config: &str, default: &[Vec<u32>], got: &[Vec<u32>]) -> Result<()> {
    for (i, (a, b)) in default.iter().zip(got).enumerate() {
        if a != b {
            let at = a
                .iter()
                .zip(b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            bail!(
                "configuration `{config}` gave other tokens than the default for prompt {i} \
                 (first difference at token {at}): settings that only place weights must never \
                 change the output; this is a bug in coli, please report it with this command"
            );
        }
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// What every run of a tune shares.
struct Bench<'a> {
    /// The starting options.
    base: &'a EngineOptions,
    /// The usage history to copy per run.
    usage: Option<&'a Path>,
    prompts: &'a [Vec<u32>],
    max_tokens: usize,
    rounds: usize,
    /// A line on stderr per run.
    progress: bool,
}

/// Measures `configs` interleaved over `b.rounds` rounds (the order rotated each round),
/// checking every run's tokens against
/// `reference` (set by the first run when empty); returns each configuration's seconds per
/// round and the generated tokens per run.
fn rounds_of(
    b: &Bench<'_>,
    configs: &[Settings],
    reference: &mut Option<Vec<Vec<u32>>>,
) -> Result<(Vec<Vec<f64>>, usize)> {
    let (base, usage, prompts, max_tokens, rounds, progress) = (
        b.base,
        b.usage,
        b.prompts,
        b.max_tokens,
        b.rounds,
        b.progress,
    );
    let mut times = vec![Vec::new(); configs.len()];
    let mut generated = 0;
    for round in 0..rounds {
        // The order rotates by one each round: no configuration always runs first (the first
        // run of a round was measured slower on a shared machine, whatever it ran).
        for k in 0..configs.len() {
            let i = (k + round) % configs.len();
            let c = &configs[i];
            let mut o = base.clone();
            c.apply(&mut o, &|_| false);
            let (s, toks, n) = measure(&o, usage, prompts, max_tokens)?;
            match reference {
                None => *reference = Some(toks),
                Some(r) => same_tokens(&c.flags(), r, &toks)?,
            }
            generated = n;
            times[i].push(s);
            if progress {
                eprintln!(
                    "coli tune: round {}/{rounds} {:<28} {s:.2} s",
                    round + 1,
                    c.flags()
                );
            }
        }
    }
    Ok((times, generated))
}

/// The median over rounds of `t[r] / reference[r]`: each round's ratio is taken within the
/// round (the configurations ran one after the other), so that slow drifts of a shared
/// machine cancel.
fn paired_ratio(t: &[f64], reference: &[f64]) -> f64 {
    let mut r: Vec<f64> = t.iter().zip(reference).map(|(a, b)| a / b).collect();
    median(&mut r)
}

/// Whether times `t` beat `reference`: a paired ratio below [`KEEP_BELOW`] and faster in every
/// round (a setting with no effect rarely wins every round of a noisy machine).
fn beats(t: &[f64], reference: &[f64]) -> bool {
    paired_ratio(t, reference) < KEEP_BELOW && t.iter().zip(reference).all(|(a, b)| a < b)
}

/// The tune: candidates measured against the default, the best value of each knob combined and
/// measured again when more than one helps; returns the result (not saved).
///
/// # Errors
/// A store or model that does not load, an unreadable prompts file, a configuration that
/// changes the tokens.
pub fn tune(a: &TuneArgs) -> Result<TuneResult> {
    if a.rounds == 0 || a.max_tokens == 0 {
        bail!("--rounds and --max-tokens must be at least 1");
    }
    let opts = &a.engine;
    // The numerics every measured run computes under: those run, chat and serve use.
    crate::options::apply_numerics(opts.numerics)?;
    let store = crate::options::open_store(&opts.store, &opts.open_options()?)?;
    let tok = coli_engine::TextTokenizer::from_store(&store).context("loading the tokenizer")?;
    let lines: Vec<String> = match &a.prompts {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading {}", p.display()))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect(),
        None => BUILTIN_PROMPTS.iter().map(|s| s.to_string()).collect(),
    };
    let prompts: Vec<Vec<u32>> = lines
        .iter()
        .map(|l| match &tok {
            Some(t) => t.encode(l, true).context("tokenizing a prompt"),
            None => l
                .split(',')
                .map(|x| x.trim().parse::<u32>())
                .collect::<std::result::Result<Vec<u32>, _>>()
                .with_context(|| {
                    format!(
                        "the store has no tokenizer: prompts must be token ids (1,2,3), got {l:?}"
                    )
                }),
        })
        .collect::<Result<_>>()?;
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        bail!("no prompts (or an empty one) to tune with");
    }
    let usage = opts.usage_path(&store).filter(|p| p.is_file());
    let long = prompts.iter().any(|p| p.len() > 64);
    let configs = candidates(&store, opts, usage.is_some(), long);
    let store_id = store.manifest().store_id.to_string();
    drop(store);
    let progress = !a.json;
    let mut reference = None;
    let bench = Bench {
        base: opts,
        usage: usage.as_deref(),
        prompts: &prompts,
        max_tokens: a.max_tokens,
        rounds: a.rounds,
        progress,
    };
    let (times, generated) = rounds_of(&bench, &configs, &mut reference)?;
    let row = |c: &Settings, t: &[f64], d: &[f64]| {
        let m = median(&mut t.to_vec());
        Row {
            config: c.flags(),
            median_s: m,
            ratio: paired_ratio(t, d),
            tok_s: generated as f64 / m,
        }
    };
    let mut table: Vec<Row> = configs
        .iter()
        .zip(&times)
        .map(|(c, t)| row(c, t, &times[0]))
        .collect();
    // The best value of each knob that beats the default.
    let mut best: Vec<(usize, f64)> = Vec::new();
    let knob = |s: &Settings| -> &'static str {
        if s.io.is_some() {
            "io"
        } else if s.queue_depth.is_some() {
            "queue_depth"
        } else if s.prefetch.is_some() || s.prefetch_min_use.is_some() {
            "prefetch"
        } else if s.pin_share.is_some() {
            "pin_share"
        } else if s.threads.is_some() {
            "threads"
        } else {
            "prefill_batch"
        }
    };
    let mut per_knob: std::collections::BTreeMap<&str, (usize, f64)> = Default::default();
    for (i, c) in configs.iter().enumerate().skip(1) {
        let r = table[i].ratio;
        if beats(&times[i], &times[0]) {
            let e = per_knob.entry(knob(c)).or_insert((i, r));
            if r < e.1 {
                *e = (i, r);
            }
        }
    }
    best.extend(per_knob.values().copied());
    let (settings, ratio) = if best.is_empty() {
        (Settings::default(), 1.0)
    } else {
        // Confirmation in fresh interleaved rounds: the best single change, and (when several
        // knobs qualified) their combination, against the default again.
        let mut combined = Settings::default();
        for &(i, _) in &best {
            let c = &configs[i];
            combined.io = combined.io.or(c.io.clone());
            combined.queue_depth = combined.queue_depth.or(c.queue_depth);
            combined.prefetch = combined.prefetch.or(c.prefetch);
            combined.prefetch_min_use = combined.prefetch_min_use.or(c.prefetch_min_use);
            combined.pin_share = combined.pin_share.or(c.pin_share);
            combined.threads = combined.threads.or(c.threads);
            combined.prefill_batch = combined.prefill_batch.or(c.prefill_batch);
        }
        let single = best
            .iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|&(i, _)| configs[i].clone())
            .unwrap_or_default();
        let mut confirm = vec![Settings::default(), single.clone()];
        if best.len() > 1 {
            confirm.push(combined.clone());
        }
        let (t2, _) = rounds_of(&bench, &confirm, &mut reference)?;
        for (c, t) in confirm.iter().zip(&t2).skip(1) {
            let mut r = row(c, t, &t2[0]);
            r.config = format!("{} (confirmation)", r.config);
            table.push(r);
        }
        let rs = paired_ratio(&t2[1], &t2[0]);
        match t2.get(2) {
            Some(tc) if beats(tc, &t2[0]) && paired_ratio(tc, &t2[0]) <= rs => {
                (combined, paired_ratio(tc, &t2[0]))
            }
            _ if beats(&t2[1], &t2[0]) => (single, rs),
            _ => (Settings::default(), 1.0),
        }
    };
    Ok(TuneResult {
        store_id,
        machine: Machine::current(&opts.store),
        // The baseline's own speed options go with what was kept on top of them.
        settings: Settings::of_options(opts).overlaid(&settings),
        ratio,
        table,
        prompts: prompts.len(),
        max_tokens: a.max_tokens,
        rounds: a.rounds,
        measured_at: rand_suffix() / 1_000_000_000,
    })
}

/// Runs `coli tune`: the table, the kept settings, and (unless `--no-save`) the saved file.
///
/// # Errors
/// As [`tune`]; the state directory not writable when saving.
pub fn run(a: &TuneArgs) -> Result<()> {
    let r = tune(a)?;
    let saved = if a.no_save {
        None
    } else {
        let p = tune_path(&r.store_id).context(
            "no state directory (COLI_STATE_DIR, XDG_STATE_HOME or HOME) to save the tune in; \
             set one or pass --no-save",
        )?;
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let tmp = p.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("writing {}", p.display()))?;
        Some(p)
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let w = r
        .table
        .iter()
        .map(|row| row.config.len())
        .max()
        .unwrap_or(0)
        .max(13);
    println!(
        "{:<w$} {:>10} {:>9} {:>9}",
        "configuration", "median s", "x default", "tok/s"
    );
    for row in &r.table {
        println!(
            "{:<w$} {:>10.3} {:>9.3} {:>9.1}",
            row.config, row.median_s, row.ratio, row.tok_s
        );
    }
    println!(
        "kept: {} ({:.3}x the default's time; {} prompts x {} tokens, {} round{}, every \
         configuration gave the default's tokens)",
        r.settings.flags(),
        r.ratio,
        r.prompts,
        r.max_tokens,
        r.rounds,
        if r.rounds == 1 { "" } else { "s" }
    );
    if let Some(p) = saved {
        println!(
            "saved to {}: run, chat, eval and serve use it for the options they are not given (--no-tune: ignore it)",
            p.display()
        );
    }
    Ok(())
}

/// Applies the saved tune of the store in `opts` (if any, measured on this machine) to every
/// option `explicit` says was not given, and says so on stderr. Nothing when `opts.no_tune`.
pub fn apply_saved(opts: &mut EngineOptions, explicit: &dyn Fn(&str) -> bool) {
    if opts.no_tune {
        return;
    }
    let Ok(bytes) = std::fs::read(opts.store.join("MANIFEST")) else {
        return;
    };
    let Ok(m) = coli_store::Manifest::parse(&bytes) else {
        return;
    };
    let Some(path) = tune_path(&m.store_id.to_string()) else {
        return;
    };
    let Ok(text) = std::fs::read(&path) else {
        return;
    };
    let r: TuneResult = match serde_json::from_slice(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "coli: ignoring {} ({e}); run `coli tune` again",
                path.display()
            );
            return;
        }
    };
    if r.machine != Machine::current(&opts.store) {
        eprintln!(
            "coli: {} was measured on another machine or drive; ignored (run `coli tune` here)",
            path.display()
        );
        return;
    }
    let used = r.settings.apply(opts, explicit);
    if used != Settings::default() {
        eprintln!(
            "coli: tuned settings from {}: {} (options given override them; --no-tune ignores them)",
            path.display(),
            used.flags()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_apply_respect_explicit_options() {
        let s = Settings {
            io: Some("pread".into()),
            queue_depth: Some(8),
            prefetch: Some(false),
            threads: Some(1),
            ..Settings::default()
        };
        assert_eq!(
            s.flags(),
            "--io pread --queue-depth 8 --no-prefetch --threads 1"
        );
        assert_eq!(Settings::default().flags(), "default");
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            e: EngineOptions,
        }
        let mut o = <Cli as clap::Parser>::parse_from(["x", "--store", "s", "--threads", "2"]).e;
        let used = s.apply(&mut o, &|id| id == "threads");
        assert_eq!(o.threads, Some(2), "given on the command line: kept");
        assert_eq!(o.queue_depth, Some(8));
        assert!(o.no_prefetch);
        assert_eq!(o.io, IoEngineChoice::named("pread").unwrap());
        assert_eq!(used.threads, None);
        assert_eq!(used.queue_depth, Some(8));
    }

    #[test]
    fn the_baseline_goes_with_what_was_kept() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            e: EngineOptions,
        }
        let o = <Cli as clap::Parser>::parse_from([
            "x",
            "--store",
            "s",
            "--no-prefetch",
            "--io",
            "pread",
        ])
        .e;
        let base = Settings::of_options(&o);
        assert_eq!(base.flags(), "--io pread --no-prefetch");
        let plain = <Cli as clap::Parser>::parse_from(["x", "--store", "s"]).e;
        assert_eq!(Settings::of_options(&plain), Settings::default());
        let won = Settings {
            queue_depth: Some(16),
            ..Settings::default()
        };
        assert_eq!(
            base.overlaid(&won).flags(),
            "--io pread --queue-depth 16 --no-prefetch"
        );
    }

    #[test]
    fn a_token_mismatch_is_an_error() {
        let d = vec![vec![1, 2, 3], vec![4, 5]];
        assert!(same_tokens("x", &d, &d.clone()).is_ok());
        let e = same_tokens("--queue-depth 8", &d, &[vec![1, 2, 3], vec![4, 6]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--queue-depth 8") && e.contains("prompt 1") && e.contains("token 1"),
            "{e}"
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        // Paired: a round where everything ran slow does not count against one configuration.
        assert_eq!(paired_ratio(&[1.0, 4.0, 1.0], &[2.0, 8.0, 1.0]), 0.5);
        // Kept only when faster in every round, and by 3% at the median.
        assert!(beats(&[1.0, 4.0, 0.9], &[2.0, 8.0, 1.0]));
        assert!(!beats(&[1.0, 4.0, 1.1], &[2.0, 8.0, 1.0]));
        assert!(!beats(&[0.99, 0.99, 0.99], &[1.0, 1.0, 1.0]));
    }
}
