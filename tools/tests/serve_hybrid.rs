//! `coli serve` on a model with gated delta rule layers (the Qwen3-Next fixture): whatever
//! `--prefill-batch` of at least 64 the server runs, the prefill chunks its scheduler feeds one
//! per step beside a decoding request are cut at the same aligned positions
//! (`coli_engine::prefill`), so the sequence state it leaves is the same bits, on a fresh prompt
//! and on a prompt that resumes from a cached prefix whose length is not a multiple of 64. The states are read back from the servers' own prefix-cache files (`--kv-dir`,
//! docs/KV_CACHE.md) and compared by the logits each gives for one more token; a chunk below 64
//! (all positions in the recurrent form) gives other bits, which shows the comparison sees the
//! cuts.

mod common;

use coli_engine::prefix_cache::file::read_state;
use coli_engine::{Engine, EngineOptions, Logits};
use common::TempDir;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Child;

const FIXTURE: &str = "qwen3_next_bf16";

/// The fixture checkpoint with a word-level `tokenizer.json` (`t0` .. `t{V-1}`: serve needs a
/// tokenizer; the prompts here are token ids), converted into `dir/store`.
fn hybrid_store(dir: &Path) -> (PathBuf, Value) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny")
        .join(FIXTURE);
    let ck = dir.join("checkpoint");
    std::fs::create_dir_all(&ck).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
    }
    let config: Value =
        serde_json::from_slice(&std::fs::read(ck.join("config.json")).unwrap()).unwrap();
    let vocab: serde_json::Map<String, Value> = (0..config["vocab_size"].as_u64().unwrap())
        .map(|i| (format!("t{i}"), json!(i)))
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    std::fs::write(ck.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let store = dir.join("store");
    common::convert_dir(&ck, &store);
    let expected: Value =
        serde_json::from_slice(&std::fs::read(src.join("expected.json")).unwrap()).unwrap();
    (store, expected)
}

/// A `coli serve` child on a free port; killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(store: &Path, prefill_batch: usize, kv_dir: &Path) -> Server {
        let pb = prefill_batch.to_string();
        let args: Vec<&std::ffi::OsStr> = vec![
            "--store".as_ref(),
            store.as_os_str(),
            "--port".as_ref(),
            "0".as_ref(),
            "--speculate".as_ref(),
            "off".as_ref(),
            "--max-batch".as_ref(),
            "2".as_ref(),
            "--prefill-batch".as_ref(),
            pb.as_ref(),
            "--kv-dir".as_ref(),
            kv_dir.as_os_str(),
            // f32 activations, as the engine this test reads the files with (the library's
            // default): the recurrent form's states below 64 are then within f32 rounding of
            // the chunked form's, where integer activations would amplify that difference.
            "--numerics".as_ref(),
            "exact".as_ref(),
        ];
        let (child, addr) = common::spawn_serve(&args);
        Server { child, addr }
    }

    /// Sends a greedy completion request of `prompt` (token ids), `max_tokens` long, on a new
    /// connection (`stream`: as server-sent events; `ignore_eos`: past the EOS token).
    fn send(&self, prompt: &[u32], max_tokens: usize, stream: bool) -> TcpStream {
        let body = json!({
            "model": "store", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, "ignore_eos": true
        })
        .to_string();
        let mut s = TcpStream::connect(&self.addr).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        s
    }

    /// A greedy completion of `prompt`, `max_tokens` long: its response.
    fn complete(&self, prompt: &[u32], max_tokens: usize) -> Value {
        let mut reply = String::new();
        self.send(prompt, max_tokens, false)
            .read_to_string(&mut reply)
            .unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// Starts a long streamed completion of `prompt` and returns once its first token arrived
    /// (so that it is decoding: prompts sent meanwhile are prefilled one chunk per step beside
    /// it); the thread reads it to its end.
    fn decode_in_background(
        &self,
        prompt: &[u32],
        max_tokens: usize,
    ) -> std::thread::JoinHandle<()> {
        let mut r = BufReader::new(self.send(prompt, max_tokens, true));
        let mut line = String::new();
        while !line.starts_with("data: {") {
            line.clear();
            assert!(
                r.read_line(&mut line).unwrap() > 0,
                "the stream ended early"
            );
        }
        std::thread::spawn(move || {
            let mut rest = String::new();
            r.read_to_string(&mut rest).unwrap();
            assert!(rest.contains("data: [DONE]"), "{rest}");
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The longest state file in `kv_dir` whose tokens start with `prefix`, and its state's logits
/// after one more token `next` (one pass through `Engine::prefill_sequence` on an engine of
/// `store`).
fn next_logits(store: &Path, kv_dir: &Path, prefix: &[u32], next: u32) -> (Vec<u32>, Vec<f32>) {
    let s = common::open_store(store);
    let mut e = Engine::new(&s, &EngineOptions::default()).unwrap();
    let layout = e.kv_layout();
    let mut best: Option<coli_engine::KvState> = None;
    for f in std::fs::read_dir(kv_dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "kv") {
            let (_, st) = read_state(&p, &layout).unwrap();
            if st.tokens().starts_with(prefix) && best.as_ref().is_none_or(|b| st.len() > b.len()) {
                best = Some(st);
            }
        }
    }
    let st = best.expect("the server wrote no state file");
    let tokens = st.tokens().to_vec();
    let mut seq = e.resume_sequence(st).unwrap();
    let mut rows = e
        .prefill_sequence(&mut seq, &[next], Logits::Last, &|| false)
        .unwrap();
    (tokens, rows.pop().unwrap())
}

#[test]
fn serve_prefill_cuts_keep_the_bits_of_a_hybrid_model() {
    let dir = TempDir::new("serve-hybrid");
    let (store, exp) = hybrid_store(dir.path());
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    // 150 prompt tokens; then the same prompt and 3 generated tokens plus 60 more, which
    // resumes from the first request's cached state (151 positions: not a multiple of 64).
    let prompt = ids(&exp["long_prompt_ids"]);
    let extra: Vec<u32> = prompt[..60].iter().rev().copied().collect();
    let mut runs = Vec::new();
    for batch in [2048, 64, 100, 192, 16] {
        let kv = dir.path().join(format!("kv-{batch}"));
        let server = Server::start(&store, batch, &kv);
        // A request decoding meanwhile: the prompts below are not the server's only work, so
        // its scheduler cuts them (a lone prompt runs through `Engine::prefill_sequence`).
        let background = server.decode_in_background(&prompt[..8], 900);
        let first = server.complete(&prompt, 3);
        // The generated text, as the word-level tokenizer writes it: "t12 t7 t301".
        let generated: Vec<u32> = first["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .map(|w| w[1..].parse().unwrap())
            .collect();
        assert_eq!(generated.len(), 3, "{first}");
        let mut second = prompt.clone();
        second.extend(&generated);
        second.extend(&extra);
        let r = server.complete(&second, 1);
        let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        background.join().unwrap();
        drop(server);
        let (tokens, logits) = next_logits(&store, &kv, &prompt, 7);
        runs.push((batch, generated, cached, tokens, logits));
    }
    let (_, gen0, _, tokens0, logits0) = &runs[0];
    // The reference: the same tokens in one in-process pass.
    let s = common::open_store(&store);
    let mut e = Engine::new(
        &s,
        &EngineOptions {
            prefill_batch: 4096,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let mut seq = e.new_sequence().unwrap();
    let mut all = tokens0.clone();
    all.push(7);
    let one_pass = e
        .prefill_sequence(&mut seq, &all, Logits::Last, &|| false)
        .unwrap()
        .pop()
        .unwrap();
    for (batch, generated, cached, tokens, logits) in &runs {
        assert_eq!(generated, gen0, "prefill batch {batch}: generated tokens");
        assert_eq!(tokens, tokens0, "prefill batch {batch}: the state's tokens");
        assert!(
            *cached >= 128 && *cached < prompt.len() as u64 + 3,
            "prefill batch {batch}: the second request resumes from the first's state ({cached} cached)"
        );
        let d = common::max_abs_diff(logits, logits0);
        if *batch >= 64 {
            assert!(
                logits == logits0,
                "prefill batch {batch}: the served state differs in its bits from batch 2048's (by up to {d})"
            );
        } else {
            // Below 64 every position runs the recurrent form: close, not the same bits.
            assert!(logits != logits0 && d < 1e-3, "prefill batch {batch}: {d}");
        }
    }
    // Serving from cached prefixes and cutting at aligned positions gives what one pass over
    // the whole sequence from position 0 does only where the cuts coincide; here the first
    // request's state ends at 150 and the resumed prefill starts there, so the reference is
    // close but need not be the same bits.
    let d = common::max_abs_diff(&one_pass, logits0);
    assert!(d < 1e-3, "one pass vs served: {d}");
}
