//! Arguments streamed while a call is generated, for the syntaxes whose arguments are JSON text
//! (Hermes, DeepSeek-V3.1, Kimi-K2): the call's name as soon as it is read, then its arguments
//! piece by piece, ending where the JSON object closes. Used for forced calls, whose grammar
//! guarantees the call is well formed ([`super::ToolCallParser::streaming`]); a call the model
//! writes unforced is sent whole once its block closes, so that a malformed one can still become
//! text.

use super::{ParsedCall, ToolEvent, ToolSyntax};

/// Where the scanner is in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before a call's arguments: reading its name.
    Head,
    /// In the arguments' JSON: nesting depth (0 before the opening brace), inside a string,
    /// after a backslash in one.
    Args {
        depth: usize,
        in_str: bool,
        esc: bool,
    },
    /// The block's calls are read (Hermes: one call per block).
    Done,
}

/// The scanner of one block (see the module doc).
#[derive(Clone, Debug)]
pub struct ArgStream {
    syntax: ToolSyntax,
    /// Byte offset in the block's text up to which it has been read.
    pos: usize,
    phase: Phase,
    name: String,
    args: String,
    /// Calls started, and ended, in this block.
    pub(super) started: usize,
    pub(super) ended: usize,
}

/// `(begin, separator, end)` markers of one call, for the token syntaxes.
fn call_markers(syntax: ToolSyntax) -> Option<(&'static str, &'static str, &'static str)> {
    match syntax {
        ToolSyntax::DeepSeek => Some((
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
        )),
        ToolSyntax::Kimi => Some((
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        )),
        _ => None,
    }
}

/// The JSON string literal starting at `s`'s first byte (a `"`): its value and the byte length
/// of the literal; None while it is incomplete.
fn json_string(s: &str) -> Option<(String, usize)> {
    let mut esc = false;
    for (i, c) in s.char_indices().skip(1) {
        if esc {
            esc = false;
        } else if c == '\\' {
            esc = true;
        } else if c == '"' {
            let lit = &s[..i + 1];
            return serde_json::from_str::<String>(lit).ok().map(|v| (v, i + 1));
        }
    }
    None
}

/// After `key` (a JSON key with its quotes) in `s` from `from`: the offset past `key`, `:` and
/// whitespace; None while incomplete.
fn after_key(s: &str, from: usize, key: &str) -> Option<usize> {
    let k = from + s[from..].find(key)? + key.len();
    let rest = &s[k..];
    let colon = rest.find(|c: char| !c.is_whitespace())?;
    if !rest[colon..].starts_with(':') {
        return None;
    }
    let after = &rest[colon + 1..];
    let v = after.find(|c: char| !c.is_whitespace())?;
    Some(k + colon + 1 + v)
}

impl ArgStream {
    /// A scanner for a block in `syntax` (None for the syntaxes whose arguments are not JSON
    /// text: they are sent whole).
    pub fn new(syntax: ToolSyntax) -> Option<ArgStream> {
        matches!(
            syntax,
            ToolSyntax::Hermes | ToolSyntax::DeepSeek | ToolSyntax::Kimi
        )
        .then(|| ArgStream {
            syntax,
            pos: syntax.open().len(),
            phase: Phase::Head,
            name: String::new(),
            args: String::new(),
            started: 0,
            ended: 0,
        })
    }

    /// Whether a call has started and not ended.
    pub fn in_call(&self) -> bool {
        self.started > self.ended
    }

    /// The call in progress, as far as it went (a reply cut short).
    pub fn partial(&self) -> ParsedCall {
        ParsedCall {
            name: self.name.clone(),
            arguments: self.args.clone(),
        }
    }

    /// Reads `block` (the block's text so far, from its opening marker) past what was read.
    pub fn advance(&mut self, block: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Done => return out,
                Phase::Head => {
                    let Some((name, at)) = self.head(block) else {
                        return out;
                    };
                    self.name = name.clone();
                    self.args.clear();
                    self.started += 1;
                    self.pos = at;
                    self.phase = Phase::Args {
                        depth: 0,
                        in_str: false,
                        esc: false,
                    };
                    out.push(ToolEvent::CallStart { name });
                }
                Phase::Args {
                    mut depth,
                    mut in_str,
                    mut esc,
                } => {
                    let from = self.pos;
                    let mut end = None;
                    for (i, c) in block[from..].char_indices() {
                        if in_str {
                            if esc {
                                esc = false;
                            } else if c == '\\' {
                                esc = true;
                            } else if c == '"' {
                                in_str = false;
                            }
                        } else if c == '"' {
                            in_str = true;
                        } else if c == '{' || c == '[' {
                            depth += 1;
                        } else if c == '}' || c == ']' {
                            depth = depth.saturating_sub(1);
                            if depth == 0 {
                                end = Some(from + i + c.len_utf8());
                                break;
                            }
                        }
                    }
                    let upto = end.unwrap_or(block.len());
                    let piece = &block[from..upto];
                    if !piece.is_empty() {
                        self.args.push_str(piece);
                        out.push(ToolEvent::CallArgs(piece.to_string()));
                    }
                    self.pos = upto;
                    match end {
                        None => {
                            self.phase = Phase::Args { depth, in_str, esc };
                            return out;
                        }
                        Some(_) => {
                            self.ended += 1;
                            out.push(ToolEvent::CallEnd(self.partial()));
                            self.phase = match self.syntax {
                                ToolSyntax::Hermes => Phase::Done,
                                _ => Phase::Head,
                            };
                        }
                    }
                }
            }
        }
    }

    /// The next call's name and where its arguments start, once both are read.
    fn head(&self, block: &str) -> Option<(String, usize)> {
        match call_markers(self.syntax) {
            Some((begin, sep, _)) => {
                let b = self.pos + block[self.pos..].find(begin)? + begin.len();
                let s = b + block[b..].find(sep)?;
                let raw = block[b..s].trim();
                let name = match self.syntax {
                    ToolSyntax::Kimi => {
                        let id = raw.strip_prefix("functions.").unwrap_or(raw);
                        match id.rfind(':') {
                            Some(c) if id[c + 1..].chars().all(|ch| ch.is_ascii_digit()) => {
                                &id[..c]
                            }
                            _ => id,
                        }
                    }
                    _ => raw,
                };
                Some((name.to_string(), s + sep.len()))
            }
            None => {
                // Hermes: `{"name": "N", "arguments": {...}}` (the forced grammar's order).
                let n = after_key(block, self.pos, "\"name\"")?;
                let (name, len) = json_string(&block[n..])?;
                let a = after_key(block, n + len, "\"arguments\"")?;
                Some((name, a))
            }
        }
    }
}
