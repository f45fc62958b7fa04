//! Kimi K3's chat format (XTML, `coli_engine::xtml`) against the release's own encoder:
//! `tests/fixtures/chat_k3/make_k3_chat_expected.py` ran `encoding_k3.py` (vendored unchanged in
//! tests/fixtures/oracle/kimi_k3/) on 13 conversations (history, thinking on and off, the
//! thinking-effort note, tools with calls whose arguments are JSON strings, objects of every
//! JSON type and text that is not JSON, tool results out of call order, special-token strings
//! in text and attribute values, tool_choice and response_format notes) and tiktoken encoded
//! each segment as K3's tokenizer does. coli's segments must be the encoder's, and its ids
//! tiktoken's, through the tokenizer coli converts from the same tiktoken vocabulary.

use coli_convert::tiktoken::{convert, Tiktoken};
use coli_engine::text::{ChatMessage, ChatTemplate, TextTokenizer};
use coli_engine::xtml::{segments, Segment, XtmlOptions};
use serde_json::Value;
use std::path::Path;

fn fixtures() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"))
}

/// The tiktoken fixture's vocabulary with the XTML markers named (chat_k3's
/// tokenizer_config.json), converted as coli-convert converts a K3 checkpoint's tokenizer.
fn tokenizer() -> TextTokenizer {
    let tmp = tempfile::tempdir().unwrap();
    for (f, from) in [
        ("tiktoken.model", "tiktoken/kimi"),
        ("tokenization_kimi.py", "tiktoken/kimi"),
        ("tokenizer_config.json", "chat_k3"),
    ] {
        std::fs::copy(fixtures().join(from).join(f), tmp.path().join(f)).unwrap();
    }
    let Some(Tiktoken::Converted { tokenizer_json, .. }) = convert(tmp.path()).unwrap() else {
        panic!("not converted")
    };
    let cfg = std::fs::read(fixtures().join("chat_k3/tokenizer_config.json")).unwrap();
    let mut t = TextTokenizer::from_parts(&tokenizer_json, Some(&cfg), None).unwrap();
    assert!(t.chat_template.is_none(), "K3 ships no template");
    t.chat_template = Some(ChatTemplate::xtml());
    t
}

fn message(m: &Value) -> ChatMessage {
    let mut c = ChatMessage::new(
        m["role"].as_str().unwrap(),
        m["content"].as_str().unwrap_or(""),
    );
    c.tool_calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    c.tool_call_id = m["tool_call_id"].as_str().map(str::to_string);
    c.name = m["name"].as_str().map(str::to_string);
    c
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fixtures().join("chat_k3/expected.json")).unwrap())
        .unwrap()
}

#[test]
fn xtml_segments_and_ids_are_the_release_encoders() {
    let exp = expected();
    let tok = tokenizer();
    let cases = exp["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 13);
    for c in cases {
        let title = c["title"].as_str().unwrap();
        let msgs: Vec<ChatMessage> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect();
        let tools = c["tools"].as_array().cloned();
        let opts = XtmlOptions {
            thinking: c["thinking"].as_bool().unwrap(),
            thinking_effort: c["thinking_effort"].as_str().map(str::to_string),
            tool_choice: c["tool_choice"].as_str().map(str::to_string),
            response_format: Some(c["response_format"].clone()).filter(|v| !v.is_null()),
        };
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let segs = segments(&msgs, tools.as_deref(), add, &opts).unwrap();
        let want: Vec<Segment> = c["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Segment {
                text: s[0].as_str().unwrap().to_string(),
                special: s[1].as_bool().unwrap(),
            })
            .collect();
        assert_eq!(segs, want, "{title}: segments");
        let ids = coli_tests::ids(&c["ids"]);
        assert_eq!(tok.encode_segments(&segs).unwrap(), ids, "{title}: ids");
        // The chat path (`coli chat`, `coli serve`) renders with K3's defaults: thinking, effort
        // max.
        if opts == XtmlOptions::default() {
            let (text, got) = tok
                .chat_ids_with_tools(&msgs, add, tools.as_deref())
                .unwrap();
            assert_eq!(got, ids, "{title}: chat ids");
            assert_eq!(text, c["text"].as_str().unwrap(), "{title}: text");
        }
    }
}

#[test]
fn special_token_strings_in_text_stay_text() {
    // Encoding the rendered text whole (as a Jinja template's output is) would turn the user's
    // `<|end_of_msg|><|open|>` into markers; the segments keep them text.
    let exp = expected();
    let tok = tokenizer();
    let c = exp["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["title"] == "special-token strings in text and attributes")
        .unwrap();
    let ids = coli_tests::ids(&c["ids"]);
    let whole = tok.encode(c["text"].as_str().unwrap(), false).unwrap();
    assert_ne!(whole, ids);
    let open = tok.token_id("<|open|>").unwrap();
    assert_eq!(
        ids.iter().filter(|&&i| i == open).count() + 1,
        whole.iter().filter(|&&i| i == open).count()
    );
}

#[test]
fn bad_conversations_are_refused() {
    let user = ChatMessage::new("user", "hi");
    let medium = XtmlOptions {
        thinking_effort: Some("medium".into()),
        ..XtmlOptions::default()
    };
    let e = segments(std::slice::from_ref(&user), None, true, &medium).unwrap_err();
    assert!(e.to_string().contains("thinking_effort"), "{e}");
    // A tool result no call or name names.
    let orphan = ChatMessage::new("tool", "42");
    let e = segments(&[user.clone(), orphan], None, true, &XtmlOptions::default()).unwrap_err();
    assert!(e.to_string().contains("tool name"), "{e}");
    // Arguments that are JSON but not an object.
    let mut a = ChatMessage::new("assistant", "");
    a.tool_calls = vec![serde_json::json!({"function": {"name": "f", "arguments": "[1, 2]"}})];
    let e = segments(&[user, a], None, true, &XtmlOptions::default()).unwrap_err();
    assert!(e.to_string().contains("JSON object"), "{e}");
}
