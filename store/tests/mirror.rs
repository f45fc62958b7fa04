//! Mirrors on real files: staged segments (format, admission, damage), full copies, mirror-set
//! admission (which drives hold which records), fsck of mirrors and `repair`.

mod common;
use coli_store::fsck::{check, repair, FsckOptions, MirrorStatus, NoProgress, Status};
use coli_store::mirror::copy::{copy_segments, CopyOutcome};
use coli_store::mirror::{self, stage_records, MirrorFileKind, PrimaryInfo};
use coli_store::*;
use common::*;
use std::path::{Path, PathBuf};

/// A store of 2 layers x 3 experts spread over several segments, and an empty mirror dir. Its
/// records' gate and up are stored interleaved (coli-convert's default order, format version
/// 7, INDEX flag bit 1): staged copies keep the primary's flags.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempdir();
    let target = target_in(&t);
    let mut model = make_model(&ModelParams::default());
    model.spec.matrix_order = MatrixOrder::Interleaved;
    write_model(&target, &model);
    assert!(Store::open(&target).unwrap().index()[0].is_interleaved());
    let m = t.path().join("mirror");
    std::fs::create_dir_all(&m).unwrap();
    (t, target, m)
}

fn flip(path: &Path, pos: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[pos as usize] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

fn opts(m: &[PathBuf]) -> FsckOptions {
    FsckOptions {
        quick: false,
        mirrors: m.to_vec(),
    }
}

#[test]
fn staged_segment_holds_a_subset_byte_identical_and_is_admitted() {
    let (_t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    let keys = [
        ExpertKey::new(1, 2),
        ExpertKey::new(0, 1),
        ExpertKey::new(0, 1),
    ];
    let w = stage_records(&store, &m, &keys, 0).unwrap();
    assert_eq!(w.records, 2, "duplicates are written once");
    assert_eq!(w.path, m.join("staged/stg-00000.bin"));
    assert_eq!(std::fs::metadata(&w.path).unwrap().len(), w.bytes);
    // No temporary file is left.
    let names: Vec<_> = std::fs::read_dir(m.join("staged")).unwrap().collect();
    assert_eq!(names.len(), 1);
    // Layout: header, index, records at multiples of the alignment, byte-identical.
    let bytes = std::fs::read(&w.path).unwrap();
    assert_eq!(&bytes[..8], b"COLISTG\0");
    let primary = PrimaryInfo::of(&store).unwrap();
    let set = mirror::admit(&primary, std::slice::from_ref(&m)).unwrap();
    let staged: Vec<_> = set
        .files
        .iter()
        .filter(|f| f.kind == MirrorFileKind::Staged)
        .collect();
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].status, MirrorStatus::Admitted);
    let si = staged[0].staged.as_ref().unwrap();
    assert_eq!(si.entries.len(), 2);
    for e in &si.entries {
        assert_eq!(e.offset.get() % 512, 0);
        let pr = store.record(e.key()).unwrap();
        let want = store.fetch_one(e.key()).unwrap();
        let off = e.offset.get() as usize;
        assert_eq!(&bytes[off..off + pr.length.get() as usize], want.bytes());
    }
    // Holders: the staged records on drive 1, every other record on the primary only.
    for (pos, r) in store.index().iter().enumerate() {
        let want: Vec<u32> = if keys.contains(&r.key()) {
            vec![0, 1]
        } else {
            vec![0]
        };
        assert_eq!(set.holders(pos), want, "{}", r.key());
    }
    // Every primary segment copy is reported missing, once each.
    let missing = set.rejected().count();
    assert_eq!(missing, primary.segments.len());
    // A second stage gets the next id and keeps the first file.
    let w2 = stage_records(&store, &m, &[ExpertKey::new(0, 0)], 0).unwrap();
    assert_eq!(w2.path, m.join("staged/stg-00001.bin"));
    assert!(w.path.exists());
    // fsck: clean, staged files admitted with their record counts.
    let r = check(&target, &opts(std::slice::from_ref(&m)), &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:#?}");
    let st: Vec<_> = r.mirrors[0]
        .files
        .iter()
        .filter(|f| f.kind == "staged")
        .map(|f| (f.status, f.records))
        .collect();
    assert_eq!(
        st,
        vec![(MirrorStatus::Admitted, 2), (MirrorStatus::Admitted, 1)]
    );
}

#[test]
fn stage_refuses_unknown_keys_missing_dirs_and_a_short_reserve() {
    let (t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    let e = stage_records(&store, &m, &[ExpertKey::new(9, 0)], 0).unwrap_err();
    assert!(e.to_string().contains("layer 9 expert 0"), "{e}");
    let e = stage_records(&store, &m, &[], 0).unwrap_err();
    assert!(e.to_string().contains("no records"), "{e}");
    let e = stage_records(&store, &t.path().join("nope"), &[ExpertKey::new(0, 0)], 0).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = stage_records(&store, &m, &[ExpertKey::new(0, 0)], u64::MAX / 2).unwrap_err();
    assert!(e.to_string().contains("reserve"), "{e}");
    assert!(
        !m.join("staged").exists() || std::fs::read_dir(m.join("staged")).unwrap().count() == 0
    );
}

#[test]
fn damaged_staged_record_is_found_blamed_and_repaired() {
    let (_t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    let key = ExpertKey::new(1, 0);
    let w = stage_records(&store, &m, &[ExpertKey::new(0, 2), key], 0).unwrap();
    let primary = PrimaryInfo::of(&store).unwrap();
    let set = mirror::admit(&primary, std::slice::from_ref(&m)).unwrap();
    let si = set
        .files
        .iter()
        .find_map(|f| f.staged.as_ref())
        .unwrap()
        .clone();
    let e = si.entries.iter().find(|e| e.key() == key).unwrap();
    flip(&w.path, e.offset.get() + 100);
    drop(store);
    // Admission reads no record bytes: still admitted; fsck reads them: damaged, one record.
    let o = opts(std::slice::from_ref(&m));
    let r = check(&target, &o, &NoProgress);
    assert_eq!(r.exit_code(), 1);
    let f = r.mirrors[0]
        .files
        .iter()
        .find(|f| f.kind == "staged")
        .unwrap();
    assert_eq!(f.status, MirrorStatus::Damaged);
    assert_eq!(f.bad_records.len(), 1);
    assert_eq!((f.bad_records[0].layer, f.bad_records[0].expert), (1, 0));
    assert!(r.bad_records.is_empty(), "the primary is not blamed");
    let before_primary = snapshot(&target);
    let acts = repair(&target, &o, &r);
    assert_eq!(acts.len(), 1);
    assert!(acts[0].repaired, "{acts:?}");
    assert!(acts[0].source.as_ref().unwrap().contains("seg-"));
    assert_eq!(
        snapshot(&target),
        before_primary,
        "the good copy is not written"
    );
    let r = check(&target, &o, &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:#?}");
}

#[test]
fn damaged_primary_record_is_repaired_from_a_mirror_copy() {
    let (_t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    let out = copy_segments(&store, &m, 0).unwrap();
    assert!(out.iter().all(|o| matches!(o, CopyOutcome::Copied(..))));
    let rec = store.index()[3];
    drop(store);
    let seg = target.join(format!("segments/seg-{:05}.bin", rec.segment.get()));
    flip(&seg, rec.offset.get() + 7);
    let o = opts(std::slice::from_ref(&m));
    let r = check(&target, &o, &NoProgress);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.bad_records.len(), 1);
    let acts = repair(&target, &o, &r);
    assert!(acts.iter().all(|a| a.repaired), "{acts:?}");
    assert!(acts[0].source.as_ref().unwrap().contains("mirror"));
    let r = check(&target, &o, &NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:#?}");
    // Without a good copy nothing is rewritten and damage remains.
    let seg0 = m.join("segments/seg-00000.bin");
    let p0 = target.join("segments/seg-00000.bin");
    let store = Store::open(&target).unwrap();
    let rec = *store.index().iter().find(|r| r.segment.get() == 0).unwrap();
    drop(store);
    flip(&seg0, rec.offset.get() + 1);
    flip(&p0, rec.offset.get() + 2);
    let r = check(&target, &o, &NoProgress);
    let acts = repair(&target, &o, &r);
    assert_eq!(acts.len(), 2);
    assert!(
        acts.iter().all(|a| !a.repaired && a.error.is_some()),
        "{acts:?}"
    );
    assert_eq!(check(&target, &o, &NoProgress).exit_code(), 1);
}

#[test]
fn truncated_and_foreign_files_are_rejected_once_and_never_rewritten() {
    let (t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    copy_segments(&store, &m, 0).unwrap();
    // Copying again keeps what is there.
    let again = copy_segments(&store, &m, 0).unwrap();
    assert!(again.iter().all(|o| matches!(o, CopyOutcome::Present(_))));
    let w = stage_records(&store, &m, &[ExpertKey::new(0, 0)], 0).unwrap();
    // Truncate a copy and the staged file.
    let s1 = m.join("segments/seg-00001.bin");
    let f = std::fs::OpenOptions::new().write(true).open(&s1).unwrap();
    let l = f.metadata().unwrap().len();
    f.set_len(l - 100).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&w.path)
        .unwrap();
    let l = f.metadata().unwrap().len();
    f.set_len(l - 512).unwrap();
    let primary = PrimaryInfo::of(&store).unwrap();
    let set = mirror::admit(&primary, std::slice::from_ref(&m)).unwrap();
    let rej: Vec<_> = set.rejected().map(|f| (f.rel.clone(), f.status)).collect();
    assert_eq!(
        rej,
        vec![
            ("segments/seg-00001.bin".to_string(), MirrorStatus::Damaged),
            ("staged/stg-00000.bin".to_string(), MirrorStatus::Damaged)
        ]
    );
    // Records of segment 1 are held by the primary only.
    for (pos, r) in store.index().iter().enumerate() {
        let n = set.holders(pos).len();
        assert_eq!(n, if r.segment.get() == 1 { 1 } else { 2 }, "{}", r.key());
    }
    // copy leaves the damaged file alone.
    let out = copy_segments(&store, &m, 0).unwrap();
    assert!(out
        .iter()
        .any(|o| matches!(o, CopyOutcome::Blocked(r, _) if r == "segments/seg-00001.bin")));
    let snap = snapshot(&m);
    let o = opts(std::slice::from_ref(&m));
    let r = check(&target, &o, &NoProgress);
    assert_eq!(r.exit_code(), 1);
    let acts = repair(&target, &o, &r);
    assert!(
        acts.is_empty(),
        "no record-level damage to rewrite: {acts:?}"
    );
    assert_eq!(snapshot(&m), snap);
    // A staged file of another store is mismatched.
    let t2 = tempdir();
    let other = target_in(&t2);
    let mut om = make_model(&ModelParams {
        seed: 9,
        ..Default::default()
    });
    om.spec.parameters.insert("x".into(), "y".into());
    write_model(&other, &om);
    let ostore = Store::open(&other).unwrap();
    let m2 = t.path().join("m2");
    std::fs::create_dir_all(&m2).unwrap();
    stage_records(&ostore, &m2, &[ExpertKey::new(0, 0)], 0).unwrap();
    let set = mirror::admit(&primary, std::slice::from_ref(&m2)).unwrap();
    let f = set
        .files
        .iter()
        .find(|f| f.kind == MirrorFileKind::Staged)
        .unwrap();
    assert_eq!(f.status, MirrorStatus::Mismatched);
    assert!(f.detail.as_ref().unwrap().contains("store id"));
}

#[test]
fn nonexistent_mirror_dir_is_unusable_input() {
    let (t, target, _m) = fixture();
    let r = check(&target, &opts(&[t.path().join("no-such-dir")]), &NoProgress);
    assert_eq!(r.status, Status::Unusable);
    assert_eq!(r.exit_code(), 2);
    assert!(r.problems[0].what.contains("does not exist"));
    let store = Store::open(&target).unwrap();
    let primary = PrimaryInfo::of(&store).unwrap();
    assert!(mirror::admit(&primary, &[t.path().join("no-such-dir")]).is_err());
}

#[test]
fn staged_header_and_index_damage_is_detected() {
    let (_t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    let primary = PrimaryInfo::of(&store).unwrap();
    let w = stage_records(&store, &m, &[ExpertKey::new(0, 0), ExpertKey::new(1, 1)], 0).unwrap();
    let orig = std::fs::read(&w.path).unwrap();
    // Header field, header padding, index entry, index padding: each damaged.
    for pos in [20u64, 100, 512 + 3, 512 + 64 + 10, 512 + 200] {
        let mut b = orig.clone();
        b[pos as usize] ^= 1;
        std::fs::write(&w.path, &b).unwrap();
        let set = mirror::admit(&primary, std::slice::from_ref(&m)).unwrap();
        let f = set
            .files
            .iter()
            .find(|f| f.kind == MirrorFileKind::Staged)
            .unwrap();
        assert_eq!(
            f.status,
            MirrorStatus::Damaged,
            "flip at {pos}: {:?}",
            f.detail
        );
        assert!(set.copies.iter().all(|c| c.is_empty()));
    }
}

#[test]
fn measured_weights_are_cached_per_store_and_device() {
    let (t, target, m) = fixture();
    let store = Store::open(&target).unwrap();
    copy_segments(&store, &m, 0).unwrap();
    let primary = PrimaryInfo::of(&store).unwrap();
    let set = mirror::admit(&primary, std::slice::from_ref(&m)).unwrap();
    let state = t.path().join("state");
    let w = mirror::weights::measure(&primary, &set, Some(&state), false).unwrap();
    assert_eq!(w.len(), 2);
    assert!(w.iter().all(|x| *x > 0.0 && x.is_finite()), "{w:?}");
    // The cache holds one entry per drive, keyed by store id, device and directory; a cached
    // value is used as is (no probe) until a remeasure.
    let path = state.join(mirror::weights::CACHE_FILE);
    let mut cache: std::collections::BTreeMap<String, f64> =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(cache.len(), 2);
    assert!(cache
        .keys()
        .all(|k| k.starts_with(&store.manifest().store_id.to_string())));
    for v in cache.values_mut() {
        *v = 12345.0;
    }
    std::fs::write(&path, serde_json::to_vec(&cache).unwrap()).unwrap();
    let w = mirror::weights::measure(&primary, &set, Some(&state), false).unwrap();
    assert_eq!(w, vec![12345.0, 12345.0]);
    let w = mirror::weights::measure(&primary, &set, Some(&state), true).unwrap();
    assert!(w.iter().all(|x| *x != 12345.0), "{w:?}");
    // Without a cache directory the probe just runs.
    assert_eq!(
        mirror::weights::measure(&primary, &set, None, false)
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn disk_weights_must_match_the_drives_even_without_mirrors() {
    let (_t, store, _mirror) = fixture();
    for w in [vec![5.0, 5.0], vec![]] {
        let e = Store::open_with(
            &store,
            &OpenOptions {
                disk_weights: Some(w.clone()),
                ..OpenOptions::default()
            },
        )
        .err()
        .unwrap_or_else(|| panic!("{w:?} weights for one drive were accepted"));
        assert!(e.to_string().contains("--disk-weights"), "{e}");
        assert!(e.to_string().contains("for 1 drive"), "{e}");
    }
    Store::open_with(
        &store,
        &OpenOptions {
            disk_weights: Some(vec![3.0]),
            ..OpenOptions::default()
        },
    )
    .unwrap();
}

#[test]
fn queue_depth_above_the_maximum_is_refused_by_name() {
    let (_t, store, _mirror) = fixture();
    let e = Store::open_with(
        &store,
        &OpenOptions {
            queue_depth: Some(MAX_QUEUE_DEPTH + 1),
            ..OpenOptions::default()
        },
    )
    .err()
    .expect("queue depth above the maximum accepted");
    assert!(e.to_string().contains("queue depth 257"), "{e}");
    Store::open_with(
        &store,
        &OpenOptions {
            queue_depth: Some(MAX_QUEUE_DEPTH),
            ..OpenOptions::default()
        },
    )
    .unwrap();
}
