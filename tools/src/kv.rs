//! `coli kv ls|clear`: the KV cache files of the prefix cache (docs/KV_CACHE.md). `ls` reads
//! and checks each file's header (not its body: that needs the model's shapes, and is checked
//! when a file is read back); `clear` removes files under the directory's lock.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use coli_engine::prefix_cache::disk::{is_kv_file_name, KV_FILE_SUFFIX, QUARANTINE_DIR};
use coli_engine::prefix_cache::file::{read_header, KvFileError, KvFileHeader};
use serde_json::json;
use std::path::{Path, PathBuf};

/// `coli kv`.
#[derive(Args, Debug)]
pub struct KvArgs {
    #[command(subcommand)]
    cmd: KvCmd,
}

#[derive(Subcommand, Debug)]
enum KvCmd {
    /// List the KV cache files: store, tokens, bytes, scope, age, and whether the header checks.
    Ls(KvDirArgs),
    /// Remove KV cache files (all, or one store's) and the quarantined ones.
    Clear(KvClearArgs),
}

#[derive(Args, Debug)]
struct KvDirArgs {
    /// The KV cache directory (default: the one chat and serve use, under the state directory).
    #[arg(long, value_name = "DIR")]
    kv_dir: Option<PathBuf>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct KvClearArgs {
    /// The KV cache directory (default: the one chat and serve use, under the state directory).
    #[arg(long, value_name = "DIR")]
    kv_dir: Option<PathBuf>,
    /// Only this store's files (its id, as `coli info` prints it).
    #[arg(long, value_name = "ID")]
    store_id: Option<String>,
}

fn dir_or_default(d: &Option<PathBuf>) -> Result<PathBuf> {
    d.clone()
        .or_else(coli_engine::prefix_cache::default_disk_dir)
        .context("no KV cache directory: pass --kv-dir DIR (or set COLI_STATE_DIR)")
}

/// Runs `coli kv`.
///
/// # Errors
/// The directory cannot be listed or locked, a file cannot be removed.
pub fn kv(a: KvArgs) -> Result<()> {
    match a.cmd {
        KvCmd::Ls(a) => ls(&dir_or_default(&a.kv_dir)?, a.json),
        KvCmd::Clear(a) => clear(&dir_or_default(&a.kv_dir)?, a.store_id.as_deref()),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The KV cache files of `dir` (named as coli names them; other files are never touched), or
/// with `quarantined` every `.kv` file of the quarantine directory `dir`.
fn files(dir: &Path, quarantined: bool) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = if quarantined {
            name.ends_with(KV_FILE_SUFFIX)
        } else {
            is_kv_file_name(&name)
        };
        if ours {
            out.push((e.path(), e.metadata().map_or(0, |m| m.len())));
        }
    }
    out.sort();
    Ok(out)
}

fn ls(dir: &Path, as_json: bool) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut rows = Vec::new();
    for (path, bytes) in files(dir, false)? {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The header holds the body's length: a file of another length lost its tail (or has
        // bytes after it) and is not served.
        let header = match read_header(&path, None) {
            Ok(h) => {
                let want =
                    (KvFileHeader::encoded_len(h.tokens.len()) as u64).saturating_add(h.body_len);
                match bytes.cmp(&want) {
                    std::cmp::Ordering::Equal => Ok(h),
                    std::cmp::Ordering::Less => Err((
                        "truncated",
                        format!("{}: {bytes} bytes, its header says {want}", path.display()),
                    )),
                    std::cmp::Ordering::Greater => Err((
                        "damaged",
                        format!(
                            "{}: {bytes} bytes, its header says {want} (bytes after the body)",
                            path.display()
                        ),
                    )),
                }
            }
            Err(e) => Err((
                match e {
                    KvFileError::Newer { .. } => "newer version",
                    KvFileError::Io { .. } => "unreadable",
                    _ => "damaged",
                },
                e.to_string(),
            )),
        };
        rows.push(match header {
            Ok(h) => json!({
                "file": name, "bytes": bytes, "status": "ok",
                "store_id": hex(&h.store_id), "parameter_hash": format!("{:016x}", h.param_hash),
                "tokens": h.tokens.len(), "scope": if h.scope == 0 { "shared".to_string() } else { format!("private {:016x}", h.scope) },
                "mtp_state": h.has_mtp, "age_s": now.saturating_sub(h.created_unix_s),
            }),
            Err((status, error)) => {
                json!({"file": name, "bytes": bytes, "status": status, "error": error})
            }
        });
    }
    let quarantined = files(&dir.join(QUARANTINE_DIR), true)?.len();
    if as_json {
        println!(
            "{}",
            json!({"dir": dir.display().to_string(), "files": rows, "quarantined": quarantined})
        );
        return Ok(());
    }
    println!("{} ({} files)", dir.display(), rows.len());
    if !rows.is_empty() {
        println!(
            "{:<32}  {:>8}  {:>10}  {:<22}  {:>8}  status",
            "store", "tokens", "MiB", "scope", "age"
        );
    }
    for r in &rows {
        let mib = r["bytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64;
        if r["status"] == "ok" {
            let age = r["age_s"].as_u64().unwrap_or(0);
            println!(
                "{:<32}  {:>8}  {:>10.2}  {:<22}  {:>8}  ok",
                r["store_id"].as_str().unwrap_or(""),
                r["tokens"].as_u64().unwrap_or(0),
                mib,
                r["scope"].as_str().unwrap_or(""),
                format_age(age)
            );
        } else {
            // The store column holds the file name's first 32 characters (the store id, for a
            // file coli named), so the columns stay aligned; the error names the whole path.
            let file = r["file"].as_str().unwrap_or("");
            println!(
                "{:<32}  {:>8}  {:>10.2}  {:<22}  {:>8}  {}: {}",
                file.get(..32).unwrap_or(file),
                "-",
                mib,
                "-",
                "-",
                r["status"].as_str().unwrap_or(""),
                r["error"].as_str().unwrap_or("")
            );
        }
    }
    if quarantined > 0 {
        println!(
            "{quarantined} quarantined file(s) in {} (damaged or foreign; `coli kv clear` removes them)",
            dir.join(QUARANTINE_DIR).display()
        );
    }
    Ok(())
}

fn format_age(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86400),
    }
}

fn clear(dir: &Path, store_id: Option<&str>) -> Result<()> {
    if !dir.is_dir() {
        println!("{}: no KV cache files", dir.display());
        return Ok(());
    }
    let _lock = coli_engine::prefix_cache::disk::lock(dir)
        .with_context(|| format!("locking {}", dir.display()))?;
    let mut removed = 0u64;
    let mut bytes = 0u64;
    for (path, len) in files(dir, false)? {
        let mine = match store_id {
            None => true,
            Some(id) => path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{id}-"))),
        };
        if mine {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            removed += 1;
            bytes += len;
        }
    }
    let q = dir.join(QUARANTINE_DIR);
    let mut quarantined = 0;
    if store_id.is_none() {
        for (path, _) in files(&q, true)? {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            quarantined += 1;
        }
    }
    println!(
        "removed {removed} KV cache file(s), {:.2} MiB, and {quarantined} quarantined from {}",
        bytes as f64 / (1u64 << 20) as f64,
        dir.display()
    );
    Ok(())
}
