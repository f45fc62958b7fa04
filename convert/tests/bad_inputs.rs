//! Every kind of bad input: non-zero exit, stderr names the file/tensor/field, no store
//! (nor a partial one) left behind, input files unchanged.

mod common;
use common::*;
use serde_json::json;
use std::path::Path;

/// Writes `ck`, lets `mutate` damage the directory, runs the converter with `args`, and checks
/// the failure. Returns stderr.
fn expect_failure(
    ck: &Ckpt,
    args: &[&str],
    mutate: impl FnOnce(&Path),
    needles: &[&str],
) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let output = tmp.path().join("out");
    ck.write(&input);
    mutate(&input);
    let before = read_tree(&input);
    let o = convert(&input, &output, args);
    let err = stderr(&o);
    assert!(!o.status.success(), "conversion should fail; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr should mention {n:?}: {err}");
    }
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(!output.exists(), "OUTPUT_STORE was created");
    assert!(
        !partial(&output).exists(),
        "a partial store was left behind"
    );
    assert_eq!(before, read_tree(&input), "input files changed");
    err
}

const S1: &str = "model-00001-of-00003.safetensors";
const S2: &str = "model-00002-of-00003.safetensors";

#[test]
fn missing_shard_named_in_index() {
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| std::fs::remove_file(d.join(S2)).unwrap(),
        &[S2, "missing"],
    );
}

#[test]
fn truncated_shard() {
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| {
            let p = d.join(S2);
            let len = std::fs::metadata(&p).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(len - 100).unwrap();
        },
        &[S2, "out of bounds"],
    );
}

#[test]
fn git_lfs_pointer_in_place_of_shard() {
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| {
            std::fs::write(
                d.join(S1),
                "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
            )
            .unwrap()
        },
        &[S1, "Git-LFS pointer"],
    );
}

#[test]
fn bad_json_header() {
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| std::fs::write(d.join(S1), raw_safetensors(b"{\"a\": [1, 2", &[0; 16])).unwrap(),
        &[S1, "invalid JSON"],
    );
}

#[test]
fn header_length_past_eof() {
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| {
            let mut b = (5_000_000u64).to_le_bytes().to_vec();
            b.extend_from_slice(b"{}");
            std::fs::write(d.join(S1), b).unwrap()
        },
        &[S1, "past the end"],
    );
}

#[test]
fn shape_disagrees_with_offsets() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.tensor_mut("model.layers.0.self_attn.k_proj.weight")
        .shape = vec![80, 81];
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.layers.0.self_attn.k_proj.weight", "data_offsets"],
    );
}

#[test]
fn offsets_out_of_bounds() {
    let h = br#"{"model.norm.weight":{"dtype":"BF16","shape":[80],"data_offsets":[0,160]},"x":{"dtype":"BF16","shape":[8],"data_offsets":[160,176]}}"#;
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| std::fs::write(d.join(S1), raw_safetensors(h, &[0u8; 170])).unwrap(),
        &[S1, "out of bounds", "tensor x"],
    );
}

#[test]
fn overlapping_offsets() {
    let h = br#"{"a":{"dtype":"BF16","shape":[80],"data_offsets":[0,160]},"b":{"dtype":"BF16","shape":[80],"data_offsets":[100,260]}}"#;
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| std::fs::write(d.join(S1), raw_safetensors(h, &[0u8; 260])).unwrap(),
        &[S1, "overlap"],
    );
}

#[test]
fn duplicate_keys() {
    let h = br#"{"a":{"dtype":"BF16","shape":[80],"data_offsets":[0,160]},"a":{"dtype":"BF16","shape":[80],"data_offsets":[160,320]}}"#;
    expect_failure(
        &tiny_qwen3_fp8(2, 4),
        &[],
        |d| std::fs::write(d.join(S1), raw_safetensors(h, &[0u8; 320])).unwrap(),
        &[S1, "duplicate key \"a\""],
    );
}

#[test]
fn unsupported_dtype() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.1.input_layernorm.weight");
    t.dtype = "I32".into();
    t.shape = vec![20];
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "model.layers.1.input_layernorm.weight",
            "unsupported dtype I32",
        ],
    );
}

/// I64 is read for lookup tables only (DeepSeek-V4's `tid2eid`): an integer weight is refused,
/// naming it.
#[test]
fn integer_weights_are_refused() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.1.input_layernorm.weight");
    let n = t.shape[0];
    t.dtype = "I64".into();
    t.data = vec![0u8; 8 * n];
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "model.layers.1.input_layernorm.weight",
            "is I64",
            "only lookup tables",
        ],
    );
}

#[test]
fn missing_scale_tensor() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.remove("model.layers.1.mlp.experts.2.up_proj.weight_scale_inv");
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "model.layers.1.mlp.experts.2.up_proj.weight_scale_inv",
            "missing",
        ],
    );
}

#[test]
fn misshapen_scale_tensor() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.0.self_attn.q_proj.weight_scale_inv");
    t.shape = vec![1, 2];
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.layers.0.self_attn.q_proj.weight_scale_inv", "[2, 1]"],
    );
}

#[test]
fn nan_in_bf16_weight() {
    let mut ck = tiny_mixtral_bf16(2, 4);
    let t = ck.tensor_mut("model.layers.1.self_attn.v_proj.weight");
    // row 3, col 5 of [40, 80]
    let k = (3 * 80 + 5) * 2;
    t.data[k..k + 2].copy_from_slice(&0x7FC0u16.to_le_bytes());
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.layers.1.self_attn.v_proj.weight", "[3, 5]", "NaN"],
    );
}

#[test]
fn e4m3_nan_code_in_fp8_weight() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.1.mlp.experts.3.down_proj.weight");
    t.data[2 * 48 + 7] = 0x7F;
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "model.layers.1.mlp.experts.3.down_proj.weight",
            "[2, 7]",
            "0x7F",
        ],
    );
}

#[test]
fn e4m3_nan_code_in_lossless_store() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.0.mlp.experts.0.gate_proj.weight");
    t.data[0] = 0xFF;
    expect_failure(
        &ck,
        &["--experts", "fp8", "--dense", "fp8"],
        |_| {},
        &["model.layers.0.mlp.experts.0.gate_proj.weight", "[0, 0]"],
    );
}

#[test]
fn inf_in_scale() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    let t = ck.tensor_mut("model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv");
    t.data[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "model.layers.0.mlp.experts.1.gate_proj.weight_scale_inv",
            "inf",
        ],
    );
}

#[test]
fn config_missing_field() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.config.as_object_mut().unwrap().remove("hidden_size");
    expect_failure(&ck, &[], |_| {}, &["config.json", "hidden_size"]);
    let mut ck = tiny_mixtral_bf16(2, 4);
    ck.config
        .as_object_mut()
        .unwrap()
        .remove("num_local_experts");
    expect_failure(&ck, &[], |_| {}, &["config.json", "num_local_experts"]);
}

#[test]
fn unknown_model_type() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.config["model_type"] = json!("llama");
    expect_failure(
        &ck,
        &[],
        |_| {},
        &[
            "config.json",
            "llama",
            "mixtral",
            "qwen3_moe",
            "deepseek_v3",
        ],
    );
}

#[test]
fn fused_experts_refused() {
    let mut ck = tiny_mixtral_bf16(2, 4);
    let mut rng = Rng(7);
    ck.shards[0].1.push(bf16_tensor(
        "model.layers.0.mlp.experts.gate_up_proj",
        &[4, 96, 80],
        &mut rng,
        0.1,
    ));
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.layers.0.mlp.experts.gate_up_proj", "fused"],
    );
}

#[test]
fn missing_required_tensor_names_it() {
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.remove("model.norm.weight");
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.norm.weight", "is the last shard absent?"],
    );
    let mut ck = tiny_qwen3_fp8(2, 4);
    ck.remove("model.layers.1.mlp.experts.3.down_proj.weight");
    ck.remove("model.layers.1.mlp.experts.3.down_proj.weight_scale_inv");
    expect_failure(
        &ck,
        &[],
        |_| {},
        &["model.layers.1.mlp.experts.3.down_proj.weight", "missing"],
    );
}

#[test]
fn fp8_refused_for_non_fp8_source() {
    let ck = tiny_mixtral_bf16(2, 4);
    expect_failure(
        &ck,
        &["--experts", "fp8"],
        |_| {},
        &["block_sparse_moe.experts.0.w1.weight", "BF16", "fp8"],
    );
    expect_failure(
        &ck,
        &["--dense", "fp8"],
        |_| {},
        &["self_attn", "BF16", "--dense fp8"],
    );
}

#[test]
fn bad_parameter_value() {
    expect_failure(
        &tiny_mixtral_bf16(1, 2),
        &["--experts", "int3"],
        |_| {},
        &["--experts int3", "int4-g64"],
    );
}
