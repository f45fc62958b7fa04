//! int4 dense encodings and per-role choices (issue 23) on the committed GLM-5 fixture
//! (tests/fixtures/tiny/glm5_fp8: MLA attention, DSA indexer, a dense first layer, shared
//! experts, an MTP layer): which tensor gets which encoding, the recorded parameters and
//! format version, and the refusals.

mod common;
use coli_format::Encoding;
use coli_store::Store;
use common::*;
use std::path::PathBuf;

fn glm5() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny/glm5_fp8")
}

fn enc(st: &Store, name: &str) -> Encoding {
    st.dense(name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .encoding
}

#[test]
fn per_role_choices_reach_every_tensor_of_their_role() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let o = convert(
        &glm5(),
        &out,
        &[
            "--dense",
            "int4-g64",
            "--attention",
            "int8",
            "--shared-experts",
            "int4-g32",
            "--embeddings",
            "int4-g32",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for k in [
        "attention",
        "indexer",
        "shared_experts",
        "dense_mlp",
        "embeddings",
    ] {
        let e = rep["rel_rms_error"][k].as_f64().unwrap_or(0.0);
        assert!(e > 0.0 && e < 0.2, "{k}: relative RMS error {e}");
    }
    let st = Store::open(&out).unwrap();
    let m = st.manifest();
    assert_eq!(m.format_version, 3);
    let p = &m.parameters;
    assert_eq!(p["dense"], "int4-g64");
    assert_eq!(p["attention"], "int8");
    assert_eq!(p["shared_experts"], "int4-g32");
    assert_eq!(p["embeddings"], "int4-g32");
    assert!(!p.contains_key("indexer") && !p.contains_key("dense_mlp"));

    let g64 = Encoding::Int4 { group_size: 64 };
    let g32 = Encoding::Int4 { group_size: 32 };
    let l = "model.layers";
    for (name, want) in [
        (format!("{l}.0.self_attn.q_a_proj.weight"), Encoding::Int8),
        (format!("{l}.1.self_attn.kv_b_proj.weight"), Encoding::Int8),
        (format!("{l}.2.self_attn.o_proj.weight"), Encoding::Int8),
        // The indexer follows --dense; its weights_proj stays BF16 as published.
        (format!("{l}.0.self_attn.indexer.wq_b.weight"), g64),
        (format!("{l}.0.self_attn.indexer.wk.weight"), g64),
        (
            format!("{l}.0.self_attn.indexer.weights_proj.weight"),
            Encoding::Bf16,
        ),
        // Layer 0 is dense (first_k_dense_replace 1): its MLP follows --dense.
        (format!("{l}.0.mlp.gate_proj.weight"), g64),
        (format!("{l}.1.mlp.shared_experts.down_proj.weight"), g32),
        // Routers, norms and biases as in the source.
        (format!("{l}.1.mlp.gate.weight"), Encoding::Bf16),
        (format!("{l}.1.input_layernorm.weight"), Encoding::Bf16),
        ("model.embed_tokens.weight".into(), g32),
        ("lm_head.weight".into(), g32),
        // The MTP layer (3) follows --mtp (int8), its own embedding as in the source.
        (format!("{l}.3.self_attn.q_a_proj.weight"), Encoding::Int8),
        (format!("{l}.3.eh_proj.weight"), Encoding::Int8),
        (format!("{l}.3.embed_tokens.weight"), Encoding::Bf16),
    ] {
        assert_eq!(enc(&st, &name), want, "{name}");
    }
}

#[test]
fn dense_encodings_without_int4_keep_the_older_format_version() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let o = convert(&glm5(), &out, &["--dense", "int8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(Store::open(&out).unwrap().manifest().format_version, 1);
}

#[test]
fn bad_role_choices_are_refused_and_name_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    for (args, want) in [
        (
            &["--attention", "int3"][..],
            "--attention int3: expected one of bf16, int8, int4-g64, int4-g32, fp8",
        ),
        (
            &["--embeddings", "fp8"][..],
            "--embeddings fp8: expected one of source, int8, int4-g64, int4-g32",
        ),
        (
            &["--dense-mlp", "mxfp4"][..],
            "--dense-mlp mxfp4: expected one of",
        ),
    ] {
        let o = convert(&glm5(), &out, args);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!out.exists(), "nothing published on a refusal");
    }
    // A role the model does not have is refused, not silently recorded.
    let input_q =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny/qwen3_moe_bf16");
    for (args, want) in [
        (
            &["--indexer", "int4-g32"][..],
            "--indexer int4-g32: this qwen3_moe model has no DSA indexer weights",
        ),
        (
            &["--shared-experts", "int8"][..],
            "--shared-experts int8: this qwen3_moe model has no shared-expert weights",
        ),
        (
            &["--total-ram", "0"][..],
            "--total-ram 0 bytes leaves nothing",
        ),
        (&["--context", "4096"][..], "give --total-ram too"),
    ] {
        let o = convert(&input_q, &out, args);
        assert!(!o.status.success(), "{args:?}");
        let e = stderr(&o);
        assert!(e.contains(want), "{args:?}: {e}");
        assert!(!out.exists());
    }
    // --mtp ENCODING on a model without an MTP layer is refused, naming the option; --mtp none
    // is accepted (it changes nothing) and recorded; an unknown value lists the choices.
    let o = convert(&input_q, &out, &["--mtp", "bf16"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--mtp bf16: this qwen3_moe model has no MTP layer")
            && e.contains("drop the option"),
        "{e}"
    );
    assert!(!out.exists() && !tmp.path().join("store.partial").exists());
    // A config that declares an MTP layer the checkpoint does not hold (a copy stripped of
    // model.layers.3.*): an explicit --mtp is refused, naming the option and --mtp none; the
    // default converts the main model.
    let stripped = tmp.path().join("glm5-no-mtp");
    copy_without_prefix(&glm5(), &stripped, "model.layers.3.");
    let o = convert(&stripped, &out, &["--mtp", "int8"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--mtp int8")
            && e.contains("holds none of its tensors")
            && e.contains("--mtp none"),
        "{e}"
    );
    assert!(!out.exists() && !tmp.path().join("store.partial").exists());
    let o = convert(&stripped, &out, &["--mtp", "none"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&out).unwrap();
    let o = convert(&input_q, &out, &["--mtp", "int2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("int8, bf16, fp8, none"),
        "{}",
        stderr(&o)
    );
    let o = convert(&input_q, &out, &["--mtp", "none"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("mtp=none"));
    std::fs::remove_dir_all(&out).unwrap();
    // fp8 for a role asked of a BF16 checkpoint names that role's option.
    let input = tmp.path().join("bf16");
    tiny_mixtral_bf16(1, 2).write(&input);
    let o = convert(&input, &out, &["--attention", "fp8"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("--attention fp8 keeps FP8 weights only"), "{e}");
    assert!(!out.exists());
}

#[test]
fn a_resume_with_other_role_choices_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let o = convert(&glm5(), &out, &["--dense", "int4-g64"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = convert(
        &glm5(),
        &out,
        &["--dense", "int4-g64", "--attention", "int8"],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(
            "parameter attention: existing the --dense encoding (the default) vs requested int8"
        ),
        "{e}"
    );
}

#[test]
fn the_text_report_names_only_what_is_true() {
    // A model without an MTP layer: no `mtp=` in the converted line, no rows for classes that
    // had nothing converted; a model with one: `mtp=int8`.
    let tmp = tempfile::tempdir().unwrap();
    let mixtral =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny/mixtral_fp8");
    let o = convert(&mixtral, &tmp.path().join("a"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The report without the output path, whose random temporary name may hold "n/a".
    let t = stdout(&o).replace(&tmp.path().display().to_string(), "TMP");
    assert!(
        t.contains("converted mixtral (dense=bf16 experts=int4-g64)"),
        "{t}"
    );
    assert!(!t.contains("mtp") && !t.contains("n/a"), "{t}");
    let o = convert(&glm5(), &tmp.path().join("b"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(
        t.contains("mtp=int8") && t.contains("relative RMS error mtp:"),
        "{t}"
    );
}

#[test]
fn total_ram_preflight_prints_the_plan_and_names_the_options_that_fit() {
    use coli_convert::memory_plan::{
        plan_from_config, ConfigPlanArgs, RUNTIME_RESERVE_BYTES, USABLE_CONTEXT,
    };
    // A RAM size where the int4 dense + int4 embeddings configuration just keeps every expert
    // cached at 8k tokens and the bf16 default does not.
    let p = plan_from_config(&ConfigPlanArgs {
        gguf: None,
        checkpoint: Some(&glm5()),
        config: None,
        total_ram: 1 << 30,
        context: Some(USABLE_CONTEXT),
        disk_gib_s: None,
        experts: None,
        mtp: Some(Encoding::Int8),
        chosen: None,
    })
    .unwrap();
    let int4 = p
        .rows
        .iter()
        .find(|r| r.dense_encoding == "int4-g64" && r.embeddings_encoding == "int4-g64")
        .unwrap();
    let total = int4.dense_bytes + int4.kv_bytes + RUNTIME_RESERVE_BYTES + p.expert_bytes_total;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let total_s = total.to_string();
    let ctx = USABLE_CONTEXT.to_string();
    let o = convert(
        &glm5(),
        &out,
        &["--total-ram", &total_s, "--context", &ctx, "--json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("bf16 (chosen)"), "{e}");
    assert!(
        e.contains("warning: these encodings are not usable")
            && e.contains("these are: --dense int4-g64 --embeddings int4-g64"),
        "{e}"
    );
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        rep["status"], "converted",
        "the plan warns, the conversion goes on"
    );

    // The chosen int4 configuration fits: no warning.
    let out2 = tmp.path().join("store2");
    let o = convert(
        &glm5(),
        &out2,
        &[
            "--total-ram",
            &total_s,
            "--context",
            &ctx,
            "--dense",
            "int4-g64",
            "--embeddings",
            "int4-g64",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("int4-g64 (chosen)") && !e.contains("warning"),
        "{e}"
    );

    // The plan's other options need --total-ram.
    let o = convert(&glm5(), &tmp.path().join("s3"), &["--disk-gib-s", "3"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("give --total-ram too"),
        "{}",
        stderr(&o)
    );
}

/// A closed standard output (`coli-convert ... --json | head -c1`): the store is written, the
/// report's print fails with EPIPE, and the converter exits 0 with nothing on stderr.
#[test]
fn a_closed_stdout_ends_the_converter_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_coli-convert"))
        .arg(glm5())
        .arg(&out)
        .arg("--json")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.trim().is_empty(), "{err}");
    assert!(out.join("MANIFEST").exists());
}

/// Copies the checkpoint `src` to `dst` without the tensors whose names start with `prefix`
/// (safetensors headers rewritten, data repacked, the index's weight_map filtered).
fn copy_without_prefix(src: &std::path::Path, dst: &std::path::Path, prefix: &str) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&p).unwrap();
        let out = if name.ends_with(".safetensors") {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let data = &bytes[8 + n..];
            let mut new_header = serde_json::Map::new();
            let mut new_data = Vec::new();
            for (k, v) in header {
                if k == "__metadata__" {
                    new_header.insert(k, v);
                    continue;
                }
                if k.starts_with(prefix) {
                    continue;
                }
                let o = v["data_offsets"].as_array().unwrap();
                let (a, b) = (
                    o[0].as_u64().unwrap() as usize,
                    o[1].as_u64().unwrap() as usize,
                );
                let start = new_data.len();
                new_data.extend_from_slice(&data[a..b]);
                let mut v = v.clone();
                v["data_offsets"] = serde_json::json!([start, new_data.len()]);
                new_header.insert(k, v);
            }
            let h = serde_json::to_vec(&new_header).unwrap();
            let mut out = (h.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&h);
            out.extend_from_slice(&new_data);
            out
        } else if name == "model.safetensors.index.json" {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            v["weight_map"]
                .as_object_mut()
                .unwrap()
                .retain(|k, _| !k.starts_with(prefix));
            serde_json::to_vec(&v).unwrap()
        } else {
            bytes
        };
        std::fs::write(dst.join(name), out).unwrap();
    }
}
