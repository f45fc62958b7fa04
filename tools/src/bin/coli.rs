//! `coli`: run MoE models from a coli block store.
//!
//! - `coli run --store DIR --prompt TEXT [--chat]` / `--prompt-ids 1,2,3`: generate, streaming
//!   text to stdout and statistics to stderr (`--json`: one JSON object instead).
//! - `coli chat --store DIR`: multi-turn chat on stdin/stdout, KV cache kept across turns.
//! - `coli eval --store DIR --text FILE`: teacher-forced perplexity of a text file.
//! - `coli info STORE [--json]`: what a store holds.
//! - `coli serve --store DIR [--port 8000]`: OpenAI-compatible HTTP server (docs/SERVE.md).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use coli_engine::{
    parse_size, ChatMessage, Engine, EngineOptions as CoreOptions, GenerateParams, Generation,
    Logits, SamplingParams, StreamDecoder, TextTokenizer,
};
use coli_store::{IoEngineChoice, IoPreference, OpenOptions, Store};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

#[path = "../info.rs"]
mod info;
#[path = "../mirror.rs"]
mod mirror;
#[path = "../plan.rs"]
mod plan;
#[path = "../serve/mod.rs"]
mod serve;

#[derive(Parser)]
#[command(
    name = "coli",
    version,
    about = "Run Mixture-of-Experts models larger than RAM from a coli block store"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate a continuation of a prompt.
    Run(RunArgs),
    /// Interactive multi-turn chat (one user message per line; /reset, /exit).
    Chat(ChatArgs),
    /// Teacher-forced perplexity of a text file.
    Eval(EvalArgs),
    /// Describe a store.
    Info(InfoArgs),
    /// Where a RAM budget goes and the decode speed bound it implies (disk probe included).
    Plan(plan::PlanArgs),
    /// OpenAI-compatible HTTP server (chat/completions, streaming, /metrics).
    Serve(serve::ServeArgs),
    /// Build and check mirrors of a store on other drives (plan, stage, copy, verify).
    Mirror(mirror::MirrorArgs),
}

/// Whether expert records are read with O_DIRECT.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum DirectArg {
    /// O_DIRECT when the file system supports it, else buffered.
    Auto,
    /// O_DIRECT or fail.
    On,
    /// Through the page cache.
    Off,
}

/// `--io`: `auto` or the name of an engine of the store's engine table.
fn parse_io_engine(s: &str) -> Result<IoEngineChoice, String> {
    s.parse()
}

/// Options shared by run, chat and eval.
#[derive(Args, Debug)]
struct EngineOptions {
    /// Store directory (written by coli-convert).
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Expert cache capacity, pinned set included: bytes, or with a suffix K/M/G/T
    /// (=KiB/MiB/...) or KB/MB/GB. Default: MemAvailable minus the dense set, the KV cache and
    /// 512 MiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    ram_budget: Option<u64>,
    /// Do not pin the hottest experts of the usage history at start.
    #[arg(long)]
    no_pin: bool,
    /// Share of the budget the pinned hot set may take (0..1).
    #[arg(long, value_name = "F", default_value_t = coli_engine::engine::DEFAULT_PIN_SHARE,
          value_parser = parse_share, allow_negative_numbers = true)]
    pin_share: f64,
    /// Turn off router lookahead prefetch.
    #[arg(long)]
    no_prefetch: bool,
    /// Pause lookahead prefetch while fewer than this share of the experts it reads are used
    /// (0..1; 0 keeps it always on; probes every 32 forward passes while paused).
    #[arg(long, value_name = "F", default_value_t = coli_engine::engine::DEFAULT_PREFETCH_MIN_USE,
          value_parser = parse_share, allow_negative_numbers = true)]
    prefetch_min_use: f64,
    /// Routing-usage history file (default: $COLI_STATE_DIR, $XDG_STATE_HOME/coli or
    /// ~/.local/state/coli, file usage-<store id>.json).
    #[arg(long, value_name = "FILE")]
    usage: Option<PathBuf>,
    /// Maximum tokens in the KV cache (default: max_position_embeddings, capped at 4096).
    #[arg(long, value_name = "N")]
    context: Option<usize>,
    /// Worker threads (default: one per CPU). Output does not depend on it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    threads: Option<u16>,
    /// Skip the checksum of every expert record read.
    #[arg(long)]
    no_verify: bool,
    /// I/O engine that reads expert records (docs/IO.md): auto (io_uring, or the pread engine,
    /// with a note, where the kernel refuses io_uring), uring (or fail), pread (positional
    /// reads on a thread pool), mmap (copies out of a memory map: page cache only, needs
    /// --direct auto or off).
    #[arg(long, default_value = "auto", value_parser = parse_io_engine)]
    io: IoEngineChoice,
    /// O_DIRECT reads of expert records (bypassing the page cache).
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    direct: DirectArg,
    /// Expert reads in flight at once (default 4, at most 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    queue_depth: Option<u16>,
    /// Prompt tokens per prefill batch (at least 1).
    #[arg(long, value_name = "N", default_value_t = coli_engine::engine::DEFAULT_PREFILL_BATCH,
          value_parser = parse_at_least_one)]
    prefill_batch: usize,
    /// Mirror directory: a full or partial read-only copy of the store on another drive
    /// (docs/MIRRORS.md); repeatable. Without --mirror: COLI_MIRRORS=DIR1,DIR2 (empty entries
    /// ignored); --mirror on the command line replaces COLI_MIRRORS.
    #[arg(long = "mirror", value_name = "DIR", value_delimiter = ',')]
    mirrors: Vec<PathBuf>,
    /// Read bandwidth weights of the drives: the store first, then each mirror in the order
    /// given (e.g. 9,3). Default: measured at open with a short O_DIRECT probe, cached.
    #[arg(long, value_name = "W,W,...")]
    disk_weights: Option<String>,
}

/// The mirror directories: `--mirror` when given, else the non-empty entries of
/// `COLI_MIRRORS` (comma-separated).
fn mirror_dirs(cli: &[PathBuf]) -> Vec<PathBuf> {
    mirror_dirs_from(cli, std::env::var_os("COLI_MIRRORS"))
}

/// [`mirror_dirs`] with the value of `COLI_MIRRORS` given.
fn mirror_dirs_from(cli: &[PathBuf], env: Option<std::ffi::OsString>) -> Vec<PathBuf> {
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

fn parse_budget(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// A share: a number between 0 and 1 inclusive.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err("expected a number between 0 and 1".into()),
    }
}

/// A count of at least 1.
fn parse_at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err("expected a whole number of at least 1".into()),
    }
}

#[derive(Args, Debug)]
struct SamplingArgs {
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this total probability.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    fn params(&self) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
            stop_on_eos: true,
        }
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    engine: EngineOptions,
    /// Prompt text (tokenized with the store's tokenizer, BOS added as the tokenizer does).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, fed exactly (no BOS, no template).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as one user message in the chat template (with the generation prompt).
    #[arg(long, conflicts_with = "prompt_ids")]
    chat: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print one JSON object (ids, text, stats) instead of streaming.
    #[arg(long)]
    json: bool,
    /// Write the logits of the last prompt position to FILE as a JSON array.
    #[arg(long, value_name = "FILE")]
    logits_out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ChatArgs {
    #[command(flatten)]
    engine: EngineOptions,
    /// System message placed before the conversation.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args, Debug)]
struct EvalArgs {
    #[command(flatten)]
    engine: EngineOptions,
    /// UTF-8 text file to score.
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Score at most the first N tokens.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Print a JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct InfoArgs {
    /// Store directory.
    store: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// An opened store plus what loading took.
struct Loaded {
    store: Store,
    tokenizer: Option<TextTokenizer>,
    open_s: f64,
}

fn open(opts: &EngineOptions) -> Result<Loaded> {
    let t0 = Instant::now();
    if !opts.store.join("MANIFEST").is_file() {
        bail!(
            "{} is not a coli store (no MANIFEST); create one with `coli-convert CHECKPOINT {}`",
            opts.store.display(),
            opts.store.display()
        );
    }
    let io = match opts.direct {
        DirectArg::Auto => IoPreference::Auto,
        DirectArg::On => IoPreference::Direct,
        DirectArg::Off => IoPreference::Buffered,
    };
    let io_engine = opts.io;
    let store = Store::open_with(
        &opts.store,
        &OpenOptions {
            verify_checksums: !opts.no_verify,
            io,
            engine: io_engine,
            queue_depth: opts.queue_depth.map(usize::from),
            mirrors: mirror_dirs(&opts.mirrors),
            disk_weights: opts
                .disk_weights
                .as_deref()
                .map(coli_store::mirror::parse_disk_weights)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--disk-weights: {e}"))?,
            ..OpenOptions::default()
        },
    )
    .with_context(|| format!("opening store {}", opts.store.display()))?;
    let tokenizer = TextTokenizer::from_store(&store).context("loading the store's tokenizer")?;
    Ok(Loaded {
        store,
        tokenizer,
        open_s: t0.elapsed().as_secs_f64(),
    })
}

fn engine<'s>(loaded: &'s Loaded, opts: &EngineOptions) -> Result<(Engine<'s>, f64)> {
    let t0 = Instant::now();
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
    let usage = opts
        .usage
        .clone()
        .or_else(|| coli_engine::usage::default_usage_path(loaded.store.manifest().store_id));
    let core = CoreOptions {
        ram_budget: opts.ram_budget,
        context: opts.context,
        threads: opts.threads.map(usize::from),
        prefill_batch: opts.prefill_batch,
        pin: !opts.no_pin,
        pin_share: opts.pin_share,
        prefetch: !opts.no_prefetch,
        prefetch_min_use: opts.prefetch_min_use,
        usage,
    };
    let mut e = Engine::new(&loaded.store, &core)
        .with_context(|| format!("loading the model of {}", opts.store.display()))?;
    for w in e.take_warnings() {
        eprintln!("warning: {w}");
    }
    Ok((e, loaded.open_s + t0.elapsed().as_secs_f64()))
}

fn fmt_bytes(b: f64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.2} {}", U[i])
    }
}

/// `kv`: KV-cache bytes per token and tokens held.
fn print_stats(g: &Generation, load_s: f64, io: &str, kv: (u64, usize)) {
    let s = &g.stats;
    eprintln!("load: {load_s:.2} s (io: {io})");
    eprintln!(
        "kv cache: {} per token, {} for the {} tokens held",
        fmt_bytes(kv.0 as f64),
        fmt_bytes((kv.0 * kv.1 as u64) as f64),
        kv.1
    );
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s), TTFT {:.3} s",
        s.prompt_tokens,
        s.prefill_s,
        s.prefill_tok_s(),
        s.ttft_s
    );
    eprintln!(
        "decode: {} tokens generated, {} decode steps in {:.3} s ({:.1} tok/s), stop: {:?}",
        s.generated_tokens,
        s.decode_steps,
        s.decode_s,
        s.decode_tok_s(),
        g.stop
    );
    eprintln!(
        "experts: {} read from disk ({} per token), cache hits {} misses {} (hit rate {:.1}%), evictions {}",
        fmt_bytes(s.expert_bytes_read as f64),
        fmt_bytes(s.expert_bytes_per_token()),
        s.cache.hits,
        s.cache.misses,
        s.cache.hit_rate() * 100.0,
        s.cache.evictions
    );
    print_placement_stats(s);
}

/// The tiered-cache and prefetch lines of the run statistics (stderr).
fn print_placement_stats(s: &coli_engine::GenerationStats) {
    let c = &s.cache;
    eprintln!(
        "disk per token: {} demand + {} prefetch; hits by tier: pinned {}, cache {}, in flight {}",
        fmt_bytes(s.per_token(c.demand_bytes as f64)),
        fmt_bytes(s.per_token(c.prefetch_bytes as f64)),
        c.pinned_hits,
        c.hits - c.pinned_hits - c.inflight_waits,
        c.inflight_waits
    );
    eprintln!(
        "prefetch: {} experts read, {} used; prediction precision {:.1}% recall {:.1}%",
        c.prefetch_reads,
        c.prefetch_used,
        c.prefetch_precision() * 100.0,
        c.prefetch_recall() * 100.0
    );
    eprintln!(
        "per token: I/O wait {:.2} ms (+{:.2} ms of reads hidden behind compute), compute {:.2} ms; disk {:.3} GiB/s",
        s.per_token(s.io_wait_s()) * 1e3,
        s.per_token(c.io_hidden_ns as f64 * 1e-9) * 1e3,
        s.per_token(s.compute_s()) * 1e3,
        s.disk_gib_s()
    );
}

/// The placement stats as JSON fields (merged into `coli run --json`'s `stats`).
fn placement_json(s: &coli_engine::GenerationStats, eng: &Engine<'_>) -> serde_json::Value {
    let c = &s.cache;
    let p = eng.placement();
    serde_json::json!({
        "demand_bytes": c.demand_bytes,
        "prefetch_bytes": c.prefetch_bytes,
        "demand_bytes_per_token": s.per_token(c.demand_bytes as f64),
        "prefetch_bytes_per_token": s.per_token(c.prefetch_bytes as f64),
        "pinned_hits": c.pinned_hits,
        "cache_hits": c.hits - c.pinned_hits - c.inflight_waits,
        "inflight_waits": c.inflight_waits,
        "prefetch_reads": c.prefetch_reads,
        "prefetch_used": c.prefetch_used,
        "prefetch_precision": c.prefetch_precision(),
        "prefetch_recall": c.prefetch_recall(),
        "prefetch_read_precision": c.prefetch_read_precision(),
        "io_wait_s": s.io_wait_s(),
        "compute_s": s.compute_s(),
        "io_wait_s_per_token": s.per_token(s.io_wait_s()),
        "io_hidden_s": c.io_hidden_ns as f64 * 1e-9,
        "compute_s_per_token": s.per_token(s.compute_s()),
        "disk_gib_s": s.disk_gib_s(),
        "ram_budget": p.budget,
        "pinned_experts": p.pinned_experts,
        "pinned_bytes": p.pinned_bytes,
        "lru_capacity": p.lru_capacity,
        "prefetch": p.prefetch,
        "prefetch_use_estimate": eng.prefetch_gate().estimate(),
        "prefetch_passes_skipped": eng.prefetch_gate().skipped(),
    })
}

/// The I/O mode and engine, for the stats line.
fn io_desc(store: &Store) -> String {
    format!("{}, {}", io_name(store), store.io_engine_description())
}

fn io_name(store: &Store) -> &'static str {
    match store.io_mode() {
        coli_store::IoMode::Direct => "direct",
        coli_store::IoMode::Buffered => "buffered",
    }
}

fn run(a: RunArgs) -> Result<()> {
    let loaded = open(&a.engine)?;
    let (mut eng, load_s) = engine(&loaded, &a.engine)?;
    let tok = loaded.tokenizer.as_ref();
    let prompt_ids = match (&a.prompt_ids, &a.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(text)) => {
            let tok = tok.context(
                "the store has no tokenizer.json, so --prompt cannot be tokenized; pass --prompt-ids instead",
            )?;
            if a.chat {
                tok.chat_ids(&[ChatMessage::new("user", text)], true)
                    .context("applying the chat template")?
                    .1
            } else {
                tok.encode(text, true).context("tokenizing the prompt")?
            }
        }
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    if let Some(path) = &a.logits_out {
        let logits = eng
            .forward(&prompt_ids, Logits::Last)
            .context("running the prompt")?;
        let json = serde_json::to_string(&logits[0])?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        // Generation below prefills the prompt again, so its statistics cover the whole prompt.
        eng.reset();
    }
    let params = a.sampling.params();
    let stream = !a.json;
    let mut dec = StreamDecoder::new();
    let mut stdout = std::io::stdout().lock();
    let g = eng
        .generate(&prompt_ids, &params, |id| {
            if stream {
                let piece = match tok {
                    Some(t) => dec.push(t, id)?,
                    None => format!("{id} "),
                };
                if !piece.is_empty() {
                    // A closed stdout (e.g. `| head`) stops generation instead of failing.
                    if stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                        .is_err()
                    {
                        return Ok(false);
                    }
                }
            }
            Ok(true)
        })
        .context("generating")?;
    for w in eng.take_warnings() {
        eprintln!("warning: {w}");
    }
    if stream {
        if let Some(t) = tok {
            let rest = dec.finish(t)?;
            let _ = stdout.write_all(rest.as_bytes());
        }
        let _ = writeln!(stdout);
        let _ = stdout.flush();
        let kv = (eng.kv_bytes_per_token(), eng.cached_tokens().len());
        print_stats(&g, load_s, &io_desc(&loaded.store), kv);
        mirror::print_stats(&loaded.store);
    } else {
        let s = &g.stats;
        let mut obj = serde_json::json!({
            "prompt_ids": prompt_ids,
            "token_ids": g.tokens,
            "stop_reason": g.stop,
            "stats": {
                "load_s": load_s,
                "ttft_s": s.ttft_s,
                "prefill_s": s.prefill_s,
                "decode_s": s.decode_s,
                "prompt_tokens": s.prompt_tokens,
                "generated_tokens": s.generated_tokens,
                "prefill_tok_s": s.prefill_tok_s(),
                "decode_tok_s": s.decode_tok_s(),
                "expert_bytes_read": s.expert_bytes_read,
                "expert_bytes_per_token": s.expert_bytes_per_token(),
                "expert_bytes_fetched": s.cache.bytes_fetched,
                "hits": s.cache.hits,
                "misses": s.cache.misses,
                "evictions": s.cache.evictions,
                "hit_rate": s.cache.hit_rate(),
                "io_mode": io_name(&loaded.store),
                "io_engine": loaded.store.io_engine(),
                "queue_depth": loaded.store.queue_depth(),
                "threads": eng.threads(),
                "kernels": coli_kernels::detected_isa().name(),
                "kv_bytes_per_token": eng.kv_bytes_per_token(),
            }
        });
        if let (Some(stats), serde_json::Value::Object(extra)) =
            (obj["stats"].as_object_mut(), placement_json(s, &eng))
        {
            stats.extend(extra);
        }
        if let Some(m) = mirror::stats_json(&loaded.store) {
            obj["stats"]["mirrors"] = m;
        }
        if let Some(t) = tok {
            obj["text"] = serde_json::Value::from(t.decode(&g.tokens, true)?);
        }
        println!("{obj}");
    }
    Ok(())
}

fn chat(a: ChatArgs) -> Result<()> {
    let loaded = open(&a.engine)?;
    let (mut eng, load_s) = engine(&loaded, &a.engine)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .context("chat needs the store's tokenizer.json")?;
    if tok.chat_template.is_none() {
        bail!("the store has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
    }
    eprintln!("loaded in {load_s:.2} s; one message per line, /reset to start over, /exit or Ctrl-D to quit");
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage::new("system", s));
    }
    let base = messages.len();
    let params = a.sampling.params();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.context("reading stdin")?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.truncate(base);
                eng.reset();
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", text));
        let (_, ids) = tok
            .chat_ids(&messages, true)
            .context("applying the chat template")?;
        let mut dec = StreamDecoder::new();
        let mut out = std::io::stdout().lock();
        let g = match eng.generate(&ids, &params, |id| {
            let piece = dec.push(tok, id)?;
            if !piece.is_empty()
                && out
                    .write_all(piece.as_bytes())
                    .and_then(|_| out.flush())
                    .is_err()
            {
                return Ok(false);
            }
            Ok(true)
        }) {
            Ok(g) => g,
            Err(coli_engine::EngineError::ContextOverflow { needed, context }) => {
                eprintln!("\nthe conversation needs {needed} tokens but the context holds {context}; use /reset or --context");
                messages.pop();
                continue;
            }
            Err(e) => return Err(e).context("generating"),
        };
        let rest = dec.finish(tok)?;
        let _ = writeln!(out, "{rest}");
        let _ = out.flush();
        let reply = tok.decode(&g.tokens, true)?;
        messages.push(ChatMessage::new("assistant", &reply));
        let s = &g.stats;
        eprintln!(
            "[{} new prompt tokens, {} generated, TTFT {:.2} s, {:.1} tok/s, {} expert bytes read, hit rate {:.1}%]",
            s.prompt_tokens,
            s.generated_tokens,
            s.ttft_s,
            s.decode_tok_s(),
            s.expert_bytes_read,
            s.cache.hit_rate() * 100.0
        );
    }
    Ok(())
}

fn eval(a: EvalArgs) -> Result<()> {
    let loaded = open(&a.engine)?;
    let (mut eng, load_s) = engine(&loaded, &a.engine)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .context("eval needs the store's tokenizer.json")?;
    let text = std::fs::read_to_string(&a.text)
        .with_context(|| format!("reading {}", a.text.display()))?;
    let mut ids = tok.encode(&text, true).context("tokenizing the text")?;
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    if ids.len() < 2 {
        bail!(
            "{} has fewer than 2 tokens; nothing to score",
            a.text.display()
        );
    }
    if ids.len() > eng.context() {
        bail!(
            "{} has {} tokens but the context holds {}; pass --max-tokens {} or a larger --context",
            a.text.display(),
            ids.len(),
            eng.context(),
            eng.context()
        );
    }
    let t0 = Instant::now();
    let (nll, n) = eng.mean_nll(&ids).context("scoring")?;
    let secs = t0.elapsed().as_secs_f64();
    let ppl = nll.exp();
    let cs = eng.cache_stats();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"tokens": ids.len(), "predicted": n, "mean_nll": nll, "ppl": ppl,
                               "load_s": load_s, "eval_s": secs, "tok_s": n as f64 / secs,
                               "expert_bytes_read": loaded.store.stats().bytes_read,
                               "hit_rate": cs.hit_rate(), "evictions": cs.evictions})
        );
    } else {
        println!(
            "tokens: {} (predicted {n}), mean NLL {nll:.4} nats, perplexity {ppl:.4}",
            ids.len()
        );
        eprintln!(
            "load {load_s:.2} s, eval {secs:.2} s ({:.1} tok/s), hit rate {:.1}%, evictions {}",
            n as f64 / secs,
            cs.hit_rate() * 100.0,
            cs.evictions
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Chat(a) => chat(a),
        Cmd::Eval(a) => eval(a),
        Cmd::Info(a) => info::run(&a.store, a.json),
        Cmd::Plan(a) => plan::run(&a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Mirror(a) => {
            let verify = a.is_verify();
            match mirror::run(a) {
                Ok(0) => Ok(()),
                Ok(code) => return std::process::ExitCode::from(code),
                // verify's 1 means damaged: a check that could not run exits 2 (as coli-fsck).
                Err(e) if verify => {
                    eprintln!("error: {}", error_chain(&e));
                    return std::process::ExitCode::from(2);
                }
                Err(e) => Err(e),
            }
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": " (each error adds its context once: a library error
/// shows its inner error in its message or returns it as `source()`, never both).
fn error_chain(e: &anyhow::Error) -> String {
    format!("{e:#}")
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
