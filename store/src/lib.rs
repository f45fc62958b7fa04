//! # coli-store: the block store for MoE expert weights
//!
//! A store is a directory (format: `docs/FORMAT.md`) holding every routed expert of a
//! Mixture-of-Experts model as ONE contiguous, aligned, checksummed record (gate, up and down
//! weights with all their scales), the dense tensors in a memory-mappable file, and the model's
//! config and tokenizer files. Engines read it through [`Store::fetch`] (experts, positional
//! O_DIRECT reads, checksum verified) and [`Store::dense`] (dense tensors by name, mmap).
//! [`StoreWriter`] builds a store and publishes it atomically.
//!
//! Data flows one way: checkpoint -> `coli-convert` -> [`StoreWriter`] -> store directory ->
//! [`Store::fetch`] -> engine cache -> kernels.

pub mod encoding;
mod error;
mod format;
mod io;
mod manifest;
mod reader;
mod writer;

pub use encoding::{Encoding, MatrixView, RecordLayout};
pub use error::StoreError;
pub use format::{IndexRecord, FORMAT_VERSION};
pub use io::{AlignedBuf, IoMode, IoPreference};
pub use manifest::{DenseEntry, ExpertLayer, FileEntry, Manifest, SourceFile};
pub use reader::{DenseTensor, ExpertBuf, FetchStats, OpenOptions, Store};
pub use writer::{EncodedMatrix, ResumeInfo, StoreSpec, StoreWriter, WriterStart};

/// Identity of one routed expert: its decoder layer index and its index within the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ExpertKey {
    /// Decoder layer index (0-based, as in the checkpoint's tensor names).
    pub layer: u32,
    /// Expert index within the layer.
    pub expert: u32,
}

impl ExpertKey {
    /// Makes a key.
    pub fn new(layer: u32, expert: u32) -> ExpertKey {
        ExpertKey { layer, expert }
    }
    /// The checksum seed of this expert's record: `(layer << 32) | expert` (FORMAT.md section 3).
    pub fn checksum_seed(self) -> u64 {
        ((self.layer as u64) << 32) | self.expert as u64
    }
}

impl std::fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "layer {} expert {}", self.layer, self.expert)
    }
}
