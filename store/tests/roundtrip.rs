//! Property test: random stores are written and read back bit-exact.

mod common;
use coli_store::*;
use common::*;
use proptest::prelude::*;

fn check_roundtrip(p: &ModelParams, io: IoPreference) {
    let t = tempdir();
    let target = target_in(&t);
    let m = make_model(p);
    assert_eq!(write_model(&target, &m), "fresh");
    let store = Store::open_with(
        &target,
        &OpenOptions {
            io,
            fetch_threads: 3,
            ..Default::default()
        },
    )
    .unwrap();
    if io == IoPreference::Buffered {
        assert_eq!(store.io_mode(), IoMode::Buffered);
    }
    let man = store.manifest();
    assert_eq!(man.store_id, m.spec.store_id());
    // Small segment bound: records are spread over several segment files, none over the bound
    // unless it holds a single record.
    let per_seg = |id: u32| {
        store
            .index()
            .iter()
            .filter(|r| r.segment.get() == id)
            .count()
    };
    for id in 0..man.segment_count {
        let len = std::fs::metadata(target.join(format!("segments/seg-{id:05}.bin")))
            .unwrap()
            .len();
        assert!(
            len <= p.segment_max_bytes || per_seg(id) == 1,
            "segment {id} is {len} bytes"
        );
    }
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    let bufs = store.fetch(&keys).unwrap();
    assert_eq!(store.stats().reads, keys.len() as u64);
    for ((k, h, i, mats), b) in m.experts.iter().zip(&bufs) {
        assert_eq!(b.key, *k);
        assert_eq!((b.hidden, b.intermediate), (*h, *i));
        assert_eq!(b.len_bytes() % p.alignment, 0);
        for (view, want) in [b.gate(), b.up(), b.down()].iter().zip(mats) {
            assert_eq!(view.encoding(), want.encoding);
            assert_eq!((view.rows(), view.cols()), (want.rows, want.cols));
            assert_eq!(view.data(), &want.data[..], "{k} data");
            assert_eq!(
                view.scales()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                want.scales.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{k} scales"
            );
        }
        // Dequantized rows equal the reference applied to the input matrices.
        let mut got = vec![0f32; *h];
        let mut want = vec![0f32; *h];
        b.gate().dequantize_row(i - 1, &mut got);
        MatrixView::new(mats[0].encoding, *i, *h, &mats[0].data, &mats[0].scales)
            .unwrap()
            .dequantize_row(i - 1, &mut want);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
    for (name, shape, t) in &m.dense {
        let d = store.dense(name).unwrap();
        assert_eq!(d.shape, &shape[..]);
        assert_eq!(d.data, &t.data[..]);
        assert_eq!(d.scales, &t.scales[..]);
        let mv = d.matrix();
        assert_eq!((mv.rows(), mv.cols()), (t.rows, t.cols));
        assert_eq!(d.to_f32().len(), t.rows * t.cols);
    }
    for (name, bytes) in &m.files {
        assert_eq!(store.file(name).unwrap().as_deref(), Some(&bytes[..]));
    }
    assert_eq!(
        store.file("config.json").unwrap().unwrap(),
        m.spec.config_json
    );
    assert_eq!(store.model_config()["hidden_size"], p.hidden);
    let r = fsck::check(&target, &fsck::FsckOptions::default(), &fsck::NoProgress);
    assert_eq!(r.exit_code(), 0, "{r:?}");
    assert_eq!(r.records_checked, keys.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_stores_roundtrip(
        seed in 0u64..1000,
        hidden in 1usize..150,
        inter in 1usize..80,
        enc in 0usize..6,
        mtp in proptest::option::of(0usize..6),
        align4k in any::<bool>(),
        seg_blocks in 3u64..12,
        layers in 1u32..3,
        experts in 1u32..5,
        dense in 0usize..5,
    ) {
        let alignment = if align4k { 4096 } else { 512 };
        let p = ModelParams {
            seed, hidden, inter,
            encoding: ENCODINGS[enc],
            alignment,
            segment_max_bytes: seg_blocks * alignment as u64,
            layers, experts,
            mtp_encoding: mtp.map(|i| ENCODINGS[i]),
            dense,
        };
        check_roundtrip(&p, if seed % 2 == 0 { IoPreference::Buffered } else { IoPreference::Auto });
    }
}

/// Several segments really happen, and the same input gives a byte-identical store.
#[test]
fn deterministic_and_multi_segment() {
    let p = ModelParams::default();
    let m = make_model(&p);
    let (a, b) = (tempdir(), tempdir());
    write_model(&target_in(&a), &m);
    write_model(&target_in(&b), &m);
    let sa = snapshot(&target_in(&a));
    assert_eq!(sa, snapshot(&target_in(&b)));
    assert!(sa.keys().filter(|k| k.starts_with("segments/")).count() >= 2);
    assert!(!sa.contains_key("journal") && !sa.contains_key("spec.json"));
    // A second run on a complete store does nothing.
    let spec = m.spec.clone();
    assert!(matches!(
        StoreWriter::create_or_resume(&target_in(&a), spec),
        Ok(WriterStart::AlreadyComplete)
    ));
    // The same shards and parameters with an edited config.json (not part of the store id)
    // are not that store: refused, naming the config, the store untouched.
    let mut spec = m.spec.clone();
    let mut cfg: serde_json::Value = serde_json::from_slice(&spec.config_json).unwrap();
    cfg["edited"] = serde_json::json!(true);
    spec.config_json = serde_json::to_vec(&cfg).unwrap();
    let e = match StoreWriter::create_or_resume(&target_in(&a), spec) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a store of another config.json was taken as complete"),
    };
    assert!(e.contains("config.json"), "{e}");
    assert_eq!(snapshot(&target_in(&a)), sa);
}

/// Buffered and Auto I/O read the same bytes; Auto reports the mode it chose, and Direct either
/// works or fails at open (never silently buffered).
#[test]
fn io_modes() {
    let p = ModelParams {
        alignment: 4096,
        segment_max_bytes: 1 << 20,
        ..Default::default()
    };
    let m = make_model(&p);
    let t = tempdir();
    let target = target_in(&t);
    write_model(&target, &m);
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    let open = |io| {
        Store::open_with(
            &target,
            &OpenOptions {
                io,
                ..Default::default()
            },
        )
    };
    let buffered = open(IoPreference::Buffered).unwrap();
    assert_eq!(buffered.io_mode(), IoMode::Buffered);
    let auto = open(IoPreference::Auto).unwrap();
    let a: Vec<Vec<u8>> = auto
        .fetch(&keys)
        .unwrap()
        .iter()
        .map(|b| b.bytes().to_vec())
        .collect();
    let b: Vec<Vec<u8>> = buffered
        .fetch(&keys)
        .unwrap()
        .iter()
        .map(|b| b.bytes().to_vec())
        .collect();
    assert_eq!(a, b);
    match open(IoPreference::Direct) {
        Ok(s) => {
            assert_eq!(s.io_mode(), IoMode::Direct);
            assert_eq!(auto.io_mode(), IoMode::Direct);
            let d: Vec<Vec<u8>> = s
                .fetch(&keys)
                .unwrap()
                .iter()
                .map(|b| b.bytes().to_vec())
                .collect();
            assert_eq!(d, b);
        }
        Err(e) => {
            assert_eq!(
                auto.io_mode(),
                IoMode::Buffered,
                "Direct failed ({e}) but Auto chose Direct"
            );
        }
    }
    assert_eq!(
        auto.stats().bytes_read,
        a.iter().map(|x| x.len() as u64).sum::<u64>()
    );
}

#[test]
fn expert_buf_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ExpertBuf>();
    check::<Store>();
}

/// Fetches from several threads at once on one shared store give the written bytes.
#[test]
fn concurrent_fetches() {
    let p = ModelParams {
        layers: 3,
        experts: 4,
        ..Default::default()
    };
    let m = make_model(&p);
    let t = tempdir();
    let target = target_in(&t);
    write_model(&target, &m);
    let store = std::sync::Arc::new(Store::open(&target).unwrap());
    let m = std::sync::Arc::new(m);
    let handles: Vec<_> = (0..4)
        .map(|n| {
            let (store, m) = (store.clone(), m.clone());
            std::thread::spawn(move || {
                for round in 0..3 {
                    let keys: Vec<ExpertKey> = m
                        .experts
                        .iter()
                        .map(|e| e.0)
                        .cycle()
                        .skip(n + round)
                        .take(5)
                        .collect();
                    for b in store.fetch(&keys).unwrap() {
                        let want = &m.experts.iter().find(|e| e.0 == b.key).unwrap().3;
                        assert_eq!(b.down().data(), &want[2].data[..]);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(store.stats().reads, 4 * 3 * 5);
    assert_eq!(
        store
            .fetch_one(ExpertKey::new(9, 0))
            .err()
            .map(|e| e.to_string()),
        Some("not in store: expert layer 9 expert 0".to_string())
    );
}
