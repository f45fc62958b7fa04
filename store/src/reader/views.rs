//! Typed views of what was read: [`ExpertBuf`] (one expert record) and [`DenseTensor`] (a
//! dense tensor in the memory map of dense.bin).

use super::Store;
use crate::{AlignedBuf, Encoding, ExpertKey, MatrixView, RecordLayout, StoreError};
use std::sync::atomic::Ordering;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};
use zerocopy::FromBytes;

/// How [`ExpertBuf::interleave`] and [`Store::dense_ordered`] reorder a matrix's weight and
/// scale sections in memory: [`MatrixView::interleave`] (the definition) or a faster function
/// giving the same bytes (`coli_kernels::interleave_sections`).
pub type Reorder = fn(Encoding, usize, usize, &mut [u8], &mut [u8]);

/// One fetched expert: its record bytes in an aligned buffer, with typed views of its matrices.
///
/// `ExpertBuf` is `Send + Sync` (engines keep `Arc<ExpertBuf>` in caches).
pub struct ExpertBuf {
    /// Which expert.
    pub key: ExpertKey,
    /// Its encoding (the gate's, when a ggml record's matrices differ: [`ExpertBuf::encodings`]).
    pub encoding: Encoding,
    /// The encodings of gate, up and down: all [`ExpertBuf::encoding`], except in a record of
    /// ggml block types copied from a GGUF, whose matrices may differ (format version 4).
    pub encodings: [Encoding; 3],
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    pub(super) layout: RecordLayout,
    pub(super) buf: RecordBytes,
    /// Which of gate, up, down are in the interleaved row order: stored so (INDEX flag bit 1,
    /// format version 7) or reordered by [`ExpertBuf::interleave`], and not reordered back by
    /// [`ExpertBuf::deinterleave`].
    pub(super) interleaved: [bool; 3],
}

/// Where an [`ExpertBuf`]'s bytes live: a buffer of the process's own, or a range of a shared
/// read-only map of a segment file.
pub(super) enum RecordBytes {
    Owned(AlignedBuf),
    Mapped(MappedRecord),
}

impl From<AlignedBuf> for RecordBytes {
    fn from(b: AlignedBuf) -> RecordBytes {
        RecordBytes::Owned(b)
    }
}

impl From<MappedRecord> for RecordBytes {
    fn from(m: MappedRecord) -> RecordBytes {
        RecordBytes::Mapped(m)
    }
}

impl std::ops::Deref for RecordBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            RecordBytes::Owned(b) => b,
            RecordBytes::Mapped(m) => m.bytes(),
        }
    }
}

impl RecordBytes {
    /// Bytes of memory held: an owned buffer's [`AlignedBuf::held_bytes`], a mapped record's
    /// length rounded up to whole pages.
    fn held_bytes(&self) -> usize {
        match self {
            RecordBytes::Owned(b) => b.held_bytes(),
            RecordBytes::Mapped(m) => crate::held_bytes_for(m.len as u64) as usize,
        }
    }

    /// The bytes, writable: a mapped record is copied into a buffer of its own first (the map
    /// is read-only and shared with the page cache).
    fn make_mut(&mut self) -> &mut [u8] {
        if let RecordBytes::Mapped(m) = self {
            let mut b = AlignedBuf::new(m.len, AlignedBuf::DEFAULT_ALIGN);
            b.as_mut_slice().copy_from_slice(m.bytes());
            *self = RecordBytes::Owned(b);
        }
        match self {
            RecordBytes::Owned(b) => b.as_mut_slice(),
            RecordBytes::Mapped(_) => unreachable!("replaced above"),
        }
    }
}

/// One record's bytes in a shared read-only map of its segment file ([`Store::map_records`]).
pub(super) struct MappedRecord {
    map: std::sync::Arc<memmap2::Mmap>,
    offset: usize,
    len: usize,
}

impl MappedRecord {
    /// Bytes `offset..offset + len` of `map` (the whole pages inside the range are released
    /// from the process on drop).
    ///
    /// # Panics
    /// If the range is outside the map.
    pub(super) fn new(map: std::sync::Arc<memmap2::Mmap>, offset: usize, len: usize) -> Self {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= map.len()),
            "a mapped record lies inside its segment's map"
        );
        MappedRecord { map, offset, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }
}

impl Drop for MappedRecord {
    /// Unmaps the record's whole pages from the process (they stay in the page cache), so a
    /// record no longer held no longer counts in the process's memory.
    fn drop(&mut self) {
        let page = crate::io::page_size();
        let start = self.offset.next_multiple_of(page);
        let stop = (self.offset + self.len) / page * page;
        if stop > start {
            // SAFETY: [start, stop) is whole pages inside this read-only shared file map;
            // MADV_DONTNEED there only drops this process's page-table entries (the pages stay
            // in the page cache), so a later access through another record sharing a page, or
            // the same range mapped again, faults the same file bytes back in. A hint: its
            // failure only leaves the pages mapped until the map is dropped.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    stop - start,
                )
            };
        }
    }
}

/// A dense tensor, borrowed from the store's memory map.
pub struct DenseTensor<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Encoding.
    pub encoding: Encoding,
    /// Shape: `[n]` or `[rows, cols]`.
    pub shape: &'a [usize],
    /// Weight section, as stored: in the interleaved row order when [`DenseTensor::interleaved`]
    /// (read it through [`DenseTensor::matrix`], or [`Store::dense_ordered`] for row-major).
    pub data: &'a [u8],
    /// Scales (empty for f32/bf16), as stored (like `data`).
    pub scales: &'a [f32],
    /// The sections are in the interleaved row order (format version 7; [`DenseTensor::matrix`]
    /// reads them so), not row-major.
    pub interleaved: bool,
}

/// Views `bytes` as f32 values (aligned, length a multiple of 4: guaranteed by the format's
/// 64-byte section alignment inside an aligned buffer or page-aligned map).
pub(super) fn as_f32s(bytes: &[u8]) -> &[f32] {
    if bytes.is_empty() {
        return &[];
    }
    <[f32]>::ref_from_bytes(bytes).expect("scale sections are 64-byte aligned, length 4*n")
}

impl Store {
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
            interleaved: e.interleaved,
        })
    }

    /// The dense matrix `name` with its weight and scale sections in the interleaved row order
    /// ([`MatrixView::interleave`]) when `interleaved`, else row-major: the map of dense.bin
    /// where the tensor is stored in that order (format version 7 stores interleavable matrices
    /// interleaved), else a copy in that order the store keeps for as long as it is open (made
    /// at the first call, after the checksum check of [`Store::dense`]; the mapped pages of both
    /// sections are then released, as nothing reads them again through this store's users). A
    /// matrix that cannot be interleaved is returned as [`Store::dense`] maps it. `reorder` makes
    /// the interleaved order from the row-major one ([`MatrixView::interleave`] or a faster
    /// function giving the same bytes); [`MatrixView::deinterleave`] the other way. Kernels give
    /// the same numbers in either order; engines ask for the order their kernels read.
    ///
    /// # Errors
    /// As [`Store::dense`].
    pub fn dense_ordered(
        &self,
        name: &str,
        interleaved: bool,
        reorder: Reorder,
    ) -> Result<MatrixView<'_>, StoreError> {
        let t = self.dense(name)?;
        let m = t.matrix();
        let (e, rows, cols) = (m.encoding(), m.rows(), m.cols());
        if !MatrixView::can_interleave(e, rows, cols) || m.is_interleaved() == interleaved {
            return Ok(m);
        }
        let i = self.dense_by_name[name];
        // The copy (in the one order the tensor is not stored in): the weight section, then
        // (from a 64-byte boundary) the scale section.
        let (wb, sec) = (t.data.len(), m.scale_section());
        let s0 = wb.next_multiple_of(64);
        let copy = self.dense_copies[i].get_or_init(|| {
            let mut b = AlignedBuf::new(s0 + sec.len(), AlignedBuf::DEFAULT_ALIGN);
            let (w, s) = b.as_mut_slice().split_at_mut(s0);
            w[..wb].copy_from_slice(t.data);
            s.copy_from_slice(sec);
            if interleaved {
                reorder(e, rows, cols, &mut w[..wb], s);
            } else {
                MatrixView::deinterleave(e, rows, cols, &mut w[..wb], s);
            }
            if let Some(map) = &self.dense_map {
                let d = &self.manifest.dense[i];
                // The weight and scale sections, both copied above.
                for (off, len) in [
                    (d.offset as usize, t.data.len()),
                    (d.scales_offset as usize, sec.len()),
                ] {
                    if len == 0 {
                        continue;
                    }
                    // SAFETY: the map is a shared, read-only file mapping: MADV_DONTNEED only
                    // drops this process's pages of the range (other tensors sharing a boundary
                    // page included), and a later read faults in the same file bytes again, so
                    // every borrowed slice of the map keeps its contents.
                    let _ = unsafe {
                        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, off, len)
                    };
                }
            }
            b
        });
        let v = MatrixView::from_sections(e, rows, cols, &copy[..wb], &copy[s0..])
            .expect("a copy of a checked section");
        Ok(if interleaved {
            v.as_interleaved()
                .expect("a matrix that can be interleaved")
        } else {
            v
        })
    }

    /// True when the store has a dense tensor of that name.
    pub fn has_dense(&self, name: &str) -> bool {
        self.dense_by_name.contains_key(name)
    }
}

impl ExpertBuf {
    /// The expert `key` described by its INDEX record `r` (checked at open), over `buf`.
    pub(super) fn of_record(key: ExpertKey, r: &crate::IndexRecord, buf: RecordBytes) -> Self {
        ExpertBuf {
            key,
            encoding: Encoding::from_id(r.encoding.get(), r.group_size.get())
                .expect("checked at open"),
            hidden: r.hidden.get() as usize,
            intermediate: r.intermediate.get() as usize,
            encodings: r.encodings().expect("checked at open"),
            layout: r.layout(),
            buf,
            interleaved: r.interleaved_sections(),
        }
    }

    fn view(&self, i: usize) -> MatrixView<'_> {
        let (w_off, wb, s_off, sb) = self.layout.sections[i];
        let (rows, cols) = if i == 2 {
            (self.hidden, self.intermediate)
        } else {
            (self.intermediate, self.hidden)
        };
        let v = MatrixView::from_sections(
            self.encodings[i],
            rows,
            cols,
            &self.buf[w_off..w_off + wb],
            &self.buf[s_off..s_off + sb],
        )
        .expect("record sections follow RecordLayout (checked at open)");
        if self.interleaved[i] {
            return v
                .as_interleaved()
                .expect("interleave reorders only matrices that can be");
        }
        v
    }

    /// Reorders the weight and scale sections of the matrices `pick` selects (among gate, up and down,
    /// those [`MatrixView::can_interleave`]) into the interleaved row order in memory
    /// ([`MatrixView::interleave`]); their views then read that order. The kernels give the
    /// same numbers in either order, faster in this one for some (`coli_kernels::
    /// prefers_interleaved`): engines reorder a record they pin, once, with `reorder`
    /// ([`MatrixView::interleave`] or a faster function giving the same bytes). After this,
    /// [`ExpertBuf::bytes`] are no longer the record as stored.
    pub fn interleave(&mut self, pick: impl Fn(&MatrixView<'_>) -> bool, reorder: Reorder) {
        for i in 0..3 {
            let v = self.view(i);
            if self.interleaved[i]
                || !MatrixView::can_interleave(v.encoding(), v.rows(), v.cols())
                || !pick(&v)
            {
                continue;
            }
            let (e, rows, cols) = (v.encoding(), v.rows(), v.cols());
            let (w_off, wb, s_off, sb) = self.layout.sections[i];
            // The scale section follows the weight section (RecordLayout).
            assert!(w_off + wb <= s_off, "a record's scales follow its weights");
            let (w, s) = self.buf.make_mut().split_at_mut(s_off);
            reorder(e, rows, cols, &mut w[w_off..w_off + wb], &mut s[..sb]);
            self.interleaved[i] = true;
        }
    }

    /// Reorders the matrices in the interleaved row order (stored so, format version 7, or
    /// reordered by [`ExpertBuf::interleave`]) that `keep` rejects back into the row-major
    /// order ([`MatrixView::deinterleave`]); `keep` sees each interleaved view. Engines call it
    /// on a record read from an interleaved store for the matrices their kernels read row-major
    /// (f32 activations, `--numerics exact`); the views give the same numbers in either order.
    pub fn deinterleave(&mut self, keep: impl Fn(&MatrixView<'_>) -> bool) {
        for i in 0..3 {
            if !self.interleaved[i] {
                continue;
            }
            let v = self.view(i);
            if keep(&v) {
                continue;
            }
            let (e, rows, cols) = (v.encoding(), v.rows(), v.cols());
            let (w_off, wb, s_off, sb) = self.layout.sections[i];
            assert!(w_off + wb <= s_off, "a record's scales follow its weights");
            let (w, s) = self.buf.make_mut().split_at_mut(s_off);
            MatrixView::deinterleave(e, rows, cols, &mut w[w_off..w_off + wb], &mut s[..sb]);
            self.interleaved[i] = false;
        }
    }

    /// Which of gate, up and down are in the interleaved row order now.
    pub fn interleaved(&self) -> [bool; 3] {
        self.interleaved
    }

    fn bias(&self, i: usize) -> Option<&[f32]> {
        let (off, len) = self.layout.biases[i];
        (len > 0).then(|| as_f32s(&self.buf[off..off + len]))
    }

    /// The record's byte layout (FORMAT.md section 5).
    pub fn layout(&self) -> &RecordLayout {
        &self.layout
    }

    /// True when the record carries biases (format version 2, FORMAT.md section 5).
    pub fn has_biases(&self) -> bool {
        self.layout.has_biases()
    }

    /// The gate projection's bias, f32 `[I]`, when the record has biases.
    pub fn gate_bias(&self) -> Option<&[f32]> {
        self.bias(0)
    }

    /// The up projection's bias, f32 `[I]`, when the record has biases.
    pub fn up_bias(&self) -> Option<&[f32]> {
        self.bias(1)
    }

    /// The down projection's bias, f32 `[H]`, when the record has biases.
    pub fn down_bias(&self) -> Option<&[f32]> {
        self.bias(2)
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

    /// True when the record's bytes are a view of the page cache ([`Store::map_records`]), not
    /// a buffer of the process's own.
    pub fn is_mapped(&self) -> bool {
        matches!(self.buf, RecordBytes::Mapped(_))
    }

    /// Bytes of the record as read (payload plus padding to the store alignment).
    pub fn len_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of memory the record's buffer holds ([`crate::AlignedBuf::held_bytes`]: its length
    /// rounded up to the page size; equal to [`ExpertBuf::len_bytes`] when the store's alignment
    /// is a multiple of the page size). What the engine's expert cache charges against its budget.
    pub fn held_bytes(&self) -> usize {
        self.buf.held_bytes()
    }

    /// The raw record bytes (FORMAT.md section 5), padding included, as stored, except for the
    /// matrices [`ExpertBuf::interleave`] or [`ExpertBuf::deinterleave`] reordered since.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

impl<'a> DenseTensor<'a> {
    /// The tensor as a matrix view ([`coli_format::matrix_dims`]): `[n]` vectors as [1, n],
    /// `[rows, cols]` as is, N-D shapes as the product of their leading dimensions by the last.
    pub fn matrix(&self) -> MatrixView<'a> {
        let (rows, cols) = coli_format::matrix_dims(self.shape)
            .expect("dense shapes have a dimension (checked at open)");
        let m = MatrixView::new(self.encoding, rows, cols, self.data, self.scales)
            .expect("dense sections have their encoding's lengths (checked at open)");
        if self.interleaved {
            m.as_interleaved()
                .expect("an interleaved dense tensor can be (checked at open)")
        } else {
            m
        }
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
