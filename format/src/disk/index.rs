//! INDEX (docs/FORMAT.md section 3): a 64-byte header and one 64-byte record per expert,
//! sorted by (layer, expert), each with its own crc32.

use super::manifest::Manifest;
use super::{names, FORMAT_VERSION, INDEX_MAGIC, INDEX_RECORD_SIZE};
use crate::{Encoding, ExpertKey, FormatError, RecordLayout};
use std::collections::HashMap;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// One INDEX record: where one expert's record lives and how to check it.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, PartialEq, Eq)]
#[repr(C)]
pub struct IndexRecord {
    /// Decoder layer.
    pub layer: U32,
    /// Expert within the layer.
    pub expert: U32,
    /// Segment file id.
    pub segment: U32,
    /// Encoding id (FORMAT.md section 6).
    pub encoding: U16,
    /// Group size field.
    pub group_size: U16,
    /// Offset of the record in its segment file, bytes (multiple of the alignment).
    pub offset: U64,
    /// Record length on disk, bytes (multiple of the alignment).
    pub length: U64,
    /// Bytes before the zero padding.
    pub payload_len: U64,
    /// Hidden size H.
    pub hidden: U32,
    /// Intermediate size I.
    pub intermediate: U32,
    /// xxh3 of the whole record, seeded with `(layer << 32) | expert`.
    pub checksum: U64,
    /// Record flags ([`RECORD_FLAG_BIASES`]); zero in format version 1.
    pub flags: U32,
    /// crc32 of bytes 0..60.
    pub crc: U32,
}

const _: () = assert!(std::mem::size_of::<IndexRecord>() == INDEX_RECORD_SIZE);

/// INDEX record flag bit 0 (format version 2): the record carries an f32 bias section after
/// each matrix (FORMAT.md section 5).
pub const RECORD_FLAG_BIASES: u32 = 1;

/// INDEX record flag bit 1 (format version 7): the record's matrices that have an interleaved
/// row order ([`crate::MatrixView::can_interleave`]: int4, int8 and mxfp4 with `cols` a
/// multiple of 64 and at least 16 rows) are stored in it ([`crate::MatrixView::interleave`],
/// weight and scale sections); its other matrices are row-major (FORMAT.md section 5).
pub const RECORD_FLAG_INTERLEAVED: u32 = 2;

/// INDEX record flag bits 8..24 (format version 4), for encoding id 7 (ggml block types) only:
/// bits 8..16 hold the ggml type id of the up matrix, bits 16..24 that of the down matrix (the
/// gate's is the group size field). Zero for every other encoding.
pub const RECORD_FLAG_GGML_TYPES: u32 = 0x00FF_FF00;

/// Where a record is and what it holds: the fields of an [`IndexRecord`] a writer chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPlace {
    /// The expert.
    pub key: ExpertKey,
    /// Segment file id.
    pub segment: u32,
    /// Encodings of the three matrices (gate, up, down): one encoding, or ggml block types
    /// that may differ per matrix.
    pub encodings: [Encoding; 3],
    /// Offset in the segment file, bytes.
    pub offset: u64,
    /// Record length on disk, bytes.
    pub length: u64,
    /// Bytes before the zero padding.
    pub payload_len: u64,
    /// Hidden size H.
    pub hidden: u32,
    /// Intermediate size I.
    pub intermediate: u32,
    /// Whether the record carries bias sections ([`RECORD_FLAG_BIASES`]).
    pub biases: bool,
    /// Whether the matrices that can be are stored interleaved ([`RECORD_FLAG_INTERLEAVED`]).
    pub interleaved: bool,
    /// xxh3 of the record's `length` bytes, seeded with [`ExpertKey::checksum_seed`].
    pub checksum: u64,
}

impl IndexRecord {
    /// The record for `p`, with its crc32.
    pub fn new(p: RecordPlace) -> IndexRecord {
        let mut r = IndexRecord {
            layer: U32::new(p.key.layer),
            expert: U32::new(p.key.expert),
            segment: U32::new(p.segment),
            encoding: U16::new(p.encodings[0].id()),
            group_size: U16::new(p.encodings[0].group_size()),
            offset: U64::new(p.offset),
            length: U64::new(p.length),
            payload_len: U64::new(p.payload_len),
            hidden: U32::new(p.hidden),
            intermediate: U32::new(p.intermediate),
            checksum: U64::new(p.checksum),
            flags: U32::new(
                if p.biases { RECORD_FLAG_BIASES } else { 0 }
                    | if p.interleaved {
                        RECORD_FLAG_INTERLEAVED
                    } else {
                        0
                    }
                    | ggml_type_flags(p.encodings),
            ),
            crc: U32::new(0),
        };
        r.crc = U32::new(r.compute_crc());
        r
    }

    /// The key of this record.
    pub fn key(&self) -> ExpertKey {
        ExpertKey::new(self.layer.get(), self.expert.get())
    }

    /// True when the record carries bias sections ([`RECORD_FLAG_BIASES`]).
    pub fn has_biases(&self) -> bool {
        self.flags.get() & RECORD_FLAG_BIASES != 0
    }

    /// True when the record's matrices that can be are stored in the interleaved row order
    /// ([`RECORD_FLAG_INTERLEAVED`]).
    pub fn is_interleaved(&self) -> bool {
        self.flags.get() & RECORD_FLAG_INTERLEAVED != 0
    }

    /// Which of gate, up and down are stored in the interleaved row order: none without
    /// [`RECORD_FLAG_INTERLEAVED`], else those that [`crate::MatrixView::can_interleave`].
    ///
    /// # Panics
    /// If the encoding fields are invalid (callers use entries [`parse_index`] accepted).
    pub fn interleaved_sections(&self) -> [bool; 3] {
        if !self.is_interleaved() {
            return [false; 3];
        }
        let encs = self
            .encodings()
            .expect("INDEX records are checked at parse");
        let dims = self.matrix_dims();
        std::array::from_fn(|m| crate::MatrixView::can_interleave(encs[m], dims[m].0, dims[m].1))
    }

    /// `(rows, cols)` of gate, up and down: `[I, H]`, `[I, H]`, `[H, I]` (FORMAT.md section 5).
    pub fn matrix_dims(&self) -> [(usize, usize); 3] {
        let (h, i) = (self.hidden.get() as usize, self.intermediate.get() as usize);
        [(i, h), (i, h), (h, i)]
    }

    /// The encodings of the record's gate, up and down matrices: the encoding fields' for all
    /// three, except that a ggml record (id 7) takes up's and down's types from the flags
    /// ([`RECORD_FLAG_GGML_TYPES`]).
    ///
    /// # Errors
    /// A message for an unknown encoding id or group size, a ggml type in the flags coli does
    /// not decode, or type bits on a record of another encoding.
    pub fn encodings(&self) -> Result<[Encoding; 3], String> {
        let enc = Encoding::from_id(self.encoding.get(), self.group_size.get()).map_err(|_| {
            format!(
                "unknown encoding id {} group size {}",
                self.encoding.get(),
                self.group_size.get()
            )
        })?;
        let bits = self.flags.get() & RECORD_FLAG_GGML_TYPES;
        if !matches!(enc, Encoding::Ggml(_)) {
            if bits != 0 {
                return Err(format!(
                    "flags {:#x} carry ggml types on a {} record",
                    self.flags.get(),
                    enc.name()
                ));
            }
            return Ok([enc; 3]);
        }
        let ty = |shift: u32, which: &str| {
            let id = (bits >> shift) & 0xFF;
            crate::encoding::GgmlType::from_id(id)
                .map(Encoding::Ggml)
                .ok_or_else(|| format!("{which} matrix: unknown ggml type {id} in the flags"))
        };
        Ok([enc, ty(8, "up")?, ty(16, "down")?])
    }

    /// The byte layout of the record this entry describes.
    ///
    /// # Panics
    /// If the encoding fields are invalid (callers use entries [`parse_index`] accepted).
    pub fn layout(&self) -> RecordLayout {
        let encs = self
            .encodings()
            .expect("INDEX records are checked at parse");
        RecordLayout::mixed(
            encs,
            self.hidden.get() as usize,
            self.intermediate.get() as usize,
            self.has_biases(),
        )
    }

    /// crc32 of the first 60 bytes, as stored in `crc`.
    pub fn compute_crc(&self) -> u32 {
        crc32fast::hash(&self.as_bytes()[..60])
    }
}

/// INDEX header.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IndexHeader {
    /// `COLIIDX\0`.
    pub magic: [u8; 8],
    /// Format version.
    pub version: U32,
    /// 64.
    pub record_size: U32,
    /// Number of records.
    pub count: U64,
    /// Zero.
    pub reserved: [u8; 36],
    /// crc32 of bytes 0..60.
    pub crc: U32,
}

const _: () = assert!(std::mem::size_of::<IndexHeader>() == 64);

/// The flag bits of a record's up and down ggml types ([`RECORD_FLAG_GGML_TYPES`]); 0 unless
/// the gate is a ggml type.
fn ggml_type_flags(e: [Encoding; 3]) -> u32 {
    match e {
        [Encoding::Ggml(_), Encoding::Ggml(up), Encoding::Ggml(down)] => {
            (up.id() & 0xFF) << 8 | (down.id() & 0xFF) << 16
        }
        _ => 0,
    }
}

/// The oldest format version that can hold `records`: 7 when one is interleaved, 2 when one
/// has biases, else the newest its encodings need (1 for int4 and int8). A writer stamps this version on every file of the store, so a
/// store that needs nothing new stays readable by version-1 readers (FORMAT.md section 12).
pub fn min_format_version(records: &[IndexRecord]) -> u32 {
    records
        .iter()
        .map(|r| {
            let enc = Encoding::from_id(r.encoding.get(), r.group_size.get())
                .map_or(FORMAT_VERSION, |e| e.min_format_version());
            // A ggml record's up and down types (flag bits 8..24) may need a later version
            // than its gate's.
            let enc = [8, 16].into_iter().fold(enc, |v, shift| {
                let id = (r.flags.get() & RECORD_FLAG_GGML_TYPES) >> shift & 0xFF;
                match crate::encoding::GgmlType::from_id(id) {
                    Some(t) if r.encoding.get() == 7 => v.max(t.min_format_version()),
                    _ => v,
                }
            });
            let v = if r.has_biases() { enc.max(2) } else { enc };
            if r.is_interleaved() {
                v.max(7)
            } else {
                v
            }
        })
        .max()
        .unwrap_or(1)
}

/// The INDEX file's bytes for `records` (sorted here by key) at format `version`: header, then
/// the records.
pub fn write_index(records: &[IndexRecord], version: u32) -> Vec<u8> {
    let mut recs = records.to_vec();
    recs.sort_by_key(|r| r.key());
    let mut header = IndexHeader {
        magic: INDEX_MAGIC,
        version: U32::new(version),
        record_size: U32::new(INDEX_RECORD_SIZE as u32),
        count: U64::new(recs.len() as u64),
        reserved: [0; 36],
        crc: U32::new(0),
    };
    header.crc = U32::new(crc32fast::hash(&header.as_bytes()[..60]));
    let mut out = Vec::with_capacity(INDEX_RECORD_SIZE * (recs.len() + 1));
    out.extend_from_slice(header.as_bytes());
    for r in &recs {
        out.extend_from_slice(r.as_bytes());
    }
    out
}

fn fmt_err(what: impl Into<String>) -> FormatError {
    FormatError::format(names::INDEX, what)
}

/// Parses and checks INDEX against the manifest: header (magic, crc32, version, record size,
/// reserved bytes, count vs file length and MANIFEST's `index_file.length`), then each record
/// (crc32, reserved, sorting, listed in `expert_layers`, encoding, segment id, shape, payload and
/// record lengths of the encoding's layout, aligned offset) and that records of one segment do
/// not overlap. Segment file lengths are checked by the store when it opens them; the
/// whole-file xxh3 likewise.
///
/// # Errors
/// [`FormatError::Format`] naming INDEX, the record and the field; [`FormatError::NewerVersion`].
pub fn parse_index(bytes: &[u8], m: &Manifest) -> Result<Vec<IndexRecord>, FormatError> {
    super::check_header_64(names::INDEX, bytes, &INDEX_MAGIC, "COLIIDX")?;
    let h = IndexHeader::read_from_bytes(&bytes[..64]).expect("64 bytes");
    if h.version.get() != m.format_version {
        return Err(fmt_err(format!(
            "version {} differs from MANIFEST's {}",
            h.version.get(),
            m.format_version
        )));
    }
    if h.record_size.get() as usize != INDEX_RECORD_SIZE {
        return Err(fmt_err(format!(
            "record size {}, expected {INDEX_RECORD_SIZE}",
            h.record_size.get()
        )));
    }
    if h.reserved.iter().any(|&b| b != 0) {
        return Err(fmt_err("header reserved bytes 24..60 are not zero"));
    }
    let count = h.count.get();
    let expect_len = count
        .checked_mul(64)
        .and_then(|x| x.checked_add(64))
        .unwrap_or(u64::MAX);
    if expect_len != bytes.len() as u64 {
        return Err(fmt_err(format!(
            "header says {count} records ({expect_len} bytes), file has {} bytes",
            bytes.len()
        )));
    }
    if bytes.len() as u64 != m.index_file.length {
        return Err(fmt_err(format!(
            "length {} differs from MANIFEST index_file.length {}",
            bytes.len(),
            m.index_file.length
        )));
    }
    let align = m.alignment;
    let mut recs = Vec::with_capacity(count as usize);
    let expected: HashMap<u32, u32> = m
        .expert_layers
        .iter()
        .map(|l| (l.layer, l.num_experts))
        .collect();
    for (i, chunk) in bytes[64..].chunks_exact(64).enumerate() {
        let r = IndexRecord::read_from_bytes(chunk).expect("64 bytes");
        let what = |s: String| fmt_err(format!("record {i} ({}): {s}", r.key()));
        let c = r.compute_crc();
        if c != r.crc.get() {
            return Err(what(format!(
                "crc32 mismatch: stored {:08x}, computed {c:08x}",
                r.crc.get()
            )));
        }
        if m.format_version < 2 && r.flags.get() != 0 {
            return Err(what(
                "flags field is not zero (a version 1 record has no flags)".into(),
            ));
        }
        if r.flags.get() & !(RECORD_FLAG_BIASES | RECORD_FLAG_INTERLEAVED | RECORD_FLAG_GGML_TYPES)
            != 0
        {
            return Err(what(format!("unknown flags {:#x}", r.flags.get())));
        }
        if m.format_version < 7 && r.is_interleaved() {
            return Err(what(format!(
                "flag bit 1 (interleaved sections) in a version {} store (version 7 on)",
                m.format_version
            )));
        }
        if let Some(prev) = recs.last().map(|p: &IndexRecord| p.key()) {
            if r.key() <= prev {
                return Err(what(format!(
                    "not sorted after {prev} (duplicate or out of order)"
                )));
            }
        }
        if expected
            .get(&r.layer.get())
            .is_none_or(|&n| r.expert.get() >= n)
        {
            return Err(what(
                "not an expert listed in MANIFEST expert_layers".into(),
            ));
        }
        let encs = r.encodings().map_err(&what)?;
        if r.is_interleaved() && r.interleaved_sections() == [false; 3] {
            return Err(what(
                "flag bit 1 (interleaved sections), but none of its matrices has that order".into(),
            ));
        }
        let enc = encs[0];
        if let Some(e) = encs
            .iter()
            .find(|e| e.min_format_version() > m.format_version)
        {
            return Err(what(format!(
                "encoding {} needs format version {}, the store is version {}",
                e.name(),
                e.min_format_version(),
                m.format_version
            )));
        }
        if enc.group_size() != r.group_size.get() {
            return Err(what(format!(
                "group size {} invalid for {}",
                r.group_size.get(),
                enc.name()
            )));
        }
        if r.segment.get() >= m.segment_count {
            return Err(what(format!(
                "segment {} out of range (segment_count {})",
                r.segment.get(),
                m.segment_count
            )));
        }
        let (h_, i_) = (r.hidden.get() as usize, r.intermediate.get() as usize);
        if h_ == 0 || i_ == 0 || h_ > (1 << 24) || i_ > (1 << 24) {
            return Err(what(format!(
                "hidden {h_} / intermediate {i_} out of range"
            )));
        }
        // gate and up have H columns, down has I.
        for (e, cols) in encs.iter().zip([h_, h_, i_]) {
            if !cols.is_multiple_of(e.col_multiple()) {
                return Err(what(format!(
                    "{cols} columns are not a multiple of {}'s block size {}",
                    e.name(),
                    e.col_multiple()
                )));
            }
        }
        let layout = RecordLayout::mixed(encs, h_, i_, r.has_biases());
        if layout.payload_len as u64 != r.payload_len.get() {
            return Err(what(format!(
                "payload length {} differs from the {} layout's {}",
                r.payload_len.get(),
                enc.name(),
                layout.payload_len
            )));
        }
        let rl = layout.record_len(align as usize) as u64;
        if r.length.get() != rl {
            return Err(what(format!(
                "length {} differs from the expected {rl} (payload rounded up to {align})",
                r.length.get()
            )));
        }
        if !r.offset.get().is_multiple_of(align) || r.offset.get() < align {
            return Err(what(format!(
                "offset {} is not a multiple of {align} after the segment header",
                r.offset.get()
            )));
        }
        if r.offset.get().checked_add(r.length.get()).is_none() {
            return Err(what("offset + length overflows".into()));
        }
        recs.push(r);
    }
    // Non-overlap per segment.
    let mut by_seg: Vec<&IndexRecord> = recs.iter().collect();
    by_seg.sort_by_key(|r| (r.segment.get(), r.offset.get()));
    for w in by_seg.windows(2) {
        if w[0].segment == w[1].segment && w[0].offset.get() + w[0].length.get() > w[1].offset.get()
        {
            return Err(fmt_err(format!(
                "records of {} and {} overlap in {}",
                w[0].key(),
                w[1].key(),
                names::segment_rel(w[0].segment.get())
            )));
        }
    }
    Ok(recs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::GgmlType;

    fn record(encodings: [Encoding; 3], biases: bool) -> IndexRecord {
        IndexRecord::new(RecordPlace {
            key: ExpertKey::new(0, 0),
            segment: 1,
            encodings,
            offset: 4096,
            length: 4096,
            payload_len: 4000,
            hidden: 256,
            intermediate: 256,
            biases,
            interleaved: false,
            checksum: 7,
        })
    }

    #[test]
    fn a_records_newest_matrix_type_sets_its_version() {
        let (q4k, iq) = (
            Encoding::Ggml(GgmlType::Q4_K),
            Encoding::Ggml(GgmlType::IQ2_XS),
        );
        assert_eq!(min_format_version(&[record([q4k; 3], false)]), 4);
        // An i-quant up or down behind a version-4 gate (the INDEX flags carry their types).
        assert_eq!(min_format_version(&[record([q4k, q4k, iq], false)]), 6);
        assert_eq!(min_format_version(&[record([q4k, iq, q4k], false)]), 6);
        assert_eq!(min_format_version(&[record([iq, q4k, q4k], false)]), 6);
        let int4 = Encoding::Int4 { group_size: 64 };
        assert_eq!(min_format_version(&[record([int4; 3], false)]), 1);
        assert_eq!(min_format_version(&[record([int4; 3], true)]), 2);
        assert_eq!(min_format_version(&[]), 1);
    }

    #[test]
    fn interleaved_records_need_version_7_and_name_their_sections() {
        let int4 = Encoding::Int4 { group_size: 64 };
        let mut p = RecordPlace {
            key: ExpertKey::new(0, 0),
            segment: 0,
            encodings: [int4; 3],
            offset: 4096,
            length: 8192,
            payload_len: 8000,
            hidden: 128,
            intermediate: 32,
            biases: false,
            interleaved: true,
            checksum: 7,
        };
        let r = IndexRecord::new(p);
        assert!(r.is_interleaved());
        assert_eq!(min_format_version(&[r]), 7);
        // down is [H, I] = [128, 32]: 32 columns have no interleaved order.
        assert_eq!(r.interleaved_sections(), [true, true, false]);
        p.interleaved = false;
        let r = IndexRecord::new(p);
        assert_eq!(r.interleaved_sections(), [false; 3]);
        assert_eq!(min_format_version(&[r]), 1);
        // A ggml record never has an interleaved section, flag or not.
        p.encodings = [Encoding::Ggml(GgmlType::Q4_K); 3];
        p.interleaved = true;
        assert_eq!(IndexRecord::new(p).interleaved_sections(), [false; 3]);
    }
}
