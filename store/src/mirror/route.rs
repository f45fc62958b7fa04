//! Routing expert reads over the primary and its mirrors: which drive serves a record, how a
//! large cold read is striped, and what happens when a copy fails (fallback, blame, rotation).

use super::assign::{assign, stripe_plan};
use super::set::MirrorSet;
use crate::io::{FileId, ReadPiece};
use crate::{AlignedBuf, IndexRecord};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Faults (read errors, short reads, checksum mismatches) after which a mirror drive leaves
/// the rotation for the rest of the process (the primary never leaves).
pub const MAX_FAULTS: u64 = 3;

/// Default size at or above which a single cold record read is striped over its holders,
/// bytes (colibri striped reads of 4 MiB and more).
pub const DEFAULT_STRIPE_THRESHOLD: u64 = 4 << 20;

/// Counters of one drive since open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriveStats {
    /// The directory (the store for drive 0).
    pub dir: PathBuf,
    /// Reads (whole records or stripe pieces) served.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Faults blamed on this drive (read errors, short reads, checksum mismatches).
    pub faults: u64,
    /// False once the drive left the rotation after [`MAX_FAULTS`] faults.
    pub in_rotation: bool,
}

/// Mirror read counters since open ([`crate::Store::mirror_stats`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorStats {
    /// One entry per drive: 0 the primary, then the mirrors in the order given.
    pub drives: Vec<DriveStats>,
    /// Weights in use, primary first.
    pub weights: Vec<f64>,
    /// Record reads split over several drives.
    pub striped_reads: u64,
    /// Records that were read again from another copy after a fault.
    pub fallbacks: u64,
    /// Copies that failed their checksum.
    pub checksum_failures: u64,
    /// Reads that failed (I/O error or short read).
    pub read_errors: u64,
}

/// Where one copy of a record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Source {
    pub(crate) drive: u32,
    pub(crate) file: FileId,
    pub(crate) offset: u64,
}

/// The routing table of an open store with mirrors.
pub(crate) struct Router {
    dirs: Vec<PathBuf>,
    weights: Vec<f64>,
    /// Per INDEX position: every copy, the primary's first.
    sources: Vec<Vec<Source>>,
    /// Per INDEX position: the drive it is assigned to with every drive in rotation.
    assigned: Vec<u32>,
    /// Engine file id -> own handle (same O_DIRECT choice) for recovery reads, and its path.
    files: Vec<(File, PathBuf)>,
    stripe_threshold: u64,
    stripe_align: u64,
    reads: Vec<AtomicU64>,
    bytes: Vec<AtomicU64>,
    faults: Vec<AtomicU64>,
    out: Vec<AtomicBool>,
    warned: Vec<AtomicBool>,
    striped: AtomicU64,
    fallbacks: AtomicU64,
    checksum_failures: AtomicU64,
    read_errors: AtomicU64,
}

impl Router {
    /// Builds the table. `index` is the primary INDEX; `mirror_file_ids[k]` the engine file id
    /// of `set.files[k]` when that file is admitted and open; `files` every engine file's own
    /// handle and path, by file id (primary segments first, file id = segment id).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        index: &[IndexRecord],
        set: &MirrorSet,
        mirror_file_ids: &[Option<FileId>],
        files: Vec<(File, PathBuf)>,
        primary_dir: PathBuf,
        weights: Vec<f64>,
        stripe_threshold: u64,
        stripe_align: u64,
    ) -> Router {
        let n = set.drives as usize;
        let mut dirs = vec![primary_dir];
        dirs.extend(set.dirs.iter().cloned());
        let mut sources = Vec::with_capacity(index.len());
        let mut assigned = Vec::with_capacity(index.len());
        for (pos, r) in index.iter().enumerate() {
            let mut s = vec![Source {
                drive: 0,
                file: r.segment.get(),
                offset: r.offset.get(),
            }];
            for c in &set.copies[pos] {
                if let Some(fid) = mirror_file_ids[c.file as usize] {
                    s.push(Source {
                        drive: c.drive,
                        file: fid,
                        offset: c.offset,
                    });
                }
            }
            let holders: Vec<u32> = s.iter().map(|x| x.drive).collect();
            assigned.push(assign(pos as u64, &holders, &weights).unwrap_or(0));
            sources.push(s);
        }
        let atomics = |v: u64| (0..n).map(|_| AtomicU64::new(v)).collect::<Vec<_>>();
        Router {
            dirs,
            weights,
            sources,
            assigned,
            files,
            stripe_threshold,
            stripe_align,
            reads: atomics(0),
            bytes: atomics(0),
            faults: atomics(0),
            out: (0..n).map(|_| AtomicBool::new(false)).collect(),
            warned: (0..n).map(|_| AtomicBool::new(false)).collect(),
            striped: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            checksum_failures: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
        }
    }

    fn in_rotation(&self, drive: u32) -> bool {
        drive == 0 || !self.out[drive as usize].load(Ordering::Relaxed)
    }

    /// The drive an unstriped read of record `pos` goes to now (0 = the primary).
    pub(crate) fn drive_of(&self, pos: usize) -> u32 {
        self.choose(pos).drive
    }

    /// The copy that serves an unstriped read of record `pos`: its assigned drive, or, when
    /// that drive left the rotation, the assignment among the holders still in rotation.
    pub(crate) fn choose(&self, pos: usize) -> Source {
        let s = &self.sources[pos];
        let a = self.assigned[pos];
        if self.in_rotation(a) {
            if let Some(x) = s.iter().find(|x| x.drive == a) {
                return *x;
            }
        }
        let holders: Vec<u32> = s
            .iter()
            .map(|x| x.drive)
            .filter(|&d| self.in_rotation(d))
            .collect();
        let d = assign(pos as u64, &holders, &self.weights).unwrap_or(0);
        *s.iter().find(|x| x.drive == d).unwrap_or(&s[0])
    }

    /// The pieces of a striped read of record `pos` (`len` bytes) when it is at or above the
    /// threshold and at least two holders are in rotation; each piece with its drive.
    pub(crate) fn stripe(&self, pos: usize, len: u64) -> Option<Vec<(u32, ReadPiece)>> {
        if len < self.stripe_threshold {
            return None;
        }
        let s = &self.sources[pos];
        let holders: Vec<u32> = s
            .iter()
            .map(|x| x.drive)
            .filter(|&d| self.in_rotation(d))
            .collect();
        if holders.len() < 2 {
            return None;
        }
        let plan = stripe_plan(len, self.stripe_align, &holders, &self.weights);
        if plan.len() < 2 {
            return None;
        }
        Some(
            plan.iter()
                .map(|p| {
                    let src = s.iter().find(|x| x.drive == p.drive).expect("a holder");
                    (
                        p.drive,
                        ReadPiece {
                            file: src.file,
                            file_offset: src.offset + p.offset,
                            buf_offset: p.offset as usize,
                            len: p.len as usize,
                        },
                    )
                })
                .collect(),
        )
    }

    /// Counts a successful read of `bytes` from `drive`.
    pub(crate) fn count_read(&self, drive: u32, bytes: u64) {
        self.reads[drive as usize].fetch_add(1, Ordering::Relaxed);
        self.bytes[drive as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a striped read.
    pub(crate) fn count_striped(&self) {
        self.striped.fetch_add(1, Ordering::Relaxed);
    }

    /// Blames `drive` for a fault: counted, one warning per drive, out of rotation after
    /// [`MAX_FAULTS`] (mirrors only).
    pub(crate) fn fault(&self, drive: u32, checksum: bool, what: &str) {
        let d = drive as usize;
        if checksum {
            self.checksum_failures.fetch_add(1, Ordering::Relaxed);
        } else {
            self.read_errors.fetch_add(1, Ordering::Relaxed);
        }
        let n = self.faults[d].fetch_add(1, Ordering::Relaxed) + 1;
        if !self.warned[d].swap(true, Ordering::Relaxed) {
            eprintln!(
                "coli-store: warning: {} ({}): {what}; reading another copy (further faults on this drive are counted, not shown)",
                self.dirs[d].display(),
                if d == 0 { "primary".to_string() } else { format!("mirror {d}") }
            );
        }
        if d != 0 && n >= MAX_FAULTS && !self.out[d].swap(true, Ordering::Relaxed) {
            eprintln!(
                "coli-store: warning: {} (mirror {d}): {n} faults; taken out of rotation",
                self.dirs[d].display()
            );
        }
    }

    /// Reads and verifies record `pos` (`len` bytes, checksum `expected` with `seed`) from
    /// each copy in `drives` separately; blames each copy that fails. Returns the first good
    /// buffer.
    pub(crate) fn verify_copies(
        &self,
        pos: usize,
        drives: &[u32],
        len: usize,
        align: usize,
        seed: u64,
        expected: u64,
    ) -> Option<(u32, AlignedBuf)> {
        let mut good = None;
        for &d in drives {
            let Some(src) = self.sources[pos].iter().find(|x| x.drive == d) else {
                continue;
            };
            match self.read_verified(src, len, align, seed, expected) {
                Ok(b) => {
                    self.count_read(d, len as u64);
                    if good.is_none() {
                        good = Some((d, b));
                    }
                }
                Err((checksum, what)) => self.fault(d, checksum, &what),
            }
        }
        good
    }

    /// After a fault on the copies in `tried`: reads record `pos` from the other holders in
    /// rotation (the primary first), verifying each; blames the ones that fail. Counts a
    /// fallback when one succeeds.
    pub(crate) fn fallback(
        &self,
        pos: usize,
        tried: &[u32],
        len: usize,
        align: usize,
        seed: u64,
        expected: u64,
    ) -> Option<(u32, AlignedBuf)> {
        for src in &self.sources[pos] {
            if tried.contains(&src.drive) || !self.in_rotation(src.drive) {
                continue;
            }
            match self.read_verified(src, len, align, seed, expected) {
                Ok(b) => {
                    self.count_read(src.drive, len as u64);
                    self.fallbacks.fetch_add(1, Ordering::Relaxed);
                    return Some((src.drive, b));
                }
                Err((checksum, what)) => self.fault(src.drive, checksum, &what),
            }
        }
        None
    }

    /// One synchronous verified read of a copy: `Err((is_checksum, what))` on failure.
    fn read_verified(
        &self,
        src: &Source,
        len: usize,
        align: usize,
        seed: u64,
        expected: u64,
    ) -> Result<AlignedBuf, (bool, String)> {
        let (f, path) = &self.files[src.file as usize];
        let mut buf = AlignedBuf::new(len, align);
        f.read_exact_at(buf.as_mut_slice(), src.offset)
            .map_err(|e| {
                (
                    false,
                    format!(
                        "{}: reading {len} bytes at {}: {e}",
                        path.display(),
                        src.offset
                    ),
                )
            })?;
        let found = crate::checksum::xxh3_64_with_seed(&buf, seed);
        if found != expected {
            return Err((
                true,
                format!(
                    "{}: record at {} fails its checksum (expected {expected:016x}, found {found:016x})",
                    path.display(),
                    src.offset
                ),
            ));
        }
        Ok(buf)
    }

    /// The path of engine file `file`.
    pub(crate) fn path(&self, file: FileId) -> &std::path::Path {
        &self.files[file as usize].1
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> MirrorStats {
        MirrorStats {
            drives: (0..self.dirs.len())
                .map(|d| DriveStats {
                    dir: self.dirs[d].clone(),
                    reads: self.reads[d].load(Ordering::Relaxed),
                    bytes: self.bytes[d].load(Ordering::Relaxed),
                    faults: self.faults[d].load(Ordering::Relaxed),
                    in_rotation: self.in_rotation(d as u32),
                })
                .collect(),
            weights: self.weights.clone(),
            striped_reads: self.striped.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            checksum_failures: self.checksum_failures.load(Ordering::Relaxed),
            read_errors: self.read_errors.load(Ordering::Relaxed),
        }
    }
}

/// Admits the mirrors of a store being opened and builds its [`Router`]: `headers` are the
/// primary's segment headers (validated at open), `direct` whether the primary is read with
/// O_DIRECT (each mirror drive is probed and falls back to buffered reads with a note),
/// `first_file` the engine file id of the first mirror file (after the primary's segments).
/// Returns the router and the admitted mirror files to append to the engine's file table, in
/// file id order. Rejected files are reported on stderr once each (missing copies as one line
/// per mirror); weights are `disk_weights` (primary first) or measured (cached in the state
/// directory, [`super::weights::measure`]).
///
/// # Errors
/// [`StoreError::Io`] when a mirror directory does not exist or is not a directory, or a file
/// cannot be opened; [`StoreError::Format`] (file `--disk-weights`) when the number of weights
/// is not 1 + the number of mirrors.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_mirrors(
    dir: &std::path::Path,
    store_id: crate::StoreId,
    alignment: u64,
    headers: &[coli_format::disk::segment::SegmentHeader],
    index: &[IndexRecord],
    direct: bool,
    buf_align: usize,
    mirrors: &[PathBuf],
    disk_weights: Option<&[f64]>,
    stripe_threshold: u64,
) -> Result<(Router, Vec<crate::io::EngineFile>), crate::StoreError> {
    use super::set::{admit, PrimaryInfo};
    use super::status::MirrorStatus;
    use crate::io::{open_read, probe_direct, EngineFile};
    let primary = PrimaryInfo::from_parts(dir, store_id, alignment, headers, index);
    let set = admit(&primary, mirrors)?;
    for (d, mdir) in set.dirs.iter().enumerate() {
        let drive = d as u32 + 1;
        let missing = set
            .files
            .iter()
            .filter(|f| f.drive == drive && f.status == MirrorStatus::Missing)
            .count();
        if missing > 0 {
            eprintln!(
                "coli-store: note: mirror {}: {missing} of {} segment copies missing (a partial mirror)",
                mdir.display(),
                primary.segments.len()
            );
        }
        for f in set.rejected().filter(|f| {
            f.drive == drive && matches!(f.status, MirrorStatus::Damaged | MirrorStatus::Mismatched)
        }) {
            eprintln!(
                "coli-store: warning: mirror {}: {}: {:?}: {}; left out (check with coli-fsck --mirror)",
                mdir.display(),
                f.rel,
                f.status,
                f.detail.as_deref().unwrap_or("")
            );
        }
    }
    let weights = match disk_weights {
        Some(w) if w.len() == set.drives as usize => w.to_vec(),
        Some(w) => {
            return Err(super::fmt_err(
                "--disk-weights",
                format!(
                    "{} weights given for {} drives (the store first, then each mirror in the order given)",
                    w.len(),
                    set.drives
                ),
            ))
        }
        None => super::weights::measure(
            &primary,
            &set,
            super::weights::default_state_dir().as_deref(),
            false,
        )?,
    };
    // Own handles of the primary segments for recovery reads.
    let mut handles = Vec::new();
    for id in 0..primary.segments.len() as u32 {
        let p = coli_format::disk::names::segment_path(dir, id);
        let f = open_read(&p, direct).map_err(|e| super::io_err(&p, e))?;
        handles.push((f, p));
    }
    let mut ids = vec![None; set.files.len()];
    let mut extra = Vec::new();
    let mut drive_direct: Vec<Option<bool>> = vec![None; set.drives as usize];
    for (k, f) in set.files.iter().enumerate() {
        if f.status != MirrorStatus::Admitted {
            continue;
        }
        let path = f.path();
        let dd = *drive_direct[f.drive as usize].get_or_insert_with(|| {
            direct
                && match probe_direct(&path, alignment as usize, f.len) {
                    Ok(a) if a <= buf_align => true,
                    Ok(a) => {
                        eprintln!(
                            "coli-store: note: mirror {}: direct I/O needs {a}-byte buffers; using buffered reads",
                            f.dir.display()
                        );
                        false
                    }
                    Err(why) => {
                        eprintln!(
                            "coli-store: note: mirror {}: direct I/O unavailable ({why}); using buffered reads",
                            f.dir.display()
                        );
                        false
                    }
                }
        });
        let file = open_read(&path, dd).map_err(|e| super::io_err(&path, e))?;
        let own = file.try_clone().map_err(|e| super::io_err(&path, e))?;
        ids[k] = Some(handles.len() as FileId);
        handles.push((own, path.clone()));
        extra.push(EngineFile { path, file });
    }
    let router = Router::new(
        index,
        &set,
        &ids,
        handles,
        dir.to_path_buf(),
        weights,
        stripe_threshold,
        alignment.max(buf_align as u64),
    );
    Ok((router, extra))
}
