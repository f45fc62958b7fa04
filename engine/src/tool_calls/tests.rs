use super::*;
use serde_json::json;

fn tools() -> Vec<Json> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}),
    ]
}

/// Every way of cutting `text` into two pushes, and one push per character, give the same
/// events (merged) as one push.
fn events(syntax: ToolSyntax, text: &str) -> Vec<ToolEvent> {
    let run = |pieces: &[&str]| {
        let mut p = ToolCallParser::new(syntax, ParamTypes::from_tools(&tools()));
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(p.push(piece));
        }
        out.extend(p.finish());
        merge(out)
    };
    let whole = run(&[text]);
    for (i, _) in text.char_indices() {
        assert_eq!(
            run(&[&text[..i], &text[i..]]),
            whole,
            "split at {i}: {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(run(&refs), whole);
    whole
}

fn merge(ev: Vec<ToolEvent>) -> Vec<ToolEvent> {
    let mut out: Vec<ToolEvent> = Vec::new();
    for e in ev {
        match (out.last_mut(), e) {
            (Some(ToolEvent::Text(a)), ToolEvent::Text(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

fn call(name: &str, args: Json) -> ToolEvent {
    ToolEvent::Call(ParsedCall {
        name: name.into(),
        arguments: args.to_string(),
    })
}

#[test]
fn hermes_calls_and_text() {
    let t = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}\n</tool_call>";
    assert_eq!(
        events(ToolSyntax::Hermes, t),
        vec![
            ToolEvent::Text("Let me check.\n".into()),
            call("get_weather", json!({"city": "Paris", "days": 2})),
            ToolEvent::Text("\n".into()),
            call("get_weather", json!({"city": "Rome"})),
        ]
    );
}

#[test]
fn malformed_blocks_are_text() {
    for t in [
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n[1, 2]\n</tool_call>",
        "<tool_call>\n{\"name\": \"a b\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"x\", \"arguments\": [1]}",
        "a < b and <tool_ca",
    ] {
        assert_eq!(
            events(ToolSyntax::Hermes, t),
            vec![ToolEvent::Text(t.into())],
            "{t}"
        );
    }
    // A block the model did not close still counts when it parses.
    assert_eq!(
        events(
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n"
        ),
        vec![call("x", json!({}))]
    );
}

#[test]
fn glm_values_follow_the_schema() {
    let t = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>2024</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
    assert_eq!(
        events(ToolSyntax::Glm, t),
        vec![call("get_weather", json!({"city": "2024", "days": 3}))]
    );
    let t =
        "<tool_call>other\n<arg_key>q</arg_key>\n<arg_value>{\"a\": [1]}</arg_value>\n</tool_call>";
    assert_eq!(
        events(ToolSyntax::Glm, t),
        vec![call("other", json!({"q": {"a": [1]}}))]
    );
    let bad = "<tool_call>x\n<arg_key>q</arg_key>\n</tool_call>";
    assert_eq!(
        events(ToolSyntax::Glm, bad),
        vec![ToolEvent::Text(bad.into())]
    );
}

#[test]
fn qwen_xml() {
    let t = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        events(ToolSyntax::QwenXml, t),
        vec![call("get_weather", json!({"city": "New York", "days": 5}))]
    );
}

#[test]
fn token_syntaxes() {
    let t = "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    assert_eq!(
        events(ToolSyntax::DeepSeek, t),
        vec![
            ToolEvent::Text("ok".into()),
            call("get_weather", json!({"city": "Oslo"})),
            call("f", json!({}))
        ]
    );
    let t = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Lima\"}<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(
        events(ToolSyntax::Kimi, t),
        vec![call("get_weather", json!({"city": "Lima"}))]
    );
    let bad = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{oops<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(
        events(ToolSyntax::Kimi, bad),
        vec![ToolEvent::Text(bad.into())]
    );
}

#[test]
fn invoke_syntaxes() {
    let t = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Kyiv</parameter>\n<parameter name=\"days\">1</parameter>\n</invoke>\n</minimax:tool_call>";
    assert_eq!(
        events(ToolSyntax::MiniMax, t),
        vec![call("get_weather", json!({"city": "Kyiv", "days": 1}))]
    );
    let t = "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">12</｜DSML｜parameter>\n<｜DSML｜parameter name=\"b\" string=\"false\">[1,2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    assert_eq!(
        events(ToolSyntax::Dsml, t),
        vec![call("f", json!({"a": "12", "b": [1, 2]}))]
    );
}

#[test]
fn detection_from_the_published_templates() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat_templates");
    for (file, syntax) in [
        ("qwen3.jinja", ToolSyntax::Hermes),
        ("glm-4.6.jinja", ToolSyntax::Glm),
        ("deepseek-v3.1.jinja", ToolSyntax::DeepSeek),
        ("deepseek-v3.2.jinja", ToolSyntax::Dsml),
        ("kimi-k2.jinja", ToolSyntax::Kimi),
        ("minimax-m2.jinja", ToolSyntax::MiniMax),
    ] {
        let src = std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(ToolSyntax::detect(&src), syntax, "{file}");
    }
}
