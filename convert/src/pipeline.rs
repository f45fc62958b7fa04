//! The conversion driver: open and check the checkpoint, then stream every tensor through the
//! store writer in a fixed order (dense tensors, then experts layer by layer), resumable.

use crate::checkpoint::Checkpoint;
use crate::error::{ConvertError, Result};
use crate::plan::{self, Class, Encodings, Plan};
use crate::quant::{self, ErrStats};
use coli_format::Encoding;
use coli_store::failpoint;
use coli_store::{EncodedMatrix, MatrixOrder, SourceFile, StoreSpec, StoreWriter, WriterStart};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Record alignment of the stores this converter writes, bytes.
pub const ALIGNMENT: usize = 4096;
/// Segment size bound, bytes (4 GiB).
pub const SEGMENT_MAX_BYTES: u64 = 4 << 30;

/// What to convert and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// Hugging Face checkpoint directory.
    pub input: PathBuf,
    /// Store directory to create.
    pub output: PathBuf,
    /// Encodings per tensor class.
    pub encodings: Encodings,
    /// The order of the matrices in expert records (FORMAT.md section 5): interleaved (format
    /// version 7; the kernels' order, so a pinned record is used in place) or row-major.
    pub matrix_order: MatrixOrder,
    /// Worker threads for quantization (`None`: rayon's default, one per core).
    pub threads: Option<usize>,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
}

/// Outcome of a conversion, printed as text or JSON (docs/CONVERT.md).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `"converted"` or `"already_complete"`.
    pub status: String,
    /// The store directory.
    pub store: PathBuf,
    /// `model_type`.
    pub family: String,
    /// `experts`, `dense`, `mtp` encodings (and `embeddings` and the per-role choices when
    /// given), as recorded in the store (`mtp` is recorded even for a model without an MTP
    /// layer: see `mtp_layer`).
    pub parameters: BTreeMap<String, String>,
    /// Whether the store holds an MTP layer (the text report names `mtp=` only then, or when
    /// it is `none`).
    pub mtp_layer: bool,
    /// The MTP layer's tensors the checkpoint does not hold, with the main model's tensor
    /// standing in (the MANIFEST's `mtp_shared`).
    pub mtp_shared: BTreeMap<String, String>,
    /// Dense tensors in the store.
    pub tensors: u64,
    /// Expert records in the store.
    pub experts: u64,
    /// Expert records found already written (resume) and skipped.
    pub experts_skipped: u64,
    /// Bytes of those skipped records (as reported by the writer).
    pub bytes_skipped: u64,
    /// Dense tensors found already written (resume) and skipped.
    pub dense_skipped: u64,
    /// Source bytes read and converted by this run (weights and scales).
    pub bytes_in: u64,
    /// Encoded bytes (weights and scales, no padding) produced by this run.
    pub bytes_out: u64,
    /// Size of the finished store on disk, bytes (all files).
    pub store_bytes: u64,
    /// Relative RMS quantization error per class, `sqrt(sum (w_q - w)^2 / sum w^2)` against
    /// the f32 source values, over the tensors converted by this run; `null` when the class
    /// had no tensor converted.
    pub rel_rms_error: BTreeMap<String, Option<f64>>,
    /// Checkpoint tensors not converted: ones the model does not read (not in its spec) and,
    /// for a multimodal checkpoint, those outside its language model.
    pub not_converted: Vec<String>,
    /// What became of the checkpoint's tokenizer where it was not simply copied: a
    /// tokenizer.json written from `tiktoken.model`, or why not ([`crate::tiktoken`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Wall time, seconds.
    pub elapsed_s: f64,
}

/// What an absent conversion parameter means, for the message that compares a resumed or
/// finished store's parameters with the requested ones: `embeddings` = `source`, each per-role
/// choice = the `--dense` encoding.
pub(crate) fn parameter_defaults() -> BTreeMap<String, String> {
    let mut d = BTreeMap::from([
        ("embeddings".to_string(), "source (the default)".to_string()),
        (
            "matrix_order".to_string(),
            "row-major (not recorded)".to_string(),
        ),
    ]);
    for k in ["attention", "indexer", "shared_experts", "dense_mlp"] {
        d.insert(
            k.to_string(),
            "the --dense encoding (the default)".to_string(),
        );
    }
    d
}

/// Parses an `--experts` value: `int4-g64`, `int4-g32`, `int8`, `fp8`, `bf16`.
///
/// # Errors
/// [`ConvertError::Usage`] for anything else.
pub fn parse_encoding(s: &str, allowed: &[&str], flag: &str) -> Result<Encoding> {
    if !allowed.contains(&s) {
        return Err(ConvertError::Usage(format!(
            "--{flag} {s}: expected one of {}",
            allowed.join(", ")
        )));
    }
    Ok(match s {
        "int4-g64" => Encoding::Int4 { group_size: 64 },
        "int4-g32" => Encoding::Int4 { group_size: 32 },
        "int8" => Encoding::Int8,
        "fp8" => Encoding::Fp8,
        "bf16" => Encoding::Bf16,
        "mxfp4" => Encoding::Mxfp4,
        "mxfp8" => Encoding::Mxfp8,
        _ => unreachable!("checked against allowed"),
    })
}

/// `TARGET.lock`: held (an exclusive `flock`) by the converter building `TARGET` for the whole
/// run, so that a second converter started on the same target refuses instead of writing
/// into the first one's `TARGET.partial`; removed when the run ends (a killed run leaves the
/// file, unlocked, and the next run takes it over).
pub fn lock_path(target: &Path) -> PathBuf {
    let mut s = target.as_os_str().to_os_string();
    s.push(".lock");
    PathBuf::from(s)
}

/// The build lock of one target (see [`lock_path`]); the file is removed on drop.
pub(crate) struct BuildLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl BuildLock {
    /// Takes the lock of `target` without waiting.
    ///
    /// # Errors
    /// [`ConvertError::Usage`] when another process holds it; [`ConvertError::Io`] when the
    /// lock file cannot be created or locked.
    pub(crate) fn take(target: &Path) -> Result<BuildLock> {
        use std::os::unix::fs::MetadataExt;
        let path = lock_path(target);
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| ConvertError::io(&path, e))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(ConvertError::Usage(format!(
                        "{}: another coli-convert is building this store (it holds {}); wait for it to finish",
                        target.display(),
                        path.display()
                    )))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(ConvertError::io(&path, e)),
            }
            // The holder removes the file when it ends: a lock taken on a file that is no
            // longer at `path` protects nothing, so take the current one.
            let held = file.metadata().map_err(|e| ConvertError::io(&path, e))?;
            match std::fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(BuildLock { path, _file: file })
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ConvertError::io(&path, e)),
            }
        }
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        // Removed while still locked (the file closes after this); a converter that locks the
        // removed file afterwards sees it is no longer at the path and takes the current one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the build lock of `output` after checking that its parent directory exists and, unless
/// the store is already complete, that the file system has room for `estimated` bytes more than
/// a partial store already holds.
///
/// # Errors
/// [`ConvertError::Usage`] for a missing parent directory; [`ConvertError::DiskSpace`]; the
/// lock's errors ([`BuildLock::take`]).
pub(crate) fn take_output(output: &Path, estimated: u64) -> Result<BuildLock> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !parent.is_dir() {
        return Err(ConvertError::Usage(format!(
            "{}: the parent directory of OUTPUT_STORE does not exist; create it first",
            parent.display()
        )));
    }
    let lock = BuildLock::take(output)?;
    if !output.join("MANIFEST").exists() {
        let have = dir_size(&partial_path(output));
        let needed = estimated.saturating_sub(have);
        let available = free_bytes(&parent)?;
        if needed > available {
            return Err(ConvertError::DiskSpace {
                dir: parent,
                needed,
                available,
            });
        }
    }
    Ok(lock)
}

/// `TARGET.partial`, where the writer builds the store (docs/FORMAT.md section 1).
pub fn partial_path(target: &Path) -> PathBuf {
    let mut s = target.as_os_str().to_os_string();
    s.push(".partial");
    PathBuf::from(s)
}

pub(crate) fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Free bytes for unprivileged users on the file system holding `dir` (statvfs).
pub(crate) fn free_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| ConvertError::Usage(format!("{}: path contains a NUL byte", dir.display())))?;
    let mut st: libc::statvfs = unsafe_zeroed_statvfs();
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid, writable statvfs struct.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(ConvertError::io(dir, std::io::Error::last_os_error()));
    }
    #[allow(clippy::unnecessary_cast)] // u64 on 64-bit Linux, narrower elsewhere
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    Ok(free)
}

fn unsafe_zeroed_statvfs() -> libc::statvfs {
    // SAFETY: statvfs is a plain C struct of integers, for which all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

/// Converts a checkpoint into a store. Already-written records of an interrupted run with the
/// same parameters are verified by the writer and skipped; a finished store with the same
/// parameters returns `status = "already_complete"`.
///
/// # Errors
/// Any [`ConvertError`]: bad input (found in preflight before anything is written, or NaN/Inf
/// found while converting, in which case the partial store is removed), not enough disk space,
/// a store with different parameters at the target (writer error), I/O errors (the partial
/// store is kept for a later resume).
pub fn run(opts: &Options) -> Result<Report> {
    let pool = {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(n) = opts.threads {
            b = b.num_threads(n.max(1));
        }
        b.build().map_err(|e| {
            ConvertError::Usage(format!("cannot start {:?} threads: {e}", opts.threads))
        })?
    };
    pool.install(|| run_in_pool(opts))
}

fn run_in_pool(opts: &Options) -> Result<Report> {
    let t0 = Instant::now();
    // `out/` and `out` are the same store (and `out/.partial` must not happen).
    let mut opts = opts.clone();
    opts.output = opts.output.components().collect();
    let opts = &opts;
    let ck = Checkpoint::open(&opts.input)?;
    let plan =
        plan::build(&ck, opts.encodings, ALIGNMENT).map_err(|e| ck.in_checkpoint_names(e))?;
    let mut parameters = BTreeMap::new();
    parameters.insert("experts".to_string(), opts.encodings.experts.name());
    parameters.insert("dense".to_string(), opts.encodings.dense.name());
    parameters.insert(
        "mtp".to_string(),
        opts.encodings
            .mtp
            .map_or_else(|| "none".into(), Encoding::name),
    );
    for (k, e) in opts.encodings.roles.chosen() {
        parameters.insert(k.to_string(), e.name());
    }
    if let Some(e) = opts.encodings.embeddings {
        parameters.insert("embeddings".to_string(), e.name());
    }
    // The store writer records `matrix_order=interleaved` when the spec writes that order
    // (StoreSpec::recorded_parameters); the report names what the store records.
    // Disk space (the target's parent must exist).
    let _lock = take_output(&opts.output, plan.estimated_out)?;
    failpoint::hit("convert.after_preflight");

    let spec = StoreSpec {
        family: ck.spec.model_type.clone(),
        config_json: ck.config_bytes.clone(),
        num_layers: plan.num_layers,
        expert_layers: plan.expert_layers.clone(),
        expert_encoding: opts.encodings.experts,
        alignment: ALIGNMENT,
        segment_max_bytes: SEGMENT_MAX_BYTES,
        matrix_order: opts.matrix_order,
        converter_version: env!("CARGO_PKG_VERSION").to_string(),
        parameter_defaults: parameter_defaults(),
        parameters,
        sources: ck
            .shards
            .iter()
            .map(|s| SourceFile {
                name: s.name.clone(),
                size: s.size,
                header_xxh3: coli_store::Xxh3Sum(s.header_xxh3),
            })
            .collect(),
    };
    let report = Report {
        status: "converted".into(),
        store: opts.output.clone(),
        family: ck.spec.model_type.clone(),
        parameters: spec.recorded_parameters(),
        mtp_layer: !plan.mtp_layers.is_empty(),
        mtp_shared: plan.mtp_shared.clone(),
        tensors: plan.dense.len() as u64,
        experts: plan.experts.len() as u64,
        experts_skipped: 0,
        bytes_skipped: 0,
        dense_skipped: 0,
        bytes_in: 0,
        bytes_out: 0,
        store_bytes: 0,
        rel_rms_error: BTreeMap::new(),
        // As the checkpoint names them (a wrapper's prefix kept).
        not_converted: ck
            .outside_model
            .iter()
            .cloned()
            .chain(
                plan.unused
                    .iter()
                    .map(|n| ck.renamed.get(n).cloned().unwrap_or_else(|| n.clone())),
            )
            .collect(),
        tokenizer: ck.tokenizer_note.clone(),
        elapsed_s: 0.0,
    };
    write_store(&opts.output, spec, report, t0, |writer, report| {
        writer.set_mtp_shared(plan.mtp_shared.clone());
        for s in &ck.shards {
            s.read_sequentially();
        }
        write_all(&ck, &plan, writer, report, opts.progress)
    })
}

/// Starts (or resumes) the store at `output` with `spec`, runs `write` on its writer and
/// finishes it, filling `report`'s status, skipped bytes, store size and time. A store already
/// complete is reported as such without running `write`. When `write` fails on bad input data
/// ([`ConvertError::is_bad_data`]) the partial store is removed (resuming could not help); any
/// other error keeps it for a resume.
///
/// # Errors
/// The writer's errors and `write`'s.
pub(crate) fn write_store(
    output: &Path,
    spec: StoreSpec,
    mut report: Report,
    t0: Instant,
    write: impl FnOnce(&mut StoreWriter, &mut Report) -> Result<()>,
) -> Result<Report> {
    let mut writer = match StoreWriter::create_or_resume(output, spec)? {
        WriterStart::AlreadyComplete => {
            report.status = "already_complete".into();
            report.store_bytes = dir_size(output);
            report.elapsed_s = t0.elapsed().as_secs_f64();
            return Ok(report);
        }
        WriterStart::Fresh(w) => w,
        WriterStart::Resumed(w, info) => {
            report.bytes_skipped = info.bytes_kept;
            w
        }
    };
    if let Err(e) = write(&mut writer, &mut report) {
        drop(writer);
        if e.is_bad_data() {
            // The input is corrupt: what was written from it is worthless.
            let _ = std::fs::remove_dir_all(partial_path(output));
        }
        return Err(e);
    }
    let path = writer.finish()?;
    report.store_bytes = dir_size(&path);
    report.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

fn write_all(
    ck: &Checkpoint,
    plan: &Plan,
    writer: &mut StoreWriter,
    report: &mut Report,
    progress: bool,
) -> Result<()> {
    use std::io::IsTerminal;
    let pb = if progress && std::io::stderr().is_terminal() {
        let pb = ProgressBar::with_draw_target(Some(plan.bytes_in), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        pb
    } else {
        ProgressBar::hidden()
    };
    let mut stats: BTreeMap<Class, ErrStats> = BTreeMap::new();
    let mut counted: BTreeMap<Class, bool> = BTreeMap::new();

    for (di, d) in plan.dense.iter().enumerate() {
        if let Some(next) = plan.dense.get(di + 1) {
            prefetch(ck, &next.name);
        }
        let (m, regions) = plan::source_matrix(ck, &d.name)?;
        let nbytes: u64 = regions.iter().map(|(_, t)| t.nbytes() as u64).sum();
        if writer.is_dense_done(&d.name) {
            report.dense_skipped += 1;
            pb.inc(nbytes);
            continue;
        }
        pb.set_message(d.name.clone());
        let (enc, st) = quant::encode(&m, d.encoding)?;
        writer.add_dense(&d.name, &d.shape, &enc)?;
        for (s, t) in &regions {
            s.release(t);
        }
        stats.entry(d.class).or_default().add(st);
        counted.insert(d.class, true);
        report.bytes_in += nbytes;
        report.bytes_out += out_bytes(&enc);
        pb.inc(nbytes);
    }
    failpoint::hit("convert.after_dense");

    // Experts: this thread quantizes expert k+1 (rows in parallel on the rayon pool) while a
    // writer thread appends expert k; a channel of 2 bounds the experts in flight to 4.
    let mut todo = Vec::with_capacity(plan.experts.len());
    for x in &plan.experts {
        if writer.is_expert_done(x.key) {
            report.experts_skipped += 1;
            let regions = expert_regions(ck, x)?;
            pb.inc(regions.iter().map(|(_, t)| t.nbytes() as u64).sum::<u64>());
        } else {
            todo.push(x);
        }
    }
    let (h, i) = (ck.spec.expert_hidden(), ck.spec.moe_intermediate_size);
    type Region<'a> = crate::fused::Region<'a>;
    type Job<'a> = (
        coli_store::ExpertKey,
        Vec<EncodedMatrix>,
        Vec<Region<'a>>,
        u64,
    );
    let w: &mut StoreWriter = &mut *writer;
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job<'_>>(2);
        let pbw = pb.clone();
        let consumer = scope.spawn(move || -> Result<()> {
            let mut written = 0u64;
            for (key, mats, regions, nbytes) in rx {
                w.add_expert(key, h, i, [&mats[0], &mats[1], &mats[2]])?;
                for (s, t) in &regions {
                    s.release(t);
                }
                pbw.inc(nbytes);
                written += 1;
                failpoint::hit_nth("convert.after_expert", written);
            }
            Ok(())
        });
        let mut produce = || -> Result<()> {
            // Readahead: the source bytes of the next PREFETCH_EXPERTS experts are requested
            // from the disk while this one is quantized (and the previous one written).
            for x in todo.iter().take(PREFETCH_EXPERTS) {
                prefetch_expert(ck, x);
            }
            for (k, x) in todo.iter().enumerate() {
                if let Some(next) = todo.get(k + PREFETCH_EXPERTS) {
                    prefetch_expert(ck, next);
                }
                pb.set_message(format!("{}", x.key));
                let mut mats: Vec<EncodedMatrix> = Vec::with_capacity(3);
                let mut all_regions: Vec<Region<'_>> = Vec::with_capacity(6);
                let mut nbytes = 0u64;
                match &x.source {
                    plan::ExpertSource::PerMatrix(names) => {
                        for n in names {
                            let (m, regions) = plan::source_matrix(ck, n)?;
                            nbytes += regions.iter().map(|(_, t)| t.nbytes() as u64).sum::<u64>();
                            let (enc, st) = quant::encode(&m, x.encoding)?;
                            stats.entry(x.class).or_default().add(st);
                            mats.push(enc);
                            all_regions.extend(regions.into_iter().map(|(s, t)| (s, t.clone())));
                        }
                    }
                    plan::ExpertSource::Fused { set, storage, .. } => {
                        let g = crate::fused::gather(ck, set, *storage, x.key.expert, x.encoding)?;
                        nbytes += g.bytes_in;
                        stats.entry(x.class).or_default().add(g.stats);
                        mats.extend(g.mats);
                        all_regions.extend(g.regions);
                    }
                }
                counted.insert(x.class, true);
                for m in &mats {
                    report.bytes_out += out_bytes(m);
                }
                report.bytes_in += nbytes;
                if tx.send((x.key, mats, all_regions, nbytes)).is_err() {
                    break; // the writer thread failed; its error is reported below
                }
            }
            Ok(())
        };
        let produced = produce();
        drop(tx);
        let written = consumer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        // A data error (NaN) from the producer takes precedence: it decides cleanup.
        produced?;
        written
    })?;
    pb.finish_and_clear();
    for (name, bytes) in &ck.extra_files {
        writer.add_file(name, bytes)?;
    }
    for c in [
        Class::Experts,
        Class::Attention,
        Class::Indexer,
        Class::SharedExperts,
        Class::DenseMlp,
        Class::Mtp,
        Class::Embeddings,
    ] {
        let v = if counted.get(&c).copied().unwrap_or(false) {
            stats.get(&c).and_then(|s| s.rel_rms())
        } else {
            None
        };
        report.rel_rms_error.insert(c.key().to_string(), v);
    }
    Ok(())
}

/// Experts whose source bytes are read ahead of the one being quantized (about 4.7 MB each for
/// a 2048 x 768 FP8 expert): enough to keep the disk busy while both cores quantize.
const PREFETCH_EXPERTS: usize = 3;

/// The source byte ranges of expert `x` (for progress of skipped experts).
fn expert_regions<'a>(
    ck: &'a Checkpoint,
    x: &'a plan::ExpertItem,
) -> Result<Vec<crate::fused::Region<'a>>> {
    Ok(match &x.source {
        plan::ExpertSource::PerMatrix(names) => {
            let mut out = Vec::new();
            for n in names {
                let (_, regions) = plan::source_matrix(ck, n)?;
                out.extend(regions.into_iter().map(|(s, t)| (s, t.clone())));
            }
            out
        }
        plan::ExpertSource::Fused { set, tensors, .. } => {
            crate::fused::regions(ck, tensors, x.key.expert, set.count)
        }
    })
}

/// Starts asynchronous readahead of an expert's source bytes (errors ignored: advice only).
fn prefetch_expert(ck: &Checkpoint, x: &plan::ExpertItem) {
    if let Ok(regions) = expert_regions(ck, x) {
        for (s, t) in regions {
            s.prefetch(&t);
        }
    }
}

/// Starts asynchronous readahead of a tensor and its scale (errors ignored: advice only).
fn prefetch(ck: &Checkpoint, name: &str) {
    if let Ok((_, regions)) = plan::source_matrix(ck, name) {
        for (s, t) in regions {
            s.prefetch(t);
        }
    }
}

fn out_bytes(m: &EncodedMatrix) -> u64 {
    (m.data.len() + m.scale_section().len() + m.bias.as_ref().map_or(0, |b| b.len() * 4)) as u64
}

impl Report {
    /// Human-readable summary (several lines).
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        if self.status == "already_complete" {
            let _ = writeln!(s, "already complete: {}", self.store.display());
            return s;
        }
        if self.experts_skipped > 0 || self.dense_skipped > 0 {
            let _ = writeln!(
                s,
                "resumed: skipped {} experts ({} bytes) and {} dense tensors",
                self.experts_skipped, self.bytes_skipped, self.dense_skipped
            );
        }
        let _ = writeln!(
            s,
            "converted {} ({}) -> {}",
            self.family,
            self.parameters
                .iter()
                .filter(|(k, v)| self.mtp_layer || k.as_str() != "mtp" || v.as_str() == "none")
                // The default order is named in the JSON report and the store, not here.
                .filter(|(k, v)| (k.as_str(), v.as_str()) != ("matrix_order", "interleaved"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            self.store.display()
        );
        let _ = writeln!(
            s,
            "tensors: {} dense, {} experts; bytes in {}, bytes out {}, store {} bytes; {:.2} s",
            self.tensors,
            self.experts,
            self.bytes_in,
            self.bytes_out,
            self.store_bytes,
            self.elapsed_s
        );
        if !self.not_converted.is_empty() {
            let shown: Vec<&str> = self
                .not_converted
                .iter()
                .take(8)
                .map(String::as_str)
                .collect();
            let mtp_none = self.parameters.get("mtp").is_some_and(|m| m == "none");
            let _ = writeln!(
                s,
                "not converted ({} tensors the model does not read{}): {}{}",
                self.not_converted.len(),
                if mtp_none {
                    ", or of its MTP layer: --mtp none"
                } else {
                    ""
                },
                shown.join(", "),
                if self.not_converted.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            );
        }
        if let Some(t) = &self.tokenizer {
            let _ = writeln!(s, "tokenizer: {t}");
        }
        for (shared, stand_in) in &self.mtp_shared {
            let _ = writeln!(
                s,
                "MTP layer: {shared} is not in the checkpoint; the main model's {stand_in} stands in"
            );
        }
        // Classes with no tensor converted by this run (null in the JSON report) are left out.
        for (k, v) in &self.rel_rms_error {
            if let Some(v) = v {
                let _ = writeln!(s, "relative RMS error {k}: {v:.6}");
            }
        }
        s
    }
}
