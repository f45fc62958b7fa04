//! Opening a store: [`OpenOptions`] and [`Store::open_with`], which validates the MANIFEST,
//! INDEX, segment headers and dense.bin before anything is read, and builds the I/O engine.

use super::{fmt_err, io_err, read_file, Segment, Store};
use crate::io::{
    open_engine, open_read, probe_direct, read_aligned, EngineConfig, EngineFile, IoEngine,
    IoEngineChoice,
};
use crate::{AlignedBuf, IoMode, IoPreference, Manifest, StoreError};
use coli_format::disk::index::parse_index;
use coli_format::disk::names;
use coli_format::disk::names::{segment_path, segment_rel};
use coli_format::disk::segment::SegmentHeader;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64_with_seed;

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
    /// and field for structural damage, [`StoreError::Format`] (`FormatError::NewerVersion`) for a newer store, [`StoreError::Incomplete`]
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
                return Err(StoreError::Options(format!(
                    "O_DIRECT was requested with the {name} engine, which always reads through \
                     the page cache; choose another engine or buffered I/O"
                )));
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
            return Err(StoreError::Options(format!(
                "queue depth {queue_depth} is above the maximum {MAX_QUEUE_DEPTH} \
                 (each unit of depth is a read in flight and a pool thread)"
            )));
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
        let dense_copies = (0..manifest.dense.len())
            .map(|_| Default::default())
            .collect();
        let segment_maps = (0..segments.len()).map(|_| Default::default()).collect();
        let maps_records = router.is_none() && opts.engine_wrapper.is_none();
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
            dense_copies,
            segment_maps,
            maps_records,
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
}
