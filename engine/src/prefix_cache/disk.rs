//! The prefix cache's directory: KV cache files ([`super::file`]) named by store, parameters,
//! scope and tokens; indexed (headers only) when opened, read back when a prompt extends one;
//! kept within a byte budget, least recently used first; damaged or foreign files moved to
//! `quarantine/`. Changes to the directory (write, evict, quarantine) happen under an
//! exclusive lock on `<dir>/.lock`, so several coli processes may share one directory.

use super::file::{self, KvFileError, KvFileHeader};
use super::layout::KvLayout;
use crate::sequence::KvState;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use xxhash_rust::xxh3::Xxh3;

/// File name suffix of KV cache files.
pub const KV_FILE_SUFFIX: &str = ".kv";

/// Subdirectory that damaged and foreign files are moved to.
pub const QUARANTINE_DIR: &str = "quarantine";

/// Files kept in `quarantine/` at most (the oldest go first).
const QUARANTINE_KEEP: usize = 16;

/// One indexed file of this layout.
#[derive(Clone, Debug)]
pub(crate) struct DiskEntry {
    pub(crate) path: PathBuf,
    pub(crate) scope: u64,
    pub(crate) tokens: Vec<u32>,
}

/// The directory tier (see the module doc).
pub(crate) struct DiskTier {
    pub(crate) dir: PathBuf,
    pub(crate) budget: u64,
    pub(crate) entries: Vec<DiskEntry>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KvFileError + '_ {
    move |source| KvFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The lock of `dir` (`<dir>/.lock`), held until the returned file is dropped (flock,
/// released on close): every change to the directory's files is made under it.
///
/// # Errors
/// [`KvFileError::Io`] when the lock file cannot be opened or locked.
pub fn lock(dir: &Path) -> Result<File, KvFileError> {
    let path = dir.join(".lock");
    crate::usage::flock_exclusive(&path).map_err(io(&path))
}

/// The name of the file holding `tokens` for `scope` in `layout`:
/// `<store id>-<parameter hash>-<scope>-<XXH3-64 of the token ids>.kv`.
pub(crate) fn file_name(layout: &KvLayout, scope: u64, tokens: &[u32]) -> String {
    let mut h = Xxh3::new();
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!(
        "{}-{scope:016x}-{:016x}{KV_FILE_SUFFIX}",
        layout.file_prefix(),
        h.digest()
    )
}

/// Whether `name` is a KV cache file's name (`<32 hex>-<16 hex>-<16 hex>-<16 hex>.kv`, as
/// the writer names its files): other files in the directory are never touched.
pub fn is_kv_file_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(KV_FILE_SUFFIX) else {
        return false;
    };
    let parts: Vec<&str> = stem.split('-').collect();
    parts.len() == 4
        && parts
            .iter()
            .zip([32, 16, 16, 16])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Every KV cache file in `dir` (not the quarantine), with its size and modification time.
pub(crate) fn list_files(dir: &Path) -> Result<Vec<(PathBuf, u64, SystemTime)>, KvFileError> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(dir)(e)),
    };
    for e in rd {
        let e = e.map_err(io(dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_kv_file_name(&name) {
            continue;
        }
        let Ok(m) = e.metadata() else { continue };
        if m.is_file() {
            out.push((
                e.path(),
                m.len(),
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            ));
        }
    }
    Ok(out)
}

/// Moves `path` into `<dir>/quarantine/` (or removes it when that fails), keeping at most
/// [`QUARANTINE_KEEP`] files there. Returns where it went.
pub(crate) fn quarantine(dir: &Path, path: &Path) -> String {
    use std::os::unix::fs::DirBuilderExt;
    let q = dir.join(QUARANTINE_DIR);
    // A unique name (the same file may go bad more than once), still ending in `.kv`.
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(KV_FILE_SUFFIX).unwrap_or(&name);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let target = q.join(format!("{stem}.{nanos}{KV_FILE_SUFFIX}"));
    let moved = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&q)
        .is_ok()
        && std::fs::rename(path, &target).is_ok();
    if !moved {
        let _ = std::fs::remove_file(path);
        return "removed".into();
    }
    if let Ok(rd) = std::fs::read_dir(&q) {
        let mut files: Vec<(SystemTime, PathBuf)> = rd
            .flatten()
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        files.sort();
        let extra = files.len().saturating_sub(QUARANTINE_KEEP);
        for (_, p) in files.into_iter().take(extra) {
            let _ = std::fs::remove_file(p);
        }
    }
    format!("moved to {}", target.display())
}

/// Removes the temporary files of writers killed mid-write (`.<name>.tmp.<pid>`). Called under
/// the directory's lock: every write holds it, so no temporary seen then is being written.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let temporary = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(".tmp."))
            .is_some_and(|(kv, pid)| is_kv_file_name(kv) && pid.parse::<u32>().is_ok());
        if temporary {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl DiskTier {
    /// Opens (creating it, mode 0700) and indexes `dir`: the headers of this layout's files are
    /// read and checked; bad ones are quarantined and reported in `warnings`.
    ///
    /// # Errors
    /// The directory cannot be created or listed, or its lock taken.
    pub(crate) fn open(
        dir: &Path,
        budget: u64,
        layout: &KvLayout,
        warnings: &mut Vec<String>,
    ) -> Result<DiskTier, KvFileError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(dir))?;
        let _lock = lock(dir)?;
        remove_stale_temporaries(dir);
        let prefix = layout.file_prefix();
        let mut entries = Vec::new();
        for (path, _, _) in list_files(dir)? {
            let ours = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix));
            if !ours {
                continue;
            }
            match file::read_header(&path, Some(layout)) {
                Ok(h) => entries.push(DiskEntry {
                    path,
                    scope: h.scope,
                    tokens: h.tokens,
                }),
                Err(e) => report(dir, &path, &e, warnings),
            }
        }
        Ok(DiskTier {
            dir: dir.to_path_buf(),
            budget,
            entries,
        })
    }

    /// Reads entry `i` back keeping its first `keep` positions (every check of
    /// [`file::read_state`]) and marks it recently used. A bad file is quarantined, reported
    /// in `warnings` and dropped from the index.
    pub(crate) fn read(
        &mut self,
        i: usize,
        keep: usize,
        layout: &KvLayout,
        warnings: &mut Vec<String>,
    ) -> Option<(KvFileHeader, KvState)> {
        let path = self.entries[i].path.clone();
        match file::read_state_prefix(&path, layout, keep) {
            Ok((h, s))
                if h.scope == self.entries[i].scope && h.tokens == self.entries[i].tokens =>
            {
                let _ = File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                Some((h, s))
            }
            Ok(_) => {
                // Replaced by another process since it was indexed: index it again.
                self.entries.remove(i);
                if let Ok(h) = file::read_header(&path, Some(layout)) {
                    self.entries.push(DiskEntry {
                        path,
                        scope: h.scope,
                        tokens: h.tokens,
                    });
                }
                None
            }
            // Usable for its whole length or a longer match, not for this one.
            Err(KvFileError::Unshortenable { .. }) => None,
            Err(e) => {
                self.entries.remove(i);
                if !matches!(&e, KvFileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
                {
                    let _lock = lock(&self.dir);
                    report(&self.dir, &path, &e, warnings);
                }
                None
            }
        }
    }

    /// Whether a file for exactly `tokens` in `scope` is indexed.
    pub(crate) fn has(&self, scope: u64, tokens: &[u32]) -> bool {
        self.entries
            .iter()
            .any(|e| e.scope == scope && e.tokens == tokens)
    }

    /// Writes `state` for `scope` (atomically; [`file::write_atomic`]), drops files of the same
    /// scope whose tokens are a prefix of it (the new file serves them), then evicts the least
    /// recently used files of the directory until it fits the budget. Returns bytes written.
    ///
    /// # Errors
    /// [`KvFileError::Io`]; nothing already on disk is lost then.
    pub(crate) fn write(
        &mut self,
        layout: &KvLayout,
        scope: u64,
        state: &KvState,
    ) -> Result<u64, KvFileError> {
        let size = KvFileHeader::encoded_len(state.len()) as u64 + file::body_len(state);
        if size > self.budget {
            return Ok(0);
        }
        let path = self.dir.join(file_name(layout, scope, state.tokens()));
        let _lock = lock(&self.dir)?;
        // A temporary left by a killed writer of the same pid would make O_EXCL fail.
        remove_stale_temporaries(&self.dir);
        let n = file::write_atomic(&path, state, layout.store_id, layout.param_hash, scope)?;
        let tokens = state.tokens();
        let mut keep = Vec::with_capacity(self.entries.len() + 1);
        for e in self.entries.drain(..) {
            if e.path == path {
                continue;
            }
            if e.scope == scope && tokens.starts_with(&e.tokens) {
                let _ = std::fs::remove_file(&e.path);
                continue;
            }
            keep.push(e);
        }
        keep.push(DiskEntry {
            path: path.clone(),
            scope,
            tokens: tokens.to_vec(),
        });
        self.entries = keep;
        self.evict(&path);
        Ok(n)
    }

    /// Removes the least recently used files (any store's: the budget is the directory's) until
    /// the directory fits the budget; never `keep`, never a newer coli's file.
    fn evict(&mut self, keep: &Path) {
        let Ok(mut files) = list_files(&self.dir) else {
            return;
        };
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort_by_key(|f| f.2);
        for (path, len, _) in files {
            if total <= self.budget {
                break;
            }
            if path == keep {
                continue;
            }
            if let Err(KvFileError::Newer { .. }) = file::read_header(&path, None) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                self.entries.retain(|e| e.path != path);
            }
        }
    }
}

/// Reports a bad file once (`warnings`) and moves it out of the way when it is damaged or
/// foreign; a newer version's file and I/O failures leave it in place.
fn report(dir: &Path, path: &Path, e: &KvFileError, warnings: &mut Vec<String>) {
    if e.quarantine() {
        let went = quarantine(dir, path);
        warnings.push(format!("KV cache file not used: {e}; {went}"));
    } else {
        warnings.push(format!("KV cache file not used: {e}"));
    }
}
