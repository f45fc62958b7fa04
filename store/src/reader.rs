//! Opening a store and fetching experts and dense tensors.

use crate::checksum::StreamingChecksum;
use crate::io::{open_engine, open_read, probe_direct, read_aligned, EngineConfig, EngineFile};
use crate::io::{CountingEngine, EngineStats, IoEngine, IoEngineChoice, ReadProgress, ReadRequest};
use crate::mirror::primary::{PrimaryInfo, PrimarySegment};
use crate::{
    AlignedBuf, Encoding, ExpertKey, IndexRecord, IoMode, IoPreference, Manifest, MatrixView,
    RecordLayout, StoreError,
};
use coli_format::disk::index::parse_index;
use coli_format::disk::names::{self, segment_path, segment_rel};
use coli_format::disk::segment::SegmentHeader;
use coli_format::disk::SEGMENT_HEADER_FIELDS;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};
use zerocopy::FromBytes;

#[cfg(target_endian = "big")]
compile_error!(
    "coli-store reads little-endian f32/u16 sections in place and needs a little-endian target"
);

/// A caller-supplied wrapper around the I/O engine built at open ([`OpenOptions::engine_wrapper`]):
/// it receives the engine (its file table is the store's segments, then the admitted mirror
/// files, see [`IoEngine::path`]) and returns the engine every expert read then goes through.
pub type EngineWrapper = Arc<dyn Fn(Arc<dyn IoEngine>) -> Arc<dyn IoEngine> + Send + Sync>;

/// The largest queue depth [`Store::open_with`] accepts (reads in flight per fetch call; the
/// pread and mmap engines run one thread per unit of depth).
pub const MAX_QUEUE_DEPTH: usize = 256;

/// Options for [`Store::open_with`].
#[derive(Clone)]
pub struct OpenOptions {
    /// Verify each record's checksum on every fetch (default true), and each dense tensor's
    /// and copied file's checksum on first access.
    pub verify_checksums: bool,
    /// O_DIRECT / buffered choice (default Auto), independent of the engine.
    pub io: IoPreference,
    /// Threads of the pread and mmap engines, and the queue depth when `queue_depth` is `None`
    /// (default 4).
    pub fetch_threads: usize,
    /// I/O engine (default [`IoEngineChoice::Auto`]: io_uring, else pread with one note; the
    /// engines are listed by [`crate::io_engine_names`]).
    pub engine: IoEngineChoice,
    /// Expert reads in flight at once per fetch call (default `None`: `fetch_threads`).
    pub queue_depth: Option<usize>,
    /// Bytes per piece in which verified records of a batch (and every verified record with the
    /// mmap engine) are read and hashed as they land, rounded up to the store alignment;
    /// `Some(0)` reads each record whole and hashes it after it lands (a batch's records in
    /// parallel on up to `queue_depth` hashing threads, at most one per CPU). Default `None`:
    /// the engine's best ([`IoEngine::verify_piece_bytes`], measured, `docs/IO.md`): whole
    /// records for io_uring, [`crate::DEFAULT_VERIFY_PIECE_BYTES`] for pread and mmap.
    pub verify_piece_bytes: Option<usize>,
    /// Mirror directories (docs/MIRRORS.md), drives 1, 2, ... in this order (default none).
    /// Admitted files serve reads; damaged, mismatched and missing ones are left out with one
    /// note each. Mirrors are only read.
    pub mirrors: Vec<PathBuf>,
    /// Relative read bandwidth of each drive, the store first then each mirror (default
    /// `None`: measured at open with a short O_DIRECT probe, cached in the state directory).
    /// Only used with mirrors.
    pub disk_weights: Option<Vec<f64>>,
    /// With mirrors, a single-record fetch of at least this many bytes is striped over the
    /// drives holding the record in proportion to their weights (default
    /// [`crate::mirror::DEFAULT_STRIPE_THRESHOLD`]; `u64::MAX` never stripes).
    pub stripe_threshold: u64,
    /// Pluggable engine layer (default `None`: the engine chosen by `engine` is used as is).
    /// When set, it is called once at open with the built engine, and expert reads (batches,
    /// striped reads, [`Store::io_engine_handle`]) go through the engine it returns, which must
    /// read the same files (e.g. a wrapper that measures, traces or throttles each drive, as
    /// the mirror benchmark does). Reads outside the engine (dense tensors, mirror fallback
    /// re-reads, probes at open) do not.
    pub engine_wrapper: Option<EngineWrapper>,
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("verify_checksums", &self.verify_checksums)
            .field("io", &self.io)
            .field("fetch_threads", &self.fetch_threads)
            .field("engine", &self.engine)
            .field("queue_depth", &self.queue_depth)
            .field("verify_piece_bytes", &self.verify_piece_bytes)
            .field("mirrors", &self.mirrors)
            .field("disk_weights", &self.disk_weights)
            .field("stripe_threshold", &self.stripe_threshold)
            .field(
                "engine_wrapper",
                &self.engine_wrapper.as_ref().map(|_| "<wrapper>"),
            )
            .finish()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            verify_checksums: true,
            io: IoPreference::Auto,
            fetch_threads: 4,
            engine: IoEngineChoice::Auto,
            queue_depth: None,
            verify_piece_bytes: None,
            mirrors: Vec::new(),
            disk_weights: None,
            stripe_threshold: crate::mirror::DEFAULT_STRIPE_THRESHOLD,
            engine_wrapper: None,
        }
    }
}

/// Counters of expert reads since open.
///
/// Disk throughput is `bytes_read / io_wait_ns` (bytes per ns = GB/s) as seen by the callers;
/// `io_wait_ns` minus `verify_ns` bounds the time blocked on the device alone from above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Expert records read.
    pub reads: u64,
    /// Bytes read from segment files.
    pub bytes_read: u64,
    /// Wall-clock time callers spent inside [`Store::fetch`] / [`Store::fetch_one`], summed
    /// over calls (concurrent calls each count), ns: the engine's I/O wait, verification of
    /// what was read included.
    pub io_wait_ns: u64,
    /// Time spent computing record checksums, summed over the threads that hashed, ns (part of
    /// it overlaps reads in flight).
    pub verify_ns: u64,
    /// Fetch calls.
    pub fetches: u64,
}

/// One open segment file.
pub(crate) struct Segment {
    pub(crate) rel: String,
    pub(crate) file: File,
    pub(crate) len: u64,
    pub(crate) header: SegmentHeader,
}

/// An open, validated store.
///
/// `Store` is `Send + Sync`: fetches from several threads at once are fine.
pub struct Store {
    dir: PathBuf,
    manifest: Manifest,
    index: Vec<IndexRecord>,
    segments: Vec<Segment>,
    io_mode: IoMode,
    buf_align: usize,
    verify: bool,
    dense_map: Option<memmap2::Mmap>,
    dense_by_name: HashMap<String, usize>,
    dense_verified: Vec<AtomicBool>,
    dense_encodings: Vec<Encoding>,
    engine: Arc<dyn IoEngine>,
    /// The counters around the engine (the same engine, before any caller wrapper).
    counting: Arc<CountingEngine>,
    engine_note: Option<String>,
    verify_piece_bytes: Option<usize>,
    /// Threads hashing whole records of a batch as they land (queue depth > 1).
    hash_pool: Option<rayon::ThreadPool>,
    /// Mirror routing (`None` without mirrors).
    router: Option<crate::mirror::route::Router>,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    io_wait_ns: AtomicU64,
    verify_ns: AtomicU64,
    fetches: AtomicU64,
}

/// Feeds a record's checksum as its pieces land (see [`ReadProgress`]).
struct RecordHasher {
    h: StreamingChecksum,
    ns: u64,
}

impl ReadProgress for RecordHasher {
    fn advance(&mut self, buf: &[u8], valid: usize) {
        let t = Instant::now();
        self.h.update(buf, valid);
        self.ns += t.elapsed().as_nanos() as u64;
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// One fetched expert: its record bytes in an aligned buffer, with typed views of its matrices.
///
/// `ExpertBuf` is `Send + Sync` (engines keep `Arc<ExpertBuf>` in caches).
pub struct ExpertBuf {
    /// Which expert.
    pub key: ExpertKey,
    /// Its encoding.
    pub encoding: Encoding,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    layout: RecordLayout,
    buf: AlignedBuf,
}

/// A dense tensor, borrowed from the store's memory map.
pub struct DenseTensor<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Encoding.
    pub encoding: Encoding,
    /// Shape: `[n]` or `[rows, cols]`.
    pub shape: &'a [usize],
    /// Weight section.
    pub data: &'a [u8],
    /// Scales (empty for f32/bf16).
    pub scales: &'a [f32],
}

fn fmt_err(file: impl Into<String>, what: impl Into<String>) -> StoreError {
    StoreError::Format {
        file: file.into(),
        what: what.into(),
    }
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// Views `bytes` as f32 values (aligned, length a multiple of 4: guaranteed by the format's
/// 64-byte section alignment inside an aligned buffer or page-aligned map).
fn as_f32s(bytes: &[u8]) -> &[f32] {
    if bytes.is_empty() {
        return &[];
    }
    <[f32]>::ref_from_bytes(bytes).expect("scale sections are 64-byte aligned, length 4*n")
}

/// Reads a whole small file, naming it in errors.
fn read_file(dir: &Path, rel: &str) -> Result<Vec<u8>, StoreError> {
    let p = dir.join(rel);
    std::fs::read(&p).map_err(|e| io_err(&p, e))
}

impl Store {
    /// Opens and validates the store in `dir` with default [`OpenOptions`].
    ///
    /// # Errors
    /// See [`Store::open_with`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Store, StoreError> {
        Store::open_with(dir, &OpenOptions::default())
    }

    /// Opens and validates the store in `dir`: MANIFEST (magic, version, length, crc32), INDEX
    /// (header and record crc32s, whole-file xxh3, sorting, alignment, bounds, overlap), every
    /// segment header (magic, crc32, segment id, store id, length), completeness against
    /// `expert_layers`, and the dense table (bounds, lengths, alignment). Record and dense
    /// checksums are checked later, at each fetch / first access (when `verify_checksums`).
    ///
    /// With [`IoPreference::Auto`], O_DIRECT is used when the file system supports it at the
    /// store's alignment; otherwise buffered reads, with one note on stderr.
    ///
    /// # Errors
    /// [`StoreError::Io`] for missing/unreadable files, [`StoreError::Format`] naming the file
    /// and field for structural damage, [`StoreError::NewerVersion`], [`StoreError::Incomplete`]
    /// naming the layers with missing experts, [`StoreError::Checksum`] when INDEX's whole-file
    /// xxh3 differs, and [`StoreError::Io`] when `IoPreference::Direct` cannot be honoured.
    pub fn open_with(dir: impl AsRef<Path>, opts: &OpenOptions) -> Result<Store, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = Manifest::parse(&read_file(&dir, names::MANIFEST)?)?;
        let store_id = manifest.store_id;
        let index_bytes = read_file(&dir, names::INDEX)?;
        let index = parse_index(&index_bytes, &manifest)?;
        let found = xxh3_64_with_seed(&index_bytes, 0);
        let expected = manifest.index_file.xxh3.0;
        if found != expected {
            return Err(StoreError::Checksum {
                what: "INDEX (whole file)".into(),
                file: "INDEX".into(),
                offset: 0,
                expected,
                found,
            });
        }
        // Segments.
        let align = manifest.alignment as usize;
        let mut segments = Vec::new();
        for id in 0..manifest.segment_count {
            let rel = segment_rel(id);
            let path = segment_path(&dir, id);
            let file = open_read(&path, false).map_err(|e| io_err(&path, e))?;
            let len = file.metadata().map_err(|e| io_err(&path, e))?.len();
            if len < align as u64 {
                return Err(fmt_err(
                    &rel,
                    format!("{len} bytes, shorter than the {align}-byte header"),
                ));
            }
            let hb = read_aligned(&file, 0, align, AlignedBuf::DEFAULT_ALIGN)
                .map_err(|e| io_err(&path, e))?;
            let header = SegmentHeader::parse(&rel, &hb, id, store_id, len)?;
            segments.push(Segment {
                rel,
                file,
                len,
                header,
            });
        }
        for r in &index {
            let s = &segments[r.segment.get() as usize];
            if r.offset.get() + r.length.get() > s.len {
                return Err(fmt_err(
                    "INDEX",
                    format!(
                        "record of {}: offset {} + length {} beyond the end of {} ({} bytes)",
                        r.key(),
                        r.offset.get(),
                        r.length.get(),
                        s.rel,
                        s.len
                    ),
                ));
            }
        }
        // Completeness.
        let mut missing = Vec::new();
        for l in &manifest.expert_layers {
            let have = index.iter().filter(|r| r.layer.get() == l.layer).count() as u64;
            if have != l.num_experts as u64 {
                missing.push(l.layer);
            }
        }
        if !missing.is_empty() {
            return Err(StoreError::Incomplete {
                dir: dir.clone(),
                layers: missing,
            });
        }
        // Dense table.
        let dpath = dir.join("dense.bin");
        let dfile = File::open(&dpath).map_err(|e| io_err(&dpath, e))?;
        let dlen = dfile.metadata().map_err(|e| io_err(&dpath, e))?.len();
        if dlen != manifest.dense_file.length {
            return Err(fmt_err(
                "dense.bin",
                format!(
                    "{dlen} bytes, MANIFEST dense_file.length says {}",
                    manifest.dense_file.length
                ),
            ));
        }
        let mut dense_by_name = HashMap::new();
        let mut dense_encodings = Vec::new();
        for (i, e) in manifest.dense.iter().enumerate() {
            let enc = e.check(dlen)?;
            if dense_by_name.insert(e.name.clone(), i).is_some() {
                return Err(fmt_err(
                    "MANIFEST",
                    format!("dense tensor {} listed twice", e.name),
                ));
            }
            dense_encodings.push(enc);
        }
        let dense_map = if dlen > 0 {
            // SAFETY: the store's files are immutable once published (FORMAT.md section 1);
            // the map is read-only. Modifying the file while open is outside the contract.
            Some(unsafe { memmap2::Mmap::map(&dfile) }.map_err(|e| io_err(&dpath, e))?)
        } else {
            None
        };
        // I/O mode.
        let direct_engine = opts.engine.direct_io();
        let (io_mode, buf_align) = match (opts.io, direct_engine) {
            (IoPreference::Direct, false) => {
                let name = match opts.engine {
                    IoEngineChoice::Engine(n) => n,
                    IoEngineChoice::Auto => "auto",
                };
                return Err(io_err(
                    &dir,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("O_DIRECT was requested with the {name} engine, which always reads through the page cache; choose another engine or buffered I/O"),
                    ),
                ));
            }
            (IoPreference::Buffered, _) | (_, false) => {
                (IoMode::Buffered, AlignedBuf::DEFAULT_ALIGN.max(align))
            }
            (pref, true) => {
                let probe = match segments.first() {
                    Some(s) => probe_direct(&segment_path(&dir, 0), align, s.len),
                    None => Ok(AlignedBuf::DEFAULT_ALIGN.max(align)),
                };
                match probe {
                    Ok(a) => (IoMode::Direct, a),
                    Err(why) if pref == IoPreference::Auto => {
                        eprintln!(
                            "coli-store: note: {}: direct I/O unavailable ({why}); using buffered reads",
                            dir.display()
                        );
                        (IoMode::Buffered, AlignedBuf::DEFAULT_ALIGN.max(align))
                    }
                    Err(why) => {
                        return Err(io_err(
                            &segment_path(&dir, 0),
                            std::io::Error::other(format!(
                                "O_DIRECT requested but unavailable: {why}"
                            )),
                        ))
                    }
                }
            }
        };
        if io_mode == IoMode::Direct {
            for (id, s) in segments.iter_mut().enumerate() {
                let p = segment_path(&dir, id as u32);
                s.file = open_read(&p, true).map_err(|e| io_err(&p, e))?;
            }
        }
        // I/O engine, over its own handles of the segment files (same O_DIRECT choice).
        let queue_depth = opts.queue_depth.unwrap_or(opts.fetch_threads).max(1);
        if queue_depth > MAX_QUEUE_DEPTH {
            return Err(io_err(
                &dir,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "queue depth {queue_depth} is above the maximum {MAX_QUEUE_DEPTH} \
                         (each unit of depth is a read in flight and a pool thread)"
                    ),
                ),
            ));
        }
        let mut files = Vec::with_capacity(segments.len());
        for (id, s) in segments.iter().enumerate() {
            let path = segment_path(&dir, id as u32);
            let file = s.file.try_clone().map_err(|e| io_err(&path, e))?;
            files.push(EngineFile { path, file });
        }
        let cfg = EngineConfig {
            queue_depth,
            threads: queue_depth,
            pooled_buffers: queue_depth,
            buf_align,
            probe_len: align,
        };
        // Mirrors: their admitted files follow the segments in the engine's file table.
        let router = if opts.mirrors.is_empty() {
            if let Some(w) = opts.disk_weights.as_deref().filter(|w| w.len() != 1) {
                return Err(crate::mirror::fmt_err(
                    "--disk-weights",
                    format!(
                        "{} weights given for 1 drive (no mirrors; the store first, then each \
                         mirror in the order given)",
                        w.len()
                    ),
                ));
            }
            None
        } else {
            let headers: Vec<SegmentHeader> = segments.iter().map(|s| s.header).collect();
            let (router, extra) = crate::mirror::route::open_mirrors(
                &dir,
                store_id,
                manifest.alignment,
                &headers,
                &index,
                io_mode == IoMode::Direct,
                buf_align,
                &opts.mirrors,
                opts.disk_weights.as_deref(),
                opts.stripe_threshold,
            )?;
            files.extend(extra);
            Some(router)
        };
        let (counting, engine_note) =
            open_engine(opts.engine, files, &cfg, &dir).map_err(|e| io_err(&dir, e))?;
        let engine: Arc<dyn IoEngine> = counting.clone();
        let engine = match &opts.engine_wrapper {
            Some(wrap) => wrap(engine),
            None => engine,
        };
        let hash_pool = if queue_depth > 1 && opts.verify_checksums {
            Some(
                rayon::ThreadPoolBuilder::new()
                    // Hashing is CPU work: more threads than CPUs only add switching.
                    .num_threads(
                        queue_depth
                            .min(std::thread::available_parallelism().map_or(1, |n| n.get())),
                    )
                    .thread_name(|i| format!("coli-verify-{i}"))
                    .build()
                    .map_err(|e| io_err(&dir, std::io::Error::other(e.to_string())))?,
            )
        } else {
            None
        };
        let dense_verified = manifest
            .dense
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Ok(Store {
            dir,
            manifest,
            index,
            segments,
            io_mode,
            buf_align,
            verify: opts.verify_checksums,
            dense_map,
            dense_by_name,
            dense_verified,
            dense_encodings,
            engine,
            counting,
            engine_note,
            verify_piece_bytes: opts.verify_piece_bytes,
            hash_pool,
            router,
            reads: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            io_wait_ns: AtomicU64::new(0),
            verify_ns: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
        })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed MANIFEST body.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The model's parsed `config.json` (as embedded in the MANIFEST).
    pub fn model_config(&self) -> &serde_json::Value {
        &self.manifest.config
    }

    /// The bytes of the copied model file `files/NAME` (e.g. `tokenizer.json`), or `None` when
    /// the store has no such file. Size and xxh3 are checked (the checksum only when
    /// `verify_checksums`).
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file cannot be read, [`StoreError::Checksum`] /
    /// [`StoreError::Format`] when its checksum or size differs from the MANIFEST.
    pub fn file(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(e) = self.manifest.files.iter().find(|f| f.name == name) else {
            return Ok(None);
        };
        let rel = format!("files/{name}");
        let bytes = read_file(&self.dir, &rel)?;
        if bytes.len() as u64 != e.size {
            return Err(fmt_err(
                rel,
                format!("{} bytes, MANIFEST says {}", bytes.len(), e.size),
            ));
        }
        if self.verify {
            let found = xxh3_64_with_seed(&bytes, 0);
            let expected = e.xxh3.0;
            if found != expected {
                return Err(StoreError::Checksum {
                    what: format!("file {name}"),
                    file: rel,
                    offset: 0,
                    expected,
                    found,
                });
            }
        }
        Ok(Some(bytes))
    }

    /// Every INDEX record, sorted by (layer, expert).
    pub fn index(&self) -> &[IndexRecord] {
        &self.index
    }

    /// The INDEX record of one expert.
    pub fn record(&self, key: ExpertKey) -> Option<&IndexRecord> {
        self.index
            .binary_search_by_key(&key, |r| r.key())
            .ok()
            .map(|i| &self.index[i])
    }

    /// Reads several experts through the store's I/O engine ([`Store::io_engine`]), up to the
    /// queue depth in flight, each record into an aligned buffer from the engine (an
    /// [`ExpertBuf`] returns its buffer to the engine's pool when dropped, so steady fetching
    /// does not allocate, zero and page-fault a fresh buffer per record). Results are in the
    /// order of `keys`. Each record's xxh3 is verified when `verify_checksums`: in a batch (and
    /// always with the mmap engine) records are read in pieces of
    /// [`OpenOptions::verify_piece_bytes`], each hashed as it lands while the other reads keep
    /// the device busy; a lone record is read with one request and hashed after it lands.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a key not in the store, [`StoreError::Io`] naming the
    /// segment file, the expert, the offset and length on a read error or a short file,
    /// [`StoreError::Checksum`] naming the expert, segment file and offset on a mismatch.
    pub fn fetch(&self, keys: &[ExpertKey]) -> Result<Vec<ExpertBuf>, StoreError> {
        let t0 = Instant::now();
        let r = self.fetch_batch(keys, None);
        self.io_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.fetches.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// Reads one expert (see [`Store::fetch`]).
    ///
    /// # Errors
    /// As [`Store::fetch`].
    pub fn fetch_one(&self, key: ExpertKey) -> Result<ExpertBuf, StoreError> {
        let mut v = self.fetch(&[key])?;
        Ok(v.pop().expect("one key, one buffer"))
    }

    /// Alignment a buffer given to [`Store::fetch_into`] must have, bytes: the store alignment,
    /// at least 4096 (which O_DIRECT on every file system accepts).
    pub fn buffer_alignment(&self) -> usize {
        (self.manifest.alignment as usize).max(self.buf_align)
    }

    /// Reads one expert's record into the caller's buffer `dst`, through the same path as
    /// [`Store::fetch`] (the store's I/O engine, mirrors and their fallbacks, the checksum
    /// verified when `verify_checksums`, the same counters): the engine reads straight into
    /// `dst` (a mirror fallback copies the good copy there). `dst` must be aligned to
    /// [`Store::buffer_alignment`] and hold at least the record's length
    /// (`record(key).length`); its first `length` bytes are then the record (FORMAT.md
    /// section 5), the rest untouched.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a key not in the store; [`StoreError::Io`] with
    /// `InvalidInput` for a buffer too small or misaligned (naming both sizes or alignments);
    /// otherwise as [`Store::fetch`] (on a checksum mismatch `dst` holds the bad bytes).
    pub fn fetch_into(&self, key: ExpertKey, dst: &mut [u8]) -> Result<(), StoreError> {
        let r = self
            .record(key)
            .ok_or_else(|| StoreError::NotFound(format!("expert {key}")))?;
        let len = r.length.get() as usize;
        let align = self.buffer_alignment();
        let invalid = |what: String| StoreError::Io {
            path: self.dir.clone(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidInput, what),
        };
        if dst.len() < len {
            return Err(invalid(format!(
                "buffer of {} bytes is smaller than the {len}-byte record of {key}",
                dst.len()
            )));
        }
        if !(dst.as_ptr() as usize).is_multiple_of(align) {
            return Err(invalid(format!(
                "buffer address {:p} is not aligned to {align} bytes",
                dst.as_ptr()
            )));
        }
        let ptr = std::ptr::NonNull::new(dst.as_mut_ptr()).expect("a slice is never null");
        // SAFETY: `ptr` is valid for writes of `len` <= dst.len() bytes, aligned to `align`
        // (checked above), and `dst` is mutably borrowed for this whole call and not touched
        // while the buffer lives: every read into it completes before `fetch_batch` returns
        // (a queue waits for its reads in flight when dropped), and the ExpertBuf wrapping it is
        // dropped before `dst` is used again below. A borrowed buffer never frees its memory.
        let buf = unsafe { AlignedBuf::borrowed(ptr, len, align) };
        let t0 = Instant::now();
        let got = self.fetch_batch(&[key], Some(buf));
        self.io_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let b = got?.pop().expect("one key, one buffer");
        if b.bytes().as_ptr() != ptr.as_ptr() {
            // A mirror fallback read another copy: bring it into the caller's buffer.
            let bytes = b.bytes().to_vec();
            drop(b);
            dst[..len].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// Reads `keys`; with `caller`, the one key is read into that buffer (over the caller's
    /// memory, [`Store::fetch_into`]) instead of one of the engine's.
    fn fetch_batch(
        &self,
        keys: &[ExpertKey],
        mut caller: Option<AlignedBuf>,
    ) -> Result<Vec<ExpertBuf>, StoreError> {
        debug_assert!(caller.is_none() || keys.len() == 1);
        let recs = keys
            .iter()
            .map(|&k| {
                self.record(k)
                    .ok_or_else(|| StoreError::NotFound(format!("expert {k}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if recs.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(rt) = &self.router {
            return self.fetch_mirrored(rt, keys, &recs, caller);
        }
        let mut q = self.engine.queue().map_err(|e| io_err(&self.dir, e))?;
        let piece_bytes = self
            .verify_piece_bytes
            .unwrap_or_else(|| self.engine.verify_piece_bytes());
        let pieces = self.verify
            && piece_bytes > 0
            && (recs.len() > 1 || self.engine.verify_lone_records_in_pieces());
        let piece_len = if pieces {
            piece_bytes.next_multiple_of(self.manifest.alignment as usize)
        } else {
            0
        };
        for (i, r) in recs.iter().enumerate() {
            let len = r.length.get() as usize;
            let buf = caller
                .take()
                .unwrap_or_else(|| self.engine.buffer(len, self.buf_align));
            let mut req =
                ReadRequest::whole(i as u64, buf, r.segment.get(), r.offset.get(), piece_len);
            if pieces {
                req.progress = Some(Box::new(RecordHasher {
                    h: StreamingChecksum::new(keys[i].checksum_seed(), len),
                    ns: 0,
                }));
            }
            q.submit(req);
        }
        let mut out: Vec<Option<ExpertBuf>> = (0..recs.len()).map(|_| None).collect();
        match &self.hash_pool {
            // Whole records of a batch: each is hashed on the pool as soon as it lands, while
            // this thread keeps reaping (and the engine keeps the rest of the batch in flight).
            Some(pool) if self.verify && !pieces && recs.len() > 1 => {
                let (tx, rx) = std::sync::mpsc::channel();
                let (keys, recs) = (&keys, &recs);
                pool.in_place_scope(|sc| -> Result<(), StoreError> {
                    while let Some(c) = q.wait() {
                        let i = c.tag as usize;
                        let buf = self.landed(keys[i], recs[i], c.result, c.buf)?;
                        let tx = tx.clone();
                        sc.spawn(move |_| {
                            let r = self.verified(keys[i], recs[i], buf, None);
                            // The receiver lives until the scope ends.
                            let _ = tx.send((i, r));
                        });
                    }
                    Ok(())
                })?;
                drop(tx);
                for (i, r) in rx {
                    out[i] = Some(r?);
                }
            }
            _ => {
                while let Some(c) = q.wait() {
                    let i = c.tag as usize;
                    let buf = self.landed(keys[i], recs[i], c.result, c.buf)?;
                    out[i] = Some(self.verified(keys[i], recs[i], buf, c.progress)?);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every request completes once"))
            .collect())
    }

    /// The buffer of a completed read, counted in the stats, or the read's error naming the
    /// file and the expert.
    fn landed(
        &self,
        key: ExpertKey,
        r: &IndexRecord,
        result: Result<(), crate::ReadError>,
        buf: AlignedBuf,
    ) -> Result<AlignedBuf, StoreError> {
        if let Err(e) = result {
            return Err(StoreError::Io {
                path: e.path,
                error: std::io::Error::new(
                    e.error.kind(),
                    format!(
                        "reading the record of {key} ({} bytes at offset {}; failed at offset {}, {} bytes left): {}",
                        r.length.get(),
                        r.offset.get(),
                        e.offset,
                        e.len,
                        e.error
                    ),
                ),
            });
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf)
    }

    /// Verifies a landed record's checksum (finishing the streaming hash of its progress
    /// observer when it has one) and wraps it.
    fn verified(
        &self,
        key: ExpertKey,
        r: &IndexRecord,
        buf: AlignedBuf,
        progress: Option<Box<dyn ReadProgress>>,
    ) -> Result<ExpertBuf, StoreError> {
        if self.verify {
            let t = Instant::now();
            let (found, ns) = match progress.map(|p| p.into_any().downcast::<RecordHasher>()) {
                Some(Ok(h)) => {
                    let ns = h.ns;
                    (h.h.finish(&buf), ns)
                }
                _ => (
                    crate::checksum::xxh3_64_with_seed(&buf, key.checksum_seed()),
                    0,
                ),
            };
            self.verify_ns
                .fetch_add(ns + t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if found != r.checksum.get() {
                return Err(StoreError::Checksum {
                    what: key.to_string(),
                    file: self.segments[r.segment.get() as usize].rel.clone(),
                    offset: r.offset.get(),
                    expected: r.checksum.get(),
                    found,
                });
            }
        }
        let encoding =
            Encoding::from_id(r.encoding.get(), r.group_size.get()).expect("checked at open");
        let (hidden, intermediate) = (r.hidden.get() as usize, r.intermediate.get() as usize);
        Ok(ExpertBuf {
            key,
            encoding,
            hidden,
            intermediate,
            layout: RecordLayout::new(encoding, hidden, intermediate),
            buf,
        })
    }

    /// A dense tensor by name, borrowed from the memory map of `dense.bin`. Its xxh3 is checked
    /// at the first access (when `verify_checksums`); later accesses do not re-check.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for an unknown name, [`StoreError::Checksum`] naming the tensor
    /// on a mismatch.
    pub fn dense(&self, name: &str) -> Result<DenseTensor<'_>, StoreError> {
        let &i = self
            .dense_by_name
            .get(name)
            .ok_or_else(|| StoreError::NotFound(format!("dense tensor {name}")))?;
        let e = &self.manifest.dense[i];
        let map: &[u8] = self.dense_map.as_deref().unwrap_or(&[]);
        let data = &map[e.offset as usize..(e.offset + e.length) as usize];
        let sbytes = &map[e.scales_offset as usize..(e.scales_offset + e.scales_length) as usize];
        if self.verify && !self.dense_verified[i].load(Ordering::Acquire) {
            let mut h = Xxh3::with_seed(xxh3_64_with_seed(e.name.as_bytes(), 0));
            h.update(data);
            h.update(sbytes);
            let found = h.digest();
            let expected = e.xxh3.0;
            if found != expected {
                return Err(StoreError::Checksum {
                    what: format!("dense tensor {name}"),
                    file: "dense.bin".into(),
                    offset: e.offset,
                    expected,
                    found,
                });
            }
            self.dense_verified[i].store(true, Ordering::Release);
        }
        Ok(DenseTensor {
            name: &e.name,
            encoding: self.dense_encodings[i],
            shape: &e.shape,
            data,
            scales: as_f32s(sbytes),
        })
    }

    /// True when the store has a dense tensor of that name.
    pub fn has_dense(&self, name: &str) -> bool {
        self.dense_by_name.contains_key(name)
    }

    /// How expert records are read (O_DIRECT or buffered).
    pub fn io_mode(&self) -> IoMode {
        self.io_mode
    }

    /// The name of the I/O engine that actually reads expert records (with
    /// [`IoEngineChoice::Auto`], `pread` when io_uring was refused; see
    /// [`Store::io_engine_note`]).
    pub fn io_engine(&self) -> &'static str {
        self.engine.name()
    }

    /// What the store's I/O engine read since open: requests, bytes and failures, counted by
    /// the [`CountingEngine`] around it (a striped record is several requests; mirror
    /// fallback reads outside the engine are not counted). [`Store::stats`] counts records.
    pub fn engine_stats(&self) -> EngineStats {
        self.counting.stats()
    }

    /// Why the engine differs from the one asked for (io_uring refused and the pread engine
    /// used instead), or `None`.
    pub fn io_engine_note(&self) -> Option<&str> {
        self.engine_note.as_deref()
    }

    /// A one-line description of the engine: kind, queue depth, threads or rings, registration.
    pub fn io_engine_description(&self) -> String {
        self.engine.describe()
    }

    /// Expert reads in flight at once per fetch call.
    pub fn queue_depth(&self) -> usize {
        self.engine.queue_depth()
    }

    /// The store's I/O engine, for readers of segment files beyond [`Store::fetch`] (its file
    /// table is the segment files, `FileId` = segment id).
    pub fn io_engine_handle(&self) -> &Arc<dyn IoEngine> {
        &self.engine
    }

    /// Reads, bytes read, time in fetch calls and hashing since open.
    pub fn stats(&self) -> FetchStats {
        FetchStats {
            reads: self.reads.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            io_wait_ns: self.io_wait_ns.load(Ordering::Relaxed),
            verify_ns: self.verify_ns.load(Ordering::Relaxed),
            fetches: self.fetches.load(Ordering::Relaxed),
        }
    }

    /// Mirror counters (per drive bytes and reads, striped reads, fallbacks, checksum
    /// failures); `None` when the store was opened without mirrors.
    pub fn mirror_stats(&self) -> Option<crate::mirror::MirrorStats> {
        self.router.as_ref().map(|r| r.stats())
    }

    /// [`Store::fetch`] through mirrors (docs/MIRRORS.md): each record from its assigned drive,
    /// a single record at or above the stripe threshold striped over its holders; every copy
    /// read from a mirror is verified (the primary's when `verify_checksums`); a read error,
    /// short read or checksum mismatch falls back to another copy (a striped read first
    /// verifies each copy's whole record, to blame only the damaged one).
    fn fetch_mirrored(
        &self,
        rt: &crate::mirror::route::Router,
        keys: &[ExpertKey],
        recs: &[&IndexRecord],
        mut caller: Option<AlignedBuf>,
    ) -> Result<Vec<ExpertBuf>, StoreError> {
        let mut q = self.engine.queue().map_err(|e| io_err(&self.dir, e))?;
        // Per request: the position in INDEX and the (drive, bytes) it reads.
        let mut plan: Vec<(usize, Vec<(u32, u64)>)> = Vec::with_capacity(recs.len());
        // Striped reads already read (pool engines, see `read_split`).
        let mut prepared: Vec<crate::Completion> = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            let len = r.length.get() as usize;
            let pos = self
                .index
                .binary_search_by_key(&keys[i], |x| x.key())
                .expect("fetched keys are in INDEX");
            let buf = caller
                .take()
                .unwrap_or_else(|| self.engine.buffer(len, self.buf_align));
            // A single cold read is striped; a batch already keeps the drives busy through
            // the per-expert assignment.
            let striped = if recs.len() == 1 {
                rt.stripe(pos, len as u64)
            } else {
                None
            };
            if let Some(st) = striped {
                rt.count_striped();
                plan.push((pos, st.iter().map(|(d, p)| (*d, p.len as u64)).collect()));
                let pieces: Vec<crate::ReadPiece> = st.into_iter().map(|(_, p)| p).collect();
                if self.engine.concurrent_pieces() {
                    // io_uring reads the pieces of one request concurrently.
                    q.submit(ReadRequest {
                        tag: i as u64,
                        buf,
                        pieces,
                        progress: None,
                    });
                } else {
                    // The pool engines read a request's pieces one after the other: one
                    // request per piece puts them all in flight, then they are assembled.
                    prepared.push(self.read_split(&mut *q, i as u64, buf, &pieces));
                }
            } else {
                let src = rt.choose(pos);
                plan.push((pos, vec![(src.drive, len as u64)]));
                q.submit(ReadRequest::whole(i as u64, buf, src.file, src.offset, 0));
            }
        }
        let mut out: Vec<Option<ExpertBuf>> = (0..recs.len()).map(|_| None).collect();
        while let Some(c) = prepared.pop().or_else(|| q.wait()) {
            let i = c.tag as usize;
            let (key, r) = (keys[i], recs[i]);
            let (pos, used) = &plan[i];
            let (seed, expected) = (key.checksum_seed(), r.checksum.get());
            let len = r.length.get() as usize;
            let mut buf = c.buf;
            let fault: Option<(bool, String)> = match &c.result {
                Err(e) => Some((false, e.to_string())),
                Ok(()) if self.verify || used.iter().any(|(d, _)| *d != 0) => {
                    let t = Instant::now();
                    let found = crate::checksum::xxh3_64_with_seed(&buf, seed);
                    self.verify_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    (found != expected).then(|| {
                        (
                            true,
                            format!("{key} fails its checksum (expected {expected:016x}, found {found:016x})"),
                        )
                    })
                }
                Ok(()) => None,
            };
            match fault {
                None => {
                    for (d, n) in used {
                        rt.count_read(*d, *n);
                    }
                }
                Some((checksum, what)) => {
                    let drives: Vec<u32> = used.iter().map(|(d, _)| *d).collect();
                    let good = if drives.len() > 1 {
                        rt.verify_copies(*pos, &drives, len, self.buf_align, seed, expected)
                            .or_else(|| {
                                rt.fallback(*pos, &drives, len, self.buf_align, seed, expected)
                            })
                    } else {
                        rt.fault(drives[0], checksum, &what);
                        rt.fallback(*pos, &drives, len, self.buf_align, seed, expected)
                    };
                    match good {
                        Some((_, b)) => buf = b,
                        None if checksum => {
                            return Err(StoreError::Checksum {
                                what: format!("{key} (every copy)"),
                                file: self.segments[r.segment.get() as usize].rel.clone(),
                                offset: r.offset.get(),
                                expected,
                                found: crate::checksum::xxh3_64_with_seed(&buf, seed),
                            })
                        }
                        None => {
                            return Err(StoreError::Io {
                                path: rt.path(r.segment.get()).to_path_buf(),
                                error: std::io::Error::other(format!(
                                    "reading the record of {key}: every copy failed; first: {what}"
                                )),
                            })
                        }
                    }
                }
            }
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
            let encoding =
                Encoding::from_id(r.encoding.get(), r.group_size.get()).expect("checked at open");
            let (hidden, intermediate) = (r.hidden.get() as usize, r.intermediate.get() as usize);
            out[i] = Some(ExpertBuf {
                key,
                encoding,
                hidden,
                intermediate,
                layout: RecordLayout::new(encoding, hidden, intermediate),
                buf,
            });
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every request completes once"))
            .collect())
    }

    /// Reads `pieces` (of one record, into `buf` at their buffer offsets) as one request per
    /// piece, all in flight at once on `q` (which must have nothing else outstanding), then
    /// copies them into `buf`; returns the completion of the whole record as tag `tag`.
    fn read_split(
        &self,
        q: &mut dyn crate::IoQueue,
        tag: u64,
        mut buf: AlignedBuf,
        pieces: &[crate::ReadPiece],
    ) -> crate::Completion {
        for (k, p) in pieces.iter().enumerate() {
            q.submit(ReadRequest::whole(
                k as u64,
                self.engine.buffer(p.len, self.buf_align),
                p.file,
                p.file_offset,
                0,
            ));
        }
        let mut result = Ok(());
        while let Some(c) = q.wait() {
            let p = &pieces[c.tag as usize];
            match c.result {
                Ok(()) => {
                    buf.as_mut_slice()[p.buf_offset..p.buf_offset + p.len].copy_from_slice(&c.buf)
                }
                Err(mut e) => {
                    e.tag = tag;
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
            }
        }
        crate::Completion {
            tag,
            buf,
            progress: None,
            result,
        }
    }

    /// The open segment files (for fsck).
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The whole of dense.bin (empty when it is empty).
    pub(crate) fn dense_bytes(&self) -> &[u8] {
        self.dense_map.as_deref().unwrap_or(&[])
    }

    /// The alignment of fetch buffers, bytes.
    pub(crate) fn buf_align(&self) -> usize {
        self.buf_align
    }
}

impl ExpertBuf {
    fn view(&self, i: usize) -> MatrixView<'_> {
        let (w_off, wb, s_off, sb) = self.layout.sections[i];
        let (rows, cols) = if i == 2 {
            (self.hidden, self.intermediate)
        } else {
            (self.intermediate, self.hidden)
        };
        MatrixView::new(
            self.encoding,
            rows,
            cols,
            &self.buf[w_off..w_off + wb],
            as_f32s(&self.buf[s_off..s_off + sb]),
        )
        .expect("record sections follow RecordLayout (checked at open)")
    }

    /// The gate projection, [I, H] (rows = intermediate features, cols = hidden).
    pub fn gate(&self) -> MatrixView<'_> {
        self.view(0)
    }

    /// The up projection, [I, H].
    pub fn up(&self) -> MatrixView<'_> {
        self.view(1)
    }

    /// The down projection, [H, I].
    pub fn down(&self) -> MatrixView<'_> {
        self.view(2)
    }

    /// Bytes of the record as read (payload plus padding to the store alignment).
    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    /// The raw record bytes (FORMAT.md section 5), padding included.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

impl<'a> DenseTensor<'a> {
    /// The tensor as a matrix view: `[n]` vectors as [1, n], `[rows, cols]` as is.
    pub fn matrix(&self) -> MatrixView<'a> {
        let (rows, cols) = match *self.shape {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => unreachable!("checked at open"),
        };
        MatrixView::new(self.encoding, rows, cols, self.data, self.scales)
            .expect("dense sections have their encoding's lengths (checked at open)")
    }

    /// Dequantizes the whole tensor to f32, row-major (`rows * cols` values), with
    /// [`MatrixView::dequantize_row`].
    pub fn to_f32(&self) -> Vec<f32> {
        let m = self.matrix();
        let mut out = vec![0f32; m.rows() * m.cols()];
        if m.cols() > 0 {
            for (r, row) in out.chunks_exact_mut(m.cols()).enumerate() {
                m.dequantize_row(r, row);
            }
        }
        out
    }
}

impl PrimaryInfo {
    /// Collects the identity of an open store (its segment headers are re-read: 64 bytes each).
    ///
    /// # Errors
    /// [`StoreError::Io`] when a primary segment header cannot be read.
    pub fn of(store: &Store) -> Result<PrimaryInfo, StoreError> {
        let m = store.manifest();
        let store_id = m.store_id;
        let mut segments = Vec::with_capacity(m.segment_count as usize);
        for id in 0..m.segment_count {
            let p = segment_path(store.dir(), id);
            let f = File::open(&p).map_err(|e| io_err(&p, e))?;
            let mut b = [0u8; SEGMENT_HEADER_FIELDS];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 0).map_err(|e| io_err(&p, e))?;
            let h = SegmentHeader::read_from_bytes(&b).expect("64 bytes");
            segments.push(PrimarySegment {
                id,
                file_len: h.file_len.get(),
                body_xxh3: h.body_xxh3.get(),
                header_crc: h.crc.get(),
            });
        }
        Ok(PrimaryInfo {
            dir: store.dir().to_path_buf(),
            store_id,
            alignment: m.alignment,
            segments,
            index: store.index().to_vec(),
        })
    }
}
