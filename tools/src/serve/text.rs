//! Generated text for streaming: whole UTF-8 characters only (through
//! [`coli_engine::StreamDecoder`]) and stop strings applied across token boundaries, holding back
//! any tail that may still become a stop string; for a model that answers in OpenAI's harmony
//! format (gpt-oss), the final channel as the content and the other channels as reasoning
//! ([`ReplyText`]).

use coli_engine::text::hold_from;
use coli_engine::tool_calls::{ParamTypes, ParsedCall, ToolCallParser, ToolEvent, ToolSyntax};
use coli_engine::{HarmonyParser, HarmonyTokens, Routed, StreamDecoder, TextTokenizer};

/// Cuts generated text at the first stop string, releasing text only once no stop string can
/// start inside it.
#[derive(Debug, Default)]
pub struct StopFilter {
    /// The non-empty stop strings with their index in the list given to [`StopFilter::new`].
    stops: Vec<(usize, String)>,
    pending: String,
    hit: bool,
    /// Index (in the list given to `new`) of the stop string that ended the text.
    matched: Option<usize>,
}

impl StopFilter {
    /// A filter for `stops` (empty strings are ignored; an empty list passes everything
    /// through).
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops: stops
                .into_iter()
                .enumerate()
                .filter(|(_, s)| !s.is_empty())
                .collect(),
            pending: String::new(),
            hit: false,
            matched: None,
        }
    }

    /// Whether a stop string was seen.
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// The index, in the list given to [`StopFilter::new`], of the stop string that ended the
    /// text (the one starting first; of those, the first listed).
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// Adds `piece`; returns the text that is now safe to emit and whether a stop string was
    /// completed (then the text ends right before it and everything after is dropped).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.hit {
            return (String::new(), true);
        }
        self.pending.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|(i, s)| self.pending.find(s.as_str()).map(|at| (at, *i)))
            .min();
        if let Some((at, i)) = first {
            self.hit = true;
            self.matched = Some(i);
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a proper prefix of some stop string. A stop string
        // starts with a whole character, so a matching tail starts on a character boundary.
        let hold = self
            .pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|(_, s)| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold].to_string();
        self.pending.drain(..hold);
        (out, false)
    }

    /// End of generation: returns the held-back text (it did not become a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Token ids to text chunks: a [`StreamDecoder`] (never a split character) followed by a
/// [`StopFilter`].
pub struct TextStream {
    decoder: StreamDecoder,
    filter: StopFilter,
}

impl TextStream {
    /// A stream applying `stops`.
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            decoder: StreamDecoder::new(),
            filter: StopFilter::new(stops),
        }
    }

    /// Adds generated token `id`; returns text to send (possibly empty) and whether a stop
    /// string ended generation.
    ///
    /// # Errors
    /// The tokenizer's decode error (an id outside its vocabulary).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> coli_engine::Result<(String, bool)> {
        let piece = self.decoder.push(tok, id)?;
        Ok(self.filter.push(&piece))
    }

    /// Adds text that is not decoded from a token (a tool-call marker the decoder skips as a
    /// special token); returns what [`TextStream::push`] returns.
    pub fn push_text(&mut self, text: &str) -> (String, bool) {
        self.filter.push(text)
    }

    /// The index of the stop string that ended the text ([`StopFilter::matched`]).
    pub fn matched(&self) -> Option<usize> {
        self.filter.matched()
    }

    /// End of generation: the rest of the text and whether it completed a stop string.
    ///
    /// # Errors
    /// As [`TextStream::push`].
    pub fn finish(&mut self, tok: &TextTokenizer) -> coli_engine::Result<(String, bool)> {
        if self.filter.hit() {
            return Ok((String::new(), true));
        }
        let rest = self.decoder.finish(tok)?;
        let (mut out, hit) = self.filter.push(&rest);
        if !hit {
            out.push_str(&self.filter.finish());
        }
        Ok((out, hit))
    }
}

/// A piece of a reply, ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text of the answer (the message `content`).
    Content(String),
    /// Reasoning: harmony's `analysis` and `commentary` channels (the message's
    /// `reasoning_content`, as vLLM and llama.cpp name it).
    Reasoning(String),
    /// A tool call parsed from the content ([`ReplyText::with_tools`]).
    ToolCall(ParsedCall),
    /// A streamed tool call's name (its arguments follow as [`Piece::ToolCallArgs`]).
    ToolCallStart(String),
    /// A piece of a streamed tool call's arguments.
    ToolCallArgs(String),
    /// A streamed tool call is complete (its name and whole arguments).
    ToolCallEnd(ParsedCall),
}

/// What a reply's tool calls need: the parser of the model's syntax and the ids of its markers
/// that the decoder skips (special tokens), with their text. A harmony model's calls are
/// messages addressed to functions, which the harmony parser routes
/// ([`coli_engine::Routed::CallArgs`]): no text parser then.
pub struct ReplyTools {
    /// The parser (None for harmony).
    pub parser: Option<ToolCallParser>,
    /// `(id, text)` of markers held as one special token.
    pub markers: Vec<(u32, String)>,
    /// A harmony call's argument ids so far.
    harmony_args: Vec<u32>,
    /// Harmony calls released.
    harmony_calls: usize,
}

impl ReplyTools {
    /// For replies of `tok`'s model in `syntax`, calling tools typed by `types`; `stream_args`
    /// for a forced call (its arguments stream, [`ToolCallParser::streaming`]).
    pub fn new(
        tok: &TextTokenizer,
        syntax: ToolSyntax,
        types: ParamTypes,
        stream_args: bool,
    ) -> ReplyTools {
        // A harmony model's markers are routed by the harmony parser.
        let text_markers = if syntax == ToolSyntax::Harmony {
            Vec::new()
        } else {
            syntax.markers()
        };
        let markers = text_markers
            .into_iter()
            .filter_map(|m| {
                let id = tok.token_id(&m)?;
                // Only markers the decoder drops (special tokens) are put back by hand.
                tok.decode(&[id], true)
                    .ok()
                    .filter(|t| t.is_empty())
                    .map(|_| (id, m))
            })
            .collect();
        ReplyTools {
            parser: (syntax != ToolSyntax::Harmony)
                .then(|| ToolCallParser::new(syntax, types).streaming(stream_args)),
            markers,
            harmony_args: Vec::new(),
            harmony_calls: 0,
        }
    }

    fn marker(&self, id: u32) -> Option<&str> {
        self.markers
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, m)| m.as_str())
    }

    /// Content pieces through the parser (calls out, text as content); others unchanged.
    fn route(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        let Some(parser) = self.parser.as_mut() else {
            return pieces;
        };
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(t) => out.extend(parser.push(&t).into_iter().map(piece)),
                p => out.push(p),
            }
        }
        out
    }

    /// Calls released so far.
    fn calls(&self) -> usize {
        self.harmony_calls + self.parser.as_ref().map_or(0, ToolCallParser::calls)
    }

    /// A harmony call to `name` ended: its arguments as a call when they are a JSON object,
    /// else as reasoning (malformed output degrades to text).
    fn harmony_call(&mut self, tok: &TextTokenizer, name: String) -> coli_engine::Result<Piece> {
        let text = tok.decode(&std::mem::take(&mut self.harmony_args), true)?;
        Ok(
            match serde_json::from_str::<serde_json::Value>(text.trim()) {
                Ok(v) if v.is_object() => {
                    self.harmony_calls += 1;
                    Piece::ToolCall(ParsedCall {
                        name,
                        arguments: v.to_string(),
                    })
                }
                _ => Piece::Reasoning(text),
            },
        )
    }
}

fn piece(e: ToolEvent) -> Piece {
    match e {
        ToolEvent::Text(t) => Piece::Content(t),
        ToolEvent::Call(c) => Piece::ToolCall(c),
        ToolEvent::CallStart { name } => Piece::ToolCallStart(name),
        ToolEvent::CallArgs(a) => Piece::ToolCallArgs(a),
        ToolEvent::CallEnd(c) => Piece::ToolCallEnd(c),
    }
}

/// The opening and closing tags of a reasoning model's thoughts (Qwen3, DeepSeek-R1, GLM-4.5,
/// MiniMax-M2, ...).
pub const THINK_OPEN: &str = "<think>";
/// See [`THINK_OPEN`].
pub const THINK_CLOSE: &str = "</think>";

/// How a chat reply's text is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFormat {
    /// All text is content.
    Plain,
    /// OpenAI's harmony format (gpt-oss): the final channel is content, the others reasoning.
    Harmony(HarmonyTokens),
    /// `<think>...</think>` then the answer: the thoughts are reasoning. `open` when the prompt
    /// already opened the block (the template ends the generation prompt with `<think>`), so
    /// the reply starts inside it.
    Think {
        /// The reply starts inside the thoughts.
        open: bool,
    },
}

/// The format of a chat reply whose prompt rendered as `prompt_text`: harmony when the tokenizer
/// has harmony's tokens; `<think>` blocks when `split_think` and the tokenizer has the `<think>`
/// and `</think>` tokens (open when the prompt ends with `<think>`, whitespace aside: the
/// template opened the block; a `<think>` elsewhere, e.g. in a user's text, does not count);
/// else plain.
pub fn reply_format(tok: &TextTokenizer, prompt_text: &str, split_think: bool) -> ReplyFormat {
    if let Some(t) = HarmonyTokens::detect(tok) {
        return ReplyFormat::Harmony(t);
    }
    if split_think && tok.token_id(THINK_OPEN).is_some() && tok.token_id(THINK_CLOSE).is_some() {
        let open = prompt_text.trim_end().ends_with(THINK_OPEN);
        return ReplyFormat::Think { open };
    }
    ReplyFormat::Plain
}

/// Splits streamed text at `<think>` / `</think>` (text level: the tags may be one token or
/// several): text inside is reasoning, text after is content (its leading whitespace dropped).
/// A reply that does not start with `<think>` (and was not opened by the prompt) is all content.
#[derive(Debug)]
struct ThinkSplit {
    state: ThinkState,
    /// Text not yet released: a possible prefix of the tag being looked for.
    pending: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThinkState {
    /// Before anything but whitespace: looking for `<think>`.
    Start,
    /// Inside the thoughts.
    Thinking,
    /// After `</think>`, before the first non-whitespace character of the answer.
    AnswerStart,
    /// The answer.
    Answer,
}

impl ThinkSplit {
    fn new(open: bool) -> ThinkSplit {
        ThinkSplit {
            state: if open {
                ThinkState::Thinking
            } else {
                ThinkState::Start
            },
            pending: String::new(),
        }
    }

    /// Adds `text`; returns (reasoning, content) released now.
    fn push(&mut self, text: &str) -> (String, String) {
        self.pending.push_str(text);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                ThinkState::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                        self.pending = rest.to_string();
                        self.state = ThinkState::Thinking;
                    } else if THINK_OPEN.starts_with(t) {
                        return (reasoning, content); // maybe the tag: wait
                    } else {
                        self.state = ThinkState::Answer;
                    }
                }
                ThinkState::Thinking => match self.pending.find(THINK_CLOSE) {
                    Some(at) => {
                        reasoning.push_str(&self.pending[..at]);
                        self.pending = self.pending[at + THINK_CLOSE.len()..].to_string();
                        self.state = ThinkState::AnswerStart;
                    }
                    None => {
                        let h = hold_from(&self.pending, THINK_CLOSE);
                        reasoning.push_str(&self.pending[..h]);
                        self.pending.drain(..h);
                        return (reasoning, content);
                    }
                },
                ThinkState::AnswerStart => {
                    let t = self.pending.trim_start();
                    if t.is_empty() {
                        self.pending.clear();
                        return (reasoning, content);
                    }
                    self.pending = t.to_string();
                    self.state = ThinkState::Answer;
                }
                ThinkState::Answer => {
                    content.push_str(&self.pending);
                    self.pending.clear();
                    return (reasoning, content);
                }
            }
        }
    }

    /// End of the reply: what is still held back (an unfinished tag is text).
    fn finish(&mut self) -> (String, String) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            ThinkState::Thinking => (rest, String::new()),
            ThinkState::AnswerStart => (String::new(), String::new()),
            ThinkState::Start | ThinkState::Answer => (String::new(), rest),
        }
    }
}

/// The text of one choice: every token into one [`TextStream`]; for a harmony reply, the final
/// channel's tokens into the content stream (stop strings apply to it) and the other channels'
/// into a reasoning stream (no stop strings), the format's special tokens and headers into
/// neither ([`HarmonyParser`]); for a `<think>` reply, the decoded text split at the tags
/// ([`ReplyFormat::Think`]), stop strings applied to the answer only.
pub struct ReplyText {
    content: TextStream,
    harmony: Option<(HarmonyParser, TextStream)>,
    /// `<think>` replies: the whole text decoded once, split, then the answer through the stop
    /// filter.
    think: Option<(StreamDecoder, ThinkSplit, StopFilter)>,
    /// The ids of `<think>` and `</think>` when each is one token: fed to the split as their
    /// text, not decoded (a tokenizer may mark them special, which decoding skips).
    think_ids: Option<(u32, u32)>,
    /// Tool calls parsed out of the content, when the request offers tools.
    tools: Option<ReplyTools>,
}

impl ReplyText {
    /// A reply applying `stops` to its content; `harmony` when the request is a chat with a
    /// model whose tokenizer has the harmony tokens.
    pub fn new(stops: Vec<String>, harmony: Option<HarmonyTokens>) -> ReplyText {
        let format = match harmony {
            Some(t) => ReplyFormat::Harmony(t),
            None => ReplyFormat::Plain,
        };
        ReplyText::with_format(stops, format)
    }

    /// A reply in `format`, applying `stops` to its content; for [`ReplyFormat::Think`], the
    /// tag ids of `tok` when the tags are single tokens.
    pub fn for_tokenizer(
        tok: &TextTokenizer,
        stops: Vec<String>,
        format: ReplyFormat,
    ) -> ReplyText {
        let mut r = ReplyText::with_format(stops, format);
        if matches!(format, ReplyFormat::Think { .. }) {
            r.think_ids = tok.token_id(THINK_OPEN).zip(tok.token_id(THINK_CLOSE));
        }
        r
    }

    /// A reply in `format`, applying `stops` to its content.
    pub fn with_format(stops: Vec<String>, format: ReplyFormat) -> ReplyText {
        let mut r = ReplyText {
            content: TextStream::new(Vec::new()),
            harmony: None,
            think: None,
            think_ids: None,
            tools: None,
        };
        match format {
            ReplyFormat::Plain => r.content = TextStream::new(stops),
            ReplyFormat::Harmony(t) => {
                r.content = TextStream::new(stops);
                r.harmony = Some((HarmonyParser::new(t), TextStream::new(Vec::new())));
            }
            ReplyFormat::Think { open } => {
                r.think = Some((
                    StreamDecoder::new(),
                    ThinkSplit::new(open),
                    StopFilter::new(stops),
                ));
            }
        }
        r
    }

    /// Pieces of reasoning and content from a split, the content through the stop filter.
    fn think_pieces(
        reasoning: String,
        content: String,
        filter: &mut StopFilter,
    ) -> (Vec<Piece>, bool) {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.push(Piece::Reasoning(reasoning));
        }
        let (c, hit) = if content.is_empty() {
            (String::new(), filter.hit())
        } else {
            filter.push(&content)
        };
        if !c.is_empty() {
            out.push(Piece::Content(c));
        }
        (out, hit)
    }

    /// Adds generated token `id`; returns the pieces to send now (none, one, or a reasoning
    /// piece then a content piece when a `</think>` fell inside this token's text) and whether
    /// a stop string ended generation.
    ///
    /// # Errors
    /// The tokenizer's decode error (an id outside its vocabulary).
    pub fn push(
        &mut self,
        tok: &TextTokenizer,
        id: u32,
    ) -> coli_engine::Result<(Vec<Piece>, bool)> {
        let (pieces, hit) = self.push_inner(tok, id)?;
        Ok(match &mut self.tools {
            Some(t) => (t.route(pieces), hit),
            None => (pieces, hit),
        })
    }

    /// Replies to tool calls: the content goes through `tools`' parser.
    pub fn with_tools(mut self, tools: ReplyTools) -> ReplyText {
        self.tools = Some(tools);
        self
    }

    /// Tool calls released so far.
    pub fn tool_calls(&self) -> usize {
        self.tools.as_ref().map_or(0, ReplyTools::calls)
    }

    fn push_inner(
        &mut self,
        tok: &TextTokenizer,
        id: u32,
    ) -> coli_engine::Result<(Vec<Piece>, bool)> {
        let marker = self
            .tools
            .as_ref()
            .and_then(|t| t.marker(id))
            .map(str::to_string);
        if let Some((dec, split, filter)) = &mut self.think {
            let text = match self.think_ids {
                Some((open, _)) if id == open => THINK_OPEN.to_string(),
                Some((_, close)) if id == close => THINK_CLOSE.to_string(),
                _ => match &marker {
                    Some(m) => m.clone(),
                    None => dec.push(tok, id)?,
                },
            };
            let (r, c) = split.push(&text);
            return Ok(Self::think_pieces(r, c, filter));
        }
        let routed = match &mut self.harmony {
            Some((parser, _)) => parser.push(tok, id)?,
            None => Routed::Final,
        };
        if let (Some((parser, _)), Some(tools)) = (&mut self.harmony, &mut self.tools) {
            // A call's arguments are held until its `<|call|>`, then released as the call.
            if routed == Routed::CallArgs {
                tools.harmony_args.push(id);
                return Ok((Vec::new(), false));
            }
            if let Some(name) = parser.take_call() {
                return Ok((vec![tools.harmony_call(tok, name)?], false));
            }
        }
        Ok(match (routed, &mut self.harmony) {
            (Routed::Final, _) => {
                let (t, hit) = match &marker {
                    Some(m) => self.content.push_text(m),
                    None => self.content.push(tok, id)?,
                };
                (
                    (!t.is_empty())
                        .then_some(Piece::Content(t))
                        .into_iter()
                        .collect(),
                    hit,
                )
            }
            (Routed::Reasoning | Routed::CallArgs, Some((_, reasoning))) => {
                let (t, _) = reasoning.push(tok, id)?;
                (
                    (!t.is_empty())
                        .then_some(Piece::Reasoning(t))
                        .into_iter()
                        .collect(),
                    false,
                )
            }
            _ => (Vec::new(), false),
        })
    }

    /// The index (in the `stops` given to [`ReplyText::with_format`]) of the stop string that ended
    /// the content, if one did.
    pub fn matched_stop(&self) -> Option<usize> {
        match &self.think {
            Some((_, _, filter)) => filter.matched(),
            None => self.content.matched(),
        }
    }

    /// End of generation: the rest of the reasoning and content, and whether the content
    /// completed a stop string.
    ///
    /// # Errors
    /// As [`ReplyText::push`].
    pub fn finish(&mut self, tok: &TextTokenizer) -> coli_engine::Result<(Vec<Piece>, bool)> {
        self.finish_reply(tok, false)
    }

    /// [`ReplyText::finish`] of a reply that was `truncated` (max_tokens, a shutdown): a tool
    /// call cut short is dropped, not shown as markup.
    ///
    /// # Errors
    /// As [`ReplyText::push`].
    pub fn finish_reply(
        &mut self,
        tok: &TextTokenizer,
        truncated: bool,
    ) -> coli_engine::Result<(Vec<Piece>, bool)> {
        let (pieces, hit) = self.finish_inner(tok)?;
        Ok(match &mut self.tools {
            Some(t) => {
                let mut out = t.route(pieces);
                if let Some(p) = t.parser.as_mut() {
                    out.extend(p.finish(truncated).into_iter().map(piece));
                }
                (out, hit)
            }
            None => (pieces, hit),
        })
    }

    fn finish_inner(&mut self, tok: &TextTokenizer) -> coli_engine::Result<(Vec<Piece>, bool)> {
        if let Some((dec, split, filter)) = &mut self.think {
            if filter.hit() {
                return Ok((Vec::new(), true));
            }
            let text = dec.finish(tok)?;
            let (mut r, mut c) = split.push(&text);
            let (r2, c2) = split.finish();
            r.push_str(&r2);
            c.push_str(&c2);
            let (mut out, hit) = Self::think_pieces(r, c, filter);
            if !hit {
                let rest = filter.finish();
                if !rest.is_empty() {
                    out.push(Piece::Content(rest));
                }
            }
            return Ok((out, hit));
        }
        let mut out = Vec::new();
        if let Some((_, reasoning)) = &mut self.harmony {
            let (t, _) = reasoning.finish(tok)?;
            if !t.is_empty() {
                out.push(Piece::Reasoning(t));
            }
        }
        let (t, hit) = self.content.finish(tok)?;
        if !t.is_empty() {
            out.push(Piece::Content(t));
        }
        Ok((out, hit))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// GPT-2's bytes_to_unicode stand-in character of byte `b`.
    fn byte_char(b: u8) -> char {
        let printable = |c: u32| {
            (33..=126).contains(&c) || (161..=172).contains(&c) || (174..=255).contains(&c)
        };
        if printable(b as u32) {
            return char::from_u32(b as u32).expect("latin-1");
        }
        let n = (0..b as u32).filter(|&c| !printable(c)).count() as u32;
        char::from_u32(256 + n).expect("valid")
    }

    /// A byte-level BPE tokenizer whose token i is byte i (no merges), so any multi-byte
    /// character is split across tokens.
    pub(crate) fn byte_tokenizer() -> TextTokenizer {
        byte_tokenizer_with(&[])
    }

    /// [`byte_tokenizer`] plus special tokens `special[k]` with ids `256 + k`.
    pub(crate) fn byte_tokenizer_with(special: &[&str]) -> TextTokenizer {
        let vocab: serde_json::Map<String, Value> = (0..=255u8)
            .map(|b| (byte_char(b).to_string(), Value::from(b as u32)))
            .collect();
        let added: Vec<Value> = special
            .iter()
            .enumerate()
            .map(|(k, t)| {
                json!({"id": 256 + k, "content": t, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let j = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "vocab": vocab, "merges": []}
        });
        TextTokenizer::from_parts(j.to_string().as_bytes(), None, None).expect("tokenizer")
    }

    fn run(stops: &[&str], text: &str) -> (Vec<String>, bool) {
        let tok = byte_tokenizer();
        let ids = tok.encode(text, false).expect("encode");
        assert_eq!(ids.len(), text.len(), "one token per byte");
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut chunks = Vec::new();
        for id in ids {
            let (t, hit) = s.push(&tok, id).expect("push");
            if !t.is_empty() {
                chunks.push(t);
            }
            if hit {
                return (chunks, true);
            }
        }
        let (t, hit) = s.finish(&tok).expect("finish");
        if !t.is_empty() {
            chunks.push(t);
        }
        (chunks, hit)
    }

    #[test]
    fn chunks_never_split_a_character() {
        let text = "héllo → 世界 🎉!";
        let (chunks, hit) = run(&[], text);
        assert!(!hit);
        assert_eq!(chunks.concat(), text);
        assert_eq!(
            chunks.len(),
            text.chars().count(),
            "one chunk per character"
        );
        for c in &chunks {
            assert!(!c.contains('\u{FFFD}'), "broken character in {c:?}");
            assert_eq!(c.chars().count(), 1);
        }
    }

    #[test]
    fn stop_strings_across_tokens() {
        // The stop string arrives one byte at a time; nothing of it is emitted.
        let (chunks, hit) = run(&["世界"], "héllo → 世界 🎉!");
        assert!(hit);
        assert_eq!(chunks.concat(), "héllo → ");
        // A partial match that does not complete is released, in order.
        let (chunks, hit) = run(&["→ 世x"], "a → 世界");
        assert!(!hit);
        assert_eq!(chunks.concat(), "a → 世界");
        // The earliest of several stop strings wins.
        let (chunks, hit) = run(&["lo", "é"], "héllo");
        assert!(hit);
        assert_eq!(chunks.concat(), "h");
        let mut f = StopFilter::new(vec!["".into(), "lo".into(), "él".into(), "é".into()]);
        assert_eq!(f.push("héllo"), ("h".to_string(), true));
        assert_eq!(
            f.matched(),
            Some(2),
            "the first listed of those starting first"
        );
    }

    #[test]
    fn stop_filter_holds_back_only_possible_prefixes() {
        let mut f = StopFilter::new(vec!["END".into(), String::new()]);
        assert_eq!(f.push("abcE"), ("abc".to_string(), false));
        assert_eq!(f.push("N"), (String::new(), false));
        assert_eq!(f.push("x"), ("ENx".to_string(), false));
        assert_eq!(f.push("yEND tail"), ("y".to_string(), true));
        assert_eq!(f.push("more"), (String::new(), true));
        let mut f = StopFilter::new(vec!["ab".into()]);
        assert_eq!(f.push("xa"), ("x".to_string(), false));
        assert_eq!(f.finish(), "a");
        // No stop strings: everything passes at once.
        let mut f = StopFilter::new(Vec::new());
        assert_eq!(f.push("END"), ("END".to_string(), false));
    }

    /// harmony's special tokens (o200k_harmony names), ids 256.. in the byte tokenizer.
    pub(crate) const HARMONY: [&str; 7] = [
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|return|>",
        "<|call|>",
        "<|constrain|>",
    ];

    /// Feeds `reply` token by token, harmony when `harmony`; returns the pieces (adjacent
    /// pieces of one kind joined) and whether a stop string hit.
    fn reply(stops: &[&str], harmony: bool, reply: &str) -> (Vec<Piece>, bool) {
        let format = if harmony {
            let tok = byte_tokenizer_with(&HARMONY);
            ReplyFormat::Harmony(HarmonyTokens::detect(&tok).expect("harmony tokens"))
        } else {
            ReplyFormat::Plain
        };
        reply_with(&HARMONY, stops, format, reply)
    }

    const HARMONY_REPLY: &str = "<|channel|>analysis<|message|>The user asks 2+2. Easy → 4.<|end|>\
        <|start|>assistant<|channel|>final<|message|>2 + 2 = 4. 世界 END ignored<|return|>";

    #[test]
    fn harmony_final_channel_is_the_content() {
        let (pieces, hit) = reply(&[], true, HARMONY_REPLY);
        assert!(!hit);
        assert_eq!(
            pieces,
            vec![
                Piece::Reasoning("The user asks 2+2. Easy → 4.".into()),
                Piece::Content("2 + 2 = 4. 世界 END ignored".into()),
            ]
        );
        // Stop strings cut the content only (the reasoning also holds "4").
        let (pieces, hit) = reply(&["END", "4."], true, HARMONY_REPLY);
        assert!(hit);
        assert_eq!(
            pieces,
            vec![
                Piece::Reasoning("The user asks 2+2. Easy → 4.".into()),
                Piece::Content("2 + 2 = ".into()),
            ]
        );
        // Without harmony (e.g. /v1/completions) the special tokens are skipped and every
        // channel's text is content, as before.
        let (pieces, _) = reply(&[], false, HARMONY_REPLY);
        assert_eq!(
            pieces,
            vec![Piece::Content(
                "analysisThe user asks 2+2. Easy → 4.assistantfinal2 + 2 = 4. 世界 END ignored"
                    .into()
            )]
        );
    }

    /// Feeds `reply` with `format` token by token (tokenizer: bytes plus `special`).
    fn reply_with(
        special: &[&str],
        stops: &[&str],
        format: ReplyFormat,
        reply: &str,
    ) -> (Vec<Piece>, bool) {
        let tok = byte_tokenizer_with(special);
        let r =
            ReplyText::for_tokenizer(&tok, stops.iter().map(|s| s.to_string()).collect(), format);
        feed(&tok, r, reply)
    }

    /// Feeds `reply` token by token into `r`: the pieces (adjacent text of one kind joined) and
    /// whether a stop string hit.
    fn feed(tok: &TextTokenizer, mut r: ReplyText, reply: &str) -> (Vec<Piece>, bool) {
        let mut pieces: Vec<Piece> = Vec::new();
        let mut add = |p: Piece| match (pieces.last_mut(), p) {
            (Some(Piece::Content(a)), Piece::Content(b))
            | (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (_, p) => pieces.push(p),
        };
        for id in tok.encode(reply, false).expect("encode") {
            let (ps, hit) = r.push(tok, id).expect("push");
            ps.into_iter().for_each(&mut add);
            if hit {
                return (pieces, true);
            }
        }
        let (rest, hit) = r.finish(tok).expect("finish");
        rest.into_iter().for_each(&mut add);
        (pieces, hit)
    }

    /// Feeds `reply` with `format` and tools in `syntax` (tokenizer: bytes plus `special`);
    /// returns the pieces (adjacent text of one kind joined).
    fn tool_reply(
        special: &[&str],
        format: ReplyFormat,
        syntax: ToolSyntax,
        reply: &str,
    ) -> Vec<Piece> {
        let tok = byte_tokenizer_with(special);
        let tools = ReplyTools::new(&tok, syntax, ParamTypes::default(), false);
        let r = ReplyText::for_tokenizer(&tok, Vec::new(), format).with_tools(tools);
        feed(&tok, r, reply).0
    }

    fn call(name: &str, args: &str) -> Piece {
        Piece::ToolCall(ParsedCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

    #[test]
    fn tool_calls_out_of_the_content() {
        // Kimi-K2's markers as special tokens (decoding drops them: they are put back).
        let kimi = [
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
        ];
        let text = "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0\
                    <|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|><|tool_calls_section_end|>";
        for special in [&kimi[..], &[][..]] {
            assert_eq!(
                tool_reply(special, ReplyFormat::Plain, ToolSyntax::Kimi, text),
                vec![Piece::Content("Sure.".into()), call("f", "{\"a\":1}")],
                "special {special:?}"
            );
        }
        // A reasoning model: the thoughts never reach the call parser, even when they hold a
        // call's syntax.
        let reply = "<think>maybe <tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call></think>\n\
                     <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            tool_reply(
                &["<think>", "</think>"],
                ReplyFormat::Think { open: false },
                ToolSyntax::Hermes,
                reply
            ),
            vec![
                Piece::Reasoning(
                    "maybe <tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>".into()
                ),
                call("f", "{}")
            ]
        );
        // gpt-oss: a commentary message addressed to a function is the call; malformed
        // arguments are reasoning.
        let tok = byte_tokenizer_with(&HARMONY);
        let harmony = ReplyFormat::Harmony(HarmonyTokens::detect(&tok).unwrap());
        let reply = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary \
                     to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
        assert_eq!(
            tool_reply(&HARMONY, harmony, ToolSyntax::Harmony, reply),
            vec![
                Piece::Reasoning("Need it.".into()),
                call("get_weather", "{\"city\":\"Oslo\"}")
            ]
        );
        let bad = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>";
        assert_eq!(
            tool_reply(&HARMONY, harmony, ToolSyntax::Harmony, bad),
            vec![Piece::Reasoning("{oops".into())]
        );
    }

    #[test]
    fn think_blocks_are_reasoning() {
        let think = ReplyFormat::Think { open: false };
        let reply = "<think>\nThe user wants 2+2 → 4.\n</think>\n\n2 + 2 = 4.";
        // The tags as one token each (here marked special, so decoding would drop them) and as
        // plain text (bytes).
        for special in [&["<think>", "</think>"][..], &[][..]] {
            let (p, hit) = reply_with(special, &[], think, reply);
            assert!(!hit);
            assert_eq!(
                p,
                vec![
                    Piece::Reasoning("\nThe user wants 2+2 → 4.\n".into()),
                    Piece::Content("2 + 2 = 4.".into())
                ],
                "special tokens {special:?}"
            );
        }
        // A prompt that opened the block (DeepSeek-R1's template): the reply starts inside it.
        let (p, _) = reply_with(&[], &[], ReplyFormat::Think { open: true }, "hmm</think>ok");
        assert_eq!(
            p,
            vec![Piece::Reasoning("hmm".into()), Piece::Content("ok".into())]
        );
        // No block: all content; stop strings cut the answer only.
        let (p, _) = reply_with(&[], &[], think, "  plain <think> text");
        assert_eq!(p, vec![Piece::Content("  plain <think> text".into())]);
        let (p, hit) = reply_with(&[], &["4."], think, reply);
        assert!(hit);
        assert_eq!(
            p,
            vec![
                Piece::Reasoning("\nThe user wants 2+2 → 4.\n".into()),
                Piece::Content("2 + 2 = ".into())
            ]
        );
        // Cut off while thinking (max_tokens): what came is reasoning, no content.
        let (p, _) = reply_with(&[], &[], think, "<think>still thinking </thi");
        assert_eq!(p, vec![Piece::Reasoning("still thinking </thi".into())]);
    }

    #[test]
    fn reply_format_from_the_tokenizer_and_prompt() {
        let tok = byte_tokenizer_with(&["<think>", "</think>"]);
        assert_eq!(
            reply_format(&tok, "<|user|>hi<|assistant|>", true),
            ReplyFormat::Think { open: false }
        );
        assert_eq!(
            reply_format(&tok, "<|assistant|><think>\n", true),
            ReplyFormat::Think { open: true }
        );
        assert_eq!(
            reply_format(&tok, "<think>a</think>b<|assistant|>", true),
            ReplyFormat::Think { open: false }
        );
        // A user asking about the tag does not open a block.
        assert_eq!(
            reply_format(&tok, "<|user|>What does <think> do?<|assistant|>", true),
            ReplyFormat::Think { open: false }
        );
        assert_eq!(
            reply_format(&tok, "x", false),
            ReplyFormat::Plain,
            "inline reasoning"
        );
        assert_eq!(
            reply_format(&byte_tokenizer(), "x", true),
            ReplyFormat::Plain
        );
        assert!(matches!(
            reply_format(&byte_tokenizer_with(&HARMONY), "x", true),
            ReplyFormat::Harmony(_)
        ));
    }
}
