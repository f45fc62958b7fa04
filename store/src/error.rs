//! The store's error type.

use std::path::PathBuf;

/// Every error the store reports. Each variant names the file, record or tensor concerned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A structural problem: bad magic, bad field, out-of-bounds offset, ...
    #[error("{file}: {what}")]
    Format {
        /// The file (relative to the store directory when inside a store).
        file: String,
        /// What is wrong, with expected and found values.
        what: String,
    },
    /// The store was written by a newer format version than this reader knows.
    #[error("{file}: format version {found} is newer than the newest this reader knows ({known}); upgrade coli")]
    NewerVersion {
        /// The file.
        file: String,
        /// Version found on disk.
        found: u32,
        /// Newest version this code reads.
        known: u32,
    },
    /// The store does not hold every expected expert.
    #[error("incomplete store {dir}: missing experts in layers {layers:?}")]
    Incomplete {
        /// The store directory.
        dir: PathBuf,
        /// Layers with at least one missing expert.
        layers: Vec<u32>,
    },
    /// A record or tensor failed its checksum.
    #[error("checksum mismatch in {what} ({file} at offset {offset}): expected {expected:016x}, found {found:016x}")]
    Checksum {
        /// What failed, e.g. "layer 3 expert 7" or "dense tensor model.norm.weight".
        what: String,
        /// The file.
        file: String,
        /// Byte offset of the record or section in the file.
        offset: u64,
        /// Checksum in the index or manifest.
        expected: u64,
        /// Checksum of the bytes read.
        found: u64,
    },
    /// No such expert or tensor in this store.
    #[error("not in store: {0}")]
    NotFound(String),
    /// Misuse of the writer (wrong order, writes after a failure, parameters differing on resume).
    #[error("{0}")]
    Writer(String),
}

/// Shorthand used throughout the crate.
#[allow(dead_code)]
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl From<coli_format::FormatError> for StoreError {
    /// Format errors keep their file and message; a config error (which the store never
    /// parses) becomes a format error of its file.
    fn from(e: coli_format::FormatError) -> StoreError {
        use coli_format::FormatError as F;
        match e {
            F::Format { file, what } | F::Config { file, what } => {
                StoreError::Format { file, what }
            }
            F::NewerVersion { file, found, known } => {
                StoreError::NewerVersion { file, found, known }
            }
            F::Unsupported(what) => StoreError::Format {
                file: String::new(),
                what,
            },
        }
    }
}
