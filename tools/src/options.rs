//! The options `coli run`, `chat`, `eval`, `serve` and `plan` share, turned into built
//! objects: the opened store (I/O engine, mirrors, O_DIRECT) and the engine (budget, pinning,
//! prefetch, usage history), as ripgrep's flags become its `HiArgs`. The commands and the
//! server take their store and engine from here.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use coli_engine::{parse_size, Engine, EngineOptions as CoreOptions, TextTokenizer};
use coli_store::{IoEngineChoice, IoPreference, OpenOptions, Store};
use std::path::PathBuf;
use std::time::Instant;

/// Whether expert records are read with O_DIRECT.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DirectArg {
    /// O_DIRECT when the file system supports it, else buffered.
    Auto,
    /// O_DIRECT or fail.
    On,
    /// Through the page cache.
    Off,
}

/// `--io`: `auto` or the name of an engine of the store's engine table.
pub fn parse_io_engine(s: &str) -> Result<IoEngineChoice, String> {
    s.parse()
}

/// Options shared by run, chat, eval, serve and plan.
#[derive(Args, Debug, Clone)]
pub struct EngineOptions {
    /// Store directory (written by coli-convert).
    #[arg(long, value_name = "DIR")]
    pub store: PathBuf,
    /// Expert cache capacity, pinned set included: bytes, or with a suffix K/M/G/T
    /// (=KiB/MiB/...) or KB/MB/GB. Default: MemAvailable, capped by the memory cgroup, minus
    /// the dense set, the KV cache and 512 MiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub ram_budget: Option<u64>,
    /// Do not pin the hottest experts of the usage history at start.
    #[arg(long)]
    pub no_pin: bool,
    /// Do not read every expert at start when the budget holds them all (by default such a
    /// model is read whole at load, as llama.cpp does, and decode never reads).
    #[arg(long)]
    pub no_preload: bool,
    /// Share of the budget the pinned hot set may take (0..1).
    #[arg(long, value_name = "F", default_value_t = coli_engine::placement::DEFAULT_PIN_SHARE,
          value_parser = parse_share, allow_negative_numbers = true)]
    pub pin_share: f64,
    /// Turn off router lookahead prefetch.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Pause lookahead prefetch while fewer than this share of the experts it reads are used
    /// (0..1; 0 keeps it always on; probes every 32 forward passes while paused).
    #[arg(long, value_name = "F", default_value_t = coli_engine::placement::DEFAULT_PREFETCH_MIN_USE,
          value_parser = parse_share, allow_negative_numbers = true)]
    pub prefetch_min_use: f64,
    /// Routing-usage history file (default: $COLI_STATE_DIR, $XDG_STATE_HOME/coli or
    /// ~/.local/state/coli, file `usage-<store id>.json`).
    #[arg(long, value_name = "FILE")]
    pub usage: Option<PathBuf>,
    /// Maximum tokens in the KV cache (default: max_position_embeddings, capped at 4096).
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,
    /// Worker threads (default: one per CPU). Output does not depend on it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Skip the checksum of every expert record read.
    #[arg(long)]
    pub no_verify: bool,
    /// I/O engine that reads expert records (docs/IO.md): auto (io_uring, or the pread engine,
    /// with a note, where the kernel refuses io_uring), uring (or fail), pread (positional
    /// reads on a thread pool), mmap (copies out of a memory map: page cache only, needs
    /// --direct auto or off).
    #[arg(long, default_value = "auto", value_parser = parse_io_engine)]
    pub io: IoEngineChoice,
    /// O_DIRECT reads of expert records (bypassing the page cache).
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
    /// Expert reads in flight at once (default 4, at most 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub queue_depth: Option<u16>,
    /// Prompt tokens per prefill forward pass (at least 1; on models with gated delta rule
    /// layers, passes are cut at multiples of 64 when N >= 64). Default: as many as the memory
    /// plan allows (a multiple of 64 from 64 to 512, at most the context; docs/ENGINE.md, "Long
    /// prompts").
    #[arg(long, value_name = "N", value_parser = parse_at_least_one)]
    pub prefill_batch: Option<usize>,
    /// Prefill a long prompt chunk by chunk through all layers instead of layer by layer: the
    /// same output, each chunk reading the experts again (for comparison; docs/ENGINE.md,
    /// "Long prompts").
    #[arg(long)]
    pub token_major_prefill: bool,
    /// Mirror directory: a full or partial read-only copy of the store on another drive
    /// (docs/MIRRORS.md); repeatable. Without --mirror: COLI_MIRRORS=DIR1,DIR2 (empty entries
    /// ignored); --mirror on the command line replaces COLI_MIRRORS.
    #[arg(long = "mirror", value_name = "DIR", value_delimiter = ',')]
    pub mirrors: Vec<PathBuf>,
    /// Read bandwidth weights of the drives: the store first, then each mirror in the order
    /// given (e.g. 9,3). Default: measured at open with a short O_DIRECT probe, cached.
    #[arg(long, value_name = "W,W,...")]
    pub disk_weights: Option<String>,
    /// RAM kept for finished conversations' KV caches, reused by any prompt that extends one
    /// (coli serve's prefix cache; docs/KV_CACHE.md): bytes or K/M/G/T. Default: one
    /// sequence's KV cache at --context for serve, 0 for run, chat and eval. The default
    /// --ram-budget leaves room for it.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub kv_cache_budget: Option<u64>,
    /// Ignore the settings `coli tune` saved for this store and machine (by default they apply
    /// to every option not given here).
    #[arg(long)]
    pub no_tune: bool,
    /// How products treat activations (docs/ENGINE.md, "Precision"): exact (f32 activations
    /// times the decoded weights) or q8a (int8 activations per block of 32 with integer dot
    /// products for int8, int4, mxfp4 and GGUF integer matrices, bf16 activations for bf16
    /// matrices: faster; those products give the same bits on every instruction set).
    /// Default: COLI_NUMERICS, else q8a.
    #[arg(long, value_name = "exact|q8a", value_parser = coli_kernels::Numerics::parse)]
    pub numerics: Option<coli_kernels::Numerics>,
}

/// The mirror directories: `--mirror` when given, else the non-empty entries of
/// `COLI_MIRRORS` (comma-separated).
pub fn mirror_dirs(cli: &[PathBuf]) -> Vec<PathBuf> {
    mirror_dirs_from(cli, std::env::var_os("COLI_MIRRORS"))
}

/// [`mirror_dirs`] with the value of `COLI_MIRRORS` given.
pub fn mirror_dirs_from(cli: &[PathBuf], env: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    if !cli.is_empty() {
        return cli.to_vec();
    }
    env.map(|v| {
        v.to_string_lossy()
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect()
    })
    .unwrap_or_default()
}

/// A byte size (`parse_size`: bytes, K/M/G/T = KiB/MiB/..., KB/MB/GB).
pub fn parse_budget(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A share: a number between 0 and 1 inclusive.
pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err("expected a number between 0 and 1".into()),
    }
}

/// A count of at least 1.
pub fn parse_at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

impl EngineOptions {
    /// How the store is opened: checksums (`--no-verify`), O_DIRECT (`--direct`), I/O engine
    /// (`--io`), queue depth, mirrors ([`mirror_dirs`]) and disk weights.
    ///
    /// # Errors
    /// Bad `--disk-weights`.
    pub fn open_options(&self) -> Result<OpenOptions> {
        Ok(OpenOptions {
            verify_checksums: !self.no_verify,
            io: match self.direct {
                DirectArg::Auto => IoPreference::Auto,
                DirectArg::On => IoPreference::Direct,
                DirectArg::Off => IoPreference::Buffered,
            },
            engine: self.io,
            queue_depth: self.queue_depth.map(usize::from),
            mirrors: mirror_dirs(&self.mirrors),
            disk_weights: self
                .disk_weights
                .as_deref()
                .map(coli_store::mirror::parse_disk_weights)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--disk-weights: {e}"))?,
            ..OpenOptions::default()
        })
    }

    /// The usage-history file: `--usage`, else the state directory's file for `store`
    /// ([`coli_engine::usage::default_usage_path`]; None when there is no state directory).
    pub fn usage_path(&self, store: &Store) -> Option<PathBuf> {
        self.usage
            .clone()
            .or_else(|| coli_engine::usage::default_usage_path(store.manifest().store_id))
    }

    /// The engine's options: budget, context, threads, prefill batch, pinning, prefetch and
    /// the usage history ([`EngineOptions::usage_path`]).
    pub fn core_options(&self, store: &Store) -> CoreOptions {
        CoreOptions {
            ram_budget: self.ram_budget,
            context: self.context,
            threads: self.threads.map(usize::from),
            prefill_batch: self
                .prefill_batch
                .unwrap_or(coli_engine::options::PREFILL_BATCH_AUTO),
            pin: !self.no_pin,
            pin_share: self.pin_share,
            preload: !self.no_preload,
            prefetch: !self.no_prefetch,
            prefetch_min_use: self.prefetch_min_use,
            usage: self.usage_path(store),
            max_sequences: 1,
            kv_cache_budget: self.kv_cache_budget,
            token_major_prefill: self.token_major_prefill,
        }
    }
}

/// An opened store plus what loading took.
pub struct Loaded {
    /// The store.
    pub store: Store,
    /// Its tokenizer, when it has one.
    pub tokenizer: Option<TextTokenizer>,
    /// Seconds opening the store and the tokenizer took.
    pub open_s: f64,
}

/// Why `dir` (which has no MANIFEST) is not a store, and what to do: a path that does not exist
/// or a plain file (a GGUF file is to be converted) is named as such; a Hugging Face checkpoint
/// (config.json and safetensors) is to be converted into another directory; a directory with a
/// store's other files (INDEX, segments/) is a damaged or unfinished store, for `coli-fsck`;
/// anything else is to be created with `coli-convert` (the demo, `bash tools/demo/demo.sh`,
/// makes one).
pub fn not_a_store(dir: &std::path::Path) -> String {
    let d = dir.display();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!(
            "{d} does not exist: pass the directory of a coli store, or create one with `coli-convert CHECKPOINT_DIR {d}` (`bash tools/demo/demo.sh` builds the demo store in demo/store)"
        ),
        Err(e) => format!("{d}: {e}"),
        Ok(m) if !m.is_dir() => {
            if dir
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            {
                format!(
                    "{d} is a GGUF file, not a coli store: convert it into a new directory first, e.g. `coli-convert {d} STORE_DIR`, then pass STORE_DIR"
                )
            } else {
                format!(
                    "{d} is a file, not a coli store (a store is a directory with a MANIFEST, written by `coli-convert`)"
                )
            }
        }
        // A Hugging Face checkpoint: config.json and safetensors.
        Ok(_) if dir.join("config.json").is_file()
            && std::fs::read_dir(dir).is_ok_and(|r| {
                r.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
            }) =>
        {
            format!(
                "{d} is a Hugging Face checkpoint, not a coli store: convert it into a new directory first, e.g. `coli-convert {d} STORE_DIR`, then pass STORE_DIR"
            )
        }
        // A store's other files without its MANIFEST: damaged or half written.
        Ok(_) if dir.join("INDEX").is_file() || dir.join("segments").is_dir() => format!(
            "{d} holds a coli store's files but no MANIFEST: the store is damaged or was never finished (MANIFEST is written last); run `coli-fsck {d}` to see what is there, or convert again into a new directory"
        ),
        Ok(_) => format!(
            "{d} is not a coli store (no MANIFEST): create one with `coli-convert CHECKPOINT_DIR STORE_DIR` (`bash tools/demo/demo.sh` builds the demo store in demo/store)"
        ),
    }
}

/// Opens the store in `dir` with `options`: a directory without a MANIFEST is refused with
/// [`not_a_store`]'s message (what it is and how to make a store), a store that does not open
/// with the reason and a pointer to `coli-fsck`.
///
/// # Errors
/// Those two.
pub fn open_store(dir: &std::path::Path, options: &OpenOptions) -> Result<Store> {
    if !dir.join("MANIFEST").is_file() {
        bail!("{}", not_a_store(dir));
    }
    Store::open_with(dir, options).with_context(|| {
        format!(
            "cannot open store {d} (run `coli-fsck {d}` to see what is wrong)",
            d = dir.display()
        )
    })
}

/// Opens the store the options name (its I/O engine, O_DIRECT choice, queue depth, mirrors
/// and disk weights) and its tokenizer.
///
/// # Errors
/// A directory that is not a store (saying how to make one), a store that does not open, bad
/// `--disk-weights`, a tokenizer that does not load.
pub fn open(opts: &EngineOptions) -> Result<Loaded> {
    let t0 = Instant::now();
    let store = open_store(&opts.store, &opts.open_options()?)?;
    let tokenizer = TextTokenizer::from_store(&store).context("loading the store's tokenizer")?;
    Ok(Loaded {
        store,
        tokenizer,
        open_s: t0.elapsed().as_secs_f64(),
    })
}

/// The engine over an opened store, with the options' budget, context, threads, pinning,
/// prefetch and usage history; warnings of the load go to stderr. Returns it and the seconds
/// the whole load took.
///
/// # Errors
/// A model that does not load (missing tensors, bad config) or invalid options.
pub fn engine<'s>(loaded: &'s Loaded, opts: &EngineOptions) -> Result<(Engine<'s>, f64)> {
    engine_with_sequences(loaded, opts, 1)
}

/// The numerics the coli tools run under: `--numerics` (`flag`), else `COLI_NUMERICS` when set
/// and not empty, else [`Numerics::Q8a`](coli_kernels::Numerics::Q8a) (docs/ENGINE.md
/// "Precision": the integer-activation rule, +0.67% perplexity on the demo model and up to 1.9x
/// faster resident decode). The library's own default stays `exact`
/// ([`coli_kernels::numerics`]): the tools choose q8a, embedders and the oracle tests choose
/// for themselves.
///
/// # Errors
/// A `COLI_NUMERICS` that names no numerics (the message names the variable and the values).
pub fn numerics(flag: Option<coli_kernels::Numerics>) -> Result<coli_kernels::Numerics> {
    numerics_and_source(flag).0
}

/// [`numerics`] and where it came from: `--numerics`, `COLI_NUMERICS` or `the default`
/// (`coli doctor` says which).
pub fn numerics_and_source(
    flag: Option<coli_kernels::Numerics>,
) -> (Result<coli_kernels::Numerics>, &'static str) {
    if let Some(n) = flag {
        return (Ok(n), "--numerics");
    }
    match std::env::var("COLI_NUMERICS") {
        Ok(v) if !v.trim().is_empty() => (
            coli_kernels::Numerics::parse(&v).map_err(|e| anyhow::anyhow!("COLI_NUMERICS: {e}")),
            "COLI_NUMERICS",
        ),
        Err(std::env::VarError::NotUnicode(v)) => (
            Err(anyhow::anyhow!(
                "COLI_NUMERICS: {v:?} is not UTF-8: expected exact (f32 activations) or q8a (int8 activations per block of 32)"
            )),
            "COLI_NUMERICS",
        ),
        _ => (Ok(coli_kernels::Numerics::Q8a), "the default"),
    }
}

/// Resolves [`numerics`] and sets it for the process ([`coli_kernels::set_numerics`]) before
/// any engine is built: what every command that computes does first.
///
/// # Errors
/// As [`numerics`].
pub fn apply_numerics(flag: Option<coli_kernels::Numerics>) -> Result<coli_kernels::Numerics> {
    let n = numerics(flag)?;
    coli_kernels::set_numerics(n);
    Ok(n)
}

/// [`engine`] with room for `max_sequences` sequences' KV caches (`coli serve --max-batch`;
/// the default expert budget leaves room for all of them).
///
/// # Errors
/// As [`engine`].
pub fn engine_with_sequences<'s>(
    loaded: &'s Loaded,
    opts: &EngineOptions,
    max_sequences: usize,
) -> Result<(Engine<'s>, f64)> {
    let t0 = Instant::now();
    apply_numerics(opts.numerics)?;
    // A COLI_ISA this CPU does not run (or a typo) falls back to the best instruction set: say so.
    let isa = coli_kernels::detected_isa().name();
    if let Ok(want) = std::env::var("COLI_ISA") {
        let forced_scalar = std::env::var("COLI_FORCE_SCALAR").is_ok_and(|v| v.trim() == "1");
        if want.trim() != isa && !forced_scalar {
            eprintln!(
                "warning: COLI_ISA={want} is not an instruction set this CPU runs (scalar, avx2-fma, avx512 where supported); using {isa}"
            );
        }
    }
    let core = CoreOptions {
        max_sequences,
        ..opts.core_options(&loaded.store)
    };
    let mut e = Engine::new(&loaded.store, &core)
        .with_context(|| format!("loading the model of {}", opts.store.display()))?;
    for w in e.take_warnings() {
        eprintln!("warning: {w}");
    }
    let p = e.placement();
    if p.preloaded {
        eprintln!(
            "coli: the expert budget ({}) holds all {} expert records ({}): read them all at start; decode reads nothing from disk (--no-preload to stream instead)",
            crate::units::bytes(p.budget as f64),
            p.pinned_experts,
            crate::units::bytes(p.pinned_bytes as f64)
        );
    }
    Ok((e, loaded.open_s + t0.elapsed().as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_come_from_the_command_line_else_from_coli_mirrors() {
        let env = |v: &str| Some(std::ffi::OsString::from(v));
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(mirror_dirs_from(&[], None), p(&[]));
        assert_eq!(mirror_dirs_from(&[], env("")), p(&[]));
        assert_eq!(mirror_dirs_from(&[], env(",, ,")), p(&[]));
        assert_eq!(mirror_dirs_from(&[], env("/a,,/b ")), p(&["/a", "/b"]));
        assert_eq!(mirror_dirs_from(&p(&["/c"]), env("/a,/b")), p(&["/c"]));
    }
}

/// Where the prefix cache keeps KV states on disk (chat and serve; docs/KV_CACHE.md).
#[derive(Args, Debug, Clone)]
pub struct KvDiskArgs {
    /// Directory of KV cache files, where conversations survive a restart (default:
    /// $COLI_STATE_DIR, $XDG_STATE_HOME/coli or ~/.local/state/coli, subdirectory `kv`).
    #[arg(long, value_name = "DIR")]
    pub kv_dir: Option<PathBuf>,
    /// Bytes of KV cache files the directory may hold, every store's together; the least
    /// recently used go first.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget, default_value = "16GiB")]
    pub kv_disk_budget: u64,
    /// Keep the prefix cache in RAM only (nothing is read from or written to disk).
    #[arg(long, conflicts_with = "kv_dir")]
    pub no_kv_disk: bool,
}

impl KvDiskArgs {
    /// The KV cache directory: `--kv-dir`, else the default under the state directory; None
    /// with `--no-kv-disk` (or when no state directory is known, with a note on stderr).
    pub fn dir(&self) -> Option<PathBuf> {
        if self.no_kv_disk {
            return None;
        }
        let d = self
            .kv_dir
            .clone()
            .or_else(coli_engine::prefix_cache::default_disk_dir);
        if d.is_none() {
            eprintln!("note: no state directory (HOME, XDG_STATE_HOME and COLI_STATE_DIR are unset): KV caches stay in RAM; pass --kv-dir DIR to keep them on disk");
        }
        d
    }

    /// Opens the prefix cache of `eng`: RAM within the engine's [`Engine::kv_cache_budget`],
    /// disk as these options say. Warnings about unusable files go to stderr.
    ///
    /// # Errors
    /// The directory cannot be created, listed or locked (the message names it and says how
    /// to run without it).
    pub fn open(&self, eng: &Engine<'_>) -> Result<coli_engine::prefix_cache::PrefixCache> {
        use coli_engine::prefix_cache::{PrefixCache, PrefixCacheOptions};
        let opts = PrefixCacheOptions {
            ram_budget: eng.kv_cache_budget(),
            disk_dir: self.dir(),
            disk_budget: self.kv_disk_budget,
        };
        let mut c = PrefixCache::open(eng.kv_layout(), &opts).map_err(|e| {
            anyhow::anyhow!("opening the KV cache directory: {e} (pass --kv-dir DIR, or --no-kv-disk to keep KV caches in RAM only)")
        })?;
        for w in c.take_warnings() {
            eprintln!("warning: {w}");
        }
        Ok(c)
    }
}

/// `--speculate`: where drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpeculateArg {
    /// One token per decode pass.
    Off,
    /// Prompt lookup: the tokens that followed the last n-gram's most recent earlier occurrence.
    Ngram,
    /// The store's multi-token-prediction layer (an error where it has none).
    Mtp,
    /// MTP where the store has it, else prompt lookup; drafting pauses while it does not pay.
    Auto,
}

/// Speculative decoding options of run, chat and serve (docs/ENGINE.md, "Speculative
/// decoding"). The tokens are the same whatever they are.
#[derive(Args, Debug, Clone)]
pub struct SpeculationArgs {
    /// Draft tokens to verify per decode pass: prompt lookup (ngram), the MTP layer (mtp), or
    /// auto (mtp where the store has an MTP layer, else ngram).
    #[arg(long, value_enum, default_value_t = SpeculateArg::Auto)]
    pub speculate: SpeculateArg,
    /// Drafts per decode pass at most (k).
    #[arg(long, value_name = "K", default_value_t = coli_engine::speculative::DEFAULT_DRAFT_TOKENS as u32,
          value_parser = clap::value_parser!(u32).range(1..=coli_engine::speculative::MAX_DRAFT_TOKENS as i64))]
    pub draft_tokens: u32,
    /// Draft on every pass that has a proposal, even where the measured gain does not pay
    /// (for measurements).
    #[arg(long)]
    pub no_draft_gate: bool,
}

impl SpeculationArgs {
    /// The engine's speculation parameters.
    pub fn params(&self) -> coli_engine::SpeculationParams {
        use coli_engine::Speculate;
        coli_engine::SpeculationParams {
            mode: match self.speculate {
                SpeculateArg::Off => Speculate::Off,
                SpeculateArg::Ngram => Speculate::Ngram,
                SpeculateArg::Mtp => Speculate::Mtp,
                SpeculateArg::Auto => Speculate::Auto,
            },
            draft_tokens: self.draft_tokens as usize,
            gate: !self.no_draft_gate,
            ..Default::default()
        }
    }
}
