//! Tools through the published chat templates, checked against transformers and the templates
//! themselves (tests/fixtures/make_tool_call_expected.py wrote tools_expected.json):
//!
//! - coli renders conversations with `tools` (and with calls and their results) as
//!   transformers' `apply_chat_template(..., tools=...)` does;
//! - the text a template writes for an assistant turn's calls is what the model emits when it
//!   calls: coli's parser for the syntax detected from the template reads those calls back,
//!   every way the text can be cut into streamed pieces;
//! - the grammar coli forces a call with (`tool_choice` required) accepts that very text, so a
//!   constrained model writes calls the way its template does.

use coli_engine::constrain::Grammars;
use coli_engine::tool_calls::grammar::{tool_call_grammar, ToolSpec};
use coli_engine::tool_calls::{ParamTypes, ToolCallParser, ToolEvent, ToolSyntax};
use coli_engine::ChatMessage;
use serde_json::Value;
use std::path::Path;

fn expected() -> (Value, std::path::PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat_templates");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tools_expected.json")).unwrap())
            .unwrap();
    (v, dir)
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut c = ChatMessage::new(
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap_or_default(),
            );
            if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                c.tool_calls = calls.clone();
            }
            c.tool_call_id = m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(String::from);
            c.name = m.get("name").and_then(Value::as_str).map(String::from);
            c
        })
        .collect()
}

use coli_tests::chat_template_fixture as template;

#[test]
fn prompts_with_tools_render_as_transformers_renders_them() {
    let (v, dir) = expected();
    let tools = v["tools"].as_array().unwrap();
    let mut checked = 0;
    for (name, t) in v["templates"].as_object().unwrap() {
        let tmpl = template(t, &dir);
        for p in t["prompts"].as_array().unwrap() {
            let Some(want) = p["rendered"].as_str() else {
                continue;
            };
            let offered = (p["tools"] == true).then_some(&tools[..]);
            let got = tmpl
                .render_with_tools(&messages(&p["messages"]), true, offered)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            // gpt-oss's template writes today's date (`strftime_now`): the expectation holds
            // the day the script ran, so both sides' dates are compared as a date's shape.
            let (got, want) = (undated(&got, name), undated(want, name));
            if got != want {
                let at = got
                    .char_indices()
                    .zip(want.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(got.len().min(want.len()), |((i, _), _)| i);
                let lo = at.saturating_sub(80);
                panic!(
                    "{name}: differs at byte {at}:\n got  {:?}\n want {:?}",
                    &got[got.floor_char_boundary(lo)
                        ..got.floor_char_boundary((at + 120).min(got.len()))],
                    &want[want.floor_char_boundary(lo)
                        ..want.floor_char_boundary((at + 120).min(want.len()))]
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 29, "{checked} renderings compared");
}

/// The calls of `text` in `syntax`, `text` pushed in pieces cut at `cuts`.
fn parse(
    syntax: ToolSyntax,
    types: &ParamTypes,
    text: &str,
    cuts: &[usize],
) -> Vec<(String, Value)> {
    let mut p = ToolCallParser::new(syntax, types.clone());
    let mut events = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        events.extend(p.push(&text[at..c]));
        at = c;
    }
    events.extend(p.finish(false));
    events
        .into_iter()
        .filter_map(|e| match e {
            ToolEvent::Call(c) => Some((c.name, serde_json::from_str(&c.arguments).unwrap())),
            _ => None,
        })
        .collect()
}

#[test]
fn calls_as_the_templates_write_them_parse_back() {
    let (v, dir) = expected();
    let types = ParamTypes::from_tools(v["tools"].as_array().unwrap());
    let want: Vec<(String, Value)> = v["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["arguments"].clone(),
            )
        })
        .collect();
    let mut checked = 0;
    for (name, t) in v["templates"].as_object().unwrap() {
        let Some(text) = t["call_text"].as_str() else {
            continue;
        };
        let syntax = ToolSyntax::detect(&template(t, &dir).source);
        if syntax == ToolSyntax::Harmony {
            // Token-level (coli_engine::harmony): checked there on this same text.
            continue;
        }
        assert_eq!(
            parse(syntax, &types, text, &[]),
            want,
            "{name} ({})",
            syntax.name()
        );
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        for &c in &bounds {
            assert_eq!(parse(syntax, &types, text, &[c]), want, "{name} cut at {c}");
        }
        assert_eq!(
            parse(syntax, &types, text, &bounds),
            want,
            "{name} char by char"
        );
        checked += 1;
    }
    assert!(checked >= 9, "{checked} templates");
}

#[test]
fn forced_call_grammars_accept_what_the_templates_write() {
    let (v, dir) = expected();
    let specs: Vec<ToolSpec> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(ToolSpec::from_tool)
        .collect();
    let g = Grammars::bytewise();
    let none = |_: &str| None;
    for (name, t) in v["templates"].as_object().unwrap() {
        let Some(text) = t["call_text"].as_str() else {
            continue;
        };
        let syntax = ToolSyntax::detect(&template(t, &dir).source);
        let (open, close) = (syntax.open(), syntax.close());
        // A harmony call starts right after the generation prompt (` to=functions.NAME`).
        let start = match syntax {
            ToolSyntax::Harmony => 0,
            _ => text
                .find(&open)
                .unwrap_or_else(|| panic!("{name}: no {open}")),
        };
        let end = text.rfind(&close).unwrap() + close.len();
        let block = &text[start..end];
        let lark = tool_call_grammar(syntax, &specs, true, &none, None).unwrap();
        let mut c = g
            .compile(&lark)
            .unwrap_or_else(|e| panic!("{name}: {e}\n{lark}"));
        let took = c.allowed_prefix(block.as_bytes());
        assert!(
            took == block.len() && c.accepts_bytes(b""),
            "{name}: the grammar refuses {:?} after {:?}\n{lark}",
            &block[took..],
            &block[..took]
        );
        // One call only: the template's two calls are refused (gpt-oss's template writes one).
        let one = tool_call_grammar(syntax, &specs, false, &none, None).unwrap();
        let mut c = g.compile(&one).unwrap();
        assert!(
            syntax == ToolSyntax::Harmony || !c.accepts_bytes(block.as_bytes()),
            "{name}: one call accepted two"
        );
        // A call of another tool than the one named is refused.
        let only = tool_call_grammar(syntax, &specs[1..], true, &none, None).unwrap();
        let mut c = g.compile(&only).unwrap();
        assert!(
            !c.accepts_bytes(block.as_bytes()),
            "{name}: a call of an unnamed tool"
        );
    }
}

/// The syntax of a case in parse_expected.json.
fn syntax_named(name: &str) -> ToolSyntax {
    match name {
        "hermes" => ToolSyntax::Hermes,
        "qwen-xml" => ToolSyntax::QwenXml,
        "glm" | "glm-4.7" => ToolSyntax::Glm,
        "deepseek-v3.1" => ToolSyntax::DeepSeek,
        "dsml" => ToolSyntax::Dsml,
        "dsml-v4" => ToolSyntax::DsmlV4,
        "kimi-k2" => ToolSyntax::Kimi,
        "minimax-m2" => ToolSyntax::MiniMax,
        other => panic!("unknown syntax {other}"),
    }
}

/// coli's parser against an independent one: SGLang 0.5.23's function-call detectors, run once
/// on the same model outputs (tests/fixtures/make_tool_parse_expected.py): the same calls (names
/// and arguments, values typed alike) and the same text outside them (whitespace at its ends
/// aside), every way the text is cut into streamed pieces.
#[test]
fn calls_parse_as_sglang_parses_them() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/chat_templates");
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("parse_expected.json")).unwrap())
            .unwrap();
    let types = ParamTypes::from_tools(v["tools"].as_array().unwrap());
    let cases = v["cases"].as_array().unwrap();
    assert!(cases.len() >= 17);
    for c in cases {
        let syntax = syntax_named(c["syntax"].as_str().unwrap());
        let text = c["text"].as_str().unwrap();
        let want: Vec<(String, Value)> = c["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["name"].as_str().unwrap().to_string(),
                    k["arguments"].clone(),
                )
            })
            .collect();
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
        for cuts in std::iter::once(&[][..]).chain(bounds.chunks(1)) {
            assert_eq!(
                parse(syntax, &types, text, cuts),
                want,
                "{syntax:?} cut {cuts:?}: {text:?}"
            );
        }
        let mut p = ToolCallParser::new(syntax, types.clone());
        let mut rest = String::new();
        for e in p.push(text).into_iter().chain(p.finish(false)) {
            if let ToolEvent::Text(t) = e {
                rest.push_str(&t);
            }
        }
        assert_eq!(
            rest.trim(),
            c["normal_text"].as_str().unwrap().trim(),
            "{syntax:?}: {text:?}"
        );
    }
}

/// `text` with the date after each `Current date: ` replaced by `YYYY-MM-DD`, after checking it
/// is one (ten characters `dddd-dd-dd`).
fn undated(text: &str, name: &str) -> String {
    const KEY: &str = "Current date: ";
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(KEY) {
        let (head, tail) = rest.split_at(i + KEY.len());
        let date = tail.get(..10).unwrap_or(tail);
        let shape = date.len() == 10
            && date.char_indices().all(|(j, c)| {
                if j == 4 || j == 7 {
                    c == '-'
                } else {
                    c.is_ascii_digit()
                }
            });
        assert!(shape, "{name}: {KEY}{date:?} is not a date");
        out.push_str(head);
        out.push_str("YYYY-MM-DD");
        rest = &tail[10..];
    }
    out.push_str(rest);
    out
}
