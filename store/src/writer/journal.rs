//! The journal (`TARGET.partial/journal`): one JSON line per completed entry, appended after
//! its bytes were written; on resume every journaled entry is re-read and its checksum checked,
//! the verified prefix kept and the files truncated after it.

use super::{io_err, valid_file_name, ClosedSegment, OpenSegment, StoreWriter, JOURNAL_FILE};
use crate::{DenseEntry, Encoding, ExpertKey, FileEntry, StoreError, Xxh3Sum};
use coli_format::disk::index::{IndexRecord, RecordPlace};
use coli_format::disk::names::segment_path;
use coli_format::encoding::{align_up, SECTION_ALIGN};
use coli_format::RecordLayout;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// One journal line.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(super) enum JournalEntry {
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
        /// Whether the record carries bias sections (absent in journals of older writers).
        #[serde(default)]
        biases: bool,
        /// The up and down matrices' ggml type ids of a ggml record (absent otherwise).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ggml_up_down: Option<[u16; 2]>,
        /// Whether the record's matrices that can be are interleaved (format version 7; absent
        /// in journals of older writers and for row-major records).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interleaved: bool,
        checksum: Xxh3Sum,
    },
    Dense {
        entry: DenseEntry,
    },
    File {
        entry: FileEntry,
    },
}

/// Reads `len` bytes at `offset`; Ok(None) when the file is shorter.
pub(super) fn read_range(file: &File, offset: u64, len: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; len];
    match file.read_exact_at(&mut buf, offset) {
        Ok(()) => Ok(Some(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

impl StoreWriter {
    pub(super) fn append_journal(&mut self, e: &JournalEntry) -> Result<(), StoreError> {
        let mut line = serde_json::to_vec(e).expect("journal entry serializes");
        line.push(b'\n');
        let path = self.partial.join(JOURNAL_FILE);
        self.fs
            .append(&mut self.journal, &path, &line)
            .map_err(|x| io_err(&path, x))
    }

    /// Re-reads one journaled entry, checks it, and adopts it into the writer state.
    /// Returns false when the entry does not verify (the prefix ends before it).
    pub(super) fn verify_entry(
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
                biases,
                ggml_up_down,
                interleaved,
                checksum,
            } => {
                let key = ExpertKey::new(*layer, *expert);
                let sum = checksum.0;
                let Ok(enc) = Encoding::from_id(*encoding, *group_size) else {
                    return Ok(false);
                };
                let encs = match (enc, ggml_up_down) {
                    (Encoding::Ggml(_), Some([up, down])) => {
                        let (Ok(up), Ok(down)) =
                            (Encoding::from_id(7, *up), Encoding::from_id(7, *down))
                        else {
                            return Ok(false);
                        };
                        [enc, up, down]
                    }
                    (Encoding::Ggml(_), None) | (_, Some(_)) => return Ok(false),
                    _ => [enc; 3],
                };
                let layout =
                    RecordLayout::mixed(encs, *hidden as usize, *intermediate as usize, *biases);
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
                    encodings: encs,
                    offset: *offset,
                    length: *length,
                    payload_len: *payload_len,
                    hidden: *hidden,
                    intermediate: *intermediate,
                    biases: *biases,
                    interleaved: *interleaved,
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
}
