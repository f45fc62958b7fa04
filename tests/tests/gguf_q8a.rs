//! GGUF stores under the integer-activation numerics (`--numerics q8a`; since rule revision 2
//! the ggml block types with integer codes take int8 activations per block of 32, as llama.cpp
//! pairs them with q8 activations, kernels/src/q8a.rs step 3; the mxfp4 and int4 matrices some
//! of these stores hold follow step 2) against transformers with the rule's activation step
//! emulated on the input of every quantized product (`tests/fixtures/gguf/make_gguf_fixtures.py`
//! `install_q8a`; `make_gated_delta_ggufs.py`, `make_deepseek_v4_gguf.py` and `make_kda_ggufs.py`
//! for the files of `MORE_Q8A`):
//! greedy 32, teacher-forced top-1, last logits within 1e-3; the expected logits moved from the
//! exact numerics' by more than the tolerance, and the engine's are nearer the q8a expectation
//! than the exact one. The all-float files compute the exact numbers under q8a
//! (`gguf_float_q8a.rs`). (Its own binary: the numerics are process-wide.)

use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, Logits};
use coli_format::Encoding;
use coli_kernels::Numerics;
use coli_store::IoPreference;
use coli_tests::{floats, greedy, ids, max_abs_diff, open_store, top1};
use serde_json::Value;
use std::path::Path;

/// GGUF fixtures outside `GGUF_FIXTURES` with a `q8a` section on their own prompt and teacher
/// ids: the Q8_0 Gated DeltaNet files (`make_gated_delta_ggufs.py --q8a-only`: Qwen3.5-MoE as
/// llama.cpp's quantizer writes it, with 6 value heads, and Qwen3-Next's legacy fused `ssm_in`
/// form), DeepSeek-V4's (`make_deepseek_v4_gguf.py --q8a-only`: Q8_0 linears, MXFP4
/// experts, a BF16 head under revision 4's bf16 activations) and Kimi K3's
/// (`make_kda_ggufs.py --q8a-only`: MXFP4 experts in an F32 model, the fixture's transcription).
const MORE_Q8A: [&str; 5] = [
    "qwen3_5_moe-q8_0",
    "qwen3_5_moe-hv6-q8_0",
    "qwen3_next-ssm_in-q8_0",
    "deepseek_v4-mxfp4",
    "kimi_k3-mxfp4",
];

/// Converts the GGUF fixture `name` and holds it under q8a to its JSON's `q8a` section (prompt
/// and teacher ids there, else the JSON's own).
fn check_q8a(dir: &Path, name: &str) {
    let exp: Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).unwrap()).unwrap();
    let q = &exp["q8a"];
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    coli_convert::gguf::run(&Options {
        input: dir.join(format!("{name}.gguf")),
        output: out.clone(),
        encodings: Encodings::new(Encoding::Bf16, Encoding::Bf16, Encoding::Bf16),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap();
    let store = open_store(&out, true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let or_top = |k: &str| {
        if q[k].is_null() {
            ids(&exp[k])
        } else {
            ids(&q[k])
        }
    };
    let prompt = or_top("prompt_ids");
    assert_eq!(
        greedy(&mut e, &prompt, 32),
        ids(&q["greedy"]),
        "{name}: q8a greedy 32 tokens"
    );
    e.reset();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last, &floats(&q["last_logits"]));
    assert!(d < 1e-3, "{name}: q8a last logits differ by {d}");
    let moved = q["moved_from_exact"].as_f64().unwrap();
    // The exact numerics' logits on these ids are `moved` away from the q8a ones.
    assert!(
        moved > 1e-2 && moved > 10.0 * d as f64,
        "{name}: the engine ({d} from q8a, the exact oracle {moved} from it) does not tell the numerics apart"
    );
    if q["prompt_ids"].is_null() {
        let to_exact = max_abs_diff(&last, &floats(&exp["last_logits"]));
        assert!(
            to_exact > 10.0 * d,
            "{name}: the engine is {to_exact} from the exact expectation, {d} from q8a"
        );
    }
    let rows = e.forward_logits(&or_top("teacher_ids")).unwrap();
    assert_eq!(
        top1(&rows),
        ids(&q["teacher_top1"]),
        "{name}: q8a teacher-forced top-1"
    );
}

#[test]
fn gguf_stores_match_transformers_under_q8a() {
    coli_kernels::set_numerics(Numerics::Q8a);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf");
    for name in coli_tests::GGUF_FIXTURES.iter().chain(&MORE_Q8A) {
        check_q8a(&dir, name);
    }
}
