//! What mirror admission knows of the primary store: its id, alignment, segment headers and
//! INDEX ([`PrimaryInfo`]; built by `PrimaryInfo::of` from an open store).

use crate::{IndexRecord, StoreId};
use coli_format::disk::segment::SegmentHeader;
use std::path::{Path, PathBuf};

/// The identity of one primary segment file, from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimarySegment {
    /// Segment id.
    pub id: u32,
    /// File length, bytes.
    pub file_len: u64,
    /// xxh3 (seed = segment id) of the bytes after the header.
    pub body_xxh3: u64,
    /// crc32 of the header's first 60 bytes.
    pub header_crc: u32,
}

/// What mirror admission needs to know of the primary store.
#[derive(Clone, Debug)]
pub struct PrimaryInfo {
    /// The primary store directory.
    pub dir: PathBuf,
    /// Store id, raw.
    pub store_id: StoreId,
    /// Record alignment, bytes.
    pub alignment: u64,
    /// Every segment, by id.
    pub segments: Vec<PrimarySegment>,
    /// The primary INDEX, sorted by (layer, expert).
    pub index: Vec<IndexRecord>,
}

impl PrimaryInfo {
    /// From the parts of a store being opened: segment headers as validated at open.
    pub(crate) fn from_parts(
        dir: &Path,
        store_id: StoreId,
        alignment: u64,
        headers: &[SegmentHeader],
        index: &[IndexRecord],
    ) -> PrimaryInfo {
        PrimaryInfo {
            dir: dir.to_path_buf(),
            store_id,
            alignment,
            segments: headers
                .iter()
                .enumerate()
                .map(|(id, h)| PrimarySegment {
                    id: id as u32,
                    file_len: h.file_len.get(),
                    body_xxh3: h.body_xxh3.get(),
                    header_crc: h.crc.get(),
                })
                .collect(),
            index: index.to_vec(),
        }
    }
}
