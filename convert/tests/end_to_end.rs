//! Whole conversions of hand-written checkpoints: values in the store, determinism across
//! thread counts, resume after a failpoint abort or SIGKILL, refusal of changed parameters.

mod common;
use coli_store::{ExpertKey, Store};
use common::*;
use std::time::{Duration, Instant};

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn e4m3(b: u8) -> f32 {
    coli_format::encoding::fp8_e4m3_to_f32(b)
}

#[test]
fn bf16_mixtral_lossless_values_and_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in"), tmp.path().join("store"));
    let ck = tiny_mixtral_bf16(2, 4);
    ck.write(&input);
    let o = convert(&input, &output, &["--experts", "bf16", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(rep["status"], "converted");
    assert_eq!(rep["experts"], 8);
    assert_eq!(rep["rel_rms_error"]["experts"], 0.0);
    assert_eq!(rep["rel_rms_error"]["attention"], 0.0);
    let st = Store::open(&output).unwrap();
    assert_eq!(st.index().len(), 8);
    // expert (1, 3) down: bytes equal to the source BF16
    let src = &ck.shards[ck
        .find("model.layers.1.block_sparse_moe.experts.3.w2.weight")
        .0]
        .1[ck
        .find("model.layers.1.block_sparse_moe.experts.3.w2.weight")
        .1];
    let x = st.fetch_one(ExpertKey::new(1, 3)).unwrap();
    assert_eq!(x.down().data(), &src.data[..]);
    let d = st.dense("model.layers.0.self_attn.q_proj.weight").unwrap();
    let (si, ti) = ck.find("model.layers.0.self_attn.q_proj.weight");
    assert_eq!(d.data, &ck.shards[si].1[ti].data[..]);
    assert_eq!(
        st.file("chat_template.jinja").unwrap().unwrap(),
        b"{{ messages }}"
    );
    assert_eq!(
        st.file("generation_config.json").unwrap().unwrap(),
        b"{\"eos_token_id\": 2}\n"
    );
    assert!(st.file("config.json").unwrap().is_some());
}

#[test]
fn fp8_qwen3_lossless_and_int4_values() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let ck = tiny_qwen3_fp8(2, 4);
    ck.write(&input);
    let lossless = tmp.path().join("lossless");
    let o = convert(&input, &lossless, &["--experts", "fp8", "--dense", "fp8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let st = Store::open(&lossless).unwrap();
    let name = "model.layers.1.mlp.experts.2.down_proj.weight";
    let (si, ti) = ck.find(name);
    let w = &ck.shards[si].1[ti];
    let (ssi, sti) = ck.find(&format!("{name}_scale_inv"));
    let scale = f32s(&ck.shards[ssi].1[sti].data)[0];
    let x = st.fetch_one(ExpertKey::new(1, 2)).unwrap();
    assert_eq!(x.down().data(), &w.data[..]);
    assert_eq!(x.down().scales(), &[scale]);
    // q_proj [160, 80] with a BF16 [2, 1] scale in another shard: kept, widened exactly.
    let q = st.dense("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.scales.len(), 2);
    let (ssi, sti) = ck.find("model.layers.0.self_attn.q_proj.weight_scale_inv");
    let sb = &ck.shards[ssi].1[sti].data;
    assert_eq!(
        q.scales[1],
        f32::from_bits((u16::from_le_bytes([sb[2], sb[3]]) as u32) << 16)
    );
    // Router stays BF16.
    let r = st.dense("model.layers.0.mlp.gate.weight").unwrap();
    assert_eq!(r.encoding, coli_store::Encoding::Bf16);

    // Default store: int4-g64 experts; dequantized values close to the source, exact per FORMAT.
    let int4 = tmp.path().join("int4");
    let o = convert(&input, &int4, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let err = rep["rel_rms_error"]["experts"].as_f64().unwrap();
    assert!(err > 0.01 && err < 0.2, "int4 rel error {err}");
    let st4 = Store::open(&int4).unwrap();
    let x4 = st4.fetch_one(ExpertKey::new(1, 2)).unwrap();
    let g = x4.gate();
    assert_eq!(g.encoding(), coli_store::Encoding::Int4 { group_size: 64 });
    let gname = "model.layers.1.mlp.experts.2.gate_proj.weight";
    let (si, ti) = ck.find(gname);
    let (ssi, sti) = ck.find(&format!("{gname}_scale_inv"));
    let gs = f32s(&ck.shards[ssi].1[sti].data)[0];
    let src: Vec<f32> = ck.shards[si].1[ti].data[..80]
        .iter()
        .map(|&b| e4m3(b) * gs)
        .collect();
    let mut row = vec![0f32; 80];
    g.dequantize_row(0, &mut row);
    for (grp, sg) in [(0..64, 0usize), (64..80, 1)] {
        let absmax = src[grp.clone()].iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = (absmax / 7.0).max(1e-8);
        assert_eq!(g.scales()[sg], s);
        for c in grp {
            let q = (src[c] / s).round_ties_even().clamp(-8.0, 7.0);
            assert_eq!(row[c], q * s, "col {c}");
        }
    }
    // Attention in bf16: RNE of the dequantized FP8 value.
    let k = st4.dense("model.layers.0.self_attn.k_proj.weight").unwrap();
    assert_eq!(k.encoding, coli_store::Encoding::Bf16);
    let kn = "model.layers.0.self_attn.k_proj.weight";
    let (si, ti) = ck.find(kn);
    let (ssi, sti) = ck.find(&format!("{kn}_scale_inv"));
    let sb = &ck.shards[ssi].1[sti].data;
    let ks = f32::from_bits((u16::from_le_bytes([sb[0], sb[1]]) as u32) << 16);
    let v0 = e4m3(ck.shards[si].1[ti].data[0]) * ks;
    assert_eq!(u16::from_le_bytes([k.data[0], k.data[1]]), bf16_bits(v0));
    assert_eq!(
        st4.file("tokenizer.json").unwrap().unwrap(),
        b"{\"version\": \"1.0\"}"
    );
}

#[test]
fn embeddings_int8_values_and_refusal() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let ck = tiny_mixtral_bf16(2, 4);
    ck.write(&input);
    let out = tmp.path().join("store");
    let o = convert(&input, &out, &["--embeddings", "int8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let err = rep["rel_rms_error"]["embeddings"].as_f64().unwrap();
    assert!(err > 0.0 && err < 0.02, "int8 embeddings rel error {err}");
    let st = Store::open(&out).unwrap();
    assert_eq!(
        st.manifest()
            .parameters
            .get("embeddings")
            .map(String::as_str),
        Some("int8")
    );
    // Both the embedding and the (untied) lm_head: per-row int8, s = absmax / 127, q = RNE(w / s).
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        let d = st.dense(name).unwrap();
        assert_eq!(d.encoding, coli_store::Encoding::Int8, "{name}");
        let m = d.matrix();
        let (si, ti) = ck.find(name);
        let src: Vec<f32> = ck.shards[si].1[ti]
            .data
            .chunks_exact(2)
            .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
            .collect();
        let mut row = vec![0f32; m.cols()];
        for r in 0..m.rows() {
            let sr = &src[r * m.cols()..(r + 1) * m.cols()];
            let absmax = sr.iter().fold(0f32, |a, x| a.max(x.abs()));
            let s = (absmax / 127.0).max(1e-8);
            assert_eq!(m.scales()[r], s, "{name} row {r} scale");
            m.dequantize_row(r, &mut row);
            for c in 0..m.cols() {
                let q = (sr[c] / s).round_ties_even().clamp(-128.0, 127.0);
                assert_eq!(row[c], q * s, "{name} [{r}, {c}]");
            }
        }
    }
    // The other dense tensors keep their encodings (router and norms bf16, attention bf16).
    let q = st.dense("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.encoding, coli_store::Encoding::Bf16);
    // Only int8, int4 (or the source encoding) is accepted.
    let o = convert(&input, &tmp.path().join("bad"), &["--embeddings", "fp8"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--embeddings fp8") && e.contains("int8, int4-g64"),
        "{e}"
    );
    assert!(!tmp.path().join("bad").exists());
}

#[test]
fn threads_do_not_change_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    tiny_qwen3_fp8(2, 4).write(&input);
    for args in [&[][..], &["--experts", "int8", "--dense", "int8"][..]] {
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
        let mut a1 = args.to_vec();
        a1.extend(["--threads", "1"]);
        let mut a2 = args.to_vec();
        a2.extend(["--threads", "2"]);
        let o = convert(&input, &a, &a1);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = convert(&input, &b, &a2);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_same_tree(&a, &b);
    }
}

#[test]
fn resume_after_failpoint_and_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    tiny_qwen3_fp8(2, 4).write(&input);
    let reference = tmp.path().join("ref");
    let o = convert(&input, &reference, &[]);
    assert!(o.status.success(), "{}", stderr(&o));

    let out = tmp.path().join("out");
    let o = convert_env(
        &input,
        &out,
        &[],
        &[("COLI_FAILPOINT", "convert.after_expert:3")],
    );
    assert!(!o.status.success(), "failpoint should abort");
    assert!(!out.exists());
    assert!(partial(&out).exists());
    let o = convert(&input, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("resumed: skipped 3 experts"),
        "{}",
        stderr(&o)
    );
    assert_same_tree(&reference, &out);

    let o = convert(&input, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("already complete"), "{}", stdout(&o));

    let o = convert(&input, &out, &["--experts", "int8"]);
    assert!(!o.status.success());
    let e = stderr(&o).to_lowercase();
    assert!(e.contains("int8") && e.contains("int4"), "{e}");
    assert_same_tree(&reference, &out);

    // Other failpoints: after preflight nothing exists; after dense the rerun finishes.
    let out2 = tmp.path().join("out2");
    let o = convert_env(
        &input,
        &out2,
        &[],
        &[("COLI_FAILPOINT", "convert.after_preflight")],
    );
    assert!(!o.status.success());
    assert!(!out2.exists() && !partial(&out2).exists());
    let o = convert_env(
        &input,
        &out2,
        &[],
        &[("COLI_FAILPOINT", "convert.after_dense")],
    );
    assert!(!o.status.success());
    let o = convert(&input, &out2, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rep: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(rep["dense_skipped"].as_u64().unwrap() > 0);
    assert_same_tree(&reference, &out2);
}

#[test]
fn random_sigkills_then_resume_give_identical_store() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    tiny_qwen3_fp8(4, 16).write(&input);
    let reference = tmp.path().join("ref");
    let t0 = Instant::now();
    let o = convert(&input, &reference, &["--threads", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let full = t0.elapsed();
    eprintln!("reference conversion took {full:?}");
    let out = tmp.path().join("out");
    let mut rng = Rng(0x5EED);
    for _ in 0..3 {
        let mut child = std::process::Command::new(bin())
            .arg(&input)
            .arg(&out)
            .args(["--threads", "1"])
            .env_remove("COLI_FAILPOINT")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let frac = rng.below(1000) as f64 / 1000.0;
        std::thread::sleep(Duration::from_secs_f64(full.as_secs_f64() * frac));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        eprintln!(
            "killed after {frac:.3} of the reference time: partial {}, store {}",
            partial(&out).exists(),
            out.exists()
        );
    }
    let o = convert(&input, &out, &["--threads", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_same_tree(&reference, &out);
}

#[test]
fn single_file_checkpoint_with_f16_scale_and_f16_norm() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    let mut ck = tiny_qwen3_fp8(1, 2);
    // F16 scale for expert (0, 1) up; F16 final norm (kept: widened to F32 exactly).
    let f16 = |x: f32| half::f16::from_f32(x).to_bits().to_le_bytes();
    let t = ck.tensor_mut("model.layers.0.mlp.experts.1.up_proj.weight_scale_inv");
    let v = f32s(&t.data)[0];
    t.dtype = "F16".into();
    t.data = f16(v).to_vec();
    let t = ck.tensor_mut("model.norm.weight");
    t.dtype = "F16".into();
    t.data = (0..80).flat_map(|k| f16(0.5 + k as f32 / 64.0)).collect();
    std::fs::create_dir_all(&input).unwrap();
    std::fs::write(
        input.join("config.json"),
        serde_json::to_vec(&ck.config).unwrap(),
    )
    .unwrap();
    let all: Vec<T> = ck.shards.iter().flat_map(|(_, ts)| ts.clone()).collect();
    std::fs::write(input.join("model.safetensors"), safetensors_bytes(&all)).unwrap();
    let out = tmp.path().join("store");
    let o = convert(&input, &out, &["--experts", "fp8", "--dense", "fp8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let st = Store::open(&out).unwrap();
    let x = st.fetch_one(ExpertKey::new(0, 1)).unwrap();
    assert_eq!(
        x.up().scales(),
        &[half::f16::from_bits(u16::from_le_bytes(f16(v))).to_f32()]
    );
    let n = st.dense("model.norm.weight").unwrap();
    assert_eq!(n.encoding, coli_store::Encoding::F32);
    let vals = f32s(n.data);
    assert_eq!(vals[3], 0.5 + 3.0 / 64.0);
    assert_eq!(st.manifest().sources.len(), 1);
    assert_eq!(st.manifest().sources[0].name, "model.safetensors");
}

#[test]
fn trailing_slash_output_and_missing_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    tiny_mixtral_bf16(1, 2).write(&input);
    let out = tmp.path().join("store");
    let mut with_slash = out.clone().into_os_string();
    with_slash.push("/");
    let o = convert(&input, std::path::Path::new(&with_slash), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("MANIFEST").exists());
    assert!(!out.join(".partial").exists());
    let o = convert(&input, &tmp.path().join("no/such/dir/store"), &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("parent directory"), "{}", stderr(&o));
}

#[test]
fn a_second_converter_on_the_same_target_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in");
    tiny_mixtral_bf16(2, 4).write(&input);
    let out = tmp.path().join("store");
    let lock = tmp.path().join("store.lock");
    // This process plays the converter in progress: it holds OUT.lock.
    let held = std::fs::File::create(&lock).unwrap();
    held.lock().unwrap();
    let o = convert(&input, &out, &["--embeddings", "int8"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("another coli-convert is building this store") && e.contains("store.lock"),
        "{e}"
    );
    assert!(!out.exists() && !tmp.path().join("store.partial").exists());
    // Released (as when the holder ends): the conversion runs and removes its lock file.
    drop(held);
    let o = convert(&input, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("MANIFEST").exists());
    assert!(!lock.exists(), "the lock file is removed at the end");
    // A lock file left by a killed run (not locked) does not block.
    std::fs::write(&lock, b"").unwrap();
    let o = convert(&input, &tmp.path().join("store2"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = convert(&input, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!lock.exists());
}
