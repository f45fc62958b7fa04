//! Fetch of records larger than one read piece (1 MiB): verified fetches read and hash in
//! pieces, buffers are recycled through the store's pool; content and corruption detection must
//! be the same as for one-piece reads.

mod common;
use coli_store::*;
use common::*;

fn record_span(
    dir: &std::path::Path,
    store: &Store,
    k: ExpertKey,
) -> (std::path::PathBuf, u64, u64) {
    let r = store.record(k).unwrap();
    (
        dir.join(format!("segments/seg-{:05}.bin", r.segment.get())),
        r.offset.get(),
        r.length.get(),
    )
}

#[test]
fn multi_piece_records_roundtrip_reuse_buffers_and_detect_flips() {
    let t = tempdir();
    let dir = target_in(&t);
    // Int8 with H = 1024, I = 2048: three 2 MiB matrices plus scales, ~6 MiB per record, so a
    // verified batch fetch reads each record in several pieces.
    let m = make_model(&ModelParams {
        hidden: 1024,
        inter: 2048,
        encoding: Encoding::Int8,
        alignment: 4096,
        segment_max_bytes: 1 << 30,
        layers: 1,
        experts: 2,
        dense: 1,
        ..ModelParams::default()
    });
    write_model(&dir, &m);
    let keys = [ExpertKey::new(0, 0), ExpertKey::new(0, 1)];
    for io in [IoPreference::Auto, IoPreference::Buffered] {
        let plain = Store::open_with(
            &dir,
            &OpenOptions {
                verify_checksums: false,
                io,
                fetch_threads: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let verified = Store::open_with(
            &dir,
            &OpenOptions {
                verify_checksums: true,
                io,
                fetch_threads: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let want: Vec<Vec<u8>> = keys
            .iter()
            .map(|&k| plain.fetch_one(k).unwrap().bytes().to_vec())
            .collect();
        assert!(
            want[0].len() > 4 << 20,
            "record must span several read pieces"
        );
        assert_ne!(want[0], want[1]);
        for (i, (k, h, inter, mats)) in m.experts.iter().enumerate() {
            let b = verified.fetch_one(*k).unwrap();
            assert_eq!((b.hidden, b.intermediate), (*h, *inter));
            assert_eq!(b.gate().data(), &mats[0].data[..]);
            assert_eq!(b.down().data(), &mats[2].data[..]);
            assert_eq!(b.bytes(), &want[i][..]);
        }
        // Alternate keys and batch orders so recycled buffers hold the other record's bytes.
        for round in 0..4 {
            let order = if round % 2 == 0 {
                vec![keys[0], keys[1], keys[0]]
            } else {
                vec![keys[1], keys[0]]
            };
            let got = verified.fetch(&order).unwrap();
            for (k, b) in order.iter().zip(&got) {
                assert_eq!(b.key, *k);
                assert_eq!(b.bytes(), &want[k.expert as usize][..], "round {round} {k}");
            }
        }
    }
    // One flip in the first piece of expert 0, one in the last piece of expert 1.
    let s = Store::open(&dir).unwrap();
    let spans = [
        record_span(&dir, &s, keys[0]),
        record_span(&dir, &s, keys[1]),
    ];
    drop(s);
    for (i, (path, off, len)) in spans.iter().enumerate() {
        let pos = if i == 0 {
            off + 100
        } else {
            off + len - 4096 - 7
        };
        let mut b = std::fs::read(path).unwrap();
        b[pos as usize] ^= 0x10;
        std::fs::write(path, b).unwrap();
    }
    let s = Store::open(&dir).unwrap();
    for (i, &k) in keys.iter().enumerate() {
        match s.fetch_one(k) {
            Err(StoreError::Checksum { what, offset, .. }) => {
                assert_eq!(what, k.to_string());
                assert_eq!(offset, spans[i].1);
            }
            Err(e) => panic!("{k}: expected a checksum error, got {e}"),
            Ok(_) => panic!("{k}: corruption not detected"),
        }
    }
    let err = s.fetch(&keys).err().expect("batch with corrupt records");
    assert!(matches!(err, StoreError::Checksum { .. }), "{err}");
    // Without verification the (corrupt) bytes come back as stored.
    let plain = Store::open_with(
        &dir,
        &OpenOptions {
            verify_checksums: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(plain.fetch(&keys).unwrap().len(), 2);
}
