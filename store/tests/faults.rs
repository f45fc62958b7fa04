//! Faults injected in-process through the writer's file backend (`WriterFs`), at every file
//! operation of a build in turn, as redb's fuzz backend fails the N-th write: an I/O error, or a
//! torn write (half the bytes land, then the error). After the fault the writer refuses further
//! writes (or the build fails at once); a rerun with the real backend resumes and ends with a
//! store byte-identical to an uninterrupted build, and nothing but `TARGET` or
//! `TARGET.partial` is ever left. (Crashes of a real process are `crash.rs`'s.)

mod common;
use coli_store::*;
use common::*;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How the faulty operation fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Nothing is written; the operation returns EIO.
    Error,
    /// A write lands half its bytes, then returns EIO (other operations: as `Error`).
    Torn,
}

/// The OS backend, failing its `fail_at`-th operation (counted from 0) with `fault`.
struct FaultFs {
    ops: AtomicU64,
    fail_at: u64,
    fault: Fault,
}

impl FaultFs {
    fn new(fail_at: u64, fault: Fault) -> FaultFs {
        FaultFs {
            ops: AtomicU64::new(0),
            fail_at,
            fault,
        }
    }
    /// True when this operation is the one to fail.
    fn fails(&self) -> bool {
        self.ops.fetch_add(1, Ordering::SeqCst) == self.fail_at
    }
    fn eio() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EIO)
    }
}

impl WriterFs for FaultFs {
    fn write_at(&self, file: &File, path: &Path, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if self.fails() {
            if self.fault == Fault::Torn {
                OsFs.write_at(file, path, &buf[..buf.len() / 2], offset)?;
            }
            return Err(Self::eio());
        }
        OsFs.write_at(file, path, buf, offset)
    }
    fn append(&self, file: &mut File, path: &Path, buf: &[u8]) -> std::io::Result<()> {
        if self.fails() {
            if self.fault == Fault::Torn {
                OsFs.append(file, path, &buf[..buf.len() / 2])?;
            }
            return Err(Self::eio());
        }
        OsFs.append(file, path, buf)
    }
    fn sync(&self, file: &File, path: &Path) -> std::io::Result<()> {
        if self.fails() {
            return Err(Self::eio());
        }
        OsFs.sync(file, path)
    }
    fn write_file(&self, path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
        if self.fails() {
            if self.fault == Fault::Torn {
                OsFs.write_file(path, &bytes[..bytes.len() / 2], false)?;
            }
            return Err(Self::eio());
        }
        OsFs.write_file(path, bytes, sync)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        if self.fails() {
            return Err(Self::eio());
        }
        OsFs.rename(from, to)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        if self.fails() {
            return Err(Self::eio());
        }
        OsFs.sync_dir(path)
    }
}

fn params() -> ModelParams {
    ModelParams {
        seed: 5,
        hidden: 128,
        inter: 64,
        layers: 2,
        experts: 3,
        alignment: 4096,
        segment_max_bytes: 40 * 1024,
        dense: 3,
        ..Default::default()
    }
}

/// Builds `m` at `target` through `fs`; returns the first error.
fn build_with(target: &Path, m: &Model, fs: Arc<dyn WriterFs>) -> Result<(), StoreError> {
    let mut w = match StoreWriter::create_or_resume_with(target, m.spec.clone(), fs)? {
        WriterStart::Fresh(w) | WriterStart::Resumed(w, _) => w,
        WriterStart::AlreadyComplete => return Ok(()),
    };
    if let Err(e) = add_all(&mut w, m) {
        // A writer that failed refuses further writes instead of guessing.
        if matches!(e, StoreError::Io { .. }) {
            let again = add_all(&mut w, m).unwrap_err().to_string();
            assert!(again.contains("refuses further writes"), "{again}");
        }
        return Err(e);
    }
    w.finish().map(|_| ())
}

#[test]
fn every_file_operation_can_fail_and_the_rerun_ends_byte_identical() {
    let m = make_model(&params());
    // The reference: an uninterrupted build; count its file operations.
    let t = tempdir();
    let reference = target_in(&t);
    let counting = Arc::new(FaultFs::new(u64::MAX, Fault::Error));
    build_with(&reference, &m, counting.clone()).unwrap();
    let total = counting.ops.load(Ordering::SeqCst);
    assert!(total > 20, "a build does {total} file operations");
    let want = snapshot(&reference);
    for fault in [Fault::Error, Fault::Torn] {
        for n in 0..total {
            let t = tempdir();
            let target = target_in(&t);
            let r = build_with(&target, &m, Arc::new(FaultFs::new(n, fault)));
            let e = r.expect_err(&format!("operation {n} ({fault:?}) must fail the build"));
            assert!(e.to_string().contains("os error 5"), "{n} {fault:?}: {e}");
            // Only the target or its partial build exist next to it.
            let names: Vec<String> = std::fs::read_dir(t.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            let stem = target.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                names
                    .iter()
                    .all(|x| *x == stem || *x == format!("{stem}.partial")),
                "{n} {fault:?}: {names:?}"
            );
            // The rerun with the real backend completes, byte-identical.
            build_with(&target, &m, Arc::new(OsFs))
                .unwrap_or_else(|e| panic!("{n} {fault:?}: {e}"));
            assert_eq!(snapshot(&target), want, "{n} {fault:?}");
            Store::open(&target).unwrap();
        }
    }
}
