//! `coli-fsck`: verifies a coli store (and mirror copies of its segment files).
//!
//! Exit codes: 0 clean, 1 damaged or mismatched, 2 unusable input (see `docs/FSCK.md`).
//! With `--repair`, damaged records are rewritten from a verified good copy and the exit code is
//! that of the check that follows.

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{ArgGroup, Parser};
use coli_store::fsck::{self, FsckOptions, FsckReport, MirrorStatus, Progress};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Verify a coli store: manifest, index, segment headers, every expert record, dense tensor and
/// copied file checksum, and completeness.
#[derive(Parser, Debug)]
#[command(
    name = "coli-fsck",
    version,
    about = "Verify a coli store (and its mirrors): structure, every checksum, completeness"
)]
#[command(group(ArgGroup::new("store_dir").required(true).args(["store", "store_flag"])))]
struct Args {
    /// The store directory.
    store: Option<PathBuf>,
    /// The store directory, as `coli run --store` takes it (the same as the positional
    /// argument).
    #[arg(long = "store", value_name = "DIR")]
    store_flag: Option<PathBuf>,
    /// A mirror directory (copies of segment files DIR/segments/seg-NNNNN.bin and staged
    /// segments DIR/staged/stg-NNNNN.bin); repeatable.
    #[arg(long = "mirror", value_name = "DIR")]
    mirrors: Vec<PathBuf>,
    /// Rewrite each damaged record, in the store or in a mirror, in place from a verified good
    /// copy (fsync, re-read, verify), then check again. Exit 0 when everything is clean
    /// afterwards, 1 when damage remains.
    #[arg(long, conflicts_with = "quick")]
    repair: bool,
    /// Print the report as JSON on stdout (schema: docs/FSCK.md).
    #[arg(long)]
    json: bool,
    /// Structure only: skip record, dense, segment-body and file checksums.
    #[arg(long)]
    quick: bool,
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn set_total(&self, bytes: u64) {
        self.0.set_length(bytes);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

/// The model check beyond the store's bytes: the MANIFEST (whose `config` is the one `coli run`
/// uses; `files/config.json` is a checked copy, FORMAT.md section 8) must describe a model coli
/// runs, with its own fields agreeing (`ModelSpec::of_store`). Skipped when the store could not
/// be read at all.
fn check_model(store: &std::path::Path, report: &mut FsckReport) {
    if report.status == fsck::Status::Unusable {
        return;
    }
    let Ok(m) = std::fs::read(store.join("MANIFEST"))
        .map_err(|e| e.to_string())
        .and_then(|b| coli_store::Manifest::parse(&b).map_err(|e| e.to_string()))
    else {
        return; // the store check reported it
    };
    let spec = match coli_format::ModelSpec::of_store(&m) {
        Ok(s) => s,
        Err(e) => {
            let what = e.to_string();
            let what = what.strip_prefix("MANIFEST: ").unwrap_or(&what).to_string();
            report.add_problem("MANIFEST", what);
            return;
        }
    };
    // The records' widths against the config (the store check read the INDEX's bytes).
    let Ok(records) = std::fs::read(store.join("INDEX"))
        .map_err(|e| e.to_string())
        .and_then(|b| coli_format::disk::index::parse_index(&b, &m).map_err(|e| e.to_string()))
    else {
        return;
    };
    if let Err(e) = spec.check_records(&records) {
        let what = e.to_string();
        let what = what.strip_prefix("INDEX: ").unwrap_or(&what).to_string();
        report.add_problem(
            "MANIFEST",
            format!("config disagrees with the INDEX: {what}"),
        );
    }
}

fn print_human(r: &FsckReport) {
    for a in &r.repairs {
        let what = format!(
            "layer {} expert {} in {}/{} at offset {}",
            a.layer, a.expert, a.dir, a.file, a.offset
        );
        match (a.repaired, &a.source, &a.error) {
            (true, Some(src), _) => println!("REPAIRED: {what} from {src}"),
            (_, _, Some(e)) => println!("NOT REPAIRED: {what}: {e}"),
            _ => println!("NOT REPAIRED: {what}"),
        }
    }
    println!("store: {}", r.store);
    println!(
        "model config: the MANIFEST's (what coli run uses); files/config.json checked as a copy"
    );
    if let Some(id) = &r.store_id {
        println!(
            "store id: {id} (format version {})",
            r.format_version.unwrap_or(0)
        );
    }
    for p in &r.problems {
        if p.file.is_empty() {
            println!("PROBLEM: {}", p.what);
        } else {
            println!("PROBLEM: {}: {}", p.file, p.what);
        }
    }
    for b in &r.bad_records {
        match &b.error {
            Some(e) => println!(
                "BAD RECORD: layer {} expert {} in {} at offset {}: read error: {e}",
                b.layer, b.expert, b.file, b.offset
            ),
            None => println!(
                "BAD RECORD: layer {} expert {} in {} at offset {}: expected xxh3 {}, found {}",
                b.layer, b.expert, b.file, b.offset, b.expected, b.found
            ),
        }
    }
    for d in &r.bad_dense {
        println!(
            "BAD DENSE TENSOR: {} in dense.bin at offset {}: expected xxh3 {}, found {}",
            d.name, d.offset, d.expected, d.found
        );
    }
    for f in &r.bad_files {
        println!("BAD FILE: files/{}: {}", f.name, f.what);
    }
    for m in &r.mirrors {
        for f in &m.files {
            let status = match f.status {
                MirrorStatus::Admitted => "admitted",
                MirrorStatus::Missing => "missing",
                MirrorStatus::Mismatched => "MISMATCHED",
                MirrorStatus::Damaged => "DAMAGED",
            };
            match &f.detail {
                Some(d) => println!("mirror {}: {} ({}): {status}: {d}", m.dir, f.file, f.kind),
                None => println!(
                    "mirror {}: {} ({}, {} records): {status}",
                    m.dir, f.file, f.kind, f.records
                ),
            }
        }
    }
    if r.status != fsck::Status::Unusable {
        println!(
            "checked{}: {} records, {} dense tensors, {} files",
            if r.quick {
                " (quick: structure only)"
            } else {
                ""
            },
            r.records_checked,
            r.dense_checked,
            r.files_checked
        );
    }
    let verdict = match r.status {
        fsck::Status::Clean => "clean".to_string(),
        fsck::Status::Damaged if r.bad_records.is_empty() && r.problems.is_empty() && r.bad_dense.is_empty() && r.bad_files.is_empty() => {
            "DAMAGED mirror files: run with --repair to rewrite damaged records from a good copy; re-copy truncated or mismatched files (`coli mirror copy` / `coli mirror stage` after removing them)".into()
        }
        // --repair rewrites expert records only: where none was found bad, say what does help.
        fsck::Status::Damaged if r.bad_records.is_empty() && r.mirrors.iter().all(|m| m.files.iter().all(|f| f.bad_records.is_empty())) => {
            let mirrors = if r.mirrors.iter().any(|m| m.files.iter().any(|f| !matches!(f.status, MirrorStatus::Admitted))) {
                "; re-copy the mirror files named above (`coli mirror copy` / `coli mirror stage` after removing them)"
            } else {
                ""
            };
            format!("DAMAGED: re-convert the store, or restore the named files from a copy of the store (--repair rewrites damaged expert records only, and none was found){mirrors}")
        }
        // A repair ran and could not rewrite everything: no good copy was there.
        fsck::Status::Damaged if r.repairs.iter().any(|a| !a.repaired) => {
            "DAMAGED: --repair found no verified copy of some records: pass a --mirror DIR that holds one (`coli mirror copy` makes mirrors), or re-convert the store".into()
        }
        fsck::Status::Damaged => {
            "DAMAGED: run with --repair (and --mirror DIR) to rewrite damaged records from a good copy, or re-convert the store / restore the named files".into()
        }
        fsck::Status::Unusable => {
            "UNUSABLE: not a coli store this version can check, or a --mirror path is not a directory".into()
        }
    };
    println!("result: {verdict}");
}

fn main() -> std::process::ExitCode {
    coli_tools::cli::exit_quietly_on_closed_stdout();
    match real_main() {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            // A check that could not run exits 2, as a damaged store's report does not.
            coli_tools::cli::print_error("coli-fsck", &e);
            std::process::ExitCode::from(2)
        }
    }
}

/// Checks (and repairs) the store; the exit code of the report.
fn real_main() -> anyhow::Result<u8> {
    let args = Args::parse();
    let store = args
        .store
        .clone()
        .or(args.store_flag.clone())
        .expect("clap requires one of them");
    let bar = if args.json || !std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
    } else {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
            )
            .context("progress bar template")?,
        );
        b
    };
    let opts = FsckOptions {
        quick: args.quick,
        mirrors: args.mirrors.clone(),
    };
    let mut report = fsck::check(&store, &opts, &Bar(bar.clone()));
    if args.repair && report.status == fsck::Status::Damaged {
        let actions = fsck::repair(&store, &opts, &report);
        if !actions.is_empty() {
            bar.reset();
            report = fsck::check(&store, &opts, &Bar(bar.clone()));
            report.repairs = actions;
        }
    }
    bar.finish_and_clear();
    check_model(&store, &mut report);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("serializing the fsck report")?
        );
    } else {
        print_human(&report);
    }
    Ok(report.exit_code() as u8)
}
