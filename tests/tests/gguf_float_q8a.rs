//! GGUF stores whose every matrix is F32 or F16 (the F32 files llama.cpp's converter writes
//! with `--outtype f32`: the MTP, DeepSeek-V3.2, GLM-5.3-Flash, Kimi-Linear, Qwen3.5 and
//! Qwen3-Next fixtures) compute the same bits under `--numerics q8a` as under `exact`: the
//! integer rule takes ggml types with integer codes only, revision 4's bf16 activations the bf16
//! encoding (a GGUF's BF16 tensors become it, so a BF16 file is not exact under q8a) only
//! (docs/ENGINE.md "Precision"). So each fixture's exact oracle (its own test
//! holds the store to transformers) is its q8a oracle too. Checked bit for bit on the logits of
//! a prompt's every position and, where the store has one, the MTP layer's; a Q8_0 file's logits
//! move under q8a (the switch is live). (Its own binary: the numerics are process-wide.)

use coli_engine::{Engine, EngineOptions};
use coli_format::encoding::GgmlType;
use coli_format::Encoding;
use coli_kernels::Numerics;
use coli_store::{ExpertKey, IoPreference, Store};
use coli_tests::{gguf_convert, open_store};

const FLOAT_FIXTURES: [&str; 9] = [
    "deepseek_v3-mtp-f32",
    "deepseek_v32-mtp-f32",
    "glm4_moe-mtp-f32",
    "glm_moe_dsa-mtp-f32",
    "glm5_next-f32",
    "kimi_linear-f32",
    "qwen3_5_moe-f32",
    "qwen3_next-f32",
    "qwen3_next-hv6-f32",
];

/// Every matrix of `store` (dense tensors, every expert's three) F32 or F16: encodings whose
/// products keep f32 activations under q8a.
fn all_float(store: &Store) -> bool {
    let float = |e: Encoding| matches!(e, Encoding::F32 | Encoding::Ggml(GgmlType::F16));
    let dense = store
        .manifest()
        .dense
        .iter()
        .all(|d| float(store.dense(&d.name).expect("dense tensor").encoding));
    let experts = store.index().iter().all(|r| {
        let b = store
            .fetch_one(ExpertKey::new(r.layer.get(), r.expert.get()))
            .expect("expert");
        [b.gate(), b.up(), b.down()]
            .iter()
            .all(|m| float(m.encoding()))
    });
    dense && experts
}

/// The logits of every position of a fixed prompt, and of the MTP layer on fixed inputs where
/// the store has one, under `n`.
fn logits(store: &Store, n: Numerics) -> Vec<Vec<f32>> {
    coli_kernels::set_numerics(n);
    let mut e = Engine::new(store, &EngineOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 90 + 3).collect();
    let mut rows = e.forward_logits(&prompt).unwrap();
    if e.has_mtp() {
        let h = e.spec().hidden_size;
        let hidden: Vec<f32> = (0..3 * h).map(|i| (i as f32 * 0.37).sin()).collect();
        rows.extend(e.mtp_logits(&hidden, &[7, 11, 13]).unwrap());
    }
    rows
}

fn bits(rows: &[Vec<f32>]) -> Vec<u32> {
    rows.iter().flatten().map(|x| x.to_bits()).collect()
}

#[test]
fn float_gguf_stores_give_the_exact_bits_under_q8a() {
    for name in FLOAT_FIXTURES {
        let (_tmp, out) = gguf_convert(name);
        let store = open_store(&out, true, IoPreference::Auto);
        assert!(all_float(&store), "{name}: a matrix of an integer type");
        let exact = logits(&store, Numerics::Exact);
        let q8a = logits(&store, Numerics::Q8a);
        assert!(
            bits(&exact) == bits(&q8a),
            "{name}: q8a logits differ from exact ones"
        );
    }
    // Control: a file with Q8_0 matrices moves under q8a.
    let (_tmp, out) = gguf_convert("olmoe-q8_0");
    let store = open_store(&out, true, IoPreference::Auto);
    assert!(!all_float(&store));
    assert!(bits(&logits(&store, Numerics::Exact)) != bits(&logits(&store, Numerics::Q8a)));
}
