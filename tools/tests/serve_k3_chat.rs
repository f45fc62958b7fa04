//! `coli serve` on a Kimi K3 store: it chats in K3's own format (coli_engine::xtml; the format
//! itself is held to the release's encoder in tests/tests/chat_k3.rs), and refuses what that
//! format's replies cannot serve yet: tools and structured output (their calls are not parsed,
//! and the other syntaxes' grammars would force text K3 does not write).

mod common;

use common::TempDir;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

/// POSTs `body` to `path`: (status line, JSON body).
fn post(addr: &str, path: &str, body: &Value) -> (String, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, rest) = reply.split_once("\r\n\r\n").unwrap();
    (
        head.lines().next().unwrap().to_string(),
        serde_json::from_str(rest).unwrap_or(Value::Null),
    )
}

#[test]
fn k3_store_chats_in_xtml_and_refuses_tools() {
    let tmp = TempDir::new("serve-k3");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    // The K3 fixture with a tokenizer whose special ids name the XTML markers.
    let ck = tmp.path().join("checkpoint");
    std::fs::create_dir_all(&ck).unwrap();
    for e in std::fs::read_dir(fixtures.join("tiny/kimi_k3_mxfp4")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
    }
    for (f, from) in [
        ("tiktoken.model", "tiktoken/kimi"),
        ("tokenization_kimi.py", "tiktoken/kimi"),
        ("tokenizer_config.json", "chat_k3"),
    ] {
        std::fs::copy(fixtures.join(from).join(f), ck.join(f)).unwrap();
    }
    let store = tmp.path().join("store");
    common::convert_dir(&ck, &store);
    let (mut child, addr) = common::spawn_serve(&[
        "--store".as_ref(),
        store.as_os_str(),
        "--port".as_ref(),
        "0".as_ref(),
    ]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let tool =
        json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
    let (status, body) = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": "store", "messages": user, "tools": [tool], "max_tokens": 1}),
    );
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        status.contains(" 400 ") && msg.contains("XTML") && body["error"]["param"] == "tools",
        "{status} {body}"
    );
    let (status, body) = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": "store", "messages": user, "max_tokens": 1,
                "response_format": {"type": "json_object"}}),
    );
    assert!(
        status.contains(" 400 ") && body["error"]["param"] == "response_format",
        "{status} {body}"
    );
    // A plain chat renders in XTML: its markers are this tokenizer's ids 40020.., past the tiny
    // model's 512-token vocabulary, which the server names (a real K3 store's vocabulary holds
    // them).
    let (status, body) = post(
        &addr,
        "/v1/chat/completions",
        &json!({"model": "store", "messages": user, "max_tokens": 1}),
    );
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        status.contains(" 400 ") && msg.contains("token id 40020"),
        "{status} {body}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
