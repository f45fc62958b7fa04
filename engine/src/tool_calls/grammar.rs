//! Grammars (llguidance's Lark dialect) that force a reply to be tool calls in a family's
//! syntax, or JSON that follows a schema. [`crate::constrain`] compiles them into token masks.
//!
//! A call's arguments follow the tool's `parameters` schema: JSON-argument syntaxes embed the
//! schema (`%json`), XML syntaxes list the schema's properties in order, required ones always,
//! optional ones maybe. An XML value of a `string` property is raw text (as the templates write
//! it and the parser reads it back): one of its `enum` or its `const` as literals, its
//! `pattern` as a regular expression, else any text of its `minLength`..`maxLength` that ends at
//! the first marker closing the value and holds none of the markers closing the call; other
//! values are JSON of the property's schema. Schemas embedded below their root keep their
//! references: the root's `$defs` / `definitions` and the root itself travel with them
//! (`standalone`). JSON is compact (llguidance's `whitespace_flexible: false`): a small model
//! cannot wander into whitespace.

use super::{ToolSyntax, DSML};
use serde_json::{json, Map, Value as Json};

/// A Lark string literal for `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `s` as a Lark regular expression matching it literally.
fn regex_lit(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/-".contains(c) {
            out.push('\\');
            out.push(c);
        } else if c == '\n' {
            out.push_str("\\n");
        } else {
            out.push(c);
        }
    }
    out
}

/// `schema` with `"additionalProperties": false` added to every object schema that lists its
/// properties, requires only those, says nothing about others and is not composed (`allOf`,
/// `anyOf`, `oneOf`, `$ref` beside it, or inside an `allOf`, where closing one part would refuse
/// the other parts' properties): OpenAI's strict mode. What the model may emit still validates
/// against `schema`, without keys nobody asked for.
fn closed(schema: &Json) -> Json {
    let Json::Object(o) = schema else {
        return schema.clone();
    };
    let mut o: Map<String, Json> = o
        .iter()
        .map(|(k, v)| (k.clone(), closed_child(k, v)))
        .collect();
    let composed = ["allOf", "anyOf", "oneOf", "$ref"]
        .iter()
        .any(|k| o.contains_key(*k));
    let listed = o.get("properties").and_then(Json::as_object);
    let required_listed = listed.is_some_and(|p| {
        o.get("required")
            .and_then(Json::as_array)
            .is_none_or(|r| r.iter().filter_map(Json::as_str).all(|n| p.contains_key(n)))
    });
    if listed.is_some() && required_listed && !composed && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Json::Bool(false));
    }
    Json::Object(o)
}

/// [`closed`] applied below keyword `k` where its value holds schemas (`allOf` parts are left
/// open).
fn closed_child(k: &str, v: &Json) -> Json {
    match (k, v) {
        ("properties" | "$defs" | "definitions", Json::Object(m)) => {
            Json::Object(m.iter().map(|(n, s)| (n.clone(), closed(s))).collect())
        }
        ("items" | "additionalProperties" | "not", s @ Json::Object(_)) => closed(s),
        ("anyOf" | "oneOf" | "prefixItems", Json::Array(a)) => {
            Json::Array(a.iter().map(closed).collect())
        }
        _ => v.clone(),
    }
}

/// The name under which [`standalone`] keeps the root schema.
const ROOT_DEF: &str = "coli_root";

/// `v` with its local references re-pointed for a schema whose `$defs` hold the root's
/// definitions and the root itself ([`ROOT_DEF`]): `#/$defs/..` stays, `#/definitions/X..`
/// becomes `#/$defs/X..`, `#` and any other `#/..` point into the root.
fn repoint(v: &Json) -> Json {
    match v {
        Json::Object(o) => Json::Object(
            o.iter()
                .map(|(k, x)| {
                    let x = match (k.as_str(), x) {
                        ("$ref", Json::String(r)) if r.starts_with('#') => {
                            let rest = &r[1..];
                            Json::String(if rest.starts_with("/$defs/") {
                                r.clone()
                            } else if let Some(d) = rest.strip_prefix("/definitions/") {
                                format!("#/$defs/{d}")
                            } else {
                                format!("#/$defs/{ROOT_DEF}{rest}")
                            })
                        }
                        _ => repoint(x),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Json::Array(a) => Json::Array(a.iter().map(repoint).collect()),
        other => other.clone(),
    }
}

/// `sub`, a schema found inside `root`, made self-contained: its references re-pointed
/// ([`repoint`]) and the definitions they need returned beside it (`$defs` for the schema that
/// will hold it at its root): the root's `$defs` and `definitions`, and the root itself when
/// something points into it.
fn standalone(sub: &Json, root: &Json) -> (Json, Map<String, Json>) {
    let mut defs = Map::new();
    for key in ["$defs", "definitions"] {
        if let Some(d) = root.get(key).and_then(Json::as_object) {
            for (k, v) in d {
                defs.insert(k.clone(), repoint(v));
            }
        }
    }
    let mut body = repoint(sub);
    if let Some(o) = body.as_object_mut() {
        o.remove("$defs");
        o.remove("definitions");
    }
    let text = format!("{body}{}", Json::Object(defs.clone()));
    if text.contains(&format!("#/$defs/{ROOT_DEF}")) {
        let mut r = repoint(root);
        if let Some(o) = r.as_object_mut() {
            o.remove("$defs");
            o.remove("definitions");
        }
        defs.insert(ROOT_DEF.into(), r);
    }
    (body, defs)
}

/// `%json` of `schema` ([`closed`]) with compact separators; `defs` go in its `$defs`.
fn json_rule_with(schema: &Json, defs: Map<String, Json>) -> String {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        if !defs.is_empty() {
            let mut all = o
                .get("$defs")
                .and_then(Json::as_object)
                .cloned()
                .unwrap_or_default();
            all.extend(defs);
            o.insert("$defs".into(), Json::Object(all));
        }
    }
    let mut s = closed(&s);
    if let Some(o) = s.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    format!("%json {s}")
}

/// `%json` of a root schema.
fn json_rule(schema: &Json) -> String {
    json_rule_with(schema, Map::new())
}

/// `%json` of `sub`, a schema inside `root` ([`standalone`]).
fn json_rule_in(sub: &Json, root: &Json) -> String {
    let (body, defs) = standalone(sub, root);
    json_rule_with(&body, defs)
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

/// Whether an XML value of a property of `schema` is raw text: its type is `string` (the parser
/// keeps such values as text).
fn is_text(schema: &Json) -> bool {
    match schema.get("type") {
        Some(Json::String(t)) => t == "string",
        Some(Json::Array(a)) => a == &[json!("string")],
        _ => false,
    }
}

/// The XML value rules of one grammar: the lazy free-text rules they need, by length bounds.
struct XmlValues {
    /// The marker that closes a value.
    end: String,
    /// Markers a value may not hold (they close the call around it).
    outer: Vec<String>,
    /// `(rule name, body)` of the free-text rules made so far.
    rules: Vec<(String, String)>,
}

impl XmlValues {
    fn new(syntax: ToolSyntax) -> XmlValues {
        let (end, outer): (String, Vec<String>) = match syntax {
            ToolSyntax::Glm => (
                "</arg_value>".into(),
                vec!["</tool_call>".into(), "<arg_key>".into()],
            ),
            ToolSyntax::QwenXml => (
                "\n</parameter>".into(),
                vec!["</function>".into(), "</tool_call>".into()],
            ),
            ToolSyntax::MiniMax => (
                "</parameter>".into(),
                vec!["</invoke>".into(), "</minimax:tool_call>".into()],
            ),
            ToolSyntax::Dsml | ToolSyntax::DsmlV4 => (
                format!("</{DSML}parameter>"),
                vec![format!("</{DSML}invoke>"), syntax.close()],
            ),
            _ => (String::new(), Vec::new()),
        };
        XmlValues {
            end,
            outer,
            rules: Vec::new(),
        }
    }

    /// A value of a property of `schema` (inside the tool parameters `root`) and the marker
    /// that closes it.
    fn value(&mut self, schema: &Json, root: &Json) -> String {
        let end = lit(&self.end);
        if !is_text(schema) {
            return format!("{} {end}", json_rule_in(schema, root));
        }
        if let Some(Json::Array(options)) = schema.get("enum") {
            let alts: Vec<String> = options.iter().filter_map(Json::as_str).map(lit).collect();
            if !alts.is_empty() {
                return format!("({}) {end}", alts.join(" | "));
            }
        }
        if let Some(Json::String(c)) = schema.get("const") {
            return format!("{} {end}", lit(c));
        }
        if let Some(Json::String(p)) = schema.get("pattern") {
            let p = p.strip_prefix('^').unwrap_or(p);
            let p = p.strip_suffix('$').unwrap_or(p);
            return format!("/{}/ {end}", p.replace('/', "\\/"));
        }
        let min = schema.get("minLength").and_then(Json::as_u64).unwrap_or(0);
        let max = schema.get("maxLength").and_then(Json::as_u64);
        let name = format!("xml_text{}", self.rules.len());
        let len = match max {
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        let forbid: Vec<String> = self.outer.iter().map(|m| regex_lit(m)).collect();
        let body = if forbid.is_empty() {
            format!("/(?s:.{len})/")
        } else {
            format!("/(?s:.{len})/ & ~/(?s:.*)({})(?s:.*)/", forbid.join("|"))
        };
        self.rules.push((name.clone(), body));
        name
    }

    /// The rules made, as Lark lines: each lazy, ending at the first closing marker.
    fn lark(&self) -> String {
        self.rules
            .iter()
            .map(|(n, b)| {
                let upper = n.to_uppercase();
                format!("{n}[suffix={}]: {upper}\n{upper}: {b}\n", lit(&self.end))
            })
            .collect()
    }
}

/// A grammar for one or more calls (`parallel`) of `tools` in `syntax`, nothing else; with
/// `or_json`, a reply may instead be JSON of that schema (`response_format` beside tools the
/// model may call or not).
///
/// # Errors
/// No tools to call.
pub fn tool_call_grammar(
    syntax: ToolSyntax,
    tools: &[ToolSpec],
    parallel: bool,
    special: &dyn Fn(&str) -> Option<u32>,
    or_json: Option<&Json>,
) -> Result<String, String> {
    if tools.is_empty() {
        return Err("no tool to call".into());
    }
    let mk = |m: &str| marker(m, special);
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    let mut xml = XmlValues::new(syntax);
    for (i, t) in tools.iter().enumerate() {
        let call = format!("call{i}");
        alts.push(call.clone());
        let root = t.object_schema();
        let mut args = |item: &dyn Fn(&str, String) -> String| -> String {
            let parts: Vec<String> = t
                .properties()
                .iter()
                .map(|(k, s, req)| {
                    let one = item(k, xml.value(s, &root));
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
                let (arguments, defs) = standalone(&root, &root);
                let mut schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": arguments},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                });
                if !defs.is_empty() {
                    schema["$defs"] = Json::Object(defs);
                }
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
                json_rule(&root),
                mk("<｜tool▁call▁end｜>")
            ),
            ToolSyntax::Kimi => format!(
                "{} {} /[0-9]/ {} {} {}",
                mk("<|tool_call_begin|>"),
                lit(&format!("functions.{}:", t.name)),
                mk("<|tool_call_argument_begin|>"),
                json_rule(&root),
                mk("<|tool_call_end|>")
            ),
            ToolSyntax::Glm => {
                // GLM-4.5/4.6 put each tag on its own line, GLM-4.7 and GLM-5 do not.
                let a = args(&|k, v| {
                    format!(
                        "\"\\n\"? {} {} {} \"\\n\"? {} {v}",
                        mk("<arg_key>"),
                        lit(k),
                        mk("</arg_key>"),
                        mk("<arg_value>"),
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
                let a = args(&|k, v| {
                    format!("{} \"\\n\" {v} \"\\n\"", lit(&format!("<parameter={k}>")))
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
                let json = json_rule(&root);
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
                let props: Vec<(String, Json, bool)> = t.properties();
                let a = args(&|k, v| {
                    let string = props
                        .iter()
                        .find(|(n, _, _)| n == k)
                        .is_some_and(|(_, s, _)| is_text(s));
                    let attr = match (dsml, string) {
                        (true, true) => " string=\"true\"",
                        (true, false) => " string=\"false\"",
                        _ => "",
                    };
                    format!(
                        "{} {v} \"\\n\"",
                        lit(&format!("<{p}parameter name=\"{k}\"{attr}>")),
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
                "call (\"\\n\"? call)*".to_string()
            } else {
                "call".to_string()
            }
        }
        // One call per reply: generation ends at `<|call|>`.
        ToolSyntax::Harmony => "call".to_string(),
        ToolSyntax::DeepSeek | ToolSyntax::Kimi => {
            format!("{} {calls} {}", mk(&syntax.open()), mk(&syntax.close()))
        }
        ToolSyntax::MiniMax | ToolSyntax::Dsml | ToolSyntax::DsmlV4 => format!(
            "{} \"\\n\" {calls} {}",
            mk(&syntax.open()),
            mk(&syntax.close())
        ),
    };
    let start = match or_json {
        Some(schema) => format!("start: ({start}) | {}", json_rule(schema)),
        None => format!("start: {start}"),
    };
    let mut g = format!("{start}\ncall: {one}\n");
    for r in rules {
        g.push_str(&r);
        g.push('\n');
    }
    g.push_str(&xml.lark());
    Ok(g)
}
