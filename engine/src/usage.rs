//! The routing-usage history: per (layer, expert) token counts with exponential decay, kept
//! OUTSIDE the store (which stays read-only and fully checksummed) in a state directory, one
//! file per store id. The engine pins the hottest experts of it at start
//! ([`crate::ExpertCache::pin`]) and merges what it routed back into it at the end of each
//! generation and every [`SAVE_EVERY_TOKENS`] tokens.
//!
//! - Location: `$COLI_STATE_DIR`, else `$XDG_STATE_HOME/coli`, else `~/.local/state/coli`; the
//!   file is `usage-<store_id>.json` ([`default_usage_path`]); `--usage FILE` names another.
//! - Sharing: every read-merge-write holds an exclusive `flock` on `FILE.lock` (so `coli run`
//!   and `coli serve` on the same store can share it), and the file is replaced atomically
//!   (written to a temporary file in the same directory, fsynced, renamed).
//! - Decay: when `t` new tokens are merged, every stored count is multiplied by
//!   `0.5^(t / half_life_tokens)` before the new counts are added (the new tokens are treated
//!   as the most recent), so a count is a token count with a half-life of
//!   [`DEFAULT_HALF_LIFE_TOKENS`] tokens.
//! - A corrupt file or one of another store is reported as an error by [`UsageHistory::load`]
//!   and is never overwritten (it may be something else the user named by mistake, or another
//!   store's history): the engine turns the error into a warning, runs without a history and
//!   leaves the file unchanged.
//! - Only the default state directory is created when missing ([`default_usage_path`]); the
//!   directory of a file named with `--usage` must exist.
//!
//! File format (JSON): `{"version": 1, "store_id": "<32 hex>", "half_life_tokens": 8192.0,
//! "tokens": <decayed tokens merged>, "layers": [{"layer": L, "counts": [c_0, .., c_{E-1}]}]}`.

use coli_format::disk::StoreId;
use coli_format::ExpertKey;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Half-life of the usage counts, in tokens.
pub const DEFAULT_HALF_LIFE_TOKENS: f64 = 8192.0;

/// The engine merges its counts into the file at least every this many tokens processed.
pub const SAVE_EVERY_TOKENS: u64 = 1024;

/// Version of the usage file format.
pub const USAGE_FORMAT_VERSION: u32 = 1;

/// Errors reading or writing a usage file.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// An I/O error on `path`.
    #[error("usage history {path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error (in the message, not also a `source()`).
        error: std::io::Error,
    },
    /// The file is not a usage history of this format.
    #[error("usage history {path} is corrupt ({what})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file belongs to another store.
    #[error("usage history {path} is for store {found}, not {expected}")]
    OtherStore {
        /// The file.
        path: PathBuf,
        /// This store's id.
        expected: String,
        /// The id in the file.
        found: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> UsageError + '_ {
    move |source| UsageError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// The state directory: `$COLI_STATE_DIR`, else `$XDG_STATE_HOME/coli`, else
/// `$HOME/.local/state/coli`; None when none of these variables is set.
pub fn default_state_dir() -> Option<PathBuf> {
    let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty());
    if let Some(d) = var("COLI_STATE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = var("XDG_STATE_HOME") {
        return Some(PathBuf::from(d).join("coli"));
    }
    var("HOME").map(|h| PathBuf::from(h).join(".local/state/coli"))
}

/// `<state dir>/usage-<store_id>.json` (see [`default_state_dir`]). Creates the state
/// directory when it is missing (best effort: a failure shows up when the file is written).
pub fn default_usage_path(store_id: StoreId) -> Option<PathBuf> {
    default_state_dir().map(|d| {
        let _ = std::fs::create_dir_all(&d);
        d.join(format!("usage-{store_id}.json"))
    })
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LayerCounts {
    layer: u32,
    counts: Vec<f64>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct UsageFile {
    version: u32,
    store_id: StoreId,
    half_life_tokens: f64,
    tokens: f64,
    layers: Vec<LayerCounts>,
}

/// Decayed routing counts of one store.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageHistory {
    /// The store's id (MANIFEST `store_id`).
    pub store_id: StoreId,
    /// Half-life of the counts, tokens.
    pub half_life_tokens: f64,
    /// Tokens merged so far, decayed like the counts.
    pub tokens: f64,
    /// Decayed tokens routed to each expert.
    pub counts: HashMap<ExpertKey, f64>,
}

impl UsageHistory {
    /// An empty history of store `store_id` with the default half-life.
    pub fn new(store_id: StoreId) -> UsageHistory {
        UsageHistory {
            store_id,
            half_life_tokens: DEFAULT_HALF_LIFE_TOKENS,
            tokens: 0.0,
            counts: HashMap::new(),
        }
    }

    /// Reads `path`; `Ok(None)` when it does not exist.
    ///
    /// # Errors
    /// [`UsageError::Io`] when it cannot be read, [`UsageError::Corrupt`] when it is not a
    /// valid usage file (bad JSON, other version, negative or non-finite counts, a layer listed
    /// twice), [`UsageError::OtherStore`] when it belongs to another store.
    pub fn load(path: &Path, store_id: StoreId) -> Result<Option<UsageHistory>, UsageError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path)(e)),
        };
        let corrupt = |what: String| UsageError::Corrupt {
            path: path.to_path_buf(),
            what,
        };
        let f: UsageFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not valid JSON: {e}")))?;
        if f.version != USAGE_FORMAT_VERSION {
            return Err(corrupt(format!(
                "version {}, expected {USAGE_FORMAT_VERSION}",
                f.version
            )));
        }
        if f.store_id != store_id {
            return Err(UsageError::OtherStore {
                path: path.to_path_buf(),
                expected: store_id.to_string(),
                found: f.store_id.to_string(),
            });
        }
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(f.half_life_tokens) && f.half_life_tokens > 0.0 && ok(f.tokens)) {
            return Err(corrupt(format!(
                "half_life_tokens {} / tokens {} must be finite and positive",
                f.half_life_tokens, f.tokens
            )));
        }
        let mut counts = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for l in &f.layers {
            if !seen.insert(l.layer) {
                return Err(corrupt(format!("layer {} is listed twice", l.layer)));
            }
            for (e, &c) in l.counts.iter().enumerate() {
                if !ok(c) {
                    return Err(corrupt(format!(
                        "layer {} expert {e}: count {c} must be finite and >= 0",
                        l.layer
                    )));
                }
                if c > 0.0 {
                    counts.insert(ExpertKey::new(l.layer, e as u32), c);
                }
            }
        }
        Ok(Some(UsageHistory {
            store_id: f.store_id,
            half_life_tokens: f.half_life_tokens,
            tokens: f.tokens,
            counts,
        }))
    }

    /// Decays every count by `0.5^(tokens / half_life_tokens)`, then adds `routed` (tokens
    /// routed to each expert over those `tokens` tokens).
    pub fn merge(&mut self, routed: &HashMap<ExpertKey, u64>, tokens: u64) {
        let decay = 0.5f64.powf(tokens as f64 / self.half_life_tokens);
        for c in self.counts.values_mut() {
            *c *= decay;
        }
        for (k, &n) in routed {
            *self.counts.entry(*k).or_insert(0.0) += n as f64;
        }
        self.tokens = self.tokens * decay + tokens as f64;
    }

    /// Experts with a positive count, hottest first (ties: lower layer, then lower expert).
    pub fn hottest(&self) -> Vec<(ExpertKey, f64)> {
        let mut v: Vec<(ExpertKey, f64)> = self
            .counts
            .iter()
            .filter(|(_, &c)| c > 0.0)
            .map(|(&k, &c)| (k, c))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Writes the history to `path` atomically: a temporary file in the same directory (which
    /// must exist), fsynced, renamed over `path`.
    ///
    /// # Errors
    /// [`UsageError::Io`] naming the file or directory.
    pub fn write_atomic(&self, path: &Path) -> Result<(), UsageError> {
        let dir = parent_dir(path);
        let mut by_layer: std::collections::BTreeMap<u32, Vec<f64>> = Default::default();
        for (k, &c) in &self.counts {
            let v = by_layer.entry(k.layer).or_default();
            if v.len() <= k.expert as usize {
                v.resize(k.expert as usize + 1, 0.0);
            }
            v[k.expert as usize] = c;
        }
        let f = UsageFile {
            version: USAGE_FORMAT_VERSION,
            store_id: self.store_id,
            half_life_tokens: self.half_life_tokens,
            tokens: self.tokens,
            layers: by_layer
                .into_iter()
                .map(|(layer, counts)| LayerCounts { layer, counts })
                .collect(),
        };
        let json = serde_json::to_vec(&f).expect("usage file serializes");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "usage".into());
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(&json)?;
            file.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&tmp)(e));
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err(path)(e)
        })?;
        // The rename is durable once the directory is synced (best effort: some file systems
        // refuse to open a directory for syncing).
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Merges `routed` over `tokens` tokens into the file at `path` under its lock: the file
    /// is re-read (another process may have updated it), decayed and added to, and replaced
    /// atomically. Returns the merged history.
    ///
    /// # Errors
    /// [`UsageError::Io`] when the lock or the file cannot be written (a missing directory
    /// included); [`UsageError::Corrupt`] / [`UsageError::OtherStore`] when the file is not this
    /// store's usage history — it is then left unchanged.
    pub fn merge_into_file(
        path: &Path,
        store_id: StoreId,
        routed: &HashMap<ExpertKey, u64>,
        tokens: u64,
    ) -> Result<UsageHistory, UsageError> {
        let _lock = lock_exclusive(path)?;
        let mut h =
            UsageHistory::load(path, store_id)?.unwrap_or_else(|| UsageHistory::new(store_id));
        h.merge(routed, tokens);
        h.write_atomic(path)?;
        Ok(h)
    }

    /// Reads `path` under its lock (see [`UsageHistory::load`]).
    ///
    /// # Errors
    /// As [`UsageHistory::load`], plus [`UsageError::Io`] when the lock cannot be taken.
    pub fn load_locked(path: &Path, store_id: StoreId) -> Result<Option<UsageHistory>, UsageError> {
        if !path.exists() {
            return Ok(None);
        }
        let _lock = lock_exclusive(path)?;
        UsageHistory::load(path, store_id)
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The lock file of `path` (`<path>.lock`), locked exclusively until the returned file is
/// dropped (flock; released on close).
fn lock_exclusive(path: &Path) -> Result<std::fs::File, UsageError> {
    let mut name = path.as_os_str().to_os_string();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    flock_exclusive(&lock_path).map_err(io_err(&lock_path))
}

/// Opens (creating it) the lock file `lock_path` and locks it exclusively until the returned
/// file is dropped (flock; released on close). Shared by the state directory's files: the
/// usage history and the prefix cache's directory.
pub(crate) fn flock_exclusive(lock_path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path)?;
    fs4::fs_std::FileExt::lock_exclusive(&f)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: StoreId = StoreId([
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
        0xef,
    ]);

    #[test]
    fn merge_decays_and_ranks() {
        let mut h = UsageHistory::new(ID);
        h.half_life_tokens = 10.0;
        let k = |l, e| ExpertKey::new(l, e);
        h.merge(&HashMap::from([(k(0, 1), 8), (k(1, 0), 2)]), 10);
        assert_eq!(h.counts[&k(0, 1)], 8.0);
        // Ten more tokens: the old counts halve.
        h.merge(&HashMap::from([(k(1, 0), 6)]), 10);
        assert!((h.counts[&k(0, 1)] - 4.0).abs() < 1e-12);
        assert!((h.counts[&k(1, 0)] - 7.0).abs() < 1e-12);
        assert!((h.tokens - 15.0).abs() < 1e-12);
        let hot: Vec<ExpertKey> = h.hottest().into_iter().map(|x| x.0).collect();
        assert_eq!(hot, vec![k(1, 0), k(0, 1)]);
    }

    #[test]
    fn file_round_trip_lock_and_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state/usage.json");
        assert!(UsageHistory::load(&path, ID).unwrap().is_none());
        let routed = HashMap::from([(ExpertKey::new(2, 3), 5u64)]);
        // A missing directory is not created for a named file.
        let e = UsageHistory::merge_into_file(&path, ID, &routed, 5).unwrap_err();
        assert!(matches!(e, UsageError::Io { .. }), "{e}");
        assert!(!path.parent().unwrap().exists());
        std::fs::create_dir(path.parent().unwrap()).unwrap();
        let h = UsageHistory::merge_into_file(&path, ID, &routed, 5).unwrap();
        assert_eq!(UsageHistory::load_locked(&path, ID).unwrap().unwrap(), h);
        // A second merge adds to what is on disk.
        let h2 = UsageHistory::merge_into_file(&path, ID, &routed, 5).unwrap();
        assert!(h2.counts[&ExpertKey::new(2, 3)] > 9.99);
        // Another store's id: an error from load and from a merge, which leaves it unchanged.
        let other = StoreId([0xff; 16]);
        let e = UsageHistory::load(&path, other).unwrap_err();
        assert!(matches!(e, UsageError::OtherStore { .. }), "{e}");
        let before = std::fs::read(&path).unwrap();
        let e = UsageHistory::merge_into_file(&path, other, &routed, 5).unwrap_err();
        assert!(matches!(e, UsageError::OtherStore { .. }), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Corrupt (or foreign) files: clear errors, never a panic, never overwritten.
        for bad in [
            &b"{not json"[..],
            br#"{"version":9,"store_id":"x","half_life_tokens":1,"tokens":0,"layers":[]}"#,
            br#"{"version":1,"store_id":"0123456789abcdef0123456789abcdef","half_life_tokens":1,"tokens":0,"layers":[{"layer":0,"counts":[-1]}]}"#,
            br#"{"version":1,"store_id":"0123456789abcdef0123456789abcdef","half_life_tokens":1,"tokens":0,"layers":[{"layer":0,"counts":[1]},{"layer":0,"counts":[1]}]}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = UsageHistory::load(&path, ID).unwrap_err();
            assert!(e.to_string().contains("corrupt"), "{e}");
            let e = UsageHistory::merge_into_file(&path, ID, &routed, 5).unwrap_err();
            assert!(e.to_string().contains("corrupt"), "{e}");
            assert_eq!(std::fs::read(&path).unwrap(), bad);
        }
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(".tmp.")), "{names:?}");
    }

    #[test]
    fn concurrent_merges_lose_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("usage.json");
        let routed = HashMap::from([(ExpertKey::new(0, 0), 1u64)]);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5 {
                        UsageHistory::merge_into_file(&path, ID, &routed, 0).unwrap();
                    }
                });
            }
        });
        let h = UsageHistory::load(&path, ID).unwrap().unwrap();
        assert_eq!(h.counts[&ExpertKey::new(0, 0)], 20.0);
    }
}
