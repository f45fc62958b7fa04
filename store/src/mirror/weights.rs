//! Disk weights: each drive's share of the reads, declared (`--disk-weights 9,3`) or measured
//! with a short O_DIRECT probe and cached per store and device.

use super::io_err;
use super::set::{MirrorFileKind, MirrorSet, PrimaryInfo};
use super::status::MirrorStatus;
use crate::StoreError;
use crate::StoreId;
use coli_format::disk::names::segment_path;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where the weights came from.
#[derive(Clone, Debug, PartialEq)]
pub enum DiskWeights {
    /// Given by the user: one weight per drive, primary first (relative, any unit).
    Declared(Vec<f64>),
    /// Measured read bandwidth per drive, bytes per second (a cached measurement included).
    Measured(Vec<f64>),
}

impl DiskWeights {
    /// The weights, primary first.
    pub fn values(&self) -> &[f64] {
        match self {
            DiskWeights::Declared(v) | DiskWeights::Measured(v) => v,
        }
    }
}

/// Parses `--disk-weights` / `COLI_DISK_WEIGHTS`: comma-separated positive finite numbers,
/// primary first, then mirrors in the order given (`9,3`, `1,0.5,0.5`).
///
/// # Errors
/// A message naming the bad entry.
pub fn parse_disk_weights(s: &str) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for (i, part) in s.split(',').enumerate() {
        let t = part.trim();
        let v: f64 = t.parse().map_err(|_| {
            format!(
                "disk weight {} ({t:?}) is not a number; expected e.g. 9,3",
                i + 1
            )
        })?;
        if !(v > 0.0 && v.is_finite()) {
            return Err(format!(
                "disk weight {} ({t}) must be a positive finite number",
                i + 1
            ));
        }
        out.push(v);
    }
    Ok(out)
}

/// Number of probe reads per drive.
pub const PROBE_READS: usize = 8;
/// Size of one probe read, bytes (at most; smaller files are read whole).
pub const PROBE_READ_BYTES: u64 = 8 << 20;

/// Measures the read bandwidth of the file at `path` (`len` bytes) in bytes per second:
/// [`PROBE_READS`] reads of up to [`PROBE_READ_BYTES`] at offsets spread over the file, each a
/// multiple of `alignment`, with O_DIRECT when the file system allows it (else buffered after
/// dropping the file's cached pages).
///
/// # Errors
/// The I/O error of an open or read.
pub fn probe_file(path: &Path, len: u64, alignment: u64) -> std::io::Result<f64> {
    let direct = crate::io::open_read(path, true);
    let (file, direct) = match direct {
        Ok(f) => (f, true),
        Err(_) => (std::fs::File::open(path)?, false),
    };
    if !direct {
        super::drop_cache(&file);
    }
    let chunk = PROBE_READ_BYTES.min(len - len % alignment).max(alignment);
    let span = len.saturating_sub(chunk);
    let mut buf = crate::AlignedBuf::new(chunk as usize, alignment.max(4096) as usize);
    let t0 = Instant::now();
    let mut total = 0u64;
    for i in 0..PROBE_READS as u64 {
        let off = (span * i / PROBE_READS as u64) / alignment * alignment;
        let n = chunk.min(len - off) as usize;
        let n = n - n % alignment as usize;
        if n == 0 {
            continue;
        }
        let r = file.read_exact_at(&mut buf.as_mut_slice()[..n], off);
        match r {
            Ok(()) => total += n as u64,
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                // O_DIRECT refused at this alignment: measure buffered instead.
                drop(file);
                let f = std::fs::File::open(path)?;
                super::drop_cache(&f);
                return probe_buffered(&f, len, alignment, chunk);
            }
            Err(e) => return Err(e),
        }
    }
    let s = t0.elapsed().as_secs_f64().max(1e-6);
    Ok(total as f64 / s)
}

fn probe_buffered(f: &std::fs::File, len: u64, alignment: u64, chunk: u64) -> std::io::Result<f64> {
    let span = len.saturating_sub(chunk);
    let mut buf = vec![0u8; chunk as usize];
    let t0 = Instant::now();
    let mut total = 0u64;
    for i in 0..PROBE_READS as u64 {
        let off = (span * i / PROBE_READS as u64) / alignment * alignment;
        let n = chunk.min(len - off) as usize;
        f.read_exact_at(&mut buf[..n], off)?;
        total += n as u64;
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64().max(1e-6))
}

/// The default cache directory of measured weights: `$COLI_STATE_DIR`, else
/// `$XDG_STATE_HOME/coli`, else `$HOME/.local/state/coli`; `None` when none is set.
pub fn default_state_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("COLI_STATE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return Some(PathBuf::from(d).join("coli"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/coli"))
}

/// Name of the cache file inside the state directory.
pub const CACHE_FILE: &str = "disk-weights.json";

/// The cache key of a drive: store id, device number (`st_dev`) and the directory.
fn cache_key(store_id: &StoreId, dir: &Path) -> Option<String> {
    let md = std::fs::metadata(dir).ok()?;
    let canon = std::fs::canonicalize(dir).ok()?;
    Some(format!("{}:{:x}:{}", store_id, md.dev(), canon.display()))
}

/// Measured bandwidth (bytes/s) of every drive of `set`, primary first: each drive's largest
/// admitted file (the primary's largest segment) is probed with [`probe_file`]. With
/// `state_dir`, values are read from and written to `state_dir/disk-weights.json`, keyed by
/// store id, device and directory, so that later opens skip the probe; `remeasure` ignores
/// cached values. A drive without an admitted file gets the primary's bandwidth.
///
/// # Errors
/// [`StoreError::Io`] when a probe read fails on the primary (a failing mirror drive gets the
/// smallest measured bandwidth and a warning on stderr). Cache file problems are not errors
/// (the probe runs; a warning is printed when it cannot be written).
pub fn measure(
    primary: &PrimaryInfo,
    set: &MirrorSet,
    state_dir: Option<&Path>,
    remeasure: bool,
) -> Result<Vec<f64>, StoreError> {
    let cache_path = state_dir.map(|d| d.join(CACHE_FILE));
    let mut cache: BTreeMap<String, f64> = cache_path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut dirty = false;
    let mut out = Vec::with_capacity(set.drives as usize);
    let mut dirs = vec![primary.dir.clone()];
    dirs.extend(set.dirs.iter().cloned());
    for (d, dir) in dirs.iter().enumerate() {
        let key = cache_key(&primary.store_id, dir);
        if let (false, Some(k)) = (remeasure, &key) {
            if let Some(&v) = cache.get(k) {
                if v > 0.0 && v.is_finite() {
                    out.push(Some(v));
                    continue;
                }
            }
        }
        // The drive's largest admitted file.
        let target: Option<(PathBuf, u64)> = if d == 0 {
            primary
                .segments
                .iter()
                .max_by_key(|s| s.file_len)
                .map(|s| (segment_path(&primary.dir, s.id), s.file_len))
        } else {
            set.files
                .iter()
                .filter(|f| f.drive == d as u32 && f.status == MirrorStatus::Admitted)
                .max_by_key(|f| (f.len, matches!(f.kind, MirrorFileKind::Copy { .. })))
                .map(|f| (f.path(), f.len))
        };
        let Some((path, len)) = target else {
            out.push(None);
            continue;
        };
        match probe_file(&path, len, primary.alignment) {
            Ok(v) => {
                if let Some(k) = key {
                    cache.insert(k, v);
                    dirty = true;
                }
                out.push(Some(v));
            }
            Err(e) if d == 0 => return Err(io_err(&path, e)),
            Err(e) => {
                eprintln!(
                    "coli-store: warning: {}: bandwidth probe failed ({e}); giving this mirror the lowest weight",
                    path.display()
                );
                out.push(Some(0.0));
            }
        }
    }
    if dirty {
        if let (Some(p), Some(sd)) = (&cache_path, state_dir) {
            let tmp = p.with_extension("json.tmp");
            let r = std::fs::create_dir_all(sd)
                .and_then(|_| {
                    std::fs::write(
                        &tmp,
                        serde_json::to_vec_pretty(&cache).expect("map serializes"),
                    )
                })
                .and_then(|_| std::fs::rename(&tmp, p));
            if let Err(e) = r {
                eprintln!(
                    "coli-store: warning: cannot cache disk weights in {}: {e}",
                    p.display()
                );
            }
        }
    }
    let primary_bw = out[0].unwrap_or(1.0);
    let min_pos = out
        .iter()
        .flatten()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    Ok(out
        .into_iter()
        .map(|v| match v {
            None => primary_bw,
            Some(x) if x > 0.0 => x,
            Some(_) => {
                if min_pos.is_finite() {
                    min_pos
                } else {
                    primary_bw
                }
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_weights() {
        assert_eq!(parse_disk_weights("9,3").unwrap(), vec![9.0, 3.0]);
        assert_eq!(parse_disk_weights(" 1 , 0.5").unwrap(), vec![1.0, 0.5]);
        assert!(parse_disk_weights("9,x").unwrap_err().contains("weight 2"));
        assert!(parse_disk_weights("9,0").unwrap_err().contains("positive"));
        assert!(parse_disk_weights("inf").is_err());
    }
}
