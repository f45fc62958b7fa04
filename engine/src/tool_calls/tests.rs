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
        out.extend(p.finish(false));
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
            ToolEvent::Text("Let me check.".into()),
            call("get_weather", json!({"city": "Paris", "days": 2})),
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
    // A reply cut short inside a block: the markup is dropped, not shown as text.
    let mut p = ToolCallParser::new(ToolSyntax::Hermes, ParamTypes::default());
    let mut ev = p.push("Hi <tool_call>\n{\"name\": \"x\", \"argu");
    ev.extend(p.finish(true));
    assert_eq!(merge(ev), vec![ToolEvent::Text("Hi ".into())]);
    // Whitespace alone is text only when no call comes.
    assert_eq!(
        events(ToolSyntax::Hermes, " \n "),
        vec![ToolEvent::Text(" \n ".into())]
    );
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

mod grammars {
    use super::super::grammar::{json_grammar, tool_call_grammar, ToolSpec};
    use super::super::ToolSyntax;
    use crate::constrain::Grammars;
    use serde_json::{json, Value as Json};

    fn spec(name: &str, parameters: Json) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            parameters,
        }
    }

    /// Whether the grammar of `tools` in `syntax` (`or_json` beside) accepts `text`.
    fn accepts(syntax: ToolSyntax, tools: &[ToolSpec], or_json: Option<&Json>, text: &str) -> bool {
        let none = |_: &str| None;
        let lark = tool_call_grammar(syntax, tools, true, &none, or_json).unwrap();
        let g = Grammars::bytewise();
        let mut c = g.compile(&lark).unwrap_or_else(|e| panic!("{e}\n{lark}"));
        c.accepts_bytes(text.as_bytes())
    }

    fn weather() -> ToolSpec {
        spec(
            "w",
            json!({"type": "object", "properties": {
                "unit": {"type": "string", "enum": ["c", "f"]},
                "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "city": {"type": "string", "maxLength": 8}},
                "required": ["unit", "code"]}),
        )
    }

    #[test]
    fn xml_string_values_are_raw_text_within_their_schema() {
        let glm = |unit: &str, code: &str, city: &str| {
            let city = if city.is_empty() {
                String::new()
            } else {
                format!("<arg_key>city</arg_key><arg_value>{city}</arg_value>")
            };
            format!("<tool_call>w<arg_key>unit</arg_key><arg_value>{unit}</arg_value><arg_key>code</arg_key><arg_value>{code}</arg_value>{city}</tool_call>")
        };
        let t = [weather()];
        assert!(accepts(ToolSyntax::Glm, &t, None, &glm("c", "ABC", "")));
        assert!(accepts(
            ToolSyntax::Glm,
            &t,
            None,
            &glm("f", "XYZ", "a <b> c")
        ));
        assert!(
            !accepts(ToolSyntax::Glm, &t, None, &glm("\"c\"", "ABC", "")),
            "an enum value is raw, not JSON"
        );
        assert!(
            !accepts(ToolSyntax::Glm, &t, None, &glm("x", "ABC", "")),
            "outside the enum"
        );
        assert!(
            !accepts(ToolSyntax::Glm, &t, None, &glm("c", "Paris", "")),
            "against the pattern"
        );
        assert!(
            !accepts(ToolSyntax::Glm, &t, None, &glm("c", "ABC", "Amsterdam")),
            "over maxLength"
        );
        // A text value cannot hold the markers that close the call around it.
        let qwen = |city: &str| {
            format!("<tool_call>\n<function=w>\n<parameter=unit>\nc\n</parameter>\n<parameter=code>\nABC\n</parameter>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>")
        };
        assert!(accepts(ToolSyntax::QwenXml, &t, None, &qwen("Rome")));
        assert!(!accepts(
            ToolSyntax::QwenXml,
            &t,
            None,
            &qwen("R</tool_call>")
        ));
        assert!(!accepts(
            ToolSyntax::QwenXml,
            &t,
            None,
            &qwen("Ro</function>")
        ));
    }

    #[test]
    fn references_survive_embedding() {
        let loc = spec(
            "f",
            json!({"type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"},
                "old": {"$ref": "#/definitions/Old"}, "same": {"$ref": "#/properties/loc"}},
                "required": ["loc"],
                "$defs": {"Loc": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
                "definitions": {"Old": {"type": "integer"}}}),
        );
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"loc\": {\"lat\": 1.5}, \"old\": 3, \"same\": {\"lat\": 2}}}\n</tool_call>";
        assert!(accepts(
            ToolSyntax::Hermes,
            std::slice::from_ref(&loc),
            None,
            call
        ));
        assert!(!accepts(
            ToolSyntax::Hermes,
            std::slice::from_ref(&loc),
            None,
            &call.replace("1.5", "\"x\"")
        ));
        let glm =
            "<tool_call>f<arg_key>loc</arg_key><arg_value>{\"lat\": 1}</arg_value></tool_call>";
        assert!(accepts(
            ToolSyntax::Glm,
            std::slice::from_ref(&loc),
            None,
            glm
        ));
        // `#` is the arguments' schema, not the wrapper's.
        let rec = spec(
            "r",
            json!({"type": "object", "properties": {"c": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["c"]}),
        );
        let ok =
            "<tool_call>\n{\"name\": \"r\", \"arguments\": {\"c\": {\"c\": null}}}\n</tool_call>";
        assert!(accepts(
            ToolSyntax::Hermes,
            std::slice::from_ref(&rec),
            None,
            ok
        ));
        let wrapper = "<tool_call>\n{\"name\": \"r\", \"arguments\": {\"c\": {\"name\": \"r\", \"arguments\": {\"c\": null}}}}\n</tool_call>";
        assert!(!accepts(ToolSyntax::Hermes, &[rec], None, wrapper));
    }

    #[test]
    fn composed_schemas_stay_satisfiable() {
        let g = Grammars::bytewise();
        for schema in [
            json!({"type": "object", "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}),
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                   "allOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}),
        ] {
            let mut c = g
                .compile(&json_grammar(&schema))
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            assert!(c.accepts_bytes(br#"{"a": 1, "b": 2}"#), "{schema}");
        }
        // Required names the properties do not list: left open.
        let schema = json!({"type": "object", "properties": {}, "required": ["zz"]});
        let mut c = g.compile(&json_grammar(&schema)).unwrap();
        assert!(c.accepts_bytes(br#"{"zz": 1}"#));
        // A plain object schema is closed: no keys beyond its properties.
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let mut c = g.compile(&json_grammar(&schema)).unwrap();
        assert!(!c.accepts_bytes(br#"{"a": 1, "b": 2}"#));
    }

    #[test]
    fn json_or_calls() {
        let t = [spec(
            "f",
            json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        )];
        let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]});
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        assert!(accepts(ToolSyntax::Hermes, &t, Some(&schema), call));
        assert!(accepts(
            ToolSyntax::Hermes,
            &t,
            Some(&schema),
            "{\"answer\": \"4\"}"
        ));
        assert!(!accepts(ToolSyntax::Hermes, &t, Some(&schema), "four"));
        assert!(!accepts(
            ToolSyntax::Hermes,
            &t,
            None,
            "{\"answer\": \"4\"}"
        ));
    }
}

/// Streamed calls (forced ones): the name as soon as it is read, the arguments piece by piece
/// before the block closes, the same calls whatever the pieces the text comes in.
#[test]
fn forced_calls_stream_their_arguments() {
    let cases = [
        (
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\\\"\", \"days\": [1, {\"a\": 2}]}}\n</tool_call>",
            vec![("get_weather", "{\"city\": \"Pa}ris\\\"\", \"days\": [1, {\"a\": 2}]}")],
        ),
        (
            ToolSyntax::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            vec![("f", "{\"a\": 1}"), ("g", "{}")],
        ),
        (
            ToolSyntax::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Lima\"}<|tool_call_end|><|tool_calls_section_end|>",
            vec![("get_weather", "{\"city\": \"Lima\"}")],
        ),
    ];
    for (syntax, text, want) in cases {
        let run = |pieces: &[&str]| {
            let mut p = ToolCallParser::new(syntax, ParamTypes::default()).streaming(true);
            let mut ev = Vec::new();
            // (events so far, bytes fed) after each piece
            let mut fed = 0;
            let mut first_args_at = None;
            for piece in pieces {
                fed += piece.len();
                for e in p.push(piece) {
                    if matches!(e, ToolEvent::CallArgs(_)) && first_args_at.is_none() {
                        first_args_at = Some(fed);
                    }
                    ev.push(e);
                }
            }
            ev.extend(p.finish(false));
            (ev, first_args_at, p.calls())
        };
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        let (ev, first_args, calls) = run(&refs);
        // Assembled from the stream: names from the starts, arguments from the pieces, equal to
        // each end's whole call.
        let mut got: Vec<(String, String)> = Vec::new();
        for e in &ev {
            match e {
                ToolEvent::CallStart { name } => got.push((name.clone(), String::new())),
                ToolEvent::CallArgs(a) => got.last_mut().unwrap().1.push_str(a),
                ToolEvent::CallEnd(c) => {
                    assert_eq!((&c.name, &c.arguments), {
                        let l = got.last().unwrap();
                        (&l.0, &l.1)
                    })
                }
                other => panic!("{syntax:?}: unexpected {other:?}"),
            }
        }
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        assert_eq!(got, want, "{syntax:?}");
        assert_eq!(calls, want.len());
        assert!(
            first_args.unwrap() < text.rfind(&syntax.close()).unwrap(),
            "{syntax:?}: arguments stream before the block closes"
        );
        // One push: the same calls.
        let (ev1, _, _) = run(&[text]);
        let ends = |ev: &[ToolEvent]| -> Vec<ParsedCall> {
            ev.iter()
                .filter_map(|e| match e {
                    ToolEvent::CallEnd(c) => Some(c.clone()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(ends(&ev1), ends(&ev));
    }
    // A streamed call cut short ends with what it has.
    let mut p = ToolCallParser::new(ToolSyntax::Hermes, ParamTypes::default()).streaming(true);
    let mut ev = p.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ");
    ev.extend(p.finish(true));
    assert_eq!(
        ev.last(),
        Some(&ToolEvent::CallEnd(ParsedCall {
            name: "f".into(),
            arguments: "{\"a\": ".into()
        }))
    );
    // Not streaming (an unforced call): whole calls only.
    let mut p = ToolCallParser::new(ToolSyntax::Kimi, ParamTypes::default());
    let ev = p.push(cases_kimi());
    assert!(ev.iter().all(|e| matches!(e, ToolEvent::Call(_))) && ev.len() == 1);
}

fn cases_kimi() -> &'static str {
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"
}
