//! The converter's error type. Every variant names the file, tensor or field concerned.

use std::path::PathBuf;

/// Everything `coli-convert` can refuse or fail on.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// An I/O error on a named file.
    #[error("{path}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error (in the message, not also a `source()`).
        error: std::io::Error,
    },
    /// A malformed safetensors file (header, offsets, dtype, LFS pointer, ...).
    #[error("{file}: {what}")]
    Safetensors {
        /// The shard.
        file: PathBuf,
        /// What is wrong, with expected and found values.
        what: String,
    },
    /// A malformed GGUF file (header, metadata, tensor infos, split files).
    #[error("{file}: {what}")]
    Gguf {
        /// The GGUF file.
        file: PathBuf,
        /// What is wrong, naming the key or tensor.
        what: String,
    },
    /// A missing or malformed field in config.json or the index, or an unsupported model.
    #[error("{file}: {what}")]
    Config {
        /// `config.json` or `model.safetensors.index.json` (full path).
        file: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A tensor the architecture needs is missing, or a tensor is inconsistent / unsupported.
    #[error("{tensor}: {what}")]
    Tensor {
        /// Tensor name as in the checkpoint.
        tensor: String,
        /// What is wrong (including the shard file when known).
        what: String,
    },
    /// A NaN or infinite value in a weight or a scale.
    #[error("{tensor} ({file}): non-finite value {value} at {position}; the checkpoint is corrupt, re-download it")]
    NonFinite {
        /// Tensor name (the weight, or its `_scale_inv`).
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// `[row, col]` or flat index.
        position: String,
        /// The value as decoded (`NaN`, `inf`, `-inf`).
        value: String,
    },
    /// Not enough free disk space for the estimated output.
    #[error("{dir}: not enough free disk space: the store needs about {needed} bytes, {available} bytes are free")]
    DiskSpace {
        /// Directory where the store is written.
        dir: PathBuf,
        /// Estimated bytes still to write.
        needed: u64,
        /// Free bytes (statvfs f_bavail * f_frsize).
        available: u64,
    },
    /// An invalid command-line parameter value.
    #[error("{0}")]
    Usage(String),
    /// The store writer refused or failed (resume with different parameters, I/O, ...).
    #[error(transparent)]
    Store(#[from] coli_store::StoreError),
}

impl ConvertError {
    /// Builds an [`ConvertError::Io`].
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ConvertError {
        ConvertError::Io {
            path: path.into(),
            error: source,
        }
    }

    /// True for errors in the input itself (a NaN/Inf value, a tensor, header, index or config
    /// that is wrong), which resuming cannot fix: the partially written store is worthless and
    /// is removed. I/O errors, a full disk and the store writer's errors keep it for a resume.
    pub fn is_bad_data(&self) -> bool {
        matches!(
            self,
            ConvertError::NonFinite { .. }
                | ConvertError::Tensor { .. }
                | ConvertError::Safetensors { .. }
                | ConvertError::Gguf { .. }
                | ConvertError::Config { .. }
        )
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
