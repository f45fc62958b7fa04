//! Layer-major prefill (`Engine::forward` over a prompt of several chunks runs it layer by
//! layer): on every fixture family it gives the same bits as feeding the same chunks one
//! forward call at a time (token-major), for the logits of every row, the last row, and the
//! decode that follows, from an empty cache and after a cached prefix; with a budget of about
//! one layer's experts it reads fewer expert bytes than token-major does.

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::IoPreference;
use coli_tests::{convert_fixture, expected, ids, open_store, FIXTURE_FAMILIES};

/// Token-major reference: every chunk in its own forward call (one chunk: no layer-major).
fn token_major(e: &mut Engine<'_>, ids: &[u32], chunk: usize, which: Logits) -> Vec<Vec<f32>> {
    let parts: Vec<&[u32]> = ids.chunks(chunk).collect();
    let last = parts.len() - 1;
    let mut out = Vec::new();
    for (i, p) in parts.into_iter().enumerate() {
        let mut l = e.forward(p, which).unwrap();
        if which == Logits::Last && i < last {
            l.clear();
        }
        out.append(&mut l);
    }
    out
}

/// The fixture's prompt, repeated to `len` tokens.
fn prompt_of(name: &str, len: usize) -> Vec<u32> {
    let mut prompt = ids(&expected(name)["prompt_ids"]);
    while prompt.len() < len {
        prompt.extend_from_within(..prompt.len().min(len - prompt.len()));
    }
    prompt
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn layer_major_prefill_gives_the_token_major_bits() {
    for name in FIXTURE_FAMILIES {
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        // Long enough for several chunks of 3 after a cached prefix of 4.
        let prompt = prompt_of(name, 14);
        let store = open_store(&dir, true, IoPreference::Auto);
        let opts = EngineOptions {
            ram_budget: Some(u64::MAX),
            prefill_batch: 3,
            threads: Some(2),
            ..Default::default()
        };
        for which in [Logits::All, Logits::Last] {
            let mut lm = Engine::new(&store, &opts).unwrap();
            let mut tm = Engine::new(&store, &opts).unwrap();
            // From an empty cache.
            let a = lm.forward(&prompt, which).unwrap();
            let b = token_major(&mut tm, &prompt, 3, which);
            assert_eq!(a.len(), b.len(), "{name} {which:?}");
            assert!(bits(&a) == bits(&b), "{name} {which:?}: logits differ");
            // The caches then decode the same bits.
            let next = [prompt[1]];
            let a = lm.forward(&next, Logits::Last).unwrap();
            let b = tm.forward(&next, Logits::Last).unwrap();
            assert!(
                bits(&a) == bits(&b),
                "{name} {which:?}: decode after prefill differs"
            );
            assert_eq!(lm.cached_tokens(), tm.cached_tokens());
            // After a cached prefix (an MLA layer expands the cached latents once).
            lm.reset();
            tm.reset();
            lm.forward(&prompt[..4], Logits::Last).unwrap();
            tm.forward(&prompt[..4], Logits::Last).unwrap();
            let a = lm.forward(&prompt[4..], which).unwrap();
            let b = token_major(&mut tm, &prompt[4..], 3, which);
            assert!(
                bits(&a) == bits(&b),
                "{name} {which:?}: logits after a prefix differ"
            );
        }
    }
}

#[test]
fn layer_major_prefill_reads_a_layers_experts_once_per_prompt() {
    let name = "olmoe_fp8";
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let prompt = prompt_of(name, 24);
    let probe = open_store(&dir, true, IoPreference::Auto);
    let layer0: u64 = probe
        .index()
        .iter()
        .filter(|r| r.key().layer == 0)
        .map(|r| r.length.get())
        .sum();
    let all: u64 = probe.index().iter().map(|r| r.length.get()).sum();
    drop(probe);
    // One layer's experts fit; the whole model's do not.
    assert!(layer0 * 2 <= all, "{layer0} of {all}");
    let opts = EngineOptions {
        ram_budget: Some(layer0),
        prefill_batch: 2,
        pin: false,
        prefetch: false,
        threads: Some(1),
        ..Default::default()
    };
    let read = |layer_major: bool| {
        let store = open_store(&dir, true, IoPreference::Auto);
        let mut e = Engine::new(&store, &opts).unwrap();
        let before = store.stats().bytes_read;
        let l = if layer_major {
            e.forward(&prompt, Logits::Last).unwrap()
        } else {
            token_major(&mut e, &prompt, 2, Logits::Last)
        };
        (store.stats().bytes_read - before, bits(&l))
    };
    let (lm_bytes, lm_logits) = read(true);
    let (tm_bytes, tm_logits) = read(false);
    assert!(lm_logits == tm_logits);
    // Layer-major reads each expert at most once here (a layer's experts all fit).
    assert!(
        lm_bytes <= all,
        "layer-major read {lm_bytes} of {all} bytes"
    );
    assert!(
        lm_bytes < tm_bytes,
        "layer-major {lm_bytes} bytes vs token-major {tm_bytes}"
    );
}

/// `Engine::prefill_sequence` (what `coli serve` runs for a lone prompt) gives the bits of
/// `Engine::forward` on a sequence of its own, after a cached prefix too; a stop check that says
/// true ends it with `Stopped` and rolls the sequence back to where it was, and the prefill then
/// runs again to the same bits.
#[test]
fn prefill_sequence_matches_forward_and_stops_cleanly() {
    for name in ["deepseek_v3_fp8", "glm5_fp8", "mixtral_fp8"] {
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let prompt = prompt_of(name, 14);
        let store = open_store(&dir, true, IoPreference::Auto);
        let opts = EngineOptions {
            ram_budget: Some(u64::MAX),
            prefill_batch: 3,
            max_sequences: 3,
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        let want = bits(&e.forward(&prompt, Logits::Last).unwrap());
        e.reset();
        let mut seq = e.new_sequence().unwrap();
        let got = e
            .prefill_sequence(&mut seq, &prompt, Logits::Last, &|| false)
            .unwrap();
        assert!(bits(&got) == want, "{name}: prefill_sequence vs forward");
        assert_eq!(seq.len(), prompt.len());

        // The same split as forward's (MLA computes a one-token chunk in the absorbed form, so
        // the chunking must match for the bits to).
        e.reset();
        e.forward(&prompt[..4], Logits::Last).unwrap();
        let want = bits(&e.forward(&prompt[4..], Logits::Last).unwrap());
        e.reset();
        let mut seq = e.new_sequence().unwrap();
        e.prefill_sequence(&mut seq, &prompt[..4], Logits::Last, &|| false)
            .unwrap();
        let err = e
            .prefill_sequence(&mut seq, &prompt[4..], Logits::Last, &|| true)
            .unwrap_err();
        assert!(
            matches!(err, coli_engine::EngineError::Stopped),
            "{name}: {err}"
        );
        assert_eq!(seq.len(), 4, "{name}: rolled back to the cached prefix");
        let got = e
            .prefill_sequence(&mut seq, &prompt[4..], Logits::Last, &|| false)
            .unwrap();
        assert!(bits(&got) == want, "{name}: after a stop, the same bits");
    }
}

/// Without `--prefill-batch` the engine takes the chunk the memory beside the dense set, the
/// experts, the KV caches and the reserve allows. The expert budget counts only up to what every
/// expert record holds in the cache: the default budget (all the memory left) and an explicit
/// budget larger than the experts leave the same chunk as a budget of exactly the experts (before,
/// both left the smallest chunk, 64 tokens, on every model whose experts fit).
#[test]
fn auto_prefill_chunk_counts_only_what_the_experts_hold() {
    use coli_engine::placement::budget;
    let name = "qwen3_next_bf16";
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let store = open_store(&dir, true, IoPreference::Auto);
    let held = budget::store_held_bytes(&store);
    let available = budget::memory_limit_bytes().expect("MemAvailable is readable on Linux");
    let chunk = |ram_budget: Option<u64>| {
        let opts = EngineOptions {
            ram_budget,
            threads: Some(1),
            ..Default::default()
        };
        let e = Engine::new(&store, &opts).unwrap();
        (e.prefill_batch(), e.context())
    };
    let (exact, context) = chunk(Some(held));
    assert_eq!(chunk(None).0, exact, "the default budget");
    assert_eq!(
        chunk(Some(available)).0,
        exact,
        "a budget of all the memory"
    );
    assert_eq!(chunk(Some(u64::MAX)).0, exact, "an unbounded budget");
    // The fixture's rows take kilobytes: with a few GiB free the chunk is the largest one.
    if available > 4 << 30 {
        let want = budget::MAX_AUTO_PREFILL_CHUNK.min(context);
        assert_eq!(exact, want, "{available} bytes available");
        assert!(want > budget::MIN_AUTO_PREFILL_CHUNK, "context {context}");
    }
}
