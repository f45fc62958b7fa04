//! # coli-store: the block store for MoE expert weights
//!
//! A store is a directory (format: `docs/FORMAT.md`) holding every routed expert of a
//! Mixture-of-Experts model as ONE contiguous, aligned, checksummed record (gate, up and down
//! weights with all their scales), the dense tensors in a memory-mappable file, and the model's
//! config and tokenizer files. Engines read it through [`Store::fetch`] (experts, read by an
//! [`IoEngine`]: io_uring, a pread thread pool or mmap, O_DIRECT where possible, checksum
//! verified; `docs/IO.md`) and [`Store::dense`] (dense tensors by name, mmap).
//! [`StoreWriter`] builds a store and publishes it atomically.
//!
//! Data flows one way: checkpoint -> `coli-convert` -> [`StoreWriter`] -> store directory ->
//! [`Store::fetch`] -> engine cache -> kernels.
//!
//! Integrity: every structure carries a crc32 and every record, tensor and file an xxh3
//! (FORMAT.md section 9). [`Store::open`] checks the structure; [`Store::fetch`] checks each
//! record's checksum on every read, [`Store::dense`] each tensor's at its first access, and
//! [`Store::file`] each file's at every read (unless [`OpenOptions::verify_checksums`] is
//! false). [`fsck::check`] checks everything (the `coli-fsck` tool).
//!
//! # Example
//!
//! Write a tiny store (one layer of two int4 experts, H = 8, I = 4, one bf16 norm vector),
//! open it, fetch both experts and dequantize a row:
//!
//! ```
//! use coli_store::*;
//! use std::collections::BTreeMap;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tmp = tempfile::tempdir()?;
//! let target = tmp.path().join("tiny.coli");
//! let enc = Encoding::Int4 { group_size: 4 };
//! let spec = StoreSpec {
//!     family: "mixtral".into(),
//!     config_json: br#"{"model_type":"mixtral","hidden_size":8}"#.to_vec(),
//!     num_layers: 1,
//!     expert_layers: vec![ExpertLayer { layer: 0, num_experts: 2 }],
//!     expert_encoding: enc,
//!     alignment: 4096,
//!     segment_max_bytes: 1 << 20,
//!     matrix_order: Default::default(),
//!     converter_version: "0.1.0".into(),
//!     parameter_defaults: Default::default(),
//!     parameters: BTreeMap::from([("experts".to_string(), "int4-g4".to_string())]),
//!     sources: vec![],
//! };
//! // An int4 matrix whose every weight is q = 1 (nibble 9) with scale 0.5.
//! let mat = |rows: usize, cols: usize| EncodedMatrix {
//!     encoding: enc,
//!     rows,
//!     cols,
//!     data: vec![0x99; enc.weight_bytes(rows, cols)],
//!     scales: vec![0.5; enc.scale_count(rows, cols)],
//!     e8m0_scales: Vec::new(),
//!     bias: None,
//! };
//! let (h, i) = (8, 4);
//! let (gate, up, down) = (mat(i, h), mat(i, h), mat(h, i));
//! let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&target, spec)? else {
//!     panic!("the target is new");
//! };
//! for e in 0..2 {
//!     w.add_expert(ExpertKey::new(0, e), h, i, [&gate, &up, &down])?;
//! }
//! let norm = EncodedMatrix {
//!     encoding: Encoding::Bf16, rows: 1, cols: 8,
//!     data: [0x80u8, 0x3f].repeat(8), // bf16 1.0
//!     scales: vec![],
//!     e8m0_scales: Vec::new(),
//!     bias: None,
//! };
//! w.add_dense("model.norm.weight", &[8], &norm)?;
//! w.finish()?;
//!
//! let store = Store::open(&target)?;
//! let experts = store.fetch(&[ExpertKey::new(0, 0), ExpertKey::new(0, 1)])?;
//! let mut row = vec![0f32; h];
//! experts[1].gate().dequantize_row(0, &mut row);
//! assert_eq!(row, vec![0.5f32; 8]);
//! assert_eq!(store.dense("model.norm.weight")?.to_f32(), vec![1.0f32; 8]);
//! assert_eq!(store.model_config()["hidden_size"], 8);
//! # Ok(())
//! # }
//! ```

pub mod checksum;
mod error;
pub mod failpoint;
pub mod fsck;
mod io;
pub mod mirror;
mod reader;
mod writer;

pub use coli_format::disk::index::IndexRecord;
pub use coli_format::disk::manifest::{
    ConverterInfo, DenseEntry, EncodingInfo, ExpertLayer, FileEntry, Manifest, SourceFile,
    WholeFile,
};
pub use coli_format::disk::{StoreId, Xxh3Sum, FORMAT_VERSION};
pub use coli_format::{Encoding, ExpertKey, FormatError, MatrixView, RecordLayout};
pub use error::StoreError;
pub use io::{
    held_bytes_for, io_engine_names, memlock_limit, probe_direct, AlignedBuf, Completion,
    CountingEngine, EngineLayer, EngineStats, FileId, IoEngine, IoEngineChoice, IoMode,
    IoPreference, IoQueue, ReadError, ReadPiece, ReadProgress, ReadRequest,
    DEFAULT_VERIFY_PIECE_BYTES,
};
pub use reader::{
    DenseTensor, EngineWrapper, ExpertBuf, FetchStats, OpenOptions, Reorder, Store, MAX_QUEUE_DEPTH,
};
pub use writer::{
    EncodedMatrix, MatrixOrder, OsFs, ResumeInfo, StoreSpec, StoreWriter, WriterFs, WriterStart,
    CONVERTER_NAME, DEFAULT_ALIGNMENT, DEFAULT_SEGMENT_MAX_BYTES,
};
