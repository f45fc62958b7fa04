//! Placement invariance with mirrors: greedy tokens on a converted fixture store are identical
//! with 0, 1 or 2 mirrors, full or partial, with weighted striping on, and with a mirror whose
//! records are corrupted or whose file is truncated during the run (the counters show the
//! fallbacks). Mirrors are never written.

use coli_engine::{Engine, EngineOptions};
use coli_store::mirror::copy::copy_segments;
use coli_store::mirror::stage_records;
use coli_store::{ExpertKey, IoEngineChoice, OpenOptions, Store};
use coli_tests::{convert_fixture, expected, greedy, ids};
use std::path::{Path, PathBuf};

fn open(dir: &Path, mirrors: &[PathBuf], weights: Option<Vec<f64>>, stripe: u64) -> Store {
    Store::open_with(
        dir,
        &OpenOptions {
            mirrors: mirrors.to_vec(),
            disk_weights: weights,
            stripe_threshold: stripe,
            engine: IoEngineChoice::Engine("pread"),
            ..OpenOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Greedy tokens with a one-expert cache (every routed expert is read from disk).
fn tokens(store: &Store, one: u64, prompt: &[u32]) -> Vec<u32> {
    let opts = EngineOptions {
        ram_budget: Some(one),
        threads: Some(1),
        ..Default::default()
    };
    let mut e = Engine::new(store, &opts).unwrap();
    greedy(&mut e, prompt, 16)
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for sub in ["segments", "staged"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            for e in rd {
                let p = e.unwrap().path();
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn greedy_tokens_do_not_depend_on_mirrors_or_their_faults() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let (tmp, dir) = convert_fixture(name, "int4_store");
    let want: Vec<u32> = ids(&exp["greedy_int4_g64"]).into_iter().take(16).collect();
    let prompt = ids(&exp["prompt_ids"]);
    let store = Store::open(&dir).unwrap();
    let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
    let one = store.index()[0].length.get();
    let full = tmp.path().join("full");
    let part = tmp.path().join("part");
    let bad = tmp.path().join("bad");
    for d in [&full, &part, &bad] {
        std::fs::create_dir_all(d).unwrap();
    }
    copy_segments(&store, &full, 0).unwrap();
    copy_segments(&store, &bad, 0).unwrap();
    let half: Vec<ExpertKey> = keys.iter().copied().step_by(2).collect();
    stage_records(&store, &part, &half, 0).unwrap();
    drop(store);
    assert_eq!(tokens(&open(&dir, &[], None, u64::MAX), one, &prompt), want);
    let before = (snapshot(&full), snapshot(&part));

    // (mirrors, weights, stripe threshold)
    let cases: Vec<(Vec<PathBuf>, Vec<f64>, u64)> = vec![
        (vec![full.clone()], vec![1.0, 1.0], u64::MAX),
        (vec![part.clone()], vec![1.0, 3.0], u64::MAX),
        (
            vec![full.clone(), part.clone()],
            vec![2.0, 1.0, 1.0],
            u64::MAX,
        ),
        (vec![full.clone()], vec![2.0, 1.0], 0),
        (vec![full.clone(), part.clone()], vec![1.0, 1.0, 1.0], 0),
    ];
    for (mirrors, w, stripe) in cases {
        let s = open(&dir, &mirrors, Some(w.clone()), stripe);
        assert_eq!(
            tokens(&s, one, &prompt),
            want,
            "mirrors {mirrors:?} weights {w:?} stripe {stripe}"
        );
        let st = s.mirror_stats().unwrap();
        assert!(st.drives[0].bytes > 0, "{st:?}");
        assert!(st.drives[1..].iter().all(|d| d.bytes > 0), "{st:?}");
        assert_eq!(st.fallbacks + st.checksum_failures + st.read_errors, 0);
        if stripe == 0 {
            assert!(st.striped_reads > 0, "{st:?}");
        }
    }
    assert_eq!(
        (snapshot(&full), snapshot(&part)),
        before,
        "mirrors are never written"
    );

    // A mirror whose records are corrupted after open, all reads assigned to it: fallbacks.
    let s = open(
        &dir,
        std::slice::from_ref(&bad),
        Some(vec![1e-9, 1.0]),
        u64::MAX,
    );
    let seg = bad.join("segments/seg-00000.bin");
    let probe = Store::open(&dir).unwrap();
    let mut b = std::fs::read(&seg).unwrap();
    for r in probe.index().iter().filter(|r| r.segment.get() == 0) {
        b[r.offset.get() as usize + 100] ^= 0x01;
    }
    drop(probe);
    std::fs::write(&seg, &b).unwrap();
    let damaged = snapshot(&bad);
    assert_eq!(tokens(&s, one, &prompt), want, "corrupted mirror");
    let st = s.mirror_stats().unwrap();
    assert!(st.checksum_failures > 0 && st.fallbacks > 0, "{st:?}");
    assert_eq!(st.drives[0].faults, 0, "{st:?}");
    assert_eq!(snapshot(&bad), damaged, "the damaged mirror is not written");

    // A mirror file truncated during the run: short reads fall back.
    std::fs::copy(dir.join("segments/seg-00000.bin"), &seg).unwrap();
    let s = open(&dir, std::slice::from_ref(&bad), Some(vec![1e-9, 1.0]), 0);
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(f.metadata().unwrap().len() / 3).unwrap();
    drop(f);
    assert_eq!(tokens(&s, one, &prompt), want, "truncated mirror");
    let st = s.mirror_stats().unwrap();
    assert!(st.read_errors > 0 && st.fallbacks > 0, "{st:?}");
    // Reopened, the truncated file is left out at admission and nothing faults.
    let s = open(&dir, std::slice::from_ref(&bad), Some(vec![1.0, 1.0]), 0);
    assert_eq!(tokens(&s, one, &prompt), want, "reopened");
    assert_eq!(s.mirror_stats().unwrap().read_errors, 0);
}

/// `Store::drive_of` (what `coli web`'s heat map shows per expert) names the drive that read
/// each expert: with an unbounded cache every routed expert is read once, unstriped, so each
/// drive's byte counter equals the record bytes of the experts the map assigns to it; and an
/// expert is never assigned to a partial mirror that lacks it.
#[test]
fn the_expert_map_names_the_drive_that_read_each_expert() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let (tmp, dir) = convert_fixture(name, "int4_store");
    let prompt = ids(&exp["prompt_ids"]);
    let store = Store::open(&dir).unwrap();
    let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
    let full = tmp.path().join("full");
    let part = tmp.path().join("part");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&part).unwrap();
    copy_segments(&store, &full, 0).unwrap();
    let half: Vec<ExpertKey> = keys.iter().copied().step_by(2).collect();
    stage_records(&store, &part, &half, 0).unwrap();
    drop(store);
    let s = open(&dir, &[full, part], Some(vec![2.0, 1.0, 1.0]), u64::MAX);
    let opts = EngineOptions {
        ram_budget: Some(u64::MAX),
        threads: Some(1),
        ..Default::default()
    };
    let mut e = Engine::new(&s, &opts).unwrap();
    greedy(&mut e, &prompt, 8);
    let map = e.expert_map();
    let st = s.mirror_stats().unwrap();
    let mut want = vec![0u64; st.drives.len()];
    let mut read = 0;
    for l in &map.layers {
        for (x, r) in l.residency.iter().enumerate() {
            let key = ExpertKey::new(l.layer, x as u32);
            let drive = l.drive[x];
            assert_eq!(Some(drive), s.drive_of(key));
            if drive == 2 {
                assert!(
                    half.contains(&key),
                    "{key:?} assigned to the partial mirror"
                );
            }
            if matches!(
                r,
                Some(coli_engine::Residency::Cached | coli_engine::Residency::Pinned)
            ) {
                want[drive as usize] += s.record(key).unwrap().length.get();
                read += 1;
            }
        }
    }
    assert!(read > 0 && map.routed_total > 0, "{map:?}");
    let got: Vec<u64> = st.drives.iter().map(|d| d.bytes).collect();
    assert_eq!(got, want, "bytes read per drive vs the map's assignment");
    assert!(
        want.iter().all(|&b| b > 0),
        "every drive served some: {want:?}"
    );
}
