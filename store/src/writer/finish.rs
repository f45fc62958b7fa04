//! Finishing a build: seal the last segment, write INDEX and MANIFEST, fsync everything and
//! publish `TARGET.partial/` as `TARGET` with one rename.

use super::{
    io_err, parent_dir, writer_err, ClosedSegment, StoreWriter, CONVERTER_NAME, JOURNAL_FILE,
    SPEC_FILE,
};
use crate::{failpoint, ExpertKey, Manifest, StoreError, Xxh3Sum};
use coli_format::disk::index::min_format_version;
use coli_format::disk::index::write_index;
use coli_format::disk::manifest::dense_min_format_version;
use coli_format::disk::manifest::{ConverterInfo, EncodingInfo, WholeFile};
use coli_format::disk::names;
use coli_format::disk::names::segment_path;
use coli_format::disk::segment::SegmentHeader;
use std::fs::File;
use std::path::PathBuf;
use xxhash_rust::xxh3::xxh3_64_with_seed;
use zerocopy::IntoBytes;

impl StoreWriter {
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

    pub(super) fn finish_inner(&mut self) -> Result<PathBuf, StoreError> {
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
        let version = min_format_version(&self.index).max(dense_min_format_version(&self.dense));
        for (id, s) in self.closed.iter().enumerate() {
            let id = id as u32;
            let h = SegmentHeader::new(version, id, self.store_id, s.len, s.body_xxh3);
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
        let index_bytes = write_index(&self.index, version);
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
            format_version: version,
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
            parameters: spec.recorded_parameters(),
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
            mtp_shared: self.mtp_shared.clone(),
        };
        let mbytes = manifest.to_bytes();
        // What a reader will check (mtp_shared against the dense tensors, among the rest):
        // never publish a MANIFEST that does not open.
        Manifest::parse(&mbytes).map_err(|e| writer_err(format!("cannot finish: {e}")))?;
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
