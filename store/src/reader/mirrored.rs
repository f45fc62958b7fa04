//! The fetch path through mirrors (docs/MIRRORS.md): each record from its assigned drive,
//! striping of single cold reads, verification and fallback to another copy.

use super::views::ExpertBuf;
use super::{io_err, Store};
use crate::io::ReadRequest;
use crate::{AlignedBuf, ExpertKey, IndexRecord, StoreError};
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Store {
    /// [`Store::fetch`] through mirrors (docs/MIRRORS.md): each record from its assigned drive,
    /// a single record at or above the stripe threshold striped over its holders; every copy
    /// read from a mirror is verified (the primary's when `verify_checksums`); a read error,
    /// short read or checksum mismatch falls back to another copy (a striped read first
    /// verifies each copy's whole record, to blame only the damaged one).
    pub(super) fn fetch_mirrored(
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
            out[i] = Some(ExpertBuf::of_record(key, r, buf.into()));
        }
        Ok(out
            .into_iter()
            .map(|b| b.expect("every request completes once"))
            .collect())
    }

    /// Reads `pieces` (of one record, into `buf` at their buffer offsets) as one request per
    /// piece, all in flight at once on `q` (which must have nothing else outstanding), then
    /// copies them into `buf`; returns the completion of the whole record as tag `tag`.
    pub(super) fn read_split(
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
}
