//! `coli`: run MoE models from a coli block store.
//!
//! - `coli run --store DIR --prompt TEXT [--chat]` / `--prompt-ids 1,2,3`: generate, streaming
//!   text to stdout and statistics to stderr (`--json`: one JSON object instead).
//! - `coli chat --store DIR`: multi-turn chat on stdin/stdout, KV cache kept across turns.
//! - `coli eval --store DIR --text FILE`: teacher-forced perplexity of a text file.
//! - `coli info STORE [--json]`: what a store holds.
//! - `coli serve --store DIR [--port 8000]`: OpenAI-compatible HTTP server (docs/SERVE.md).

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Parser, Subcommand};
use coli_engine::trace::RoutingTrace;
use coli_engine::{
    ChatMessage, Engine, GenerateParams, Generation, Logits, SamplingParams, StreamDecoder,
};
use coli_store::Store;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use coli_tools::options::{engine, open, EngineOptions, SpeculationArgs};
use coli_tools::serve::text::{reply_format, Piece, ReplyText};
use coli_tools::{doctor, info, kv, mirror, plan, serve, session, tune};

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
    /// Measure the speed settings (I/O engine, queue depth, prefetch, pinning, threads, prefill
    /// batch) on this machine and store, keep the fastest for run/chat/eval/serve.
    Tune(tune::TuneArgs),
    /// Check this machine and a store (CPU, memory, O_DIRECT, io_uring, disks, fsck): PASS /
    /// WARN / FAIL per check with the fix; exit 1 when a check fails, 2 when it cannot run.
    Doctor(doctor::DoctorArgs),
    /// OpenAI-compatible HTTP server (chat/completions, streaming, /metrics).
    Serve(serve::ServeArgs),
    /// `coli serve --web`: the server with its web page at / (chat, live figures, heat map of
    /// expert routing and residency, memory plan).
    Web(serve::ServeArgs),
    /// Build and check mirrors of a store on other drives (plan, stage, copy, verify).
    Mirror(mirror::MirrorArgs),
    /// The prefix cache's KV cache files on disk: list them (ls) or remove them (clear).
    Kv(kv::KvArgs),
    /// Write a store back in another format: `--gguf STORE OUT.gguf` (a store converted from a
    /// GGUF: its blocks and metadata, loadable by llama.cpp).
    Export(ExportArgs),
}

#[derive(Args, Debug)]
struct ExportArgs {
    /// Write a GGUF (the only format so far).
    #[arg(long, required = true)]
    gguf: bool,
    /// The store directory.
    store: PathBuf,
    /// The GGUF file to write (written as OUT.partial, then renamed).
    out: PathBuf,
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
    #[command(flatten)]
    speculation: SpeculationArgs,
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
            speculation: self.speculation.params(),
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
    /// Write every token's routing and lookahead prediction, per MoE layer, to FILE (JSON
    /// lines: pos, layer, experts, predicted; see coli_engine::trace). Tokens are unchanged.
    #[arg(long, value_name = "FILE")]
    routing_trace: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ChatArgs {
    #[command(flatten)]
    engine: EngineOptions,
    /// System message placed before the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Name of a conversation kept across runs: its messages are saved in the state
    /// directory's `sessions/NAME.json` after every turn and its KV cache in the KV cache
    /// directory, so that the next `coli chat --session NAME` resumes it without prefilling the
    /// history again. /reset empties it.
    #[arg(long, value_name = "NAME", value_parser = parse_session_name)]
    session: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    kv_disk: coli_tools::options::KvDiskArgs,
}

/// A session name: letters, digits, `-`, `_` and `.`, not starting with `.` (it names a file).
fn parse_session_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.to_string())
    } else {
        Err("expected 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'".into())
    }
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
#[command(group(ArgGroup::new("store_dir").required(true).args(["store", "store_flag"])))]
struct InfoArgs {
    /// Store directory.
    store: Option<PathBuf>,
    /// Store directory, as run/chat/plan/serve take it (the same as the positional argument).
    #[arg(long = "store", value_name = "DIR")]
    store_flag: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `n` and the noun in the number it needs ("1 token", "2 tokens").
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `kv`: KV-cache bytes per token and tokens held; `prefill_batch`: prompt tokens per prefill
/// pass (`--prefill-batch` or the memory plan's chunk, as `--json`'s `stats.prefill_batch`).
fn print_stats(
    g: &Generation,
    load_s: f64,
    io: &str,
    kv: (u64, usize),
    prefetch: bool,
    prefill_batch: usize,
) {
    let s = &g.stats;
    eprintln!(
        "load: {load_s:.2} s (io: {io}); numerics {} ({})",
        coli_kernels::numerics().name(),
        coli_kernels::numerics_id(coli_kernels::detected_isa())
    );
    eprintln!(
        "kv cache: {} per token, {} for the {} tokens held",
        coli_tools::units::bytes(kv.0 as f64),
        coli_tools::units::bytes((kv.0 * kv.1 as u64) as f64),
        kv.1
    );
    eprintln!(
        "prefill: {} in {:.3} s ({:.1} tok/s, up to {prefill_batch} per pass), TTFT {:.3} s",
        count(s.prompt_tokens, "token", "tokens"),
        s.prefill_s,
        s.prefill_tok_s(),
        s.ttft_s
    );
    eprintln!(
        "decode: {} generated, {} in {:.3} s ({:.1} tok/s), stop: {:?}",
        count(s.generated_tokens, "token", "tokens"),
        count(s.decode_steps, "decode pass", "decode passes"),
        s.decode_s,
        s.decode_tok_s(),
        g.stop
    );
    let sp = &s.speculation;
    let per_generated = coli_tools::units::bytes(s.expert_bytes_per_generated_token());
    if sp.drafts_proposed == 0 && sp.gate_paused_passes == 0 {
        // Nothing was drafted (off, or no proposal): one token per decode pass.
        eprintln!(
            "speculation: {}, no drafts; {per_generated} of experts read per generated token",
            s.speculation_mode.name()
        );
    } else {
        eprintln!(
            "speculation: {}; {} proposed, {} accepted ({:.1}%), {}, {:.2} tokens generated per decode pass after the first token, {} paused by the draft gate; {per_generated} of experts read per generated token",
            s.speculation_mode.name(),
            count(sp.drafts_proposed as usize, "draft", "drafts"),
            sp.drafts_accepted,
            sp.acceptance_rate() * 100.0,
            count(sp.verify_passes as usize, "verify pass", "verify passes"),
            s.tokens_per_forward(),
            count(sp.gate_paused_passes as usize, "pass", "passes"),
        );
    }
    eprintln!(
        "experts: {} read from disk ({} per token run, prompt included), cache hits {} waits for reads in flight {} misses {} (hit rate {:.1}%, in flight {:.1}%), evictions {}",
        coli_tools::units::bytes(s.expert_bytes_read as f64),
        coli_tools::units::bytes(s.expert_bytes_per_token()),
        s.cache.hits - s.cache.inflight_waits,
        s.cache.inflight_waits,
        s.cache.misses,
        s.cache.hit_rate() * 100.0,
        s.cache.inflight_rate() * 100.0,
        s.cache.evictions
    );
    print_placement_stats(s, prefetch);
}

/// The tiered-cache and prefetch lines of the run statistics (stderr).
fn print_placement_stats(s: &coli_engine::GenerationStats, prefetch: bool) {
    let c = &s.cache;
    eprintln!(
        "disk per token: {} demand + {} prefetch; hits by tier: pinned {}, cache {}, in flight {}",
        coli_tools::units::bytes(s.per_token(c.demand_bytes as f64)),
        coli_tools::units::bytes(s.per_token(c.prefetch_bytes as f64)),
        c.pinned_hits,
        c.hits - c.pinned_hits - c.inflight_waits,
        c.inflight_waits
    );
    if !prefetch {
        eprintln!("prefetch: off");
    } else if c.prefetch_reads == 0 {
        eprintln!(
            "prefetch: on, no expert read ahead (each predicted expert was already cached or in \
             flight, or the cache holds none)"
        );
    } else {
        eprintln!(
            "prefetch: {} experts read, {} used; prediction precision {:.1}% recall {:.1}%",
            c.prefetch_reads,
            c.prefetch_used,
            c.prefetch_precision() * 100.0,
            c.prefetch_recall() * 100.0
        );
    }
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
        "largest_request_bytes": c.largest_request_bytes,
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

fn run(mut a: RunArgs) -> Result<()> {
    // One generation keeps no prefix cache: its RAM goes to the expert budget.
    a.engine.kv_cache_budget.get_or_insert(0);
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
    if let Some(path) = &a.routing_trace {
        eng.set_routing_trace(Some(
            RoutingTrace::create(path).map_err(anyhow::Error::msg)?,
        ));
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
    if let Some(t) = eng.set_routing_trace(None) {
        t.finish().map_err(anyhow::Error::msg)?;
    }
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
        print_stats(
            &g,
            load_s,
            &io_desc(&loaded.store),
            kv,
            eng.placement().prefetch,
            eng.prefill_batch(),
        );
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
                "inflight_waits": s.cache.inflight_waits,
                "inflight_rate": s.cache.inflight_rate(),
                "io_mode": io_name(&loaded.store),
                "io_engine": loaded.store.io_engine(),
                "queue_depth": loaded.store.queue_depth(),
                "threads": eng.threads(),
                "kernels": coli_kernels::detected_isa().name(),
                "numerics": {
                    "mode": coli_kernels::numerics().name(),
                    "id": coli_kernels::numerics_id(coli_kernels::detected_isa()),
                    "integer_kernel": coli_kernels::integer_kernel(coli_kernels::detected_isa()),
                    "bf16_kernel": coli_kernels::bf16_kernel(coli_kernels::detected_isa()),
                    // Resident int4/int8/mxfp4 weights kept in the interleaved row order (q8a
                    // only; ENGINE.md "Precision").
                    "interleaved_rows": coli_kernels::numerics() == coli_kernels::Numerics::Q8a
                        && coli_kernels::interleave(),
                },
                "kv_bytes_per_token": eng.kv_bytes_per_token(),
                "decode_passes": s.decode_steps,
                "expert_bytes_per_generated_token": s.expert_bytes_per_generated_token(),
                "speculation": {
                    "mode": s.speculation_mode.name(),
                    "draft_tokens": params.speculation.draft_tokens,
                    "drafts_proposed": s.speculation.drafts_proposed,
                    "drafts_accepted": s.speculation.drafts_accepted,
                    "acceptance_rate": s.speculation.acceptance_rate(),
                    "verify_passes": s.speculation.verify_passes,
                    "decode_passes": s.decode_steps,
                    "tokens_per_forward": s.tokens_per_forward(),
                    "gate_paused_passes": s.speculation.gate_paused_passes,
                    "draft_s": s.speculation.draft_s,
                },
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
        // Prompt tokens per prefill pass: --prefill-batch or the memory plan's chunk.
        obj["stats"]["prefill_batch"] = eng.prefill_batch().into();
        if let Some(t) = tok {
            obj["text"] = serde_json::Value::from(t.decode(&g.tokens, true)?);
        }
        println!("{obj}");
    }
    Ok(())
}

fn chat(mut a: ChatArgs) -> Result<()> {
    if a.session.is_none() && a.kv_disk.kv_dir.is_some() {
        bail!("--kv-dir needs --session NAME: a chat without a session keeps no KV cache on disk (coli chat --session NAME --kv-dir DIR resumes NAME from DIR next time)");
    }
    // The conversation lives in the engine's own sequence (and, with --session, on disk):
    // nothing is kept in a RAM prefix cache, whose room goes to the expert budget.
    a.engine.kv_cache_budget.get_or_insert(0);
    let loaded = open(&a.engine)?;
    let (mut eng, load_s) = engine(&loaded, &a.engine)?;
    let tok = loaded
        .tokenizer
        .as_ref()
        .context("chat needs the store's tokenizer.json")?;
    if tok.chat_template.is_none() {
        bail!("the store has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
    }
    let mut prefix = match &a.session {
        Some(_) => Some(a.kv_disk.open(&eng)?),
        None => None,
    };
    let session = a
        .session
        .as_deref()
        .map(|name| session::Session::open(name, loaded.store.manifest().store_id))
        .transpose()?;
    eprintln!("loaded in {load_s:.2} s; one message per line, /reset to start over, /exit or Ctrl-D to quit");
    let mut system = Vec::new();
    if let Some(s) = &a.system {
        system.push(ChatMessage::new("system", s));
    }
    // A session's states are its own: no other session, and no server, reuses them.
    let scope = a
        .session
        .as_deref()
        .map_or(0, coli_engine::prefix_cache::session_scope);
    let mut messages: Vec<ChatMessage> = match &session {
        Some(s) if !s.messages.is_empty() => {
            // /reset keeps the session's own system message.
            system = s
                .messages
                .first()
                .filter(|m| m.role == "system")
                .cloned()
                .into_iter()
                .collect();
            if a.system.is_some() && s.messages.first().map(|m| m.role.as_str()) != Some("system") {
                eprintln!(
                    "note: session {} started without a system message; --system is ignored",
                    s.name
                );
            }
            eprintln!(
                "resuming session {} ({} messages; /reset empties it)",
                s.name,
                s.messages.len()
            );
            s.messages.clone()
        }
        _ => system.clone(),
    };
    // The first turn of a resumed session continues from its saved KV cache.
    let mut resumed = session.is_none();
    let params = a.sampling.params();
    let stdin = std::io::stdin();
    // Piped input is not echoed by a terminal: echo it after the prompt (stderr, beside the
    // prompt), so that a transcript shows each question before its answer.
    let echo = !std::io::IsTerminal::is_terminal(&stdin);
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else {
            eprintln!();
            break;
        };
        let line = line.context("reading stdin")?;
        if echo {
            eprintln!("{line}");
        }
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                eng.reset();
                if let Some(s) = &session {
                    s.save(&messages)?;
                }
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", text));
        let (prompt_text, ids) = tok
            .chat_ids(&messages, true)
            .context("applying the chat template")?;
        let mut restored = false;
        if let (false, Some(p)) = (resumed, prefix.as_mut()) {
            resumed = true;
            if let Some(hit) = p.take(scope, &ids, ids.len() - 1) {
                match eng.restore_own(hit.state) {
                    Ok(()) => restored = true,
                    Err(e) => eprintln!(
                        "warning: the session's KV cache does not fit: {e}; prefilling it again"
                    ),
                }
            }
            for w in p.take_warnings() {
                eprintln!("warning: {w}");
            }
        }
        // A harmony model (gpt-oss) answers in its final channel and a reasoning model after its
        // `<think>` block: the reasoning goes to stderr, the answer to stdout and the history.
        let mut reply =
            ReplyText::for_tokenizer(tok, Vec::new(), reply_format(tok, &prompt_text, true));
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        let mut show = |pieces: Vec<Piece>, answer: &mut String| {
            pieces.into_iter().all(|p| match p {
                Piece::Content(t) => {
                    answer.push_str(&t);
                    out.write_all(t.as_bytes())
                        .and_then(|_| out.flush())
                        .is_ok()
                }
                Piece::Reasoning(t) => {
                    eprint!("{t}");
                    true
                }
                // `coli chat` offers no tools, so its replies are never parsed for calls.
                Piece::ToolCall(_)
                | Piece::ToolCallStart(_)
                | Piece::ToolCallArgs(_)
                | Piece::ToolCallEnd(_) => true,
            })
        };
        let g = match eng.generate(&ids, &params, |id| {
            let (pieces, _) = reply.push(tok, id)?;
            // A closed stdout stops generation.
            Ok(show(pieces, &mut answer))
        }) {
            Ok(g) => g,
            Err(coli_engine::EngineError::ContextOverflow { needed, context }) => {
                eprintln!("\nthe conversation needs {needed} tokens but the context holds {context}; use /reset or --context");
                messages.pop();
                continue;
            }
            Err(e) => return Err(e).context("generating"),
        };
        let (rest, _) = reply.finish(tok)?;
        show(rest, &mut answer);
        let _ = writeln!(out);
        let _ = out.flush();
        messages.push(ChatMessage::new("assistant", &answer));
        if let Some(s) = &session {
            s.save(&messages)?;
            if let Some(p) = prefix.as_mut() {
                p.save(scope, &eng.own_state());
                for w in p.take_warnings() {
                    eprintln!("warning: {w}");
                }
            }
        }
        let s = &g.stats;
        if restored {
            // Counted from what generation prefilled: MTP drafting, for one, may drop a state.
            eprintln!(
                "[resumed {} cached tokens of the session]",
                ids.len() - s.prompt_tokens
            );
        }
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

fn eval(mut a: EvalArgs) -> Result<()> {
    // Scoring keeps no prefix cache: its RAM goes to the expert budget.
    a.engine.kv_cache_budget.get_or_insert(0);
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
                               "hit_rate": cs.hit_rate(), "evictions": cs.evictions,
                               "numerics": coli_kernels::numerics().name()})
        );
    } else {
        println!(
            "tokens: {} (predicted {n}), mean NLL {nll:.4} nats, perplexity {ppl:.4}",
            ids.len()
        );
        eprintln!(
            "load {load_s:.2} s, eval {secs:.2} s ({:.1} tok/s), hit rate {:.1}%, evictions {}, numerics {}",
            n as f64 / secs,
            cs.hit_rate() * 100.0,
            cs.evictions,
            coli_kernels::numerics().name()
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    coli_tools::cli::exit_quietly_on_closed_stdout();
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The settings `coli tune` saved apply to every engine option not given on the command line.
    if let Some((_, sub)) = matches.subcommand() {
        let explicit = |id: &str| {
            matches!(
                sub.value_source(id),
                Some(
                    clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable
                )
            )
        };
        match &mut cli.cmd {
            Cmd::Run(a) => tune::apply_saved(&mut a.engine, &explicit),
            Cmd::Chat(a) => tune::apply_saved(&mut a.engine, &explicit),
            Cmd::Eval(a) => tune::apply_saved(&mut a.engine, &explicit),
            Cmd::Serve(a) | Cmd::Web(a) => tune::apply_saved(&mut a.engine, &explicit),
            // Plan and doctor describe the run with the same command line.
            Cmd::Plan(a) => tune::apply_saved(&mut a.engine, &explicit),
            Cmd::Doctor(a) => tune::apply_saved(&mut a.engine, &explicit),
            _ => {}
        }
    }
    let r = match cli.cmd {
        Cmd::Run(a) => run(a),
        Cmd::Chat(a) => chat(a),
        Cmd::Eval(a) => eval(a),
        Cmd::Info(a) => {
            let store = a.store.or(a.store_flag).expect("clap requires one of them");
            info::run(&store, a.json)
        }
        Cmd::Plan(a) => plan::run(&a),
        Cmd::Tune(a) => tune::run(&a),
        Cmd::Doctor(a) => match doctor::run(&a) {
            Ok(code) => return std::process::ExitCode::from(code as u8),
            Err(e) => {
                coli_tools::cli::print_error("coli", &e);
                return std::process::ExitCode::from(2);
            }
        },
        Cmd::Serve(a) => serve::run(a),
        Cmd::Web(mut a) => {
            a.web = true;
            serve::run(a)
        }
        Cmd::Kv(a) => kv::kv(a),
        Cmd::Export(a) => coli_tools::export::run(&a.store, &a.out),
        Cmd::Mirror(a) => {
            let verify = a.is_verify();
            match mirror::run(a) {
                Ok(0) => Ok(()),
                Ok(code) => return std::process::ExitCode::from(code),
                // verify's 1 means damaged: a check that could not run exits 2 (as coli-fsck).
                Err(e) if verify => {
                    coli_tools::cli::print_error("coli", &e);
                    return std::process::ExitCode::from(2);
                }
                Err(e) => Err(e),
            }
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            coli_tools::cli::print_error("coli", &e);
            std::process::ExitCode::FAILURE
        }
    }
}
