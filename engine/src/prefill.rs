//! How a prompt is cut into forward passes (prefill spans).
//!
//! A prompt longer than the prefill chunk (`--prefill-batch`, or the memory plan's choice,
//! [`crate::placement::budget::prefill_chunk`]) runs in several passes. Most layers give the
//! same bits however the prompt is cut, but the gated delta rule layers (Qwen3-Next,
//! Qwen3.5/3.6, Kimi-Linear, GLM-5.3-Flash) run an aligned chunk of [`ALIGN`] positions in
//! their chunkwise form only when it lies inside one pass, and the recurrent form otherwise
//! (docs/ENGINE.md "Determinism"). So for a model with such layers ([`align_for`]) every cut
//! between two passes of a prompt falls on a position that is a multiple of [`ALIGN`]
//! whenever the chunk allows it (a chunk of at least [`ALIGN`] tokens): then which positions
//! run which form depends on where the prompt starts and ends, never on the chunk size, and a
//! different `--ram-budget` (hence a different automatic chunk) or `--prefill-batch` of 64 or
//! more gives the same bits. Other models are cut into plain chunks (their bits do not depend
//! on the cuts). `coli serve`'s one-chunk-per-step prefill cuts at the same positions.

use std::ops::Range;

/// The alignment of cuts between prefill passes of a model with gated delta rule layers,
/// positions: the rule's chunk (`coli_kernels::gated_delta::CHUNK`).
pub const ALIGN: usize = coli_kernels::gated_delta::CHUNK;

/// The cut alignment for `spec`: [`ALIGN`] when it has gated delta rule layers, else 1
/// (plain chunks).
pub fn align_for(spec: &coli_format::ModelSpec) -> usize {
    if spec.gated_delta.is_some() {
        ALIGN
    } else {
        1
    }
}

/// Tokens the next prefill pass takes, of `remaining` prompt tokens from sequence position
/// `pos`, with chunk `chunk` (tokens, at least 1) and cut alignment `align` ([`align_for`]):
/// all of them when they fit in the chunk; else, with `align > 1` and `chunk >= align`, up to
/// the last multiple of `align` within `pos + chunk` (between `chunk - align + 1` and `chunk`
/// tokens), except that a pass of one token becomes `1 + align` (so that no pass but a
/// prompt's last is a single token: MLA runs those in another form, docs/ENGINE.md
/// "Determinism"); else `chunk` tokens.
pub fn next_span(pos: usize, remaining: usize, chunk: usize, align: usize) -> usize {
    let chunk = chunk.max(1);
    if remaining <= chunk {
        return remaining;
    }
    if align <= 1 || chunk < align {
        return chunk;
    }
    let n = (pos + chunk) / align * align - pos;
    if n == 1 {
        (1 + align).min(remaining)
    } else {
        n
    }
}

/// The spans (ranges of indices into the prompt) [`next_span`] cuts a prompt of `len` tokens
/// into when it starts at sequence position `pos`: in order, covering `0..len`, none empty.
pub fn spans(pos: usize, len: usize, chunk: usize, align: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let n = next_span(pos + at, len - at, chunk, align);
        out.push(at..at + n);
        at += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_on_aligned_positions_whatever_the_chunk() {
        // From position 0, 300 tokens: chunk 100 cuts at 64, 128, 192, 256.
        let s = spans(0, 300, 100, ALIGN);
        let ends: Vec<usize> = s.iter().map(|r| r.end).collect();
        assert_eq!(ends, [64, 128, 192, 256, 300]);
        // Chunk 256 from position 37: first cut at 256 (219 tokens), then 512.
        let s = spans(37, 600, 256, ALIGN);
        let cuts: Vec<usize> = s.iter().map(|r| 37 + r.end).collect();
        assert_eq!(cuts, [256, 512, 637]);
        // Every chunk of at least ALIGN: interior cuts aligned, spans within the chunk (one
        // more for a pass that would have been a single token), none a single token but the
        // last.
        for pos in [0, 1, 63, 64, 65, 127, 1000] {
            for chunk in [64, 65, 100, 127, 128, 200, 2048] {
                let s = spans(pos, 1500, chunk, ALIGN);
                assert_eq!(s.first().unwrap().start, 0);
                assert_eq!(s.last().unwrap().end, 1500);
                for w in s.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!((pos + w[0].end).is_multiple_of(ALIGN), "{pos} {chunk}");
                    assert!(w[0].len() > 1, "{pos} {chunk}");
                }
                assert!(s.iter().all(|r| !r.is_empty() && r.len() <= chunk + 1));
            }
        }
        // From position 63 with chunk 64: 65 tokens (to 128), not one.
        assert_eq!(spans(63, 200, 64, ALIGN)[0], 0..65);
        // A prompt within the chunk is one pass; a chunk below ALIGN, or no alignment, cuts
        // plainly.
        assert_eq!(spans(5, 40, 64, ALIGN), vec![0..40]);
        assert_eq!(spans(5, 40, 16, ALIGN), vec![0..16, 16..32, 32..40]);
        assert_eq!(spans(5, 250, 100, 1), vec![0..100, 100..200, 200..250]);
        assert!(spans(0, 0, 16, ALIGN).is_empty());
    }
}
