//! `coli mirror plan|stage|copy|verify`: build and check mirrors of a store on other drives
//! (docs/MIRRORS.md).
//!
//! - `plan`: which records a partial mirror should hold: the most expected reads saved per byte
//!   (usage-history count / record bytes), within `--budget`, skipping records the mirror
//!   already holds; or an explicit selection (`--layers`, `--experts`).
//! - `stage`: writes the plan as a new staged segment (temporary file, fsync, verify, atomic
//!   rename; keeps `--reserve` bytes free; never deletes or rewrites existing mirror files).
//! - `copy`: byte-identical full copies of every primary segment the mirror lacks.
//! - `verify`: the mirror part of `coli-fsck STORE --mirror DIR` (exit 0 clean, 1 damaged,
//!   2 when it cannot check: no store, no mirror directory; as `coli-fsck`).

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use coli_engine::usage::{default_usage_path, UsageHistory};
use coli_store::fsck::{self, FsckOptions, MirrorStatus, NoProgress};
use coli_store::mirror::copy::{copy_segments, CopyOutcome};
use coli_store::mirror::staged::data_start;
use coli_store::mirror::{self, stage_records, PrimaryInfo};
use coli_store::{ExpertKey, Store};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// `coli mirror ...`.
#[derive(Args, Debug)]
pub struct MirrorArgs {
    #[command(subcommand)]
    cmd: MirrorCmd,
}

impl MirrorArgs {
    /// Whether this is `coli mirror verify` (whose errors exit 2, a verdict's damage 1).
    pub fn is_verify(&self) -> bool {
        matches!(self.cmd, MirrorCmd::Verify(_))
    }
}

#[derive(Subcommand, Debug)]
enum MirrorCmd {
    /// Show which records a partial mirror should hold (nothing is written).
    Plan(SelectArgs),
    /// Write the planned records into a new staged segment of the mirror.
    Stage(SelectArgs),
    /// Copy every primary segment file the mirror lacks, byte for byte.
    Copy(CopyArgs),
    /// Verify every file of the mirror against the store (exit 0 clean, 1 damaged, 2 cannot
    /// check).
    Verify(VerifyArgs),
}

#[derive(Args, Debug)]
struct Common {
    /// The primary store directory.
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// The mirror directory (must exist; on the other drive).
    #[arg(long, alias = "to", value_name = "DIR")]
    mirror: PathBuf,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct SelectArgs {
    #[command(flatten)]
    common: Common,
    /// Bytes the new staged segment may take (header and index included): K/M/G/T suffixes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    budget: Option<u64>,
    /// Usage history to rank records by (default: the engine's history of this store,
    /// `$COLI_STATE_DIR/usage-<store id>.json`).
    #[arg(long, value_name = "FILE")]
    usage: Option<PathBuf>,
    /// At most N records (the hottest first).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Only records of these layers (`0,3,5-7`); without a usage history, all of them.
    #[arg(long, value_name = "LIST")]
    layers: Option<String>,
    /// Exactly these records: `LAYER:EXPERT,...` (no ranking).
    #[arg(long, value_name = "LIST", conflicts_with_all = ["usage", "top", "layers"])]
    experts: Option<String>,
    /// Free space to keep on the mirror's file system after staging: K/M/G/T suffixes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, default_value = "1G")]
    reserve: u64,
}

#[derive(Args, Debug)]
struct CopyArgs {
    #[command(flatten)]
    common: Common,
    /// Free space to keep on the mirror's file system after copying: K/M/G/T suffixes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, default_value = "1G")]
    reserve: u64,
}

#[derive(Args, Debug)]
struct VerifyArgs {
    #[command(flatten)]
    common: Common,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    coli_engine::parse_size(s).map_err(|e| e.to_string())
}

fn open_store(dir: &Path) -> Result<Store> {
    crate::options::open_store(dir, &coli_store::OpenOptions::default())
}

fn check_mirror_dir(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        bail!(
            "mirror directory {} does not exist; create it on the other drive first (mkdir -p)",
            dir.display()
        );
    }
    Ok(())
}

/// Parses `0,3,5-7` into layer numbers.
fn parse_layers(s: &str) -> Result<HashSet<u32>> {
    let mut out = HashSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--layers: {part:?} is not a layer or range like 5-7");
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().with_context(bad)?;
            let b: u32 = b.trim().parse().with_context(bad)?;
            if a > b {
                bail!(bad());
            }
            out.extend(a..=b);
        } else {
            out.insert(part.parse().with_context(bad)?);
        }
    }
    Ok(out)
}

/// Parses `--experts L:E,L:E,..` into expert keys, in the order given, each expert once (a
/// repeat is dropped).
fn parse_experts(s: &str) -> Result<Vec<ExpertKey>> {
    let mut seen = std::collections::HashSet::new();
    let keys: Vec<ExpertKey> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (l, e) = p
                .split_once(':')
                .with_context(|| format!("--experts: {p:?} is not LAYER:EXPERT"))?;
            Ok(ExpertKey::new(
                l.trim()
                    .parse()
                    .with_context(|| format!("--experts: bad layer in {p:?}"))?,
                e.trim()
                    .parse()
                    .with_context(|| format!("--experts: bad expert in {p:?}"))?,
            ))
        })
        .collect::<Result<_>>()?;
    Ok(keys.into_iter().filter(|k| seen.insert(*k)).collect())
}

/// A planned staged segment.
struct Plan {
    keys: Vec<ExpertKey>,
    bytes: u64,
    expected_reads: f64,
    ranked_by: &'static str,
    skipped_held: usize,
}

fn plan(store: &Store, a: &SelectArgs) -> Result<Plan> {
    let primary = PrimaryInfo::of(store).context("reading the store's segment headers")?;
    let set = mirror::admit(&primary, std::slice::from_ref(&a.common.mirror))
        .with_context(|| format!("looking at mirror {}", a.common.mirror.display()))?;
    let held: HashSet<ExpertKey> = store
        .index()
        .iter()
        .enumerate()
        .filter(|(pos, _)| !set.copies[*pos].is_empty())
        .map(|(_, r)| r.key())
        .collect();
    let layers = a.layers.as_deref().map(parse_layers).transpose()?;
    // Candidates with their expected reads (usage count), hottest first.
    let (cands, ranked_by): (Vec<(ExpertKey, f64)>, &'static str) = if let Some(s) = &a.experts {
        let keys = parse_experts(s)?;
        for k in &keys {
            if store.record(*k).is_none() {
                bail!("--experts: {k} is not in the store");
            }
        }
        (keys.into_iter().map(|k| (k, 0.0)).collect(), "explicit")
    } else {
        let sid = store.manifest().store_id;
        let path = a.usage.clone().or_else(|| default_usage_path(sid));
        let hist = match &path {
            Some(p) if p.exists() || a.usage.is_some() => UsageHistory::load(p, sid)
                .with_context(|| format!("reading usage history {}", p.display()))?,
            _ => None,
        };
        match hist {
            Some(h) => (
                h.hottest()
                    .into_iter()
                    .filter(|(k, _)| layers.as_ref().is_none_or(|l| l.contains(&k.layer)))
                    .filter(|(k, _)| store.record(*k).is_some())
                    .collect(),
                "usage",
            ),
            None => {
                let Some(l) = &layers else {
                    bail!(
                        "no usage history for store {sid} (run the model first, or pass --usage FILE); select records with --layers LIST or --experts L:E,..."
                    );
                };
                (
                    store
                        .index()
                        .iter()
                        .filter(|r| l.contains(&r.layer.get()))
                        .map(|r| (r.key(), 0.0))
                        .collect(),
                    "layers",
                )
            }
        }
    };
    // Most expected reads saved per byte: counts / record bytes, stable on ties.
    let mut cands: Vec<(ExpertKey, f64, u64)> = cands
        .into_iter()
        .map(|(k, c)| (k, c, store.record(k).expect("checked").length.get()))
        .collect();
    if ranked_by == "usage" {
        cands.sort_by(|x, y| {
            (y.1 / y.2 as f64)
                .total_cmp(&(x.1 / x.2 as f64))
                .then(x.0.cmp(&y.0))
        });
    }
    let align = store.manifest().alignment;
    let mut keys = Vec::new();
    let mut rec_bytes = 0u64;
    let mut reads = 0.0;
    let mut skipped_held = 0;
    for (k, c, len) in cands {
        if held.contains(&k) {
            skipped_held += 1;
            continue;
        }
        if a.top.is_some_and(|n| keys.len() >= n) {
            break;
        }
        let total = data_start(keys.len() as u64 + 1, align) + rec_bytes + len;
        if a.budget.is_some_and(|b| total > b) {
            if ranked_by == "usage" {
                continue; // a smaller record further down may still fit
            }
            break;
        }
        keys.push(k);
        rec_bytes += len;
        reads += c;
    }
    let bytes = if keys.is_empty() {
        0
    } else {
        data_start(keys.len() as u64, align) + rec_bytes
    };
    Ok(Plan {
        keys,
        bytes,
        expected_reads: reads,
        ranked_by,
        skipped_held,
    })
}

fn print_plan(p: &Plan, json: bool, written: Option<&Path>) {
    if json {
        let obj = serde_json::json!({
            "records": p.keys.len(),
            "bytes": p.bytes,
            "ranked_by": p.ranked_by,
            "expected_reads": p.expected_reads,
            "already_held": p.skipped_held,
            "experts": p.keys.iter().map(|k| [k.layer, k.expert]).collect::<Vec<_>>(),
            "written": written.map(|w| w.display().to_string()),
        });
        println!("{obj}");
        return;
    }
    println!(
        "{} records, {} bytes (ranked by {}; {} records already on the mirror skipped)",
        p.keys.len(),
        p.bytes,
        p.ranked_by,
        p.skipped_held
    );
    if p.ranked_by == "usage" {
        println!("expected reads covered: {:.1}", p.expected_reads);
    }
    for k in p.keys.iter().take(20) {
        println!("  {k}");
    }
    if p.keys.len() > 20 {
        println!("  ... and {} more", p.keys.len() - 20);
    }
    if let Some(w) = written {
        println!("wrote {}", w.display());
    }
}

/// Mirror read counters of an open store as JSON (`None` without mirrors): per drive `dir`,
/// `reads`, `bytes`, `faults`, `in_rotation`, `weight`; `striped_reads`, `fallbacks`,
/// `checksum_failures`, `read_errors`.
pub fn stats_json(store: &Store) -> Option<serde_json::Value> {
    let m = store.mirror_stats()?;
    let drives: Vec<serde_json::Value> = m
        .drives
        .iter()
        .zip(&m.weights)
        .map(|(d, w)| {
            serde_json::json!({"dir": d.dir.display().to_string(), "reads": d.reads,
                "bytes": d.bytes, "faults": d.faults, "in_rotation": d.in_rotation, "weight": w})
        })
        .collect();
    Some(
        serde_json::json!({"drives": drives, "striped_reads": m.striped_reads,
        "fallbacks": m.fallbacks, "checksum_failures": m.checksum_failures,
        "read_errors": m.read_errors}),
    )
}

/// Prints the mirror read counters on stderr (nothing without mirrors).
pub fn print_stats(store: &Store) {
    let Some(m) = store.mirror_stats() else {
        return;
    };
    let total: u64 = m.drives.iter().map(|d| d.bytes).sum::<u64>().max(1);
    // Weights are measured bytes per second or given ratios: print each as its share.
    let wsum: f64 = m.weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    for (i, (d, w)) in m.drives.iter().zip(&m.weights).enumerate() {
        eprintln!(
            "drive {i} {}: {} reads, {} bytes ({:.1}%, weight share {:.1}%), {} faults{}",
            d.dir.display(),
            d.reads,
            d.bytes,
            d.bytes as f64 * 100.0 / total as f64,
            w * 100.0 / wsum,
            d.faults,
            if d.in_rotation {
                ""
            } else {
                ", out of rotation"
            }
        );
    }
    eprintln!(
        "mirrors: {} striped reads, {} fallbacks, {} checksum failures, {} read errors",
        m.striped_reads, m.fallbacks, m.checksum_failures, m.read_errors
    );
}

/// Runs `coli mirror ...`; `Ok(code)` is the process exit code (verify: 1 when damaged).
///
/// # Errors
/// Bad arguments, a store that does not open, a missing mirror directory, I/O errors and
/// short space, each with what to do.
pub fn run(a: MirrorArgs) -> Result<u8> {
    match a.cmd {
        MirrorCmd::Plan(s) | MirrorCmd::Stage(s)
            if s.budget.is_none()
                && s.top.is_none()
                && s.experts.is_none()
                && s.layers.is_none() =>
        {
            bail!(
                "say how much to stage: --budget SIZE, --top N, --layers LIST or --experts L:E,..."
            )
        }
        MirrorCmd::Plan(s) => {
            check_mirror_dir(&s.common.mirror)?;
            let store = open_store(&s.common.store)?;
            let p = plan(&store, &s)?;
            print_plan(&p, s.common.json, None);
            Ok(0)
        }
        MirrorCmd::Stage(s) => {
            check_mirror_dir(&s.common.mirror)?;
            let store = open_store(&s.common.store)?;
            let p = plan(&store, &s)?;
            if p.keys.is_empty() {
                bail!(
                    "nothing to stage: every selected record is already on {} or none fits the budget",
                    s.common.mirror.display()
                );
            }
            let w = stage_records(&store, &s.common.mirror, &p.keys, s.reserve)
                .with_context(|| format!("staging into {}", s.common.mirror.display()))?;
            print_plan(&p, s.common.json, Some(&w.path));
            Ok(0)
        }
        MirrorCmd::Copy(c) => {
            check_mirror_dir(&c.common.mirror)?;
            let store = open_store(&c.common.store)?;
            let out = copy_segments(&store, &c.common.mirror, c.reserve)
                .with_context(|| format!("copying into {}", c.common.mirror.display()))?;
            let blocked = out
                .iter()
                .filter(|o| matches!(o, CopyOutcome::Blocked(..)))
                .count();
            if c.common.json {
                let v: Vec<serde_json::Value> = out
                    .iter()
                    .map(|o| match o {
                        CopyOutcome::Copied(f, b) => {
                            serde_json::json!({"file": f, "status": "copied", "bytes": b})
                        }
                        CopyOutcome::Present(f) => {
                            serde_json::json!({"file": f, "status": "present"})
                        }
                        CopyOutcome::Blocked(f, d) => {
                            serde_json::json!({"file": f, "status": "blocked", "detail": d})
                        }
                    })
                    .collect();
                println!("{}", serde_json::json!({ "files": v }));
            } else {
                for o in &out {
                    match o {
                        CopyOutcome::Copied(f, b) => println!("copied {f} ({b} bytes, verified)"),
                        CopyOutcome::Present(f) => println!("present {f}"),
                        CopyOutcome::Blocked(f, d) => println!(
                            "BLOCKED {f}: {d}; left as is: run `coli-fsck STORE --mirror DIR --repair`, or remove it and copy again"
                        ),
                    }
                }
            }
            Ok(if blocked > 0 { 1 } else { 0 })
        }
        MirrorCmd::Verify(v) => {
            check_mirror_dir(&v.common.mirror)?;
            let opts = FsckOptions {
                quick: false,
                mirrors: vec![v.common.mirror.clone()],
            };
            let r = fsck::check(&v.common.store, &opts, &NoProgress);
            if r.status == fsck::Status::Unusable {
                bail!("cannot verify: {}", r.problems_line());
            }
            // A primary whose structure is damaged is not checked against (fsck stops before
            // the mirrors): say what is wrong with it instead.
            let Some(m) = r.mirrors.first() else {
                bail!(
                    "cannot verify the mirror: the store {d} is damaged ({}); run `coli-fsck {d}` to see what is wrong",
                    r.problems_line(),
                    d = v.common.store.display()
                );
            };
            let bad = m
                .files
                .iter()
                .any(|f| matches!(f.status, MirrorStatus::Damaged | MirrorStatus::Mismatched));
            if v.common.json {
                println!("{}", serde_json::to_string_pretty(m)?);
            } else {
                for f in &m.files {
                    let st = match f.status {
                        MirrorStatus::Admitted => "admitted",
                        MirrorStatus::Missing => "missing",
                        MirrorStatus::Mismatched => "MISMATCHED",
                        MirrorStatus::Damaged => "DAMAGED",
                    };
                    match &f.detail {
                        Some(d) => println!("{} ({}): {st}: {d}", f.file, f.kind),
                        None => println!("{} ({}, {} records): {st}", f.file, f.kind, f.records),
                    }
                }
                println!(
                    "result: {}",
                    if bad {
                        "DAMAGED: run `coli-fsck STORE --mirror DIR --repair`"
                    } else {
                        "clean"
                    }
                );
            }
            Ok(if bad { 1 } else { 0 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn experts_are_parsed_in_order_once_each() {
        let k = ExpertKey::new;
        assert_eq!(
            parse_experts("0:1, 1:7,0:1,,2:0").unwrap(),
            vec![k(0, 1), k(1, 7), k(2, 0)]
        );
        assert!(parse_experts("0-1").is_err());
        assert!(parse_experts("x:1").is_err());
    }
}
