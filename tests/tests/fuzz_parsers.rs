//! Fuzzing on stable Rust (issue 42): every parser that reads outside input gets valid inputs
//! with random damage (bytes flipped, set, inserted, removed, the input cut short) and must
//! answer `Ok` or an error, never panic or hang: the MANIFEST, INDEX and segment headers of a
//! real store, config.json through the model spec, safetensors shard headers, the request
//! bodies of both HTTP APIs, chat-template inputs (messages and template sources) and
//! prefix-cache files. Driven by proptest (shrinking finds the smallest failing input).
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

/// Chat-template inputs: the committed release templates (tests/fixtures/chat_templates) render
/// damaged message lists (a JSON seed of every role, damaged, then parsed; inputs that are not
/// a list of `{role, content}` strings are skipped as the server would refuse them), and
/// damaged template sources (a store's `chat_template` can be anything) render a fixed
/// conversation: `Ok` or an error, never a panic.
#[test]
fn chat_template_inputs_never_panic() {
    use coli_engine::text::{ChatMessage, ChatTemplate};
    let dir = coli_tests::published::repo_root().join("tests/fixtures/chat_templates");
    let mut templates: Vec<(String, ChatTemplate)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let t = ChatTemplate {
                source: std::fs::read_to_string(&p).unwrap(),
                special_tokens: vec![
                    ("bos_token".into(), "<s>".into()),
                    ("eos_token".into(), "</s>".into()),
                ],
                xtml: false,
            };
            (name, t)
        })
        .collect();
    templates.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(templates.len() >= 5, "templates in {}", dir.display());
    let conversation = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi <|im_start|> {{ x }} {% if %}"),
        ChatMessage::new("assistant", "<think>hm</think>Hello"),
        ChatMessage::new("user", "More\u{0}\u{202e}?"),
    ];
    let seed = serde_json::to_vec(
        &conversation
            .iter()
            .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for (name, t) in &templates {
        t.render(&conversation, true)
            .unwrap_or_else(|e| panic!("{name}: the seed conversation must render: {e}"));
        fuzz(
            &format!("chat template {name}: messages"),
            std::slice::from_ref(&seed),
            |b| {
                let Ok(v) = serde_json::from_slice::<Vec<serde_json::Value>>(b) else {
                    return;
                };
                let msgs: Option<Vec<ChatMessage>> = v
                    .iter()
                    .map(|m| {
                        Some(ChatMessage::new(
                            m["role"].as_str()?,
                            m["content"].as_str()?,
                        ))
                    })
                    .collect();
                if let Some(msgs) = msgs {
                    let _ = t.render(&msgs, true);
                }
            },
        );
        fuzz(
            &format!("chat template {name}: source"),
            &[t.source.clone().into_bytes()],
            |b| {
                let damaged = ChatTemplate {
                    source: String::from_utf8_lossy(b).into_owned(),
                    special_tokens: t.special_tokens.clone(),
                    xtml: false,
                };
                let _ = damaged.render(&conversation, true);
            },
        );
    }
}

/// Prefix-cache files (the KV state of a conversation on disk, docs/KV_CACHE.md): a file the
/// engine wrote for the OLMoE fixture, damaged, read back against the model's layout: `Ok`
/// (only if every check passes) or an error, never a panic, and never a huge allocation from a
/// damaged length.
#[test]
fn prefix_cache_files_never_panic() {
    use coli_engine::{BatchItem, Engine, EngineOptions, Logits};
    let (_tmp, dir) = coli_tests::convert_fixture("olmoe_fp8", "int4_store");
    let store = coli_tests::open_store(&dir, false, coli_store::IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let mut seq = e.new_sequence().unwrap();
    let ids: Vec<u32> = (1..=9).collect();
    for chunk in ids.chunks(4) {
        let mut items = [BatchItem {
            seq: &mut seq,
            ids: chunk,
            logits: Some(Logits::Last),
            verify: false,
        }];
        e.forward_many(&mut items).unwrap();
    }
    let layout = e.kv_layout();
    let work = tempfile::tempdir().unwrap();
    let good = work.path().join("seed.kv");
    coli_engine::prefix_cache::file::write_atomic(
        &good,
        &seq.into_state(),
        layout.store_id,
        layout.param_hash,
        0,
    )
    .unwrap();
    coli_engine::prefix_cache::file::read_state(&good, &layout).expect("the seed reads back");
    let seed = std::fs::read(&good).unwrap();
    let path = work.path().join("damaged.kv");
    fuzz("prefix-cache file", &[seed], |b| {
        std::fs::write(&path, b).unwrap();
        let _ = coli_engine::prefix_cache::file::read_header(&path, Some(&layout));
        let _ = coli_engine::prefix_cache::file::read_state(&path, &layout);
    });
}

/// The seeds are real inputs the parsers accept (else damage would only test the first check).
#[test]
fn the_seeds_parse() {
    let (_tmp, dir) = store_files();
    let m = coli_store::Manifest::parse(&std::fs::read(dir.join("MANIFEST")).unwrap()).unwrap();
    coli_format::disk::index::parse_index(&std::fs::read(dir.join("INDEX")).unwrap(), &m).unwrap();
    assert!(Path::new(&dir).join("segments/seg-00000.bin").exists());
}
