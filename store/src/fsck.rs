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
//!   has no MANIFEST or it cannot be read), or the store has a newer format version than this
//!   code knows (a newer version whose header agrees with its intact body).

use crate::format::SEGMENT_MAGIC;
use crate::format::{SegmentHeader, FORMAT_VERSION};
use crate::io::{open_read, read_aligned};
use crate::writer::{hex128, hex64, parse_hex64, segment_rel};
use crate::{IndexRecord, OpenOptions, Store, StoreError};
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};
use zerocopy::FromBytes;

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Structure only: no record, dense, segment body or file checksums.
    pub quick: bool,
    /// Directories holding copies of segment files (`DIR/segments/seg-NNNNN.bin`).
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

/// Verdict on one mirror copy of a segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MirrorStatus {
    /// Header matches the primary's (store id, segment id, length, body checksum) and, unless
    /// `--quick`, every record verifies.
    Admitted,
    /// No such file in the mirror.
    Missing,
    /// An intact header that describes a different file (other store, segment, length or body).
    Mismatched,
    /// Header damaged, file length differs from its header, or records fail.
    Damaged,
}

/// One mirror file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MirrorFile {
    /// Path relative to the mirror directory (`segments/seg-00000.bin`).
    pub file: String,
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
    /// One entry per segment of the primary store.
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
}

impl FsckReport {
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
        }
    }

    fn finish(mut self) -> FsckReport {
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
        self
    }

    /// The process exit code: 0 clean, 1 damaged or mismatched, 2 unusable input.
    pub fn exit_code(&self) -> i32 {
        self.exit_code
    }
}

fn problem_of(e: &StoreError) -> Problem {
    match e {
        StoreError::Format { file, what } => Problem {
            file: file.clone(),
            what: what.clone(),
        },
        StoreError::Checksum { file, .. } => Problem {
            file: file.clone(),
            what: e.to_string(),
        },
        StoreError::Io { path, source } => Problem {
            file: path.display().to_string(),
            what: source.to_string(),
        },
        StoreError::NewerVersion { file, .. } => Problem {
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
                "has no MANIFEST: not a coli store (an unfinished conversion is in NAME.partial)"
                    .into()
            },
        });
        return rep.finish();
    }
    // The MANIFEST alone, for the id even when the rest fails.
    match std::fs::read(dir.join("MANIFEST")) {
        Ok(b) => {
            if let Ok(m) = crate::reader::parse_manifest(&b) {
                rep.store_id = Some(m.store_id.clone());
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
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            if matches!(e, StoreError::NewerVersion { .. }) {
                rep.status = Status::Unusable;
            }
            rep.problems.push(problem_of(&e));
            return rep.finish();
        }
    };
    let m = store.manifest();
    let seg_bytes: u64 = store.segments().iter().map(|s| s.len).sum();
    let file_bytes: u64 = m.files.iter().map(|f| f.size).sum();
    if !opts.quick {
        progress.set_total(
            seg_bytes * (1 + opts.mirrors.len() as u64) + m.dense_file.length + file_bytes,
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
    for mdir in &opts.mirrors {
        rep.mirrors
            .push(check_mirror(&store, mdir, &by_seg, opts.quick, progress));
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
                        expected: hex64(r.checksum.get()),
                        found: hex64(found),
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
                    expected: hex64(r.checksum.get()),
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
                    hex64(body_expected),
                    hex64(found)
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
                    expected: hex64(expected),
                    found: hex64(found),
                }),
                Err(other) => Some(BadDense {
                    name: e.name.clone(),
                    offset: e.offset,
                    expected: e.xxh3.clone(),
                    found: other.to_string(),
                }),
                Ok(_) => None,
            }
        })
        .collect();
    let mut probs = Vec::new();
    let found = xxh3_64_with_seed(store.dense_bytes(), 0);
    let expected = parse_hex64(&m.dense_file.xxh3).unwrap_or(0);
    let tensor_bytes: u64 = m.dense.iter().map(|e| e.length + e.scales_length).sum();
    progress.advance(m.dense_file.length.saturating_sub(tensor_bytes));
    if found != expected {
        probs.push(Problem {
            file: "dense.bin".into(),
            what: format!(
                "whole-file xxh3 mismatch: MANIFEST says {}, bytes give {}{}",
                hex64(expected),
                hex64(found),
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
    by_seg: &[Vec<&IndexRecord>],
    quick: bool,
    progress: &dyn Progress,
) -> MirrorReport {
    use rayon::prelude::*;
    let align = store.manifest().alignment;
    let files = store
        .segments()
        .par_iter()
        .enumerate()
        .map(|(i, primary)| {
            let rel = segment_rel(i as u32);
            let path = mdir.join(&rel);
            let mut out = MirrorFile {
                file: rel.clone(),
                status: MirrorStatus::Admitted,
                detail: None,
                bad_records: Vec::new(),
            };
            let mut set = |s: MirrorStatus, d: String| {
                out.status = s;
                out.detail = Some(d);
            };
            let file = match open_read(&path, false) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    set(MirrorStatus::Missing, "not present".into());
                    progress.advance(primary.len);
                    return out;
                }
                Err(e) => {
                    set(MirrorStatus::Damaged, format!("cannot be opened: {e}"));
                    progress.advance(primary.len);
                    return out;
                }
            };
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let hb = if len >= align {
                read_aligned(&file, 0, align as usize, store.buf_align()).ok()
            } else {
                None
            };
            let Some(hb) = hb else {
                set(
                    MirrorStatus::Damaged,
                    format!("{len} bytes: no readable {align}-byte header"),
                );
                progress.advance(primary.len);
                return out;
            };
            let h = SegmentHeader::read_from_bytes(&hb[..64]).expect("64 bytes");
            let crc = crc32fast::hash(&hb[..60]);
            if h.magic != SEGMENT_MAGIC
                || crc != h.crc.get()
                || h.version.get() != FORMAT_VERSION
                || h.reserved.iter().chain(&hb[64..]).any(|&b| b != 0)
            {
                set(
                    MirrorStatus::Damaged,
                    "header damaged (magic, crc32, version or reserved bytes)".into(),
                );
                progress.advance(primary.len);
                return out;
            }
            let p = &primary.header;
            if h.store_id != p.store_id {
                set(
                    MirrorStatus::Mismatched,
                    format!(
                        "store id {} differs from the primary's {}",
                        hex128(&h.store_id),
                        hex128(&p.store_id)
                    ),
                );
            } else if h.segment.get() != p.segment.get() {
                set(
                    MirrorStatus::Mismatched,
                    format!(
                        "segment id {} differs from the primary's {}",
                        h.segment.get(),
                        p.segment.get()
                    ),
                );
            } else if h.file_len.get() != p.file_len.get() {
                set(
                    MirrorStatus::Mismatched,
                    format!(
                        "header length {} differs from the primary's {}",
                        h.file_len.get(),
                        p.file_len.get()
                    ),
                );
            } else if h.body_xxh3.get() != p.body_xxh3.get() {
                set(
                    MirrorStatus::Mismatched,
                    format!(
                        "body checksum {} differs from the primary's {}",
                        hex64(h.body_xxh3.get()),
                        hex64(p.body_xxh3.get())
                    ),
                );
            } else if len != h.file_len.get() {
                set(
                    MirrorStatus::Damaged,
                    format!(
                        "{len} bytes, header says {} (truncated or extended)",
                        h.file_len.get()
                    ),
                );
            }
            if out.status != MirrorStatus::Admitted {
                progress.advance(primary.len);
                return out;
            }
            if !quick {
                let (bad, probs, _) = scan_segment(
                    &file,
                    &rel,
                    len,
                    align,
                    store.buf_align(),
                    &by_seg[i],
                    h.body_xxh3.get(),
                    i as u32,
                    progress,
                );
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
            }
            out
        })
        .collect();
    MirrorReport {
        dir: mdir.display().to_string(),
        files,
    }
}
