//! Starting a build: [`StoreWriter::create_or_resume`] refuses an existing target, starts a
//! fresh `TARGET.partial/` or resumes one whose spec matches.

use super::fs::{OsFs, WriterFs};
use super::journal::JournalEntry;
use super::spec::{describe_differences, spec_differences, validate_spec, SpecFile};
use super::{
    io_err, parent_dir, partial_path, writer_err, ResumeInfo, StoreSpec, StoreWriter, WriterStart,
    JOURNAL_FILE, SPEC_FILE,
};
use crate::{StoreError, StoreId};
use coli_format::disk::names::{parse_segment_name, segment_path};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

impl StoreWriter {
    /// Starts building the store at `target`, or resumes an interrupted build.
    ///
    /// - `target` is a complete store with the same store id and config.json:
    ///   [`WriterStart::AlreadyComplete`] (the same id with another config.json is refused).
    /// - `TARGET.partial/` exists with the same spec: every journaled entry is re-read and its
    ///   checksum checked; the verified prefix is kept, the rest truncated:
    ///   [`WriterStart::Resumed`]. The caller skips entries for which
    ///   [`StoreWriter::is_expert_done`] / [`StoreWriter::is_dense_done`] are true and adds the
    ///   others in the same order as before.
    /// - otherwise a fresh `TARGET.partial/` is created: [`WriterStart::Fresh`].
    ///
    /// `files/config.json` is written from `spec.config_json` as the first entry.
    ///
    /// # Errors
    /// [`StoreError::Writer`] when the spec is invalid (alignment, layers, config not JSON), when
    /// `target` exists but is a store of different parameters/sources/converter version or not a
    /// store, or when the partial build's spec differs (the message names every difference);
    /// [`StoreError::Io`] on file system errors.
    pub fn create_or_resume(target: &Path, spec: StoreSpec) -> Result<WriterStart, StoreError> {
        Self::create_or_resume_with(target, spec, Arc::new(OsFs))
    }

    /// [`StoreWriter::create_or_resume`] with the file operations of `fs` (tests inject I/O
    /// errors and torn writes there; [`OsFs`] is the operating system's).
    ///
    /// # Errors
    /// As [`StoreWriter::create_or_resume`].
    pub fn create_or_resume_with(
        target: &Path,
        spec: StoreSpec,
        fs: Arc<dyn WriterFs>,
    ) -> Result<WriterStart, StoreError> {
        let config = validate_spec(&spec)?;
        let spec_file = SpecFile::from_spec(&spec);
        let store_id = spec_file.store_id;
        if target.exists() {
            return Self::check_existing_target(target, &spec, &spec_file);
        }
        let partial = partial_path(target);
        if partial.exists() {
            let spec_path = partial.join(SPEC_FILE);
            if spec_path.exists() {
                let bytes = std::fs::read(&spec_path).map_err(|e| io_err(&spec_path, e))?;
                let old: SpecFile = serde_json::from_slice(&bytes).map_err(|e| {
                    writer_err(format!(
                        "{}: unreadable ({e}); remove {} to start over",
                        spec_path.display(),
                        partial.display()
                    ))
                })?;
                let diffs = spec_differences(&spec.parameter_defaults, &old, &spec_file);
                if !diffs.is_empty() {
                    return Err(writer_err(format!(
                        "{} is a partial build with a different spec: {}; remove it to start over or use the original parameters",
                        partial.display(),
                        diffs.join("; ")
                    )));
                }
                let (w, info) = Self::resume(target, partial, spec, config, store_id, fs)?;
                return Ok(WriterStart::Resumed(w, info));
            }
            if partial.join("MANIFEST").exists() {
                // Interrupted between removing spec/journal and the rename: the partial
                // directory is a complete store.
                let st = crate::Store::open_with(
                    &partial,
                    &crate::OpenOptions {
                        io: crate::IoPreference::Buffered,
                        fetch_threads: 1,
                        ..Default::default()
                    },
                )
                .map_err(|e| {
                    writer_err(format!(
                        "{} holds a MANIFEST but is not a valid store ({e}); remove it to start over",
                        partial.display()
                    ))
                })?;
                if st.manifest().store_id != spec_file.store_id {
                    return Err(writer_err(format!(
                        "{} is a finished build of a different store (id {}, requested {}); remove it",
                        partial.display(),
                        st.manifest().store_id,
                        spec_file.store_id
                    )));
                }
                drop(st);
                fs.rename(&partial, target).map_err(|e| io_err(target, e))?;
                let parent = parent_dir(target);
                fs.sync_dir(&parent).map_err(|e| io_err(&parent, e))?;
                return Ok(WriterStart::AlreadyComplete);
            }
            // Interrupted before spec.json existed: nothing of value is there.
            std::fs::remove_dir_all(&partial).map_err(|e| io_err(&partial, e))?;
        }
        let w = Self::fresh(target, partial, spec, config, store_id, &spec_file, fs)?;
        Ok(WriterStart::Fresh(w))
    }

    pub(super) fn check_existing_target(
        target: &Path,
        spec: &StoreSpec,
        spec_file: &SpecFile,
    ) -> Result<WriterStart, StoreError> {
        if !target.join("MANIFEST").exists() {
            return Err(writer_err(format!(
                "{} exists and is not a store (no MANIFEST); choose another output path or remove it",
                target.display()
            )));
        }
        let st = crate::Store::open_with(
            target,
            &crate::OpenOptions {
                io: crate::IoPreference::Buffered,
                fetch_threads: 1,
                ..Default::default()
            },
        )
        .map_err(|e| {
            writer_err(format!(
                "{} exists but is not a valid store ({e}); run coli-fsck on it, or remove it to convert again",
                target.display()
            ))
        })?;
        let m = st.manifest();
        if m.store_id == spec_file.store_id {
            // The id names the converter, the parameters and the shards; config.json is not
            // part of it (FORMAT.md section 2), so an edited config over the same shards is
            // not this store.
            return match serde_json::from_slice::<serde_json::Value>(&spec.config_json) {
                Ok(c) if c == m.config => Ok(WriterStart::AlreadyComplete),
                _ => Err(writer_err(format!(
                    "{} is a complete store of the same shards and parameters but another config.json (its MANIFEST's config differs from the input's); choose another output path or remove it",
                    target.display()
                ))),
            };
        }
        let diffs = describe_differences(
            &spec.parameter_defaults,
            &m.parameters,
            &spec.recorded_parameters(),
            &m.sources,
            &spec.sources,
            &m.converter.version,
            &spec.converter_version,
        );
        Err(writer_err(format!(
            "{} is a complete store of a different conversion (id {}, requested {}): {}; choose another output path or remove it",
            target.display(),
            m.store_id,
            spec_file.store_id,
            if diffs.is_empty() {
                "converter name differs".to_string()
            } else {
                diffs.join("; ")
            }
        )))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_state(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        dense_file: File,
        journal: File,
        fs: Arc<dyn WriterFs>,
    ) -> StoreWriter {
        let expected = spec
            .expert_layers
            .iter()
            .map(|l| (l.layer, l.num_experts))
            .collect();
        StoreWriter {
            target: target.to_path_buf(),
            partial,
            spec,
            store_id,
            config,
            expected,
            seg: None,
            closed: Vec::new(),
            index: Vec::new(),
            experts_done: HashMap::new(),
            dense_file,
            dense_pos: 0,
            dense_hasher: Box::new(Xxh3::new()),
            dense: Vec::new(),
            dense_done: HashMap::new(),
            files: BTreeMap::new(),
            mtp_shared: BTreeMap::new(),
            journal,
            poisoned: None,
            fs,
            records_this_run: 0,
            dense_this_run: 0,
        }
    }

    pub(super) fn fresh(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        spec_file: &SpecFile,
        fs: Arc<dyn WriterFs>,
    ) -> Result<StoreWriter, StoreError> {
        std::fs::create_dir(&partial).map_err(|e| io_err(&partial, e))?;
        for sub in ["segments", "files"] {
            let p = partial.join(sub);
            std::fs::create_dir(&p).map_err(|e| io_err(&p, e))?;
        }
        let dense_path = partial.join("dense.bin");
        let dense_file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&dense_path)
            .map_err(|e| io_err(&dense_path, e))?;
        let jpath = partial.join(JOURNAL_FILE);
        let journal = File::options()
            .append(true)
            .create_new(true)
            .open(&jpath)
            .map_err(|e| io_err(&jpath, e))?;
        // spec.json last, atomically: its presence marks a resumable partial build.
        let tmp = partial.join("spec.json.tmp");
        let bytes = serde_json::to_vec_pretty(spec_file).expect("spec serializes");
        fs.write_file(&tmp, &bytes, true)
            .map_err(|e| io_err(&tmp, e))?;
        let sp = partial.join(SPEC_FILE);
        fs.rename(&tmp, &sp).map_err(|e| io_err(&sp, e))?;
        fs.sync_dir(&partial).map_err(|e| io_err(&partial, e))?;
        let parent = parent_dir(&partial);
        fs.sync_dir(&parent).map_err(|e| io_err(&parent, e))?;
        let mut w = Self::new_state(
            target, partial, spec, config, store_id, dense_file, journal, fs,
        );
        w.ensure_config()?;
        Ok(w)
    }

    pub(super) fn ensure_config(&mut self) -> Result<(), StoreError> {
        if !self.files.contains_key("config.json") {
            let bytes = self.spec.config_json.clone();
            self.add_file("config.json", &bytes)?;
        }
        Ok(())
    }

    pub(super) fn resume(
        target: &Path,
        partial: PathBuf,
        spec: StoreSpec,
        config: serde_json::Value,
        store_id: StoreId,
        fs: Arc<dyn WriterFs>,
    ) -> Result<(StoreWriter, ResumeInfo), StoreError> {
        for sub in ["segments", "files"] {
            let p = partial.join(sub);
            if !p.exists() {
                std::fs::create_dir(&p).map_err(|e| io_err(&p, e))?;
            }
        }
        let jpath = partial.join(JOURNAL_FILE);
        let mut jbytes = Vec::new();
        if jpath.exists() {
            File::open(&jpath)
                .and_then(|mut f| f.read_to_end(&mut jbytes))
                .map_err(|e| io_err(&jpath, e))?;
        }
        let dense_path = partial.join("dense.bin");
        let dense_file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&dense_path)
            .map_err(|e| io_err(&dense_path, e))?;
        let journal = File::options()
            .append(true)
            .create(true)
            .open(&jpath)
            .map_err(|e| io_err(&jpath, e))?;
        let mut w = Self::new_state(
            target, partial, spec, config, store_id, dense_file, journal, fs,
        );
        let mut info = ResumeInfo::default();
        let mut kept_journal_len = 0usize;
        let mut seg_files: BTreeMap<u32, File> = BTreeMap::new();
        let alignment = w.spec.alignment as u64;
        // Verify the journal entry by entry; stop at the first line that does not parse or
        // whose bytes fail.
        let mut pos = 0usize;
        while pos < jbytes.len() {
            let Some(nl) = jbytes[pos..].iter().position(|&b| b == b'\n') else {
                break; // torn last line
            };
            let line = &jbytes[pos..pos + nl];
            let Ok(entry) = serde_json::from_slice::<JournalEntry>(line) else {
                break;
            };
            let ok = w.verify_entry(&entry, &mut seg_files, alignment)?;
            if !ok {
                break;
            }
            match &entry {
                JournalEntry::Expert { length, .. } => {
                    info.experts_kept += 1;
                    info.bytes_kept += length;
                }
                JournalEntry::Dense { entry } => {
                    info.dense_kept += 1;
                    info.bytes_kept += entry.length + entry.scales_length;
                }
                JournalEntry::File { entry } => info.bytes_kept += entry.size,
            }
            pos += nl + 1;
            kept_journal_len = pos;
        }
        // Truncate everything after the verified prefix.
        w.journal
            .set_len(kept_journal_len as u64)
            .map_err(|e| io_err(&jpath, e))?;
        w.dense_file
            .set_len(w.dense_pos)
            .map_err(|e| io_err(&dense_path, e))?;
        let keep_segments = w.seg.as_ref().map(|s| s.id + 1).unwrap_or(0);
        if let Some(s) = &w.seg {
            let p = segment_path(&w.partial, s.id);
            s.file.set_len(s.pos).map_err(|e| io_err(&p, e))?;
        }
        let segdir = w.partial.join("segments");
        for e in std::fs::read_dir(&segdir).map_err(|e| io_err(&segdir, e))? {
            let e = e.map_err(|e| io_err(&segdir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let id = parse_segment_name(&name);
            if id.is_none_or(|id| id >= keep_segments) {
                std::fs::remove_file(e.path()).map_err(|x| io_err(&e.path(), x))?;
            }
        }
        let filesdir = w.partial.join("files");
        for e in std::fs::read_dir(&filesdir).map_err(|e| io_err(&filesdir, e))? {
            let e = e.map_err(|e| io_err(&filesdir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !w.files.contains_key(&name) {
                std::fs::remove_file(e.path()).map_err(|x| io_err(&e.path(), x))?;
            }
        }
        for name in ["MANIFEST", "INDEX"] {
            let p = w.partial.join(name);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
            }
        }
        for d in [&segdir, &filesdir, &w.partial] {
            w.fs.sync_dir(d).map_err(|e| io_err(d, e))?;
        }
        w.ensure_config()?;
        Ok((w, info))
    }
}
