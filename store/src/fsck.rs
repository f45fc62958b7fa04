//! Store verification (`coli-fsck`): structure, every record, dense tensor and copied file
//! checksum, completeness, and mirror copies of segment files.
//!
//! [`check`] returns a serializable [`FsckReport`]; its JSON form is documented in
//! `docs/FSCK.md`. Exit codes ([`FsckReport::exit_code`]):
//!
//! - **0** clean: the store and every mirror file is intact (mirror files may be missing);
//! - **1** damaged: anything failed a check — a structure (MANIFEST, INDEX, segment header,
//!   dense table, completeness) or a checksum (record, segment body, dense tensor, dense.bin,
//!   copied file) — or a mirror file is damaged or mismatched. The report names the file and
//!   the record/tensor/field;
//! - **2** unusable: there is no store to check (the path does not exist, is not a directory,
//!   has no MANIFEST or it cannot be read), the store has a newer format version than this
//!   code knows (a newer version whose header agrees with its intact body), or a `--mirror`
//!   path is not a directory.
//!
//! [`repair`] rewrites damaged records (in the primary or in any mirror copy) from a verified
//! good copy (`coli-fsck --repair`).

use crate::io::{open_read, read_aligned};
pub use crate::mirror::MirrorStatus;
use crate::mirror::{self, MirrorFileKind, MirrorSet, PrimaryInfo, StagedIndex};
use crate::Xxh3Sum;
use crate::{IndexRecord, OpenOptions, Store, StoreError};
use coli_format::disk::names::segment_rel;
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Structure only: no record, dense, segment body or file checksums.
    pub quick: bool,
    /// Mirror directories: copies of segment files (`DIR/segments/seg-NNNNN.bin`) and staged
    /// segments (`DIR/staged/stg-NNNNN.bin`). A path that is not a directory makes the
    /// check [`Status::Unusable`] (exit 2).
    pub mirrors: Vec<PathBuf>,
}

/// Progress callbacks (bytes checked); implementations must be thread-safe.
pub trait Progress: Sync {
    /// Called once with the number of bytes the check will read.
    fn set_total(&self, bytes: u64);
    /// Called as bytes are checked.
    fn advance(&self, bytes: u64);
}

/// A [`Progress`] that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn set_total(&self, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// Overall verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Everything checked is intact.
    Clean,
    /// Something failed a check.
    Damaged,
    /// No store could be opened (see the module docs).
    Unusable,
}

/// A structural or whole-file problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// File, relative to the store (or mirror) directory.
    pub file: String,
    /// What is wrong, with expected and found values.
    pub what: String,
}

/// An expert record that failed its checksum or could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BadRecord {
    /// Decoder layer.
    pub layer: u32,
    /// Expert within the layer.
    pub expert: u32,
    /// Segment file, relative (`segments/seg-00000.bin`).
    pub file: String,
    /// Offset of the record in the file, bytes.
    pub offset: u64,
    /// Record length, bytes.
    pub length: u64,
    /// xxh3 from INDEX, 16 hex digits.
    pub expected: String,
    /// xxh3 of the bytes read, 16 hex digits (empty when the read failed).
    pub found: String,
    /// Read error, when the record could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A dense tensor that failed its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BadDense {
    /// Tensor name.
    pub name: String,
    /// Offset of its weight section in dense.bin, bytes.
    pub offset: u64,
    /// xxh3 from MANIFEST.
    pub expected: String,
    /// xxh3 of the bytes.
    pub found: String,
}

/// A copied file that is missing, has the wrong size or fails its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BadFile {
    /// File name in `files/`.
    pub name: String,
    /// What is wrong.
    pub what: String,
}

/// One mirror file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MirrorFile {
    /// Path relative to the mirror directory (`segments/seg-00000.bin`,
    /// `staged/stg-00000.bin`).
    pub file: String,
    /// `copy` (a byte-identical copy of a primary segment) or `staged` (a staged segment).
    pub kind: &'static str,
    /// Records the file holds (0 when it is missing or its header/index is not admitted).
    pub records: u64,
    /// Verdict.
    pub status: MirrorStatus,
    /// Why, when not admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Records failing in this copy.
    pub bad_records: Vec<BadRecord>,
}

/// One mirror directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MirrorReport {
    /// The mirror directory as given.
    pub dir: String,
    /// One entry per segment of the primary store (its copy, possibly missing), then one per
    /// staged segment found in `DIR/staged/`.
    pub files: Vec<MirrorFile>,
}

/// The result of [`check`] (JSON schema: docs/FSCK.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FsckReport {
    /// The store directory as given.
    pub store: String,
    /// Verdict.
    pub status: Status,
    /// Process exit code for this verdict (0, 1 or 2).
    pub exit_code: i32,
    /// Whether this was a `--quick` (structure only) check.
    pub quick: bool,
    /// Store id, when the MANIFEST could be read.
    pub store_id: Option<String>,
    /// Format version of the store, when the MANIFEST could be read.
    pub format_version: Option<u32>,
    /// Structural and whole-file problems.
    pub problems: Vec<Problem>,
    /// Expert records whose checksum was checked.
    pub records_checked: u64,
    /// Records failing.
    pub bad_records: Vec<BadRecord>,
    /// Dense tensors checked.
    pub dense_checked: u64,
    /// Dense tensors failing.
    pub bad_dense: Vec<BadDense>,
    /// Copied files checked.
    pub files_checked: u64,
    /// Copied files failing.
    pub bad_files: Vec<BadFile>,
    /// Mirrors.
    pub mirrors: Vec<MirrorReport>,
    /// With `--repair`: the record copies rewritten (or not) before this check ran; absent
    /// from the JSON when no repair was attempted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<RepairAction>,
}

impl FsckReport {
    /// The structural problems as one line, `FILE: WHAT` joined by `; ` (empty when none): what
    /// a caller that cannot go on (an unusable or damaged store) says.
    pub fn problems_line(&self) -> String {
        self.problems
            .iter()
            .map(|p| format!("{}: {}", p.file, p.what))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn new(dir: &Path, quick: bool) -> FsckReport {
        FsckReport {
            store: dir.display().to_string(),
            status: Status::Clean,
            exit_code: 0,
            quick,
            store_id: None,
            format_version: None,
            problems: Vec::new(),
            records_checked: 0,
            bad_records: Vec::new(),
            dense_checked: 0,
            bad_dense: Vec::new(),
            files_checked: 0,
            bad_files: Vec::new(),
            mirrors: Vec::new(),
            repairs: Vec::new(),
        }
    }

    fn finish(mut self) -> FsckReport {
        self.settle();
        self
    }

    /// The verdict and exit code from what was found.
    fn settle(&mut self) {
        if self.status != Status::Unusable {
            let mirror_bad = self
                .mirrors
                .iter()
                .flat_map(|m| &m.files)
                .any(|f| matches!(f.status, MirrorStatus::Damaged | MirrorStatus::Mismatched));
            self.status = if self.problems.is_empty()
                && self.bad_records.is_empty()
                && self.bad_dense.is_empty()
                && self.bad_files.is_empty()
                && !mirror_bad
            {
                Status::Clean
            } else {
                Status::Damaged
            };
        }
        self.exit_code = match self.status {
            Status::Clean => 0,
            Status::Damaged => 1,
            Status::Unusable => 2,
        };
    }

    /// Adds a problem found outside the store's own checks (`coli-fsck`'s model check of the
    /// MANIFEST): a clean store becomes damaged.
    pub fn add_problem(&mut self, file: impl Into<String>, what: impl Into<String>) {
        self.problems.push(Problem {
            file: file.into(),
            what: what.into(),
        });
        self.settle();
    }

    /// The process exit code: 0 clean, 1 damaged or mismatched, 2 unusable input.
    pub fn exit_code(&self) -> i32 {
        self.exit_code
    }
}

fn problem_of(e: &StoreError) -> Problem {
    match e {
        StoreError::Format(
            coli_format::FormatError::Format { file, what }
            | coli_format::FormatError::Config { file, what },
        ) => Problem {
            file: file.clone(),
            what: what.clone(),
        },
        StoreError::Checksum { file, .. } => Problem {
            file: file.clone(),
            what: e.to_string(),
        },
        StoreError::Io {
            path,
            error: source,
        } => Problem {
            file: path.display().to_string(),
            what: source.to_string(),
        },
        StoreError::Format(coli_format::FormatError::NewerVersion { file, .. }) => Problem {
            file: file.clone(),
            what: e.to_string(),
        },
        other => Problem {
            file: String::new(),
            what: other.to_string(),
        },
    }
}

/// Checks the store in `dir` (and mirrors), reporting progress in bytes.
///
/// Never panics on corrupt input; never fails: problems, including an unopenable store, are
/// in the report.
pub fn check(dir: &Path, opts: &FsckOptions, progress: &dyn Progress) -> FsckReport {
    let mut rep = FsckReport::new(dir, opts.quick);
    if !dir.is_dir() || !dir.join("MANIFEST").is_file() {
        rep.status = Status::Unusable;
        rep.problems.push(Problem {
            file: dir.display().to_string(),
            what: if !dir.exists() {
                "does not exist".into()
            } else if !dir.is_dir() {
                "is not a directory".into()
            } else {
                format!(
                    "has no MANIFEST: not a coli store (`coli-convert` makes one; a conversion into this path that did not finish is in {}.partial)",
                    dir.display()
                )
            },
        });
        return rep.finish();
    }
    for m in &opts.mirrors {
        if !m.is_dir() {
            rep.status = Status::Unusable;
            rep.problems.push(Problem {
                file: m.display().to_string(),
                what: if m.exists() {
                    "mirror is not a directory".into()
                } else {
                    "mirror directory does not exist (check the --mirror path)".into()
                },
            });
        }
    }
    if rep.status == Status::Unusable {
        return rep.finish();
    }
    // The MANIFEST alone, for the id even when the rest fails.
    match std::fs::read(dir.join("MANIFEST")) {
        Ok(b) => {
            if let Ok(m) = crate::Manifest::parse(&b) {
                rep.store_id = Some(m.store_id.to_string());
                rep.format_version = Some(m.format_version);
            }
        }
        Err(e) => {
            rep.status = Status::Unusable;
            rep.problems.push(Problem {
                file: "MANIFEST".into(),
                what: format!("cannot be read: {e}"),
            });
            return rep.finish();
        }
    }
    let store = match Store::open_with(
        dir,
        &OpenOptions {
            verify_checksums: true,
            // O_DIRECT where possible: checking a store larger than RAM should not evict
            // everything else from the page cache.
            io: crate::IoPreference::Auto,
            fetch_threads: 1,
            ..OpenOptions::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            if matches!(
                e,
                StoreError::Format(coli_format::FormatError::NewerVersion { .. })
            ) {
                rep.status = Status::Unusable;
            }
            rep.problems.push(problem_of(&e));
            return rep.finish();
        }
    };
    let m = store.manifest();
    let seg_bytes: u64 = store.segments().iter().map(|s| s.len).sum();
    let file_bytes: u64 = m.files.iter().map(|f| f.size).sum();
    let mut sets = Vec::new();
    if !opts.mirrors.is_empty() {
        let primary = match PrimaryInfo::of(&store) {
            Ok(p) => p,
            Err(e) => {
                rep.problems.push(problem_of(&e));
                return rep.finish();
            }
        };
        for mdir in &opts.mirrors {
            match mirror::admit(&primary, std::slice::from_ref(mdir)) {
                Ok(set) => sets.push(set),
                Err(e) => {
                    rep.status = Status::Unusable;
                    rep.problems.push(problem_of(&e));
                    return rep.finish();
                }
            }
        }
    }
    if !opts.quick {
        let staged_bytes: u64 = sets
            .iter()
            .flat_map(|s| &s.files)
            .filter(|f| f.kind == MirrorFileKind::Staged)
            .map(|f| f.len)
            .sum();
        progress.set_total(
            seg_bytes * (1 + opts.mirrors.len() as u64)
                + staged_bytes
                + m.dense_file.length
                + file_bytes,
        );
    }
    // Records and segment bodies, one task per segment; dense and files alongside.
    let nseg = store.segments().len();
    let mut by_seg: Vec<Vec<&IndexRecord>> = vec![Vec::new(); nseg];
    for r in store.index() {
        by_seg[r.segment.get() as usize].push(r);
    }
    for v in &mut by_seg {
        v.sort_by_key(|r| r.offset.get());
    }
    use rayon::prelude::*;
    let ((seg_results, dense_result), file_result) = rayon::join(
        || {
            rayon::join(
                || {
                    if opts.quick {
                        return Vec::new();
                    }
                    (0..nseg)
                        .into_par_iter()
                        .map(|i| {
                            let s = &store.segments()[i];
                            scan_segment(
                                &s.file,
                                &s.rel,
                                s.len,
                                store.manifest().alignment,
                                store.buf_align(),
                                &by_seg[i],
                                s.header.body_xxh3.get(),
                                i as u32,
                                progress,
                            )
                        })
                        .collect::<Vec<_>>()
                },
                || check_dense(&store, opts.quick, progress),
            )
        },
        || check_files(&store, opts.quick, progress),
    );
    for (bad, probs, n) in seg_results {
        rep.records_checked += n;
        rep.bad_records.extend(bad);
        rep.problems.extend(probs);
    }
    let (dn, bad_dense, dprobs) = dense_result;
    rep.dense_checked = dn;
    rep.bad_dense = bad_dense;
    rep.problems.extend(dprobs);
    let (fnum, bad_files) = file_result;
    rep.files_checked = fnum;
    rep.bad_files = bad_files;
    rep.bad_records.sort_by_key(|b| (b.layer, b.expert));
    for (mdir, set) in opts.mirrors.iter().zip(&sets) {
        rep.mirrors.push(check_mirror(
            &store, mdir, set, &by_seg, opts.quick, progress,
        ));
    }
    rep.finish()
}

/// Reads one segment in offset order: checks each record's xxh3 and the body xxh3 of the
/// header. Returns (bad records, problems, records checked).
#[allow(clippy::too_many_arguments)]
fn scan_segment(
    file: &File,
    rel: &str,
    len: u64,
    alignment: u64,
    buf_align: usize,
    recs: &[&IndexRecord],
    body_expected: u64,
    seg_id: u32,
    progress: &dyn Progress,
) -> (Vec<BadRecord>, Vec<Problem>, u64) {
    let mut bad = Vec::new();
    let mut probs = Vec::new();
    let mut body = Xxh3::with_seed(seg_id as u64);
    let mut pos = alignment;
    let mut body_ok = true;
    let hash_range = |from: u64, to: u64, body: &mut Xxh3| -> Result<(), String> {
        let mut p = from;
        while p < to {
            let n = (to - p).min(8 << 20) as usize;
            let b = read_aligned(file, p, n, buf_align).map_err(|e| e.to_string())?;
            body.update(&b);
            progress.advance(n as u64);
            p += n as u64;
        }
        Ok(())
    };
    progress.advance(alignment);
    for r in recs {
        let (off, rlen) = (r.offset.get(), r.length.get());
        if off > pos {
            if let Err(e) = hash_range(pos, off, &mut body) {
                probs.push(Problem {
                    file: rel.into(),
                    what: format!("read error at {pos}: {e}"),
                });
                body_ok = false;
            }
        }
        let key = r.key();
        match read_aligned(file, off, rlen as usize, buf_align) {
            Ok(b) => {
                let found = crate::checksum::xxh3_64_with_seed(&b, key.checksum_seed());
                if found != r.checksum.get() {
                    bad.push(BadRecord {
                        layer: key.layer,
                        expert: key.expert,
                        file: rel.into(),
                        offset: off,
                        length: rlen,
                        expected: Xxh3Sum(r.checksum.get()).to_string(),
                        found: Xxh3Sum(found).to_string(),
                        error: None,
                    });
                }
                body.update(&b);
                progress.advance(rlen);
            }
            Err(e) => {
                body_ok = false;
                bad.push(BadRecord {
                    layer: key.layer,
                    expert: key.expert,
                    file: rel.into(),
                    offset: off,
                    length: rlen,
                    expected: Xxh3Sum(r.checksum.get()).to_string(),
                    found: String::new(),
                    error: Some(e.to_string()),
                });
            }
        }
        pos = off + rlen;
    }
    if pos < len {
        if let Err(e) = hash_range(pos, len, &mut body) {
            probs.push(Problem {
                file: rel.into(),
                what: format!("read error at {pos}: {e}"),
            });
            body_ok = false;
        }
    }
    if body_ok {
        let found = body.digest();
        if found != body_expected {
            probs.push(Problem {
                file: rel.into(),
                what: format!(
                    "body xxh3 mismatch: header says {}, bytes give {}",
                    Xxh3Sum(body_expected),
                    Xxh3Sum(found)
                ),
            });
        }
    }
    (bad, probs, recs.len() as u64)
}

fn check_dense(
    store: &Store,
    quick: bool,
    progress: &dyn Progress,
) -> (u64, Vec<BadDense>, Vec<Problem>) {
    if quick {
        return (0, Vec::new(), Vec::new());
    }
    use rayon::prelude::*;
    let m = store.manifest();
    let bad: Vec<BadDense> = m
        .dense
        .par_iter()
        .filter_map(|e| {
            let r = store.dense(&e.name);
            progress.advance(e.length + e.scales_length);
            match r {
                Err(StoreError::Checksum {
                    expected, found, ..
                }) => Some(BadDense {
                    name: e.name.clone(),
                    offset: e.offset,
                    expected: Xxh3Sum(expected).to_string(),
                    found: Xxh3Sum(found).to_string(),
                }),
                Err(other) => Some(BadDense {
                    name: e.name.clone(),
                    offset: e.offset,
                    expected: e.xxh3.to_string(),
                    found: other.to_string(),
                }),
                Ok(_) => None,
            }
        })
        .collect();
    let mut probs = Vec::new();
    let found = xxh3_64_with_seed(store.dense_bytes(), 0);
    let expected = m.dense_file.xxh3.0;
    let tensor_bytes: u64 = m.dense.iter().map(|e| e.length + e.scales_length).sum();
    progress.advance(m.dense_file.length.saturating_sub(tensor_bytes));
    if found != expected {
        probs.push(Problem {
            file: "dense.bin".into(),
            what: format!(
                "whole-file xxh3 mismatch: MANIFEST says {}, bytes give {}{}",
                Xxh3Sum(expected),
                Xxh3Sum(found),
                if bad.is_empty() {
                    " (every tensor verifies: the damage is in padding between sections)"
                } else {
                    ""
                }
            ),
        });
    }
    (m.dense.len() as u64, bad, probs)
}

fn check_files(store: &Store, quick: bool, progress: &dyn Progress) -> (u64, Vec<BadFile>) {
    let mut bad = Vec::new();
    for f in &store.manifest().files {
        let path = store.dir().join("files").join(&f.name);
        match std::fs::metadata(&path) {
            Err(e) => {
                bad.push(BadFile {
                    name: f.name.clone(),
                    what: format!("cannot be read: {e}"),
                });
                continue;
            }
            Ok(md) if md.len() != f.size => {
                bad.push(BadFile {
                    name: f.name.clone(),
                    what: format!("{} bytes, MANIFEST says {}", md.len(), f.size),
                });
                continue;
            }
            Ok(_) => {}
        }
        if quick {
            continue;
        }
        match store.file(&f.name) {
            Ok(_) => {}
            Err(e) => bad.push(BadFile {
                name: f.name.clone(),
                what: e.to_string(),
            }),
        }
        progress.advance(f.size);
    }
    (store.manifest().files.len() as u64, bad)
}

fn check_mirror(
    store: &Store,
    mdir: &Path,
    set: &MirrorSet,
    by_seg: &[Vec<&IndexRecord>],
    quick: bool,
    progress: &dyn Progress,
) -> MirrorReport {
    use rayon::prelude::*;
    let align = store.manifest().alignment;
    let files = set
        .files
        .par_iter()
        .map(|fi| {
            let mut out = MirrorFile {
                file: fi.rel.clone(),
                kind: match fi.kind {
                    MirrorFileKind::Copy { .. } => "copy",
                    MirrorFileKind::Staged => "staged",
                },
                records: 0,
                status: fi.status,
                detail: fi.detail.clone(),
                bad_records: Vec::new(),
            };
            let seg_len = |k: &MirrorFileKind| match k {
                MirrorFileKind::Copy { segment } => store.segments()[*segment as usize].len,
                MirrorFileKind::Staged => fi.len,
            };
            if fi.status != MirrorStatus::Admitted {
                progress.advance(seg_len(&fi.kind));
                return out;
            }
            let path = fi.path();
            let file = match open_read(&path, false) {
                Ok(f) => f,
                Err(e) => {
                    out.status = MirrorStatus::Damaged;
                    out.detail = Some(format!("cannot be opened: {e}"));
                    progress.advance(seg_len(&fi.kind));
                    return out;
                }
            };
            let (bad, probs) = match (&fi.kind, &fi.staged) {
                (MirrorFileKind::Copy { segment }, _) => {
                    let i = *segment as usize;
                    out.records = by_seg[i].len() as u64;
                    if quick {
                        return out;
                    }
                    let primary = &store.segments()[i];
                    let (bad, probs, _) = scan_segment(
                        &file,
                        &fi.rel,
                        fi.len,
                        align,
                        store.buf_align(),
                        &by_seg[i],
                        primary.header.body_xxh3.get(),
                        *segment,
                        progress,
                    );
                    (bad, probs)
                }
                (MirrorFileKind::Staged, Some(si)) => {
                    out.records = si.entries.len() as u64;
                    if quick {
                        return out;
                    }
                    (
                        scan_staged(&file, &fi.rel, si, store.buf_align(), progress),
                        Vec::new(),
                    )
                }
                (MirrorFileKind::Staged, None) => (Vec::new(), Vec::new()),
            };
            if !bad.is_empty() || !probs.is_empty() {
                let mut d: Vec<String> = bad
                    .iter()
                    .map(|b| format!("layer {} expert {} fails", b.layer, b.expert))
                    .collect();
                d.extend(probs.iter().map(|p| p.what.clone()));
                out.status = MirrorStatus::Damaged;
                out.detail = Some(d.join("; "));
                out.bad_records = bad;
            }
            out
        })
        .collect();
    MirrorReport {
        dir: mdir.display().to_string(),
        files,
    }
}

/// Reads every record of an admitted staged segment and checks it against its entry's
/// checksum (equal to the primary INDEX's, checked at admission).
fn scan_staged(
    file: &File,
    rel: &str,
    si: &StagedIndex,
    buf_align: usize,
    progress: &dyn Progress,
) -> Vec<BadRecord> {
    let mut bad = Vec::new();
    let first = si.entries.first().map(|e| e.offset.get()).unwrap_or(0);
    progress.advance(first);
    for e in &si.entries {
        let key = e.key();
        let (off, len) = (e.offset.get(), e.length.get());
        let mut b = BadRecord {
            layer: key.layer,
            expert: key.expert,
            file: rel.into(),
            offset: off,
            length: len,
            expected: Xxh3Sum(e.checksum.get()).to_string(),
            found: String::new(),
            error: None,
        };
        match read_aligned(file, off, len as usize, buf_align) {
            Ok(buf) => {
                let found = crate::checksum::xxh3_64_with_seed(&buf, key.checksum_seed());
                if found != e.checksum.get() {
                    b.found = Xxh3Sum(found).to_string();
                    bad.push(b);
                }
            }
            Err(err) => {
                b.error = Some(err.to_string());
                bad.push(b);
            }
        }
        progress.advance(len);
    }
    bad
}

/// One record copy that [`repair`] tried to rewrite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RepairAction {
    /// The directory of the damaged copy: the store, or a mirror directory as given.
    pub dir: String,
    /// File relative to `dir`.
    pub file: String,
    /// Decoder layer.
    pub layer: u32,
    /// Expert within the layer.
    pub expert: u32,
    /// Offset of the record in `file`, bytes.
    pub offset: u64,
    /// Record length, bytes.
    pub length: u64,
    /// The verified good copy the bytes came from (`DIR/FILE@OFFSET`), when one was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// True when the record was rewritten, fsynced, re-read and verified.
    pub repaired: bool,
    /// Why not, when not repaired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A place a record's bytes live.
struct Place {
    dir: PathBuf,
    file: String,
    offset: u64,
}

impl Place {
    fn path(&self) -> PathBuf {
        self.dir.join(&self.file)
    }
    fn name(&self) -> String {
        format!("{}@{}", self.path().display(), self.offset)
    }
}

/// Rewrites, in place, every damaged record copy listed in `report` (a [`check`] of `dir` with
/// `opts`): the primary's bad records and those of every mirror file. For each, the other
/// copies (the primary and the admitted mirror files holding the record) are read and the
/// first whose checksum verifies is written over the damaged bytes at the same offset; the file
/// is fsynced, its cached pages dropped, and the record re-read and verified. Files whose
/// header, length or index is damaged are not rewritten (re-copy them: `coli mirror copy`,
/// `coli mirror stage`). Run [`check`] again afterwards for the verdict.
///
/// Never panics; every failure is in the returned actions (`repaired: false`, `error`), except
/// an unopenable store, which gives no actions (the report already says so).
pub fn repair(dir: &Path, opts: &FsckOptions, report: &FsckReport) -> Vec<RepairAction> {
    let mut out = Vec::new();
    let Ok(store) = Store::open_with(
        dir,
        &OpenOptions {
            fetch_threads: 1,
            ..OpenOptions::default()
        },
    ) else {
        return out;
    };
    let Ok(primary) = PrimaryInfo::of(&store) else {
        return out;
    };
    let Ok(set) = mirror::admit(&primary, &opts.mirrors) else {
        return out;
    };
    // Every damaged copy: (key, place).
    let mut damaged: Vec<(crate::ExpertKey, u64, Place)> = Vec::new();
    for b in &report.bad_records {
        damaged.push((
            crate::ExpertKey::new(b.layer, b.expert),
            b.length,
            Place {
                dir: dir.to_path_buf(),
                file: b.file.clone(),
                offset: b.offset,
            },
        ));
    }
    for (mdir, mr) in opts.mirrors.iter().zip(&report.mirrors) {
        for f in &mr.files {
            for b in &f.bad_records {
                damaged.push((
                    crate::ExpertKey::new(b.layer, b.expert),
                    b.length,
                    Place {
                        dir: mdir.clone(),
                        file: b.file.clone(),
                        offset: b.offset,
                    },
                ));
            }
        }
    }
    for (key, length, place) in damaged {
        let mut act = RepairAction {
            dir: place.dir.display().to_string(),
            file: place.file.clone(),
            layer: key.layer,
            expert: key.expert,
            offset: place.offset,
            length,
            source: None,
            repaired: false,
            error: None,
        };
        let Ok(pos) = primary.index.binary_search_by_key(&key, |r| r.key()) else {
            act.error = Some("not in the primary INDEX".into());
            out.push(act);
            continue;
        };
        let rec = &primary.index[pos];
        let mut sources = vec![Place {
            dir: dir.to_path_buf(),
            file: segment_rel(rec.segment.get()),
            offset: rec.offset.get(),
        }];
        for c in &set.copies[pos] {
            let fi = &set.files[c.file as usize];
            sources.push(Place {
                dir: fi.dir.clone(),
                file: fi.rel.clone(),
                offset: c.offset,
            });
        }
        let good = sources
            .iter()
            .filter(|s| !(s.path() == place.path() && s.offset == place.offset))
            .find_map(|s| {
                let f = File::open(s.path()).ok()?;
                let b = read_aligned(&f, s.offset, length as usize, store.buf_align()).ok()?;
                let h = crate::checksum::xxh3_64_with_seed(&b, key.checksum_seed());
                (h == rec.checksum.get()).then(|| (s.name(), b))
            });
        let Some((src, bytes)) = good else {
            act.error = Some("no verified good copy of this record was found".into());
            out.push(act);
            continue;
        };
        act.source = Some(src);
        match rewrite(&place.path(), place.offset, &bytes, key, rec.checksum.get()) {
            Ok(()) => act.repaired = true,
            Err(e) => act.error = Some(e),
        }
        out.push(act);
    }
    out
}

/// Writes `bytes` at `offset` of `path`, fsyncs, drops the cached pages, re-reads and checks
/// the record's checksum.
fn rewrite(
    path: &Path,
    offset: u64,
    bytes: &[u8],
    key: crate::ExpertKey,
    expected: u64,
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {} for writing: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if offset + bytes.len() as u64 > len {
        return Err(format!(
            "{} is {len} bytes, the record ends at {}: not rewritten (re-copy the file)",
            path.display(),
            offset + bytes.len() as u64
        ));
    }
    f.write_all_at(bytes, offset)
        .map_err(|e| format!("write to {} failed: {e}", path.display()))?;
    f.sync_all()
        .map_err(|e| format!("fsync of {} failed: {e}", path.display()))?;
    mirror::drop_cache(&f);
    drop(f);
    let f = File::open(path).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; bytes.len()];
    f.read_exact_at(&mut back, offset)
        .map_err(|e| format!("re-read of {} failed: {e}", path.display()))?;
    let found = crate::checksum::xxh3_64_with_seed(&back, key.checksum_seed());
    if found != expected {
        return Err(format!(
            "re-read after the rewrite still fails: expected {}, found {}",
            Xxh3Sum(expected),
            Xxh3Sum(found)
        ));
    }
    Ok(())
}
