//! Speculative decoding gives exactly the tokens of plain decoding.
//!
//! For every tiny fixture family (converted to an int4 store) a prompt that repeats itself (so
//! that prompt lookup proposes drafts) is generated with `--speculate off` and with `ngram`
//! (gate off, so every proposal is verified): the tokens, the KV cache left behind and the
//! expert usage counts must be equal, under expert budgets from unbounded down to one expert,
//! prefetch and pinning on and off, other thread counts, greedy and sampled, and when an EOS or
//! `max_tokens` cuts a pass's accepted drafts. A statistical check of the acceptance rule on a
//! fixture's logits (20 000 seeded draws, chi-square at p = 1e-6) shows the emitted tokens are
//! distributed as the model's, and that a wrong rule is caught.
//!
//! `COLI_DEMO_STORE=DIR cargo test -p coli-tests --test speculative -- --ignored` runs the
//! placement check on the demo store (tools/test.sh does so).

use coli_engine::sampling::{candidates, Sampler, SamplingParams};
use coli_engine::speculative::{accept, Speculate, SpeculationParams};
use coli_engine::usage::UsageHistory;
use coli_engine::{Engine, EngineOptions, GenerateParams, Generation, Logits};
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{convert_fixture, expected, ids, open_store};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// Budget, prefetch, pin, threads (budget `Some(1)` stands for one expert's bytes).
type Config = (Option<u64>, bool, bool, usize);

const CONFIGS: [Config; 4] = [
    (None, true, true, 2),
    (Some(1), true, true, 1),
    (Some(1), false, false, 2),
    (Some(3), true, false, 1),
];

fn one_expert(store: &Store) -> u64 {
    let l = store.manifest().expert_layers[0].layer;
    store.fetch_one(ExpertKey::new(l, 0)).unwrap().len_bytes() as u64
}

/// `base`, the model's greedy continuation of it, then `base` again: prompt lookup proposes
/// that continuation as soon as the model starts to repeat it (an input-grounded prompt).
fn repeating_prompt(store: &Store, base: &[u32]) -> Vec<u32> {
    let mut e = Engine::new(store, &EngineOptions::default()).unwrap();
    let mut p = base.to_vec();
    p.extend(coli_tests::greedy(&mut e, base, 12));
    p.extend_from_slice(base);
    p
}

fn params(max_tokens: usize, sampling: SamplingParams, mode: Speculate) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling,
        // The fixtures' EOS comes early in some families; the EOS case is its own check.
        stop_on_eos: false,
        speculation: SpeculationParams {
            mode,
            draft_tokens: 4,
            gate: false,
            ..Default::default()
        },
    }
}

/// One generation on a fresh engine: its result, the KV cache's tokens after it, and the usage
/// counts it saved (no pinning from them: each run writes its own file).
fn run(
    store: &Store,
    cfg: Config,
    pin_from: &Path,
    prompt: &[u32],
    p: &GenerateParams,
    eos: Option<u32>,
) -> (Generation, Vec<u32>, UsageHistory) {
    let (budget, prefetch, pin, threads) = cfg;
    let budget = budget.map(|b| match b {
        1 => one_expert(store),
        n => n * one_expert(store),
    });
    let tmp = tempfile::tempdir().unwrap();
    let usage = tmp.path().join("usage.json");
    if pin {
        std::fs::copy(pin_from, &usage).unwrap();
    }
    let mut e = Engine::new(
        store,
        &EngineOptions {
            ram_budget: budget,
            prefetch,
            pin,
            usage: Some(usage.clone()),
            threads: Some(threads),
            prefill_batch: 4,
            ..Default::default()
        },
    )
    .unwrap();
    if let Some(id) = eos {
        e.set_eos_token_ids(vec![id]);
    }
    let g = e.generate(prompt, p, |_| Ok(true)).unwrap();
    let cached = e.cached_tokens().to_vec();
    coli_tests::assert_only_budget_warnings(&e.take_warnings());
    drop(e);
    let h = UsageHistory::load(&usage, store.manifest().store_id)
        .unwrap()
        .expect("usage saved");
    (g, cached, h)
}

/// Two runs' saved usage histories are equal (tokens and every expert's count), the MTP
/// layer's experts (layers from `main_layers` on: counted only where MTP drafts) left out.
fn same_usage(a: &UsageHistory, b: &UsageHistory, main_layers: u32, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: usage tokens");
    let main = |h: &UsageHistory| -> Vec<(ExpertKey, f64)> {
        h.counts
            .iter()
            .filter(|(k, _)| k.layer < main_layers)
            .map(|(k, v)| (*k, *v))
            .collect()
    };
    let mut ka = main(a);
    let mut kb = main(b);
    ka.sort_by_key(|(k, _)| *k);
    kb.sort_by_key(|(k, _)| *k);
    assert_eq!(ka, kb, "{what}: usage counts");
}

/// Off vs ngram on `dir` for every configuration; returns (drafts proposed, accepted) of the
/// ngram runs.
fn check_store(dir: &Path, name: &str, base: &[u32], configs: &[Config]) -> (u64, u64) {
    let store = open_store(dir, false, IoPreference::Auto);
    let prompt = repeating_prompt(&store, base);
    let tmp = tempfile::tempdir().unwrap();
    let pin_from = tmp.path().join("pin.json");
    let greedy = SamplingParams::default();
    let sampled = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 0,
        seed: 7,
    };
    // A usage history for the pinned configurations to pin from.
    {
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                usage: Some(pin_from.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        e.generate(&prompt, &params(8, greedy, Speculate::Off), |_| Ok(true))
            .unwrap();
    }
    // The reference: plain decode, unbounded budget.
    let (want, want_kv, want_usage) = run(
        &store,
        (None, true, false, 2),
        &pin_from,
        &prompt,
        &params(24, greedy, Speculate::Off),
        None,
    );
    let (mut proposed, mut accepted) = (0, 0);
    let (has_mtp, main_layers) = {
        let e = Engine::new(&store, &EngineOptions::default()).unwrap();
        (e.has_mtp(), e.spec().num_layers as u32)
    };
    let modes: &[Speculate] = if has_mtp {
        &[Speculate::Ngram, Speculate::Mtp]
    } else {
        &[Speculate::Ngram]
    };
    for (&cfg, &mode) in configs
        .iter()
        .flat_map(|c| modes.iter().map(move |m| (c, m)))
    {
        let what = format!("{name} {cfg:?} {mode}");
        let (got, kv, usage) = run(
            &store,
            cfg,
            &pin_from,
            &prompt,
            &params(24, greedy, mode),
            None,
        );
        assert_eq!(got.tokens, want.tokens, "{what}: greedy tokens");
        assert_eq!(got.stop, want.stop, "{what}: stop reason");
        assert_eq!(kv, want_kv, "{what}: KV cache tokens");
        let s = got.stats.speculation;
        assert!(s.drafts_accepted <= s.drafts_proposed);
        assert_eq!(
            got.stats.generated_tokens - 1,
            got.stats.decode_steps + s.drafts_accepted as usize,
            "{what}: every decode pass emits one token plus its accepted drafts"
        );
        if !cfg.2 {
            same_usage(&want_usage, &usage, main_layers, &what);
        }
        if mode == Speculate::Mtp {
            // MTP drafts on every pass (gate off): k per pass, fewer only near max_tokens.
            assert!(
                s.verify_passes as usize >= got.stats.decode_steps - 1,
                "{what}"
            );
        }
        proposed += s.drafts_proposed;
        accepted += s.drafts_accepted;
    }
    // Sampled: the same seed gives the same tokens with and without drafts.
    for seed in 0..3 {
        let sp = SamplingParams { seed, ..sampled };
        let cfg = (None, true, false, 2);
        let (a, _, _) = run(
            &store,
            cfg,
            &pin_from,
            &prompt,
            &params(20, sp, Speculate::Off),
            None,
        );
        for &mode in modes {
            let (b, _, _) = run(&store, cfg, &pin_from, &prompt, &params(20, sp, mode), None);
            assert_eq!(
                a.tokens, b.tokens,
                "{name}: sampled tokens, seed {seed}, {mode}"
            );
            proposed += b.stats.speculation.drafts_proposed;
            accepted += b.stats.speculation.drafts_accepted;
        }
    }
    // Cuts: max_tokens inside a pass's drafts, and an EOS that is (or follows) an accepted
    // draft: the same tokens, and the KV cache holds all but the last token, as without drafts.
    for max in [2, 5, 9] {
        let cfg = (None, true, false, 2);
        let (a, akv, _) = run(
            &store,
            cfg,
            &pin_from,
            &prompt,
            &params(max, greedy, Speculate::Off),
            None,
        );
        for &mode in modes {
            let (b, bkv, _) = run(
                &store,
                cfg,
                &pin_from,
                &prompt,
                &params(max, greedy, mode),
                None,
            );
            assert_eq!(a.tokens, b.tokens, "{name}: max_tokens {max}, {mode}");
            assert_eq!(akv, bkv, "{name}: KV cache after max_tokens {max}, {mode}");
        }
    }
    for &eos in want.tokens.iter().skip(3).take(6) {
        let cfg = (None, true, false, 2);
        let (a, akv, au) = run(
            &store,
            cfg,
            &pin_from,
            &prompt,
            &GenerateParams {
                stop_on_eos: true,
                ..params(24, greedy, Speculate::Off)
            },
            Some(eos),
        );
        assert_eq!(a.stop, coli_engine::StopReason::Eos);
        for &mode in modes {
            let (b, bkv, bu) = run(
                &store,
                cfg,
                &pin_from,
                &prompt,
                &GenerateParams {
                    stop_on_eos: true,
                    ..params(24, greedy, mode)
                },
                Some(eos),
            );
            assert_eq!(a.tokens, b.tokens, "{name}: EOS {eos}, {mode}");
            assert_eq!(akv, bkv, "{name}: KV cache after EOS {eos}, {mode}");
            same_usage(&au, &bu, main_layers, &format!("{name}: EOS {eos}, {mode}"));
        }
    }
    assert!(proposed > 0, "{name}: drafts were verified");
    (proposed, accepted)
}

#[test]
fn speculation_gives_the_tokens_of_plain_decoding_on_every_family() {
    let mut accepted_any = false;
    for name in coli_tests::FIXTURE_FAMILIES {
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let base = ids(&expected(name)["prompt_ids"]);
        let (p, a) = check_store(&dir, name, &base, &CONFIGS);
        eprintln!("{name}: {a} of {p} drafts accepted");
        accepted_any |= a > 0;
    }
    assert!(
        accepted_any,
        "some family must accept drafts, or the accept path went untested"
    );
}

#[test]
fn auto_resolves_and_mtp_without_an_mtp_layer_is_refused() {
    let (_tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let store = open_store(&dir, false, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(!e.has_mtp());
    let prompt = repeating_prompt(&store, &ids(&expected("olmoe_fp8")["prompt_ids"]));
    let g = e
        .generate(
            &prompt,
            &params(6, SamplingParams::default(), Speculate::Auto),
            |_| Ok(true),
        )
        .unwrap();
    assert_eq!(g.stats.speculation_mode, Speculate::Ngram);
    let err = e
        .generate(
            &prompt,
            &params(6, SamplingParams::default(), Speculate::Mtp),
            |_| Ok(true),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("no MTP layer"), "{err}");
}

/// Wilson–Hilferty's approximation of the chi-square quantile with `df` degrees of freedom
/// whose upper tail is 1e-6 (z = 4.7534).
fn chi2_bound(df: usize) -> f64 {
    let k = df as f64;
    let z = 4.7534;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Pearson's chi-square of `counts` against probabilities `p` (same order).
fn chi2(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &q)| {
            let e = q * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

#[test]
fn acceptance_rule_keeps_the_model_distribution() {
    // Real logits: the last prompt position of the OLMoE fixture, sharpened to a few likely
    // tokens by top-k 6 at temperature 1.5 (a flat enough distribution that every candidate
    // is drawn often).
    let (_tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let store = open_store(&dir, false, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let prompt = ids(&expected("olmoe_fp8")["prompt_ids"]);
    let row = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let sp = SamplingParams {
        temperature: 1.5,
        top_k: 6,
        top_p: 1.0,
        seed: 0,
    };
    let cand = candidates(&row, &sp);
    assert_eq!(cand.len(), 6);
    let ids_: Vec<u32> = cand.iter().map(|c| c.0).collect();
    let p: Vec<f64> = cand.iter().map(|c| c.1).collect();
    assert!(
        p.iter().all(|&q| q > 0.02),
        "every candidate is drawn often: {p:?}"
    );
    // Draft: the second most likely token; the row after it does not matter for the first
    // emitted token, so the same row serves.
    let draft = ids_[1];
    let rows = vec![row.clone(), row.clone()];
    const DRAWS: u64 = 20_000;
    let mut counts = vec![0u64; ids_.len()];
    let mut wrong = vec![0u64; ids_.len()];
    let mut accepted = 0u64;
    for seed in 0..DRAWS {
        let mut s = Sampler::new(SamplingParams { seed, ..sp });
        let v = accept(&mut s, &rows, &[draft]);
        let first = if v.accepted == 1 {
            accepted += 1;
            draft
        } else {
            assert_ne!(
                v.next, draft,
                "a rejected draft is never emitted in its place"
            );
            v.next
        };
        counts[ids_.iter().position(|&t| t == first).unwrap()] += 1;
        // A wrong rule: accept with probability p(d), but on rejection sample the full
        // distribution instead of the residual (p without d).
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
        let t = if rng.gen::<f64>() < p[1] {
            draft
        } else {
            let mut s = Sampler::new(SamplingParams {
                seed: seed + DRAWS,
                ..sp
            });
            s.sample(&row)
        };
        wrong[ids_.iter().position(|&x| x == t).unwrap()] += 1;
    }
    let bound = chi2_bound(ids_.len() - 1);
    let good = chi2(&counts, &p);
    let bad = chi2(&wrong, &p);
    eprintln!("chi-square: rule {good:.2}, wrong rule {bad:.2}, bound {bound:.2} (p = 1e-6)");
    assert!(
        good < bound,
        "the emitted tokens follow the model: chi2 {good} >= {bound}"
    );
    assert!(
        bad > bound,
        "the wrong rule is caught: chi2 {bad} <= {bound}"
    );
    // The acceptance rate is p(d) (binomial, 5 standard deviations).
    let rate = accepted as f64 / DRAWS as f64;
    let sd = (p[1] * (1.0 - p[1]) / DRAWS as f64).sqrt();
    assert!(
        (rate - p[1]).abs() < 5.0 * sd,
        "acceptance {rate} vs p(d) {}",
        p[1]
    );
}

#[test]
#[ignore = "needs COLI_DEMO_STORE (tools/test.sh sets it after building the demo store)"]
fn speculation_gives_the_tokens_of_plain_decoding_on_the_demo_store() {
    let dir = std::env::var("COLI_DEMO_STORE").expect("COLI_DEMO_STORE=<demo store dir>");
    // SmolLM2 ids of a short sentence; the prompt repeats it, so drafts are proposed.
    let base: Vec<u32> = vec![504, 2365, 314, 260, 3458, 28, 339, 1073, 253, 1432, 30];
    let (p, a) = check_store(Path::new(&dir), "demo", &base, &CONFIGS[..2]);
    eprintln!("demo: {a} of {p} drafts accepted");
    assert!(a > 0, "the demo model accepts drafts on a repeating prompt");
}

/// Verify passes with chosen drafts: every family (MLA verifying in the absorbed form per row,
/// GLM-5's DSA selecting per row) gives each verified position the logits plain decode gives
/// it, bit for bit, and rolling back rejected drafts leaves a cache that continues exactly as
/// plain decode. Drafts are the plain run's own next tokens with every third one wrong, so
/// passes accept all, some or none of their drafts.
#[test]
fn verify_rows_equal_decode_rows_and_rollback_continues_exactly() {
    use coli_engine::BatchItem;
    let same = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    for name in coli_tests::FIXTURE_FAMILIES {
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let store = open_store(&dir, false, IoPreference::Auto);
        let prompt = ids(&expected(name)["prompt_ids"]);
        const T: usize = 16;
        // Plain decode: the logits row after the prompt and after each greedy token.
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                max_sequences: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let mut rows = vec![e.forward(&prompt, Logits::Last).unwrap().pop().unwrap()];
        let mut toks = Vec::new();
        for _ in 0..T {
            let id = coli_engine::sampling::argmax(rows.last().unwrap());
            toks.push(id);
            rows.push(e.forward(&[id], Logits::Last).unwrap().pop().unwrap());
        }
        e.reset();
        // Speculative: a sequence of its own, drafts of 1..=4 tokens.
        let mut seq = e.new_sequence().unwrap();
        let mut items = [BatchItem {
            seq: &mut seq,
            ids: &prompt,
            logits: Some(Logits::Last),
            verify: false,
        }];
        e.forward_many(&mut items).unwrap();
        let mut done = 0; // tokens of `toks` in the cache
        let mut step = 0;
        let (mut proposed, mut accepted_total) = (0, 0);
        while done + 1 < T {
            let k = (1 + step % 4).min(T - done - 1);
            let drafts: Vec<u32> = (0..k)
                .map(|j| {
                    let t = toks[done + 1 + j];
                    if (step + j) % 3 == 2 {
                        (t + 1) % 100
                    } else {
                        t
                    }
                })
                .collect();
            let mut feed = vec![toks[done]];
            feed.extend_from_slice(&drafts);
            let mut items = [BatchItem {
                seq: &mut seq,
                ids: &feed,
                logits: Some(Logits::All),
                verify: true,
            }];
            let got = e.forward_many(&mut items).unwrap().pop().unwrap();
            let mut accepted = 0;
            while accepted < k && drafts[accepted] == toks[done + 1 + accepted] {
                accepted += 1;
            }
            for (i, row) in got.iter().enumerate().take(accepted + 1) {
                assert!(
                    same(row, &rows[done + 1 + i]),
                    "{name}: step {step}, verified row {i} differs from decode"
                );
            }
            seq.truncate(prompt.len() + done + 1 + accepted);
            proposed += k;
            accepted_total += accepted;
            done += 1 + accepted;
            step += 1;
        }
        assert!(
            accepted_total > 0 && accepted_total < proposed,
            "{name}: passes accepted some drafts and rejected others ({accepted_total} of {proposed})"
        );
        // After all the rollbacks the cache continues as plain decode does.
        let done = done.min(T - 1);
        seq.truncate(prompt.len() + done);
        let mut items = [BatchItem {
            seq: &mut seq,
            ids: &toks[done..done + 1],
            logits: Some(Logits::Last),
            verify: false,
        }];
        let last = e
            .forward_many(&mut items)
            .unwrap()
            .pop()
            .unwrap()
            .pop()
            .unwrap();
        assert!(
            same(&last, &rows[done + 1]),
            "{name}: the cache after rollbacks"
        );
    }
}

/// The MTP drafter's first draft is the MTP layer's top-1 as transformers computes it: on the
/// lossless DeepSeek-V3, GLM-5, GLM-4.5, DeepSeek-V3.2, Qwen3-Next and Qwen3.5 fixtures, prefilled chunk by chunk, the draft after each chunk
/// (the MTP layer catching up over the chunk's positions) equals `expected.json["mtp"]["top1"]`
/// at the chunk's last position. Chained drafts are checked by the greedy tests above (any
/// draft gives plain decode's tokens); their quality needs a trained model.
#[test]
fn first_mtp_draft_is_the_mtp_layers_top1() {
    use coli_engine::BatchItem;
    for name in [
        "deepseek_v3_fp8",
        "glm5_fp8",
        "glm4_moe_fp8",
        "deepseek_v32_fp8",
        "qwen3_next_bf16",
        "qwen3_5_moe_bf16",
    ] {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "lossless_store");
        let store = open_store(&dir, false, IoPreference::Auto);
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                max_sequences: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let m = &exp["mtp"];
        let input = ids(&m["input_ids"]);
        let next = ids(&m["next_ids"]);
        let top1 = ids(&m["top1"]);
        let mut seq = e.new_sequence().unwrap();
        e.enable_mtp(&mut seq).unwrap();
        let mut fed = 0;
        for (step, n) in [1usize, 4, 1, 7, 11].into_iter().enumerate() {
            let chunk = &input[fed..fed + n];
            let mut items = [BatchItem {
                seq: &mut seq,
                ids: chunk,
                logits: Some(Logits::Last),
                verify: false,
            }];
            e.forward_many(&mut items).unwrap();
            fed += n;
            let drafts = e.mtp_draft(&mut seq, next[fed - 1], 1 + step % 3).unwrap();
            assert_eq!(drafts.len(), 1 + step % 3, "{name}");
            assert_eq!(
                drafts[0],
                top1[fed - 1],
                "{name}: first MTP draft after {fed} positions"
            );
        }
        // A sequence without MTP state is refused.
        let mut plain = e.new_sequence().unwrap();
        assert!(e.mtp_draft(&mut plain, 1, 2).is_err());
    }
}
