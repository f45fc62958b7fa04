//! Crash safety: a real child process aborts at each named failpoint or is SIGKILLed at a
//! random time; the target is then absent or a valid store, and a rerun resumes and produces a
//! store byte-identical to an uninterrupted run. Also: writer poisoning after a real write
//! error (RLIMIT_FSIZE), and in-process resume checks.

mod common;
use coli_store::fsck::{check, FsckOptions, NoProgress};
use coli_store::*;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::time::{Duration, Instant};

fn crash_params() -> ModelParams {
    ModelParams {
        seed: 11,
        hidden: 256,
        inter: 96,
        layers: 3,
        experts: 6,
        alignment: 4096,
        segment_max_bytes: 200 * 1024,
        dense: 5,
        ..Default::default()
    }
}

/// Child entry: writes the crash model to $COLI_TEST_TARGET (fresh or resumed). With
/// $COLI_TEST_FSIZE, first limits the process's file size (RLIMIT_FSIZE) and checks poisoning.
#[test]
#[ignore = "child process entry, run by the other tests"]
fn child_writer() {
    let Ok(target) = std::env::var("COLI_TEST_TARGET") else {
        panic!("COLI_TEST_TARGET not set: this test is a child entry point");
    };
    let m = make_model(&crash_params());
    if let Ok(limit) = std::env::var("COLI_TEST_FSIZE") {
        let limit: u64 = limit.parse().unwrap();
        // SAFETY: plain libc calls on this process: ignore SIGXFSZ so that a write past the
        // limit fails with EFBIG instead of killing the process, then set the limit.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let rl = libc::rlimit {
                rlim_cur: limit,
                rlim_max: libc::RLIM_INFINITY,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rl), 0);
        }
        let WriterStart::Fresh(mut w) =
            StoreWriter::create_or_resume(Path::new(&target), m.spec.clone()).unwrap()
        else {
            panic!("expected a fresh start");
        };
        let first = add_all(&mut w, &m).expect_err("a write past RLIMIT_FSIZE must fail");
        assert!(
            matches!(first, StoreError::Io { .. }),
            "first error: {first}"
        );
        println!("FIRST-ERROR: {first}");
        // Every later write is refused, even a small one that would fit.
        let (k, h, i, mats) = &m.experts[0];
        let again = w
            .add_expert(*k, *h, *i, [&mats[0], &mats[1], &mats[2]])
            .unwrap_err();
        assert!(
            again.to_string().contains("refuses further writes"),
            "{again}"
        );
        let f = w.add_file("small.txt", b"x").unwrap_err();
        assert!(f.to_string().contains("refuses further writes"), "{f}");
        let fin = w.finish().unwrap_err();
        assert!(fin.to_string().contains("refuses further writes"), "{fin}");
        println!("POISON-OK");
        return;
    }
    let kind = write_model(Path::new(&target), &m);
    println!("WRITE-DONE {kind}");
}

fn reference() -> std::collections::BTreeMap<String, Vec<u8>> {
    let t = tempdir();
    let target = target_in(&t);
    write_model(&target, &make_model(&crash_params()));
    snapshot(&target)
}

/// After an interruption: the target does not exist (or is not openable) or passes fsck.
fn assert_absent_or_valid(target: &Path) {
    if target.exists() {
        let r = check(target, &FsckOptions::default(), &NoProgress);
        assert_eq!(
            r.exit_code(),
            0,
            "interrupted target exists but is damaged: {r:#?}"
        );
    } else {
        assert!(Store::open(target).is_err());
    }
}

fn run_child(target: &Path, failpoint: Option<&str>) -> std::process::Output {
    let mut c = child(
        "child_writer",
        &[("COLI_TEST_TARGET", target.display().to_string())],
    );
    if let Some(f) = failpoint {
        c.env("COLI_FAILPOINT", f);
    }
    c.output().unwrap()
}

#[test]
fn failpoints_then_resume_is_byte_identical() {
    let want = reference();
    let points = [
        "writer.after_record:1",
        "writer.after_record:7",
        "writer.after_journal:4",
        "writer.after_dense:2",
        "writer.before_index",
        "writer.before_manifest",
        "writer.before_rename",
        "writer.after_rename",
    ];
    for fp in points {
        let t = tempdir();
        let target = target_in(&t);
        let out = run_child(&target, Some(fp));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fp}: child did not abort");
        assert!(stderr.contains("failpoint"), "{fp}: {stderr}");
        assert_absent_or_valid(&target);
        let out = run_child(&target, None);
        assert!(
            out.status.success(),
            "{fp}: rerun failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let expected_kind = if fp == "writer.after_rename" || fp == "writer.before_rename" {
            "complete"
        } else {
            "resumed"
        };
        assert!(
            stdout.contains(&format!("WRITE-DONE {expected_kind}")),
            "{fp}: {stdout}"
        );
        assert!(
            snapshot(&target) == want,
            "{fp}: resumed store differs from an uninterrupted one"
        );
        assert!(!t.path().join("store.coli.partial").exists());
    }
}

#[test]
fn sigkill_at_random_times_then_resume() {
    let want = reference();
    // How long an uninterrupted child run takes.
    let t = tempdir();
    let start = Instant::now();
    assert!(run_child(&target_in(&t), None).status.success());
    let full = start.elapsed().as_micros() as u64;
    let mut rng = StdRng::seed_from_u64(5);
    for n in 0..5 {
        let t = tempdir();
        let target = target_in(&t);
        let mut c = child(
            "child_writer",
            &[("COLI_TEST_TARGET", target.display().to_string())],
        );
        let mut ch = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..full)));
        let _ = ch.kill(); // SIGKILL
        let _ = ch.wait();
        let state = if target.exists() {
            "complete"
        } else if t.path().join("store.coli.partial").exists() {
            "partial"
        } else {
            "absent"
        };
        eprintln!("kill #{n}: {state}");
        assert_absent_or_valid(&target);
        let out = run_child(&target, None);
        assert!(
            out.status.success(),
            "kill #{n}: rerun failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            snapshot(&target) == want,
            "kill #{n}: resumed store differs"
        );
    }
}

#[test]
fn write_error_poisons_the_writer() {
    let t = tempdir();
    let target = target_in(&t);
    let mut c = child(
        "child_writer",
        &[
            ("COLI_TEST_TARGET", target.display().to_string()),
            ("COLI_TEST_FSIZE", (64 * 1024).to_string()),
        ],
    );
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("POISON-OK"), "{stdout}");
    assert!(stdout.contains("FIRST-ERROR"), "{stdout}");
}

/// In-process: an interrupted build (writer dropped), a damaged journaled record, a spec change.
#[test]
fn resume_keeps_verified_prefix_and_checks_spec() {
    let want = reference();
    let m = make_model(&crash_params());
    let t = tempdir();
    let target = target_in(&t);
    {
        let WriterStart::Fresh(mut w) =
            StoreWriter::create_or_resume(&target, m.spec.clone()).unwrap()
        else {
            panic!()
        };
        for (k, h, i, mats) in &m.experts[..8] {
            w.add_expert(*k, *h, *i, [&mats[0], &mats[1], &mats[2]])
                .unwrap();
        }
        // dropped without finish: interrupted
    }
    let partial = t.path().join("store.coli.partial");
    assert!(partial.join("spec.json").exists() && !target.exists());
    // Damage the 6th record: the verified prefix is the first 5 records (plus config.json).
    let journal = std::fs::read_to_string(partial.join("journal")).unwrap();
    let line: serde_json::Value = serde_json::from_str(journal.lines().nth(6).unwrap()).unwrap();
    assert_eq!(line["kind"], "expert");
    let seg = line["segment"].as_u64().unwrap();
    let off = line["offset"].as_u64().unwrap();
    let p = partial.join(format!("segments/seg-{seg:05}.bin"));
    let mut b = std::fs::read(&p).unwrap();
    b[off as usize + 100] ^= 0x10;
    std::fs::write(&p, b).unwrap();
    // A different spec is refused, naming the difference.
    let mut other = m.spec.clone();
    other.parameters.insert("experts".into(), "int8".into());
    other.converter_version = "9.9".into();
    let e = StoreWriter::create_or_resume(&target, other)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("parameter experts") && e.contains("converter version"),
        "{e}"
    );
    // Same spec: resumed with the verified prefix.
    match StoreWriter::create_or_resume(&target, m.spec.clone()).unwrap() {
        WriterStart::Resumed(mut w, info) => {
            assert_eq!(info.experts_kept, 5);
            assert!(w.is_expert_done(m.experts[4].0));
            assert!(!w.is_expert_done(m.experts[5].0));
            // finish refuses while experts are missing, naming layers.
            add_all(&mut w, &m).unwrap();
            w.finish().unwrap();
        }
        _ => panic!("expected Resumed"),
    }
    assert!(snapshot(&target) == want);
    // A complete store with a different spec is refused, naming the difference.
    let mut other = m.spec.clone();
    other.sources[0].size += 1;
    let e = StoreWriter::create_or_resume(&target, other)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("source model.safetensors"), "{e}");
}

#[test]
fn finish_refuses_incomplete() {
    let m = make_model(&crash_params());
    let t = tempdir();
    let target = target_in(&t);
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&target, m.spec.clone()).unwrap()
    else {
        panic!()
    };
    for (k, h, i, mats) in m
        .experts
        .iter()
        .filter(|e| e.0.layer != 1 && e.0.expert != 3)
    {
        w.add_expert(*k, *h, *i, [&mats[0], &mats[1], &mats[2]])
            .unwrap();
    }
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("layers [0, 1, 2]"), "{e}");
    assert!(!target.exists());
}
