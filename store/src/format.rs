//! Fixed-size on-disk structures (docs/FORMAT.md sections 2-4), read with zerocopy.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Newest format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// MANIFEST magic.
pub const MANIFEST_MAGIC: [u8; 8] = *b"COLIMAN\0";
/// INDEX magic.
pub const INDEX_MAGIC: [u8; 8] = *b"COLIIDX\0";
/// Segment file magic.
pub const SEGMENT_MAGIC: [u8; 8] = *b"COLISEG\0";
/// Size of one INDEX record and of the INDEX header, bytes.
pub const INDEX_RECORD_SIZE: usize = 64;
/// Bytes of a segment header that carry fields (the rest of the first `alignment` bytes is zero).
pub const SEGMENT_HEADER_FIELDS: usize = 64;

/// One INDEX record (FORMAT.md section 3): where one expert's record lives and how to check it.
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
    /// Zero.
    pub reserved: U32,
    /// crc32 of bytes 0..60.
    pub crc: U32,
}

const _: () = assert!(std::mem::size_of::<IndexRecord>() == INDEX_RECORD_SIZE);

impl IndexRecord {
    /// The key of this record.
    pub fn key(&self) -> crate::ExpertKey {
        crate::ExpertKey::new(self.layer.get(), self.expert.get())
    }
    /// crc32 of the first 60 bytes, as stored in `crc`.
    pub fn compute_crc(&self) -> u32 {
        crc32fast::hash(&self.as_bytes()[..60])
    }
}

/// INDEX header (FORMAT.md section 3).
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

/// Segment header fields (FORMAT.md section 4); zero-padded to the alignment on disk.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SegmentHeader {
    /// `COLISEG\0`.
    pub magic: [u8; 8],
    /// Format version.
    pub version: U32,
    /// Segment id.
    pub segment: U32,
    /// Store id, raw.
    pub store_id: [u8; 16],
    /// Total file length, bytes.
    pub file_len: U64,
    /// xxh3 (seed = segment id) of all bytes after the header.
    pub body_xxh3: U64,
    /// Zero.
    pub reserved: [u8; 12],
    /// crc32 of bytes 0..60.
    pub crc: U32,
}

const _: () = assert!(std::mem::size_of::<SegmentHeader>() == SEGMENT_HEADER_FIELDS);
