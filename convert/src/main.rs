//! `coli-convert INPUT_DIR OUTPUT_STORE [--experts ..] [--dense ..] [--mtp ..] [--embeddings ..] [--threads N] [--json]`:
//! converts a Hugging Face MoE checkpoint into a coli block store (docs/CONVERT.md).

use anyhow::Context;
use clap::Parser;
use coli_convert::{parse_encoding, run, Encodings, Options, RoleEncodings};

/// The encodings of the dense linear weights (`--dense` and the per-role options).
const DENSE_CHOICES: &[&str] = &["bf16", "int8", "int4-g64", "int4-g32", "fp8"];

/// A per-role option (`--attention` ...): `None` when not given.
fn role(v: &Option<String>, flag: &str) -> anyhow::Result<Option<coli_format::Encoding>> {
    v.as_deref()
        .map(|s| parse_encoding(s, DENSE_CHOICES, flag))
        .transpose()
        .map_err(Into::into)
}
use std::path::PathBuf;

/// Converts a Hugging Face FP8/BF16 MoE checkpoint into a coli block store.
#[derive(Parser, Debug)]
#[command(name = "coli-convert", version, about)]
struct Cli {
    /// Local Hugging Face checkpoint directory (config.json, *.safetensors, index), or a GGUF
    /// file (the first of a split GGUF's files): its tensors are kept in their types.
    #[arg(value_name = "INPUT_DIR")]
    input: PathBuf,
    /// Store directory to create (built in OUTPUT_STORE.partial, then renamed).
    #[arg(value_name = "OUTPUT_STORE")]
    output: PathBuf,
    /// Routed expert encoding: auto (mxfp4 / mxfp8 when the checkpoint's expert tensors are
    /// MXFP4 / MXFP8, else int4-g64), int4-g64, int4-g32, int8, fp8 (lossless, FP8 sources only),
    /// mxfp4 (lossless, MXFP4 sources only), mxfp8 (lossless, MXFP8 sources only), bf16.
    #[arg(long, default_value = "auto")]
    experts: String,
    /// Encoding of the other linear weights (attention, DSA indexer, shared experts, dense MLP
    /// layers): bf16, int8, int4-g64, int4-g32 (format version 3), fp8 (FP8 sources only).
    #[arg(long, default_value = "bf16")]
    dense: String,
    /// Encoding of the attention projections, instead of --dense.
    #[arg(long, value_name = "ENCODING")]
    attention: Option<String>,
    /// Encoding of the DSA indexer's projections (GLM-5, DeepSeek-V3.2), instead of --dense;
    /// its weights_proj stays as in the source when this is int4.
    #[arg(long, value_name = "ENCODING")]
    indexer: Option<String>,
    /// Encoding of the shared experts, instead of --dense.
    #[arg(long, value_name = "ENCODING")]
    shared_experts: Option<String>,
    /// Encoding of the MLP of the dense (non-MoE) layers, instead of --dense.
    #[arg(long, value_name = "ENCODING")]
    dense_mlp: Option<String>,
    /// Encoding of the MTP layer's linear weights and experts: int8 (the default), bf16, fp8;
    /// `none` leaves the MTP layer out (a smaller store; `coli run --speculate mtp` then
    /// refuses). On a model without an MTP layer only `none` is accepted (it changes nothing).
    #[arg(long, value_name = "ENCODING")]
    mtp: Option<String>,
    /// Encoding of the token embedding and lm_head: source (as in the checkpoint), int8
    /// (per-row scales; halves the bytes the output projection reads per token), int4-g64 or
    /// int4-g32 (format version 3).
    #[arg(long, default_value = "source")]
    embeddings: String,
    /// Plan memory before converting: RAM for everything at run time (dense set, KV cache,
    /// expert cache, runtime), e.g. 25GiB. Prints the memory plan of the chosen encodings and
    /// of the standard ones to stderr, and warns, naming the options that fit, when the chosen
    /// ones leave less than 8 GiB for the expert cache at 8192 tokens (docs/CONVERT.md).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    total_ram: Option<u64>,
    /// Context of the memory plan, tokens (with --total-ram; default as coli run's:
    /// min(max_position_embeddings, 4096)): usability is judged at this context.
    #[arg(long, value_name = "TOKENS")]
    context: Option<usize>,
    /// Disk read bandwidth of the memory plan's decode bound, GiB/s (with --total-ram).
    #[arg(long, value_name = "GIB_S")]
    disk_gib_s: Option<f64>,
    /// The order of the matrices in expert records: interleaved (format version 7: int4, int8
    /// and mxfp4 matrices in the order the integer kernels read, so a run that pins them uses
    /// them in place in the page cache) or row-major (readable by coli releases that read
    /// format version 6). The same numbers either way (docs/FORMAT.md section 5). Default:
    /// interleaved (a GGUF's block types are always stored row-major).
    #[arg(long, value_name = "ORDER", value_parser = ["interleaved", "row-major"])]
    matrix_order: Option<String>,
    /// Quantization threads (default: one per core). Output does not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Print the final report as JSON on stdout (no progress bar).
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    coli_convert::cli::exit_quietly_on_closed_stdout();
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            coli_convert::cli::print_error("coli-convert", &e);
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if coli_convert::gguf::is_gguf(&cli.input) {
        return convert_gguf(&cli);
    }
    if cli.input.is_file() {
        anyhow::bail!(
            "{}: a file that is not a GGUF (it does not start with the GGUF magic, or is shorter than it): coli-convert reads a GGUF file or a Hugging Face checkpoint directory",
            cli.input.display()
        );
    }
    let experts = match cli.experts.as_str() {
        "auto" => auto_experts(&cli.input),
        other => other,
    };
    let encodings = Encodings {
        experts: parse_encoding(
            experts,
            &[
                "int4-g64", "int4-g32", "int8", "fp8", "mxfp4", "mxfp8", "bf16",
            ],
            "experts",
        )?,
        dense: parse_encoding(&cli.dense, DENSE_CHOICES, "dense")?,
        roles: RoleEncodings {
            attention: role(&cli.attention, "attention")?,
            indexer: role(&cli.indexer, "indexer")?,
            shared_experts: role(&cli.shared_experts, "shared-experts")?,
            dense_mlp: role(&cli.dense_mlp, "dense-mlp")?,
        },
        mtp: match cli.mtp.as_deref().unwrap_or("int8") {
            "none" => None,
            m => Some(
                parse_encoding(m, &["int8", "bf16", "fp8"], "mtp").map_err(|_| {
                    anyhow::anyhow!("--mtp {m}: expected one of int8, bf16, fp8, none")
                })?,
            ),
        },
        embeddings: match cli.embeddings.as_str() {
            "source" => None,
            e => Some(
                parse_encoding(e, &["int8", "int4-g64", "int4-g32"], "embeddings").map_err(
                    |_| {
                        anyhow::anyhow!(
                            "--embeddings {e}: expected one of source, int8, int4-g64, int4-g32"
                        )
                    },
                )?,
            ),
        },
    };
    if let Some(mtp) = cli.mtp.as_deref().filter(|m| *m != "none") {
        refuse_mtp_without_layer(&cli.input, mtp)?;
    }
    if let Some(total_ram) = cli.total_ram {
        preflight_plan(&cli, encodings, total_ram)?;
    } else if cli.disk_gib_s.is_some() || cli.context.is_some() {
        anyhow::bail!("--context and --disk-gib-s belong to the memory plan: give --total-ram too");
    }
    if cli.threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let opts = Options {
        input: cli.input.clone(),
        output: cli.output.clone(),
        encodings,
        matrix_order: match cli.matrix_order.as_deref() {
            Some("row-major") => coli_store::MatrixOrder::RowMajor,
            _ => coli_store::MatrixOrder::Interleaved,
        },
        threads: cli.threads,
        progress: !cli.json,
    };
    finish(&cli, run(&opts))
}

/// Reports a conversion's outcome: on error what became of the partial store (and the error,
/// in context); else the resume counts on stderr and the report on stdout (text or `--json`).
fn finish(
    cli: &Cli,
    result: Result<coli_convert::Report, coli_convert::ConvertError>,
) -> anyhow::Result<()> {
    let report = result
        .inspect_err(|e| say_what_was_kept(&cli.output, e))
        .with_context(|| {
            format!(
                "converting {} into {}",
                cli.input.display(),
                cli.output.display()
            )
        })?;
    if report.experts_skipped > 0 || report.dense_skipped > 0 {
        eprintln!(
            "resumed: skipped {} experts ({} bytes) and {} dense tensors",
            report.experts_skipped, report.bytes_skipped, report.dense_skipped
        );
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

/// `coli-convert FILE.gguf STORE`: the GGUF's tensors in their own types; the encoding and
/// memory-plan options do not apply and are refused by name.
fn convert_gguf(cli: &Cli) -> anyhow::Result<()> {
    let given: Vec<&str> = [
        (cli.experts != "auto", "--experts"),
        (cli.dense != "bf16", "--dense"),
        (cli.attention.is_some(), "--attention"),
        (cli.indexer.is_some(), "--indexer"),
        (cli.shared_experts.is_some(), "--shared-experts"),
        (cli.dense_mlp.is_some(), "--dense-mlp"),
        (cli.mtp.is_some(), "--mtp"),
        (cli.embeddings != "source", "--embeddings"),
        (
            cli.matrix_order.as_deref() == Some("interleaved"),
            "--matrix-order interleaved",
        ),
        (cli.total_ram.is_some(), "--total-ram"),
        (cli.context.is_some(), "--context"),
        (cli.disk_gib_s.is_some(), "--disk-gib-s"),
    ]
    .into_iter()
    .filter_map(|(g, n)| g.then_some(n))
    .collect();
    if !given.is_empty() {
        anyhow::bail!(
            "{}: {} is a GGUF, whose tensors are kept in their own types (bit for bit); drop {}",
            given.join(", "),
            cli.input.display(),
            if given.len() == 1 { "it" } else { "them" }
        );
    }
    if cli.threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let opts = Options {
        input: cli.input.clone(),
        output: cli.output.clone(),
        encodings: Encodings::new(
            coli_format::Encoding::Bf16,
            coli_format::Encoding::Bf16,
            coli_format::Encoding::Bf16,
        ),
        matrix_order: coli_store::MatrixOrder::RowMajor,
        threads: cli.threads,
        progress: !cli.json,
    };
    finish(cli, coli_convert::gguf::run(&opts))
}

/// `--mtp ENCODING` for a model whose config.json declares no MTP layer
/// (`num_nextn_predict_layers` 0 or absent), or whose checkpoint holds none of the MTP
/// layer's tensors: an error naming the option, since it would apply to nothing (`--mtp none`
/// is always accepted). An unreadable config or checkpoint is left to the conversion, which
/// reports it.
fn refuse_mtp_without_layer(input: &std::path::Path, mtp: &str) -> anyhow::Result<()> {
    let Some(cfg) = std::fs::read(input.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    else {
        return Ok(());
    };
    let Ok(spec) = coli_format::spec::ModelSpec::from_config(&cfg, None) else {
        return Ok(());
    };
    if spec.mtp_layer().is_none() && spec.unconverted_mtp_layers > 0 {
        anyhow::bail!(
            "--mtp {mtp}: this {} model's MTP layer ({} in {}) is not converted (transformers does not run it, so coli has no oracle for it); drop the option",
            spec.model_type,
            "num_nextn_predict_layers",
            input.join("config.json").display()
        );
    }
    if spec.mtp_layer().is_none() {
        anyhow::bail!(
            "--mtp {mtp}: this {} model has no MTP layer (num_nextn_predict_layers is 0 or absent in {}); drop the option",
            spec.model_type,
            input.join("config.json").display()
        );
    }
    // The config declares the layer but the checkpoint may not hold it (a release or a copy
    // stripped of it): converting would silently drop what the option asked for.
    if let Ok(ck) = coli_convert::checkpoint::Checkpoint::open(input) {
        let names: Vec<&str> = spec
            .tensors
            .mtp
            .iter()
            .flat_map(|m| m.dense())
            .map(|t| t.name.as_str())
            .collect();
        if !names.is_empty() && !names.iter().any(|n| ck.get(n).is_some()) {
            anyhow::bail!(
                "--mtp {mtp}: {} declares an MTP layer but the checkpoint holds none of its tensors (e.g. {}); give --mtp none to convert without it",
                input.join("config.json").display(),
                names[0]
            );
        }
    }
    Ok(())
}

/// After a failed conversion, says on stderr what became of `OUTPUT.partial`: removed when the
/// input itself is wrong (resuming cannot help), kept for a resume after an I/O error.
fn say_what_was_kept(output: &std::path::Path, e: &coli_convert::ConvertError) {
    let partial = coli_convert::pipeline::partial_path(output);
    if partial.exists() {
        eprintln!(
            "coli-convert: the conversion failed (the error follows); the partial store {} is kept: run the same command again to resume once the cause is fixed",
            partial.display()
        );
    } else if e.is_bad_data() {
        eprintln!(
            "coli-convert: the conversion failed (the error follows); nothing was kept: the input is wrong, so resuming could not help"
        );
    }
}

/// `--experts auto`: the encoding a store keeps the checkpoint's experts in bit for bit when
/// its tensors hold them in one (`mxfp4`: gpt-oss as published; `mxfp8`: Inkling 2's `-MXFP8`
/// releases; `coli_convert::fused::auto_experts`), else `int4-g64`. A checkpoint that does not
/// open gives `int4-g64` here; the conversion then reports why.
fn auto_experts(input: &std::path::Path) -> &'static str {
    match coli_convert::checkpoint::Checkpoint::open(input)
        .map(|ck| coli_convert::fused::auto_experts(&ck))
    {
        Ok(coli_format::Encoding::Mxfp4) => "mxfp4",
        Ok(coli_format::Encoding::Mxfp8) => "mxfp8",
        _ => "int4-g64",
    }
}

/// A `--total-ram` size (`coli_format::parse_size`).
fn parse_size_arg(s: &str) -> Result<u64, String> {
    coli_format::parse_size(s)
}

/// `--total-ram`: prints the memory plan of the chosen encodings and of the standard ones to
/// stderr (from config.json and the safetensors headers; no weight is read) and warns when the
/// chosen ones are not usable, naming the configurations that are.
fn preflight_plan(cli: &Cli, encodings: Encodings, total_ram: u64) -> anyhow::Result<()> {
    use coli_convert::memory_plan::{
        plan_from_config, render, row_options, ConfigPlanArgs, USABLE_CACHE_BYTES,
    };
    let p = plan_from_config(&ConfigPlanArgs {
        gguf: None,
        checkpoint: Some(&cli.input),
        config: None,
        total_ram,
        context: cli.context,
        disk_gib_s: cli.disk_gib_s,
        experts: Some(encodings.experts),
        mtp: encodings.mtp,
        chosen: Some(encodings),
    })
    .context("--total-ram: planning memory")?;
    eprint!("{}", render(&p));
    let chosen = p.rows.iter().find(|r| r.chosen).expect("the chosen row");
    if !chosen.usable {
        let fits: Vec<String> = p
            .rows
            .iter()
            .filter(|r| r.usable)
            .map(row_options)
            .collect();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let cache_goal = USABLE_CACHE_BYTES.min(p.expert_bytes_total);
        eprintln!(
            "coli-convert: warning: these encodings are not usable on {:.2} GiB at {} tokens: they need {:.2} GiB (dense {:.2} + KV cache {:.2} + runtime reserve {:.2} + expert cache {:.2} GiB, {}); {}",
            gib(total_ram),
            p.context,
            gib(chosen.usable_ram_bytes),
            gib(chosen.dense_bytes),
            gib(chosen.kv_bytes),
            gib(coli_convert::memory_plan::RUNTIME_RESERVE_BYTES),
            gib(cache_goal),
            if cache_goal < USABLE_CACHE_BYTES {
                "every expert"
            } else {
                "the usable minimum"
            },
            if fits.is_empty() {
                "none of the planned encodings is usable on this RAM: plan a larger machine or a shorter context".to_string()
            } else {
                format!("these are: {}", fits.join("; "))
            }
        );
    }
    Ok(())
}
