//! Tool calls in generated text: each family's published syntax ([`ToolSyntax`], detected from
//! its chat template), a streaming parser that splits a reply into text and structured calls
//! ([`ToolCallParser`]), and the grammar that makes a model emit a call in that syntax
//! ([`grammar`], for `tool_choice` required / named).
//!
//! The syntaxes, as the families' chat templates render an assistant's calls (the committed
//! templates in `tests/fixtures/chat_templates/`):
//!
//! | syntax | families | one call |
//! |---|---|---|
//! | [`ToolSyntax::Hermes`] | Qwen3, Qwen2.5, SmolLM3, templates without a tools branch | `<tool_call>\n{"name": N, "arguments": {..}}\n</tool_call>` |
//! | [`ToolSyntax::QwenXml`] | Qwen3-Coder, Qwen3.5/3.6 | `<tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>` |
//! | [`ToolSyntax::Glm`] | GLM-4.5, 4.6, 4.7, GLM-5 | `<tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>` |
//! | [`ToolSyntax::DeepSeek`] | DeepSeek-V3.1 | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{..}<｜tool▁call▁end｜><｜tool▁calls▁end｜>` |
//! | [`ToolSyntax::Dsml`] | DeepSeek-V3.2 | `<｜DSML｜function_calls>\n<｜DSML｜invoke name="N">\n<｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>` |
//! | [`ToolSyntax::DsmlV4`] | DeepSeek-V4 | as DeepSeek-V3.2 in a `<｜DSML｜tool_calls>` block |
//! | [`ToolSyntax::Kimi`] | Kimi-K2, Kimi-Linear | `<\|tool_calls_section_begin\|><\|tool_call_begin\|>functions.N:0<\|tool_call_argument_begin\|>{..}<\|tool_call_end\|><\|tool_calls_section_end\|>` |
//! | [`ToolSyntax::MiniMax`] | MiniMax-M2 | `<minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>` |
//! | [`ToolSyntax::Harmony`] | gpt-oss | `<\|channel\|>commentary to=functions.N <\|constrain\|>json<\|message\|>{..}<\|call\|>` (a harmony message addressed to the function: [`crate::harmony`] routes it, not [`ToolCallParser`]) |
//!
//! Arguments always come out as a JSON object (text). The XML syntaxes carry each value as
//! text: a value is kept as a string when the tool's schema types the parameter `string` (or
//! DSML marks it `string="true"`), else read as JSON when it parses, else kept as a string, as
//! vLLM's parsers for these families do. A call section that does not parse is passed through
//! as text: malformed model output degrades to content, never to an error.

pub mod grammar;
mod parse;
mod stream;

pub use parse::{parse_section, ParamTypes};

use crate::text::hold_from;
use serde_json::Value as Json;

/// A family's tool-call syntax (see the module doc's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolSyntax {
    /// `<tool_call>` JSON blocks (Qwen3 and the generic fallback).
    Hermes,
    /// `<tool_call>` with `<function=N>` / `<parameter=K>` (Qwen3-Coder, Qwen3.5).
    QwenXml,
    /// `<tool_call>N` with `<arg_key>` / `<arg_value>` pairs (GLM-4.5 .. GLM-5).
    Glm,
    /// DeepSeek-V3.1's tool-call tokens with JSON arguments.
    DeepSeek,
    /// DeepSeek-V3.2's DSML invoke blocks.
    Dsml,
    /// DeepSeek-V4's DSML invoke blocks (`tool_calls` for V3.2's `function_calls`).
    DsmlV4,
    /// Kimi-K2's tool-call section tokens with JSON arguments.
    Kimi,
    /// MiniMax-M2's `<minimax:tool_call>` invoke blocks.
    MiniMax,
    /// gpt-oss's harmony messages addressed to `functions.NAME` (token-level: parsed by
    /// [`crate::harmony::HarmonyParser`]).
    Harmony,
}

/// DSML's marker infix (DeepSeek-V3.2).
const DSML: &str = "｜DSML｜";

impl ToolSyntax {
    /// The syntax a chat template renders assistant tool calls in, from the markers it writes;
    /// [`ToolSyntax::Hermes`] for a template that has none (coli then describes the tools in
    /// a system message itself, [`describe_tools`]).
    pub fn detect(template: &str) -> ToolSyntax {
        if template.contains("<|channel|>") {
            ToolSyntax::Harmony
        } else if template.contains("tool_calls_section_begin") {
            ToolSyntax::Kimi
        } else if template.contains("tool▁calls▁begin") {
            ToolSyntax::DeepSeek
        } else if template.contains("DSML") {
            if template.contains("function_calls") {
                ToolSyntax::Dsml
            } else {
                ToolSyntax::DsmlV4
            }
        } else if template.contains("minimax:tool_call") {
            ToolSyntax::MiniMax
        } else if template.contains("<arg_key>") {
            ToolSyntax::Glm
        } else if template.contains("<function=") {
            ToolSyntax::QwenXml
        } else {
            ToolSyntax::Hermes
        }
    }

    /// The text that opens a block of calls.
    pub fn open(self) -> String {
        match self {
            ToolSyntax::Hermes | ToolSyntax::QwenXml | ToolSyntax::Glm => "<tool_call>".into(),
            ToolSyntax::DeepSeek => "<｜tool▁calls▁begin｜>".into(),
            ToolSyntax::Dsml => format!("<{DSML}function_calls>"),
            ToolSyntax::DsmlV4 => format!("<{DSML}tool_calls>"),
            ToolSyntax::Kimi => "<|tool_calls_section_begin|>".into(),
            ToolSyntax::MiniMax => "<minimax:tool_call>".into(),
            ToolSyntax::Harmony => "<|channel|>".into(),
        }
    }

    /// The text that closes a block of calls.
    pub fn close(self) -> String {
        match self {
            ToolSyntax::Hermes | ToolSyntax::QwenXml | ToolSyntax::Glm => "</tool_call>".into(),
            ToolSyntax::DeepSeek => "<｜tool▁calls▁end｜>".into(),
            ToolSyntax::Dsml => format!("</{DSML}function_calls>"),
            ToolSyntax::DsmlV4 => format!("</{DSML}tool_calls>"),
            ToolSyntax::Kimi => "<|tool_calls_section_end|>".into(),
            ToolSyntax::MiniMax => "</minimax:tool_call>".into(),
            ToolSyntax::Harmony => "<|call|>".into(),
        }
    }

    /// Every marker string of the syntax: a tokenizer may hold each as one (special) token,
    /// which the reply's decoder must pass through as its text.
    pub fn markers(self) -> Vec<String> {
        let mut m = vec![self.open(), self.close()];
        match self {
            ToolSyntax::DeepSeek => m.extend(
                [
                    "<｜tool▁call▁begin｜>",
                    "<｜tool▁sep｜>",
                    "<｜tool▁call▁end｜>",
                ]
                .map(String::from),
            ),
            ToolSyntax::Kimi => m.extend(
                [
                    "<|tool_call_begin|>",
                    "<|tool_call_argument_begin|>",
                    "<|tool_call_end|>",
                ]
                .map(String::from),
            ),
            ToolSyntax::Glm => m.extend(
                ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"].map(String::from),
            ),
            _ => {}
        }
        m
    }

    /// Name used in logs and documents.
    pub fn name(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "hermes",
            ToolSyntax::QwenXml => "qwen-xml",
            ToolSyntax::Glm => "glm",
            ToolSyntax::DeepSeek => "deepseek-v3.1",
            ToolSyntax::Dsml => "dsml",
            ToolSyntax::DsmlV4 => "dsml-v4",
            ToolSyntax::Kimi => "kimi-k2",
            ToolSyntax::MiniMax => "minimax-m2",
            ToolSyntax::Harmony => "harmony",
        }
    }
}

/// One parsed tool call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object, compact text.
    pub arguments: String,
}

/// What [`ToolCallParser`] releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text of the reply (outside call blocks, or a block that did not parse).
    Text(String),
    /// A complete call, in the order of the reply.
    Call(ParsedCall),
    /// A call whose arguments stream ([`ToolCallParser::streaming`]): its name, read.
    CallStart {
        /// The function's name.
        name: String,
    },
    /// The next piece of the streaming call's arguments (JSON text).
    CallArgs(String),
    /// The streaming call is complete: its name and whole arguments.
    CallEnd(ParsedCall),
}

/// Splits a reply's text, as it streams, into text and tool calls: text outside call blocks is
/// released at once (except a tail that may begin the block's opening marker), a block is held
/// until its closing marker and released as its calls (or as text when it does not parse).
#[derive(Debug)]
pub struct ToolCallParser {
    syntax: ToolSyntax,
    open: String,
    close: String,
    types: ParamTypes,
    pending: String,
    in_block: bool,
    calls: usize,
    /// Whitespace at the end of the text so far, held back: dropped before a call, released
    /// before more text or at the end (unless a call came last): whitespace around calls is
    /// not content, whatever the pieces the text streamed in.
    ws: String,
    /// Whether the last thing released was a call.
    after_call: bool,
    /// Stream the arguments of calls in JSON-argument syntaxes ([`ToolCallParser::streaming`]).
    streaming: bool,
    /// The open block's argument scanner when streaming.
    arg_stream: Option<stream::ArgStream>,
}

impl ToolCallParser {
    /// A parser for `syntax`; `types` says which parameters of which tools are strings (for
    /// the XML syntaxes' values).
    pub fn new(syntax: ToolSyntax, types: ParamTypes) -> ToolCallParser {
        ToolCallParser {
            syntax,
            open: syntax.open(),
            close: syntax.close(),
            types,
            pending: String::new(),
            in_block: false,
            calls: 0,
            ws: String::new(),
            after_call: false,
            streaming: false,
            arg_stream: None,
        }
    }

    /// Streams calls: for the syntaxes whose arguments are JSON text (Hermes, DeepSeek-V3.1,
    /// Kimi-K2), a call is released as [`ToolEvent::CallStart`] once its name is read, its
    /// arguments as [`ToolEvent::CallArgs`] pieces as they come, and [`ToolEvent::CallEnd`].
    /// For forced calls only: a grammar guarantees they are well formed (a call sent piece by
    /// piece can no longer become text). Other syntaxes send whole calls.
    pub fn streaming(mut self, on: bool) -> ToolCallParser {
        self.streaming = on;
        self
    }

    /// Calls released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Adds `text`; returns what is complete now.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_block {
                if self.streaming && self.arg_stream.is_none() {
                    self.arg_stream = stream::ArgStream::new(self.syntax);
                }
                if let Some(st) = self.arg_stream.as_mut() {
                    let limit = self.pending.find(&self.close).unwrap_or(self.pending.len());
                    for e in st.advance(&self.pending[..limit]) {
                        if matches!(e, ToolEvent::CallStart { .. }) {
                            self.ws.clear();
                            self.after_call = true;
                            self.calls += 1;
                        }
                        out.push(e);
                    }
                }
                let Some(at) = self.pending.find(&self.close) else {
                    return out;
                };
                let end = at + self.close.len();
                let block: String = self.pending.drain(..end).collect();
                self.in_block = false;
                match self.arg_stream.take() {
                    Some(st) if st.started > 0 => {
                        if st.in_call() {
                            out.push(ToolEvent::CallEnd(st.partial()));
                        }
                    }
                    _ => self.release_block(&block, &mut out),
                }
            } else {
                match self.pending.find(&self.open) {
                    Some(at) => {
                        let text: String = self.pending.drain(..at).collect();
                        self.text(&mut out, text);
                        self.in_block = true;
                    }
                    None => {
                        let hold = hold_from(&self.pending, &self.open);
                        let text: String = self.pending.drain(..hold).collect();
                        self.text(&mut out, text);
                        return out;
                    }
                }
            }
        }
    }

    /// End of the reply: a block left open (a model that stops without the closing marker)
    /// is parsed as if closed, else released as text, unless the reply was `truncated`
    /// (max_tokens, a shutdown): then a block cut short is dropped rather than shown as markup.
    pub fn finish(&mut self, truncated: bool) -> Vec<ToolEvent> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        if let Some(st) = self.arg_stream.take().filter(|st| st.started > 0) {
            // A streamed call cut short ends with the arguments it has.
            self.in_block = false;
            if st.in_call() {
                out.push(ToolEvent::CallEnd(st.partial()));
            }
        } else if self.in_block {
            self.in_block = false;
            let closed = format!("{rest}{}", self.close);
            match parse_section(self.syntax, &closed, &self.types) {
                Some(calls) if !calls.is_empty() => self.calls_out(calls, &mut out),
                _ if truncated => {}
                _ => self.text(&mut out, rest),
            }
        } else {
            self.text(&mut out, rest);
        }
        if !self.after_call {
            push_text(&mut out, std::mem::take(&mut self.ws));
        }
        out
    }

    fn release_block(&mut self, block: &str, out: &mut Vec<ToolEvent>) {
        match parse_section(self.syntax, block, &self.types) {
            Some(calls) if !calls.is_empty() => self.calls_out(calls, out),
            _ => self.text(out, block.to_string()),
        }
    }

    fn calls_out(&mut self, calls: Vec<ParsedCall>, out: &mut Vec<ToolEvent>) {
        self.ws.clear();
        self.after_call = true;
        self.calls += calls.len();
        out.extend(calls.into_iter().map(ToolEvent::Call));
    }

    /// Text out, its trailing whitespace held ([`ToolCallParser::ws`]).
    fn text(&mut self, out: &mut Vec<ToolEvent>, text: String) {
        let body = text.trim_end();
        if body.is_empty() {
            self.ws.push_str(&text);
            return;
        }
        let tail = text[body.len()..].to_string();
        let text = std::mem::take(&mut self.ws) + body;
        self.ws = tail;
        self.after_call = false;
        push_text(out, text);
    }
}

fn push_text(out: &mut Vec<ToolEvent>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(ToolEvent::Text(t)) = out.last_mut() {
        t.push_str(&text);
    } else {
        out.push(ToolEvent::Text(text));
    }
}

/// How a call of `name` with arguments `args` (a JSON object's text) is written in `syntax`
/// (one call, its block markers included), as the families' templates write it.
pub fn write_call(syntax: ToolSyntax, name: &str, args: &str) -> String {
    let obj: serde_json::Map<String, Json> = serde_json::from_str(args).unwrap_or_default();
    let xml = |open: &dyn Fn(&str) -> String, close: &str| -> String {
        obj.iter()
            .map(|(k, v)| {
                let v = match v {
                    Json::String(s) => s.clone(),
                    other => other.to_string(),
                };
                format!("{}{v}{close}", open(k))
            })
            .collect()
    };
    match syntax {
        ToolSyntax::Hermes => format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": {args}}}\n</tool_call>",
            Json::String(name.into())
        ),
        ToolSyntax::QwenXml => format!(
            "<tool_call>\n<function={name}>\n{}</function>\n</tool_call>",
            xml(&|k| format!("<parameter={k}>\n"), "\n</parameter>\n")
        ),
        ToolSyntax::Glm => format!(
            "<tool_call>{name}\n{}</tool_call>",
            xml(&|k| format!("<arg_key>{k}</arg_key>\n<arg_value>"), "</arg_value>\n")
        ),
        ToolSyntax::DeepSeek => format!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        ToolSyntax::Kimi => format!(
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>"
        ),
        ToolSyntax::Harmony => format!(
            "<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"
        ),
        ToolSyntax::MiniMax | ToolSyntax::Dsml | ToolSyntax::DsmlV4 => {
            let p = if syntax == ToolSyntax::MiniMax { "" } else { DSML };
            format!(
                "{}\n<{p}invoke name=\"{name}\">\n{}</{p}invoke>\n{}",
                syntax.open(),
                xml(&|k| format!("<{p}parameter name=\"{k}\">"), &format!("</{p}parameter>\n")),
                syntax.close()
            )
        }
    }
}

/// The system text coli adds for a chat template that does not render tools itself (its
/// source never reads `tools`): the tools as JSON lines and how a call is written in `syntax`
/// (for [`ToolSyntax::Hermes`], Qwen2.5's and Hermes' wording; for DeepSeek-V3.1, whose
/// template has no tools branch, its model card's).
pub fn describe_tools(syntax: ToolSyntax, tools: &[Json]) -> String {
    if syntax == ToolSyntax::DeepSeek {
        let mut s = String::from("## Tools\nYou have access to the following tools:\n");
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
            let desc = f
                .get("description")
                .and_then(Json::as_str)
                .unwrap_or_default();
            let params = f.get("parameters").cloned().unwrap_or(Json::Null);
            s.push_str(&format!(
                "\n### {name}\nDescription: {desc}\n\nParameters: {params}\n"
            ));
        }
        s.push_str(
            "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n\
             <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>\
             tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n\
             Where:\n- `tool_call_name` must be an exact match to one of the available tools\n\
             - `tool_call_arguments` must be valid JSON that strictly follows the tool's \
             Parameters Schema\n- For multiple tool calls, chain them directly without \
             separators or spaces",
        );
        return s;
    }
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str("\n</tools>\n\n");
    if syntax == ToolSyntax::Hermes {
        s.push_str(
            "For each function call, return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
             <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
    } else {
        s.push_str("To call a function, write the call like this:\n");
        s.push_str(&write_call(
            syntax,
            "function-name",
            "{\"parameter-name\": \"value\"}",
        ));
    }
    s
}

#[cfg(test)]
mod tests;
