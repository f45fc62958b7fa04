//! The verdict on one mirror file, shared by admission ([`super::set`]), reads
//! ([`super::route`]) and `coli-fsck`.

use serde::Serialize;

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
