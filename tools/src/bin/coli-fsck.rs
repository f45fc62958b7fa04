//! `coli-fsck`: verifies a coli store (and mirror copies of its segment files).
//!
//! Exit codes: 0 clean, 1 damaged or mismatched, 2 unusable input (see `docs/FSCK.md`).

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
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
struct Args {
    /// The store directory.
    store: PathBuf,
    /// A directory holding copies of segment files (DIR/segments/seg-NNNNN.bin); repeatable.
    #[arg(long = "mirror", value_name = "DIR")]
    mirrors: Vec<PathBuf>,
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

fn print_human(r: &FsckReport) {
    println!("store: {}", r.store);
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
                Some(d) => println!("mirror {}: {}: {status}: {d}", m.dir, f.file),
                None => println!("mirror {}: {}: {status}", m.dir, f.file),
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
        fsck::Status::Damaged => {
            "DAMAGED: re-convert the store or restore the named files from a good copy".into()
        }
        fsck::Status::Unusable => "UNUSABLE: not a coli store this version can check".into(),
    };
    println!("result: {verdict}");
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
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
    let report = fsck::check(&args.store, &opts, &Bar(bar.clone()));
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("serializing the fsck report")?
        );
    } else {
        print_human(&report);
    }
    std::process::exit(report.exit_code());
}
