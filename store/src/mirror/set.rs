//! Mirror-set admission: which files of which mirror directories may serve which records.

use super::io_err;
pub use super::primary::{PrimaryInfo, PrimarySegment};
use super::staged::{parse_staged, StagedIndex, StagedReject};
use super::status::MirrorStatus;
use crate::StoreError;
use crate::{StoreId, Xxh3Sum};
use coli_format::disk::names::{parse_staged_name, segment_rel, STAGED_DIR};
use coli_format::disk::segment::SegmentHeader;
use coli_format::disk::{FORMAT_VERSION, SEGMENT_HEADER_FIELDS, SEGMENT_MAGIC};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use zerocopy::FromBytes;

/// The kind of a mirror file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorFileKind {
    /// `segments/seg-NNNNN.bin`, a byte-identical copy of primary segment `segment`.
    Copy {
        /// Segment id.
        segment: u32,
    },
    /// `staged/stg-NNNNN.bin`, a staged segment.
    Staged,
}

/// One file of a mirror directory and its verdict.
#[derive(Clone, Debug)]
pub struct MirrorFileInfo {
    /// Drive id: 1 for the first mirror directory, 2 for the second, ... (0 is the primary).
    pub drive: u32,
    /// The mirror directory as given.
    pub dir: PathBuf,
    /// Path relative to the mirror directory.
    pub rel: String,
    /// Copy or staged.
    pub kind: MirrorFileKind,
    /// Admitted, missing (copies only), mismatched or damaged.
    pub status: MirrorStatus,
    /// Why, when not admitted.
    pub detail: Option<String>,
    /// File length in bytes (0 when missing).
    pub len: u64,
    /// The parsed index, for an admitted staged file.
    pub staged: Option<StagedIndex>,
}

impl MirrorFileInfo {
    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.rel)
    }
}

/// One copy of a record on a mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordCopy {
    /// Drive id (1.. for mirrors).
    pub drive: u32,
    /// Index into [`MirrorSet::files`].
    pub file: u32,
    /// Offset of the record in that file, bytes.
    pub offset: u64,
}

/// The admitted mirror files of a store and, for every record, the mirror copies that hold it.
#[derive(Clone, Debug)]
pub struct MirrorSet {
    /// Number of drives: 1 (the primary) + the mirror directories.
    pub drives: u32,
    /// The mirror directories, drive 1 first.
    pub dirs: Vec<PathBuf>,
    /// Every file looked at: a copy entry per primary segment and mirror (missing ones
    /// included) and every `staged/stg-NNNNN.bin`, in drive order.
    pub files: Vec<MirrorFileInfo>,
    /// For each position of the primary INDEX, the admitted mirror copies, in drive order, at
    /// most one per drive (a full copy before a staged one). The primary itself (drive 0)
    /// always holds every record and is not listed.
    pub copies: Vec<Vec<RecordCopy>>,
}

impl MirrorSet {
    /// The drives holding record `pos` of the primary INDEX: 0 (the primary) then the mirrors.
    pub fn holders(&self, pos: usize) -> Vec<u32> {
        std::iter::once(0)
            .chain(self.copies[pos].iter().map(|c| c.drive))
            .collect()
    }

    /// Files that are not admitted (missing copies included), each once.
    pub fn rejected(&self) -> impl Iterator<Item = &MirrorFileInfo> {
        self.files
            .iter()
            .filter(|f| f.status != MirrorStatus::Admitted)
    }

    /// Bytes of records held by each drive (index = drive id), counting each record once per
    /// drive.
    pub fn bytes_per_drive(&self, primary: &PrimaryInfo) -> Vec<u64> {
        let mut out = vec![0u64; self.drives as usize];
        out[0] = primary.index.iter().map(|r| r.length.get()).sum();
        for (pos, cs) in self.copies.iter().enumerate() {
            for c in cs {
                out[c.drive as usize] += primary.index[pos].length.get();
            }
        }
        out
    }
}

/// Checks the copy of primary segment `seg` in `dir`: (status, detail, file length).
pub(crate) fn check_copy(
    dir: &Path,
    seg: &PrimarySegment,
    primary: &PrimaryInfo,
) -> (MirrorStatus, Option<String>, u64) {
    let alignment = primary.alignment;
    let path = dir.join(segment_rel(seg.id));
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (MirrorStatus::Missing, Some("not present".into()), 0)
        }
        Err(e) => {
            return (
                MirrorStatus::Damaged,
                Some(format!("cannot be opened: {e}")),
                0,
            )
        }
    };
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return (MirrorStatus::Damaged, Some(format!("cannot stat: {e}")), 0),
    };
    if len < alignment {
        return (
            MirrorStatus::Damaged,
            Some(format!(
                "{len} bytes: no complete {alignment}-byte header (truncated)"
            )),
            len,
        );
    }
    let mut hb = vec![0u8; alignment as usize];
    if let Err(e) = file.read_exact_at(&mut hb, 0) {
        return (
            MirrorStatus::Damaged,
            Some(format!("header cannot be read: {e}")),
            len,
        );
    }
    let h = SegmentHeader::read_from_bytes(&hb[..SEGMENT_HEADER_FIELDS]).expect("64 bytes");
    if h.magic != SEGMENT_MAGIC
        || crc32fast::hash(&hb[..60]) != h.crc.get()
        || h.version.get() == 0
        || h.version.get() > FORMAT_VERSION
        || h.reserved
            .iter()
            .chain(&hb[SEGMENT_HEADER_FIELDS..])
            .any(|&b| b != 0)
    {
        return (
            MirrorStatus::Damaged,
            Some("header damaged (magic, crc32, version or reserved bytes)".into()),
            len,
        );
    }
    let mismatched = |what: String| (MirrorStatus::Mismatched, Some(what), len);
    if h.store_id != primary.store_id.0 {
        return mismatched(format!(
            "store id {} differs from the primary's {}",
            StoreId(h.store_id),
            primary.store_id
        ));
    }
    if h.segment.get() != seg.id {
        return mismatched(format!(
            "segment id {} differs from the primary's {}",
            h.segment.get(),
            seg.id
        ));
    }
    if h.file_len.get() != seg.file_len {
        return mismatched(format!(
            "header length {} differs from the primary's {}",
            h.file_len.get(),
            seg.file_len
        ));
    }
    if h.body_xxh3.get() != seg.body_xxh3 || h.crc.get() != seg.header_crc {
        return mismatched(format!(
            "body checksum {} differs from the primary's {}",
            Xxh3Sum(h.body_xxh3.get()),
            Xxh3Sum(seg.body_xxh3)
        ));
    }
    if len != seg.file_len {
        return (
            MirrorStatus::Damaged,
            Some(format!(
                "{len} bytes, header says {} (truncated or extended)",
                seg.file_len
            )),
            len,
        );
    }
    (MirrorStatus::Admitted, None, len)
}

/// Checks the staged segment `rel` in `dir`.
fn check_staged(
    dir: &Path,
    rel: &str,
    primary: &PrimaryInfo,
) -> (MirrorStatus, Option<String>, u64, Option<StagedIndex>) {
    let path = dir.join(rel);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            return (
                MirrorStatus::Damaged,
                Some(format!("cannot be opened: {e}")),
                0,
                None,
            )
        }
    };
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            return (
                MirrorStatus::Damaged,
                Some(format!("cannot stat: {e}")),
                0,
                None,
            )
        }
    };
    match parse_staged(&file, len, primary) {
        Ok(si) => (MirrorStatus::Admitted, None, len, Some(si)),
        Err(StagedReject::Damaged(d)) => (MirrorStatus::Damaged, Some(d), len, None),
        Err(StagedReject::Mismatched(d)) => (MirrorStatus::Mismatched, Some(d), len, None),
    }
}

/// Looks at every mirror directory: a copy of each primary segment
/// (`DIR/segments/seg-NNNNN.bin`, header against the primary's, length) and every staged
/// segment (`DIR/staged/stg-NNNNN.bin`, header, index and entries against the primary), and
/// lists, for every record of the primary INDEX, the admitted copies that hold it. Record bytes
/// are not read: per-record checksums check them at every read, `coli-fsck` reads them all.
/// Mirror directory `dirs[i]` is drive `i + 1`. Files are only read.
///
/// # Errors
/// [`StoreError::Io`] naming the directory when a mirror directory does not exist or is not a
/// directory (a usage error, unlike missing files inside it), or when `DIR/staged` cannot be
/// listed.
pub fn admit(primary: &PrimaryInfo, dirs: &[PathBuf]) -> Result<MirrorSet, StoreError> {
    let mut files = Vec::new();
    let mut copies: Vec<Vec<RecordCopy>> = vec![Vec::new(); primary.index.len()];
    // Records of each primary segment, by INDEX position.
    let mut by_seg: Vec<Vec<usize>> = vec![Vec::new(); primary.segments.len()];
    for (pos, r) in primary.index.iter().enumerate() {
        by_seg[r.segment.get() as usize].push(pos);
    }
    for (i, dir) in dirs.iter().enumerate() {
        let drive = i as u32 + 1;
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io_err(
                    dir,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "mirror is not a directory",
                    ),
                ))
            }
            Err(e) => return Err(io_err(dir, e)),
        }
        for seg in &primary.segments {
            let (status, detail, len) = check_copy(dir, seg, primary);
            let fi = files.len() as u32;
            if status == MirrorStatus::Admitted {
                for &pos in &by_seg[seg.id as usize] {
                    copies[pos].push(RecordCopy {
                        drive,
                        file: fi,
                        offset: primary.index[pos].offset.get(),
                    });
                }
            }
            files.push(MirrorFileInfo {
                drive,
                dir: dir.clone(),
                rel: segment_rel(seg.id),
                kind: MirrorFileKind::Copy { segment: seg.id },
                status,
                detail,
                len,
                staged: None,
            });
        }
        let sdir = dir.join(STAGED_DIR);
        let mut names: Vec<(u32, String)> = Vec::new();
        match std::fs::read_dir(&sdir) {
            Ok(rd) => {
                for ent in rd {
                    let ent = ent.map_err(|e| io_err(&sdir, e))?;
                    if let Some(name) = ent.file_name().to_str() {
                        if let Some(id) = parse_staged_name(name) {
                            names.push((id, name.to_string()));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&sdir, e)),
        }
        names.sort();
        for (_, name) in names {
            let rel = format!("{STAGED_DIR}/{name}");
            let (status, detail, len, staged) = check_staged(dir, &rel, primary);
            let fi = files.len() as u32;
            if let Some(si) = &staged {
                for (e, &pos) in si.entries.iter().zip(&si.primary_pos) {
                    if copies[pos].iter().all(|c| c.drive != drive) {
                        copies[pos].push(RecordCopy {
                            drive,
                            file: fi,
                            offset: e.offset.get(),
                        });
                    }
                }
            }
            files.push(MirrorFileInfo {
                drive,
                dir: dir.clone(),
                rel,
                kind: MirrorFileKind::Staged,
                status,
                detail,
                len,
                staged,
            });
        }
    }
    Ok(MirrorSet {
        drives: dirs.len() as u32 + 1,
        dirs: dirs.to_vec(),
        files,
        copies,
    })
}
