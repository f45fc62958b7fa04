//! Generated text for streaming: whole UTF-8 characters only (through
//! [`coli_engine::StreamDecoder`]) and stop strings applied across token boundaries, holding back
//! any tail that may still become a stop string; for a model that answers in OpenAI's harmony
//! format (gpt-oss), the final channel as the content and the other channels as reasoning
//! ([`ReplyText`]).

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
}

/// The text of one choice: every token into one [`TextStream`], or, for a harmony reply, the
/// final channel's tokens into the content stream (stop strings apply to it) and the other
/// channels' into a reasoning stream (no stop strings), the format's special tokens and headers
/// into neither ([`HarmonyParser`]).
pub struct ReplyText {
    content: TextStream,
    harmony: Option<(HarmonyParser, TextStream)>,
}

impl ReplyText {
    /// A reply applying `stops` to its content; `harmony` when the request is a chat with a
    /// model whose tokenizer has the harmony tokens.
    pub fn new(stops: Vec<String>, harmony: Option<HarmonyTokens>) -> ReplyText {
        ReplyText {
            content: TextStream::new(stops),
            harmony: harmony.map(|t| (HarmonyParser::new(t), TextStream::new(Vec::new()))),
        }
    }

    /// Adds generated token `id`; returns the piece to send (if any) and whether a stop string
    /// ended generation.
    ///
    /// # Errors
    /// The tokenizer's decode error (an id outside its vocabulary).
    pub fn push(
        &mut self,
        tok: &TextTokenizer,
        id: u32,
    ) -> coli_engine::Result<(Option<Piece>, bool)> {
        let routed = match &mut self.harmony {
            Some((parser, _)) => parser.push(tok, id)?,
            None => Routed::Final,
        };
        Ok(match (routed, &mut self.harmony) {
            (Routed::Final, _) => {
                let (t, hit) = self.content.push(tok, id)?;
                ((!t.is_empty()).then_some(Piece::Content(t)), hit)
            }
            (Routed::Reasoning, Some((_, reasoning))) => {
                let (t, _) = reasoning.push(tok, id)?;
                ((!t.is_empty()).then_some(Piece::Reasoning(t)), false)
            }
            _ => (None, false),
        })
    }

    /// The index (in the `stops` given to [`ReplyText::new`]) of the stop string that ended
    /// the content, if one did.
    pub fn matched_stop(&self) -> Option<usize> {
        self.content.matched()
    }

    /// End of generation: the rest of the reasoning and content, and whether the content
    /// completed a stop string.
    ///
    /// # Errors
    /// As [`ReplyText::push`].
    pub fn finish(&mut self, tok: &TextTokenizer) -> coli_engine::Result<(Vec<Piece>, bool)> {
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

    /// Feeds `reply` token by token; returns the pieces (adjacent pieces of one kind joined)
    /// and whether a stop string hit.
    fn reply(stops: &[&str], harmony: bool, reply: &str) -> (Vec<Piece>, bool) {
        let tok = byte_tokenizer_with(&HARMONY);
        let t = harmony.then(|| HarmonyTokens::detect(&tok).expect("harmony tokens"));
        let mut r = ReplyText::new(stops.iter().map(|s| s.to_string()).collect(), t);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut add = |p: Piece| match (pieces.last_mut(), p) {
            (Some(Piece::Content(a)), Piece::Content(b))
            | (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (_, p) => pieces.push(p),
        };
        for id in tok.encode(reply, false).expect("encode") {
            let (p, hit) = r.push(&tok, id).expect("push");
            if let Some(p) = p {
                add(p);
            }
            if hit {
                let (rest, _) = r.finish(&tok).expect("finish");
                rest.into_iter().for_each(&mut add);
                return (pieces, true);
            }
        }
        let (rest, hit) = r.finish(&tok).expect("finish");
        rest.into_iter().for_each(&mut add);
        (pieces, hit)
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
}
