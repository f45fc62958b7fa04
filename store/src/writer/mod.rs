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
//! Crash tests: the named failpoints `writer.*` of [`crate::failpoint`] abort the process at
//! chosen points; every file operation goes through a [`WriterFs`] backend ([`OsFs`] by
//! default), so that tests can fail or tear any of them in-process.

mod fs;

pub use fs::{OsFs, WriterFs};

use crate::failpoint;
use crate::StoreError;
use crate::{DenseEntry, Encoding, ExpertKey, ExpertLayer, FileEntry, Manifest, SourceFile};
use crate::{StoreId, Xxh3Sum};
use coli_format::disk::index::{write_index, IndexRecord, RecordPlace};
use coli_format::disk::manifest::{ConverterInfo, EncodingInfo, WholeFile};
use coli_format::disk::names::{self, parse_segment_name, segment_path};
use coli_format::disk::segment::SegmentHeader;
use coli_format::disk::FORMAT_VERSION;
use coli_format::encoding::{align_up, SECTION_ALIGN};
use coli_format::RecordLayout;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};
use zerocopy::IntoBytes;

/// Name of the converter recorded in the manifest.
pub const CONVERTER_NAME: &str = "coli-convert";
/// Default record alignment, bytes.
pub const DEFAULT_ALIGNMENT: usize = 4096;
/// Default segment size bound, bytes (4 GiB).
pub const DEFAULT_SEGMENT_MAX_BYTES: u64 = 4 << 30;

const SPEC_FILE: &str = "spec.json";
const JOURNAL_FILE: &str = "journal";

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

impl StoreSpec {
    /// The store id this spec gives (FORMAT.md section 2): 32 lowercase hex digits of the
    /// XXH3-128 of the canonical JSON of `{"converter", "parameters", "sources"}`.
    pub fn store_id(&self) -> StoreId {
        store_id_of(&self.converter_version, &self.parameters, &self.sources)
    }
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

/// The spec as kept in `TARGET.partial/spec.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SpecFile {
    store_id: StoreId,
    family: String,
    config_xxh3: Xxh3Sum,
    config_len: u64,
    num_layers: u32,
    expert_layers: Vec<ExpertLayer>,
    expert_encoding: Encoding,
    alignment: usize,
    segment_max_bytes: u64,
    converter_version: String,
    parameters: BTreeMap<String, String>,
    sources: Vec<SourceFile>,
}

impl SpecFile {
    fn from_spec(spec: &StoreSpec) -> SpecFile {
        SpecFile {
            store_id: spec.store_id(),
            family: spec.family.clone(),
            config_xxh3: Xxh3Sum(xxh3_64_with_seed(&spec.config_json, 0)),
            config_len: spec.config_json.len() as u64,
            num_layers: spec.num_layers,
            expert_layers: spec.expert_layers.clone(),
            expert_encoding: spec.expert_encoding,
            alignment: spec.alignment,
            segment_max_bytes: spec.segment_max_bytes,
            converter_version: spec.converter_version.clone(),
            parameters: spec.parameters.clone(),
            sources: spec.sources.clone(),
        }
    }
}

/// One journal line.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum JournalEntry {
    Expert {
        layer: u32,
        expert: u32,
        segment: u32,
        offset: u64,
        length: u64,
        payload_len: u64,
        hidden: u32,
        intermediate: u32,
        encoding: u16,
        group_size: u16,
        checksum: Xxh3Sum,
    },
    Dense {
        entry: DenseEntry,
    },
    File {
        entry: FileEntry,
    },
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

/// The store id of a conversion by this converter (FORMAT.md section 2).
pub(crate) fn store_id_of(
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

/// Lists what differs between what a store (or partial store) was built with and what is
/// requested now.
fn describe_differences(
    old_params: &BTreeMap<String, String>,
    new_params: &BTreeMap<String, String>,
    old_sources: &[SourceFile],
    new_sources: &[SourceFile],
    old_version: &str,
    new_version: &str,
) -> Vec<String> {
    let mut d = Vec::new();
    let keys: BTreeSet<&String> = old_params.keys().chain(new_params.keys()).collect();
    for k in keys {
        let a = old_params.get(k);
        let b = new_params.get(k);
        if a != b {
            d.push(format!(
                "parameter {k}: existing {} vs requested {}",
                a.map(String::as_str).unwrap_or("(unset)"),
                b.map(String::as_str).unwrap_or("(unset)")
            ));
        }
    }
    let old_map: BTreeMap<&str, &SourceFile> =
        old_sources.iter().map(|s| (s.name.as_str(), s)).collect();
    let new_map: BTreeMap<&str, &SourceFile> =
        new_sources.iter().map(|s| (s.name.as_str(), s)).collect();
    for (name, s) in &old_map {
        match new_map.get(name) {
            None => d.push(format!(
                "source {name}: in the existing store, not in the request"
            )),
            Some(n) if n != s => d.push(format!(
                "source {name}: existing size {} header {} vs requested size {} header {}",
                s.size, s.header_xxh3, n.size, n.header_xxh3
            )),
            _ => {}
        }
    }
    for name in new_map.keys() {
        if !old_map.contains_key(name) {
            d.push(format!(
                "source {name}: requested, not in the existing store"
            ));
        }
    }
    if d.is_empty() && old_sources != new_sources {
        d.push("sources: same files in a different order".into());
    }
    if old_version != new_version {
        d.push(format!(
            "converter version: existing {old_version} vs requested {new_version}"
        ));
    }
    d
}

fn spec_differences(old: &SpecFile, new: &SpecFile) -> Vec<String> {
    let mut d = describe_differences(
        &old.parameters,
        &new.parameters,
        &old.sources,
        &new.sources,
        &old.converter_version,
        &new.converter_version,
    );
    macro_rules! cmp {
        ($f:ident) => {
            if old.$f != new.$f {
                d.push(format!(
                    "{}: existing {:?} vs requested {:?}",
                    stringify!($f),
                    old.$f,
                    new.$f
                ));
            }
        };
    }
    cmp!(family);
    cmp!(config_xxh3);
    cmp!(num_layers);
    cmp!(expert_layers);
    cmp!(expert_encoding);
    cmp!(alignment);
    cmp!(segment_max_bytes);
    d
}

fn validate_spec(spec: &StoreSpec) -> Result<serde_json::Value, StoreError> {
    if spec.alignment < 512 || spec.alignment > 1 << 24 || !spec.alignment.is_power_of_two() {
        return Err(writer_err(format!(
            "alignment {} must be a power of two from 512 bytes to 16 MiB (what readers accept)",
            spec.alignment
        )));
    }
    if spec.segment_max_bytes < 2 * spec.alignment as u64 {
        return Err(writer_err(format!(
            "segment_max_bytes {} must be at least twice the alignment ({})",
            spec.segment_max_bytes, spec.alignment
        )));
    }
    let mut prev: Option<u32> = None;
    for l in &spec.expert_layers {
        if prev.is_some_and(|p| l.layer <= p) {
            return Err(writer_err(format!(
                "expert_layers must be sorted by layer without duplicates (layer {})",
                l.layer
            )));
        }
        if l.layer >= spec.num_layers {
            return Err(writer_err(format!(
                "expert layer {} is not below num_layers {}",
                l.layer, spec.num_layers
            )));
        }
        prev = Some(l.layer);
    }
    serde_json::from_slice(&spec.config_json)
        .map_err(|e| writer_err(format!("config.json is not valid JSON: {e}")))
}

fn check_matrix(
    what: &str,
    m: &EncodedMatrix,
    rows: usize,
    cols: usize,
    enc: Option<Encoding>,
) -> Result<(), StoreError> {
    if m.rows != rows || m.cols != cols {
        return Err(writer_err(format!(
            "{what}: shape [{}, {}], expected [{rows}, {cols}]",
            m.rows, m.cols
        )));
    }
    if let Some(e) = enc {
        if m.encoding != e {
            return Err(writer_err(format!(
                "{what}: encoding {} differs from the other matrices' {}",
                m.encoding.name(),
                e.name()
            )));
        }
    }
    if let Encoding::Int4 { group_size } = m.encoding {
        if group_size < 2 || !group_size.is_multiple_of(2) {
            return Err(writer_err(format!(
                "{what}: int4 group size {group_size} must be even and at least 2"
            )));
        }
    }
    let wb = m.encoding.weight_bytes(rows, cols);
    if m.data.len() != wb {
        return Err(writer_err(format!(
            "{what}: {} weight bytes, expected {wb} for {} [{rows}, {cols}]",
            m.data.len(),
            m.encoding.name()
        )));
    }
    let sc = m.encoding.scale_count(rows, cols);
    if m.scales.len() != sc {
        return Err(writer_err(format!(
            "{what}: {} scales, expected {sc} for {} [{rows}, {cols}]",
            m.scales.len(),
            m.encoding.name()
        )));
    }
    Ok(())
}

/// Starts writing `len` bytes at `offset` of `file` to disk now, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, Linux), so that a large conversion's writes
/// overlap with its reads instead of piling up for the final fsync. Advice only: errors are
/// ignored (durability still comes from the fsyncs in `finish`).
fn start_writeback(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: plain syscall on a valid open file descriptor; no memory is passed.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
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

/// Reads `len` bytes at `offset`; Ok(None) when the file is shorter.
fn read_range(file: &File, offset: u64, len: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; len];
    match file.read_exact_at(&mut buf, offset) {
        Ok(()) => Ok(Some(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

impl StoreWriter {
    /// Starts building the store at `target`, or resumes an interrupted build.
    ///
    /// - `target` is a complete store with the same store id: [`WriterStart::AlreadyComplete`].
    /// - `TARGET.partial/` exists with the same spec: every journaled entry is re-read and its
    ///   checksum checked; the verified prefix is kept, the rest truncated:
    ///   [`WriterStart::Resumed`]. The caller skips entries for which
    ///   [`StoreWriter::is_expert_done`] / [`StoreWriter::is_dense_done`] are true and adds the
    ///   others in the same order as before.
    /// - otherwise a fresh `TARGET.partial/` is created: [`WriterStart::Fresh`].
    ///
    /// `files/config.json` is written from `spec.config_json` as the first entry.
    ///
    /// # Errors
    /// [`StoreError::Writer`] when the spec is invalid (alignment, layers, config not JSON), when
    /// `target` exists but is a store of different parameters/sources/converter version or not a
    /// store, or when the partial build's spec differs (the message names every difference);
    /// [`StoreError::Io`] on file system errors.
    pub fn create_or_resume(target: &Path, spec: StoreSpec) -> Result<WriterStart, StoreError> {
        Self::create_or_resume_with(target, spec, Arc::new(OsFs))
    }

    /// [`StoreWriter::create_or_resume`] with the file operations of `fs` (tests inject I/O
    /// errors and torn writes there; [`OsFs`] is the operating system's).
    ///
    /// # Errors
    /// As [`StoreWriter::create_or_resume`].
    pub fn create_or_resume_with(
        target: &Path,
        spec: StoreSpec,
        fs: Arc<dyn WriterFs>,
    ) -> Result<WriterStart, StoreError> {
        let config = validate_spec(&spec)?;
        let spec_file = SpecFile::from_spec(&spec);
        let store_id = spec_file.store_id;
        if target.exists() {
            return Self::check_existing_target(target, &spec, &spec_file);
        }
        let partial = partial_path(target);
        if partial.exists() {
            let spec_path = partial.join(SPEC_FILE);
            if spec_path.exists() {
                let bytes = std::fs::read(&spec_path).map_err(|e| io_err(&spec_path, e))?;
                let old: SpecFile = serde_json::from_slice(&bytes).map_err(|e| {
                    writer_err(format!(
                        "{}: unreadable ({e}); remove {} to start over",
                        spec_path.display(),
                        partial.display()
                    ))
                })?;
                let diffs = spec_differences(&old, &spec_file);
                if !diffs.is_empty() {
                    return Err(writer_err(format!(
                        "{} is a partial build with a different spec: {}; remove it to start over or use the original parameters",
                        partial.display(),
                        diffs.join("; ")
                    )));
                }
                let (w, info) = Self::resume(target, partial, spec, config, store_id, fs)?;
                return Ok(WriterStart::Resumed(w, info));
            }
            if partial.join("MANIFEST").exists() {
                // Interrupted between removing spec/journal and the rename: the partial
                // directory is a complete store.
                let st = crate::Store::open_with(
                    &partial,
                    &crate::OpenOptions {
                        io: crate::IoPreference::Buffered,
                        fetch_threads: 1,
                        ..Default::default()
                    },
                )
                .map_err(|e| {
                    writer_err(format!(
                        "{} holds a MANIFEST but is not a valid store ({e}); remove it to start over",
                        partial.display()
                    ))
                })?;
                if st.manifest().store_id != spec_file.store_id {
                    return Err(writer_err(format!(
                        "{} is a finished build of a different store (id {}, requested {}); remove it",
                        partial.display(),
                        st.manifest().store_id,
                        spec_file.store_id
                    )));
                }
                drop(st);
                fs.rename(&partial, target).map_err(|e| io_err(target, e))?;
                let parent = parent_dir(target);
                fs.sync_dir(&parent).map_err(|e| io_err(&parent, e))?;
                return Ok(WriterStart::AlreadyComplete);
            }
            // Interrupted before spec.json existed: nothing of value is there.
            std::fs::remove_dir_all(&partial).map_err(|e| io_err(&partial, e))?;
        }
        let w = Self::fresh(target, partial, spec, config, store_id, &spec_file, fs)?;
        Ok(WriterStart::Fresh(w))
    }

    fn check_existing_target(
        target: &Path,
        spec: &StoreSpec,
        spec_file: &SpecFile,
    ) -> Result<WriterStart, StoreError> {
        if !target.join("MANIFEST").exists() {
            return Err(writer_err(format!(
                "{} exists and is not a store (no MANIFEST); choose another output path or remove it",
                target.display()
            )));
        }
        let st = crate::Store::open_with(
            target,
            &crate::OpenOptions {
                io: crate::IoPreference::Buffered,
                fetch_threads: 1,
                ..Default::default()
            },
        )
        .map_err(|e| {
            writer_err(format!(
                "{} exists but is not a valid store ({e}); run coli-fsck on it, or remove it to convert again",
                target.display()
            ))
        })?;
        let m = st.manifest();
        if m.store_id == spec_file.store_id {
            return Ok(WriterStart::AlreadyComplete);
        }
        let diffs = describe_differences(
            &m.parameters,
            &spec.parameters,
            &m.sources,
            &spec.sources,
            &m.converter.version,
            &spec.converter_version,
        );
        Err(writer_err(format!(
            "{} is a complete store of a different conversion (id {}, requested {}): {}; choose another output path or remove it",
            target.display(),
            m.store_id,
            spec_file.store_id,
            if diffs.is_empty() {
                "converter name differs".to_string()
            } else {
                diffs.join("; ")
            }
        )))
    }

    #[allow(clippy::too_many_arguments)]
    fn new_state(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        dense_file: File,
        journal: File,
        fs: Arc<dyn WriterFs>,
    ) -> StoreWriter {
        let expected = spec
            .expert_layers
            .iter()
            .map(|l| (l.layer, l.num_experts))
            .collect();
        StoreWriter {
            target: target.to_path_buf(),
            partial,
            spec,
            store_id,
            config,
            expected,
            seg: None,
            closed: Vec::new(),
            index: Vec::new(),
            experts_done: HashMap::new(),
            dense_file,
            dense_pos: 0,
            dense_hasher: Box::new(Xxh3::new()),
            dense: Vec::new(),
            dense_done: HashMap::new(),
            files: BTreeMap::new(),
            journal,
            poisoned: None,
            fs,
            records_this_run: 0,
            dense_this_run: 0,
        }
    }

    fn fresh(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        spec_file: &SpecFile,
        fs: Arc<dyn WriterFs>,
    ) -> Result<StoreWriter, StoreError> {
        std::fs::create_dir(&partial).map_err(|e| io_err(&partial, e))?;
        for sub in ["segments", "files"] {
            let p = partial.join(sub);
            std::fs::create_dir(&p).map_err(|e| io_err(&p, e))?;
        }
        let dense_path = partial.join("dense.bin");
        let dense_file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&dense_path)
            .map_err(|e| io_err(&dense_path, e))?;
        let jpath = partial.join(JOURNAL_FILE);
        let journal = File::options()
            .append(true)
            .create_new(true)
            .open(&jpath)
            .map_err(|e| io_err(&jpath, e))?;
        // spec.json last, atomically: its presence marks a resumable partial build.
        let tmp = partial.join("spec.json.tmp");
        let bytes = serde_json::to_vec_pretty(spec_file).expect("spec serializes");
        fs.write_file(&tmp, &bytes, true)
            .map_err(|e| io_err(&tmp, e))?;
        let sp = partial.join(SPEC_FILE);
        fs.rename(&tmp, &sp).map_err(|e| io_err(&sp, e))?;
        fs.sync_dir(&partial).map_err(|e| io_err(&partial, e))?;
        let parent = parent_dir(&partial);
        fs.sync_dir(&parent).map_err(|e| io_err(&parent, e))?;
        let mut w = Self::new_state(
            target, partial, spec, config, store_id, dense_file, journal, fs,
        );
        w.ensure_config()?;
        Ok(w)
    }

    fn ensure_config(&mut self) -> Result<(), StoreError> {
        if !self.files.contains_key("config.json") {
            let bytes = self.spec.config_json.clone();
            self.add_file("config.json", &bytes)?;
        }
        Ok(())
    }

    fn resume(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        fs: Arc<dyn WriterFs>,
    ) -> Result<(StoreWriter, ResumeInfo), StoreError> {
        for sub in ["segments", "files"] {
            let p = partial.join(sub);
            if !p.exists() {
                std::fs::create_dir(&p).map_err(|e| io_err(&p, e))?;
            }
        }
        let jpath = partial.join(JOURNAL_FILE);
        let mut jbytes = Vec::new();
        if jpath.exists() {
            File::open(&jpath)
                .and_then(|mut f| f.read_to_end(&mut jbytes))
                .map_err(|e| io_err(&jpath, e))?;
        }
        let dense_path = partial.join("dense.bin");
        let dense_file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&dense_path)
            .map_err(|e| io_err(&dense_path, e))?;
        let journal = File::options()
            .append(true)
            .create(true)
            .open(&jpath)
            .map_err(|e| io_err(&jpath, e))?;
        let mut w = Self::new_state(
            target, partial, spec, config, store_id, dense_file, journal, fs,
        );
        let mut info = ResumeInfo::default();
        let mut kept_journal_len = 0usize;
        let mut seg_files: BTreeMap<u32, File> = BTreeMap::new();
        let alignment = w.spec.alignment as u64;
        // Verify the journal entry by entry; stop at the first line that does not parse or
        // whose bytes fail.
        let mut pos = 0usize;
        while pos < jbytes.len() {
            let Some(nl) = jbytes[pos..].iter().position(|&b| b == b'\n') else {
                break; // torn last line
            };
            let line = &jbytes[pos..pos + nl];
            let Ok(entry) = serde_json::from_slice::<JournalEntry>(line) else {
                break;
            };
            let ok = w.verify_entry(&entry, &mut seg_files, alignment)?;
            if !ok {
                break;
            }
            match &entry {
                JournalEntry::Expert { length, .. } => {
                    info.experts_kept += 1;
                    info.bytes_kept += length;
                }
                JournalEntry::Dense { entry } => {
                    info.dense_kept += 1;
                    info.bytes_kept += entry.length + entry.scales_length;
                }
                JournalEntry::File { entry } => info.bytes_kept += entry.size,
            }
            pos += nl + 1;
            kept_journal_len = pos;
        }
        // Truncate everything after the verified prefix.
        w.journal
            .set_len(kept_journal_len as u64)
            .map_err(|e| io_err(&jpath, e))?;
        w.dense_file
            .set_len(w.dense_pos)
            .map_err(|e| io_err(&dense_path, e))?;
        let keep_segments = w.seg.as_ref().map(|s| s.id + 1).unwrap_or(0);
        if let Some(s) = &w.seg {
            let p = segment_path(&w.partial, s.id);
            s.file.set_len(s.pos).map_err(|e| io_err(&p, e))?;
        }
        let segdir = w.partial.join("segments");
        for e in std::fs::read_dir(&segdir).map_err(|e| io_err(&segdir, e))? {
            let e = e.map_err(|e| io_err(&segdir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let id = parse_segment_name(&name);
            if id.is_none_or(|id| id >= keep_segments) {
                std::fs::remove_file(e.path()).map_err(|x| io_err(&e.path(), x))?;
            }
        }
        let filesdir = w.partial.join("files");
        for e in std::fs::read_dir(&filesdir).map_err(|e| io_err(&filesdir, e))? {
            let e = e.map_err(|e| io_err(&filesdir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !w.files.contains_key(&name) {
                std::fs::remove_file(e.path()).map_err(|x| io_err(&e.path(), x))?;
            }
        }
        for name in ["MANIFEST", "INDEX"] {
            let p = w.partial.join(name);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
            }
        }
        for d in [&segdir, &filesdir, &w.partial] {
            w.fs.sync_dir(d).map_err(|e| io_err(d, e))?;
        }
        w.ensure_config()?;
        Ok((w, info))
    }

    /// Re-reads one journaled entry, checks it, and adopts it into the writer state.
    /// Returns false when the entry does not verify (the prefix ends before it).
    fn verify_entry(
        &mut self,
        entry: &JournalEntry,
        seg_files: &mut BTreeMap<u32, File>,
        alignment: u64,
    ) -> Result<bool, StoreError> {
        match entry {
            JournalEntry::Expert {
                layer,
                expert,
                segment,
                offset,
                length,
                payload_len,
                hidden,
                intermediate,
                encoding,
                group_size,
                checksum,
            } => {
                let key = ExpertKey::new(*layer, *expert);
                let sum = checksum.0;
                let Ok(enc) = Encoding::from_id(*encoding, *group_size) else {
                    return Ok(false);
                };
                let layout = RecordLayout::new(enc, *hidden as usize, *intermediate as usize);
                if self.experts_done.contains_key(&key)
                    || self.expected.get(layer).is_none_or(|&n| *expert >= n)
                    || layout.payload_len as u64 != *payload_len
                    || layout.record_len(alignment as usize) as u64 != *length
                {
                    return Ok(false);
                }
                // Records are appended: either to the current segment at its end or to the
                // next segment right after its header.
                let expected_pos = match &self.seg {
                    Some(s) if s.id == *segment => s.pos,
                    Some(s) if s.id + 1 == *segment => alignment,
                    None if *segment == 0 => alignment,
                    _ => return Ok(false),
                };
                if *offset != expected_pos {
                    return Ok(false);
                }
                let path = segment_path(&self.partial, *segment);
                if !seg_files.contains_key(segment) {
                    let f = match File::options().read(true).write(true).open(&path) {
                        Ok(f) => f,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                        Err(e) => return Err(io_err(&path, e)),
                    };
                    seg_files.insert(*segment, f);
                }
                let f = &seg_files[segment];
                let Some(bytes) =
                    read_range(f, *offset, *length as usize).map_err(|e| io_err(&path, e))?
                else {
                    return Ok(false);
                };
                if crate::checksum::xxh3_64_with_seed(&bytes, key.checksum_seed()) != sum {
                    return Ok(false);
                }
                if self.seg.as_ref().is_none_or(|s| s.id != *segment) {
                    if let Some(old) = self.seg.take() {
                        self.closed.push(ClosedSegment {
                            len: old.pos,
                            body_xxh3: old.hasher.digest(),
                        });
                    }
                    // The header region must be zero until finish writes it.
                    let file = seg_files.remove(segment).expect("inserted above");
                    file.write_all_at(&vec![0u8; alignment as usize], 0)
                        .map_err(|e| io_err(&path, e))?;
                    self.seg = Some(OpenSegment {
                        id: *segment,
                        file,
                        pos: alignment,
                        hasher: Box::new(Xxh3::with_seed(*segment as u64)),
                        records: 0,
                    });
                }
                let s = self.seg.as_mut().expect("set above");
                s.hasher.update(&bytes);
                s.pos += length;
                s.records += 1;
                self.index.push(IndexRecord::new(RecordPlace {
                    key,
                    segment: *segment,
                    encoding: enc,
                    offset: *offset,
                    length: *length,
                    payload_len: *payload_len,
                    hidden: *hidden,
                    intermediate: *intermediate,
                    checksum: sum,
                }));
                self.experts_done.insert(key, sum);
                Ok(true)
            }
            JournalEntry::Dense { entry } => {
                let sum = entry.xxh3.0;
                if self.dense_done.contains_key(&entry.name)
                    || entry.offset < self.dense_pos
                    || entry.offset != align_up(self.dense_pos as usize, SECTION_ALIGN) as u64
                {
                    return Ok(false);
                }
                let end = if entry.scales_length > 0 {
                    entry.scales_offset + entry.scales_length
                } else {
                    entry.offset + entry.length
                };
                if end < entry.offset + entry.length {
                    return Ok(false);
                }
                let start = self.dense_pos;
                let path = self.partial.join("dense.bin");
                let Some(bytes) = read_range(&self.dense_file, start, (end - start) as usize)
                    .map_err(|e| io_err(&path, e))?
                else {
                    return Ok(false);
                };
                let rel = |o: u64| (o - start) as usize;
                let w = &bytes[rel(entry.offset)..rel(entry.offset + entry.length)];
                let s = if entry.scales_length > 0 {
                    if entry.scales_offset < entry.offset + entry.length {
                        return Ok(false);
                    }
                    &bytes[rel(entry.scales_offset)..rel(end)]
                } else {
                    &[][..]
                };
                let mut h = Xxh3::with_seed(xxh3_64_with_seed(entry.name.as_bytes(), 0));
                h.update(w);
                h.update(s);
                if h.digest() != sum {
                    return Ok(false);
                }
                // Padding must be zero.
                let pad1 = &bytes[..rel(entry.offset)];
                let pad2 = if entry.scales_length > 0 {
                    &bytes[rel(entry.offset + entry.length)..rel(entry.scales_offset)]
                } else {
                    &[][..]
                };
                if pad1.iter().chain(pad2).any(|&b| b != 0) {
                    return Ok(false);
                }
                self.dense_hasher.update(&bytes);
                self.dense_pos = end;
                self.dense_done.insert(entry.name.clone(), self.dense.len());
                self.dense.push(entry.clone());
                Ok(true)
            }
            JournalEntry::File { entry } => {
                if !valid_file_name(&entry.name) || self.files.contains_key(&entry.name) {
                    return Ok(false);
                }
                let path = self.partial.join("files").join(&entry.name);
                let bytes = match std::fs::read(&path) {
                    Ok(b) => b,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                    Err(e) => return Err(io_err(&path, e)),
                };
                if bytes.len() as u64 != entry.size
                    || Xxh3Sum(xxh3_64_with_seed(&bytes, 0)) != entry.xxh3
                {
                    return Ok(false);
                }
                self.files.insert(entry.name.clone(), entry.clone());
                Ok(true)
            }
        }
    }

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

    fn append_journal(&mut self, e: &JournalEntry) -> Result<(), StoreError> {
        let mut line = serde_json::to_vec(e).expect("journal entry serializes");
        line.push(b'\n');
        let path = self.partial.join(JOURNAL_FILE);
        self.fs
            .append(&mut self.journal, &path, &line)
            .map_err(|x| io_err(&path, x))
    }

    /// Appends one expert's record: gate [I, H], up [I, H], down [H, I] (`mats` in that order,
    /// all in one encoding), laid out per FORMAT.md section 5 and zero-padded to the alignment.
    /// Starts a new segment file when the record would push the current one past
    /// `segment_max_bytes` (a record larger than a whole segment gets a segment of its own).
    ///
    /// Adding an expert that is already done is a no-op when its bytes are identical.
    ///
    /// # Errors
    /// [`StoreError::Writer`] for a key outside `expert_layers`, shapes or lengths that do not
    /// match (H, I) and the encoding, a different record for a done key, or a poisoned writer;
    /// [`StoreError::Io`] on a write error (the writer is then poisoned).
    pub fn add_expert(
        &mut self,
        key: ExpertKey,
        hidden: usize,
        intermediate: usize,
        mats: [&EncodedMatrix; 3],
    ) -> Result<(), StoreError> {
        self.check_poison()?;
        let r = self.add_expert_inner(key, hidden, intermediate, mats);
        self.poison_on_io(r)
    }

    fn add_expert_inner(
        &mut self,
        key: ExpertKey,
        hidden: usize,
        inter: usize,
        mats: [&EncodedMatrix; 3],
    ) -> Result<(), StoreError> {
        if self
            .expected
            .get(&key.layer)
            .is_none_or(|&n| key.expert >= n)
        {
            return Err(writer_err(format!(
                "{key} is not an expected expert (expert_layers of the spec)"
            )));
        }
        if hidden == 0 || inter == 0 || hidden > u32::MAX as usize || inter > u32::MAX as usize {
            return Err(writer_err(format!(
                "{key}: hidden {hidden} / intermediate {inter} out of range"
            )));
        }
        let enc = mats[0].encoding;
        check_matrix(&format!("{key} gate"), mats[0], inter, hidden, Some(enc))?;
        check_matrix(&format!("{key} up"), mats[1], inter, hidden, Some(enc))?;
        check_matrix(&format!("{key} down"), mats[2], hidden, inter, Some(enc))?;
        let layout = RecordLayout::new(enc, hidden, inter);
        let alignment = self.spec.alignment;
        let rec_len = layout.record_len(alignment);
        let mut rec = vec![0u8; rec_len];
        for (m, &(w_off, wb, s_off, sb)) in mats.iter().zip(layout.sections.iter()) {
            rec[w_off..w_off + wb].copy_from_slice(&m.data);
            if sb > 0 {
                rec[s_off..s_off + sb].copy_from_slice(m.scales.as_bytes());
            }
        }
        let sum = crate::checksum::xxh3_64_with_seed(&rec, key.checksum_seed());
        if let Some(&done) = self.experts_done.get(&key) {
            if done == sum {
                return Ok(());
            }
            return Err(writer_err(format!(
                "{key} was already written with different bytes (checksum {done:016x} vs {sum:016x})"
            )));
        }
        // Roll over to a new segment when needed.
        let need_new = match &self.seg {
            None => true,
            Some(s) => s.records > 0 && s.pos + rec_len as u64 > self.spec.segment_max_bytes,
        };
        if need_new {
            let id = match self.seg.take() {
                Some(old) => {
                    self.closed.push(ClosedSegment {
                        len: old.pos,
                        body_xxh3: old.hasher.digest(),
                    });
                    old.id + 1
                }
                None => 0,
            };
            let path = segment_path(&self.partial, id);
            let file = File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            self.fs
                .write_at(&file, &path, &vec![0u8; alignment], 0)
                .map_err(|e| io_err(&path, e))?;
            self.seg = Some(OpenSegment {
                id,
                file,
                pos: alignment as u64,
                hasher: Box::new(Xxh3::with_seed(id as u64)),
                records: 0,
            });
        }
        let s = self.seg.as_mut().expect("segment open");
        let path = segment_path(&self.partial, s.id);
        let offset = s.pos;
        self.fs
            .write_at(&s.file, &path, &rec, offset)
            .map_err(|e| io_err(&path, e))?;
        start_writeback(&s.file, offset, rec_len);
        s.hasher.update(&rec);
        s.pos += rec_len as u64;
        s.records += 1;
        let seg_id = s.id;
        self.records_this_run += 1;
        failpoint::hit_nth("writer.after_record", self.records_this_run);
        let (enc_id, gs) = (enc.id(), enc.group_size());
        self.append_journal(&JournalEntry::Expert {
            layer: key.layer,
            expert: key.expert,
            segment: seg_id,
            offset,
            length: rec_len as u64,
            payload_len: layout.payload_len as u64,
            hidden: hidden as u32,
            intermediate: inter as u32,
            encoding: enc_id,
            group_size: gs,
            checksum: Xxh3Sum(sum),
        })?;
        failpoint::hit_nth("writer.after_journal", self.records_this_run);
        self.index.push(IndexRecord::new(RecordPlace {
            key,
            segment: seg_id,
            encoding: enc,
            offset,
            length: rec_len as u64,
            payload_len: layout.payload_len as u64,
            hidden: hidden as u32,
            intermediate: inter as u32,
            checksum: sum,
        }));
        self.experts_done.insert(key, sum);
        Ok(())
    }

    /// Appends a dense tensor to `dense.bin`: `shape` is `[n]` (then `m` is [1, n]) or
    /// `[rows, cols]`; weight and scale sections start at multiples of 64 bytes
    /// (FORMAT.md section 7).
    ///
    /// Adding a tensor that is already done is a no-op when its bytes are identical.
    ///
    /// # Errors
    /// [`StoreError::Writer`] for a shape of other rank, data/scale lengths that do not match,
    /// a different tensor under a done name, or a poisoned writer; [`StoreError::Io`] on a
    /// write error (the writer is then poisoned).
    pub fn add_dense(
        &mut self,
        name: &str,
        shape: &[usize],
        m: &EncodedMatrix,
    ) -> Result<(), StoreError> {
        self.check_poison()?;
        let r = self.add_dense_inner(name, shape, m);
        self.poison_on_io(r)
    }

    fn add_dense_inner(
        &mut self,
        name: &str,
        shape: &[usize],
        m: &EncodedMatrix,
    ) -> Result<(), StoreError> {
        let (rows, cols) = match shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => {
                return Err(writer_err(format!(
                    "dense tensor {name}: shape {shape:?} must have 1 or 2 dimensions"
                )))
            }
        };
        if name.is_empty() {
            return Err(writer_err("dense tensor with an empty name"));
        }
        check_matrix(&format!("dense tensor {name}"), m, rows, cols, None)?;
        let seed = xxh3_64_with_seed(name.as_bytes(), 0);
        let mut h = Xxh3::with_seed(seed);
        h.update(&m.data);
        h.update(m.scales.as_bytes());
        let sum = h.digest();
        if let Some(&i) = self.dense_done.get(name) {
            let e = &self.dense[i];
            if e.xxh3 == Xxh3Sum(sum) && e.shape == shape && e.encoding == m.encoding.id() {
                return Ok(());
            }
            return Err(writer_err(format!(
                "dense tensor {name} was already written with different contents"
            )));
        }
        let path = self.partial.join("dense.bin");
        let offset = align_up(self.dense_pos as usize, SECTION_ALIGN) as u64;
        let sbytes = m.scales.as_bytes();
        let scales_offset = if sbytes.is_empty() {
            0
        } else {
            align_up(offset as usize + m.data.len(), SECTION_ALIGN) as u64
        };
        let end = if sbytes.is_empty() {
            offset + m.data.len() as u64
        } else {
            scales_offset + sbytes.len() as u64
        };
        // Build the whole span (padding, weights, padding, scales) and write it at once.
        let start = self.dense_pos;
        let mut span = vec![0u8; (end - start) as usize];
        let rel = |o: u64| (o - start) as usize;
        span[rel(offset)..rel(offset) + m.data.len()].copy_from_slice(&m.data);
        if !sbytes.is_empty() {
            span[rel(scales_offset)..rel(end)].copy_from_slice(sbytes);
        }
        self.fs
            .write_at(&self.dense_file, &path, &span, start)
            .map_err(|e| io_err(&path, e))?;
        self.dense_hasher.update(&span);
        self.dense_pos = end;
        self.dense_this_run += 1;
        failpoint::hit_nth("writer.after_dense", self.dense_this_run);
        let entry = DenseEntry {
            name: name.to_string(),
            encoding: m.encoding.id(),
            group_size: m.encoding.group_size(),
            shape: shape.to_vec(),
            offset,
            length: m.data.len() as u64,
            scales_offset,
            scales_length: sbytes.len() as u64,
            xxh3: Xxh3Sum(sum),
        };
        self.append_journal(&JournalEntry::Dense {
            entry: entry.clone(),
        })?;
        self.dense_done.insert(name.to_string(), self.dense.len());
        self.dense.push(entry);
        Ok(())
    }

    /// Copies a model file (config, tokenizer, chat template, ...) to `files/NAME`.
    /// `config.json` is written by the writer itself from the spec; adding it again with the
    /// same bytes (or any done file with the same bytes) is a no-op.
    ///
    /// # Errors
    /// [`StoreError::Writer`] for a name with `/`, `..`, a `.tmp` suffix or empty, different
    /// bytes under a done name, or a poisoned writer; [`StoreError::Io`] on a write error (the
    /// writer is then poisoned).
    pub fn add_file(&mut self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.check_poison()?;
        let r = self.add_file_inner(name, bytes);
        self.poison_on_io(r)
    }

    fn add_file_inner(&mut self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        if !valid_file_name(name) {
            return Err(writer_err(format!(
                "file name {name:?} is not allowed (no '/', not '.', '..', empty or *.tmp)"
            )));
        }
        let sum = Xxh3Sum(xxh3_64_with_seed(bytes, 0));
        if let Some(e) = self.files.get(name) {
            if e.xxh3 == sum && e.size == bytes.len() as u64 {
                return Ok(());
            }
            return Err(writer_err(format!(
                "file {name} was already written with different contents"
            )));
        }
        let path = self.partial.join("files").join(name);
        self.fs
            .write_file(&path, bytes, false)
            .map_err(|e| io_err(&path, e))?;
        let entry = FileEntry {
            name: name.to_string(),
            size: bytes.len() as u64,
            xxh3: sum,
        };
        self.append_journal(&JournalEntry::File {
            entry: entry.clone(),
        })?;
        self.files.insert(name.to_string(), entry);
        Ok(())
    }

    /// Finishes the store: writes the segment headers, INDEX, and MANIFEST (last), fsyncs every
    /// file and directory, renames `TARGET.partial` to `TARGET` and fsyncs the parent.
    /// Returns `TARGET`.
    ///
    /// # Errors
    /// [`StoreError::Writer`] when an expected expert is missing (naming the layers and the
    /// first missing expert) or the writer is poisoned; [`StoreError::Io`] on a write, fsync
    /// or rename error.
    pub fn finish(mut self) -> Result<PathBuf, StoreError> {
        self.check_poison()?;
        let r = self.finish_inner();
        self.poison_on_io(r)
    }

    fn finish_inner(&mut self) -> Result<PathBuf, StoreError> {
        let mut missing_layers = Vec::new();
        let mut first_missing = None;
        for (&layer, &n) in &self.expected {
            for e in 0..n {
                let k = ExpertKey::new(layer, e);
                if !self.experts_done.contains_key(&k) {
                    first_missing.get_or_insert(k);
                    missing_layers.push(layer);
                    break;
                }
            }
        }
        if let Some(k) = first_missing {
            return Err(writer_err(format!(
                "cannot finish {}: experts missing in layers {missing_layers:?} (first: {k})",
                self.target.display()
            )));
        }
        let alignment = self.spec.alignment;
        // Segment headers.
        let fs = self.fs.clone();
        if let Some(old) = self.seg.take() {
            let p = segment_path(&self.partial, old.id);
            fs.sync(&old.file, &p).map_err(|e| io_err(&p, e))?;
            self.closed.push(ClosedSegment {
                len: old.pos,
                body_xxh3: old.hasher.digest(),
            });
        }
        for (id, s) in self.closed.iter().enumerate() {
            let id = id as u32;
            let h = SegmentHeader::new(id, self.store_id, s.len, s.body_xxh3);
            let path = segment_path(&self.partial, id);
            let f = File::options()
                .write(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            fs.write_at(&f, &path, h.as_bytes(), 0)
                .map_err(|e| io_err(&path, e))?;
            fs.sync(&f, &path).map_err(|e| io_err(&path, e))?;
        }
        failpoint::hit("writer.before_index");
        // INDEX.
        let index_bytes = write_index(&self.index);
        let ipath = self.partial.join(names::INDEX);
        fs.write_file(&ipath, &index_bytes, true)
            .map_err(|e| io_err(&ipath, e))?;
        // dense.bin and files.
        let dpath = self.partial.join("dense.bin");
        fs.sync(&self.dense_file, &dpath)
            .map_err(|e| io_err(&dpath, e))?;
        for name in self.files.keys() {
            let p = self.partial.join("files").join(name);
            File::open(&p)
                .and_then(|f| fs.sync(&f, &p))
                .map_err(|e| io_err(&p, e))?;
        }
        for d in ["segments", "files"] {
            let p = self.partial.join(d);
            fs.sync_dir(&p).map_err(|e| io_err(&p, e))?;
        }
        failpoint::hit("writer.before_manifest");
        let spec = &self.spec;
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            store_id: self.store_id,
            alignment: alignment as u64,
            family: spec.family.clone(),
            config: self.config.clone(),
            num_layers: spec.num_layers,
            expert_layers: spec.expert_layers.clone(),
            expert_encoding: EncodingInfo::of(spec.expert_encoding),
            segment_count: self.closed.len() as u32,
            segment_max_bytes: spec.segment_max_bytes,
            converter: ConverterInfo {
                name: CONVERTER_NAME.into(),
                version: spec.converter_version.clone(),
            },
            parameters: spec.parameters.clone(),
            sources: spec.sources.clone(),
            dense: self.dense.clone(),
            dense_file: WholeFile {
                length: self.dense_pos,
                xxh3: Xxh3Sum(self.dense_hasher.digest()),
            },
            index_file: WholeFile {
                length: index_bytes.len() as u64,
                xxh3: Xxh3Sum(xxh3_64_with_seed(&index_bytes, 0)),
            },
            files: self.files.values().cloned().collect(),
        };
        let mbytes = manifest.to_bytes();
        let mpath = self.partial.join(names::MANIFEST);
        fs.write_file(&mpath, &mbytes, true)
            .map_err(|e| io_err(&mpath, e))?;
        for name in [JOURNAL_FILE, SPEC_FILE] {
            let p = self.partial.join(name);
            std::fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
        }
        fs.sync_dir(&self.partial)
            .map_err(|e| io_err(&self.partial, e))?;
        failpoint::hit("writer.before_rename");
        fs.rename(&self.partial, &self.target)
            .map_err(|e| io_err(&self.target, e))?;
        failpoint::hit("writer.after_rename");
        let parent = parent_dir(&self.target);
        fs.sync_dir(&parent).map_err(|e| io_err(&parent, e))?;
        Ok(self.target.clone())
    }
}
