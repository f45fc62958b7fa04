//! `coli doctor`: checks this machine and a store before a long run, one line per check
//! (PASS / WARN / FAIL) with what to do about it.
//!
//! Checks, in order: the CPU's instruction set (which kernels run), cores, memory against the
//! memory plan (`coli plan`'s figures), O_DIRECT on each drive's file system (the store and its
//! mirrors), io_uring (a container's seccomp profile may refuse it), `RLIMIT_MEMLOCK` (io_uring's
//! registered buffers), a short read-bandwidth probe per drive, a quick fsck (structure only),
//! and the state directory (usage history, measured disk weights). Exit status: 0 when no check
//! FAILs (warnings included), 1 when one does, 2 when the doctor cannot run (no store there).

use crate::options::{mirror_dirs, EngineOptions};
use crate::plan::{plan_for, Plan};
use anyhow::{bail, Result};
use coli_format::disk::names::{segment_path, STAGED_DIR};
use coli_store::fsck::{self, FsckOptions, NoProgress, Status};
use coli_store::{ExpertKey, IoEngineChoice, OpenOptions, Store};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Arguments of `coli doctor`: the options of `coli run` (the checks use the store, mirrors,
/// I/O engine, budget and context a run with them would use), the probe size and JSON.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The options `coli run` takes.
    #[command(flatten)]
    pub engine: EngineOptions,
    /// Most MiB the bandwidth probe reads per drive (0: no probe).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub probe_mib: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Level {
    /// Fine.
    Pass,
    /// Works, slower or with less than it could; the fix says how to do better.
    Warn,
    /// Will not work as it is.
    Fail,
}

impl Level {
    fn label(self) -> &'static str {
        match self {
            Level::Pass => "PASS",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

/// One check: its name, outcome, what was found and (for WARN and FAIL) what to do.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// Short name (`cpu`, `memory`, `o_direct`, ...).
    pub name: String,
    /// Outcome.
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What to do about it (WARN and FAIL).
    pub fix: Option<String>,
}

fn check(name: &str, level: Level, detail: String, fix: Option<String>) -> Check {
    Check {
        name: name.into(),
        level,
        detail,
        fix,
    }
}

/// Every check's result (the JSON output).
#[derive(Debug, Serialize)]
pub struct Report {
    /// The store directory.
    pub store: String,
    /// Its store id.
    pub store_id: String,
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// The exit status: 1 when a check failed, else 0.
    pub exit_code: i32,
}

/// The numerics a run with these options computes under (`resolved` and `from`,
/// `options::numerics_and_source`: `--numerics`, else `COLI_NUMERICS`, else q8a); an unknown
/// `COLI_NUMERICS` fails, as `coli run` refuses it.
fn numerics_check(resolved: Result<coli_kernels::Numerics>, from: &str) -> Check {
    match resolved {
        Ok(n) => check(
            "numerics",
            Level::Pass,
            format!(
                "{} ({from}; id {}): {}",
                n.name(),
                coli_kernels::numerics_id_with(coli_kernels::detected_isa(), n),
                match n {
                    coli_kernels::Numerics::Q8a => {
                        "int8 activations for integer-coded weights, bf16 for bf16 weights"
                    }
                    coli_kernels::Numerics::Exact => "f32 activations, transformers' arithmetic",
                }
            ),
            None,
        ),
        Err(e) => check(
            "numerics",
            Level::Fail,
            format!("{e:#}"),
            Some("set COLI_NUMERICS to exact or q8a, or unset it".into()),
        ),
    }
}

/// The CPU: which kernels run (`coli_kernels::detected_isa`, which honours `COLI_ISA`).
fn cpu_check() -> Check {
    use coli_kernels::Isa;
    let isa = coli_kernels::detected_isa();
    let forced = std::env::var("COLI_ISA")
        .ok()
        .map(|v| format!(" (COLI_ISA={v})"))
        .unwrap_or_default();
    // The integer-activation products, last: they are a choice of their own.
    let q8a = format!(
        "; under --numerics q8a the {} integer kernel and the {} bf16 kernel{}",
        coli_kernels::integer_kernel(isa),
        coli_kernels::bf16_kernel(isa),
        if coli_kernels::interleave() {
            ", resident weights in the interleaved row order"
        } else {
            " (COLI_NO_INTERLEAVE: resident weights stay row-major)"
        }
    );
    match isa {
        Isa::Avx512 => check(
            "cpu",
            Level::Pass,
            format!(
                "AVX-512F{forced}: AVX-512 kernels for int4, int8, mxfp4 and bf16 products, AVX2 \
                 for the other encodings{q8a}"
            ),
            None,
        ),
        Isa::Avx2Fma => check(
            "cpu",
            Level::Pass,
            format!("AVX2 + FMA{forced}: the AVX2 kernels{q8a}"),
            None,
        ),
        Isa::Scalar => {
            let fix = if Isa::Avx2Fma.supported() {
                "unset COLI_ISA: this CPU has AVX2 and FMA"
            } else {
                "run on an x86-64 CPU with AVX2 and FMA (2013 and later): the SIMD kernels are \
                 several times faster"
            };
            check(
                "cpu",
                Level::Warn,
                format!("no AVX2/FMA in use{forced}: the portable scalar kernels{q8a}"),
                Some(fix.into()),
            )
        }
    }
}

/// Cores: decode is compute-bound once the experts are resident.
fn cores_check(threads: Option<u16>) -> Check {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let used = threads.map_or(cores, usize::from);
    let detail = format!("{cores} CPUs available, {used} worker threads");
    if cores < 4 {
        check(
            "cores",
            Level::Warn,
            detail,
            Some(
                "fewer than 4 cores: decode and prefill are compute-bound once experts are \
                 resident; more cores (or a larger CPU quota for this container) speed them up"
                    .into(),
            ),
        )
    } else {
        check("cores", Level::Pass, detail, None)
    }
}

/// Memory against the plan: the dense set, one sequence's KV cache and the reserve must fit;
/// the expert budget should hold at least one token's experts.
pub fn memory_check(p: &Plan) -> Check {
    let reserve = coli_engine::placement::BUDGET_RESERVE_BYTES;
    let need = p.dense_bytes + p.kv_bytes + reserve;
    let Some(limit) = p.memory_limit_bytes else {
        return check(
            "memory",
            Level::Warn,
            format!(
                "the memory limit is unknown (neither /proc/meminfo nor a cgroup limit readable); \
                 the run needs {} for the dense set, the KV cache and the reserve",
                crate::units::bytes(need as f64)
            ),
            Some("give --ram-budget explicitly".into()),
        );
    };
    let base = format!(
        "limit {} (MemAvailable capped by the memory cgroup): dense {}, KV cache {} ({} tokens), \
         reserve {}",
        crate::units::bytes(limit as f64),
        crate::units::bytes(p.dense_bytes as f64),
        crate::units::bytes(p.kv_bytes as f64),
        p.context,
        crate::units::bytes(reserve as f64)
    );
    if need > limit {
        return check(
            "memory",
            Level::Fail,
            format!(
                "{base}: {} needed, more than the limit",
                crate::units::bytes(need as f64)
            ),
            Some(
                "free memory, raise the container's memory limit, or lower --context; the dense \
                 set stays resident, only experts stream"
                    .into(),
            ),
        );
    }
    let budget = if p.budget == u64::MAX {
        "unbounded".to_string()
    } else {
        crate::units::bytes(p.budget as f64)
    };
    let detail = format!(
        "{base}; expert budget {budget}, {:.0}% of the experts resident, ~{} read per token",
        p.resident_share * 100.0,
        crate::units::bytes(p.expected_disk_bytes_per_token)
    );
    if p.budget < p.decode_step_bytes {
        check(
            "memory",
            Level::Warn,
            detail,
            Some(format!(
                "the budget holds less than one token's experts ({}): every token re-reads \
                 experts it just read; give the run more memory",
                crate::units::bytes(p.decode_step_bytes as f64)
            )),
        )
    } else {
        check("memory", Level::Pass, detail, None)
    }
}

/// The drives: the store, then each mirror; each with one segment file to probe.
fn drives(store: &Store, mirrors: &[PathBuf]) -> Vec<(String, Option<PathBuf>)> {
    let count = store.manifest().segment_count;
    let first_segment = |dir: &Path| -> Option<PathBuf> {
        (0..count)
            .map(|id| segment_path(dir, id))
            .find(|p| p.is_file())
            .or_else(|| {
                let staged = dir.join(STAGED_DIR);
                let mut files: Vec<PathBuf> = std::fs::read_dir(staged)
                    .ok()?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.is_file())
                    .collect();
                files.sort();
                files.into_iter().next()
            })
    };
    let mut out = vec![(
        format!("store {}", store.dir().display()),
        first_segment(store.dir()),
    )];
    for m in mirrors {
        out.push((format!("mirror {}", m.display()), first_segment(m)));
    }
    out
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// O_DIRECT per drive (`coli_store::probe_direct`, as the store decides at open).
fn direct_checks(store: &Store, drives: &[(String, Option<PathBuf>)]) -> Vec<Check> {
    let align = store.manifest().alignment as usize;
    drives
        .iter()
        .map(|(name, seg)| match seg {
            None => check(
                "o_direct",
                Level::Warn,
                format!("{name}: no segment file to probe"),
                Some("a mirror without segments serves no reads; copy some with `coli mirror`".into()),
            ),
            Some(p) => match coli_store::probe_direct(p, align, file_len(p)) {
                Ok(_) => check(
                    "o_direct",
                    Level::Pass,
                    format!("{name}: O_DIRECT reads work (the expert cache is not doubled by the page cache)"),
                    None,
                ),
                Err(why) => check(
                    "o_direct",
                    Level::Warn,
                    format!("{name}: {why}; expert reads go through the page cache"),
                    Some(
                        "put the store on a local ext4/xfs/btrfs file system: buffered reads \
                         spend memory twice (page cache and expert cache) and the cache \
                         budget no longer bounds what the run uses"
                            .into(),
                    ),
                ),
            },
        })
        .collect()
}

/// io_uring and RLIMIT_MEMLOCK, from the store opened as the run opens it.
fn io_checks(store: &Store, asked: IoEngineChoice) -> Vec<Check> {
    let engine = store.io_engine();
    let desc = store.io_engine_description();
    let mut out = Vec::new();
    match (asked, engine) {
        (_, "uring") => out.push(check(
            "io_uring",
            Level::Pass,
            format!("expert reads through io_uring ({desc})"),
            None,
        )),
        (IoEngineChoice::Auto, _) => out.push(check(
            "io_uring",
            Level::Warn,
            format!(
                "io_uring unavailable, reads through {engine}: {}",
                store.io_engine_note().unwrap_or("no reason given")
            ),
            Some(
                "io_uring keeps more reads in flight per thread: in a container allow \
                 io_uring_setup in the seccomp profile (docker: --security-opt \
                 seccomp=PROFILE), unset COLI_IO_URING=off, or use a kernel >= 5.6"
                    .into(),
            ),
        )),
        (IoEngineChoice::Engine(_), _) => out.push(check(
            "io_uring",
            Level::Pass,
            format!("the {engine} engine asked for with --io ({desc})"),
            None,
        )),
    }
    if engine == "uring" {
        let need = store.largest_record_len() * store.queue_depth() as u64;
        match coli_store::memlock_limit() {
            None => out.push(check(
                "memlock",
                Level::Pass,
                "RLIMIT_MEMLOCK unlimited".into(),
                None,
            )),
            Some(l) if l >= need => out.push(check(
                "memlock",
                Level::Pass,
                format!(
                    "RLIMIT_MEMLOCK {} >= {} (queue depth {} x the largest record)",
                    crate::units::bytes(l as f64),
                    crate::units::bytes(need as f64),
                    store.queue_depth()
                ),
                None,
            )),
            Some(l) => out.push(check(
                "memlock",
                Level::Warn,
                format!(
                    "RLIMIT_MEMLOCK {} < {} (queue depth {} x the largest record): io_uring may \
                     not register its buffers; reads then work unregistered, with a little more \
                     CPU per read",
                    crate::units::bytes(l as f64),
                    crate::units::bytes(need as f64),
                    store.queue_depth()
                ),
                Some(
                    "raise it: `ulimit -l unlimited` (limits.conf memlock), LimitMEMLOCK=infinity \
                     in a systemd unit, or docker --ulimit memlock=-1"
                        .into(),
                ),
            )),
        }
    }
    out
}

/// Read bandwidth per drive (`coli_store::mirror::weights::probe_file`: O_DIRECT when the file
/// system allows it, else buffered after dropping the file's pages).
fn bandwidth_checks(
    store: &Store,
    drives: &[(String, Option<PathBuf>)],
    probe_mib: u64,
    bytes_per_token: Option<f64>,
) -> Vec<Check> {
    if probe_mib == 0 {
        return vec![check(
            "disk",
            Level::Pass,
            "bandwidth probe skipped (--probe-mib 0)".into(),
            None,
        )];
    }
    let align = store.manifest().alignment;
    drives
        .iter()
        .filter_map(|(name, seg)| seg.as_ref().map(|p| (name, p)))
        .map(|(name, p)| {
            let len = file_len(p).min(probe_mib << 20);
            match coli_store::mirror::weights::probe_file(p, len, align) {
                Ok(bps) => {
                    let g = bps / (1u64 << 30) as f64;
                    let bound = match bytes_per_token {
                        Some(b) if b > 0.0 => format!(
                            "; at ~{} read per token the disk alone allows {:.1} tok/s",
                            crate::units::bytes(b),
                            bps / b
                        ),
                        _ => String::new(),
                    };
                    let detail = format!("{name}: {g:.2} GiB/s reading {}{bound}", p.display());
                    if g < 0.5 {
                        check(
                            "disk",
                            Level::Warn,
                            detail,
                            Some(
                                "below 0.5 GiB/s (a SATA or network disk?): NVMe drives read \
                                 3-7 GiB/s, and mirrors on more drives add up (`coli mirror`)"
                                    .into(),
                            ),
                        )
                    } else {
                        check("disk", Level::Pass, detail, None)
                    }
                }
                Err(e) => check(
                    "disk",
                    Level::Fail,
                    format!("{name}: reading {} failed: {e}", p.display()),
                    Some("check the drive (dmesg) and run coli-fsck on the store".into()),
                ),
            }
        })
        .collect()
}

/// The most expert-record bytes the checksum check reads (a sample of a larger store).
const CHECKSUM_SAMPLE_BYTES: u64 = 256 << 20;

/// Verifies the xxh3 of expert records, read through the store's own fetch path: every record
/// when they take at most [`CHECKSUM_SAMPLE_BYTES`] (PASS when all match), else an evenly
/// spread sample of that many bytes (WARN: the others are not verified, `coli-fsck` does it);
/// FAIL naming the first record that fails.
fn checksum_check(store: &Store) -> Check {
    let index = store.index();
    let total: u64 = index.iter().map(|r| r.length.get()).sum();
    let per = index.first().map_or(1, |r| r.length.get().max(1));
    let take = if total <= CHECKSUM_SAMPLE_BYTES {
        index.len()
    } else {
        ((CHECKSUM_SAMPLE_BYTES / per) as usize).clamp(1, index.len())
    };
    let mut checked = 0usize;
    for i in 0..take {
        let r = &index[i * index.len() / take];
        let key = ExpertKey::new(r.layer.get(), r.expert.get());
        if let Err(e) = store.fetch(&[key]) {
            return check(
                "checksums",
                Level::Fail,
                format!("{key}: {e}"),
                Some(
                    "run `coli-fsck DIR` for every damaged record; `coli-fsck --repair --mirror M` \
                     rewrites bad records from a mirror, else convert again"
                        .into(),
                ),
            );
        }
        checked += 1;
    }
    if checked == index.len() {
        check(
            "checksums",
            Level::Pass,
            format!("all {checked} expert records match their xxh3"),
            None,
        )
    } else {
        check(
            "checksums",
            Level::Warn,
            format!(
                "{checked} of {} expert records verified (an even sample, {} MiB); the others not",
                index.len(),
                CHECKSUM_SAMPLE_BYTES >> 20
            ),
            Some("run `coli-fsck DIR` to verify every record and dense tensor".into()),
        )
    }
}

/// The quick fsck's verdict (structure only; `coli-fsck` checks every checksum).
fn fsck_check(r: &fsck::FsckReport) -> Check {
    match r.status {
        Status::Clean => check(
            "fsck",
            Level::Pass,
            "structure clean (headers, sizes, mirrors; the checksums line says what was verified)"
                .into(),
            None,
        ),
        _ => {
            let mut what: Vec<String> = r
                .problems
                .iter()
                .take(3)
                .map(|p| format!("{}: {}", p.file, p.what))
                .collect();
            what.extend(
                r.bad_files
                    .iter()
                    .take(3)
                    .map(|f| format!("files/{}: {}", f.name, f.what)),
            );
            // --repair rewrites expert records; the quick check finds structure, sizes and
            // copied files, which only a new conversion or a copy of the store restores.
            let fix = if r.bad_records.is_empty() {
                "run `coli-fsck DIR` for the full report; convert again, or restore the named \
                 files from a copy of the store (`coli-fsck --repair` rewrites expert records only)"
            } else {
                "run `coli-fsck DIR` for the full report; `coli-fsck --repair --mirror M` \
                 rewrites bad records from a mirror, else convert again"
            };
            check(
                "fsck",
                Level::Fail,
                format!("quick check found damage: {}", what.join("; ")),
                Some(fix.into()),
            )
        }
    }
}

/// The state directory: writable, or where usage histories and disk weights cannot be kept.
fn state_dir_check() -> Check {
    let Some(d) = coli_store::mirror::weights::default_state_dir() else {
        return check(
            "state_dir",
            Level::Warn,
            "no state directory: none of COLI_STATE_DIR, XDG_STATE_HOME, HOME is set".into(),
            Some(
                "set COLI_STATE_DIR to a writable directory: usage histories (pinning) and \
                 measured disk weights are kept there"
                    .into(),
            ),
        );
    };
    let probe = d.join(format!(".doctor-{}", std::process::id()));
    let r = std::fs::create_dir_all(&d)
        .and_then(|()| std::fs::write(&probe, b"ok"))
        .and_then(|()| std::fs::remove_file(&probe));
    match r {
        Ok(()) => check(
            "state_dir",
            Level::Pass,
            format!("{} is writable", d.display()),
            None,
        ),
        Err(e) => check(
            "state_dir",
            Level::Warn,
            format!("{} is not writable: {e}", d.display()),
            Some(
                "set COLI_STATE_DIR to a writable directory: without it nothing learned \
                 (usage history, disk weights) survives the run"
                    .into(),
            ),
        ),
    }
}

/// Runs every check.
///
/// # Errors
/// When the doctor cannot run: no store can be opened at `a.engine.store` (the fsck's reason).
pub fn doctor(a: &DoctorArgs) -> Result<Report> {
    let opts = &a.engine;
    let mirrors = mirror_dirs(&opts.mirrors);
    let fsck_report = fsck::check(
        &opts.store,
        &FsckOptions {
            quick: true,
            mirrors: mirrors.clone(),
        },
        &NoProgress,
    );
    if fsck_report.status == Status::Unusable {
        let why = fsck_report.problems_line();
        bail!(
            "cannot check {}: {}",
            opts.store.display(),
            if why.is_empty() {
                "no store there"
            } else {
                &why
            }
        );
    }
    // The engines this builds (the memory plan) compute under the run's numerics; an unknown
    // COLI_NUMERICS fails its check instead of the library's fallback warning.
    let (numerics, from) = crate::options::numerics_and_source(opts.numerics);
    coli_kernels::set_numerics(*numerics.as_ref().unwrap_or(&coli_kernels::Numerics::Q8a));
    let mut checks = vec![
        cpu_check(),
        numerics_check(numerics, from),
        cores_check(opts.threads),
    ];
    // The store as the run opens it, without mirrors (they are probed as drives here).
    let store = Store::open_with(
        &opts.store,
        &OpenOptions {
            verify_checksums: false,
            mirrors: Vec::new(),
            ..opts.open_options()?
        },
    );
    let mut store_id = fsck_report.store_id.clone().unwrap_or_default();
    match store {
        Ok(store) => {
            store_id = store.manifest().store_id.to_string();
            let plan = plan_for(opts, 0);
            let bytes_per_token = match &plan {
                Ok(p) => {
                    checks.push(memory_check(p));
                    Some(p.expected_disk_bytes_per_token)
                }
                Err(e) => {
                    checks.push(check(
                        "memory",
                        Level::Fail,
                        format!("the memory plan failed: {e:#}"),
                        Some("see `coli plan` with the same options".into()),
                    ));
                    None
                }
            };
            match Store::open_with(
                &opts.store,
                &OpenOptions {
                    verify_checksums: true,
                    mirrors: Vec::new(),
                    ..opts.open_options()?
                },
            ) {
                Ok(verifying) => checks.push(checksum_check(&verifying)),
                Err(e) => checks.push(check(
                    "checksums",
                    Level::Fail,
                    format!("the store does not open to verify records: {e}"),
                    None,
                )),
            }
            let drives = drives(&store, &mirrors);
            checks.extend(direct_checks(&store, &drives));
            checks.extend(io_checks(&store, opts.io));
            checks.extend(bandwidth_checks(
                &store,
                &drives,
                a.probe_mib,
                bytes_per_token,
            ));
        }
        Err(e) => checks.push(check(
            "store",
            Level::Fail,
            format!("the store does not open ({e}): memory, I/O and disk not checked"),
            Some("see the fsck line below".into()),
        )),
    }
    checks.push(fsck_check(&fsck_report));
    checks.push(state_dir_check());
    let exit_code = i32::from(checks.iter().any(|c| c.level == Level::Fail));
    Ok(Report {
        store: opts.store.display().to_string(),
        store_id,
        checks,
        exit_code,
    })
}

/// Runs `coli doctor`: prints the report (a line per check, `fix:` lines under WARN and FAIL,
/// a summary) or JSON; returns the exit status (0 or 1).
///
/// # Errors
/// As [`doctor`] (the caller exits with 2).
pub fn run(a: &DoctorArgs) -> Result<i32> {
    let r = doctor(a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(r.exit_code);
    }
    println!("coli doctor: {} (store {})", r.store, r.store_id);
    for c in &r.checks {
        println!("{}  {:<10} {}", c.level.label(), c.name, c.detail);
        if let Some(f) = &c.fix {
            println!("      {:<10} fix: {f}", "");
        }
    }
    let count = |l| r.checks.iter().filter(|c| c.level == l).count();
    println!(
        "result: {} passed, {} warnings, {} failed",
        count(Level::Pass),
        count(Level::Warn),
        count(Level::Fail)
    );
    Ok(r.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(limit: Option<u64>, dense: u64, kv: u64, budget: u64, step: u64) -> Plan {
        Plan {
            store: "s".into(),
            store_id: "0".repeat(32),
            experts: 8,
            expert_bytes_total: 8 << 20,
            mean_expert_bytes: (1 << 20) as f64,
            dense_bytes: dense,
            kv_bytes_per_token: 1024,
            kv_bytes: kv,
            kv_cache_budget_bytes: 0,
            context: 1024,
            budget,
            budget_from_available_memory: true,
            memory_limit_bytes: limit,
            sequences_fit: None,
            prefill_batch: 64,
            pinned_experts: 0,
            pinned_bytes: 0,
            cache_capacity_bytes: budget,
            cache_capacity_experts: 1.0,
            resident_share: 0.5,
            usage_history: None,
            usage_tokens: 0.0,
            routing_model: "uniform routing",
            expected_disk_bytes_per_token: 1e6,
            decode_step_bytes: step,
            probe_bytes: 0,
            probe_s: 0.0,
            probe_io_mode: "none".into(),
            disk_gib_s: None,
            decode_tok_s_bound: None,
            ram_total_bytes: 0,
        }
    }

    #[test]
    fn memory_levels() {
        let g = 1u64 << 30;
        // Fits, budget above one token's experts.
        let c = memory_check(&plan(Some(8 * g), 2 * g, g, 4 * g, g));
        assert_eq!(c.level, Level::Pass, "{c:?}");
        // Dense + KV + 512 MiB reserve over the limit.
        let c = memory_check(&plan(Some(3 * g), 2 * g, g, 0, g));
        assert_eq!(c.level, Level::Fail, "{c:?}");
        assert!(c.detail.contains("more than the limit") && c.fix.is_some());
        // Fits, but the budget is below one token's experts.
        let c = memory_check(&plan(Some(8 * g), 2 * g, g, g / 2, g));
        assert_eq!(c.level, Level::Warn, "{c:?}");
        assert!(c.fix.as_deref().unwrap().contains("one token's experts"));
        // Unknown limit.
        let c = memory_check(&plan(None, 2 * g, g, 4 * g, g));
        assert_eq!(c.level, Level::Warn);
    }
}
