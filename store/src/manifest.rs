//! The MANIFEST's JSON body (docs/FORMAT.md section 2).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A layer that holds routed experts, and how many.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpertLayer {
    /// Decoder layer index.
    pub layer: u32,
    /// Experts 0..num_experts are expected in INDEX.
    pub num_experts: u32,
}

/// A source checkpoint file's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// File name inside the checkpoint directory.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3 (seed 0) of the safetensors length prefix and JSON header, 16 hex digits.
    pub header_xxh3: String,
}

/// One dense tensor in `dense.bin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseEntry {
    /// Tensor name as in the checkpoint.
    pub name: String,
    /// Encoding id (FORMAT.md section 6).
    pub encoding: u16,
    /// Group size field.
    pub group_size: u16,
    /// Shape: [n] for vectors, [rows, cols] for matrices.
    pub shape: Vec<usize>,
    /// Offset of the weight section in dense.bin, bytes (multiple of 64).
    pub offset: u64,
    /// Weight section length, bytes.
    pub length: u64,
    /// Offset of the scale section (0 when none).
    pub scales_offset: u64,
    /// Scale section length, bytes (0 when none).
    pub scales_length: u64,
    /// xxh3 of weight then scale section, seed = xxh3(name), 16 hex digits.
    pub xxh3: String,
}

/// A file copied from the checkpoint into `files/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name (e.g. `tokenizer.json`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3 (seed 0), 16 hex digits.
    pub xxh3: String,
}

/// Length and checksum of a whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WholeFile {
    /// Bytes.
    pub length: u64,
    /// xxh3 (seed 0), 16 hex digits.
    pub xxh3: String,
}

/// Expert encoding as recorded in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodingInfo {
    /// Encoding id.
    pub id: u16,
    /// Short name (`int4-g64`).
    pub name: String,
    /// Group size field.
    pub group_size: u16,
}

/// The converter that wrote the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConverterInfo {
    /// Program name.
    pub name: String,
    /// Program version.
    pub version: String,
}

/// The MANIFEST body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version (also in the binary header).
    pub format_version: u32,
    /// 32 lowercase hex digits.
    pub store_id: String,
    /// Record alignment, bytes.
    pub alignment: u64,
    /// `model_type` of the source config.
    pub family: String,
    /// The source `config.json`, parsed.
    pub config: serde_json::Value,
    /// Decoder layers in the model (MTP layers included when present).
    pub num_layers: u32,
    /// Every layer holding routed experts.
    pub expert_layers: Vec<ExpertLayer>,
    /// Encoding of the routed experts (one per store in version 1).
    pub expert_encoding: EncodingInfo,
    /// Number of segment files.
    pub segment_count: u32,
    /// Size bound of a segment file, bytes.
    pub segment_max_bytes: u64,
    /// Converter identity.
    pub converter: ConverterInfo,
    /// Conversion parameters (`experts`, `dense`, `mtp`, ...).
    pub parameters: BTreeMap<String, String>,
    /// Source files.
    pub sources: Vec<SourceFile>,
    /// Dense tensors.
    pub dense: Vec<DenseEntry>,
    /// dense.bin as a whole.
    pub dense_file: WholeFile,
    /// INDEX as a whole.
    pub index_file: WholeFile,
    /// Copied files.
    pub files: Vec<FileEntry>,
}
