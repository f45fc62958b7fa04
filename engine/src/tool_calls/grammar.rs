//! Grammars (llguidance's Lark dialect) that force a reply to be tool calls in a family's
//! syntax, or JSON that follows a schema. [`crate::constrain`] compiles them into token masks.
//!
//! A call's arguments follow the tool's `parameters` schema: JSON-argument syntaxes embed the
//! schema (`%json`), XML syntaxes list the schema's properties in order, required ones always,
//! optional ones maybe, each value text (schema type `string`) or JSON of the property's schema.
//! JSON is compact (llguidance's `whitespace_flexible: false`): a small model cannot wander
//! into whitespace.

use super::{ToolSyntax, DSML};
use serde_json::{json, Value as Json};

/// A Lark string literal for `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `schema` with `"additionalProperties": false` added to every object schema that lists
/// properties and says nothing about others (OpenAI's strict mode): what the model may emit
/// still validates against `schema`, without keys nobody asked for.
fn closed(schema: &Json) -> Json {
    match schema {
        Json::Object(o) => {
            let mut o: serde_json::Map<String, Json> = o
                .iter()
                .map(|(k, v)| (k.clone(), closed_child(k, v)))
                .collect();
            if o.contains_key("properties") && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Json::Bool(false));
            }
            Json::Object(o)
        }
        other => other.clone(),
    }
}

/// [`closed`] applied below keyword `k` where its value holds schemas.
fn closed_child(k: &str, v: &Json) -> Json {
    match (k, v) {
        ("properties" | "$defs" | "definitions", Json::Object(m)) => {
            Json::Object(m.iter().map(|(n, s)| (n.clone(), closed(s))).collect())
        }
        ("items" | "additionalProperties" | "not", s @ Json::Object(_)) => closed(s),
        ("anyOf" | "oneOf" | "allOf" | "prefixItems", Json::Array(a)) => {
            Json::Array(a.iter().map(closed).collect())
        }
        _ => v.clone(),
    }
}

/// `%json` of `schema` ([`closed`]) with compact separators.
fn json_rule(schema: &Json) -> String {
    let mut s = closed(schema);
    if let Some(o) = s.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    format!("%json {s}")
}

/// A grammar whose only sentences are JSON documents valid against `schema`
/// (`response_format` `json_object` is the schema `{"type": "object"}`).
pub fn json_grammar(schema: &Json) -> String {
    format!("start: {}\n", json_rule(schema))
}

/// One tool for a grammar: its name and `parameters` schema.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    /// Function name.
    pub name: String,
    /// The JSON schema of its arguments (an object schema; `{}` when absent).
    pub parameters: Json,
}

impl ToolSpec {
    /// From an OpenAI-shaped tool (`{"type": "function", "function": {..}}`) or a bare function.
    pub fn from_tool(t: &Json) -> Option<ToolSpec> {
        let f = t.get("function").unwrap_or(t);
        Some(ToolSpec {
            name: f.get("name")?.as_str()?.to_string(),
            parameters: f
                .get("parameters")
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"})),
        })
    }

    /// The arguments schema as an object schema (a schema without a type gets `object`).
    fn object_schema(&self) -> Json {
        let mut p = self.parameters.clone();
        if let Some(o) = p.as_object_mut() {
            o.entry("type").or_insert(json!("object"));
        }
        p
    }

    /// `(name, schema, required)` of each property, in the schema's order.
    fn properties(&self) -> Vec<(String, Json, bool)> {
        let req: Vec<&str> = self
            .parameters
            .get("required")
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        self.parameters
            .get("properties")
            .and_then(Json::as_object)
            .map(|p| {
                p.iter()
                    .map(|(k, v)| (k.clone(), v.clone(), req.contains(&k.as_str())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How a marker appears in a grammar: `special(marker)` gives the id of a marker the tokenizer
/// holds as one special token (matched as that token, `<[id]>`); others are text.
fn marker(m: &str, special: &dyn Fn(&str) -> Option<u32>) -> String {
    match special(m) {
        Some(id) => format!("<[{id}]>"),
        None => lit(m),
    }
}

/// Whether an XML value of a property of `schema` is free text (a string without `enum`).
fn is_text(schema: &Json) -> bool {
    schema.get("type").and_then(Json::as_str) == Some("string") && schema.get("enum").is_none()
}

/// An XML value of a property and the marker `end` that closes it: free text up to the first
/// `end` (the lazy rule `xml_text`, which takes `end` itself) for a string, JSON then `end`
/// otherwise.
fn xml_value_rule(schema: &Json, end: &str) -> String {
    if is_text(schema) {
        "xml_text".into()
    } else {
        format!("{} {}", json_rule(schema), lit(end))
    }
}

/// A grammar for one or more calls (`parallel`) of `tools` in `syntax`, nothing else.
///
/// # Errors
/// No tools to call.
pub fn tool_call_grammar(
    syntax: ToolSyntax,
    tools: &[ToolSpec],
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<String, String> {
    if tools.is_empty() {
        return Err("no tool to call".into());
    }
    let mk = |m: &str| marker(m, special);
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let call = format!("call{i}");
        alts.push(call.clone());
        let args = |item: &dyn Fn(&str, &Json) -> String| -> String {
            let parts: Vec<String> = t
                .properties()
                .iter()
                .map(|(k, s, req)| {
                    let one = item(k, s);
                    if *req {
                        format!("({one})")
                    } else {
                        format!("({one})?")
                    }
                })
                .collect();
            if parts.is_empty() {
                "\"\"".into()
            } else {
                parts.join(" ")
            }
        };
        let body = match syntax {
            ToolSyntax::Hermes => {
                let schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.object_schema()},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                format!(
                    "{} \"\\n\" {} \"\\n\" {}",
                    mk("<tool_call>"),
                    json_rule(&schema),
                    mk("</tool_call>")
                )
            }
            ToolSyntax::DeepSeek => format!(
                "{} {} {} {} {}",
                mk("<｜tool▁call▁begin｜>"),
                lit(&t.name),
                mk("<｜tool▁sep｜>"),
                json_rule(&t.object_schema()),
                mk("<｜tool▁call▁end｜>")
            ),
            ToolSyntax::Kimi => format!(
                "{} {} /[0-9]/ {} {} {}",
                mk("<|tool_call_begin|>"),
                lit(&format!("functions.{}:", t.name)),
                mk("<|tool_call_argument_begin|>"),
                json_rule(&t.object_schema()),
                mk("<|tool_call_end|>")
            ),
            ToolSyntax::Glm => {
                // GLM-4.5/4.6 put each tag on its own line, GLM-4.7 and GLM-5 do not.
                let a = args(&|k, s| {
                    format!(
                        "\"\\n\"? {} {} {} \"\\n\"? {} {}",
                        mk("<arg_key>"),
                        lit(k),
                        mk("</arg_key>"),
                        mk("<arg_value>"),
                        xml_value_rule(s, "</arg_value>"),
                    )
                });
                format!(
                    "{} {} {a} \"\\n\"? {}",
                    mk("<tool_call>"),
                    lit(&t.name),
                    mk("</tool_call>")
                )
            }
            ToolSyntax::QwenXml => {
                let a = args(&|k, s| {
                    format!(
                        "{} \"\\n\" {} \"\\n\"",
                        lit(&format!("<parameter={k}>")),
                        xml_value_rule(s, "\n</parameter>")
                    )
                });
                format!(
                    "{} {} {a} \"</function>\\n\" {}",
                    mk("<tool_call>"),
                    lit(&format!("\n<function={}>\n", t.name)),
                    mk("</tool_call>")
                )
            }
            // The model's order (channel, then recipient) or the template's (recipient first),
            // after the generation prompt's `<|start|>assistant`.
            ToolSyntax::Harmony => {
                let json = json_rule(&t.object_schema());
                format!(
                    "({ch} {} \" \"? ({c})? \"json\" {m} {json} {call}) | ({} {ch} \"commentary \" ({c})? \"json\" {m} {json} {call})",
                    lit(&format!("commentary to=functions.{}", t.name)),
                    lit(&format!(" to=functions.{}", t.name)),
                    ch = mk("<|channel|>"),
                    c = mk("<|constrain|>"),
                    m = mk("<|message|>"),
                    call = mk("<|call|>"),
                )
            }
            ToolSyntax::MiniMax | ToolSyntax::Dsml | ToolSyntax::DsmlV4 => {
                let dsml = syntax != ToolSyntax::MiniMax;
                let p = if dsml { DSML } else { "" };
                let a = args(&|k, s| {
                    let string = is_text(s);
                    let attr = match (dsml, string) {
                        (true, true) => " string=\"true\"",
                        (true, false) => " string=\"false\"",
                        _ => "",
                    };
                    format!(
                        "{} {} \"\\n\"",
                        lit(&format!("<{p}parameter name=\"{k}\"{attr}>")),
                        xml_value_rule(s, &format!("</{p}parameter>")),
                    )
                });
                format!(
                    "{} {a} {}",
                    lit(&format!("<{p}invoke name=\"{}\">\n", t.name)),
                    lit(&format!("</{p}invoke>\n"))
                )
            }
        };
        rules.push(format!("{call}: {body}"));
    }
    let one = alts.join(" | ");
    let calls = if parallel { "call+" } else { "call" };
    let start = match syntax {
        // One block per call.
        ToolSyntax::Hermes | ToolSyntax::Glm | ToolSyntax::QwenXml => {
            if parallel {
                "start: call (\"\\n\"? call)*".to_string()
            } else {
                "start: call".to_string()
            }
        }
        // One call per reply: generation ends at `<|call|>`.
        ToolSyntax::Harmony => "start: call".to_string(),
        ToolSyntax::DeepSeek | ToolSyntax::Kimi => format!(
            "start: {} {calls} {}",
            mk(&syntax.open()),
            mk(&syntax.close())
        ),
        ToolSyntax::MiniMax | ToolSyntax::Dsml | ToolSyntax::DsmlV4 => format!(
            "start: {} \"\\n\" {calls} {}",
            mk(&syntax.open()),
            mk(&syntax.close())
        ),
    };
    let mut g = format!("{start}\ncall: {one}\n");
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    // A text value: anything up to the first marker that ends it (it may hold `<`); a lazy
    // rule, so the value ends where the marker first appears.
    let end = match syntax {
        ToolSyntax::Glm => "</arg_value>".to_string(),
        ToolSyntax::QwenXml => "\n</parameter>".to_string(),
        ToolSyntax::MiniMax => "</parameter>".to_string(),
        ToolSyntax::Dsml | ToolSyntax::DsmlV4 => format!("</{DSML}parameter>"),
        ToolSyntax::Hermes | ToolSyntax::DeepSeek | ToolSyntax::Kimi | ToolSyntax::Harmony => {
            return Ok(g)
        }
    };
    g.push_str(&format!("xml_text[suffix={}]: /(?s:.*)/\n", lit(&end)));
    Ok(g)
}
