//! The Gated DeltaNet families from GGUF (issue 46): llama.cpp's own converter
//! (`conversion/qwen.py`) writes the Qwen3-Next fixture (`tests/fixtures/tiny/qwen3_next_bf16`)
//! as a `qwen3next` GGUF and the Qwen3.5-MoE fixture (`tiny/qwen3_5_moe_bf16`) as `qwen35moe`
//! (`tests/fixtures/gguf/make_gated_delta_ggufs.py`): F32 as written, Q8_0 through llama.cpp's
//! quantizer, and a Q8_0 `qwen3next` file in the form earlier converters wrote (`ssm_in`, the
//! published `in_proj_qkvz`), and two checkpoints the script makes with 3 value heads per key
//! head and dk = dv (llama.cpp's graphs run them too). The converter adds one to the zero-centred norms, writes
//! `-exp(A_log)`, splits Qwen3-Next's `in_proj_qkvz` and reorders Qwen3.5's value heads from
//! grouped to tiled; coli keeps every tensor as the file holds it but `A_log`
//! (`coli_convert::gguf::arch::derived_values`) and says the rest in config.json
//! (`zero_centered_norms`, `linear_attn_split_qkvz`, `linear_value_heads_tiled`). The oracle is
//! transformers 5.25 on the values each file holds, the converter's changes undone by the
//! script: greedy 32, teacher-forced top-1, the 150-token prompt, last logits within 1e-3. The
//! MTP block llama.cpp appends (files of the checkpoint fixtures) is the store's MTP layer: the
//! F32 files' against the fixtures' MTP reference, and `--speculate mtp` never changes tokens.

use coli_engine::{Engine, EngineOptions, Logits};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{
    byte_after, convert_fixture, greedy, ids, max_abs_diff, open_store, placement_keeps_greedy,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// (GGUF fixture, the checkpoint fixture it was written from (for an F32 file, whose values
/// are the checkpoint's), format version of its store).
const CASES: [(&str, Option<&str>, u32); 6] = [
    ("qwen3_next-f32", Some("qwen3_next_bf16"), 1),
    ("qwen3_next-ssm_in-q8_0", None, 4),
    ("qwen3_5_moe-f32", Some("qwen3_5_moe_bf16"), 1),
    ("qwen3_5_moe-q8_0", None, 4),
    // Checkpoints made by the script with 2 key and 6 value heads (3 per key head, so grouped
    // `h / 3` and tiled `h % 2` differ from `h % 3` and `h / 2`) and dk = dv, which llama.cpp
    // also runs (its teacher-forced top-1 agreement is in the .json, informational).
    ("qwen3_next-hv6-f32", None, 1),
    ("qwen3_5_moe-hv6-q8_0", None, 4),
];

fn gguf(name: &str) -> PathBuf {
    coli_tests::gguf_fixture(name)
}

fn oracle(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/gguf/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn gated_delta_ggufs_run_as_the_oracle_and_keep_the_blocks() {
    for (name, fixture, version) in CASES {
        let exp = oracle(name);
        assert_eq!(
            coli_tests::sha256_hex(&std::fs::read(gguf(name)).unwrap()),
            exp["gguf_sha256"].as_str().unwrap(),
            "{name}: the committed GGUF is the one make_gated_delta_ggufs.py wrote"
        );
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        let store = open_store(&dir, true, IoPreference::Auto);
        assert_eq!(store.manifest().format_version, version, "{name}");
        // What the converter changed, said in the config the spec reads.
        let config = &store.manifest().config;
        let t = config.get("text_config").unwrap_or(config);
        assert_eq!(t["zero_centered_norms"], false, "{name}");
        let qwen35 = name.starts_with("qwen3_5");
        assert_eq!(
            t["linear_value_heads_tiled"].as_bool().unwrap_or(false),
            qwen35,
            "{name}"
        );
        if !qwen35 {
            assert_eq!(
                t["linear_attn_split_qkvz"],
                !name.contains("ssm_in"),
                "{name}"
            );
        }
        // The experts' blocks and the first input projection bit for bit, in their GGUF types.
        coli_tests::check_gguf_probe(&store, &exp["probe"], name);

        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let last_long = coli_tests::check_oracle(&mut e, &exp, "", name);
        let long = ids(&exp["long_prompt_ids"]);

        // The MTP block llama.cpp appends (`blk.L.nextn.*`, the checkpoint's `mtp.*`) is the
        // store's MTP layer where the file has one (those of the checkpoint fixtures; the
        // checkpoints the script makes have none).
        assert_eq!(e.has_mtp(), !name.contains("hv6"), "{name}: MTP layer");
        // An F32 file holds its checkpoint's numbers (the norms' `1 + w` and `A_log`'s round
        // trip aside): the store converted from the checkpoint itself gives the same logits,
        // and its MTP layer the drafts transformers-side reference gave the checkpoint
        // (make_qwen3_next_fixtures.py / make_qwen3_5_moe_fixtures.py: vLLM's MTP module).
        if e.has_mtp() {
            // Drafting with it never changes the tokens (the oracle's greedy 32).
            let params = coli_engine::GenerateParams {
                max_tokens: 32,
                sampling: Default::default(),
                stop_on_eos: false,
                speculation: coli_engine::SpeculationParams {
                    mode: coli_engine::Speculate::Mtp,
                    draft_tokens: 3,
                    gate: false,
                    ..Default::default()
                },
            };
            let got = e
                .generate(&ids(&exp["prompt_ids"]), &params, |_| Ok(true))
                .unwrap();
            assert_eq!(got.tokens, ids(&exp["greedy"]), "{name}: --speculate mtp");
            let sp = &got.stats.speculation;
            assert!(
                got.stats.speculation_mode == coli_engine::Speculate::Mtp && sp.drafts_proposed > 0,
                "{name}: the MTP layer drafted ({sp:?})"
            );
        }
        if let Some(fixture) = fixture {
            let fx = coli_tests::expected(fixture);
            coli_tests::check_mtp(&mut e, &fx, &fx["mtp"], &format!("{name} MTP"));
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
}

#[test]
fn gated_delta_ggufs_placement_never_changes_tokens() {
    for (name, _, _) in CASES {
        let exp = oracle(name);
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        placement_keeps_greedy(
            &dir,
            ExpertKey::new(1, 0),
            &ids(&exp["prompt_ids"]),
            &ids(&exp["greedy"]),
            name,
        );
    }
}

#[test]
fn gated_delta_layer_kinds_without_recurrent_layers_come_from_the_interval() {
    // A file without `attention.recurrent_layers` (renamed here): llama.cpp then reads the
    // layer kinds from `full_attention_interval` (written as 4, the fixtures' pattern).
    for name in ["qwen3_next-f32", "qwen3_5_moe-f32"] {
        let exp = oracle(name);
        let tmp = tempfile::tempdir().unwrap();
        let mut b = std::fs::read(gguf(name)).unwrap();
        let at = byte_after(&b, b".attention.recurrent_layers") - 1;
        b[at] = b'X';
        let src = tmp.path().join("no-recurrent-layers.gguf");
        std::fs::write(&src, &b).unwrap();
        let out = tmp.path().join("store");
        coli_tests::gguf_try_convert(&src, &out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let store = open_store(&out, true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        assert_eq!(
            greedy(&mut e, &ids(&exp["prompt_ids"]), 32),
            ids(&exp["greedy"]),
            "{name}: greedy 32"
        );
    }
}

/// Converts a damaged copy of GGUF fixture `name` and returns the error; nothing published.
fn refused(name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    coli_tests::gguf_refused(&gguf(name), "bad.gguf", damage)
}

fn set_u32(b: &mut [u8], key: &str, v: u32) {
    // A u32 value: its type (4 bytes), then the value.
    let at = byte_after(b, key.as_bytes()) + 4;
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn gated_delta_gguf_bad_inputs_are_refused_naming_the_key_or_tensor() {
    const NEXT: &str = "qwen3_next-f32";
    const Q35: &str = "qwen3_5_moe-f32";
    // `ssm_a` is -exp(A_log): a positive value is no decay llama.cpp writes.
    let g = coli_convert::gguf::file::Gguf::open(&gguf(Q35)).unwrap();
    let a = g.data(&g.tensors["blk.1.ssm_a"]).to_vec();
    drop(g);
    let e = refused(Q35, |b| {
        let at = byte_after(b, &a) - a.len();
        b[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    });
    assert!(
        e.contains("blk.1.ssm_a") && e.contains("value 0 is 0.5"),
        "{e}"
    );
    // Value heads that are no multiple of the key heads; an inner size no multiple of them.
    let e = refused(NEXT, |b| set_u32(b, "qwen3next.ssm.time_step_rank", 3));
    assert!(e.contains("qwen3next.ssm.time_step_rank"), "{e}");
    let e = refused(Q35, |b| set_u32(b, "qwen35moe.ssm.inner_size", 95));
    assert!(e.contains("qwen35moe.ssm.inner_size"), "{e}");
    // Dimensions the tensors contradict: named by tensor.
    let e = refused(Q35, |b| set_u32(b, "qwen35moe.ssm.state_size", 8));
    assert!(e.contains("blk.0.") && e.contains("shape"), "{e}");
    // Attention heads of two sizes.
    let e = refused(NEXT, |b| set_u32(b, "qwen3next.attention.value_length", 16));
    assert!(e.contains("qwen3next.attention.value_length"), "{e}");
    // A layer marked recurrent whose tensors are attention's (layer 3 of
    // `attention.recurrent_layers`: the array's value type, element type, count, then a byte
    // per bool).
    let e = refused(NEXT, |b| {
        let at = byte_after(b, b"qwen3next.attention.recurrent_layers") + 16;
        b[at + 3] = 1;
    });
    assert!(e.contains("blk.3."), "{e}");
    // The split input projection missing (renamed): named.
    let e = refused(NEXT, |b| {
        let at = byte_after(b, b"blk.2.attn_gate.weight") - 8;
        b[at] = b'X';
    });
    assert!(
        e.contains("blk.2.attn_gate.weight") && e.contains("missing"),
        "{e}"
    );
    let e = refused(Q35, |b| {
        let at = byte_after(b, b"blk.0.ssm_alpha.weight") - 8;
        b[at] = b'X';
    });
    assert!(
        e.contains("blk.0.ssm_alpha.weight") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn gated_delta_gguf_stores_are_not_exported_back() {
    for (name, _, _) in CASES {
        let (tmp, dir) = coli_tests::gguf_convert(name);
        let out = tmp.path().join("back.gguf");
        let e = coli_tools::export::run(&dir, &out).unwrap_err().to_string();
        assert!(
            e.contains("qwen35moe") && e.contains("not written back"),
            "{name}: {e}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn gated_delta_plan_from_the_gguf_header_matches_the_store() {
    for (name, _, _) in CASES {
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        coli_tests::check_gguf_plan(&gguf(name), &dir, name);
    }
}
