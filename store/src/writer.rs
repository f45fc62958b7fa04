//! Building a store: append records, checksum while streaming, publish atomically, resume.

use crate::{Encoding, ExpertKey, ExpertLayer, SourceFile, StoreError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Everything that identifies a store before any record is written.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    /// `model_type`.
    pub family: String,
    /// The source config.json bytes (parsed into the manifest, copied to files/).
    pub config_json: Vec<u8>,
    /// Decoder layers in the model.
    pub num_layers: u32,
    /// Every layer holding routed experts, in order.
    pub expert_layers: Vec<ExpertLayer>,
    /// Encoding of the routed experts of the main layers.
    pub expert_encoding: Encoding,
    /// Record alignment, bytes (default 4096; at least 512, a power of two).
    pub alignment: usize,
    /// Segment size bound, bytes (default 4 GiB).
    pub segment_max_bytes: u64,
    /// Converter version string.
    pub converter_version: String,
    /// Conversion parameters (threads are not a parameter).
    pub parameters: BTreeMap<String, String>,
    /// Source files.
    pub sources: Vec<SourceFile>,
}

/// One encoded matrix handed to the writer.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodedMatrix {
    /// Encoding of `data`.
    pub encoding: Encoding,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// Weight section bytes.
    pub data: Vec<u8>,
    /// Scales.
    pub scales: Vec<f32>,
}

/// What a resumed writer found already written and verified.
#[derive(Clone, Debug, Default)]
pub struct ResumeInfo {
    /// Expert records kept.
    pub experts_kept: u64,
    /// Dense tensors kept.
    pub dense_kept: u64,
    /// Bytes kept.
    pub bytes_kept: u64,
}

/// The result of [`StoreWriter::create_or_resume`].
pub enum WriterStart {
    /// Nothing was there: a fresh writer.
    Fresh(StoreWriter),
    /// A partial store with the same spec was found and verified.
    Resumed(StoreWriter, ResumeInfo),
    /// The target is already a complete store with the same spec.
    AlreadyComplete,
}

/// Writes a store into `TARGET.partial/` and publishes it with a rename.
pub struct StoreWriter {
    _private: (),
}

#[allow(unused_variables, missing_docs)]
impl StoreWriter {
    pub fn create_or_resume(target: &Path, spec: StoreSpec) -> Result<WriterStart, StoreError> { todo!() }
    pub fn is_expert_done(&self, key: ExpertKey) -> bool { todo!() }
    pub fn is_dense_done(&self, name: &str) -> bool { todo!() }
    pub fn add_expert(&mut self, key: ExpertKey, hidden: usize, intermediate: usize, mats: [&EncodedMatrix; 3]) -> Result<(), StoreError> { todo!() }
    pub fn add_dense(&mut self, name: &str, shape: &[usize], m: &EncodedMatrix) -> Result<(), StoreError> { todo!() }
    pub fn add_file(&mut self, name: &str, bytes: &[u8]) -> Result<(), StoreError> { todo!() }
    pub fn finish(self) -> Result<PathBuf, StoreError> { todo!() }
}
