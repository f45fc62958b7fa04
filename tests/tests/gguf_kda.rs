//! The KDA families from GGUF (issue 46): llama.cpp's own converter (`conversion/kimi_k3.py`,
//! `kimi_linear.py`, `glm.py`) writes the Kimi K3 fixture (`tests/fixtures/tiny/kimi_k3_mxfp4`,
//! the release's layout) as a `kimi-k3` GGUF, the Kimi-Linear fixture (`tiny/kimi_linear_bf16`)
//! as `kimi-linear` and the GLM-5.3-Flash fixture (`tiny/glm5_next_bf16`) as `glm5-next`
//! (`tests/fixtures/gguf/make_kda_ggufs.py`: F32 tensors; K3's compressed-tensors experts
//! repacked to ggml MXFP4, checked equal to the checkpoint's values by gguf-py). Each GGUF holds
//! its checkpoint's numbers, so the fixture's oracle applies as it is (the torch transcription
//! for K3, transformers 5.25 for the others): greedy 32, teacher-forced top-1, the 150-token
//! prompt, last logits within 1e-3. The experts' blocks are kept bit for bit; `-exp(A_log)`
//! (`ssm_a`) and K3's fused attention-residual scores come back as the checkpoint's tensors
//! (`coli_convert::gguf::arch::derived_values`).

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{
    byte_after, convert_fixture, expected, ids, max_abs_diff, open_store, placement_keeps_greedy,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// (GGUF fixture, the checkpoint fixture it was written from, format version of its store).
const CASES: [(&str, &str, u32); 3] = [
    ("kimi_k3-mxfp4", "kimi_k3_mxfp4", 6),
    // F32 records and tensors only: the first format version.
    ("kimi_linear-f32", "kimi_linear_bf16", 1),
    ("glm5_next-f32", "glm5_next_bf16", 1),
];

/// The K3 file, which the bad-input tests damage.
const K3: &str = "kimi_k3-mxfp4";

fn gguf(name: &str) -> PathBuf {
    coli_tests::gguf_fixture(name)
}

fn probe(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/gguf/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn kda_ggufs_run_as_the_oracle_and_keep_the_blocks() {
    for (name, fixture, version) in CASES {
        let p = probe(name);
        assert_eq!(
            coli_tests::sha256_hex(&std::fs::read(gguf(name)).unwrap()),
            p["gguf_sha256"].as_str().unwrap(),
            "{name}: the committed GGUF is the one make_kda_ggufs.py wrote"
        );
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        let store = open_store(&dir, true, IoPreference::Auto);
        assert_eq!(store.manifest().format_version, version, "{name}");
        // The experts' blocks and a split kv_b bit for bit, in their GGUF types.
        coli_tests::check_gguf_probe(&store, &p["probe"], name);

        // The fixture's oracle (the GGUF holds the checkpoint's values).
        let exp = expected(fixture);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let last_long = coli_tests::check_oracle(&mut e, &exp, "_lossless", name);
        let long = ids(&exp["long_prompt_ids"]);

        // And the store converted from the checkpoint itself: the same numbers, up to the
        // f32 / bf16 kernels' sums and `ssm_a`'s round trip.
        let (_t2, st) = convert_fixture(fixture, "lossless_store");
        let st = open_store(&st, true, IoPreference::Auto);
        let mut e2 = Engine::new(&st, &EngineOptions::default()).unwrap();
        let last2 = e2.forward(&long, Logits::Last).unwrap().pop().unwrap();
        let d = max_abs_diff(&last_long, &last2);
        assert!(
            d < 1e-4,
            "{name}: GGUF and safetensors stores differ by {d}"
        );
    }
}

#[test]
fn kda_ggufs_placement_never_changes_tokens() {
    for (name, fixture, _) in CASES {
        let exp = expected(fixture);
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        placement_keeps_greedy(
            &dir,
            ExpertKey::new(1, 0),
            &ids(&exp["prompt_ids"]),
            &ids(&exp["greedy_lossless"]),
            name,
        );
    }
}

/// Converts a damaged copy of the kimi-k3 GGUF and returns the error; nothing published.
fn refused(damage: impl FnOnce(&mut Vec<u8>)) -> String {
    refused_from(K3, damage)
}

/// [`refused`] on a damaged copy of GGUF fixture `name`.
fn refused_from(name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    coli_tests::gguf_refused(&gguf(name), "k3.gguf", damage)
}

#[test]
fn kimi_k3_gguf_bad_inputs_are_refused_naming_the_key_or_tensor() {
    // `ssm_a` is -exp(A_log): a positive value is no decay llama.cpp writes.
    let g = coli_convert::gguf::file::Gguf::open(&gguf(K3)).unwrap();
    let a = g.data(&g.tensors["blk.1.ssm_a"]).to_vec();
    drop(g);
    let e = refused(|b| {
        let at = byte_after(b, &a) - a.len();
        b[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    });
    assert!(
        e.contains("blk.1.ssm_a") && e.contains("value 0 is 0.5"),
        "{e}"
    );
    // Every layer MLA (`head_count_kv` without a 0): not Kimi K3's mix.
    let e = refused(|b| {
        // The array: value type (4), element type (4), count (8), then 5 u32.
        let at = byte_after(b, b"kimi-k3.attention.head_count_kv") + 16;
        for i in 0..5 {
            b[at + 4 * i..at + 4 * i + 4].copy_from_slice(&1u32.to_le_bytes());
        }
    });
    assert!(
        e.contains("kimi-k3.attention.head_count_kv") && e.contains("every layer"),
        "{e}"
    );
    // Softmax routing.
    let e = refused(|b| {
        let at = byte_after(b, b"kimi-k3.expert_gating_func") + 4;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(
        e.contains("kimi-k3.expert_gating_func") && e.contains("sigmoid"),
        "{e}"
    );
    // A layer kind the tensors contradict: layer 1 made an MLA layer, whose tensors are KDA's.
    let e = refused(|b| {
        let at = byte_after(b, b"kimi-k3.attention.head_count_kv") + 16;
        b[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(e.contains("blk.1."), "{e}");
    // Keys K3's graph requires, missing (renamed): refused naming them, not run as another
    // model.
    for key in [
        "kimi-k3.activation.situ_beta",
        "kimi-k3.activation.situ_linear_beta",
        "kimi-k3.attn_res.block_size",
        "kimi-k3.expert_shared_count",
    ] {
        let e = refused(|b| {
            let at = byte_after(b, key.as_bytes()) - 1;
            b[at] = b'X';
        });
        assert!(e.contains(key), "{key}: {e}");
    }
    // An MLA layer's output gate missing: named as the gate, not as KDA's.
    let e = refused(|b| {
        let at = byte_after(b, b"blk.2.attn_gate.weight") - 8;
        b[at] = b'X';
    });
    assert!(
        e.contains("blk.2.attn_gate.weight") && e.contains("missing"),
        "{e}"
    );
    // GLM-5.3-Flash: a SwiGLU limit that differs between layers (the array: value type,
    // element type, count, then f32 per block), and RoPE in its NoPE layers.
    let e = refused_from("glm5_next-f32", |b| {
        let at = byte_after(b, b"glm5-next.swiglu_clamp_exp") + 16;
        b[at..at + 4].copy_from_slice(&2.0f32.to_le_bytes());
    });
    assert!(
        e.contains("glm5-next.swiglu_clamp_exp") && e.contains("one limit"),
        "{e}"
    );
    let e = refused_from("glm5_next-f32", |b| {
        let at = byte_after(b, b"glm5-next.rope.dimension_count") + 4;
        b[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
    });
    assert!(
        e.contains("glm5-next.rope.dimension_count") && e.contains("no RoPE"),
        "{e}"
    );
}

#[test]
fn kda_gguf_stores_are_not_exported_back() {
    for (name, _, _) in CASES {
        let (tmp, dir) = coli_tests::gguf_convert(name);
        let out = tmp.path().join("back.gguf");
        let e = coli_tools::export::run(&dir, &out).unwrap_err().to_string();
        assert!(
            e.contains("glm5-next") && e.contains("not written back"),
            "{name}: {e}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn kda_plan_from_the_gguf_header_matches_the_store() {
    for (name, _, _) in CASES {
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        coli_tests::check_gguf_plan(&gguf(name), &dir, name);
    }
}
