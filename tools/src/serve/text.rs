//! Generated text for streaming: whole UTF-8 characters only (through
//! [`coli_engine::StreamDecoder`]) and stop strings applied across token boundaries, holding back
//! any tail that may still become a stop string.

use coli_engine::{StreamDecoder, TextTokenizer};

/// Cuts generated text at the first stop string, releasing text only once no stop string can
/// start inside it.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    pending: String,
    hit: bool,
}

impl StopFilter {
    /// A filter for `stops` (non-empty strings; an empty list passes everything through).
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            hit: false,
        }
    }

    /// Whether a stop string was seen.
    pub fn hit(&self) -> bool {
        self.hit
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
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.hit = true;
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
                self.stops.iter().any(|s| s.starts_with(tail))
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
        let vocab: serde_json::Map<String, Value> = (0..=255u8)
            .map(|b| (byte_char(b).to_string(), Value::from(b as u32)))
            .collect();
        let j = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
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
}
