//! Chat template rendering against transformers' recorded rendering of the demo model's
//! template (tests/fixtures/demo/expected.json, `chat_template`), and perplexity bookkeeping.

use coli_engine::{ChatMessage, ChatTemplate};
use serde_json::Value;
use std::path::Path;

/// SmolLM2-135M-Instruct's chat template (tokenizer_config.json `chat_template` of the demo
/// checkpoint built by tools/demo/make_demo_checkpoint.py).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn demo_expected() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/demo/expected.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn template() -> ChatTemplate {
    ChatTemplate {
        source: SMOLLM2_TEMPLATE.into(),
        special_tokens: vec![
            ("bos_token".into(), "<|im_start|>".into()),
            ("eos_token".into(), "<|im_end|>".into()),
            ("unk_token".into(), "<|endoftext|>".into()),
            ("pad_token".into(), "<|im_end|>".into()),
        ],
        xtml: false,
    }
}

#[test]
fn demo_template_renders_like_transformers() {
    let exp = demo_expected();
    let ct = &exp["chat_template"];
    let messages: Vec<ChatMessage> = ct["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let t = template();
    assert_eq!(
        t.render(&messages, true).unwrap(),
        ct["rendered"].as_str().unwrap()
    );
    assert_eq!(
        t.render(&messages, false).unwrap(),
        ct["rendered_without_generation_prompt"].as_str().unwrap()
    );
    // One user message gets the default system prompt, as in the recorded prompts.
    let p = &exp["lossless"]["prompts"][0];
    let one = [ChatMessage::new("user", p["prompt"].as_str().unwrap())];
    assert_eq!(
        t.render(&one, true).unwrap(),
        p["rendered"].as_str().unwrap()
    );
}

#[test]
#[ignore = "needs the built demo checkpoint (DEMO_DIR or ./demo); CI checks the same rendering through tests/demo_e2e.py"]
fn demo_checkpoint_template_is_the_embedded_one_when_present() {
    // When the demo checkpoint has been built (tools/demo/demo.sh), its template must be the one
    // embedded above; otherwise there is nothing to compare.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var_os("DEMO_DIR")
        .map_or(root.join("demo"), Into::into)
        .join("checkpoint");
    let cfg = std::fs::read(dir.join("tokenizer_config.json"))
        .unwrap_or_else(|e| panic!("no demo checkpoint at {}: {e}", dir.display()));
    let tok = coli_engine::TextTokenizer::from_parts(
        &std::fs::read(dir.join("tokenizer.json")).unwrap(),
        Some(&cfg),
        std::fs::read_to_string(dir.join("chat_template.jinja"))
            .ok()
            .as_deref(),
    )
    .unwrap();
    let exp = demo_expected();
    let ct = &exp["chat_template"];
    let messages: Vec<ChatMessage> = ct["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let (text, ids) = tok.chat_ids(&messages, true).unwrap();
    assert_eq!(text, ct["rendered"].as_str().unwrap());
    let want: Vec<u32> = ct["rendered_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want);
}

/// The published chat templates of the supported families (tests/fixtures/chat_templates/, from
/// the llama-cpp-python 0.3.36 sdist on PyPI, which vendors llama.cpp's copies of them; for
/// DeepSeek-V3.2 llama.cpp's Jinja port of the release's Python prompt encoder) render exactly as
/// transformers' `render_jinja_template` rendered them (`make_chat_template_expected.py`).
#[test]
fn published_family_templates_render_like_transformers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat_templates");
    let exp: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let templates = exp["templates"].as_object().unwrap();
    for family in [
        "glm4_moe",
        "minimax_m2",
        "deepseek_v32",
        "deepseek_v3",
        "kimi_k2",
        "qwen3_moe",
    ] {
        assert!(
            templates.values().any(|t| t["family"] == family),
            "no template for {family}"
        );
    }
    let mut n = 0;
    for (name, t) in templates {
        let ct = coli_tests::chat_template_fixture(t, &dir);
        for case in t["cases"].as_array().unwrap() {
            let messages: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                })
                .collect();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let got = ct
                .render(&messages, gen)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                got,
                case["rendered"].as_str().unwrap(),
                "{name}, {} messages, add_generation_prompt {gen}",
                messages.len()
            );
            n += 1;
        }
    }
    assert!(n >= 40, "{n} renderings");
}

/// A DeepSeek-V3.2 store gets llama.cpp's port of the release's encoder as its chat template
/// (the release ships none): the built-in copy is byte for byte the fixture's, which renders as
/// transformers renders it (above). No other family has a built-in template.
#[test]
fn deepseek_v32_built_in_template_is_the_checked_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat_templates");
    let fixture = std::fs::read_to_string(dir.join("deepseek-v3.2.jinja")).unwrap();
    assert_eq!(
        coli_engine::builtin_chat_template("deepseek_v32"),
        Some(fixture.as_str())
    );
    for family in [
        "deepseek_v3",
        "glm_moe_dsa",
        "glm4_moe",
        "minimax_m2",
        "mixtral",
    ] {
        assert_eq!(coli_engine::builtin_chat_template(family), None, "{family}");
    }
}
