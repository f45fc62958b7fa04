//! The engine against transformers on the GLM-4.5-family fixture (tests/fixtures/tiny/
//! glm4_moe_fp8, made by `make_glm4_moe_fixtures.py`): GQA with q/k/v biases, per-head q/k
//! norms and RoPE over half of each head (`partial_rotary_factor` 0.5, 10 of 20 dimensions),
//! a dense first layer, grouped sigmoid routing (2 groups, 1 kept) with a shared expert and
//! `routed_scaling_factor` 2.5, and an MTP layer published without its own embedding and head.
//!
//! The checkpoint is converted into temporary stores (lossless `--experts fp8 --dense fp8 --mtp
//! fp8` and the default `--experts int4-g64 --dense bf16 --mtp int8`); greedy tokens, last
//! logits and teacher-forced top-1 are compared with `expected.json`, decode against one
//! prefill, the MTP layer against transformers' `MtpModel`, and the int4 tokens whatever the
//! expert budget, threads and prefill batch.

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{
    check_mtp, convert_fixture, expected, floats, greedy, ids, max_abs_diff, open_store, top1,
};
use std::path::Path;

const NAME: &str = "glm4_moe_fp8";

fn open(dir: &Path) -> Store {
    open_store(dir, true, IoPreference::Auto)
}

#[test]
fn glm4_moe_lossless_matches_transformers() {
    let exp = expected(NAME);
    let (_tmp, dir) = convert_fixture(NAME, "lossless_store");
    let store = open(&dir);
    // The MTP layer has no embed_tokens / shared_head.head: nothing of the kind is stored.
    let names: Vec<&str> = store
        .manifest()
        .dense
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert!(names.contains(&"model.layers.3.eh_proj.weight"));
    assert!(!names
        .iter()
        .any(|n| n.starts_with("model.layers.3.embed_tokens")
            || n.starts_with("model.layers.3.shared_head.head")));
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let d = &exp["dims"];
    let u = |k: &str| d[k].as_u64().unwrap();
    assert_eq!(
        e.kv_bytes_per_token(),
        4 * u("layers") * 2 * u("kv_heads") * u("head_dim"),
        "f32 keys and values of every layer"
    );
    let prompt = ids(&exp["prompt_ids"]);
    assert_eq!(
        greedy(&mut e, &prompt, 32),
        ids(&exp["greedy_lossless"]),
        "greedy 32 tokens"
    );
    e.reset();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let dl = max_abs_diff(&last, &floats(&exp["last_logits_lossless"]));
    assert!(dl < 1e-3, "last logits differ by {dl}");
    let teacher = ids(&exp["teacher_ids"]);
    let full = e.forward_logits(&teacher).unwrap();
    assert_eq!(
        top1(&full),
        ids(&exp["teacher_top1_lossless"]),
        "teacher top-1"
    );
    // Decode one token per call equals one prefill.
    e.reset();
    for (t, &id) in teacher.iter().enumerate() {
        let l = e.forward(&[id], Logits::Last).unwrap().pop().unwrap();
        let dd = max_abs_diff(&l, &full[t]);
        assert!(
            dd < 1e-4,
            "decode position {t} differs from prefill by {dd}"
        );
    }
    check_mtp(&mut e, &exp, &exp["mtp"], "lossless");
}

#[test]
fn glm4_moe_int4_matches_transformers_whatever_the_budget() {
    let exp = expected(NAME);
    let (_tmp, dir) = convert_fixture(NAME, "int4_store");
    let want = ids(&exp["greedy_int4_g64"]);
    let prompt = ids(&exp["prompt_ids"]);
    let probe = open(&dir);
    let first = probe.manifest().expert_layers[0].layer;
    assert_eq!(first, 1, "layer 0 is dense (first_k_dense_replace 1)");
    let one = probe
        .fetch_one(ExpertKey::new(first, 0))
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
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        assert_eq!(
            greedy(&mut e, &prompt, 32),
            want,
            "int4 greedy, budget {budget:?} threads {threads} batch {batch}"
        );
        if budget.is_some() {
            assert!(e.cache_stats().evictions > 0);
        } else {
            check_mtp(&mut e, &exp, &exp["mtp_int8"], "int8 MTP");
        }
    }
}
