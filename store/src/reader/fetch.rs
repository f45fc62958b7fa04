//! Reading expert records through the I/O engine: [`Store::fetch`], [`Store::fetch_into`],
//! and the checksum of what landed (streamed per piece or whole).

use super::views::ExpertBuf;
use super::{io_err, Store};
use crate::checksum::StreamingChecksum;
use crate::io::{ReadProgress, ReadRequest};
use crate::{AlignedBuf, ExpertKey, IndexRecord, StoreError};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Feeds a record's checksum as its pieces land (see [`ReadProgress`]).
pub(super) struct RecordHasher {
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

impl Store {
    /// Reads several experts through the store's I/O engine ([`Store::io_engine`]), up to the
    /// queue depth in flight, each record into an aligned buffer from the engine (an
    /// [`ExpertBuf`] returns its buffer to the engine's pool when dropped, so steady fetching
    /// does not allocate, zero and page-fault a fresh buffer per record). Results are in the
    /// order of `keys`. Each record's xxh3 is verified when `verify_checksums`: in a batch (and
    /// always with the mmap engine) records are read in pieces of
    /// [`crate::OpenOptions::verify_piece_bytes`], each hashed as it lands while the other reads keep
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
    pub(super) fn fetch_batch(
        &self,
        keys: &[ExpertKey],
        mut caller: Option<AlignedBuf>,
    ) -> Result<Vec<ExpertBuf>, StoreError> {
        debug_assert!(caller.is_none() || keys.len() == 1);
        let recs = self.records_of(keys)?;
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
    pub(super) fn landed(
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
    pub(super) fn verified(
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
                return Err(self.checksum_error(key, r, found));
            }
        }
        Ok(ExpertBuf::of_record(key, r, buf.into()))
    }

    /// The error of a record of `key` (INDEX record `r`) whose bytes hash to `found`: the
    /// expert, its segment file and offset, both checksums.
    pub(super) fn checksum_error(&self, key: ExpertKey, r: &IndexRecord, found: u64) -> StoreError {
        StoreError::Checksum {
            what: key.to_string(),
            file: self.segments[r.segment.get() as usize].rel.clone(),
            offset: r.offset.get(),
            expected: r.checksum.get(),
            found,
        }
    }

    /// The INDEX records of `keys`, in their order.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] for a key not in the store.
    pub(super) fn records_of(&self, keys: &[ExpertKey]) -> Result<Vec<&IndexRecord>, StoreError> {
        keys.iter()
            .map(|&k| {
                self.record(k)
                    .ok_or_else(|| StoreError::NotFound(format!("expert {k}")))
            })
            .collect()
    }
}
