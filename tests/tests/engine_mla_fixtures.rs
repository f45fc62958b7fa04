//! The engine against transformers on the MLA fixtures (tests/fixtures/tiny/deepseek_v3_fp8,
//! tests/fixtures/tiny/glm5_fp8 and tests/fixtures/tiny/deepseek_v32_fp8): each checkpoint is converted with `coli_convert` into
//! temporary stores (lossless `--experts fp8 --dense fp8 --mtp fp8` and the default
//! `--experts int4-g64 --dense bf16 --mtp int8`), then greedy tokens, last-position logits and
//! teacher-forced top-1 are compared with `expected.json`; absorbed decode against the expanded
//! form and against one prefill; the MTP layer against `expected.json["mtp"]` (lossless store)
//! and `["mtp_int8"]` (default store); the expert-cache budget must not change the tokens.
//!
//! glm5_fp8 has `index_topk` 8: the 8-token prompt grows to 40 tokens during greedy decoding
//! and the teacher sequence has 24, so the DSA indexer really drops keys; its first positions
//! (and a 5-token prompt) have fewer keys than `index_topk`.

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{
    check_mtp, convert_fixture, expected, floats, greedy, ids, max_abs_diff, open_store, top1,
};
use serde_json::Value;
use std::path::Path;

fn open(dir: &Path) -> Store {
    open_store(dir, true, IoPreference::Auto)
}

/// KV bytes per token from the fixture's dims: f32 latent + rope key per layer, plus the
/// indexer key on GLM-5 (every layer "full" in these fixtures).
fn expected_kv_bytes(exp: &Value) -> u64 {
    let d = &exp["dims"];
    let u = |k: &str| d[k].as_u64().unwrap_or(0);
    let per_layer = u("kv_lora_rank") + u("qk_rope_head_dim") + u("index_head_dim");
    4 * u("layers") * per_layer
}

fn lossless_matches_transformers(name: &str) {
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "lossless_store");
    let store = open(&dir);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert_eq!(e.kv_bytes_per_token(), expected_kv_bytes(&exp), "{name}");
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
    assert_eq!(
        top1(&full),
        ids(&exp["teacher_top1_lossless"]),
        "{name}: teacher top-1"
    );
    // A prompt shorter than index_topk (GLM-5: every key selected) is a prefix of the above.
    e.reset();
    let short = e
        .forward(&teacher[..5], Logits::Last)
        .unwrap()
        .pop()
        .unwrap();
    let d = max_abs_diff(&short, &full[4]);
    assert!(d < 1e-4, "{name}: 5-token prompt differs by {d}");
    // Decode (one token per call) with the absorbed form (default) and the expanded form:
    // both equal one expanded prefill, and each other, within 1e-4.
    let decoded = coli_tests::decode_forms_match_prefill(&mut e, &teacher, &full, name);
    for (t, (a, x)) in decoded[0].iter().zip(&decoded[1]).enumerate() {
        let d = max_abs_diff(a, x);
        assert!(d < 1e-4, "{name}: absorbed vs expanded decode at {t}: {d}");
    }
    check_mtp(&mut e, &exp, &exp["mtp"], name);
}

fn int4_matches_transformers_whatever_the_budget(name: &str) {
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "int4_store");
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
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        assert_eq!(
            greedy(&mut e, &prompt, 32),
            want,
            "{name}: int4 greedy, budget {budget:?} threads {threads} batch {batch}"
        );
        if budget.is_some() {
            assert!(e.cache_stats().evictions > 0);
        } else {
            // The default store's MTP layer (int8) against the int8 reference.
            check_mtp(&mut e, &exp, &exp["mtp_int8"], &format!("{name} int8 MTP"));
        }
    }
}

#[test]
fn deepseek_v3_lossless_matches_transformers() {
    lossless_matches_transformers("deepseek_v3_fp8");
}

#[test]
fn deepseek_v3_int4_matches_transformers_whatever_the_budget() {
    int4_matches_transformers_whatever_the_budget("deepseek_v3_fp8");
}

#[test]
fn deepseek_v32_lossless_matches_transformers() {
    lossless_matches_transformers("deepseek_v32_fp8");
}

#[test]
fn deepseek_v32_int4_matches_transformers_whatever_the_budget() {
    int4_matches_transformers_whatever_the_budget("deepseek_v32_fp8");
}

#[test]
fn glm5_lossless_matches_transformers() {
    lossless_matches_transformers("glm5_fp8");
}

#[test]
fn glm5_int4_matches_transformers_whatever_the_budget() {
    int4_matches_transformers_whatever_the_budget("glm5_fp8");
}

/// GLM-5.2-style IndexShare: `indexer_types` ["full", "shared", "full"] on a copy of glm5_fp8
/// (no transformers outputs for it, so this checks the engine against itself): layer 1 caches
/// no indexer keys and reuses layer 0's selection; decode (absorbed) equals one prefill within
/// 1e-4, and the tokens do not depend on the expert budget, threads or prefill batch.
#[test]
fn glm5_shared_indexer_layers_decode_like_prefill() {
    let name = "glm5_fp8";
    let exp = expected(name);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ckpt");
    std::fs::create_dir(&ck).unwrap();
    for entry in std::fs::read_dir(coli_tests::fixture_dir(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, ck.join(p.file_name().unwrap())).unwrap();
    }
    let cfg_path = ck.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["indexer_types"] = serde_json::json!(["full", "shared", "full"]);
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let out = tmp.path().join("store");
    coli_convert::run(&coli_convert::Options {
        input: ck,
        output: out.clone(),
        encodings: coli_convert::Encodings {
            experts: coli_tests::encoding("int4-g64"),
            dense: coli_tests::encoding("bf16"),
            roles: Default::default(),
            mtp: Some(coli_tests::encoding("int8")),
            embeddings: None,
        },
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap();
    let prompt = ids(&exp["prompt_ids"]);
    let teacher = ids(&exp["teacher_ids"]);
    let mut tokens = Vec::new();
    for (budget, threads, batch) in [(None, 2, 32), (Some(16 << 10), 1, 3)] {
        let store = open(&out);
        let opts = EngineOptions {
            ram_budget: budget,
            threads: Some(threads),
            context: None,
            prefill_batch: batch,
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        // 3 latents (48 + 8) and 2 indexer keys (24), f32.
        assert_eq!(e.kv_bytes_per_token(), 4 * (3 * 56 + 2 * 24));
        tokens.push(greedy(&mut e, &prompt, 32));
        if budget.is_none() {
            let full = e.forward_logits(&teacher).unwrap();
            e.reset();
            for (t, &id) in teacher.iter().enumerate() {
                let l = e.forward(&[id], Logits::Last).unwrap().pop().unwrap();
                let d = max_abs_diff(&l, &full[t]);
                assert!(
                    d < 1e-4,
                    "shared indexer: decode position {t} differs by {d}"
                );
            }
        } else {
            assert!(e.cache_stats().evictions > 0);
        }
    }
    assert_eq!(tokens[0].len(), 32);
    assert_eq!(
        tokens[0], tokens[1],
        "shared indexer: placement changed the tokens"
    );
}
