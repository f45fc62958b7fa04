//! Fuzzing on stable Rust (issue 42): every parser that reads outside input gets valid inputs
//! with random damage (bytes flipped, set, inserted, removed, the input cut short) and must
//! answer `Ok` or an error, never panic or hang: the MANIFEST, INDEX and segment headers of a
//! real store, config.json through the model spec, safetensors shard headers, and the request
//! bodies of both HTTP APIs. Driven by proptest (shrinking finds the smallest failing input).
//!
//! `COLI_FUZZ_CASES` sets the cases per parser (default 200 here, in `tools/test.sh`);
//! `engine/bench/fuzz_parsers.sh` runs the long campaign and commits its output.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::path::Path;

fn cases() -> u32 {
    std::env::var("COLI_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// One damage to an input: at a position (taken modulo the length), flip bits, set a byte,
/// insert bytes, remove a range, or cut the input there.
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
    Cut(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), 1u8..).prop_map(|(i, b)| Edit::Flip(i, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, v)| Edit::Insert(i, v)),
        2 => (any::<usize>(), 1usize..64).prop_map(|(i, n)| Edit::Remove(i, n)),
        1 => any::<usize>().prop_map(Edit::Cut),
    ]
}

fn damaged(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        let at = |i: usize, b: &Vec<u8>| if b.is_empty() { 0 } else { i % b.len() };
        match e {
            Edit::Flip(i, x) if !b.is_empty() => {
                let i = at(*i, &b);
                b[i] ^= x;
            }
            Edit::Set(i, x) if !b.is_empty() => {
                let i = at(*i, &b);
                b[i] = *x;
            }
            Edit::Insert(i, v) => {
                let i = at(*i, &b);
                b.splice(i..i, v.iter().copied());
            }
            Edit::Remove(i, n) if !b.is_empty() => {
                let i = at(*i, &b);
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Edit::Cut(i) => {
                let i = at(*i, &b);
                b.truncate(i);
            }
            _ => {}
        }
    }
    b
}

/// Runs `parse` on `cases()` damaged copies of each seed; a panic fails the test with the
/// smallest damage proptest finds.
fn fuzz(what: &str, seeds: &[Vec<u8>], parse: impl Fn(&[u8])) {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (0..seeds.len(), prop::collection::vec(edit(), 1..6));
    let runs = std::sync::atomic::AtomicU64::new(0);
    let r = runner.run(&strategy, |(s, edits)| {
        let input = damaged(&seeds[s], &edits);
        parse(&input);
        runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = r {
        panic!("{what}: {e}");
    }
    let runs = runs.into_inner();
    assert!(runs >= u64::from(cases()), "{what}: {runs} inputs ran");
    eprintln!("fuzz {what}: {runs} damaged inputs, no panic");
}

fn store_files() -> (tempfile::TempDir, std::path::PathBuf) {
    coli_tests::convert_fixture("glm5_fp8", "int4_store")
}

#[test]
fn store_headers_never_panic() {
    let (_tmp, dir) = store_files();
    let manifest = std::fs::read(dir.join("MANIFEST")).unwrap();
    let m = coli_store::Manifest::parse(&manifest).unwrap();
    fuzz("MANIFEST", std::slice::from_ref(&manifest), |b| {
        let _ = coli_store::Manifest::parse(b);
    });
    let index = std::fs::read(dir.join("INDEX")).unwrap();
    fuzz("INDEX", std::slice::from_ref(&index), |b| {
        let _ = coli_format::disk::index::parse_index(b, &m);
    });
    let seg = std::fs::read(dir.join("segments/seg-00000.bin")).unwrap();
    let head = seg[..4096.min(seg.len())].to_vec();
    fuzz("segment header", &[head], |b| {
        let _ = coli_format::disk::segment::SegmentHeader::parse(
            "segments/seg-00000.bin",
            b,
            0,
            m.store_id,
            seg.len() as u64,
        );
    });
}

#[test]
fn configs_through_the_model_spec_never_panic() {
    let seeds: Vec<Vec<u8>> = coli_tests::FIXTURE_FAMILIES
        .iter()
        .map(|f| std::fs::read(coli_tests::fixture_dir(f).join("config.json")).unwrap())
        .collect();
    fuzz("config.json", &seeds, |b| {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(b) {
            let _ = coli_format::ModelSpec::from_config(&v, None);
        }
    });
}

#[test]
fn safetensors_headers_never_panic() {
    let src = coli_tests::fixture_dir("qwen3_moe_bf16").join("model.safetensors");
    let bytes = std::fs::read(if src.exists() {
        src
    } else {
        let dir = coli_tests::fixture_dir("qwen3_moe_bf16");
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .unwrap()
    })
    .unwrap();
    // The header and the first data bytes: damage lands where the parser reads.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let seed = bytes[..(8 + n + 256).min(bytes.len())].to_vec();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("shard.safetensors");
    fuzz("safetensors header", &[seed], |b| {
        std::fs::write(&path, b).unwrap();
        let _ = coli_convert::safetensors::Shard::open(&path, "shard.safetensors");
    });
}

#[test]
fn request_bodies_never_panic() {
    let chat = br#"{"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "stream": true, "stream_options": {"include_usage": true}, "seed": 3, "n": 1}"#;
    let completion = br#"{"model": "m", "prompt": "Once", "max_tokens": 4, "logprobs": null, "stop": "x", "echo": false}"#;
    let messages = br#"{"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}], "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}], "stop_sequences": ["\n\n"], "temperature": 1.0, "top_k": 5, "stream": true, "metadata": {"user_id": "u"}}"#;
    for (path, seed) in [
        ("/v1/chat/completions", &chat[..]),
        ("/v1/completions", &completion[..]),
        ("/v1/messages", &messages[..]),
    ] {
        assert!(
            coli_tools::serve::parse_request_body(path, seed).is_ok(),
            "{path}: the seed itself must be accepted"
        );
        fuzz(path, &[seed.to_vec()], |b| {
            let _ = coli_tools::serve::parse_request_body(path, b);
        });
    }
}

/// The seeds are real inputs the parsers accept (else damage would only test the first check).
#[test]
fn the_seeds_parse() {
    let (_tmp, dir) = store_files();
    let m = coli_store::Manifest::parse(&std::fs::read(dir.join("MANIFEST")).unwrap()).unwrap();
    coli_format::disk::index::parse_index(&std::fs::read(dir.join("INDEX")).unwrap(), &m).unwrap();
    assert!(Path::new(&dir).join("segments/seg-00000.bin").exists());
}
