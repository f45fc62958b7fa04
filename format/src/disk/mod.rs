//! The store's on-disk structures (docs/FORMAT.md), each in one module that both parses and
//! writes it: [`manifest`] (MANIFEST, section 2), [`index`] (INDEX, section 3), [`segment`]
//! (segment headers, section 4), [`staged`] (staged mirror segments, section 13) and [`names`]
//! (every file name). Checksums and the store id are typed values ([`Xxh3Sum`], [`StoreId`]):
//! parsed once from their hex form, compared as integers.
//!
//! All integers on disk are little-endian. Parsers check every field they read and name the
//! file and field in their errors ([`crate::FormatError`]); reading files is the store's job.

pub mod hex;
pub mod index;
pub mod manifest;
pub mod names;
pub mod segment;
pub mod staged;

pub use hex::{StoreId, Xxh3Sum};

/// Newest format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 7;
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

/// Checks what the 64-byte headers of INDEX and the segment files share (FORMAT.md sections 3
/// and 4): at least 64 bytes, `magic` in bytes 0..8 (`label` names it in the message), the
/// crc32 of bytes 0..60 stored at 60..64, and a format version (u32 at 8..12) no newer than
/// [`FORMAT_VERSION`]. Returns the version. `file` names the file in errors.
///
/// # Errors
/// [`crate::FormatError::Format`] for a short header, a wrong magic or crc32;
/// [`crate::FormatError::NewerVersion`].
pub(crate) fn check_header_64(
    file: &str,
    bytes: &[u8],
    magic: &[u8; 8],
    label: &str,
) -> Result<u32, crate::FormatError> {
    use crate::FormatError;
    if bytes.len() < 64 {
        return Err(FormatError::format(
            file,
            format!("{} bytes, shorter than the 64-byte header", bytes.len()),
        ));
    }
    let le32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if &bytes[..8] != magic {
        return Err(FormatError::format(
            file,
            format!(
                "magic {:02x?}, expected {magic:02x?} ({label})",
                &bytes[..8]
            ),
        ));
    }
    let (stored, computed) = (le32(60), crc32fast::hash(&bytes[..60]));
    if stored != computed {
        return Err(FormatError::format(
            file,
            format!("header crc32 mismatch: stored {stored:08x}, computed {computed:08x}"),
        ));
    }
    let version = le32(8);
    if version > FORMAT_VERSION {
        return Err(FormatError::NewerVersion {
            file: file.into(),
            found: version,
            known: FORMAT_VERSION,
        });
    }
    Ok(version)
}
