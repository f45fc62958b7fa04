//! The engine against transformers on the MLA fixtures (tests/fixtures/tiny/deepseek_v3_fp8):
//! the checkpoint is converted with `coli_convert` into temporary stores (lossless
//! `--experts fp8 --dense fp8 --mtp fp8` and `--experts int4-g64 --dense bf16 --mtp int8`),
//! then greedy tokens, last-position logits and teacher-forced top-1 are compared with
//! `expected.json`; the expert-cache budget must not change the tokens.

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{convert_fixture, expected, greedy, ids, open_store};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Converts fixture `name` with the encodings of `expected.json[variant]` into a temp dir.
fn convert(name: &str, variant: &str) -> (tempfile::TempDir, PathBuf) {
    convert_fixture(name, variant)
}

fn open(dir: &Path) -> Store {
    open_store(dir, true, IoPreference::Auto)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn deepseek_v3_lossless_matches_transformers() {
    let name = "deepseek_v3_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert(name, "lossless_store");
    let store = open(&dir);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let prompt = ids(&exp["prompt_ids"]);
    assert_eq!(
        greedy(&mut e, &prompt, 32),
        ids(&exp["greedy_lossless"]),
        "{name}: greedy 32 tokens"
    );
    e.reset();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last, &floats(&exp["last_logits_lossless"]));
    assert!(d < 1e-3, "{name}: last logits differ by {d}");
    let teacher = ids(&exp["teacher_ids"]);
    let full = e.forward_logits(&teacher).unwrap();
    let top1: Vec<u32> = full
        .iter()
        .map(|l| coli_engine::sampling::argmax(l))
        .collect();
    assert_eq!(
        top1,
        ids(&exp["teacher_top1_lossless"]),
        "{name}: teacher top-1"
    );
    // Decode (one token per call, latent cache) gives the same logits as one prefill.
    e.reset();
    for (t, &id) in teacher.iter().enumerate() {
        let l = e.forward(&[id], Logits::Last).unwrap().pop().unwrap();
        let d = max_abs_diff(&l, &full[t]);
        assert!(d < 1e-4, "{name}: decode position {t} differs by {d}");
    }
}

#[test]
fn deepseek_v3_int4_matches_transformers_whatever_the_budget() {
    let name = "deepseek_v3_fp8";
    let exp = expected(name);
    let (_tmp, dir) = convert(name, "int4_store");
    let want = ids(&exp["greedy_int4_g64"]);
    let prompt = ids(&exp["prompt_ids"]);
    let probe = open(&dir);
    let layers = &probe.manifest().expert_layers;
    let one = probe
        .fetch_one(ExpertKey::new(layers[0].layer, 0))
        .unwrap()
        .len_bytes() as u64;
    drop(probe);
    for (budget, threads, batch) in [(None, 2, 32), (Some(one), 1, 3)] {
        let store = open(&dir);
        let opts = EngineOptions {
            ram_budget: budget,
            threads: Some(threads),
            context: None,
            prefill_batch: batch,
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        assert_eq!(
            greedy(&mut e, &prompt, 32),
            want,
            "{name}: int4 greedy, budget {budget:?} threads {threads} batch {batch}"
        );
        if budget.is_some() {
            assert!(e.cache_stats().evictions > 0);
        }
    }
}
