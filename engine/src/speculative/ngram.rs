//! Prompt lookup (n-gram drafting): the tokens that followed the most recent earlier
//! occurrence of the sequence's last n tokens are proposed as its next tokens, trying the
//! longest n first. No draft model is needed; it pays where the output repeats its input
//! (rewrites, summaries that quote, code edits). The method is Saxena's "prompt lookup
//! decoding" (2023), as in transformers' `PromptLookupCandidateGenerator` and vLLM's n-gram
//! proposer; unlike transformers (first occurrence) it takes the most recent occurrence, which
//! also follows repetitions inside the output.

/// Default longest n-gram tried.
pub const DEFAULT_MAX_NGRAM: usize = 3;

/// Up to `k` draft tokens for the sequence `tokens` (prompt and output so far, the last token
/// included): for n from `max_ngram` down to 1, the most recent earlier occurrence of the last
/// n tokens proposes the (up to `k`) tokens that followed it. Empty when nothing matches, when
/// `k` is 0 or `tokens` has fewer than 2 tokens.
pub fn propose(tokens: &[u32], max_ngram: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || len < 2 {
        return Vec::new();
    }
    for n in (1..=max_ngram.min(len - 1)).rev() {
        let suffix = &tokens[len - n..];
        // Occurrences starting at i < len - n (an earlier one, possibly overlapping the suffix),
        // most recent first; what follows must exist (i + n < len holds for every such i).
        for i in (0..len - n).rev() {
            if &tokens[i..i + n] == suffix {
                let end = (i + n + k).min(len);
                return tokens[i + n..end].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_most_recent_match_proposes_what_followed() {
        // "1 2 3 9 ... 2 3 7 8 ... 2 3": the bigram "2 3" last occurred before "7 8".
        let t = [1, 2, 3, 9, 5, 2, 3, 7, 8, 4, 2, 3];
        assert_eq!(propose(&t, 3, 2), vec![7, 8]);
        assert_eq!(propose(&t, 3, 10), vec![7, 8, 4, 2, 3]);
        // The trigram "1 2 3" beats the more recent bigram.
        let t = [1, 2, 3, 6, 2, 3, 7, 1, 2, 3];
        assert_eq!(propose(&t, 3, 1), vec![6]);
        assert_eq!(propose(&t, 2, 1), vec![7], "bigram only: most recent");
    }

    #[test]
    fn no_match_or_no_room_proposes_nothing() {
        assert!(propose(&[1, 2, 3, 4], 3, 4).is_empty());
        assert!(propose(&[5], 3, 4).is_empty());
        assert!(propose(&[5, 5, 5], 3, 0).is_empty());
        // A run repeats itself: the overlapping occurrence proposes the run's continuation.
        assert_eq!(propose(&[5, 5, 5], 3, 4), vec![5]);
        assert_eq!(propose(&[4, 5, 5, 5], 1, 4), vec![5]);
    }
}
