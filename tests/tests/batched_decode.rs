//! Batched decode: a sequence's logits do not depend on what else is in the forward pass.
//!
//! For every tiny fixture family (converted to an int4 store) eight prompts of different
//! lengths are first run alone, on the engine's own sequence (prefill in `--prefill-batch`
//! chunks, then greedy decode), recording every logits row. Then the same eight run through
//! [`Engine::forward_many`] on a fixed join/leave schedule: sequences join at different steps,
//! their prompt chunks share passes with the others' decode tokens, and they leave after
//! different numbers of tokens. Every logits row must equal the one of the solo run bit for bit,
//! with expert budgets from unbounded down to one expert, with lookahead prefetch and pinning
//! on and off, and with another thread count than the solo run.
//!
//! `COLI_DEMO_STORE=DIR cargo test -p coli-tests --test batched_decode -- --ignored` runs the
//! same check on the demo store (tools/test.sh does so once tests/demo_e2e.py has built it).

use coli_engine::{BatchItem, Engine, EngineOptions, Logits, Sequence};
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{convert_fixture, expected, ids, open_store};
use std::path::Path;

const FAMILIES: [&str; 18] = coli_tests::FIXTURE_FAMILIES;

/// Sequences of the schedule.
const SEQS: usize = 8;
/// Tokens per prefill chunk (prompts are 3..=14 tokens: one to four chunks).
const PREFILL_BATCH: usize = 4;

/// Prompt `i`: `3 + (5 i mod 12)` ids derived from the fixture prompt `base`.
fn prompt(base: &[u32], i: usize, vocab: u32) -> Vec<u32> {
    let len = 3 + (5 * i) % 12;
    (0..len)
        .map(|t| (base[(t + i) % base.len()] * 7 + (i * 13 + t) as u32) % vocab)
        .collect()
}

/// Step at which sequence `i` joins and the tokens it generates before leaving.
fn schedule(i: usize) -> (usize, usize) {
    (i / 2 + (i % 3), 2 + (3 * i) % 5)
}

fn argmax(row: &[f32]) -> u32 {
    coli_engine::sampling::argmax(row)
}

/// Every logits row of prompt `p` run alone: the last prompt position, then each decode step
/// (greedy; `gen` tokens sampled, `gen - 1` fed back).
fn solo(e: &mut Engine<'_>, p: &[u32], gen: usize) -> Vec<Vec<f32>> {
    e.reset();
    let mut rows = vec![e.forward(p, Logits::Last).unwrap().pop().unwrap()];
    for _ in 1..gen {
        let id = argmax(rows.last().unwrap());
        rows.push(e.forward(&[id], Logits::Last).unwrap().pop().unwrap());
    }
    rows
}

/// One sequence of the batched run.
struct Slot {
    seq: Sequence,
    prompt: Vec<u32>,
    fed: usize,
    gen: usize,
    rows: Vec<Vec<f32>>,
}

/// The schedule run with [`Engine::forward_many`]; returns each sequence's logits rows and the
/// largest number of sequences that shared a pass.
fn batched(e: &mut Engine<'_>, prompts: &[Vec<u32>]) -> (Vec<Vec<Vec<f32>>>, usize) {
    let mut slots: Vec<Option<Slot>> = (0..prompts.len()).map(|_| None).collect();
    let mut done: Vec<Option<Vec<Vec<f32>>>> = vec![None; prompts.len()];
    let mut widest = 0;
    for step in 0.. {
        for (i, p) in prompts.iter().enumerate() {
            if schedule(i).0 == step {
                slots[i] = Some(Slot {
                    seq: e.new_sequence().unwrap(),
                    prompt: p.clone(),
                    fed: 0,
                    gen: schedule(i).1,
                    rows: Vec::new(),
                });
            }
        }
        if slots.iter().all(Option::is_none) && done.iter().all(Option::is_some) {
            break;
        }
        // Each active sequence feeds its next prompt chunk or its last greedy token.
        let mut feeds: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        for (i, s) in slots.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.fed < s.prompt.len() {
                let end = (s.fed + PREFILL_BATCH).min(s.prompt.len());
                feeds.push((i, s.prompt[s.fed..end].to_vec(), end == s.prompt.len()));
            } else {
                feeds.push((i, vec![argmax(s.rows.last().unwrap())], true));
            }
        }
        if feeds.is_empty() {
            continue;
        }
        widest = widest.max(feeds.len());
        let mut taken: Vec<(usize, Slot)> = feeds
            .iter()
            .map(|(i, _, _)| (*i, slots[*i].take().unwrap()))
            .collect();
        let mut items: Vec<BatchItem<'_>> = taken
            .iter_mut()
            .zip(&feeds)
            .map(|((_, s), (_, ids, last))| BatchItem {
                seq: &mut s.seq,
                ids,
                logits: last.then_some(Logits::Last),
                verify: false,
            })
            .collect();
        let out = e.forward_many(&mut items).unwrap();
        drop(items);
        for ((i, mut s), (rows, (_, ids, _))) in taken.into_iter().zip(out.into_iter().zip(&feeds))
        {
            if s.fed < s.prompt.len() {
                s.fed += ids.len();
            }
            s.rows.extend(rows);
            if s.rows.len() == s.gen {
                done[i] = Some(std::mem::take(&mut s.rows));
                // Dropping the slot frees its sequence.
            } else {
                slots[i] = Some(s);
            }
        }
    }
    (done.into_iter().map(Option::unwrap).collect(), widest)
}

fn one_expert(store: &Store) -> u64 {
    let l = store.manifest().expert_layers[0].layer;
    store.fetch_one(ExpertKey::new(l, 0)).unwrap().len_bytes() as u64
}

/// Solo vs batched on `dir` under several placements; `name` for messages.
fn check_store(dir: &Path, name: &str, base: &[u32], configs: &[(Option<u64>, bool, bool, usize)]) {
    let tmp = tempfile::tempdir().unwrap();
    let usage = tmp.path().join("usage.json");
    let store = open_store(dir, false, IoPreference::Auto);
    let vocab = {
        let e = Engine::new(&store, &EngineOptions::default()).unwrap();
        e.spec().vocab_size as u32
    };
    let prompts: Vec<Vec<u32>> = (0..SEQS).map(|i| prompt(base, i, vocab)).collect();
    // The reference: each prompt alone, 2 threads, unbounded budget; its routing becomes the
    // usage history the pinned configurations pin from.
    let mut reference = Engine::new(
        &store,
        &EngineOptions {
            ram_budget: Some(u64::MAX),
            threads: Some(2),
            prefill_batch: PREFILL_BATCH,
            usage: Some(usage.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let want: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| solo(&mut reference, p, schedule(i).1))
        .collect();
    reference.save_usage();
    assert!(reference.take_warnings().is_empty());
    drop(reference);
    let one = one_expert(&store);
    for &(budget, prefetch, pin, threads) in configs {
        let budget = budget.map(|b| if b == 1 { one } else { b });
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                ram_budget: budget,
                prefetch,
                pin,
                usage: pin.then(|| usage.clone()),
                threads: Some(threads),
                prefill_batch: PREFILL_BATCH,
                max_sequences: SEQS,
                ..Default::default()
            },
        )
        .unwrap();
        let (got, widest) = batched(&mut e, &prompts);
        let what =
            format!("{name}: budget {budget:?} prefetch {prefetch} pin {pin} threads {threads}");
        assert!(
            widest >= 5,
            "{what}: the schedule must batch (widest pass {widest})"
        );
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{what}: sequence {i} rows");
            for (t, (a, b)) in g.iter().zip(w).enumerate() {
                let same =
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{what}: sequence {i} logits row {t} differ from its solo run"
                );
            }
        }
        if budget == Some(one) {
            assert!(
                e.cache_stats().evictions > 0,
                "{what}: the budget must evict"
            );
        }
        assert_eq!(e.sequences_in_use(), 0, "{what}: every sequence was freed");
    }
    forks_equal_solo(&store, name, &prompts[7], &want[7]);
}

/// Forked sequences continue exactly as the solo run: a whole copy after the prompt (n
/// completions share a prefill) decoding beside its source, and a copy of a prefix (a new
/// conversation starting from another's common prefix) that prefills the rest itself.
fn forks_equal_solo(store: &Store, name: &str, p: &[u32], want: &[Vec<f32>]) {
    let mut e = Engine::new(
        store,
        &EngineOptions {
            threads: Some(2),
            prefill_batch: PREFILL_BATCH,
            max_sequences: 3,
            ..Default::default()
        },
    )
    .unwrap();
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    // The source: the prompt in PREFILL_BATCH chunks, as the solo run fed it.
    let mut src = e.new_sequence().unwrap();
    let mut last = Vec::new();
    for chunk in p.chunks(PREFILL_BATCH) {
        let mut items = [BatchItem {
            seq: &mut src,
            ids: chunk,
            logits: Some(Logits::Last),
            verify: false,
        }];
        last = e.forward_many(&mut items).unwrap().remove(0).remove(0);
    }
    assert!(same(&last, &want[0]), "{name}: prefilled source");
    let mut whole = e.fork_sequence(&src, usize::MAX).unwrap();
    // A prefix copy ending on a chunk boundary, so its remaining chunks match the solo run's.
    let k = PREFILL_BATCH.min(p.len() - 1);
    let mut prefix = e.fork_sequence(&src, k).unwrap();
    assert_eq!((whole.tokens(), prefix.tokens()), (src.tokens(), &p[..k]));
    for chunk in p[k..].chunks(PREFILL_BATCH) {
        let mut items = [BatchItem {
            seq: &mut prefix,
            ids: chunk,
            logits: Some(Logits::Last),
            verify: false,
        }];
        last = e.forward_many(&mut items).unwrap().remove(0).remove(0);
    }
    assert!(
        same(&last, &want[0]),
        "{name}: prefix fork prefilled the rest"
    );
    let mut ids = [argmax(&want[0]); 3];
    for (t, row) in want.iter().enumerate().skip(1) {
        let mut items: Vec<BatchItem<'_>> = [&mut src, &mut whole, &mut prefix]
            .into_iter()
            .zip(&ids)
            .map(|(seq, id)| BatchItem {
                seq,
                ids: std::slice::from_ref(id),
                logits: Some(Logits::Last),
                verify: false,
            })
            .collect();
        let out = e.forward_many(&mut items).unwrap();
        for (i, rows) in out.iter().enumerate() {
            assert!(
                same(&rows[0], row),
                "{name}: sequence {i} (0 source, 1 whole fork, 2 prefix fork) row {t}"
            );
        }
        ids = [argmax(row); 3];
    }
}

/// (budget (1 = one expert), prefetch, pin, threads)
const CONFIGS: [(Option<u64>, bool, bool, usize); 3] = [
    (None, true, true, 1),
    (Some(1), false, false, 2),
    (Some(1), true, true, 2),
];

#[test]
fn batched_logits_equal_solo_logits_on_every_family() {
    for name in FAMILIES {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        check_store(&dir, name, &ids(&exp["prompt_ids"]), &CONFIGS);
    }
}

#[test]
fn sequences_past_the_planned_count_are_refused() {
    let (_tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let store = open_store(&dir, false, IoPreference::Auto);
    let mut e = Engine::new(
        &store,
        &EngineOptions {
            max_sequences: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let a = e.new_sequence().unwrap();
    let b = e.new_sequence().unwrap();
    let err = e.new_sequence().err().expect("a third sequence is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("all 2 sequences") && msg.contains("--max-batch"),
        "{msg}"
    );
    // The engine's own sequence counts while it holds tokens.
    assert!(e.forward(&[1, 2], Logits::Last).is_err());
    drop(b);
    e.forward(&[1, 2], Logits::Last).unwrap();
    assert!(e.new_sequence().is_err());
    e.reset();
    let c = e.fork_sequence(&a, usize::MAX).unwrap();
    assert_eq!(c.len(), a.len());
    assert_eq!(e.sequences_in_use(), 2);
    // A context overflow in one item runs nothing.
    let mut a = a;
    let long = vec![1u32; e.context() + 1];
    let mut items = [BatchItem {
        seq: &mut a,
        ids: &long,
        logits: Some(Logits::Last),
        verify: false,
    }];
    assert!(e.forward_many(&mut items).is_err());
    assert!(a.is_empty());
}

#[test]
#[ignore = "needs COLI_DEMO_STORE (tools/test.sh sets it after building the demo store)"]
fn batched_logits_equal_solo_logits_on_the_demo_store() {
    let dir = std::env::var("COLI_DEMO_STORE").expect("COLI_DEMO_STORE=<demo store dir>");
    let store = open_store(Path::new(&dir), false, IoPreference::Auto);
    // A chat-ish prompt of the SmolLM2 vocabulary: ids below 1000 are common BPE pieces.
    let base: Vec<u32> = vec![504, 2365, 314, 260, 3458, 28, 339, 1073, 253, 1432, 30];
    drop(store);
    check_store(Path::new(&dir), "demo", &base, &CONFIGS[..2]);
}

/// A pass whose expert read fails rolls every sequence of it back, and the same pass run again
/// once the store is whole gives the bits of an uninterrupted run.
///
/// The fault is real bytes on disk: one byte of every expert record of the second MoE layer is
/// flipped in a private copy of the store (opened with checksums verified), so the pass fails
/// after its first layer has already appended keys and values (latents and indexer keys on the
/// MLA families) for every sequence. The failing pass holds three decoding sequences and a
/// fourth one's first prompt chunk; the budget of one expert keeps the layer's experts out of
/// RAM. Then the bytes are restored and the schedule finishes: every logits row equals the
/// sequence's solo run.
#[test]
fn a_failed_expert_read_rolls_back_every_sequence_of_the_pass() {
    for name in [
        "olmoe_fp8",
        "deepseek_v3_fp8",
        "glm5_fp8",
        "qwen3_next_bf16",
        "qwen3_5_moe_bf16",
        "kimi_linear_bf16",
    ] {
        let exp = expected(name);
        let (_tmp, dir) = convert_fixture(name, "int4_store");
        let base = ids(&exp["prompt_ids"]);
        let store = open_store(&dir, true, IoPreference::Auto);
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                threads: Some(2),
                prefill_batch: PREFILL_BATCH,
                ..Default::default()
            },
        )
        .unwrap();
        let vocab = e.spec().vocab_size as u32;
        // The fourth prompt (7 tokens) is longer than a chunk: the failing pass feeds its first.
        let prompts: Vec<Vec<u32>> = (0..4)
            .map(|i| prompt(&base, if i == 3 { 8 } else { i + 2 }, vocab))
            .collect();
        assert!(prompts[3].len() > PREFILL_BATCH);
        const GEN: usize = 4;
        let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| solo(&mut e, p, GEN)).collect();
        drop(e);

        let one = one_expert(&store);
        let mut e = Engine::new(
            &store,
            &EngineOptions {
                ram_budget: Some(one),
                prefetch: false,
                pin: false,
                threads: Some(2),
                prefill_batch: PREFILL_BATCH,
                max_sequences: 4,
                ..Default::default()
            },
        )
        .unwrap();
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let mut seqs: Vec<Sequence> = (0..4).map(|_| e.new_sequence().unwrap()).collect();
        let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 4];
        // The first three prefill chunk by chunk side by side, then decode one token.
        let mut fed = [0usize; 4];
        while (0..3).any(|i| fed[i] < prompts[i].len()) {
            let feeds: Vec<(usize, Vec<u32>)> = (0..3)
                .filter(|&i| fed[i] < prompts[i].len())
                .map(|i| {
                    let end = (fed[i] + PREFILL_BATCH).min(prompts[i].len());
                    (i, prompts[i][fed[i]..end].to_vec())
                })
                .collect();
            let mut order: Vec<usize> = feeds.iter().map(|f| f.0).collect();
            let out = forward_some(&mut e, &mut seqs, &mut order, |i| {
                let (_, ids) = feeds.iter().find(|f| f.0 == i).unwrap();
                let last = fed[i] + ids.len() == prompts[i].len();
                (ids.clone(), last)
            })
            .unwrap();
            for (i, r) in out {
                fed[i] += feeds.iter().find(|f| f.0 == i).unwrap().1.len();
                rows[i].extend(r);
            }
        }
        let decode_ids = |rows: &[Vec<Vec<f32>>], i: usize| vec![argmax(rows[i].last().unwrap())];

        // Corrupt the second MoE layer's records.
        let layers = &store.manifest().expert_layers;
        let layer = layers[1.min(layers.len() - 1)].layer;
        let mut saved = Vec::new();
        for rec in store.index().iter().filter(|r| r.layer.get() == layer) {
            let path = dir.join(coli_format::disk::names::segment_rel(rec.segment.get()));
            let at = rec.offset.get() + rec.payload_len.get() / 2;
            let byte = read_byte(&path, at);
            saved.push((path.clone(), at, byte));
            write_byte(&path, at, byte ^ 0x5A);
        }
        assert!(!saved.is_empty(), "{name}: layer {layer} has records");
        let before: Vec<Vec<u32>> = seqs.iter().map(|s| s.tokens().to_vec()).collect();
        let first_chunk = prompts[3][..PREFILL_BATCH.min(prompts[3].len())].to_vec();
        let mut order = vec![0, 1, 2, 3];
        let err = forward_some(&mut e, &mut seqs, &mut order, |i| {
            if i == 3 {
                (first_chunk.clone(), first_chunk.len() == prompts[3].len())
            } else {
                (decode_ids(&rows, i), true)
            }
        })
        .err()
        .unwrap_or_else(|| panic!("{name}: the pass over corrupted records must fail"));
        let msg = err.to_string();
        assert!(msg.contains("checksum"), "{name}: {msg}");
        for (i, s) in seqs.iter().enumerate() {
            assert_eq!(
                s.tokens(),
                &before[i][..],
                "{name}: sequence {i} was not rolled back"
            );
        }

        // Whole again: the same pass, then the rest of the schedule.
        for (path, at, byte) in &saved {
            write_byte(path, *at, *byte);
        }
        fed[3] = 0;
        loop {
            let mut order: Vec<usize> = (0..4).filter(|&i| rows[i].len() < GEN).collect();
            if order.is_empty() {
                break;
            }
            let chunks: Vec<(usize, Vec<u32>, bool)> = order
                .iter()
                .map(|&i| {
                    if fed[i] < prompts[i].len() {
                        let end = (fed[i] + PREFILL_BATCH).min(prompts[i].len());
                        (i, prompts[i][fed[i]..end].to_vec(), end == prompts[i].len())
                    } else {
                        (i, decode_ids(&rows, i), true)
                    }
                })
                .collect();
            let out = forward_some(&mut e, &mut seqs, &mut order, |i| {
                let c = chunks.iter().find(|c| c.0 == i).unwrap();
                (c.1.clone(), c.2)
            })
            .unwrap_or_else(|err| panic!("{name}: after the repair: {err}"));
            for (i, r) in out {
                if fed[i] < prompts[i].len() {
                    fed[i] += chunks.iter().find(|c| c.0 == i).unwrap().1.len();
                }
                rows[i].extend(r);
            }
        }
        for i in 0..4 {
            assert_eq!(rows[i].len(), GEN, "{name}: sequence {i}");
            for (t, (a, b)) in rows[i].iter().zip(&want[i]).enumerate() {
                assert!(
                    same(a, b),
                    "{name}: sequence {i} row {t} differs from its solo run after the rollback"
                );
            }
        }
    }
}

/// One [`Engine::forward_many`] over the sequences `order` names; `feed(i)` gives sequence
/// `i`'s ids and whether it wants its last row's logits. Returns `(i, logits rows)` per item.
fn forward_some(
    e: &mut Engine<'_>,
    seqs: &mut [Sequence],
    order: &mut [usize],
    feed: impl Fn(usize) -> (Vec<u32>, bool),
) -> coli_engine::Result<Vec<(usize, Vec<Vec<f32>>)>> {
    order.sort_unstable();
    let feeds: Vec<(Vec<u32>, bool)> = order.iter().map(|&i| feed(i)).collect();
    let mut chosen: Vec<&mut Sequence> = seqs
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| order.contains(i))
        .map(|(_, s)| s)
        .collect();
    let mut items: Vec<BatchItem<'_>> = chosen
        .iter_mut()
        .zip(&feeds)
        .map(|(seq, (ids, last))| BatchItem {
            seq,
            ids,
            logits: last.then_some(Logits::Last),
            verify: false,
        })
        .collect();
    let out = e.forward_many(&mut items)?;
    Ok(order.iter().copied().zip(out).collect())
}

/// The byte at `at` of the file `path`.
fn read_byte(path: &Path, at: u64) -> u8 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    b[0]
}

/// Writes `byte` at `at` of the file `path` in place (the rest of the file untouched).
fn write_byte(path: &Path, at: u64, byte: u8) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(&[byte], at)
        .unwrap();
}
