//! Appending entries: expert records to the segment files (rolled at the size limit), dense
//! tensors to dense.bin, model files to `files/`; each checksummed while it streams and
//! journaled after it is written.

use super::journal::JournalEntry;
use super::{io_err, valid_file_name, writer_err, EncodedMatrix, StoreWriter};
use super::{ClosedSegment, OpenSegment};
use crate::{failpoint, DenseEntry, Encoding, ExpertKey, FileEntry, StoreError, Xxh3Sum};
use coli_format::disk::index::{IndexRecord, RecordPlace};
use coli_format::disk::names::segment_path;
use coli_format::encoding::{align_up, SECTION_ALIGN};
use coli_format::{MatrixView, RecordLayout};
use std::fs::File;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};
use zerocopy::IntoBytes;

pub(super) fn check_matrix(
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
    let (found, other) = if m.encoding.has_f32_scales() {
        (m.scales.len(), m.e8m0_scales.len())
    } else {
        (m.e8m0_scales.len(), m.scales.len())
    };
    if found != sc || other != 0 {
        return Err(writer_err(format!(
            "{what}: {found} scales ({other} of the wrong kind), expected {sc} for {} [{rows}, {cols}]",
            m.encoding.name()
        )));
    }
    if let Some(e8m0) = m.e8m0_scales.iter().position(|&e| e == 255) {
        return Err(writer_err(format!(
            "{what}: e8m0 scale {e8m0} is the NaN code 255"
        )));
    }
    if let Some(b) = &m.bias {
        if b.len() != rows {
            return Err(writer_err(format!(
                "{what}: bias of {} values, expected {rows}",
                b.len()
            )));
        }
    }
    Ok(())
}

/// Starts writing `len` bytes at `offset` of `file` to disk now, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, Linux), so that a large conversion's writes
/// overlap with its reads instead of piling up for the final fsync. Advice only: errors are
/// ignored (durability still comes from the fsyncs in `finish`).
pub(super) fn start_writeback(file: &File, offset: u64, len: usize) {
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

impl StoreWriter {
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

    pub(super) fn add_expert_inner(
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
        // One encoding for the three, or ggml block types that may differ per matrix
        // (format version 4: a GGUF's tensors as published).
        let encs = mats.map(|m| m.encoding);
        let per_matrix = encs.iter().all(|e| matches!(e, Encoding::Ggml(_)));
        let want = |e: Encoding| if per_matrix { Some(e) } else { Some(enc) };
        check_matrix(
            &format!("{key} gate"),
            mats[0],
            inter,
            hidden,
            want(encs[0]),
        )?;
        check_matrix(&format!("{key} up"), mats[1], inter, hidden, want(encs[1]))?;
        check_matrix(
            &format!("{key} down"),
            mats[2],
            hidden,
            inter,
            want(encs[2]),
        )?;
        let encs = if per_matrix { encs } else { [enc; 3] };
        let biases = mats[0].bias.is_some();
        if mats.iter().any(|m| m.bias.is_some() != biases) {
            return Err(writer_err(format!(
                "{key}: either all three matrices have a bias or none has"
            )));
        }
        let layout = RecordLayout::mixed(encs, hidden, inter, biases);
        let alignment = self.spec.alignment;
        let rec_len = layout.record_len(alignment);
        let mut rec = vec![0u8; rec_len];
        for (i, (m, &(w_off, wb, s_off, sb))) in mats.iter().zip(layout.sections.iter()).enumerate()
        {
            rec[w_off..w_off + wb].copy_from_slice(&m.data);
            if sb > 0 {
                rec[s_off..s_off + sb].copy_from_slice(m.scale_section());
            }
            if let Some(b) = &m.bias {
                let (b_off, bb) = layout.biases[i];
                rec[b_off..b_off + bb].copy_from_slice(b.as_bytes());
            }
        }
        // The interleaved record order (format version 7): the matrices that have that order
        // in it, the others row-major; the flag only where a matrix was reordered.
        let mut interleaved = false;
        if self.spec.matrix_order == crate::MatrixOrder::Interleaved {
            for (m, &(w_off, wb, s_off, sb)) in mats.iter().zip(layout.sections.iter()) {
                if !MatrixView::can_interleave(m.encoding, m.rows, m.cols) {
                    continue;
                }
                // The scale section follows the weight section (section 5).
                let (w, s) = rec.split_at_mut(s_off);
                MatrixView::interleave(
                    m.encoding,
                    m.rows,
                    m.cols,
                    &mut w[w_off..w_off + wb],
                    &mut s[..sb],
                );
                interleaved = true;
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
            biases,
            ggml_up_down: per_matrix.then(|| [encs[1].group_size(), encs[2].group_size()]),
            interleaved,
            checksum: Xxh3Sum(sum),
        })?;
        failpoint::hit_nth("writer.after_journal", self.records_this_run);
        self.index.push(IndexRecord::new(RecordPlace {
            key,
            segment: seg_id,
            encodings: encs,
            offset,
            length: rec_len as u64,
            payload_len: layout.payload_len as u64,
            hidden: hidden as u32,
            intermediate: inter as u32,
            biases,
            interleaved,
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

    pub(super) fn add_dense_inner(
        &mut self,
        name: &str,
        shape: &[usize],
        m: &EncodedMatrix,
    ) -> Result<(), StoreError> {
        let Some((rows, cols)) = coli_format::matrix_dims(shape) else {
            return Err(writer_err(format!(
                "dense tensor {name}: shape {shape:?} must have at least 1 dimension"
            )));
        };
        if name.is_empty() {
            return Err(writer_err("dense tensor with an empty name"));
        }
        check_matrix(&format!("dense tensor {name}"), m, rows, cols, None)?;
        if !m.encoding.has_f32_scales() || m.bias.is_some() {
            return Err(writer_err(format!(
                "dense tensor {name}: {}{} is not a dense encoding (FORMAT.md section 7)",
                m.encoding.name(),
                if m.bias.is_some() { " with a bias" } else { "" }
            )));
        }
        // The interleaved order (format version 7) for a matrix that has one, as for records.
        let interleaved = self.spec.matrix_order == crate::MatrixOrder::Interleaved
            && MatrixView::can_interleave(m.encoding, rows, cols);
        let (data, sbytes): (std::borrow::Cow<'_, [u8]>, std::borrow::Cow<'_, [u8]>) =
            if interleaved {
                let (mut w, mut s) = (m.data.clone(), m.scales.as_bytes().to_vec());
                MatrixView::interleave(m.encoding, rows, cols, &mut w, &mut s);
                (w.into(), s.into())
            } else {
                (m.data.as_slice().into(), m.scales.as_bytes().into())
            };
        let seed = xxh3_64_with_seed(name.as_bytes(), 0);
        let mut h = Xxh3::with_seed(seed);
        h.update(&data);
        h.update(&sbytes);
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
        span[rel(offset)..rel(offset) + data.len()].copy_from_slice(&data);
        if !sbytes.is_empty() {
            span[rel(scales_offset)..rel(end)].copy_from_slice(&sbytes);
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
            interleaved,
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

    pub(super) fn add_file_inner(&mut self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
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
}
