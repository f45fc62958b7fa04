//! The store's error type.

use std::path::PathBuf;

/// Every error the store reports. Each variant names the file, record or tensor concerned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error on a named file. The message includes the OS error (it is not also a
    /// `source()`: an error's context is added by wrapping once).
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// A structural problem (bad magic, bad field, out-of-bounds offset, ...:
    /// [`coli_format::FormatError::Format`]) or a store of a newer format version
    /// ([`coli_format::FormatError::NewerVersion`]), as the format crate's parsers report them.
    #[error(transparent)]
    Format(#[from] coli_format::FormatError),
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
    /// Open options that cannot work together or are out of range (refused before anything
    /// is read; the message names the options).
    #[error("{0}")]
    Options(String),
    /// Misuse of the writer (wrong order, writes after a failure, parameters differing on resume).
    #[error("{0}")]
    Writer(String),
}

/// Shorthand used throughout the crate.
#[allow(dead_code)]
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// A [`coli_format::FormatError::Format`] of `file`.
    pub fn format(file: impl Into<String>, what: impl Into<String>) -> StoreError {
        StoreError::Format(coli_format::FormatError::format(file, what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    /// Context is added by wrapping once: an error whose message shows its inner error does not
    /// also return it from `source()` (the CLI prints the chain as it is).
    #[test]
    fn no_error_both_shows_and_returns_its_source() {
        let errors = [
            StoreError::Io {
                path: "/s/INDEX".into(),
                error: std::io::Error::from_raw_os_error(21),
            },
            StoreError::format("MANIFEST", "bad"),
            coli_format::FormatError::format("INDEX", "short").into(),
        ];
        for e in errors {
            let shown = e.to_string();
            if let Some(s) = e.source() {
                assert!(!shown.contains(&s.to_string()), "{shown}");
            }
        }
        let e = StoreError::Io {
            path: "/s/INDEX".into(),
            error: std::io::Error::from_raw_os_error(21),
        };
        assert!(e.to_string().contains("os error 21") && e.source().is_none());
    }
}
