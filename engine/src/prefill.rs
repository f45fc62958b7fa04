//! How a prompt is cut into forward passes (prefill spans).
//!
//! A prompt longer than the prefill chunk (`--prefill-batch`, or the memory plan's choice,
//! [`crate::placement::budget::prefill_chunk`]) runs in several passes. Most layers give the
//! same bits however the prompt is cut, but the gated delta rule layers (Qwen3-Next,
//! Qwen3.5/3.6, Kimi-Linear, GLM-5.3-Flash) run an aligned chunk of [`ALIGN`] positions in
//! their chunkwise form only when it lies inside one pass, and the recurrent form otherwise
//! (docs/ENGINE.md "Determinism"). So every cut between two passes of a prompt falls on a
//! position that is a multiple of [`ALIGN`] whenever the chunk allows it (a chunk of at least
//! [`ALIGN`] tokens): then which positions run which form depends on where the prompt starts
//! and ends, never on the chunk size, and a different `--ram-budget` (hence a different
//! automatic chunk) or `--prefill-batch` of 64 or more gives the same bits. `coli serve`'s
//! one-chunk-per-step prefill cuts at the same positions.

use std::ops::Range;

/// The alignment of cuts between prefill passes, positions: the gated delta rule's chunk
/// (`coli_kernels::gated_delta::CHUNK`).
pub const ALIGN: usize = coli_kernels::gated_delta::CHUNK;

/// Tokens the next prefill pass takes, of `remaining` prompt tokens from sequence position
/// `pos`, with chunk `chunk` (tokens, at least 1): all of them when they fit in the chunk;
/// otherwise up to the last multiple of [`ALIGN`] within `pos + chunk` when `chunk >= ALIGN`
/// (between `chunk - ALIGN + 1` and `chunk` tokens), or `chunk` tokens for a smaller chunk.
pub fn next_span(pos: usize, remaining: usize, chunk: usize) -> usize {
    let chunk = chunk.max(1);
    if remaining <= chunk {
        return remaining;
    }
    if chunk < ALIGN {
        return chunk;
    }
    let end = (pos + chunk) / ALIGN * ALIGN;
    end - pos
}

/// The spans (ranges of indices into the prompt) [`next_span`] cuts a prompt of `len` tokens
/// into when it starts at sequence position `pos`: in order, covering `0..len`, none empty.
pub fn spans(pos: usize, len: usize, chunk: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let n = next_span(pos + at, len - at, chunk);
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
        let s = spans(0, 300, 100);
        let ends: Vec<usize> = s.iter().map(|r| r.end).collect();
        assert_eq!(ends, [64, 128, 192, 256, 300]);
        // Chunk 256 from position 37: first cut at 256 (219 tokens), then 512.
        let s = spans(37, 600, 256);
        let cuts: Vec<usize> = s.iter().map(|r| 37 + r.end).collect();
        assert_eq!(cuts, [256, 512, 637]);
        // Every chunk of at least ALIGN: interior cuts aligned, spans within the chunk.
        for pos in [0, 1, 63, 64, 65, 1000] {
            for chunk in [64, 65, 100, 127, 128, 200, 2048] {
                let s = spans(pos, 1500, chunk);
                assert_eq!(s.first().unwrap().start, 0);
                assert_eq!(s.last().unwrap().end, 1500);
                for w in s.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!((pos + w[0].end).is_multiple_of(ALIGN), "{pos} {chunk}");
                }
                assert!(s.iter().all(|r| !r.is_empty() && r.len() <= chunk));
            }
        }
        // A prompt within the chunk is one pass; a chunk below ALIGN cuts plainly.
        assert_eq!(spans(5, 40, 64), vec![0..40]);
        assert_eq!(spans(5, 40, 16), vec![0..16, 16..32, 32..40]);
        assert!(spans(0, 0, 16).is_empty());
    }
}
