//! Building a store: append records, checksum while streaming, publish atomically, resume.
//!
//! A [`StoreWriter`] works in `TARGET.partial/` (FORMAT.md section 1). Besides the store's own
//! files that directory holds two files that exist only while the store is being built:
//!
//! - `spec.json`: the [`StoreSpec`] the build was started with (written once, atomically);
//! - `journal`: one JSON line per completed entry (expert record, dense tensor, copied file),
//!   appended after the entry's bytes were written. A torn last line is ignored.
//!
//! [`StoreWriter::create_or_resume`] compares the spec, re-reads every journaled entry and checks
//! its checksum, keeps the verified prefix, truncates the files after it and lets the converter
//! continue. Both files are removed before the directory is renamed to `TARGET`.
//!
//! One job per file: `start.rs` (create or resume), `append.rs` (expert records, dense tensors,
//! model files), `journal.rs` (journal lines; re-verifying them on resume), `spec.rs`
//! (spec.json and how a resumed spec is compared), `finish.rs` (INDEX, MANIFEST, publish),
//! `fs.rs` (the file operations). This file holds the writer's state and accessors.
//!
//! Crash tests: the named failpoints `writer.*` of [`crate::failpoint`] abort the process at
//! chosen points; every file operation goes through a [`WriterFs`] backend ([`OsFs`] by
//! default), so that tests can fail or tear any of them in-process.

mod append;
mod finish;
mod fs;
mod journal;
mod spec;
mod start;

pub use fs::{OsFs, WriterFs};

use crate::{
    DenseEntry, Encoding, ExpertKey, ExpertLayer, FileEntry, SourceFile, StoreError, StoreId,
};
use coli_format::disk::index::IndexRecord;
use coli_format::disk::manifest::ConverterInfo;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// Name of the converter recorded in the manifest.
pub const CONVERTER_NAME: &str = "coli-convert";

/// Default record alignment, bytes.
pub const DEFAULT_ALIGNMENT: usize = 4096;

/// Default segment size bound, bytes (4 GiB).
pub const DEFAULT_SEGMENT_MAX_BYTES: u64 = 4 << 30;

const SPEC_FILE: &str = "spec.json";

const JOURNAL_FILE: &str = "journal";

/// The order a writer stores the matrices of expert records in (FORMAT.md section 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MatrixOrder {
    /// Every matrix row-major, as in the checkpoint: readable by every format version's
    /// readers that know the encoding.
    #[default]
    RowMajor,
    /// The matrices that have an interleaved row order (`MatrixView::can_interleave`) in it
    /// (`MatrixView::interleave`; INDEX flag bit 1, format version 7): the order the integer
    /// kernels read, so a reader can use a record in place, e.g. from the page cache.
    Interleaved,
}

impl MatrixOrder {
    /// The name on the command line and in messages: `row-major` or `interleaved`.
    pub fn name(self) -> &'static str {
        match self {
            MatrixOrder::RowMajor => "row-major",
            MatrixOrder::Interleaved => "interleaved",
        }
    }
}

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
    /// The order of the matrices in expert records ([`MatrixOrder::RowMajor`] by default).
    pub matrix_order: MatrixOrder,
    /// Converter version string.
    pub converter_version: String,
    /// What an absent parameter means (`embeddings` -> `source (the default)`), for messages
    /// only: neither recorded nor part of the store id.
    pub parameter_defaults: BTreeMap<String, String>,
    /// Conversion parameters (threads are not a parameter).
    pub parameters: BTreeMap<String, String>,
    /// Source files.
    pub sources: Vec<SourceFile>,
}

impl StoreSpec {
    /// The store id this spec gives (FORMAT.md section 2): 32 lowercase hex digits of the
    /// XXH3-128 of the canonical JSON of `{"converter", "parameters", "sources"}`, the
    /// parameters as recorded ([`StoreSpec::recorded_parameters`]).
    pub fn store_id(&self) -> StoreId {
        store_id_of(
            &self.converter_version,
            &self.recorded_parameters(),
            &self.sources,
        )
    }

    /// The parameters the store records: [`StoreSpec::parameters`], plus
    /// `matrix_order=interleaved` when the spec writes that order (so the store id tells the
    /// two orders of one model apart; a row-major store records nothing, as before format
    /// version 7).
    pub fn recorded_parameters(&self) -> BTreeMap<String, String> {
        let mut p = self.parameters.clone();
        if self.matrix_order == MatrixOrder::Interleaved {
            p.insert(
                MATRIX_ORDER_PARAMETER.to_string(),
                MatrixOrder::Interleaved.name().to_string(),
            );
        }
        p
    }
}

/// The parameter that records [`MatrixOrder::Interleaved`] ([`StoreSpec::recorded_parameters`]).
const MATRIX_ORDER_PARAMETER: &str = "matrix_order";

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
    /// f32 scales (`encoding.scale_count(rows, cols)` of them; empty for f32, bf16, mxfp4).
    pub scales: Vec<f32>,
    /// mxfp4's e8m0 scale bytes, `[rows, ceil(cols / 32)]` (empty for every other encoding).
    pub e8m0_scales: Vec<u8>,
    /// The matrix's bias, f32 `[rows]`, for expert records that carry biases (format
    /// version 2, FORMAT.md section 5): all three matrices of a record have one or none.
    /// Dense tensors never have one (a bias is its own dense tensor).
    pub bias: Option<Vec<f32>>,
}

impl EncodedMatrix {
    /// A matrix without bias from its weight bytes and f32 scales.
    pub fn new(
        encoding: Encoding,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        scales: Vec<f32>,
    ) -> EncodedMatrix {
        EncodedMatrix {
            encoding,
            rows,
            cols,
            data,
            scales,
            e8m0_scales: Vec::new(),
            bias: None,
        }
    }

    /// The scale section as written: the f32 scales' bytes or the e8m0 bytes.
    pub fn scale_section(&self) -> &[u8] {
        use zerocopy::IntoBytes;
        if self.encoding.has_f32_scales() {
            self.scales.as_bytes()
        } else {
            &self.e8m0_scales
        }
    }
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

/// The segment file being appended to.
struct OpenSegment {
    id: u32,
    file: File,
    /// End of the last record (= file length).
    pos: u64,
    hasher: Box<Xxh3>,
    records: u64,
}

/// A segment that is complete (no more records will go to it).
struct ClosedSegment {
    len: u64,
    body_xxh3: u64,
}

/// The store id of a conversion by this converter (FORMAT.md section 2).
fn store_id_of(
    converter_version: &str,
    parameters: &BTreeMap<String, String>,
    sources: &[SourceFile],
) -> StoreId {
    let converter = ConverterInfo {
        name: CONVERTER_NAME.into(),
        version: converter_version.into(),
    };
    StoreId::of_conversion(&converter, parameters, sources)
}

/// Writes a store into `TARGET.partial/` and publishes it with a rename.
///
/// Entries are appended in the order the caller gives them; the caller must use the same
/// deterministic order on every run so that a resumed build is byte-identical to an
/// uninterrupted one. After an I/O error the writer is poisoned: every later call fails.
pub struct StoreWriter {
    target: PathBuf,
    partial: PathBuf,
    spec: StoreSpec,
    store_id: StoreId,
    config: serde_json::Value,
    expected: BTreeMap<u32, u32>,
    seg: Option<OpenSegment>,
    closed: Vec<ClosedSegment>,
    index: Vec<IndexRecord>,
    experts_done: HashMap<ExpertKey, u64>,
    dense_file: File,
    dense_pos: u64,
    dense_hasher: Box<Xxh3>,
    dense: Vec<DenseEntry>,
    dense_done: HashMap<String, usize>,
    files: BTreeMap<String, FileEntry>,
    mtp_shared: BTreeMap<String, String>,
    journal: File,
    poisoned: Option<String>,
    /// The file operations (the OS's, or a test's fault-injecting backend).
    fs: Arc<dyn WriterFs>,
    records_this_run: u64,
    dense_this_run: u64,
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

fn writer_err(msg: impl Into<String>) -> StoreError {
    StoreError::Writer(msg.into())
}

fn partial_path(target: &Path) -> PathBuf {
    let mut name = target
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    target.with_file_name(name)
}

fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(x) if !x.as_os_str().is_empty() => x.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && !name.ends_with(".tmp")
}

impl StoreWriter {
    /// True when the expert's record is already written (and, after a resume, verified).
    pub fn is_expert_done(&self, key: ExpertKey) -> bool {
        self.experts_done.contains_key(&key)
    }

    /// True when the dense tensor `name` is already written (and, after a resume, verified).
    pub fn is_dense_done(&self, name: &str) -> bool {
        self.dense_done.contains_key(name)
    }

    /// True when `files/NAME` is already written.
    pub fn is_file_done(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// The store id this writer produces.
    pub fn store_id(&self) -> StoreId {
        self.store_id
    }

    /// Records the MTP layer's tensors the store does not hold because the model shares the
    /// main model's, each with the tensor standing in (MANIFEST `mtp_shared`, FORMAT.md
    /// section 2). Set on every run, a resumed one included (it is derived from the
    /// checkpoint); [`StoreWriter::finish`] checks it against the dense tensors written.
    pub fn set_mtp_shared(&mut self, shared: BTreeMap<String, String>) {
        self.mtp_shared = shared;
    }

    /// The directory being written (`TARGET.partial`).
    pub fn partial_dir(&self) -> &Path {
        &self.partial
    }

    fn check_poison(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            Some(m) => Err(writer_err(format!(
                "the store writer for {} refuses further writes after an earlier error: {m}",
                self.target.display()
            ))),
            None => Ok(()),
        }
    }

    fn poison_on_io<T>(&mut self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e @ StoreError::Io { .. }) = &r {
            self.poisoned = Some(e.to_string());
        }
        r
    }
}
