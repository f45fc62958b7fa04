//! Corruption: single-bit flips in every kind of file are detected and named; structural
//! damage gives clear errors, never a panic.

mod common;
use coli_store::fsck::{check, FsckOptions, NoProgress, Status};
use coli_store::*;
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;

fn fixture() -> (tempfile::TempDir, std::path::PathBuf, Model) {
    let t = tempdir();
    let target = target_in(&t);
    let m = make_model(&ModelParams::default());
    write_model(&target, &m);
    (t, target, m)
}

fn flip(path: &Path, pos: usize, bit: u8) {
    let mut b = std::fs::read(path).unwrap();
    b[pos] ^= 1 << bit;
    std::fs::write(path, b).unwrap();
}

/// What a flip at `pos` of file `rel` must be reported as.
enum Expect {
    /// Structure problem naming this file.
    Problem(String),
    /// Exactly this bad record (and its segment's body problem).
    Record(ExpertKey, u64),
    /// Exactly this dense tensor.
    Dense(String),
    /// dense.bin padding: whole-file problem only.
    DensePadding,
    /// Exactly this copied file.
    File(String),
}

#[test]
fn single_bit_flips_are_detected_and_named() {
    let (_t, target, _m) = fixture();
    let store = Store::open(&target).unwrap();
    let man = store.manifest().clone();
    let index: Vec<IndexRecord> = store.index().to_vec();
    drop(store);
    let mut files: Vec<String> = vec!["MANIFEST".into(), "INDEX".into(), "dense.bin".into()];
    for id in 0..man.segment_count {
        files.push(format!("segments/seg-{id:05}.bin"));
    }
    for f in &man.files {
        files.push(format!("files/{}", f.name));
    }
    assert!(man.segment_count >= 2 && man.files.len() >= 3);
    let mut rng = StdRng::seed_from_u64(0xC011);
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    let flips = 240;
    for n in 0..flips {
        let rel = &files[n % files.len()];
        let path = target.join(rel);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        let pos = rng.gen_range(0..len);
        let bit = rng.gen_range(0..8u8);
        let expect = if let Some(seg) = rel.strip_prefix("segments/seg-") {
            let id: u32 = seg.trim_end_matches(".bin").parse().unwrap();
            let pos = pos as u64;
            match index.iter().find(|r| {
                r.segment.get() == id
                    && r.offset.get() <= pos
                    && pos < r.offset.get() + r.length.get()
            }) {
                Some(r) => Expect::Record(r.key(), r.offset.get()),
                None => Expect::Problem(rel.clone()),
            }
        } else if rel == "dense.bin" {
            let pos = pos as u64;
            match man.dense.iter().find(|e| {
                (e.offset <= pos && pos < e.offset + e.length)
                    || (e.scales_offset <= pos && pos < e.scales_offset + e.scales_length)
            }) {
                Some(e) => Expect::Dense(e.name.clone()),
                None => Expect::DensePadding,
            }
        } else if let Some(name) = rel.strip_prefix("files/") {
            Expect::File(name.to_string())
        } else {
            Expect::Problem(rel.clone())
        };
        flip(&path, pos, bit);
        let r = check(&target, &FsckOptions::default(), &NoProgress);
        let ctx = format!("flip #{n} in {rel} at {pos} bit {bit}: {r:#?}");
        assert_eq!(r.status, Status::Damaged, "{ctx}");
        assert_eq!(r.exit_code(), 1, "{ctx}");
        match &expect {
            Expect::Problem(file) => {
                assert!(r.problems.iter().any(|p| &p.file == file), "{ctx}");
                assert!(r.bad_records.is_empty() && r.bad_dense.is_empty(), "{ctx}");
                // The store refuses to open, naming the file.
                let e = Store::open(&target).err().expect(&ctx).to_string();
                assert!(e.contains(file.as_str()), "{e} / {ctx}");
            }
            Expect::Record(key, off) => {
                assert_eq!(r.bad_records.len(), 1, "{ctx}");
                let b = &r.bad_records[0];
                assert_eq!(
                    (b.layer, b.expert, b.offset),
                    (key.layer, key.expert, *off),
                    "{ctx}"
                );
                assert_eq!(&b.file, rel, "{ctx}");
                assert_ne!(b.expected, b.found);
                assert!(r.problems.iter().all(|p| &p.file == rel), "{ctx}");
                let store = Store::open(&target).unwrap();
                match store.fetch_one(*key) {
                    Err(StoreError::Checksum {
                        what, file, offset, ..
                    }) => {
                        assert_eq!(what, key.to_string());
                        assert_eq!(&file, rel);
                        assert_eq!(offset, *off);
                    }
                    other => panic!("fetch of damaged {key}: {:?} / {ctx}", other.map(|b| b.key)),
                }
                // Neighbours still fetch.
                for rec in &index {
                    if rec.key() != *key {
                        store.fetch_one(rec.key()).unwrap();
                    }
                }
            }
            Expect::Dense(name) => {
                assert_eq!(r.bad_dense.len(), 1, "{ctx}");
                assert_eq!(&r.bad_dense[0].name, name, "{ctx}");
                assert!(r.bad_records.is_empty() && r.bad_files.is_empty(), "{ctx}");
                let store = Store::open(&target).unwrap();
                assert!(
                    matches!(store.dense(name), Err(StoreError::Checksum { .. })),
                    "{ctx}"
                );
            }
            Expect::DensePadding => {
                assert!(r.bad_dense.is_empty(), "{ctx}");
                assert!(r.problems.iter().any(|p| p.file == "dense.bin"), "{ctx}");
            }
            Expect::File(name) => {
                assert_eq!(r.bad_files.len(), 1, "{ctx}");
                assert_eq!(&r.bad_files[0].name, name, "{ctx}");
                let store = Store::open(&target).unwrap();
                assert!(
                    matches!(store.file(name), Err(StoreError::Checksum { .. })),
                    "{ctx}"
                );
            }
        }
        *counts.entry(rel.clone()).or_default() += 1;
        flip(&path, pos, bit);
    }
    assert_eq!(counts.values().sum::<usize>(), flips);
    let r = check(&target, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:#?}");
}

fn open_err(dir: &Path) -> String {
    match Store::open(dir) {
        Ok(_) => panic!("damaged store opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_segment() {
    let (_t, target, _) = fixture();
    let p = target.join("segments/seg-00001.bin");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 512)
        .unwrap();
    let e = open_err(&target);
    assert!(
        e.contains("segments/seg-00001.bin") && e.contains("truncated"),
        "{e}"
    );
    let r = check(&target, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 1);
    // Shorter than a header.
    std::fs::write(&p, b"short").unwrap();
    let e = open_err(&target);
    assert!(e.contains("seg-00001.bin") && e.contains("shorter"), "{e}");
    std::fs::remove_file(&p).unwrap();
    let e = open_err(&target);
    assert!(e.contains("seg-00001.bin"), "{e}");
}

#[test]
fn wrong_magic() {
    for file in ["MANIFEST", "INDEX", "segments/seg-00000.bin"] {
        let (_t, target, _) = fixture();
        let p = target.join(file);
        let mut b = std::fs::read(&p).unwrap();
        b[0..4].copy_from_slice(b"XXXX");
        std::fs::write(&p, b).unwrap();
        let e = open_err(&target);
        assert!(e.contains(file) && e.contains("magic"), "{e}");
        assert_eq!(
            check(&target, &FsckOptions::default(), &NoProgress).exit_code(),
            1
        );
    }
}

#[test]
fn newer_version() {
    let (_t, target, _) = fixture();
    let newer = FORMAT_VERSION + 1;
    rewrite_manifest(&target, newer, |v| v["format_version"] = newer.into());
    match Store::open(&target) {
        Err(StoreError::Format(coli_format::FormatError::NewerVersion { file, found, known })) => {
            assert_eq!(
                (file.as_str(), found, known),
                ("MANIFEST", newer, FORMAT_VERSION)
            );
        }
        other => panic!("expected NewerVersion, got {:?}", other.err()),
    }
    let r = check(&target, &FsckOptions::default(), &NoProgress);
    assert_eq!((r.status, r.exit_code()), (Status::Unusable, 2));
    // A header version that the intact body contradicts is damage, not a newer version.
    rewrite_manifest(&target, 1, |v| v["format_version"] = 1.into());
    let p = target.join("MANIFEST");
    let mut b = std::fs::read(&p).unwrap();
    b[8] = 5;
    std::fs::write(&p, b).unwrap();
    assert!(matches!(
        Store::open(&target),
        Err(StoreError::Format(coli_format::FormatError::Format { .. }))
    ));
    assert_eq!(
        check(&target, &FsckOptions::default(), &NoProgress).exit_code(),
        1
    );
}

#[test]
fn index_out_of_bounds_and_overlap() {
    let (_t, target, _) = fixture();
    rewrite_index(&target, |recs| {
        recs[1][16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    });
    let e = open_err(&target);
    assert!(e.contains("INDEX") && e.contains("beyond the end"), "{e}");
    let (_t, target, _) = fixture();
    rewrite_index(&target, |recs| {
        let off0 = u64::from_le_bytes(recs[0][16..24].try_into().unwrap());
        let seg0 = recs[0][8..12].to_vec();
        recs[1][8..12].copy_from_slice(&seg0);
        recs[1][16..24].copy_from_slice(&off0.to_le_bytes());
    });
    let e = open_err(&target);
    assert!(e.contains("INDEX") && e.contains("overlap"), "{e}");
    let (_t, target, _) = fixture();
    rewrite_index(&target, |recs| {
        recs[2][16..24].copy_from_slice(&4100u64.to_le_bytes());
    });
    let e = open_err(&target);
    assert!(e.contains("INDEX") && e.contains("multiple"), "{e}");
    let (_t, target, _) = fixture();
    rewrite_index(&target, |recs| recs.swap(0, 1));
    let e = open_err(&target);
    assert!(e.contains("INDEX") && e.contains("not sorted"), "{e}");
    // Index shorter than its header claims.
    let (_t, target, _) = fixture();
    let p = target.join("INDEX");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 64]).unwrap();
    let e = open_err(&target);
    assert!(e.contains("INDEX"), "{e}");
}

#[test]
fn missing_layer() {
    let (_t, target, _) = fixture();
    rewrite_index(&target, |recs| {
        recs.retain(|r| u32::from_le_bytes(r[0..4].try_into().unwrap()) != 1)
    });
    match Store::open(&target) {
        Err(StoreError::Incomplete { layers, .. }) => assert_eq!(layers, vec![1]),
        other => panic!("expected Incomplete, got {:?}", other.err()),
    }
    let r = check(&target, &FsckOptions::default(), &NoProgress);
    assert_eq!(r.exit_code(), 1);
    assert!(r.problems[0].what.contains("layers [1]"), "{r:?}");
}

#[test]
fn garbage_files_never_panic() {
    let mut rng = StdRng::seed_from_u64(99);
    for file in ["MANIFEST", "INDEX", "dense.bin", "segments/seg-00000.bin"] {
        for len in [0usize, 1, 23, 24, 63, 64, 65, 600, 5000] {
            let (_t, target, _) = fixture();
            let garbage: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            std::fs::write(target.join(file), garbage).unwrap();
            assert!(Store::open(&target).is_err(), "{file} {len}");
            assert_ne!(
                check(&target, &FsckOptions::default(), &NoProgress).exit_code(),
                0
            );
        }
    }
}

#[test]
fn unusable_inputs_exit_2() {
    let t = tempdir();
    for p in [t.path().join("nope"), t.path().to_path_buf()] {
        let r = check(&p, &FsckOptions::default(), &NoProgress);
        assert_eq!((r.status, r.exit_code()), (Status::Unusable, 2), "{r:?}");
    }
}

#[test]
fn quick_skips_checksums_but_not_structure() {
    let (_t, target, _) = fixture();
    let r = check(
        &target,
        &FsckOptions {
            quick: true,
            mirrors: vec![],
        },
        &NoProgress,
    );
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.records_checked, 0);
    // A flipped record byte passes --quick, fails the full check.
    let store = Store::open(&target).unwrap();
    let rec = store.index()[0];
    drop(store);
    let p = target.join(format!("segments/seg-{:05}.bin", rec.segment.get()));
    flip(&p, rec.offset.get() as usize + 3, 1);
    assert_eq!(
        check(
            &target,
            &FsckOptions {
                quick: true,
                mirrors: vec![]
            },
            &NoProgress
        )
        .exit_code(),
        0
    );
    assert_eq!(
        check(&target, &FsckOptions::default(), &NoProgress).exit_code(),
        1
    );
    // A truncated file is structure: --quick fails.
    std::fs::write(target.join("files/tokenizer.json"), b"x").unwrap();
    assert_eq!(
        check(
            &target,
            &FsckOptions {
                quick: true,
                mirrors: vec![]
            },
            &NoProgress
        )
        .exit_code(),
        1
    );
}

#[test]
fn mirrors() {
    use coli_store::fsck::MirrorStatus;
    let (t, target, _) = fixture();
    let mirror = t.path().join("mirror");
    std::fs::create_dir_all(mirror.join("segments")).unwrap();
    // seg 0 copied intact, seg 1 missing.
    std::fs::copy(
        target.join("segments/seg-00000.bin"),
        mirror.join("segments/seg-00000.bin"),
    )
    .unwrap();
    let opts = FsckOptions {
        quick: false,
        mirrors: vec![mirror.clone()],
    };
    let r = check(&target, &opts, &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:#?}");
    let st: Vec<MirrorStatus> = r.mirrors[0].files.iter().map(|f| f.status).collect();
    assert_eq!(st[0], MirrorStatus::Admitted);
    assert!(st[1..].iter().all(|s| *s == MirrorStatus::Missing));
    // Damage a record in the copy.
    let store = Store::open(&target).unwrap();
    let rec = *store.index().iter().find(|r| r.segment.get() == 0).unwrap();
    drop(store);
    let mp = mirror.join("segments/seg-00000.bin");
    flip(&mp, rec.offset.get() as usize + 10, 4);
    let r = check(&target, &opts, &NoProgress);
    assert_eq!(r.exit_code(), 1);
    let f = &r.mirrors[0].files[0];
    assert_eq!(f.status, MirrorStatus::Damaged);
    assert_eq!(
        (f.bad_records[0].layer, f.bad_records[0].expert),
        (rec.key().layer, rec.key().expert)
    );
    assert!(r.bad_records.is_empty(), "primary is intact");
    // A copy of another segment under this name: mismatched.
    std::fs::copy(target.join("segments/seg-00001.bin"), &mp).unwrap();
    let r = check(&target, &opts, &NoProgress);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.mirrors[0].files[0].status, MirrorStatus::Mismatched);
    // A segment of a different store: mismatched.
    let (_t2, other, _) = {
        let t2 = tempdir();
        let o = target_in(&t2);
        let p = ModelParams {
            seed: 8,
            ..Default::default()
        };
        let mut m = make_model(&p);
        m.spec.parameters.insert("x".into(), "y".into());
        write_model(&o, &m);
        (t2, o, ())
    };
    std::fs::copy(other.join("segments/seg-00000.bin"), &mp).unwrap();
    let r = check(&target, &opts, &NoProgress);
    assert_eq!(r.mirrors[0].files[0].status, MirrorStatus::Mismatched);
    assert!(r.mirrors[0].files[0]
        .detail
        .as_ref()
        .unwrap()
        .contains("store id"));
}
