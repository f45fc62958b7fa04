//! The format crate's error type.

/// A structure that does not parse or does not meet the format (docs/FORMAT.md), or a model
/// config (config.json) that coli cannot run. Each variant names the file and what is wrong,
/// with expected and found values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A structural problem of a store file: bad magic, bad field, out-of-bounds offset, ...
    #[error("{file}: {what}")]
    Format {
        /// The file (relative to the store directory when inside a store).
        file: String,
        /// What is wrong, with expected and found values.
        what: String,
    },
    /// A store file written by a newer format version than this code knows.
    #[error("{file}: format version {found} is newer than the newest this reader knows ({known}); upgrade coli")]
    NewerVersion {
        /// The file.
        file: String,
        /// Version found on disk.
        found: u32,
        /// Newest version this code reads.
        known: u32,
    },
    /// A missing, mistyped or inconsistent field of a model config (config.json or
    /// generation_config.json).
    #[error("{file}: {what}")]
    Config {
        /// The config file (`config.json`, or its path when known).
        file: String,
        /// The field and what is wrong with it.
        what: String,
    },
    /// A model the spec does not describe: another `model_type`, activation, RoPE type or
    /// routing rule.
    #[error("unsupported model: {0}")]
    Unsupported(String),
}

impl FormatError {
    /// A [`FormatError::Format`] for `file`.
    pub fn format(file: impl Into<String>, what: impl Into<String>) -> FormatError {
        FormatError::Format {
            file: file.into(),
            what: what.into(),
        }
    }
}
