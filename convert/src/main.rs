//! `coli-convert INPUT_DIR OUTPUT_STORE [--experts ..] [--dense ..] [--mtp ..] [--embeddings ..] [--threads N] [--json]`:
//! converts a Hugging Face MoE checkpoint into a coli block store (docs/CONVERT.md).

use anyhow::Context;
use clap::Parser;
use coli_convert::{parse_encoding, run, Encodings, Options};
use std::path::PathBuf;

/// Converts a Hugging Face FP8/BF16 MoE checkpoint into a coli block store.
#[derive(Parser, Debug)]
#[command(name = "coli-convert", version, about)]
struct Cli {
    /// Local Hugging Face checkpoint directory (config.json, *.safetensors, index).
    #[arg(value_name = "INPUT_DIR")]
    input: PathBuf,
    /// Store directory to create (built in OUTPUT_STORE.partial, then renamed).
    #[arg(value_name = "OUTPUT_STORE")]
    output: PathBuf,
    /// Routed expert encoding: auto (mxfp4 when config.json declares MXFP4 experts, else
    /// int4-g64), int4-g64, int4-g32, int8, fp8 (lossless, FP8 sources only), mxfp4 (lossless,
    /// MXFP4 sources only), bf16.
    #[arg(long, default_value = "auto")]
    experts: String,
    /// Encoding of the other linear weights: bf16, int8, fp8 (FP8 sources only).
    #[arg(long, default_value = "bf16")]
    dense: String,
    /// Encoding of the MTP layer's linear weights and experts: int8, bf16, fp8.
    #[arg(long, default_value = "int8")]
    mtp: String,
    /// Encoding of the token embedding and lm_head: source (as in the checkpoint) or int8
    /// (per-row scales; halves the bytes the output projection reads per token).
    #[arg(long, default_value = "source")]
    embeddings: String,
    /// Quantization threads (default: one per core). Output does not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Print the final report as JSON on stdout (no progress bar).
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coli-convert: error: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let experts = match cli.experts.as_str() {
        "auto" => auto_experts(&cli.input),
        other => other,
    };
    let encodings = Encodings {
        experts: parse_encoding(
            experts,
            &["int4-g64", "int4-g32", "int8", "fp8", "mxfp4", "bf16"],
            "experts",
        )?,
        dense: parse_encoding(&cli.dense, &["bf16", "int8", "fp8"], "dense")?,
        mtp: parse_encoding(&cli.mtp, &["int8", "bf16", "fp8"], "mtp")?,
        embeddings: match cli.embeddings.as_str() {
            "source" => None,
            "int8" => Some(parse_encoding("int8", &["int8"], "embeddings")?),
            other => anyhow::bail!("--embeddings {other}: expected one of source, int8"),
        },
    };
    if cli.threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let opts = Options {
        input: cli.input.clone(),
        output: cli.output.clone(),
        encodings,
        threads: cli.threads,
        progress: !cli.json,
    };
    let report = run(&opts).with_context(|| {
        format!(
            "converting {} into {}",
            cli.input.display(),
            cli.output.display()
        )
    })?;
    if report.experts_skipped > 0 || report.dense_skipped > 0 {
        eprintln!(
            "resumed: skipped {} experts ({} bytes)",
            report.experts_skipped, report.bytes_skipped
        );
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// `--experts auto`: `mxfp4` when the checkpoint's config.json declares MXFP4 experts
/// (`quantization_config.quant_method`, gpt-oss as published: kept bit for bit), else
/// `int4-g64`. An unreadable config gives `int4-g64` here; the conversion then reports it.
fn auto_experts(input: &std::path::Path) -> &'static str {
    let declared = std::fs::read(input.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|c| coli_format::spec::gpt_oss::declares_mxfp4(&c));
    if declared {
        "mxfp4"
    } else {
        "int4-g64"
    }
}

/// The error and its causes joined by ": " (each error adds its context once: a library error
/// shows its inner error in its message or returns it as `source()`, never both).
fn error_chain(e: &anyhow::Error) -> String {
    format!("{e:#}")
}
