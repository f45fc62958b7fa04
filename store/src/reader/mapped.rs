//! Expert records used in place in the page cache: [`Store::map_records`].
//!
//! A record read into a buffer the process owns costs the kernel a zeroed page for every 4 KiB
//! of it before the read fills it (anonymous memory is always zeroed when first touched); a
//! record held as shared, read-only file pages is filled by the read alone. Engines pin the
//! records they keep for the whole run (a preloaded model, the hot set) this way when the
//! records are stored in the order their kernels read (format version 7, interleaved), so the
//! bytes need no reordering in memory.

use super::views::{ExpertBuf, MappedRecord};
use super::Store;
use crate::{ExpertKey, StoreError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Store {
    /// The records of `keys` as views of shared read-only maps of their segment files (the
    /// page cache), in the order of `keys`, read before this returns (the kernel is asked to
    /// read the batch ahead, `MADV_WILLNEED`, then each record's pages are populated,
    /// `MADV_POPULATE_READ` from Linux 5.14), each record's xxh3 verified over the mapped bytes
    /// when `verify_checksums`. Counted in [`Store::stats`] as reads. Their bytes are the records as stored: an [`ExpertBuf::interleave`] or
    /// [`ExpertBuf::deinterleave`] on one copies it into a buffer of its own first.
    ///
    /// A store opened with mirrors or an engine wrapper, or a segment file that cannot be
    /// mapped, reads through [`Store::fetch`] instead (the same bytes in owned buffers): mirror
    /// fallbacks and wrapped engines see every read. The pages stay the file's: the kernel may
    /// drop them under memory pressure and read them again when they are next used (a
    /// truncated segment file then raises `SIGBUS`, as for dense.bin's map: published files
    /// are immutable, FORMAT.md section 1).
    ///
    /// # Errors
    /// As [`Store::fetch`]: [`StoreError::NotFound`], [`StoreError::Io`] naming the segment
    /// file, the expert, offset and length when populating the pages fails (a read error),
    /// [`StoreError::Checksum`] naming the expert, segment file and offset.
    pub fn map_records(&self, keys: &[ExpertKey]) -> Result<Vec<ExpertBuf>, StoreError> {
        let recs = self.records_of(keys)?;
        if !self.maps_records {
            return self.fetch(keys);
        }
        let maps = recs
            .iter()
            .map(|r| self.segment_map(r.segment.get() as usize))
            .collect::<Option<Vec<_>>>();
        let Some(maps) = maps else {
            return self.fetch(keys);
        };
        let t0 = Instant::now();
        // Ask for the whole batch first: the kernel reads ahead while the records are hashed.
        for (r, m) in recs.iter().zip(&maps) {
            let (off, len) = (r.offset.get() as usize, r.length.get() as usize);
            // A hint; its failure only loses readahead.
            let _ = m.advise_range(memmap2::Advice::WillNeed, off, len);
        }
        let mut out = Vec::with_capacity(keys.len());
        for ((&key, r), map) in keys.iter().zip(&recs).zip(maps) {
            let (off, len) = (r.offset.get() as usize, r.length.get() as usize);
            match map.advise_range(memmap2::Advice::PopulateRead, off, len) {
                // EINVAL: a kernel before 5.14; the hash (or the first use) faults them in.
                Err(e) if e.raw_os_error() != Some(libc::EINVAL) => {
                    let seg = &self.segments[r.segment.get() as usize];
                    return Err(StoreError::Io {
                        path: self.dir.join(&seg.rel),
                        error: std::io::Error::new(
                            e.kind(),
                            format!("reading the record of {key} ({len} bytes at offset {off}) through its map: {e}"),
                        ),
                    });
                }
                _ => {}
            }
            let bytes = &map[off..off + len];
            if self.verify {
                let t = Instant::now();
                let found = crate::checksum::xxh3_64_with_seed(bytes, key.checksum_seed());
                self.verify_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if found != r.checksum.get() {
                    return Err(self.checksum_error(key, r, found));
                }
            }
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
            out.push(ExpertBuf::of_record(
                key,
                r,
                MappedRecord::new(map, off, len).into(),
            ));
        }
        self.io_wait_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.fetches.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// The shared read-only map of segment `id`, made at first use; `None` when the file
    /// cannot be mapped.
    fn segment_map(&self, id: usize) -> Option<Arc<memmap2::Mmap>> {
        self.segment_maps[id]
            .get_or_init(|| {
                let s = &self.segments[id];
                // SAFETY: published segment files are immutable (FORMAT.md section 1) and the
                // map is read-only; their length was checked at open. A file truncated while
                // mapped raises SIGBUS on access, the contract dense.bin's map has too.
                let m = unsafe { memmap2::Mmap::map(&s.file) }.ok()?;
                (m.len() as u64 == s.len).then(|| Arc::new(m))
            })
            .clone()
    }
}
