//! Aligned buffers and positional reads (O_DIRECT with buffered fallback).

/// How the reader was asked to read expert records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoPreference {
    /// O_DIRECT when the file system supports it at the store's alignment, else buffered
    /// (with one logged note).
    #[default]
    Auto,
    /// O_DIRECT or an error.
    Direct,
    /// Buffered reads through the page cache.
    Buffered,
}

/// How the reader actually reads expert records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT positional reads into aligned buffers.
    Direct,
    /// Buffered positional reads.
    Buffered,
}

/// A heap buffer whose start address is aligned (to 4096 bytes by default), as O_DIRECT needs.
pub struct AlignedBuf {
    _private: (),
}
