//! Placement invariance of the tiered expert cache on every supported family's tiny fixture
//! (int4-g64 store): identical greedy tokens for every combination of expert budget (down to
//! one expert), pinned hot set on/off, router lookahead prefetch on/off and thread count, with
//! the counters asserted (disk bytes = demand + prefetch bytes, evictions, prefetches issued,
//! pinned hits, each expert read at most once when all fit, identical lookups and predictions
//! whatever the placement). Also: the usage history is written, shared and survives corruption.

use coli_engine::{CacheStats, Engine, EngineOptions, GenerateParams, SamplingParams};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{convert_fixture, expected, ids, open_store};
use std::path::Path;

const FAMILIES: [&str; 18] = coli_tests::FIXTURE_FAMILIES;

fn params(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampling: SamplingParams::default(),
        stop_on_eos: true,
        // The counters compared below assume one token per decode pass (the draft gate's
        // timing would change how many passes verify drafts; tests/tests/speculative.rs checks
        // placement with speculation on).
        speculation: coli_engine::SpeculationParams::off(),
    }
}

/// Runs one greedy generation; returns tokens, cumulative cache counters, store reads and bytes,
/// pinned experts.
fn run(
    dir: &Path,
    prompt: &[u32],
    opts: &EngineOptions,
) -> (Vec<u32>, CacheStats, u64, u64, usize) {
    let store = open_store(dir, true, IoPreference::Auto);
    let mut e = Engine::new(&store, opts).unwrap();
    coli_tests::assert_only_budget_warnings(&e.take_warnings());
    let g = e.generate(prompt, &params(32), |_| Ok(true)).unwrap();
    let (cap, used) = e.cache_usage();
    assert!(used <= cap, "{used} > {cap}");
    let pinned = e.placement().pinned_experts;
    let s = e.cache_stats();
    // No demand request held more unpinned experts than the LRU tier holds (a batch union
    // larger than that is fetched in groups), or one record where that is less.
    let one = store
        .index()
        .iter()
        .map(|r| coli_store::held_bytes_for(r.length.get()))
        .max()
        .unwrap();
    let lru = e.placement().lru_capacity;
    assert!(
        s.largest_request_bytes <= lru.max(one),
        "a request held {} bytes, LRU capacity {lru}, largest record {one}",
        s.largest_request_bytes
    );
    // The generation's own counters are the engine's minus what pinning read at start.
    assert_eq!(g.stats.cache.pinned_reads, 0);
    assert_eq!(g.stats.cache.hits, s.hits);
    (
        g.tokens,
        s,
        store.stats().reads,
        store.stats().bytes_read,
        pinned,
    )
}

#[test]
fn placement_never_changes_tokens_on_any_family() {
    for name in FAMILIES {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let want = ids(&exp["greedy_int4_g64"]);
        let prompt = ids(&exp["prompt_ids"]);
        let probe = open_store(&dir, true, IoPreference::Auto);
        let n_experts = probe.index().len() as u64;
        let one = probe.index().iter().map(|r| r.length.get()).max().unwrap();
        let all: u64 = probe.index().iter().map(|r| r.length.get()).sum();
        drop(probe);

        // Learn a usage history with one plain run (the file lives in the temp dir).
        let state = tempfile::tempdir().unwrap();
        let usage = state.path().join("usage.json");
        let learn = EngineOptions {
            ram_budget: Some(u64::MAX),
            usage: Some(usage.clone()),
            ..Default::default()
        };
        let (tokens, ..) = run(&dir, &prompt, &learn);
        assert_eq!(tokens, want, "{name}: learning run");
        assert!(usage.is_file(), "{name}: the usage history was written");

        // Per prefill batch size (the batch unions differ): lookups and predictions.
        let mut lookups = std::collections::HashMap::new();
        let mut predictions = std::collections::HashMap::new();
        let mut i = 0usize;
        for (budget, pin_share) in [(one, 1.0), (all / 4, 0.5), (u64::MAX, 0.5)] {
            for pin in [false, true] {
                for prefetch in [false, true] {
                    i += 1;
                    let threads = 1 + i % 2;
                    let batch = [5, 32, 32][i % 3];
                    let opts = EngineOptions {
                        ram_budget: Some(budget),
                        threads: Some(threads),
                        pin,
                        pin_share,
                        prefetch,
                        usage: pin.then(|| usage.clone()),
                        prefill_batch: batch,
                        preload: false,
                        ..Default::default()
                    };
                    let what = format!(
                        "{name}: budget {budget} pin {pin} (share {pin_share}) prefetch {prefetch} threads {threads} batch {batch}"
                    );
                    let (tokens, s, reads, bytes, pinned) = run(&dir, &prompt, &opts);
                    assert_eq!(tokens, want, "{what}");
                    // Every byte read from disk is a demand, pin or prefetch read.
                    assert_eq!(bytes, s.bytes_fetched, "{what}: {s:?}");
                    assert_eq!(bytes, s.demand_bytes + s.prefetch_bytes, "{what}: {s:?}");
                    assert_eq!(
                        reads,
                        s.misses + s.prefetch_reads + s.pinned_reads,
                        "{what}: {s:?}"
                    );
                    // The same routing, so the same lookups, whatever the placement.
                    let l = s.hits + s.misses;
                    assert_eq!(*lookups.entry(batch).or_insert(l), l, "{what}: lookups");
                    if prefetch {
                        assert!(s.predicted > 0, "{what}: {s:?}");
                        assert!(s.predicted_used <= s.predicted);
                        assert!(s.predicted_used <= s.demanded_after_prediction);
                        let p = (s.predicted, s.predicted_used, s.demanded_after_prediction);
                        let q = *predictions.entry(batch).or_insert(p);
                        assert_eq!(q, p, "{what}: predictions");
                        // Prefetch reads happen unless every lookup is a pinned hit. They race
                        // the demand reads, which on a busy machine can win every one of them
                        // (seen in CI beside a build): up to three more runs before concluding
                        // that prefetching never reads.
                        if budget > one && s.pinned_hits < s.hits + s.misses {
                            let read = s.prefetch_reads > 0
                                || (0..3).any(|_| run(&dir, &prompt, &opts).1.prefetch_reads > 0);
                            assert!(read, "{what}: {s:?}");
                        }
                    } else {
                        assert_eq!(
                            (s.predicted, s.prefetch_reads, s.inflight_waits),
                            (0, 0, 0),
                            "{what}: {s:?}"
                        );
                    }
                    if pin {
                        assert!(pinned > 0, "{what}: nothing pinned");
                        assert_eq!(s.pinned_reads, pinned as u64, "{what}");
                        assert!(s.pinned_hits > 0, "{what}: {s:?}");
                    } else {
                        assert_eq!((pinned, s.pinned_hits), (0, 0), "{what}");
                    }
                    if budget < all {
                        assert!(s.evictions > 0 || pin, "{what}: {s:?}");
                        assert!(s.misses > 0, "{what}: {s:?}");
                    } else {
                        assert_eq!(s.evictions, 0, "{what}");
                        // No expert is read twice, demand and prefetch racing included.
                        assert!(reads <= n_experts, "{what}: {reads} reads of {n_experts}");
                    }
                }
            }
        }

        // Preload (the default): a budget that holds every record reads them all at start,
        // once each, and the run reads nothing more; one expert short of it streams instead.
        let held: u64 = {
            let probe = open_store(&dir, true, IoPreference::Auto);
            probe
                .index()
                .iter()
                .map(|r| coli_store::held_bytes_for(r.length.get()))
                .sum()
        };
        for (budget, preloaded) in [(held, true), (u64::MAX, true), (held - 1, false)] {
            let opts = EngineOptions {
                ram_budget: Some(budget),
                ..Default::default()
            };
            let store = open_store(&dir, true, IoPreference::Auto);
            let mut e = Engine::new(&store, &opts).unwrap();
            let what = format!("{name}: preload with budget {budget} (all records hold {held})");
            assert_eq!(e.placement().preloaded, preloaded, "{what}");
            let reads_at_start = store.stats().reads;
            let g = e.generate(&prompt, &params(32), |_| Ok(true)).unwrap();
            assert_eq!(g.tokens, want, "{what}");
            if preloaded {
                assert_eq!(reads_at_start, n_experts, "{what}: each record read once");
                assert_eq!(e.placement().pinned_experts as u64, n_experts, "{what}");
                assert_eq!(e.placement().pinned_bytes, held, "{what}");
                assert_eq!(store.stats().reads, reads_at_start, "{what}: decode read");
                let s = g.stats.cache;
                assert_eq!((s.misses, s.prefetch_reads), (0, 0), "{what}: {s:?}");
            } else {
                assert_eq!(reads_at_start, 0, "{what}");
                assert!(store.stats().reads > 0, "{what}");
            }
        }
    }
}

#[test]
fn pinned_experts_are_the_hottest_and_stay() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let prompt = ids(&exp["prompt_ids"]);
    let state = tempfile::tempdir().unwrap();
    let usage = state.path().join("u.json");
    let base = EngineOptions {
        ram_budget: Some(u64::MAX),
        usage: Some(usage.clone()),
        ..Default::default()
    };
    run(&dir, &prompt, &base);
    let store = open_store(&dir, true, IoPreference::Auto);
    let h = coli_engine::usage::UsageHistory::load(&usage, store.manifest().store_id)
        .unwrap()
        .unwrap();
    let hot = h.hottest();
    let one = store.index()[0].length.get();
    // A budget of 4 experts, half pinned: the two hottest are pinned and never evicted.
    let opts = EngineOptions {
        ram_budget: Some(4 * one),
        pin_share: 0.5,
        prefetch: false,
        ..base.clone()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    assert_eq!(e.placement().pinned_experts, 2);
    assert_eq!(e.placement().lru_capacity, 2 * one);
    let pinned: Vec<ExpertKey> = hot[..2].iter().map(|x| x.0).collect();
    let before = store.stats().reads;
    let g = e.generate(&prompt, &params(16), |_| Ok(true)).unwrap();
    assert!(g.stats.cache.evictions > 0);
    assert!(g.stats.cache.pinned_hits > 0);
    // Pinned experts are never read again.
    let again = e.generate(&prompt, &params(16), |_| Ok(true)).unwrap();
    assert!(store.stats().reads > before);
    assert_eq!(again.tokens, g.tokens);
    let (_, used) = e.cache_usage();
    assert!(used <= 4 * one);
    for k in pinned {
        assert!(store.record(k).is_some());
    }
    // The runs were merged into the file: more tokens than after the first run.
    let h2 = coli_engine::usage::UsageHistory::load(&usage, store.manifest().store_id)
        .unwrap()
        .unwrap();
    assert!(h2.tokens > h.tokens, "{} vs {}", h2.tokens, h.tokens);
}

#[test]
fn corrupt_or_foreign_usage_file_is_a_warning() {
    let name = "mixtral_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let prompt = ids(&exp["prompt_ids"]);
    let want = ids(&exp["greedy_int4_g64"]);
    let state = tempfile::tempdir().unwrap();
    let usage = state.path().join("usage.json");
    let store = open_store(&dir, true, IoPreference::Auto);
    for bad in [
        &b"\x00\x01garbage"[..],
        br#"{"version":1,"store_id":"ffffffffffffffffffffffffffffffff","half_life_tokens":8192,"tokens":5,"layers":[]}"#,
    ] {
        std::fs::write(&usage, bad).unwrap();
        let opts = EngineOptions {
            usage: Some(usage.clone()),
            preload: false,
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        let w = e.take_warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("usage.json"), "{w:?}");
        assert_eq!(e.placement().pinned_experts, 0);
        let g = e.generate(&prompt, &params(32), |_| Ok(true)).unwrap();
        assert_eq!(g.tokens, want);
        // The bad file is never overwritten (it may not even be a usage history) and the
        // warning is not repeated.
        assert!(e.take_warnings().is_empty());
        assert_eq!(std::fs::read(&usage).unwrap(), bad);
    }
    // An unwritable usage path: a warning, the run goes on.
    let opts = EngineOptions {
        usage: Some(usage.join("not-a-dir/usage.json")),
        ..Default::default()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    let g = e.generate(&prompt, &params(8), |_| Ok(true)).unwrap();
    assert_eq!(g.tokens, want[..8].to_vec());
    let w = e.take_warnings();
    assert!(
        w.iter().any(|x| x.contains("saving the usage history")),
        "{w:?}"
    );
}

/// Identical greedy tokens whatever I/O engine (io_uring, pread thread pool, mmap), queue depth
/// and O_DIRECT preference reads the experts, on every family, with a one-expert budget (so
/// nearly every lookup is a disk read) and prefetch on (reads in flight while layers compute).
/// Each store reports the engine that actually ran: a forced engine must run as asked, and
/// `Auto` runs io_uring unless the kernel refuses it (then pread, with a note saying why).
#[test]
fn io_engine_and_queue_depth_never_change_tokens() {
    use coli_store::{IoEngineChoice, OpenOptions, Store};
    for name in FAMILIES {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let want = ids(&exp["greedy_int4_g64"]);
        let prompt = ids(&exp["prompt_ids"]);
        let cases = [
            (IoEngineChoice::Auto, 1, IoPreference::Auto),
            (IoEngineChoice::Auto, 4, IoPreference::Auto),
            (IoEngineChoice::Engine("pread"), 1, IoPreference::Auto),
            (IoEngineChoice::Engine("pread"), 4, IoPreference::Buffered),
            (IoEngineChoice::Engine("mmap"), 2, IoPreference::Buffered),
        ];
        for (engine, depth, direct) in cases {
            let store = Store::open_with(
                &dir,
                &OpenOptions {
                    verify_checksums: true,
                    io: direct,
                    engine,
                    queue_depth: Some(depth),
                    ..OpenOptions::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {engine:?}: {e}"));
            let ran = store.io_engine();
            match engine {
                IoEngineChoice::Engine(asked) => assert_eq!(ran, asked),
                IoEngineChoice::Auto => assert!(
                    ran == "uring" || store.io_engine_note().is_some(),
                    "{name}: auto ran {ran:?} without saying why io_uring was refused"
                ),
            }
            assert_eq!(store.queue_depth(), depth);
            let one = store.index().iter().map(|r| r.length.get()).max().unwrap();
            let opts = EngineOptions {
                ram_budget: Some(one),
                pin: false,
                prefetch: true,
                ..Default::default()
            };
            let mut e = Engine::new(&store, &opts).unwrap();
            let g = e.generate(&prompt, &params(32), |_| Ok(true)).unwrap();
            let what = format!("{name}: {engine:?} ran as {ran:?}, depth {depth}, {direct:?}");
            assert_eq!(g.tokens, want, "{what}");
            assert!(store.stats().bytes_read > 0, "{what}");
            assert!(g.stats.cache.evictions > 0, "{what}");
        }
    }
}

/// With a budget above one decode step's experts, pinning never shrinks the LRU below one step
/// (a smaller LRU evicts within every step); at or below it, the pin share applies as asked.
#[test]
fn pinning_leaves_the_lru_one_decode_step() {
    let name = "mixtral_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let prompt = ids(&exp["prompt_ids"]);
    let want = ids(&exp["greedy_int4_g64"]);
    let state = tempfile::tempdir().unwrap();
    let usage = state.path().join("u.json");
    let learn = EngineOptions {
        ram_budget: Some(u64::MAX),
        usage: Some(usage.clone()),
        ..Default::default()
    };
    run(&dir, &prompt, &learn);
    let store = open_store(&dir, true, IoPreference::Auto);
    let cfg = store.model_config();
    let (layers, top_k) = (
        cfg["num_hidden_layers"].as_u64().unwrap() as usize,
        cfg["num_experts_per_tok"].as_u64().unwrap() as usize,
    );
    let step = coli_engine::placement::decode_step_bytes(&store, layers, top_k);
    let one = store.index().iter().map(|r| r.length.get()).max().unwrap();
    assert_eq!(step, (layers * top_k) as u64 * one);
    for (budget, pinned_max) in [(step + 2 * one, 2 * one), (step, step)] {
        let opts = EngineOptions {
            ram_budget: Some(budget),
            pin_share: 1.0,
            prefetch: false,
            usage: Some(usage.clone()),
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        let p = e.placement().clone();
        assert!(p.pinned_bytes <= pinned_max, "budget {budget}: {p:?}");
        assert!(p.pinned_experts > 0, "budget {budget}: {p:?}");
        if budget > step {
            assert!(p.lru_capacity >= step, "budget {budget}: {p:?}");
        }
        let g = e.generate(&prompt, &params(32), |_| Ok(true)).unwrap();
        assert_eq!(g.tokens, want);
    }
}

#[test]
fn prefetch_gate_pauses_unused_reads_and_never_changes_tokens() {
    // The lookahead on these random-weight fixtures predicts poorly, so with a threshold of 1
    // (every prefetched expert must be used) the gate pauses the reads after the first pass and
    // only probes; threshold 0 never pauses. Predictions (and their scores) are made on every
    // pass either way, and the tokens never change.
    for name in ["olmoe_fp8", "qwen3_moe_fp8"] {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let want = ids(&exp["greedy_int4_g64"]);
        let prompt = ids(&exp["prompt_ids"]);
        let probe = open_store(&dir, true, IoPreference::Auto);
        let all: u64 = probe.index().iter().map(|r| r.length.get()).sum();
        drop(probe);
        let mut seen = Vec::new();
        for min_use in [0.0, 0.25, 1.0] {
            let opts = EngineOptions {
                ram_budget: Some(all / 4),
                pin: false,
                prefill_batch: 1,
                prefetch_min_use: min_use,
                ..Default::default()
            };
            let store = open_store(&dir, true, IoPreference::Auto);
            let mut e = Engine::new(&store, &opts).unwrap();
            let g = e.generate(&prompt, &params(32), |_| Ok(true)).unwrap();
            assert_eq!(g.tokens, want, "{name} min_use {min_use}");
            let s = e.cache_stats();
            let gate = e.prefetch_gate();
            assert!(s.predicted > 0, "{name} {min_use}: {s:?}");
            seen.push((min_use, s.prefetch_reads, gate.skipped(), s.predicted));
        }
        let (_, reads0, skipped0, pred0) = seen[0];
        let (_, reads1, skipped1, pred1) = seen[2];
        assert_eq!(skipped0, 0, "{name}: min_use 0 never pauses: {seen:?}");
        assert!(
            skipped1 > 0 && reads1 < reads0,
            "{name}: min_use 1 pauses: {seen:?}"
        );
        assert_eq!(
            pred0, pred1,
            "{name}: predictions are made on every pass: {seen:?}"
        );
    }
    // Out-of-range thresholds are refused.
    let (_tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let store = open_store(&dir, true, IoPreference::Auto);
    for bad in [-0.1, 1.5, f64::NAN] {
        let opts = EngineOptions {
            prefetch_min_use: bad,
            ..Default::default()
        };
        let err = Engine::new(&store, &opts)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("prefetch minimum use"), "{err}");
    }
}

/// A budget below one expert record caches nothing: the engine says so (a warning naming both
/// sizes), reads every routed expert from disk each time, and still gives the same tokens.
#[test]
fn a_budget_below_one_record_warns_and_keeps_the_tokens() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let store = open_store(&dir, true, IoPreference::Auto);
    let smallest = store
        .index()
        .iter()
        .map(|r| coli_store::held_bytes_for(r.length.get()))
        .min()
        .unwrap();
    let opts = EngineOptions {
        ram_budget: Some(smallest - 1),
        ..Default::default()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    let w = e.take_warnings();
    assert!(
        w.len() == 1
            && w[0].contains("less than any expert record")
            && w[0].contains(&format!("({smallest} bytes as held)"))
            && w[0].contains(&format!("--ram-budget at least {smallest} bytes")),
        "{w:?}"
    );
    let g = e
        .generate(&ids(&exp["prompt_ids"]), &params(32), |_| Ok(true))
        .unwrap();
    assert_eq!(g.tokens, ids(&exp["greedy_int4_g64"]));
    assert_eq!(g.stats.cache.hits, 0, "nothing is cached");
}

/// A budget that holds the smaller records but not the larger ones (DeepSeek-V3's int4 experts
/// and its int8 MTP layer's experts): the engine names how many records cannot be cached, in
/// which layers, and the budget that would cache them; the tokens are those of an unbounded
/// budget.
#[test]
fn a_budget_below_the_larger_records_names_them_and_keeps_the_tokens() {
    let name = "deepseek_v3_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
    let store = open_store(&dir, true, IoPreference::Auto);
    let held: Vec<(u32, u64)> = store
        .index()
        .iter()
        .map(|r| (r.layer.get(), coli_store::held_bytes_for(r.length.get())))
        .collect();
    let largest = held.iter().map(|h| h.1).max().unwrap();
    let smallest = held.iter().map(|h| h.1).min().unwrap();
    assert!(
        smallest < largest,
        "the MTP layer's int8 records are larger: {held:?}"
    );
    let big: Vec<u32> = held
        .iter()
        .filter(|h| h.1 == largest)
        .map(|h| h.0)
        .collect();
    let budget = largest - 1;
    let opts = EngineOptions {
        ram_budget: Some(budget),
        ..Default::default()
    };
    let mut e = Engine::new(&store, &opts).unwrap();
    let w = e.take_warnings();
    let mut layers = big.clone();
    layers.dedup();
    assert!(
        w.len() == 1
            && w[0].contains(&format!(
                "{} of {} unpinned expert records",
                big.len(),
                held.len()
            ))
            && w[0].contains(&format!(
                "(layers {}; up to {largest} bytes as held)",
                layers
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            && w[0].contains(&format!("--ram-budget at least {largest} bytes")),
        "{w:?}"
    );
    let prompt = ids(&exp["prompt_ids"]);
    let g = e.generate(&prompt, &params(16), |_| Ok(true)).unwrap();
    let mut all = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(all.take_warnings().is_empty());
    let want = all.generate(&prompt, &params(16), |_| Ok(true)).unwrap();
    assert_eq!(g.tokens, want.tokens);
}
