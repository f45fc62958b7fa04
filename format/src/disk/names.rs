//! File names inside a store directory and a mirror directory (docs/FORMAT.md sections 1, 4
//! and 13): the one place they are spelled.

use std::path::{Path, PathBuf};

/// The MANIFEST file (section 2).
pub const MANIFEST: &str = "MANIFEST";
/// The INDEX file (section 3).
pub const INDEX: &str = "INDEX";
/// The dense tensor file (section 7).
pub const DENSE: &str = "dense.bin";
/// The directory of segment files (section 4).
pub const SEGMENTS_DIR: &str = "segments";
/// The directory of files copied from the checkpoint (section 8).
pub const FILES_DIR: &str = "files";
/// The directory of staged segments inside a mirror directory (section 13).
pub const STAGED_DIR: &str = "staged";

/// File name of segment `id`: `seg-NNNNN.bin`.
pub fn segment_name(id: u32) -> String {
    format!("seg-{id:05}.bin")
}

/// Relative name of segment `id`: `segments/seg-NNNNN.bin`.
pub fn segment_rel(id: u32) -> String {
    format!("{SEGMENTS_DIR}/{}", segment_name(id))
}

/// Path of segment `id` in the store (or mirror) directory `dir`.
pub fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(SEGMENTS_DIR).join(segment_name(id))
}

/// The id of a segment file name (`seg-NNNNN.bin`), `None` for any other name.
pub fn parse_segment_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".bin")?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Relative name of staged segment `id`: `staged/stg-NNNNN.bin`.
pub fn staged_rel(id: u32) -> String {
    format!("{STAGED_DIR}/stg-{id:05}.bin")
}

/// The id of a staged segment file name (`stg-NNNNN.bin`), `None` for any other name.
pub fn parse_staged_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("stg-")?.strip_suffix(".bin")?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(segment_rel(3), "segments/seg-00003.bin");
        assert_eq!(
            segment_path(Path::new("/s"), 12),
            Path::new("/s/segments/seg-00012.bin")
        );
        assert_eq!(staged_rel(7), "staged/stg-00007.bin");
        assert_eq!(parse_segment_name("seg-00012.bin"), Some(12));
        assert_eq!(parse_segment_name("seg-12.bin"), None);
        assert_eq!(parse_staged_name("stg-00007.bin"), Some(7));
        assert_eq!(parse_staged_name("stg-7.bin"), None);
        assert_eq!(parse_staged_name("seg-00007.bin"), None);
    }
}
