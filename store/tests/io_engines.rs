//! The same fetch suite against every I/O engine of the store's engine table
//! (`coli_store::io_engine_names`: io_uring, pread, mmap; a new engine is tested by being listed
//! there), on real stores in
//! temporary directories, O_DIRECT (where the file system has it) and buffered: contents,
//! batches, concurrent callers, queue depths, pieces, checksum failures, short files, and the
//! engine trait used directly (pieces out of order, from several files, invalid pieces). Every
//! test asserts which engine actually ran; where the kernel refuses io_uring, the uring variant
//! says so on stderr and runs through the automatic fallback, asserting that it is pread.

mod common;
use coli_store::*;
use common::*;
use std::path::{Path, PathBuf};

/// Every engine of the store's table.
fn engines() -> Vec<&'static str> {
    let e = io_engine_names();
    assert!(
        e.contains(&"uring") && e.contains(&"pread") && e.contains(&"mmap"),
        "{e:?}"
    );
    e
}

fn choice(kind: &'static str) -> IoEngineChoice {
    IoEngineChoice::named(kind).expect("a listed engine")
}

/// Opens `dir` with engine `kind` and asserts that it is the engine that runs. When io_uring is
/// refused here, says so and returns the automatic choice instead, asserting it fell back to
/// pread with a note.
fn open(dir: &Path, kind: &'static str, opts: OpenOptions) -> Store {
    let opts = OpenOptions {
        engine: choice(kind),
        ..opts
    };
    match Store::open_with(dir, &opts) {
        Ok(s) => {
            assert_eq!(s.io_engine(), kind, "{}", s.io_engine_description());
            assert_eq!(s.io_engine_note(), None);
            assert!(s.io_engine_description().starts_with(kind));
            s
        }
        Err(e)
            if kind == "uring" && e.to_string().contains("io_uring requested but unavailable") =>
        {
            eprintln!(
                "NOTE: io_uring is refused on this machine ({e}); the uring variant runs as the \
                 automatic fallback, which must be the pread engine"
            );
            let s = Store::open_with(
                dir,
                &OpenOptions {
                    engine: IoEngineChoice::Auto,
                    ..opts
                },
            )
            .unwrap();
            assert_eq!(s.io_engine(), "pread");
            assert!(s.io_engine_note().unwrap().contains("io_uring unavailable"));
            s
        }
        Err(e) => panic!("{kind} engine: {e}"),
    }
}

fn model_store(p: &ModelParams) -> (tempfile::TempDir, PathBuf, Model) {
    let t = tempdir();
    let dir = target_in(&t);
    let m = make_model(p);
    write_model(&dir, &m);
    (t, dir, m)
}

fn check_buf(b: &ExpertBuf, m: &Model) {
    let (_, h, i, mats) = m.experts.iter().find(|e| e.0 == b.key).unwrap();
    assert_eq!((b.hidden, b.intermediate), (*h, *i));
    for (view, want) in [b.gate(), b.up(), b.down()].iter().zip(mats) {
        assert_eq!(view.data(), &want.data[..], "{} data", b.key);
        assert_eq!(view.scales().len(), want.scales.len());
        assert!(view
            .scales()
            .iter()
            .zip(&want.scales)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn every_engine_reads_every_record_at_every_depth() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    // Batch order: reversed with a repeat, so completion order differs from submission order.
    let mut batch: Vec<ExpertKey> = keys.iter().rev().copied().collect();
    batch.push(keys[1]);
    for kind in engines() {
        for io in [IoPreference::Auto, IoPreference::Buffered] {
            for qd in [1usize, 3] {
                // None: the engine's default; 0: whole records hashed after they land; 512:
                // 512-byte pieces hashed as they land (many per record).
                for piece in [None, Some(0usize), Some(512)] {
                    let ctx = format!("{kind} {io:?} qd {qd} piece {piece:?}");
                    let s = open(
                        &dir,
                        kind,
                        OpenOptions {
                            io,
                            queue_depth: Some(qd),
                            verify_piece_bytes: piece,
                            ..Default::default()
                        },
                    );
                    assert_eq!(s.queue_depth(), qd, "{ctx}");
                    if !choice(kind).direct_io() || io == IoPreference::Buffered {
                        assert_eq!(s.io_mode(), IoMode::Buffered, "{ctx}");
                    }
                    let got = s.fetch(&batch).unwrap();
                    assert_eq!(got.len(), batch.len());
                    for (k, b) in batch.iter().zip(&got) {
                        assert_eq!(b.key, *k, "{ctx}");
                        check_buf(b, &m);
                    }
                    drop(got);
                    for &k in &keys {
                        check_buf(&s.fetch_one(k).unwrap(), &m);
                    }
                    let st = s.stats();
                    assert_eq!(st.reads, (batch.len() + keys.len()) as u64, "{ctx}");
                    assert_eq!(st.fetches, 1 + keys.len() as u64, "{ctx}");
                    let want_bytes: u64 = batch
                        .iter()
                        .chain(&keys)
                        .map(|&k| s.record(k).unwrap().length.get())
                        .sum();
                    assert_eq!(st.bytes_read, want_bytes, "{ctx}");
                    assert!(st.io_wait_ns > 0 && st.verify_ns > 0, "{ctx}: {st:?}");
                    assert!(st.verify_ns < st.io_wait_ns * 4, "{ctx}: {st:?}");
                    // Several callers at once (io_uring: one ring each).
                    std::thread::scope(|sc| {
                        for t in 0..3 {
                            let (s, m, keys) = (&s, &m, &keys);
                            sc.spawn(move || {
                                for r in 0..3 {
                                    let mut ks = keys.clone();
                                    ks.rotate_left(t + r);
                                    for b in s.fetch(&ks).unwrap() {
                                        check_buf(&b, m);
                                    }
                                }
                            });
                        }
                    });
                    if s.io_engine() == "uring" {
                        let d = s.io_engine_description();
                        assert!(
                            d.contains("registered buffers") || d.contains("refused"),
                            "{d}"
                        );
                        eprintln!("{ctx}: {d}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_engine_names_a_corrupt_record() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    let bad = keys[4];
    let (seg, off, len) = {
        let s = Store::open(&dir).unwrap();
        let r = *s.record(bad).unwrap();
        (r.segment.get(), r.offset.get(), r.length.get())
    };
    let rel = format!("segments/seg-{seg:05}.bin");
    let path = dir.join(&rel);
    let mut b = std::fs::read(&path).unwrap();
    // A flip in the record's last 512-byte piece.
    b[(off + len - 300) as usize] ^= 0x20;
    std::fs::write(&path, b).unwrap();
    for kind in engines() {
        for piece in [None, Some(0usize), Some(512)] {
            let ctx = format!("{kind} piece {piece:?}");
            let s = open(
                &dir,
                kind,
                OpenOptions {
                    verify_piece_bytes: piece,
                    queue_depth: Some(2),
                    ..Default::default()
                },
            );
            match s.fetch_one(bad) {
                Err(StoreError::Checksum {
                    what, file, offset, ..
                }) => {
                    assert_eq!(what, bad.to_string(), "{ctx}");
                    assert_eq!(file, rel, "{ctx}");
                    assert_eq!(offset, off, "{ctx}");
                }
                other => panic!("{ctx}: expected a checksum error, got {:?}", other.err()),
            }
            match s.fetch(&keys) {
                Err(StoreError::Checksum { what, .. }) => assert_eq!(what, bad.to_string()),
                other => panic!("{ctx}: expected a checksum error, got {:?}", other.err()),
            }
            for &k in keys.iter().filter(|&&k| k != bad) {
                check_buf(&s.fetch_one(k).unwrap(), &m);
            }
            // Unverified, the damaged bytes come back as stored.
            let plain = open(
                &dir,
                kind,
                OpenOptions {
                    verify_checksums: false,
                    ..Default::default()
                },
            );
            assert_eq!(plain.fetch(&keys).unwrap().len(), keys.len(), "{ctx}");
        }
    }
}

#[test]
fn every_engine_reports_a_short_file() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).collect();
    let s0 = Store::open(&dir).unwrap();
    // The last record of segment 0: the file is cut 512 bytes into it.
    let r = *s0
        .index()
        .iter()
        .filter(|r| r.segment.get() == 0)
        .max_by_key(|r| r.offset.get())
        .unwrap();
    drop(s0);
    let victim = r.key();
    let path = dir.join("segments/seg-00000.bin");
    let whole = std::fs::read(&path).unwrap();
    for kind in engines() {
        for io in [IoPreference::Auto, IoPreference::Buffered] {
            if !choice(kind).direct_io() && io != IoPreference::Buffered {
                continue;
            }
            let ctx = format!("{kind} {io:?}");
            std::fs::write(&path, &whole).unwrap();
            // Opened while intact (open checks lengths), truncated afterwards.
            let s = open(
                &dir,
                kind,
                OpenOptions {
                    io,
                    queue_depth: Some(2),
                    ..Default::default()
                },
            );
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(r.offset.get() + 512)
                .unwrap();
            for res in [s.fetch_one(victim).map(|_| ()), s.fetch(&keys).map(|_| ())] {
                match res {
                    Err(StoreError::Io {
                        path: p,
                        error: source,
                    }) => {
                        let msg = source.to_string();
                        assert_eq!(p, path, "{ctx}");
                        assert!(msg.contains(&victim.to_string()), "{ctx}: {msg}");
                        assert!(msg.contains("short or truncated file"), "{ctx}: {msg}");
                        assert_eq!(
                            source.kind(),
                            std::io::ErrorKind::UnexpectedEof,
                            "{ctx}: {msg}"
                        );
                    }
                    other => panic!("{ctx}: expected an I/O error, got {:?}", other.err()),
                }
            }
            // Records of other segments still read.
            for e in &m.experts {
                if s.record(e.0).unwrap().segment.get() != 0 {
                    check_buf(&s.fetch_one(e.0).unwrap(), &m);
                }
            }
        }
    }
    std::fs::write(&path, &whole).unwrap();
}

/// Progress observer recording what it was told.
struct Seen(Vec<usize>);
impl ReadProgress for Seen {
    fn advance(&mut self, _buf: &[u8], valid: usize) {
        self.0.push(valid);
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[test]
fn engine_trait_reads_pieces_from_several_files() {
    let (_t, dir, _m) = model_store(&ModelParams::default());
    let segs: Vec<Vec<u8>> = (0..2)
        .map(|i| std::fs::read(dir.join(format!("segments/seg-{i:05}.bin"))).unwrap())
        .collect();
    for kind in engines() {
        let s = open(
            &dir,
            kind,
            OpenOptions {
                queue_depth: Some(2),
                ..Default::default()
            },
        );
        let e = s.io_engine_handle();
        assert_eq!(e.name(), s.io_engine());
        assert!(e.path(0).unwrap().ends_with("segments/seg-00000.bin"));
        let mut q = e.queue().unwrap();
        // 5 requests at depth 2: each reads 1024 bytes of segment 1 (second half first) and
        // 512 of segment 0 into one 1536-byte buffer.
        for t in 0..5u64 {
            let off = 512 * t;
            q.submit(ReadRequest {
                tag: t,
                buf: e.buffer(1536, 4096),
                pieces: vec![
                    ReadPiece {
                        file: 1,
                        file_offset: off + 512,
                        buf_offset: 512,
                        len: 512,
                    },
                    ReadPiece {
                        file: 1,
                        file_offset: off,
                        buf_offset: 0,
                        len: 512,
                    },
                    ReadPiece {
                        file: 0,
                        file_offset: off,
                        buf_offset: 1024,
                        len: 512,
                    },
                ],
                progress: (t % 2 == 0).then(|| Box::new(Seen(vec![])) as Box<dyn ReadProgress>),
            });
        }
        // An invalid request: file 9 does not exist.
        q.submit(ReadRequest::whole(99, e.buffer(512, 4096), 9, 0, 0));
        assert_eq!(q.outstanding(), 6);
        let mut tags = vec![];
        while let Some(c) = q.wait() {
            tags.push(c.tag);
            if c.tag == 99 {
                let err = c.result.unwrap_err();
                assert_eq!(err.error.kind(), std::io::ErrorKind::InvalidInput);
                assert!(err.to_string().contains("file 9"), "{err}");
                continue;
            }
            c.result.unwrap();
            let off = 512 * c.tag as usize;
            assert_eq!(&c.buf[..1024], &segs[1][off..off + 1024], "{kind}");
            assert_eq!(&c.buf[1024..], &segs[0][off..off + 512], "{kind}");
            if let Some(p) = c.progress {
                let seen = p.into_any().downcast::<Seen>().unwrap().0;
                // The second piece (bytes 512..1024) lands first: no prefix until the first,
                // then all of it.
                assert_eq!(seen, vec![1024, 1536], "{kind}");
            }
        }
        tags.sort();
        assert_eq!(tags, vec![0, 1, 2, 3, 4, 99]);
        assert_eq!(q.outstanding(), 0);
        assert!(q.wait().is_none());
        // A queue dropped with reads in flight waits for them (buffers stay valid).
        let mut q = e.queue().unwrap();
        for t in 0..4 {
            q.submit(ReadRequest::whole(t, e.buffer(4096, 4096), 0, 0, 0));
        }
        drop(q);
        // Reading past the end of a file is a short-file error naming the file.
        let mut q = e.queue().unwrap();
        let len = segs[0].len() as u64;
        q.submit(ReadRequest::whole(7, e.buffer(1024, 4096), 0, len - 512, 0));
        let c = q.wait().unwrap();
        let err = c.result.unwrap_err();
        assert_eq!(
            err.error.kind(),
            std::io::ErrorKind::UnexpectedEof,
            "{kind}: {err}"
        );
        assert!(err.path.ends_with("seg-00000.bin") && err.tag == 7, "{err}");
    }
}

#[test]
fn mmap_refuses_o_direct() {
    let (_t, dir, _m) = model_store(&ModelParams::default());
    let e = Store::open_with(
        &dir,
        &OpenOptions {
            engine: IoEngineChoice::Engine("mmap"),
            io: IoPreference::Direct,
            ..Default::default()
        },
    )
    .err()
    .expect("mmap with O_DIRECT must be refused");
    assert!(e.to_string().contains("mmap engine"), "{e}");
    // An option problem, not a file's: the message does not repeat the store path (the
    // caller's context names it).
    assert!(matches!(e, StoreError::Options(_)), "{e}");
    assert!(!e.to_string().contains(&*dir.to_string_lossy()), "{e}");
}

#[test]
fn auto_uses_uring_or_says_why() {
    let (_t, dir, _m) = model_store(&ModelParams::default());
    let s = Store::open(&dir).unwrap();
    match s.io_engine() {
        "uring" => assert_eq!(s.io_engine_note(), None),
        "pread" => {
            let note = s.io_engine_note().expect("a fallback says why");
            assert!(note.contains("io_uring unavailable"), "{note}");
            eprintln!("NOTE: io_uring is refused on this machine: {note}");
        }
        other => panic!("auto never picks {other}"),
    }
}

/// Run by [`uring_refused_falls_back_to_pread_with_one_note`] with `COLI_IO_URING=off`.
#[test]
#[ignore = "run as a child process with COLI_IO_URING=off"]
fn child_uring_refused() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    for _ in 0..2 {
        let s = Store::open(&dir).unwrap();
        assert_eq!(s.io_engine(), "pread");
        let note = s.io_engine_note().unwrap();
        assert!(note.contains("COLI_IO_URING=off"), "{note}");
        for b in s.fetch(&[m.experts[0].0, m.experts[1].0]).unwrap() {
            check_buf(&b, &m);
        }
    }
    let e = Store::open_with(
        &dir,
        &OpenOptions {
            engine: IoEngineChoice::Engine("uring"),
            ..Default::default()
        },
    )
    .err()
    .expect("forced io_uring must fail when refused");
    assert!(
        e.to_string().contains("io_uring requested but unavailable"),
        "{e}"
    );
}

#[test]
fn uring_refused_falls_back_to_pread_with_one_note() {
    let out = child("child_uring_refused", &[("COLI_IO_URING", "off".into())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert_eq!(
        stderr.matches("io_uring unavailable").count(),
        1,
        "one note per process: {stderr}"
    );
}

/// The counting wrapper around every engine sees each record read once (a verified record
/// read in pieces is still one request), with its bytes; a failed read is counted apart.
#[test]
fn every_engine_is_counted_by_its_wrapper() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    for kind in engines() {
        let s = open(&dir, kind, OpenOptions::default());
        assert_eq!(s.engine_stats(), EngineStats::default(), "{kind}");
        let keys: Vec<ExpertKey> = m.experts.iter().map(|e| e.0).take(3).collect();
        let bufs = s.fetch(&keys).unwrap();
        let bytes: u64 = bufs.iter().map(|b| b.len_bytes() as u64).sum();
        let st = s.engine_stats();
        assert_eq!((st.requests, st.bytes, st.failed), (3, bytes, 0), "{kind}");
        assert_eq!(s.stats().reads, 3, "{kind}: records delivered");
    }
}

/// `Store::fetch_into` reads through every engine straight into the caller's buffer, with the
/// same bytes as a fetch, the same counters, and clear errors for a buffer too small or
/// misaligned; a damaged record is a checksum error there too.
#[test]
fn every_engine_fetches_into_a_caller_buffer() {
    let (_t, dir, m) = model_store(&ModelParams::default());
    for kind in engines() {
        let s = open(&dir, kind, OpenOptions::default());
        let key = m.experts[1].0;
        let want = s.fetch_one(key).unwrap().bytes().to_vec();
        let align = s.buffer_alignment();
        let mut buf = AlignedBuf::new(want.len() + align, align);
        buf.as_mut_slice().fill(0xEE);
        let reads = s.stats().reads;
        s.fetch_into(key, buf.as_mut_slice()).unwrap();
        assert_eq!(&buf[..want.len()], &want[..], "{kind}");
        assert!(
            buf[want.len()..].iter().all(|&b| b == 0xEE),
            "{kind}: past the record"
        );
        assert_eq!(s.stats().reads, reads + 1, "{kind}");
        let e = s
            .fetch_into(key, &mut buf.as_mut_slice()[..want.len() - 1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("smaller than the"), "{kind}: {e}");
        let e = s
            .fetch_into(key, &mut buf.as_mut_slice()[1..])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not aligned"), "{kind}: {e}");
        let e = s
            .fetch_into(ExpertKey::new(99, 0), buf.as_mut_slice())
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound(_)), "{kind}: {e}");
    }
    // A flipped byte in the record: a checksum error naming the expert.
    let key = m.experts[2].0;
    let rec = *Store::open(&dir).unwrap().record(key).unwrap();
    let seg = dir.join(format!("segments/seg-{:05}.bin", rec.segment.get()));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[rec.offset.get() as usize + 100] ^= 0x40;
    std::fs::write(&seg, bytes).unwrap();
    for kind in engines() {
        let s = open(&dir, kind, OpenOptions::default());
        let mut buf = AlignedBuf::new(rec.length.get() as usize, s.buffer_alignment());
        let e = s.fetch_into(key, buf.as_mut_slice()).unwrap_err();
        assert!(matches!(e, StoreError::Checksum { .. }), "{kind}: {e}");
        assert!(e.to_string().contains(&key.to_string()), "{kind}: {e}");
    }
}
