//! The prefix cache: KV states of recent sequences kept by token prefix, so that a prompt that
//! extends a cached one (a follow-up turn, a shared system prompt, a regenerate) prefills only
//! its new tokens.
//!
//! - **RAM**: states within a byte budget (`--kv-cache-budget`), least recently used dropped
//!   first.
//! - **Disk** ([`disk`]): every state put in the cache is also written to a directory
//!   (default `<state dir>/kv`, `--kv-disk-budget`), where it survives a restart; the
//!   directory is indexed (headers only) when the cache opens and a file is read back when a
//!   prompt extends it. The file format ([`mod@file`]) is specified in docs/KV_CACHE.md.
//! - **Identity** ([`KvLayout`]): a state is reused only by an engine over the same store with
//!   the same parameters that change the numbers (kernel numerics, MLA decode form, KV
//!   dtype, cache-layout version); placement options do not split the cache.
//! - **Scope**: a state put for one scope (an API key, [`scope_of`]) is found only for it.
//!
//! A file that is truncated, damaged or foreign is reported once (see
//! [`PrefixCache::take_warnings`]), moved to `quarantine/` and not used (the prefix then comes
//! from another file or RAM, or is recomputed).

pub mod disk;
pub mod file;
mod layout;

pub use layout::{scope_of, session_scope, KvLayout, MtpLayout};

use crate::sequence::KvState;
use disk::DiskTier;
use file::KvFileHeader;
use std::path::PathBuf;

/// Where a state goes ([`PrefixCache::open`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixCacheOptions {
    /// Bytes of KV states kept in RAM (0: none).
    pub ram_budget: u64,
    /// The directory of the disk tier; None keeps the cache in RAM only (`--no-kv-disk`).
    pub disk_dir: Option<PathBuf>,
    /// Bytes of KV cache files the directory may hold, every store's together.
    pub disk_budget: u64,
}

/// Default `--kv-disk-budget`: 16 GiB.
pub const DEFAULT_DISK_BUDGET: u64 = 16 << 30;

/// `<state dir>/kv` ([`crate::usage::default_state_dir`]).
pub fn default_disk_dir() -> Option<PathBuf> {
    crate::usage::default_state_dir().map(|d| d.join("kv"))
}

/// Which tier a reused prefix came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Kept in RAM.
    Ram,
    /// Read back from a file.
    Disk,
}

/// A cached prefix found for a prompt ([`PrefixCache::take`]).
pub struct PrefixHit {
    /// The state, truncated to the reused positions.
    pub state: KvState,
    /// Where it came from.
    pub tier: Tier,
}

/// Counters of a [`PrefixCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups that reused a prefix from RAM.
    pub ram_hits: u64,
    /// Lookups that reused a prefix read from disk.
    pub disk_hits: u64,
    /// Lookups that found nothing to reuse.
    pub misses: u64,
    /// Prompt tokens whose prefill a hit saved.
    pub tokens_reused: u64,
    /// KV cache files written.
    pub files_written: u64,
    /// Bytes of KV cache files written.
    pub bytes_written: u64,
    /// Bytes of KV cache files read back.
    pub bytes_read: u64,
    /// Files that could not be used (damaged, foreign, unreadable).
    pub bad_files: u64,
    /// Nanoseconds spent writing files (fsync and rename included).
    pub write_ns: u64,
    /// Nanoseconds spent reading files back (checks included).
    pub read_ns: u64,
}

struct RamEntry {
    state: KvState,
    scope: u64,
    /// A file with exactly these tokens exists.
    on_disk: bool,
}

/// The prefix cache of one engine (see the module doc).
pub struct PrefixCache {
    layout: KvLayout,
    /// Oldest first.
    ram: Vec<RamEntry>,
    ram_budget: u64,
    disk: Option<DiskTier>,
    stats: PrefixCacheStats,
    warnings: Vec<String>,
}

impl PrefixCache {
    /// A cache for states of `layout` ([`crate::Engine::kv_layout`]); with a disk directory,
    /// creates it (mode 0700) and indexes its files.
    ///
    /// # Errors
    /// The directory cannot be created, listed or locked (the message names it).
    pub fn open(
        layout: KvLayout,
        opts: &PrefixCacheOptions,
    ) -> Result<PrefixCache, file::KvFileError> {
        let mut warnings = Vec::new();
        let disk = match &opts.disk_dir {
            Some(d) => Some(DiskTier::open(d, opts.disk_budget, &layout, &mut warnings)?),
            None => None,
        };
        let stats = PrefixCacheStats {
            bad_files: warnings.len() as u64,
            ..Default::default()
        };
        Ok(PrefixCache {
            layout,
            ram: Vec::new(),
            ram_budget: opts.ram_budget,
            disk,
            stats,
            warnings,
        })
    }

    /// The identity states must have.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The disk tier's directory, if any.
    pub fn disk_dir(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(|d| d.dir.as_path())
    }

    /// Files of this layout indexed on disk.
    pub fn disk_files(&self) -> usize {
        self.disk.as_ref().map_or(0, |d| d.entries.len())
    }

    /// Bytes of states held in RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.ram.iter().map(|e| e.state.bytes()).sum()
    }

    /// Counters so far.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Messages about files that could not be used or written, each reported once.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The state of the longest cached prefix of `prompt` in `scope`, reused up to `max_reuse`
    /// positions (callers pass `prompt.len() - 1`: one token is always fed, for its logits).
    /// A RAM state the prompt extends whole is taken out (it comes back with [`Self::put`]);
    /// one shared only in part is copied, unless a file holds it too. A disk state is read back
    /// and checked; a bad file is quarantined and the next candidate tried. None: nothing
    /// reusable (the prompt is prefilled from scratch).
    pub fn take(&mut self, scope: u64, prompt: &[u32], max_reuse: usize) -> Option<PrefixHit> {
        let common = |t: &[u32]| {
            t.iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
                .min(max_reuse)
        };
        // Candidates: (reusable positions, RAM first, most recent first). Disk entries are
        // named by path: the index shifts when a bad file is dropped.
        let mut cands: Vec<(usize, Tier, usize, Option<PathBuf>)> = Vec::new();
        for (i, e) in self.ram.iter().enumerate() {
            if e.scope == scope {
                cands.push((common(e.state.tokens()), Tier::Ram, i, None));
            }
        }
        if let Some(d) = &self.disk {
            for (i, e) in d.entries.iter().enumerate() {
                if e.scope == scope {
                    cands.push((common(&e.tokens), Tier::Disk, i, Some(e.path.clone())));
                }
            }
        }
        cands.retain(|c| c.0 > 0);
        // A RAM state whose layers dropped their older rows gives back only so short a
        // prefix, a recurrent one its nearest checkpoint (a disk file says so when read: its
        // nearest checkpoint, or `KvFileError::Unshortenable`).
        for c in cands.iter_mut().filter(|c| c.1 == Tier::Ram) {
            c.0 = self.ram[c.2].state.exact_at_most(c.0);
        }
        cands.retain(|c| c.0 > 0);
        cands.sort_by(|a, b| {
            b.0.cmp(&a.0)
                .then((a.1 == Tier::Disk).cmp(&(b.1 == Tier::Disk)))
                .then(b.2.cmp(&a.2))
        });
        // A disk file's length is known only once read (a recurrent file gives back its
        // nearest checkpoint): a shorter result is kept while a later candidate may still
        // give more, and the best is served.
        let mut best: Option<(KvState, Tier)> = None;
        for (n, tier, i, path) in cands {
            if best.as_ref().is_some_and(|(b, _)| b.len() >= n) {
                break;
            }
            let state = match (tier, path) {
                (Tier::Ram, _) => {
                    let e = &self.ram[i];
                    if n == e.state.len() || e.on_disk {
                        let mut e = self.ram.remove(i);
                        e.state.truncate(n);
                        e.state
                    } else {
                        let s = e.state.copy_prefix(n);
                        let e = self.ram.remove(i);
                        self.ram.push(e);
                        s
                    }
                }
                (Tier::Disk, path) => {
                    let d = self
                        .disk
                        .as_mut()
                        .expect("disk candidates come from the disk tier");
                    let Some(j) = d
                        .entries
                        .iter()
                        .position(|e| Some(&e.path) == path.as_ref())
                    else {
                        continue;
                    };
                    let bad_before = self.warnings.len();
                    let t0 = std::time::Instant::now();
                    let read = d.read(j, n, &self.layout, &mut self.warnings);
                    self.stats.read_ns += t0.elapsed().as_nanos() as u64;
                    match read {
                        // At most `n` positions: fewer where the file's recurrent layers are
                        // exact only at a checkpoint before `n`.
                        Some((h, s)) => {
                            self.stats.bytes_read +=
                                KvFileHeader::encoded_len(h.tokens.len()) as u64 + h.body_len;
                            s
                        }
                        None => {
                            self.stats.bad_files += (self.warnings.len() - bad_before) as u64;
                            continue;
                        }
                    }
                }
            };
            let done = state.len() == n;
            if best.as_ref().is_none_or(|(b, _)| state.len() > b.len()) {
                best = Some((state, tier));
            }
            if done {
                break;
            }
        }
        let Some((state, tier)) = best else {
            self.stats.misses += 1;
            return None;
        };
        match tier {
            Tier::Ram => self.stats.ram_hits += 1,
            Tier::Disk => self.stats.disk_hits += 1,
        }
        self.stats.tokens_reused += state.len() as u64;
        Some(PrefixHit { state, tier })
    }

    /// Puts `state` (a finished or evicted sequence) in the cache for `scope`: written to the
    /// disk tier unless a file holds exactly its tokens already, then kept in RAM as the most
    /// recently used state; states past the RAM budget are dropped, oldest first. A failed
    /// write is reported in the warnings (the state stays in RAM).
    pub fn put(&mut self, scope: u64, state: KvState) {
        if state.is_empty() {
            return;
        }
        let on_disk = self.save(scope, &state);
        // An older state of the same scope whose tokens this one extends is redundant, when
        // this one gives that prefix back exactly (a recurrent state may not).
        let tokens = state.tokens();
        self.ram.retain(|e| {
            !(e.scope == scope
                && tokens.starts_with(e.state.tokens())
                && state.exact_at_most(e.state.len()) == e.state.len())
        });
        if state.bytes() > self.ram_budget {
            // Larger than the whole RAM tier: it would only push the others out.
            return;
        }
        self.ram.push(RamEntry {
            state,
            scope,
            on_disk,
        });
        let mut total = self.ram_bytes();
        while total > self.ram_budget && !self.ram.is_empty() {
            total -= self.ram.remove(0).state.bytes();
        }
    }

    /// Writes `state` to the disk tier for `scope` (no RAM copy is kept): e.g. a chat session's
    /// conversation after each turn. Returns whether a file now holds it.
    pub fn save(&mut self, scope: u64, state: &KvState) -> bool {
        let Some(d) = self.disk.as_mut() else {
            return false;
        };
        if d.has(scope, state.tokens()) {
            return true;
        }
        let size = KvFileHeader::encoded_len(state.len()) as u64 + file::body_len(state);
        if size > d.budget {
            self.warnings.push(format!(
                "KV cache file not written: {size} bytes, more than --kv-disk-budget ({} bytes); the state stays in RAM only",
                d.budget
            ));
            return false;
        }
        let t0 = std::time::Instant::now();
        let written = d.write(&self.layout, scope, state);
        self.stats.write_ns += t0.elapsed().as_nanos() as u64;
        match written {
            Ok(0) => false,
            Ok(n) => {
                self.stats.files_written += 1;
                self.stats.bytes_written += n;
                true
            }
            Err(e) => {
                self.warnings.push(format!(
                    "KV cache file not written: {e}; the conversation stays in RAM only"
                ));
                false
            }
        }
    }
}
