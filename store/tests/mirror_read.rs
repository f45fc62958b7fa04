//! Reading through mirrors on real files: the bytes fetched never depend on the mirrors (full,
//! partial, striped, damaged, truncated mid-run, deleted mid-run); reads follow the assignment;
//! faults fall back, are counted and blamed on the right drive.

mod common;
use coli_store::mirror::copy::copy_segments;
use coli_store::mirror::{self, stage_records, PrimaryInfo};
use coli_store::*;
use common::*;
use std::path::{Path, PathBuf};

/// A store of 3 layers x 8 experts (records of ~8 KiB at alignment 512), several segments.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempdir();
    let target = target_in(&t);
    let p = ModelParams {
        layers: 3,
        experts: 8,
        segment_max_bytes: 64 * 1024,
        ..Default::default()
    };
    write_model(&target, &make_model(&p));
    (t, target)
}

fn all_keys(store: &Store) -> Vec<ExpertKey> {
    store.index().iter().map(|r| r.key()).collect()
}

fn open(target: &Path, mirrors: &[PathBuf], weights: Option<Vec<f64>>, stripe: u64) -> Store {
    Store::open_with(
        target,
        &OpenOptions {
            mirrors: mirrors.to_vec(),
            disk_weights: weights,
            stripe_threshold: stripe,
            engine: IoEngineChoice::Engine("pread"),
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

/// Every record, fetched one at a time, as one batch and into a caller's buffer
/// (`Store::fetch_into`, the C ABI's path): all three the same.
fn contents(store: &Store) -> Vec<Vec<u8>> {
    let keys = all_keys(store);
    let one: Vec<Vec<u8>> = keys
        .iter()
        .map(|&k| store.fetch_one(k).unwrap().bytes().to_vec())
        .collect();
    let batch: Vec<Vec<u8>> = store
        .fetch(&keys)
        .unwrap()
        .iter()
        .map(|b| b.bytes().to_vec())
        .collect();
    assert_eq!(one, batch);
    let mut buf = AlignedBuf::new(
        one.iter().map(Vec::len).max().unwrap_or(0),
        store.buffer_alignment(),
    );
    for (k, want) in keys.iter().zip(&one) {
        store.fetch_into(*k, buf.as_mut_slice()).unwrap();
        assert_eq!(&buf[..want.len()], &want[..], "{k}: fetch_into");
    }
    one
}

fn mirror_dir(t: &tempfile::TempDir, name: &str) -> PathBuf {
    let m = t.path().join(name);
    std::fs::create_dir_all(&m).unwrap();
    m
}

#[test]
fn same_bytes_with_full_and_partial_mirrors_reads_follow_the_assignment() {
    let (t, target) = fixture();
    let base = contents(&Store::open(&target).unwrap());
    let store = Store::open(&target).unwrap();
    assert!(store.mirror_stats().is_none());
    let m1 = mirror_dir(&t, "m1");
    let m2 = mirror_dir(&t, "m2");
    copy_segments(&store, &m1, 0).unwrap();
    let keys = all_keys(&store);
    let half: Vec<ExpertKey> = keys.iter().copied().step_by(2).collect();
    stage_records(&store, &m2, &half, 0).unwrap();
    drop(store);
    for (mirrors, weights) in [
        (vec![m1.clone()], vec![2.0, 1.0]),
        (vec![m2.clone()], vec![1.0, 1.0]),
        (vec![m1.clone(), m2.clone()], vec![1.0, 1.0, 1.0]),
    ] {
        // No striping: every read goes to the assigned drive.
        let s = open(&target, &mirrors, Some(weights.clone()), u64::MAX);
        let per_key: Vec<Vec<u8>> = keys
            .iter()
            .map(|&k| s.fetch_one(k).unwrap().bytes().to_vec())
            .collect();
        assert_eq!(per_key, base, "mirrors {mirrors:?}");
        let st = s.mirror_stats().unwrap();
        // Expected per-drive reads from the assignment over the drives holding each record.
        let primary = PrimaryInfo::of(&s).unwrap();
        let set = mirror::admit(&primary, &mirrors).unwrap();
        let mut want = vec![0u64; weights.len()];
        for pos in 0..keys.len() {
            want[mirror::assign(pos as u64, &set.holders(pos), &weights).unwrap() as usize] += 1;
        }
        let got: Vec<u64> = st.drives.iter().map(|d| d.reads).collect();
        assert_eq!(got, want, "mirrors {mirrors:?}");
        assert!(got[1..].iter().sum::<u64>() > 0, "mirrors serve reads");
        assert_eq!(
            (
                st.fallbacks,
                st.checksum_failures,
                st.read_errors,
                st.striped_reads
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(contents(&s), base);
    }
    // Partial mirror: a record the mirror lacks is only ever read from the primary.
    let s = open(
        &target,
        std::slice::from_ref(&m2),
        Some(vec![1.0, 1000.0]),
        u64::MAX,
    );
    for (pos, &k) in keys.iter().enumerate() {
        let before = s.mirror_stats().unwrap().drives[0].reads;
        s.fetch_one(k).unwrap();
        let after = s.mirror_stats().unwrap().drives[0].reads;
        if pos % 2 == 1 {
            assert_eq!(after, before + 1, "{k} is on the primary only");
        }
    }
}

#[test]
fn striped_reads_split_by_weight_and_give_the_same_bytes() {
    let (t, target) = fixture();
    let base = contents(&Store::open(&target).unwrap());
    let store = Store::open(&target).unwrap();
    let m1 = mirror_dir(&t, "m1");
    copy_segments(&store, &m1, 0).unwrap();
    let keys = all_keys(&store);
    let len = store.index()[0].length.get();
    drop(store);
    let s = open(&target, std::slice::from_ref(&m1), Some(vec![1.0, 1.0]), 0);
    let got: Vec<Vec<u8>> = keys
        .iter()
        .map(|&k| s.fetch_one(k).unwrap().bytes().to_vec())
        .collect();
    assert_eq!(got, base);
    let st = s.mirror_stats().unwrap();
    assert_eq!(st.striped_reads, keys.len() as u64);
    // Each record split in two aligned halves (pieces of 4096-byte units).
    let total = len * keys.len() as u64;
    assert_eq!(st.drives[0].bytes + st.drives[1].bytes, total);
    let p = mirror::stripe_plan(len, 4096, &[0, 1], &[1.0, 1.0]);
    assert_eq!(st.drives[1].bytes, p[1].len * keys.len() as u64);
    // Batches are not striped.
    s.fetch(&keys).unwrap();
    assert_eq!(s.mirror_stats().unwrap().striped_reads, keys.len() as u64);
}

#[test]
fn damaged_truncated_and_deleted_mirror_files_degrade_speed_only() {
    let (t, target) = fixture();
    let base = contents(&Store::open(&target).unwrap());
    let store = Store::open(&target).unwrap();
    let m1 = mirror_dir(&t, "m1");
    copy_segments(&store, &m1, 0).unwrap();
    let keys = all_keys(&store);
    let primary_snapshot = snapshot(&target);
    // Corrupt one byte of every record copy in the mirror's segment 0 (after open: admission
    // reads headers only), with all reads assigned to the mirror.
    let recs0: Vec<IndexRecord> = store
        .index()
        .iter()
        .filter(|r| r.segment.get() == 0)
        .copied()
        .collect();
    drop(store);
    let s = open(
        &target,
        std::slice::from_ref(&m1),
        Some(vec![1e-9, 1.0]),
        u64::MAX,
    );
    let seg0 = m1.join("segments/seg-00000.bin");
    let mut b = std::fs::read(&seg0).unwrap();
    for r in &recs0[..2] {
        b[r.offset.get() as usize + 33] ^= 0x01;
    }
    std::fs::write(&seg0, &b).unwrap();
    let mirror_snapshot = snapshot(&m1);
    assert_eq!(contents(&s), base);
    let st = s.mirror_stats().unwrap();
    assert!(st.checksum_failures >= 2, "{st:?}");
    assert!(st.fallbacks >= 2, "{st:?}");
    assert_eq!(st.drives[0].faults, 0, "the primary is not blamed");
    assert!(st.drives[1].faults >= 2);
    assert!(
        !st.drives[1].in_rotation,
        "3 faults take a mirror out: {st:?}"
    );
    assert_eq!(snapshot(&m1), mirror_snapshot, "mirrors are never written");
    assert_eq!(snapshot(&target), primary_snapshot);

    // Truncated mid-run: short reads fall back; at open the file is left out.
    std::fs::copy(target.join("segments/seg-00000.bin"), &seg0).unwrap();
    let s = open(
        &target,
        std::slice::from_ref(&m1),
        Some(vec![1e-9, 1.0]),
        u64::MAX,
    );
    let last = m1.join("segments/seg-00001.bin");
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.set_len(f.metadata().unwrap().len() / 2).unwrap();
    drop(f);
    assert_eq!(contents(&s), base);
    let st = s.mirror_stats().unwrap();
    assert!(st.read_errors >= 1 && st.fallbacks >= 1, "{st:?}");
    let s2 = open(
        &target,
        std::slice::from_ref(&m1),
        Some(vec![1e-9, 1.0]),
        u64::MAX,
    );
    assert_eq!(contents(&s2), base);
    assert_eq!(
        s2.mirror_stats().unwrap().read_errors,
        0,
        "left out at open"
    );

    // Deleted mid-run: the open handle keeps reading (Unix), the result is the same.
    let s = open(&target, std::slice::from_ref(&m1), Some(vec![1.0, 1.0]), 0);
    std::fs::remove_file(&seg0).unwrap();
    assert_eq!(contents(&s), base);
    let _ = keys;
}

#[test]
fn striped_read_with_a_damaged_piece_blames_only_that_copy() {
    let (t, target) = fixture();
    let store = Store::open(&target).unwrap();
    let m1 = mirror_dir(&t, "m1");
    let m2 = mirror_dir(&t, "m2");
    copy_segments(&store, &m1, 0).unwrap();
    copy_segments(&store, &m2, 0).unwrap();
    let r = store.index()[0];
    let want = store.fetch_one(r.key()).unwrap().bytes().to_vec();
    drop(store);
    // Damage the last byte of the record in mirror 2 (its stripe piece is the last one).
    let p = m2.join("segments/seg-00000.bin");
    let mut b = std::fs::read(&p).unwrap();
    let end = (r.offset.get() + r.length.get()) as usize;
    b[end - 1] ^= 0x80;
    std::fs::write(&p, &b).unwrap();
    let s = open(&target, &[m1, m2], Some(vec![1.0, 1.0, 1.0]), 0);
    assert_eq!(s.fetch_one(r.key()).unwrap().bytes(), &want[..]);
    let st = s.mirror_stats().unwrap();
    assert_eq!(st.striped_reads, 1);
    let faults: Vec<u64> = st.drives.iter().map(|d| d.faults).collect();
    assert_eq!(faults, vec![0, 0, 1], "only mirror 2 is blamed: {st:?}");
    assert_eq!(st.checksum_failures, 1);
}

#[test]
fn bad_mirror_options_are_errors() {
    let (t, target) = fixture();
    let e = Store::open_with(
        &target,
        &OpenOptions {
            mirrors: vec![t.path().join("nope")],
            ..OpenOptions::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("nope"), "{e}");
    let m1 = mirror_dir(&t, "m1");
    let e = Store::open_with(
        &target,
        &OpenOptions {
            mirrors: vec![m1],
            disk_weights: Some(vec![1.0]),
            ..OpenOptions::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("1 weights given for 2 drives"),
        "{e}"
    );
}

/// Rough figure (run by hand: `cargo test -p coli-store --test mirror_read -- --ignored
/// --nocapture`): single-record fetches of ~4 MiB records, O_DIRECT where the file system
/// allows it, from the primary alone vs striped over the primary and a full mirror on the same
/// file system (the pieces are read concurrently, so this measures the gain of two reads in
/// flight; with two real drives each piece also has its own device).
#[test]
#[ignore]
fn striping_throughput_figure() {
    let t = tempfile::Builder::new()
        .prefix("coli-stripe-bench")
        .tempdir_in(std::env::var_os("COLI_BENCH_DIR").unwrap_or_else(|| "/var/tmp".into()))
        .unwrap();
    let target = t.path().join("s.coli");
    let p = ModelParams {
        hidden: 2048,
        inter: 1024,
        layers: 1,
        experts: 48,
        alignment: 4096,
        segment_max_bytes: 1 << 30,
        dense: 1,
        ..Default::default()
    };
    write_model(&target, &make_model(&p));
    let m = t.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let store = Store::open(&target).unwrap();
    copy_segments(&store, &m, 0).unwrap();
    let keys = all_keys(&store);
    let len = store.index()[0].length.get();
    drop(store);
    let run = |s: &Store| {
        let t0 = std::time::Instant::now();
        for &k in &keys {
            s.fetch_one(k).unwrap();
        }
        (len * keys.len() as u64) as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    for engine in [
        IoEngineChoice::Engine("pread"),
        IoEngineChoice::Engine("uring"),
    ] {
        let open_e = |mirrors: &[PathBuf], stripe: u64| {
            Store::open_with(
                &target,
                &OpenOptions {
                    mirrors: mirrors.to_vec(),
                    disk_weights: Some(vec![1.0, 1.0]),
                    stripe_threshold: stripe,
                    engine,
                    ..OpenOptions::default()
                },
            )
            .unwrap()
        };
        let mut single = Vec::new();
        let mut striped = Vec::new();
        for _ in 0..3 {
            single.push(run(&open_e(&[], u64::MAX)));
            let s = open_e(std::slice::from_ref(&m), 0);
            striped.push(run(&s));
            assert_eq!(s.mirror_stats().unwrap().striped_reads, keys.len() as u64);
        }
        let best = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        eprintln!(
            "{engine:?}: record {len} bytes, io {:?}: single {:.2} GB/s, striped 2-way {:.2} GB/s, ratio {:.2} (runs {single:.2?} / {striped:.2?})",
            open_e(&[], u64::MAX).io_mode(),
            best(&single),
            best(&striped),
            best(&striped) / best(&single)
        );
    }
}
