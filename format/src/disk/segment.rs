//! Segment file headers (docs/FORMAT.md section 4): the first `alignment` bytes of each
//! segment file, 64 bytes of fields then zeros; expert records follow.

use super::hex::StoreId;
use super::{SEGMENT_HEADER_FIELDS, SEGMENT_MAGIC};
use crate::FormatError;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Segment header fields; zero-padded to the alignment on disk.
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

impl SegmentHeader {
    /// The header of segment `segment` of store `store_id`, `file_len` bytes long, whose bytes
    /// after the header hash to `body_xxh3` (seed = segment id); with its crc32.
    pub fn new(
        version: u32,
        segment: u32,
        store_id: StoreId,
        file_len: u64,
        body_xxh3: u64,
    ) -> SegmentHeader {
        let mut h = SegmentHeader {
            magic: SEGMENT_MAGIC,
            version: U32::new(version),
            segment: U32::new(segment),
            store_id: store_id.0,
            file_len: U64::new(file_len),
            body_xxh3: U64::new(body_xxh3),
            reserved: [0; 12],
            crc: U32::new(0),
        };
        h.crc = U32::new(crc32fast::hash(&h.as_bytes()[..60]));
        h
    }

    /// Parses the first `alignment` bytes of segment file `rel` (`bytes`, at least 64 long)
    /// and checks them: magic, crc32, version, segment id `id`, store id, file length
    /// `actual_len`, zero padding.
    ///
    /// # Errors
    /// [`FormatError::Format`] naming `rel` and the field; [`FormatError::NewerVersion`].
    pub fn parse(
        rel: &str,
        bytes: &[u8],
        id: u32,
        store_id: StoreId,
        actual_len: u64,
    ) -> Result<SegmentHeader, FormatError> {
        let fmt_err = |what: String| FormatError::format(rel, what);
        super::check_header_64(rel, bytes, &SEGMENT_MAGIC, "COLISEG")?;
        let h = SegmentHeader::read_from_bytes(&bytes[..SEGMENT_HEADER_FIELDS]).expect("64 bytes");
        // check_header_64 refused a newer version.
        if h.version.get() == 0 {
            return Err(fmt_err("header version 0 invalid".into()));
        }
        if h.segment.get() != id {
            return Err(fmt_err(format!(
                "header segment id {}, expected {id}",
                h.segment.get()
            )));
        }
        if h.store_id != store_id.0 {
            return Err(fmt_err(format!(
                "header store id {} differs from MANIFEST's {store_id}",
                StoreId(h.store_id)
            )));
        }
        if h.file_len.get() != actual_len {
            return Err(fmt_err(format!(
                "header says {} bytes, file has {actual_len} (truncated or extended)",
                h.file_len.get()
            )));
        }
        if h.reserved.iter().any(|&b| b != 0) || bytes[64..].iter().any(|&b| b != 0) {
            return Err(fmt_err("header reserved bytes are not zero".into()));
        }
        Ok(h)
    }

    /// The store id, typed.
    pub fn store_id(&self) -> StoreId {
        StoreId(self.store_id)
    }
}
