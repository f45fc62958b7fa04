//! The engine against transformers on the tiny fixtures (tests/fixtures/tiny/<name>/): each
//! checkpoint is converted with `coli_convert` into a temporary store (lossless and the default
//! int4-g64), then greedy tokens, last-position logits and teacher-forced top-1 are compared
//! with `expected.json`; placement (expert budget, threads, checksum verification, I/O mode,
//! prefill batch) must not change the tokens.

use coli_engine::{Engine, EngineOptions, GenerateParams, Logits, SamplingParams};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{convert_fixture, expected, greedy, ids, open_store as open};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

const FAMILIES: [&str; 17] = [
    "mixtral_fp8",
    "qwen3_moe_fp8",
    "olmoe_fp8",
    "qwen3_moe_bf16",
    "gpt_oss_mxfp4",
    "gpt_oss_bf16",
    "minimax_m2_fp8",
    "inkling_bf16",
    "inkling2_bf16",
    "inkling2_mxfp8",
    "qwen3_next_bf16",
    "qwen3_5_moe_bf16",
    "kimi_linear_bf16",
    "kimi_k3_mxfp4",
    "glm5_next_bf16",
    "deepseek_v4_bf16",
    "deepseek_v4_fp8",
];

/// Converted stores by (fixture, variant): the temp dir (kept alive) and the store path.
type StoreDirs = HashMap<(String, String), (tempfile::TempDir, PathBuf)>;

/// Converted stores, once per (fixture, variant) per test binary; the temp dirs live until exit.
fn store_dir(name: &str, variant: &str) -> PathBuf {
    static DIRS: OnceLock<Mutex<StoreDirs>> = OnceLock::new();
    let mut map = DIRS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (name.to_string(), variant.to_string());
    if let Some((_, p)) = map.get(&key) {
        return p.clone();
    }
    let (tmp, out) = convert_fixture(name, variant);
    map.insert(key, (tmp, out.clone()));
    out
}

#[test]
fn lossless_stores_match_transformers() {
    for name in FAMILIES {
        let exp = expected(name);
        let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let prompt = ids(&exp["prompt_ids"]);
        assert_eq!(
            greedy(&mut e, &prompt, 32),
            ids(&exp["greedy_lossless"]),
            "{name}: greedy 32 tokens"
        );

        e.reset();
        let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
        let want: Vec<f32> = exp["last_logits_lossless"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        // A padded output head (Inkling's unpadded_vocab_size): the rows past the logits are
        // -inf, transformers drops them.
        assert!(last.len() >= want.len(), "{name}: {} logits", last.len());
        assert!(
            last[want.len()..].iter().all(|&x| x == f32::NEG_INFINITY),
            "{name}: padded logits must be -inf"
        );
        let max_diff = last
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max_diff < 1e-3, "{name}: last logits differ by {max_diff}");

        let teacher = ids(&exp["teacher_ids"]);
        let top1: Vec<u32> = e
            .forward_logits(&teacher)
            .unwrap()
            .iter()
            .map(|l| coli_engine::sampling::argmax(l))
            .collect();
        assert_eq!(
            top1,
            ids(&exp["teacher_top1_lossless"]),
            "{name}: teacher-forced top-1"
        );
    }
}

/// Inkling's chained MTP layers (`model.mtp.layers.{k}`) against transformers' `MtpModel`:
/// every depth's top-1 over the positions and its last row's logits, from the main hidden
/// states transformers computed.
#[test]
fn inkling_mtp_chain_matches_transformers() {
    let name = "inkling_bf16";
    let exp = expected(name);
    let m = &exp["mtp"];
    let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(e.has_mtp(), "the store holds the MTP layers");
    let hidden: Vec<f32> = m["main_hidden"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(coli_tests::floats)
        .collect();
    let depths = e.mtp_chain_logits(&hidden, &ids(&m["next_ids"])).unwrap();
    let want = m["depths"].as_array().unwrap();
    assert_eq!(depths.len(), want.len(), "one logits set per MTP layer");
    for (d, (rows, w)) in depths.iter().zip(want).enumerate() {
        assert_eq!(
            coli_tests::top1(rows),
            ids(&w["top1"]),
            "MTP depth {d}: top-1"
        );
        let diff =
            coli_tests::max_abs_diff(rows.last().unwrap(), &coli_tests::floats(&w["last_logits"]));
        assert!(diff < 1e-3, "MTP depth {d}: last logits differ by {diff}");
    }
    // A wrong id count is refused, naming what is needed.
    let err = e
        .mtp_chain_logits(&hidden, &[1, 2])
        .unwrap_err()
        .to_string();
    assert!(err.contains("need"), "{err}");
}

/// The Qwen3-Next and Qwen3.5 MTP layers (`mtp.*`, vLLM's `qwen3_next_mtp.py` /
/// `qwen3_5_mtp.py`) against transformers' `MtpModel` around the family's decoder layer (the
/// fixture scripts check it against the vLLM composition): top-1 at every position and the last
/// row's logits from the main hidden states transformers computed, as stored (`--mtp bf16`) and
/// with the default `--mtp int8` (the oracle quantizes the same tensors).
#[test]
fn hybrid_mtp_layers_match_transformers() {
    for name in ["qwen3_next_bf16", "qwen3_5_moe_bf16"] {
        let exp = expected(name);
        let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        coli_tests::check_mtp(&mut e, &exp, &exp["mtp"], &format!("{name} lossless"));
        let store = open(&store_dir(name, "int4_store"), true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        coli_tests::check_mtp(&mut e, &exp, &exp["mtp_int8"], &format!("{name} int8 MTP"));
    }
}

/// Inkling on a prompt far longer than its window: the sliding layers drop the keys and every
/// layer the convolution inputs no later position reads, and the tokens are still
/// transformers' whatever the prefill chunking, thread count, expert budget or speculation;
/// the state holds far less than every row; a rollback into what was dropped starts over.
#[test]
fn inkling_long_sequences_drop_old_rows_and_match_transformers() {
    inkling_long_sequences("inkling_bf16");
}

/// As for Inkling, Inkling 2 (the same per-position state under its attention residuals;
/// n-gram drafting where Inkling drafts with its MTP layers, which Inkling 2 has none of).
#[test]
fn inkling2_long_sequences_drop_old_rows_and_match_transformers() {
    inkling_long_sequences("inkling2_bf16");
}

fn inkling_long_sequences(name: &str) {
    let exp = expected(name);
    let dir = store_dir(name, "lossless_store");
    let prompt = ids(&exp["long_prompt_ids"]);
    let want = ids(&exp["greedy_long_lossless"]);
    let one = {
        let s = open(&dir, true, IoPreference::Auto);
        let l = s.manifest().expert_layers[0].layer;
        s.fetch_one(ExpertKey::new(l, 0)).unwrap().len_bytes() as u64
    };
    for (batch, token_major, threads, budget, mode) in [
        (0, false, 2, None, coli_engine::Speculate::Off),
        (16, false, 1, Some(one), coli_engine::Speculate::Off),
        (16, true, 2, None, coli_engine::Speculate::Ngram),
        (64, false, 2, Some(one), coli_engine::Speculate::Mtp),
    ] {
        let mode = match mode {
            coli_engine::Speculate::Mtp if exp.get("mtp").is_none() => {
                coli_engine::Speculate::Ngram
            }
            m => m,
        };
        let what = format!("{name}: prefill batch {batch} token-major {token_major} threads {threads} budget {budget:?} {mode:?}");
        let store = open(&dir, false, IoPreference::Auto);
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                prefill_batch: batch,
                token_major_prefill: token_major,
                threads: Some(threads),
                ram_budget: budget,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let params = GenerateParams {
            max_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop_on_eos: false,
            speculation: coli_engine::SpeculationParams {
                mode,
                draft_tokens: 4,
                gate: false,
                ..Default::default()
            },
        };
        let got = e.generate(&prompt, &params, |_| Ok(true)).unwrap().tokens;
        assert_eq!(got, want, "{what}");
        // No more than the memory plan counts for this many positions, which is far less than
        // every row of every layer (keys, values, convolution inputs).
        let state = e.own_state();
        let n = state.len();
        let spec = e.spec();
        let ink = spec.inkling.as_ref().unwrap();
        let every_row: usize = (0..spec.num_layers)
            .map(|l| {
                let d = ink.layer_dims(spec, l);
                n * (4 * d.kv_heads * d.head_dim + 2 * spec.hidden_size)
            })
            .sum();
        let planned = 4 * ink.kv_values(spec, n) as u64;
        if mode != coli_engine::Speculate::Mtp {
            // (The MTP layer's own state is not part of the plan.)
            assert!(
                state.bytes() <= planned,
                "{what}: {} bytes held for {n} positions, {planned} planned",
                state.bytes()
            );
        }
        let every_row_bytes = 4 * every_row as u64;
        assert!(
            planned * 3 < 2 * every_row_bytes,
            "{what}: {planned} planned, {every_row_bytes} for every row"
        );
        // What was dropped cannot be given back: a shorter prefix is not offered, and the
        // engine starts over from an edited early token instead of reusing a wrong state.
        assert!(!state.can_truncate(20) && state.can_truncate(0), "{what}");
        assert!(
            state.can_truncate(n as usize - 8),
            "{what}: a short rollback stays exact"
        );
        let mut edited = prompt.clone();
        edited[20] = (edited[20] + 1) % 500;
        let _ = e.generate(&edited, &params, |_| Ok(true)).unwrap();
        let again = e.generate(&prompt, &params, |_| Ok(true)).unwrap().tokens;
        assert_eq!(again, want, "{what}: after an edit in the dropped part");
    }
    // A prefill drops rows chunk by chunk: right after it (no decode yet) the state is within
    // the plan, whatever the chunking.
    for batch in [16, 256] {
        let store = open(&dir, false, IoPreference::Auto);
        let opts = EngineOptions {
            prefill_batch: batch,
            ..EngineOptions::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        e.forward(&prompt, Logits::Last).unwrap();
        let n = prompt.len();
        let planned = 4 * e.spec().inkling.as_ref().unwrap().kv_values(e.spec(), n) as u64;
        let held = e.own_state().bytes();
        assert!(
            held <= planned,
            "prefill batch {batch}: {held} bytes, {planned} planned"
        );
    }
    // A long prefill after cached tokens that is stopped rolls back exactly to them (its start
    // is pinned), and the conversation then continues as if never stopped.
    stopped_prefill_rolls_back(&dir, &prompt);
    // The last logits of the long prompt.
    let store = open(&dir, true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let d = coli_tests::max_abs_diff(
        &last,
        &coli_tests::floats(&exp["last_logits_long_lossless"]),
    );
    assert!(d < 1e-3, "long prompt: last logits differ by {d}");
}

/// Qwen3-Next's Gated DeltaNet layers over a prompt of 150 tokens (two whole aligned chunks of
/// 64 and a tail): the chunkwise form in a whole-prompt prefill, the recurrent form token by
/// token and in chunks of 16; greedy tokens and last logits as transformers computes them,
/// whatever the prefill chunking, threads, expert budget or speculation; a state of fixed size
/// besides the full layers' keys and values; rollbacks exact where the state allows them.
#[test]
fn qwen3_next_long_prompt_runs_both_forms_and_matches_transformers() {
    hybrid_long_prompt("qwen3_next_bf16");
}

/// The same for Qwen3.5-MoE (split Gated DeltaNet projections, nested published layout; the
/// oracle's multimodal RoPE on text positions).
#[test]
fn qwen3_5_moe_long_prompt_runs_both_forms_and_matches_transformers() {
    hybrid_long_prompt("qwen3_5_moe_bf16");
}

/// The same for Kimi-Linear: Kimi Delta Attention (one decay per key channel; both forms of
/// `coli_kernels::kda`) beside MLA layers without RoPE.
#[test]
fn kimi_linear_long_prompt_runs_both_forms_and_matches_transformers() {
    hybrid_long_prompt("kimi_linear_bf16");
}

/// The same for Kimi K3 (the release's layout: MXFP4 experts kept bit for bit): KDA with the
/// full-rank gate and the bounded decay, gated NoPE MLA, attention residuals over blocks of two
/// layers, the latent MoE with SiTU experts; the oracle a torch transcription of the official
/// pieces held to llama.cpp's `kimi-k3.cpp` (`make_kimi_k3_fixtures.py`).
#[test]
fn kimi_k3_long_prompt_runs_both_forms_and_matches_the_oracle() {
    hybrid_long_prompt("kimi_k3_mxfp4");
}

/// The same for GLM-5.3-Flash: four residual streams mixed by hyper-connections, KDA with the
/// safe forget gate, DSA layers whose k-pool indexer selects 4 of 37 pools (and a shared layer).
#[test]
fn glm5_next_long_prompt_runs_both_forms_and_matches_transformers() {
    hybrid_long_prompt("glm5_next_bf16");
}

/// DeepSeek-V4 over a prompt of 150 tokens: a window of 8 positions, 37 CSA blocks of which the
/// indexer picks 3 per query, 18 HCA blocks, four streams, hash-routed layers. Greedy tokens and
/// last logits as transformers computes them, and the same bits whatever the prefill chunking
/// (a block closing inside or across chunks), threads, expert budget or speculation; the state
/// holds the window, the open blocks' rows and one entry per closed block; every prefix from
/// its last 64 positions on is exact (a rollback), a stopped prefill rolls back exactly.
#[test]
fn deepseek_v4_long_prompt_matches_transformers_whatever_the_placement() {
    for name in ["deepseek_v4_bf16", "deepseek_v4_fp8"] {
        deepseek_v4_long_prompt(name);
    }
}

/// [`deepseek_v4_long_prompt_matches_transformers_whatever_the_placement`] of one fixture (the
/// release layout's lossless store: FP4 experts as mxfp4, FP8 dense).
fn deepseek_v4_long_prompt(name: &str) {
    let (dir, prompt, runs) = long_prompt_runs(name, 7, |_| {});
    for (what, _, state) in &runs {
        // Windows and compressor rows keep 64 positions of slack: any of them is a rollback.
        let n = state.len();
        assert!(state.can_truncate(n - 8) && state.can_truncate(0), "{what}");
    }
    for (what, last, _) in &runs[1..] {
        assert_eq!(&runs[0].1, last, "{what}: the chunking changed the bits");
    }
    stopped_prefill_rolls_back(&dir, &prompt);
}

/// Fixture `name`'s long prompt (`long_prompt_ids`, lossless store) under four placements
/// (prefill batch 256, 16, 1 token-major, `batch`; threads 1 or 2; an expert budget of one
/// record or the default; speculation off or n-gram), each engine set up by `setup`: last
/// logits within 1e-3 of transformers', `greedy_long_lossless` generated, the state no larger
/// than the KV accounting says. Returns the store, the prompt and per placement its name, last
/// logits and the state after generating.
#[allow(clippy::type_complexity)]
fn long_prompt_runs(
    name: &str,
    batch: usize,
    setup: impl Fn(&mut Engine<'_>),
) -> (
    PathBuf,
    Vec<u32>,
    Vec<(String, Vec<f32>, coli_engine::KvState)>,
) {
    let exp = expected(name);
    let dir = store_dir(name, "lossless_store");
    let prompt = ids(&exp["long_prompt_ids"]);
    let want = ids(&exp["greedy_long_lossless"]);
    let one = {
        let s = open(&dir, true, IoPreference::Auto);
        let l = s.manifest().expert_layers[0].layer;
        s.fetch_one(ExpertKey::new(l, 0)).unwrap().len_bytes() as u64
    };
    let mut runs = Vec::new();
    for (batch, token_major, threads, budget, mode) in [
        (256, false, 2, None, coli_engine::Speculate::Off),
        (16, false, 1, Some(one), coli_engine::Speculate::Off),
        (1, true, 2, None, coli_engine::Speculate::Ngram),
        (batch, false, 2, Some(one), coli_engine::Speculate::Ngram),
    ] {
        let what = format!(
            "{name}: prefill batch {batch} token-major {token_major} threads {threads} budget {budget:?} {mode:?}"
        );
        let store = open(&dir, false, IoPreference::Auto);
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                prefill_batch: batch,
                token_major_prefill: token_major,
                threads: Some(threads),
                ram_budget: budget,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        setup(&mut e);
        let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
        let d = coli_tests::max_abs_diff(
            &last,
            &coli_tests::floats(&exp["last_logits_long_lossless"]),
        );
        assert!(d < 1e-3, "{what}: last logits differ by {d}");
        e.reset();
        let params = GenerateParams {
            max_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop_on_eos: false,
            speculation: coli_engine::SpeculationParams {
                mode,
                draft_tokens: 4,
                gate: false,
                ..Default::default()
            },
        };
        let got = e.generate(&prompt, &params, |_| Ok(true)).unwrap().tokens;
        assert_eq!(got, want, "{what}");
        // What grows with the sequence, plus the bounded rest (windows, convolution rows,
        // recurrent states).
        let state = e.own_state();
        let n = state.len() as u64;
        let bounded = e.kv_bytes_per_sequence() - e.kv_bytes_per_token() * e.context() as u64;
        assert!(
            state.bytes() <= e.kv_bytes_per_token() * n + bounded,
            "{what}: {} bytes held for {n} positions",
            state.bytes()
        );
        runs.push((what, last, state));
    }
    (dir, prompt, runs)
}

fn hybrid_long_prompt(name: &str) {
    // MLA layers (Kimi-Linear) decode in their expanded form here, as they prefill: the
    // comparison of chunkings below is then about the recurrent layers alone (the absorbed form
    // rounds differently, docs/ENGINE.md "Determinism").
    let (dir, prompt, runs) = long_prompt_runs(name, 100, |e| e.set_absorbed_decode(false));
    for (what, _, state) in &runs {
        // A recurrent state is exact at its length only: a shorter prefix is not offered.
        let n = state.len();
        assert!(
            !state.can_truncate(n - 8) && state.can_truncate(0),
            "{what}"
        );
    }
    let lasts: Vec<&Vec<f32>> = runs.iter().map(|r| &r.1).collect();
    // The chunkwise and recurrent forms round differently (1e-6 relative), never by more
    // than the oracle's tolerance; the same chunking gives the same bits.
    // (A whole-prompt prefill runs positions 0..128 in the chunkwise form: its bits differ.)
    let spread = coli_tests::max_abs_diff(lasts[0], lasts[2]);
    assert!(spread < 1e-4, "forms differ by {spread}");
    assert_ne!(lasts[0], lasts[2], "the chunkwise form ran");
    assert_eq!(
        lasts[1], lasts[2],
        "16-row spans and single rows: both recurrent"
    );
    // A chunk of 100 cuts the prompt at 64 and 128 (`coli_engine::prefill`): positions 0..128
    // run the chunkwise form as in one pass of 256, so the bits are the same (before the cuts
    // were aligned, 100 gave spans 0..100 and 100..150 and other bits: a `--ram-budget` that
    // changed the automatic chunk changed the logits).
    assert_eq!(lasts[0], lasts[3], "prefill batch 100 vs 256");
    aligned_cuts_keep_the_bits(&dir, &prompt);
    // A long prefill after cached tokens that is stopped rolls back exactly to them (its start
    // is pinned), and then gives the bits of an uninterrupted prefill.
    stopped_prefill_rolls_back(&dir, &prompt);
}

/// After 37 cached positions (not a multiple of 64), the rest of `prompt` prefilled with chunks
/// of 64, 100, 192 and 2048 tokens (one pass) gives every row's logits bit for bit alike,
/// through `Engine::forward` (layer-major and token-major) and `Engine::prefill_sequence`.
fn aligned_cuts_keep_the_bits(dir: &std::path::Path, prompt: &[u32]) {
    let store = open(dir, false, IoPreference::Auto);
    let (head, tail) = prompt.split_at(37);
    let mut rows: Vec<(String, Vec<Vec<f32>>)> = Vec::new();
    for (batch, token_major) in [(2048, false), (64, false), (100, false), (192, true)] {
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                prefill_batch: batch,
                token_major_prefill: token_major,
                max_sequences: 2,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        e.set_absorbed_decode(false);
        e.forward(head, Logits::Last).unwrap();
        let all = e.forward(tail, Logits::All).unwrap();
        rows.push((
            format!("forward, batch {batch} token-major {token_major}"),
            all,
        ));
        let mut seq = e.new_sequence().unwrap();
        e.prefill_sequence(&mut seq, head, Logits::Last, &|| false)
            .unwrap();
        let all = e
            .prefill_sequence(&mut seq, tail, Logits::All, &|| false)
            .unwrap();
        rows.push((format!("prefill_sequence, batch {batch}"), all));
    }
    for (what, got) in &rows[1..] {
        assert_eq!(got.len(), tail.len(), "{what}");
        for (i, (a, b)) in rows[0].1.iter().zip(got).enumerate() {
            assert_eq!(a, b, "{what}: position {} differs from one pass", 37 + i);
        }
    }
}

/// Prefills `prompt[..120]` in chunks of 16, stops a prefill of the rest at its first check:
/// the sequence must be back at the 120 cached tokens, and prefilling the rest then must give
/// the bits of an uninterrupted prefill of the whole prompt.
fn stopped_prefill_rolls_back(dir: &std::path::Path, prompt: &[u32]) {
    let store = open(dir, false, IoPreference::Auto);
    let opts = EngineOptions {
        prefill_batch: 16,
        max_sequences: 2,
        ..EngineOptions::default()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    let (head, tail) = prompt.split_at(120);
    let mut seq = e.new_sequence().unwrap();
    e.prefill_sequence(&mut seq, head, Logits::Last, &|| false)
        .unwrap();
    let stopped = e.prefill_sequence(&mut seq, tail, Logits::Last, &|| true);
    assert!(
        matches!(stopped, Err(coli_engine::EngineError::Stopped)),
        "{stopped:?}"
    );
    assert_eq!(seq.tokens(), head, "rolled back to the cached tokens");
    let a = e
        .prefill_sequence(&mut seq, tail, Logits::Last, &|| false)
        .unwrap();
    let mut fresh = e.new_sequence().unwrap();
    let b = e
        .prefill_sequence(&mut fresh, prompt, Logits::Last, &|| false)
        .unwrap();
    assert_eq!(
        a.last().unwrap(),
        b.last().unwrap(),
        "the same bits after a stopped prefill"
    );
}

#[test]
fn int4_stores_match_transformers() {
    for name in FAMILIES {
        let exp = expected(name);
        let store = open(&store_dir(name, "int4_store"), true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let got = greedy(&mut e, &ids(&exp["prompt_ids"]), 32);
        assert_eq!(
            got,
            ids(&exp["greedy_int4_g64"]),
            "{name}: int4-g64 greedy 32 tokens"
        );
    }
}

#[test]
fn placement_never_changes_tokens() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let dir = store_dir(name, "int4_store");
    let want = ids(&exp["greedy_int4_g64"]);
    let prompt = ids(&exp["prompt_ids"]);

    let probe = open(&dir, true, IoPreference::Auto);
    let layers = &probe.manifest().expert_layers;
    let total_experts: u64 = layers.iter().map(|l| l.num_experts as u64).sum();
    let one = probe
        .fetch_one(ExpertKey::new(layers[0].layer, 0))
        .unwrap()
        .len_bytes() as u64;
    let all = one * total_experts;
    drop(probe);

    for (budget, threads, verify, io, batch) in [
        (Some(one), 1, true, IoPreference::Auto, 32),
        (Some(all / 4), 2, false, IoPreference::Buffered, 32),
        (Some(all), 2, true, IoPreference::Auto, 3),
        (None, 1, false, IoPreference::Buffered, 1),
        (Some(one), 2, false, IoPreference::Buffered, 5),
    ] {
        let store = open(&dir, verify, io);
        let opts = EngineOptions {
            ram_budget: budget,
            threads: Some(threads),
            context: None,
            prefill_batch: batch,
            preload: false,
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        let params = GenerateParams {
            max_tokens: 32,
            sampling: SamplingParams::default(),
            stop_on_eos: true,
            speculation: Default::default(),
        };
        let g = e.generate(&prompt, &params, |_| Ok(true)).unwrap();
        let what =
            format!("budget {budget:?} threads {threads} verify {verify} io {io:?} batch {batch}");
        assert_eq!(g.tokens, want, "{what}");
        let s = e.cache_stats();
        assert!(s.misses > 0 && s.bytes_fetched > 0, "{what}: {s:?}");
        assert!(store.stats().bytes_read > 0, "{what}");
        assert_eq!(
            g.stats.expert_bytes_read,
            store.stats().bytes_read,
            "{what}"
        );
        if budget.is_some_and(|b| b < all) {
            assert!(s.evictions > 0, "{what}: {s:?}");
            assert!(s.hit_rate() < 1.0, "{what}: {s:?}");
        } else {
            assert_eq!(s.evictions, 0, "{what}");
            // Every expert is read from disk at most once when they all fit.
            assert!(s.misses <= total_experts, "{what}: {s:?}");
            assert!(s.hits > 0, "{what}: {s:?}");
        }
        let (cap, used) = e.cache_usage();
        assert!(used <= cap, "{what}");
    }
}

#[test]
fn kv_cache_reuse_and_decode_agree_with_full_recompute() {
    let name = "qwen3_moe_fp8";
    let exp = expected(name);
    let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let teacher = ids(&exp["teacher_ids"]);
    let full = e.forward_logits(&teacher).unwrap();
    // Same positions fed one token at a time (decode path) give bit-identical logits.
    e.reset();
    for (t, &id) in teacher.iter().enumerate() {
        let l = e.forward(&[id], Logits::Last).unwrap().pop().unwrap();
        assert_eq!(l, full[t], "position {t}");
    }
    // A second generate with a longer prompt reuses the cached prefix and gives the same tokens
    // as a fresh engine.
    let prompt = ids(&exp["prompt_ids"]);
    let first = greedy(&mut e, &prompt, 4);
    let mut longer = prompt.clone();
    longer.extend_from_slice(&first);
    e.reset();
    greedy(&mut e, &prompt, 4);
    let params = GenerateParams {
        max_tokens: 6,
        sampling: SamplingParams::default(),
        stop_on_eos: true,
        speculation: Default::default(),
    };
    let g = e.generate(&longer, &params, |_| Ok(true)).unwrap();
    assert!(
        g.stats.prompt_tokens < longer.len(),
        "the cached prefix was reused: {}",
        g.stats.prompt_tokens
    );
    let mut fresh = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert_eq!(g.tokens, greedy(&mut fresh, &longer, 6));
}

#[test]
fn bad_inputs_are_clear_errors() {
    let name = "mixtral_fp8";
    let store = open(&store_dir(name, "int4_store"), true, IoPreference::Auto);
    let mut e = Engine::new(
        &store,
        &EngineOptions {
            context: Some(16),
            ..Default::default()
        },
    )
    .unwrap();
    let err = e
        .forward(&[1, 2, 512], Logits::Last)
        .unwrap_err()
        .to_string();
    assert!(err.contains("512") && err.contains("out of range"), "{err}");
    let err = e.forward(&[1; 17], Logits::Last).unwrap_err().to_string();
    assert!(err.contains("context overflow"), "{err}");
    let params = GenerateParams {
        max_tokens: 10,
        sampling: SamplingParams::default(),
        stop_on_eos: true,
        speculation: Default::default(),
    };
    let err = e
        .generate(&[1; 8], &params, |_| Ok(true))
        .unwrap_err()
        .to_string();
    assert!(err.contains("context overflow"), "{err}");
    assert!(e.cached_tokens().is_empty());
    // Stop on EOS: make the EOS the first greedy token by asking for it through the callback.
    let exp = expected(name);
    let prompt = ids(&exp["prompt_ids"]);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let g = e.generate(&prompt, &params, |_| Ok(false)).unwrap();
    assert_eq!(g.tokens.len(), 1);
    assert_eq!(g.stop, coli_engine::StopReason::Callback);
}

#[test]
fn perplexity_matches_teacher_forced_logits() {
    let name = "mixtral_fp8";
    let exp = expected(name);
    let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
    // Small prefill batches so the NLL is accumulated over several batches.
    let opts = EngineOptions {
        prefill_batch: 5,
        ..Default::default()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    let teacher = ids(&exp["teacher_ids"]);
    let (mean, n) = e.mean_nll(&teacher).unwrap();
    assert_eq!(n, teacher.len() - 1);
    let logits = e.forward_logits(&teacher).unwrap();
    let want: f64 = (0..n)
        .map(|t| coli_engine::engine::nll(&logits[t], teacher[t + 1] as usize))
        .sum::<f64>()
        / n as f64;
    assert_eq!(mean, want);
    // Random weights: the perplexity is finite and positive.
    assert!(mean.is_finite() && mean > 0.0);
    assert!(e.mean_nll(&teacher[..1]).is_err());
}

#[test]
fn generation_stops_on_every_eos_id() {
    let name = "qwen3_moe_bf16";
    let exp = expected(name);
    let store = open(&store_dir(name, "lossless_store"), true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let want = ids(&exp["greedy_lossless"]);
    assert_eq!(
        e.spec().eos_token_ids,
        vec![exp["eos_token_id"].as_u64().unwrap() as u32]
    );
    let params = GenerateParams {
        max_tokens: 32,
        sampling: SamplingParams::default(),
        stop_on_eos: true,
        speculation: Default::default(),
    };
    // Any id of the EOS list stops generation; the EOS itself is returned.
    e.set_eos_token_ids(vec![9999, want[4]]);
    let g = e
        .generate(&ids(&exp["prompt_ids"]), &params, |_| Ok(true))
        .unwrap();
    let first = want.iter().position(|&t| t == want[4]).unwrap();
    assert_eq!(g.tokens, want[..=first].to_vec());
    assert_eq!(g.stop, coli_engine::StopReason::Eos);
    // Without stop_on_eos the same run goes on to max_tokens.
    let g = e
        .generate(
            &ids(&exp["prompt_ids"]),
            &GenerateParams {
                stop_on_eos: false,
                speculation: Default::default(),
                ..params
            },
            |_| Ok(true),
        )
        .unwrap();
    assert_eq!(g.tokens, want);
    assert_eq!(g.stop, coli_engine::StopReason::MaxTokens);
}

/// A Kimi-Linear checkpoint saved by transformers 5.25's `save_pretrained` names the dense
/// layer's MLP `block_sparse_moe.{gate,up,down}_proj` (the reverse of its `.block_sparse_moe.`
/// -> `.mlp.` renaming; every other name as published): it converts to the published names and
/// gives transformers' tokens.
#[test]
fn kimi_linear_as_transformers_saves_it_converts_and_matches() {
    let name = "kimi_linear_bf16";
    let exp = expected(name);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    coli_tests::rewrite_checkpoint(&coli_tests::fixture_dir(name), &ck, |n| {
        Some(n.replacen("model.layers.0.mlp.", "model.layers.0.block_sparse_moe.", 1))
    });
    let out = tmp.path().join("store");
    let enc = |s: &str| coli_tests::encoding(s);
    coli_convert::run(&coli_convert::Options {
        input: ck,
        output: out.clone(),
        encodings: coli_convert::Encodings::new(enc("bf16"), enc("bf16"), enc("int8")),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap();
    let store = open(&out, true, IoPreference::Auto);
    assert!(store
        .manifest()
        .dense
        .iter()
        .any(|d| d.name == "model.layers.0.mlp.down_proj.weight"));
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert_eq!(
        greedy(&mut e, &ids(&exp["prompt_ids"]), 32),
        ids(&exp["greedy_lossless"])
    );
}
