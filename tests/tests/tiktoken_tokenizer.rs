//! Kimi's tokenizer as its checkpoints publish it (Kimi-K2, Kimi-Linear, Kimi K3: `tiktoken.model`
//! and `tokenization_kimi.py`, no tokenizer.json), converted by `coli-convert`
//! (`coli_convert::tiktoken`), tokenizes as tiktoken does: ids of committed texts written once by
//! `tests/fixtures/tiktoken/make_tiktoken_fixture.py` with PyPI tiktoken on a real tiktoken
//! vocabulary (Llama 3's first 40000 ranks) with Kimi's split regex and special tokens.

use coli_convert::tiktoken::{convert, Tiktoken};
use coli_engine::text::TextTokenizer;
use coli_engine::{Engine, EngineOptions};
use coli_tests::{convert_fixture_with, expected, fixture_dir, greedy, open_store};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn kimi_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiktoken/kimi")
}

fn fixture_expected() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiktoken/expected.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn converted(dir: &Path) -> (Vec<u8>, String) {
    match convert(dir).unwrap() {
        Some(Tiktoken::Converted {
            tokenizer_json,
            note,
        }) => (tokenizer_json, note),
        other => panic!("{}: {other:?}", dir.display()),
    }
}

/// A copy of the tokenizer fixture in a new directory, with `edit(name, bytes)` applied to each
/// file (None drops it).
fn edited(edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "tiktoken.model",
        "tokenizer_config.json",
        "tokenization_kimi.py",
    ] {
        if let Some(b) = edit(f, std::fs::read(kimi_dir().join(f)).unwrap()) {
            std::fs::write(tmp.path().join(f), b).unwrap();
        }
    }
    tmp
}

#[test]
fn tiktoken_ranks_tokenize_as_tiktoken_does() {
    let exp = fixture_expected();
    let model = std::fs::read(kimi_dir().join("tiktoken.model")).unwrap();
    let sha = coli_tests::sha256_hex(&model);
    assert_eq!(sha, exp["tiktoken_model_sha256"].as_str().unwrap());
    let (json, note) = converted(&kimi_dir());
    assert!(
        note.contains("40000 ranks") && note.contains("258 special tokens"),
        "{note}"
    );
    let cfg = std::fs::read(kimi_dir().join("tokenizer_config.json")).unwrap();
    let tok = TextTokenizer::from_parts(&json, Some(&cfg), None).unwrap();
    let texts = exp["texts"].as_array().unwrap();
    let ids = exp["ids"].as_array().unwrap();
    assert!(texts.len() > 400);
    for (text, want) in texts.iter().zip(ids) {
        let text = text.as_str().unwrap();
        let want: Vec<u32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, want, "{text:?}");
        assert_eq!(tok.decode(&got, false).unwrap(), text);
    }
    // The special ids follow the ranks, named by tokenizer_config.json or reserved.
    let first = exp["first_special"].as_u64().unwrap() as u32;
    assert_eq!(tok.token_id("[BOS]"), Some(first));
    assert_eq!(tok.token_id("<|im_end|>"), Some(first + 2));
    assert_eq!(tok.token_id("<|im_middle|>"), Some(first + 17));
    assert_eq!(
        tok.token_id(&format!("<|reserved_token_{}|>", first + 5)),
        Some(first + 5)
    );
    assert_eq!(
        tok.token_id(&format!("<|reserved_token_{}|>", first + 258)),
        None
    );
    // Kimi K3's class numbers num_reserved_special_tokens ids, not 2 more.
    let k3 = edited(|f, b| match f {
        "tokenization_kimi.py" => Some(
            String::from_utf8(b)
                .unwrap()
                .replace(
                    "num_reserved_special_tokens + 2",
                    "num_reserved_special_tokens",
                )
                .into_bytes(),
        ),
        _ => Some(b),
    });
    let (k3_json, k3_note) = converted(k3.path());
    assert!(k3_note.contains("256 special tokens"), "{k3_note}");
    let k3_tok = TextTokenizer::from_parts(&k3_json, Some(&cfg), None).unwrap();
    assert_eq!(k3_tok.token_id("[PAD]"), Some(first + 255));
    assert_eq!(
        k3_tok.token_id(&format!("<|reserved_token_{}|>", first + 256)),
        None
    );
    assert_eq!(
        tok.token_id(&format!("<|reserved_token_{}|>", first + 257)),
        Some(first + 257)
    );
    // Deterministic: the same bytes every time.
    assert_eq!(converted(&kimi_dir()).0, json);
}

/// The Kimi K3 fixture with this tokenizer beside it converts into a store that runs on text.
#[test]
fn a_kimi_checkpoint_converts_with_its_tokenizer_and_runs_on_text() {
    let name = "kimi_k3_mxfp4";
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("checkpoint");
    std::fs::create_dir(&ck).unwrap();
    for dir in [fixture_dir(name), kimi_dir()] {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
        }
    }
    let out = tmp.path().join("store");
    let params = &expected(name)["lossless_store"];
    let report = coli_tests::convert_dir(&ck, &out, params);
    let note = report.tokenizer.as_deref().unwrap_or_default();
    assert!(
        note.starts_with("tokenizer.json written from tiktoken.model"),
        "{note}"
    );
    assert!(report
        .to_text()
        .contains("tokenizer: tokenizer.json written"));
    let store = open_store(&out, true, coli_store::IoPreference::Auto);
    assert_eq!(
        store.file("tokenizer.json").unwrap().unwrap(),
        converted(&kimi_dir()).0
    );
    let tok = TextTokenizer::from_store(&store)
        .unwrap()
        .expect("a tokenizer");
    // K3 ships no chat template: its store chats in K3's own format (coli_engine::xtml,
    // tests/tests/chat_k3.rs), whose markers this test vocabulary does not name.
    assert!(tok.chat_template.as_ref().is_some_and(|t| t.xtml));
    let e = tok
        .chat_ids(&[coli_engine::ChatMessage::new("user", "hi")], true)
        .unwrap_err();
    assert!(e.to_string().contains("<|open|>"), "{e}");
    // A prompt whose tokens are within the tiny model's 512-row vocabulary.
    let prompt = tok.encode(" the in and the", false).unwrap();
    assert!(
        prompt.len() >= 4 && prompt.iter().all(|&t| t < 512),
        "{prompt:?}"
    );
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let out_ids = greedy(&mut e, &prompt, 6);
    assert!(!out_ids.is_empty());
    // The same tokens as the store without a tokenizer gives on those ids.
    let (_t2, plain) = convert_fixture_with(name, params, "lossless_store");
    let plain = open_store(&plain, true, coli_store::IoPreference::Auto);
    assert!(TextTokenizer::from_store(&plain).unwrap().is_none());
    let mut e2 = Engine::new(&plain, &EngineOptions::default()).unwrap();
    assert_eq!(greedy(&mut e2, &prompt, 6), out_ids);
    tok.decode(&out_ids, false).unwrap();
}

#[test]
fn broken_tiktoken_files_are_refused_naming_the_line() {
    let lines = |f: &str, b: Vec<u8>, edit: &dyn Fn(&mut Vec<String>)| {
        if f != "tiktoken.model" {
            return Some(b);
        }
        let mut l: Vec<String> = String::from_utf8(b)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        edit(&mut l);
        Some((l.join("\n") + "\n").into_bytes())
    };
    type Edit = Box<dyn Fn(&mut Vec<String>)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "line 3: \"%%%\" is not base64",
            Box::new(|l| l[2] = "%%% 2".into()),
        ),
        (
            "line 4: rank \"x\" is not a number",
            Box::new(|l| l[3] = "YQ== x".into()),
        ),
        (
            "line 5: rank 1 is given twice",
            Box::new(|l| {
                let t = l[4].split(' ').next().unwrap().to_string();
                l[4] = format!("{t} 1");
            }),
        ),
        (
            "line 7: the token of rank 6 is also rank 0",
            Box::new(|l| {
                let t = l[0].split(' ').next().unwrap().to_string();
                l[6] = format!("{t} 6");
            }),
        ),
        (
            "rank 39998 is missing",
            Box::new(|l| {
                l.remove(39998);
            }),
        ),
        (
            "line 2: \"QQ==\" is not `base64 rank`",
            Box::new(|l| l[1] = "QQ==".into()),
        ),
        // A byte-level vocabulary without the byte "b" (rank 65 is the one-byte token "b"):
        // the last rank takes its place.
        (
            "no token is the single byte 0x62",
            Box::new(|l| {
                let last = l.pop().unwrap();
                let t = last.split(' ').next().unwrap().to_string();
                l[65] = format!("{t} 65");
            }),
        ),
    ];
    for (want, edit) in cases {
        let dir = edited(|f, b| lines(f, b, &*edit));
        let err = convert(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("tiktoken.model") && err.contains(want),
            "{want}: {err}"
        );
    }
    // A directory where the file should be.
    let dir = edited(|f, b| (f != "tiktoken.model").then_some(b));
    std::fs::create_dir(dir.path().join("tiktoken.model")).unwrap();
    let err = convert(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("tiktoken.model") && err.contains("is not a file"),
        "{err}"
    );
    // Through the converter: refused before anything is written.
    let name = "kimi_k3_mxfp4";
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("checkpoint");
    std::fs::create_dir(&ck).unwrap();
    for e in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
    }
    let bad = edited(|f, b| lines(f, b, &|l| l[2] = "%%% 2".into()));
    for f in [
        "tiktoken.model",
        "tokenizer_config.json",
        "tokenization_kimi.py",
    ] {
        std::fs::copy(bad.path().join(f), ck.join(f)).unwrap();
    }
    let out = tmp.path().join("store");
    let err = coli_tests::try_convert_dir(&ck, &out, &expected(name)["lossless_store"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tiktoken.model") && err.contains("line 3"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn tokenizer_classes_coli_cannot_read_are_skipped_with_the_reason() {
    let py = |edit: fn(String) -> String| {
        edited(move |f, b| match f {
            "tokenization_kimi.py" => Some(edit(String::from_utf8(b).unwrap()).into_bytes()),
            _ => Some(b),
        })
    };
    let cases: Vec<(tempfile::TempDir, &str)> = vec![
        (
            py(|s| s.replace(r#"r"""\p{N}{1,3}""","#, r#"r"""\p{N}+""","#)),
            "split regex is not one coli converts",
        ),
        (
            py(|s| s.replace("num_reserved_special_tokens + 2", "num_reserved_special_tokens + 3")),
            "does not number its special tokens",
        ),
        (
            py(|s| s.replace("special_tokens_mapping.get(i,", "names.get(i,")),
            "does not number its special tokens",
        ),
        (py(|s| s.replace("pat_str", "pattern")), "has no `pat_str"),
        (
            edited(|f, b| (f != "tokenization_kimi.py").then_some(b)),
            "tokenization_kimi.py, the tokenizer class tokenizer_config.json names, is not in the checkpoint",
        ),
        (
            edited(|f, b| (f != "tokenizer_config.json").then_some(b)),
            "no tokenizer_config.json",
        ),
    ];
    for (dir, want) in cases {
        match convert(dir.path()).unwrap() {
            Some(Tiktoken::Skipped(why)) => {
                assert!(
                    why.contains(want) && why.ends_with("the store runs on token ids"),
                    "{want}: {why}"
                )
            }
            other => panic!("{want}: {other:?}"),
        }
    }
    // tokenizer.json keys special tokens by text: a special named as an ordinary token, or two
    // specials of one name, would change ids: skipped, saying which.
    let cfg_with = |edit: fn(&mut Value)| {
        edited(move |f, b| match f {
            "tokenizer_config.json" => {
                let mut v: Value = serde_json::from_slice(&b).unwrap();
                edit(&mut v);
                Some(serde_json::to_vec(&v).unwrap())
            }
            _ => Some(b),
        })
    };
    for (dir, want) in [
        (
            cfg_with(|v| {
                v["added_tokens_decoder"]["40020"] = serde_json::json!({"content": "hello"})
            }),
            "special token 40020 is named \"hello\", which is also an ordinary token",
        ),
        (
            cfg_with(|v| {
                v["added_tokens_decoder"]["40021"] = serde_json::json!({"content": "[EOS]"})
            }),
            "special token 40021 is named \"[EOS]\", as another one is",
        ),
        (
            py(|s| {
                s.replace(
                    "num_reserved_special_tokens = 256",
                    "num_reserved_special_tokens = 4000000000",
                )
            }),
            "does not number its special tokens",
        ),
        (
            cfg_with(|v| {
                v["auto_map"]["AutoTokenizer"] =
                    serde_json::json!(["/etc/tokenization_kimi.TikTokenTokenizer", null])
            }),
            "is not a module and class name of this checkpoint",
        ),
        (
            edited(|f, b| {
                Some(if f == "tokenization_kimi.py" {
                    vec![0xff, 0xfe, b'x']
                } else {
                    b
                })
            }),
            "tokenization_kimi.py is not UTF-8 text",
        ),
    ] {
        match convert(dir.path()).unwrap() {
            Some(Tiktoken::Skipped(why)) => assert!(why.contains(want), "{want}: {why}"),
            other => panic!("{want}: {other:?}"),
        }
    }
    // What the class itself says, not another class of the module; the Hub's
    // `repo--module.Class` form; whitespace between the fields as tiktoken splits them.
    let (want, _) = converted(&kimi_dir());
    let two = py(|s| format!("class Old:\n    num_reserved_special_tokens = 100\n\n\n{s}"));
    assert_eq!(converted(two.path()).0, want);
    let hub = cfg_with(|v| {
        v["auto_map"]["AutoTokenizer"] = serde_json::json!([
            "moonshotai/Kimi-K3--tokenization_kimi.TikTokenTokenizer",
            null
        ])
    });
    assert_eq!(converted(hub.path()).0, want);
    let tabs = edited(|f, b| match f {
        "tiktoken.model" => Some(
            String::from_utf8(b)
                .unwrap()
                .replace(' ', " \t ")
                .into_bytes(),
        ),
        _ => Some(b),
    });
    assert_eq!(converted(tabs.path()).0, want);
    // No tiktoken.model: nothing to do.
    let none = edited(|f, b| (f != "tiktoken.model").then_some(b));
    assert!(convert(none.path()).unwrap().is_none());
    // A tokenizer_config.json that is not JSON is an error naming it.
    let bad = edited(|f, b| {
        Some(if f == "tokenizer_config.json" {
            b"{".to_vec()
        } else {
            b
        })
    });
    let err = convert(bad.path()).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json") && err.contains("not valid JSON"),
        "{err}"
    );
}
