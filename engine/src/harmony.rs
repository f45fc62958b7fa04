//! OpenAI's harmony response format (gpt-oss): a generated reply is a sequence of messages,
//! each `<|channel|>NAME<|message|>TEXT` ended by `<|end|>` (more follows), `<|return|>` (the
//! reply is done) or `<|call|>` (a tool call), the next message opening with
//! `<|start|>assistant`. `analysis` carries the chain of thought, `commentary` tool preambles
//! and calls, `final` the answer shown to the user (format: the gpt-oss model card and
//! `openai/harmony`'s `docs/format.md`; the checkpoint's chat template renders the prompt, which
//! ends with `<|start|>assistant`).
//!
//! [`HarmonyParser`] follows the generated token ids and says where each belongs
//! ([`Routed`]), so that a server returns the final channel as the message content and the
//! others as reasoning, instead of one string with the channel names glued in (the special
//! tokens vanish when decoded). A message whose header names a function as its recipient
//! (`to=functions.NAME`, before or after the channel: `<|channel|>commentary
//! to=functions.get_weather <|constrain|>json<|message|>{...}<|call|>` as the model writes it,
//! `<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>...` as the
//! chat template renders one) is a tool call: its text is the call's arguments
//! ([`Routed::CallArgs`], [`HarmonyParser::take_call`]).

use crate::error::Result;
use crate::text::TextTokenizer;

/// The ids of harmony's special tokens in one tokenizer (o200k_harmony: `<|start|>` 200006,
/// `<|end|>` 200007, `<|message|>` 200008, `<|channel|>` 200005, `<|constrain|>` 200003,
/// `<|return|>` 200002, `<|call|>` 200012).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarmonyTokens {
    /// `<|start|>`: opens a message header (role, recipient, channel).
    pub start: u32,
    /// `<|end|>`: ends a message; another follows.
    pub end: u32,
    /// `<|message|>`: ends the header, the text follows.
    pub message: u32,
    /// `<|channel|>`: the channel name follows in the header.
    pub channel: u32,
    /// `<|return|>`: ends the reply.
    pub ret: u32,
    /// `<|call|>`: ends a tool call message.
    pub call: u32,
    /// `<|constrain|>`: the content type of a tool call follows in the header (optional).
    pub constrain: Option<u32>,
}

impl HarmonyTokens {
    /// The harmony tokens of `tok`, or `None` when its vocabulary lacks any of the required
    /// ones (the model does not speak harmony).
    pub fn detect(tok: &TextTokenizer) -> Option<HarmonyTokens> {
        let id = |t: &str| tok.token_id(t);
        Some(HarmonyTokens {
            start: id("<|start|>")?,
            end: id("<|end|>")?,
            message: id("<|message|>")?,
            channel: id("<|channel|>")?,
            ret: id("<|return|>")?,
            call: id("<|call|>")?,
            constrain: id("<|constrain|>"),
        })
    }

    fn is_control(&self, id: u32) -> bool {
        [
            self.start,
            self.end,
            self.message,
            self.channel,
            self.ret,
            self.call,
        ]
        .contains(&id)
            || self.constrain == Some(id)
    }
}

/// Where a generated token belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// Text of the `final` channel: the answer (or, when the model did not open a harmony
    /// message at all, every non-control token: passthrough).
    Final,
    /// Text of another channel (`analysis`, `commentary`, ...): reasoning, not the answer.
    Reasoning,
    /// Text of a message addressed to a function (`to=functions.NAME`): the arguments of a
    /// tool call, complete at its `<|call|>` ([`HarmonyParser::take_call`]).
    CallArgs,
    /// A special token, a header (role, recipient, channel name) or text after the reply ended.
    Control,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In a header; `naming` while the channel name is being read.
    Header { naming: bool },
    /// In the text of a message; `final_channel` when its channel is `final`, `call` when it
    /// is addressed to a function.
    Message { final_channel: bool, call: bool },
    /// After `<|end|>`: waiting for the next `<|start|>`.
    Between,
    /// After `<|return|>` or `<|call|>`.
    Done,
    /// The model did not open with a header: its tokens are the answer as they come.
    Passthrough,
}

/// Follows a harmony reply token by token (see the module docs).
#[derive(Clone, Debug)]
pub struct HarmonyParser {
    tokens: HarmonyTokens,
    state: State,
    /// Whether any header token has been seen (a reply that opens with text is passthrough).
    started: bool,
    /// Ids of the channel name being read.
    name: Vec<u32>,
    /// Ids of the header's text outside the channel name (role, recipient, content type).
    header: Vec<u32>,
    /// The function the open message is addressed to.
    recipient: Option<String>,
    /// A call that ended (`<|call|>`) and was not taken yet: the function's name.
    ended_call: Option<String>,
    /// Channel names of the messages so far, in order.
    channels: Vec<String>,
}

impl HarmonyParser {
    /// A parser for a reply generated after a prompt that ends with `<|start|>assistant` (what
    /// the gpt-oss chat template renders with `add_generation_prompt`).
    pub fn new(tokens: HarmonyTokens) -> HarmonyParser {
        HarmonyParser {
            tokens,
            state: State::Header { naming: false },
            started: false,
            name: Vec::new(),
            header: Vec::new(),
            recipient: None,
            ended_call: None,
            channels: Vec::new(),
        }
    }

    /// The name of the function whose call just ended (`<|call|>` after a message addressed
    /// to `functions.NAME`), once.
    pub fn take_call(&mut self) -> Option<String> {
        self.ended_call.take()
    }

    /// Whether a reply's first text (after the prompt's `<|start|>assistant`) may begin a
    /// recipient (` to=functions.NAME<|channel|>...`, the order the chat template writes).
    fn opens_recipient(text: &str) -> bool {
        let t = text.trim_start();
        !t.is_empty() && ("to=functions.".starts_with(t) || t.starts_with("to="))
    }

    /// The function a header's text addresses (`to=functions.NAME`), if any.
    fn recipient_of(text: &str) -> Option<String> {
        let at = text.find("to=functions.")? + "to=functions.".len();
        let name: String = text[at..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        (!name.is_empty()).then_some(name)
    }

    /// The channel names of the messages opened so far (`["analysis", "final"]`).
    pub fn channels(&self) -> &[String] {
        &self.channels
    }

    /// Whether the reply has ended (`<|return|>` or `<|call|>`).
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Follows generated token `id`; says where it belongs.
    ///
    /// # Errors
    /// The tokenizer's decode error for a channel name.
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<Routed> {
        let t = self.tokens;
        let control = t.is_control(id);
        let first = !self.started;
        self.started = true;
        Ok(match self.state {
            State::Passthrough => {
                if control {
                    Routed::Control
                } else {
                    Routed::Final
                }
            }
            State::Done => Routed::Control,
            State::Header { naming } => {
                if id == t.channel {
                    self.name.clear();
                    self.state = State::Header { naming: true };
                } else if Some(id) == t.constrain {
                    self.state = State::Header { naming: false };
                } else if id == t.message {
                    let full = tok.decode(&self.name, false)?;
                    let header = tok.decode(&self.header, false)?;
                    self.recipient = Self::recipient_of(&format!("{header} {full}"));
                    // `commentary to=functions.x json`: the channel is the first word.
                    let name = full.split_whitespace().next().unwrap_or("").to_string();
                    let final_channel = name == "final";
                    self.channels.push(name);
                    self.name.clear();
                    self.header.clear();
                    self.state = State::Message {
                        final_channel,
                        call: self.recipient.is_some(),
                    };
                } else if id == t.ret || id == t.call {
                    self.state = State::Done;
                } else if first && !control {
                    let text = tok.decode(&[id], false)?;
                    if text.trim().is_empty() {
                        // Undecided yet (` to=...` may follow).
                        self.started = false;
                        self.header.push(id);
                    } else if Self::opens_recipient(&text) {
                        self.header.push(id);
                    } else {
                        // No header at all: a model that does not follow harmony here.
                        self.state = State::Passthrough;
                        return Ok(Routed::Final);
                    }
                } else if naming && !control {
                    self.name.push(id);
                } else if !control {
                    self.header.push(id);
                }
                Routed::Control
            }
            State::Message {
                final_channel,
                call,
            } => {
                if id == t.end {
                    self.state = State::Between;
                    Routed::Control
                } else if id == t.ret || id == t.call {
                    if id == t.call {
                        self.ended_call = self.recipient.take();
                    }
                    self.state = State::Done;
                    Routed::Control
                } else if id == t.start {
                    // A message left unterminated: a new header starts.
                    self.header.clear();
                    self.state = State::Header { naming: false };
                    Routed::Control
                } else if control {
                    Routed::Control
                } else if call {
                    Routed::CallArgs
                } else if final_channel {
                    Routed::Final
                } else {
                    Routed::Reasoning
                }
            }
            State::Between => {
                if id == t.start {
                    self.header.clear();
                    self.state = State::Header { naming: false };
                } else if id == t.ret || id == t.call {
                    self.state = State::Done;
                } else if id == t.channel {
                    // `<|start|>assistant` omitted: the header starts with the channel.
                    self.name.clear();
                    self.state = State::Header { naming: true };
                }
                Routed::Control
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tests::byte_tokenizer_with;

    const SPECIAL: [&str; 7] = [
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|return|>",
        "<|call|>",
        "<|constrain|>",
    ];

    /// Routes `reply` (text with harmony special tokens) token by token; returns the final
    /// text, the reasoning text and the parser.
    fn route(reply: &str) -> (String, String, HarmonyParser) {
        let tok = byte_tokenizer_with(&SPECIAL);
        let t = HarmonyTokens::detect(&tok).expect("harmony tokens");
        let ids = tok.encode(reply, false).unwrap();
        let mut p = HarmonyParser::new(t);
        let (mut fin, mut reasoning) = (Vec::new(), Vec::new());
        for id in ids {
            match p.push(&tok, id).unwrap() {
                Routed::Final => fin.push(id),
                Routed::Reasoning | Routed::CallArgs => reasoning.push(id),
                Routed::Control => {}
            }
        }
        (
            tok.decode(&fin, true).unwrap(),
            tok.decode(&reasoning, true).unwrap(),
            p,
        )
    }

    #[test]
    fn detects_the_tokens() {
        let tok = byte_tokenizer_with(&SPECIAL);
        let t = HarmonyTokens::detect(&tok).unwrap();
        assert_eq!((t.start, t.channel, t.constrain), (256, 259, Some(262)));
        // Without the harmony tokens there is no harmony.
        assert!(HarmonyTokens::detect(&byte_tokenizer_with(&["<|start|>"])).is_none());
    }

    #[test]
    fn analysis_then_final() {
        let (fin, reasoning, p) = route(
            "<|channel|>analysis<|message|>User greets. Answer briefly.<|end|>\
             <|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
        );
        assert_eq!(fin, "Hello! How can I help?");
        assert_eq!(reasoning, "User greets. Answer briefly.");
        assert_eq!(p.channels(), ["analysis", "final"]);
        assert!(p.done());
    }

    #[test]
    fn tokens_after_the_end_are_dropped() {
        let (fin, _, p) =
            route("<|channel|>final<|message|>42<|return|><|start|>assistant more text");
        assert_eq!(fin, "42");
        assert!(p.done());
    }

    #[test]
    fn a_tool_call_is_commentary_not_content() {
        let (fin, reasoning, p) = route(
            "<|channel|>analysis<|message|>Need weather.<|end|>\
             <|start|>assistant to=functions.get_weather<|channel|>commentary \
             <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
        );
        assert_eq!(fin, "");
        assert_eq!(reasoning, "Need weather.{\"city\":\"Oslo\"}");
        assert_eq!(p.channels(), ["analysis", "commentary"]);
        assert!(p.done());
    }

    /// The arguments of a call and its function, in both header orders; `<|end|>` (no call)
    /// leaves nothing to take.
    fn call_of(reply: &str) -> (String, Option<String>) {
        let tok = byte_tokenizer_with(&SPECIAL);
        let t = HarmonyTokens::detect(&tok).unwrap();
        let mut p = HarmonyParser::new(t);
        let mut args = Vec::new();
        let mut name = None;
        for id in tok.encode(reply, false).unwrap() {
            if p.push(&tok, id).unwrap() == Routed::CallArgs {
                args.push(id);
            }
            name = name.or(p.take_call());
        }
        (tok.decode(&args, true).unwrap(), name)
    }

    #[test]
    fn tool_calls_in_both_header_orders() {
        let model = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>";
        assert_eq!(
            call_of(model),
            ("{\"city\":\"Oslo\"}".into(), Some("get_weather".into()))
        );
        let template = " to=functions.search<|channel|>commentary json<|message|>{\"q\":1}<|call|>";
        assert_eq!(
            call_of(template),
            ("{\"q\":1}".into(), Some("search".into()))
        );
        let ended = "<|channel|>commentary to=functions.f json<|message|>{}<|end|>";
        assert_eq!(call_of(ended).1, None);
    }

    /// The call gpt-oss's published template writes (tests/fixtures/chat_templates/
    /// tools_expected.json, rendered by transformers) routes to its function and arguments.
    #[test]
    fn the_published_templates_call_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/chat_templates/tools_expected.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let text = v["templates"]["gpt-oss"]["call_text"].as_str().unwrap();
        let (args, name) = call_of(text);
        let want = &v["calls"][0];
        assert_eq!(name.as_deref(), want["name"].as_str());
        let args: serde_json::Value = serde_json::from_str(&args).unwrap();
        assert_eq!(args, want["arguments"]);
    }

    #[test]
    fn a_reply_without_harmony_passes_through() {
        // A model that does not follow the format (e.g. random weights): its text is the answer.
        let (fin, reasoning, p) = route("plain text<|end|> and more");
        assert_eq!(fin, "plain text and more");
        assert_eq!(reasoning, "");
        assert!(p.channels().is_empty());
    }

    #[test]
    fn final_without_analysis_and_unterminated() {
        // Generation stopped by max_tokens inside the final message.
        let (fin, reasoning, p) = route("<|channel|>final<|message|>partial ans");
        assert_eq!((fin.as_str(), reasoning.as_str()), ("partial ans", ""));
        assert!(!p.done());
    }
}
