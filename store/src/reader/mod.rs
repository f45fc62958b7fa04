//! The open store: [`Store`] and its accessors. One job per file:
//! - [`open`]: [`OpenOptions`] and [`Store::open_with`] (validation of every on-disk structure,
//!   the I/O engine, mirrors);
//! - [`fetch`]: [`Store::fetch`] / [`Store::fetch_into`] through the I/O engine, checksums;
//! - [`mapped`]: [`Store::map_records`], records used in place in the page cache;
//! - [`mirrored`]: the fetch path through mirrors (per-expert drives, striping, fallbacks);
//! - [`views`]: [`ExpertBuf`] and [`DenseTensor`], typed views of what was read.

mod fetch;
mod mapped;
mod mirrored;
mod open;
mod views;

pub use open::{EngineWrapper, OpenOptions, MAX_QUEUE_DEPTH};
pub use views::{DenseTensor, ExpertBuf, Reorder};

use crate::io::{CountingEngine, EngineStats, IoEngine};
use crate::mirror::primary::{PrimaryInfo, PrimarySegment};
use crate::{Encoding, ExpertKey, IndexRecord, IoMode, Manifest, StoreError};
use coli_format::disk::names::segment_path;
use coli_format::disk::segment::SegmentHeader;
use coli_format::disk::SEGMENT_HEADER_FIELDS;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64_with_seed;
use zerocopy::FromBytes;

#[cfg(target_endian = "big")]
compile_error!(
    "coli-store reads little-endian f32/u16 sections in place and needs a little-endian target"
);

/// Counters of expert reads since open.
///
/// Disk throughput is `bytes_read / io_wait_ns` (bytes per ns = GB/s) as seen by the callers;
/// `io_wait_ns` minus `verify_ns` bounds the time blocked on the device alone from above.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Expert records read.
    pub reads: u64,
    /// Bytes read from segment files (a record mapped by [`Store::map_records`] counts whole,
    /// whether the page cache held it or not).
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
    /// Copies of dense weight sections in the order they are not stored in
    /// ([`Store::dense_ordered`]), made once.
    dense_copies: Vec<std::sync::OnceLock<crate::AlignedBuf>>,
    /// Shared read-only maps of the segment files for [`Store::map_records`], made at first use
    /// (`None` where mapping failed).
    segment_maps: Vec<std::sync::OnceLock<Option<Arc<memmap2::Mmap>>>>,
    /// Whether [`Store::map_records`] maps (no mirrors, no engine wrapper) or reads.
    maps_records: bool,
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

fn fmt_err(file: impl Into<String>, what: impl Into<String>) -> StoreError {
    StoreError::format(file, what)
}

fn io_err(path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        error: source,
    }
}

/// Reads a whole small file, naming it in errors.
fn read_file(dir: &Path, rel: &str) -> Result<Vec<u8>, StoreError> {
    let p = dir.join(rel);
    std::fs::read(&p).map_err(|e| io_err(&p, e))
}

impl Store {
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

    /// The drive an unstriped read of `key` goes to now: 0 for the primary (always, for a
    /// store opened without mirrors), k for the k-th mirror in the order given; the assignment
    /// is deterministic and weighted ([`crate::mirror::assign::assign`]) and skips drives that left
    /// the rotation. A record at or above the stripe threshold is read in pieces from all of
    /// its holders instead. `None` for a key not in the store.
    pub fn drive_of(&self, key: ExpertKey) -> Option<u32> {
        let pos = self.index.binary_search_by_key(&key, |r| r.key()).ok()?;
        Some(self.router.as_ref().map_or(0, |r| r.drive_of(pos)))
    }

    /// The longest expert record, bytes (0 for a store without experts): the buffer one read
    /// needs at most.
    pub fn largest_record_len(&self) -> u64 {
        self.index.iter().map(|r| r.length.get()).max().unwrap_or(0)
    }

    /// How expert records are read (O_DIRECT or buffered).
    pub fn io_mode(&self) -> IoMode {
        self.io_mode
    }

    /// The name of the I/O engine that actually reads expert records (with
    /// [`crate::IoEngineChoice::Auto`], `pread` when io_uring was refused; see
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
