//! Kimi K3 from a GGUF (issue 46): llama.cpp's own converter (`conversion/kimi_k3.py`) writes the
//! Kimi K3 fixture (`tests/fixtures/tiny/kimi_k3_mxfp4`, the release's layout) as a `kimi-k3`
//! GGUF (`tests/fixtures/gguf/make_kimi_k3_gguf.py`: F32 dense tensors, the compressed-tensors
//! experts repacked to ggml MXFP4, checked equal to the checkpoint's values by gguf-py). The
//! GGUF holds the checkpoint's numbers, so the fixture's oracle applies as it is: greedy 32,
//! teacher-forced top-1, the 150-token prompt, last logits within 1e-3. The experts' MXFP4
//! blocks are kept bit for bit; `-exp(A_log)` (`ssm_a`) and the fused attention-residual scores
//! come back as the checkpoint's tensors (`coli_convert::gguf::arch::derived_values`).

use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, Logits};
use coli_format::Encoding;
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{
    convert_fixture, expected, floats, greedy, ids, max_abs_diff, open_store,
    placement_keeps_greedy, top1,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const FIXTURE: &str = "kimi_k3_mxfp4";

fn gguf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/kimi_k3-mxfp4.gguf")
}

fn probe() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/kimi_k3-mxfp4.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn sha(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn try_convert(src: &Path, out: &Path) -> coli_convert::Result<coli_convert::Report> {
    coli_convert::gguf::run(&Options {
        input: src.to_path_buf(),
        output: out.to_path_buf(),
        encodings: Encodings::new(Encoding::Bf16, Encoding::Bf16, Encoding::Bf16),
        threads: Some(1),
        progress: false,
    })
}

fn convert() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    try_convert(&gguf(), &out).unwrap_or_else(|e| panic!("converting the kimi-k3 GGUF: {e}"));
    (tmp, out)
}

#[test]
fn kimi_k3_gguf_runs_as_the_oracle_and_keeps_the_blocks() {
    let p = probe();
    assert_eq!(
        sha(&std::fs::read(gguf()).unwrap()),
        p["gguf_sha256"].as_str().unwrap(),
        "the committed GGUF is the one make_kimi_k3_gguf.py wrote"
    );
    let (_tmp, dir) = convert();
    let store = open_store(&dir, true, IoPreference::Auto);
    assert_eq!(store.manifest().format_version, 6, "GGUF's MXFP4 experts");
    // The experts' blocks bit for bit, in MXFP4.
    let pr = &p["probe"];
    let key = ExpertKey::new(
        pr["layer"].as_u64().unwrap() as u32,
        pr["expert"].as_u64().unwrap() as u32,
    );
    let buf = store.fetch_one(key).unwrap();
    for (i, m) in [buf.gate(), buf.up(), buf.down()].iter().enumerate() {
        assert_eq!(
            sha(m.data()),
            pr["expert_sha256"][i].as_str().unwrap(),
            "{key} {i}"
        );
        assert_eq!(
            m.encoding(),
            Encoding::Ggml(coli_format::encoding::GgmlType::MXFP4)
        );
    }
    let t = store.dense(pr["dense_tensor"].as_str().unwrap()).unwrap();
    assert_eq!(
        sha(t.data),
        pr["dense_sha256"].as_str().unwrap(),
        "split kv_b"
    );

    // The K3 fixture's oracle (the GGUF holds the checkpoint's values).
    let exp = expected(FIXTURE);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    let prompt = ids(&exp["prompt_ids"]);
    assert_eq!(
        greedy(&mut e, &prompt, 32),
        ids(&exp["greedy_lossless"]),
        "greedy 32"
    );
    e.reset();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last, &floats(&exp["last_logits_lossless"]));
    assert!(d < 1e-3, "last logits differ from the oracle by {d}");
    let rows = e.forward_logits(&ids(&exp["teacher_ids"])).unwrap();
    assert_eq!(
        top1(&rows),
        ids(&exp["teacher_top1_lossless"]),
        "teacher-forced top-1"
    );
    e.reset();
    let long = ids(&exp["long_prompt_ids"]);
    let want = ids(&exp["greedy_long_lossless"]);
    assert_eq!(greedy(&mut e, &long, want.len()), want, "long prompt");
    e.reset();
    let last_long = e.forward(&long, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last_long, &floats(&exp["last_logits_long_lossless"]));
    assert!(
        d < 1e-3,
        "long prompt: last logits differ from the oracle by {d}"
    );

    // And the store converted from the checkpoint itself (mxfp4 records, bf16 dense): the same
    // numbers, up to the f32 / bf16 kernels' sums and `ssm_a`'s round trip.
    let (_t2, st) = convert_fixture(FIXTURE, "lossless_store");
    let st = open_store(&st, true, IoPreference::Auto);
    let mut e2 = Engine::new(&st, &EngineOptions::default()).unwrap();
    let last2 = e2.forward(&long, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last_long, &last2);
    assert!(d < 1e-4, "GGUF and safetensors stores differ by {d}");
}

#[test]
fn kimi_k3_gguf_placement_never_changes_tokens() {
    let exp = expected(FIXTURE);
    let (_tmp, dir) = convert();
    placement_keeps_greedy(
        &dir,
        ExpertKey::new(1, 0),
        &ids(&exp["prompt_ids"]),
        &ids(&exp["greedy_lossless"]),
        "kimi-k3 GGUF",
    );
}

/// Converts a damaged copy of the kimi-k3 GGUF and returns the error; nothing published.
fn refused(damage: impl FnOnce(&mut Vec<u8>)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(gguf()).unwrap();
    damage(&mut b);
    let src = tmp.path().join("k3.gguf");
    std::fs::write(&src, &b).unwrap();
    let out = tmp.path().join("store");
    let e = try_convert(&src, &out).expect_err("the damaged GGUF was converted");
    assert!(!out.exists(), "a store was published");
    assert!(
        !coli_convert::pipeline::partial_path(&out).exists(),
        "partial store left"
    );
    e.to_string()
}

fn after(b: &[u8], needle: &[u8]) -> usize {
    b.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{} not in the file", String::from_utf8_lossy(needle)))
        + needle.len()
}

#[test]
fn kimi_k3_gguf_bad_inputs_are_refused_naming_the_key_or_tensor() {
    // `ssm_a` is -exp(A_log): a positive value is no decay llama.cpp writes.
    let g = coli_convert::gguf::file::Gguf::open(&gguf()).unwrap();
    let a = g.data(&g.tensors["blk.1.ssm_a"]).to_vec();
    drop(g);
    let e = refused(|b| {
        let at = after(b, &a) - a.len();
        b[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    });
    assert!(
        e.contains("blk.1.ssm_a") && e.contains("value 0 is 0.5"),
        "{e}"
    );
    // Every layer MLA (`head_count_kv` without a 0): not Kimi K3's mix.
    let e = refused(|b| {
        // The array: value type (4), element type (4), count (8), then 5 u32.
        let at = after(b, b"kimi-k3.attention.head_count_kv") + 16;
        for i in 0..5 {
            b[at + 4 * i..at + 4 * i + 4].copy_from_slice(&1u32.to_le_bytes());
        }
    });
    assert!(
        e.contains("kimi-k3.attention.head_count_kv") && e.contains("MLA"),
        "{e}"
    );
    // Softmax routing.
    let e = refused(|b| {
        let at = after(b, b"kimi-k3.expert_gating_func") + 4;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(
        e.contains("kimi-k3.expert_gating_func") && e.contains("sigmoid"),
        "{e}"
    );
    // A layer kind the tensors contradict: layer 1 made an MLA layer, whose tensors are KDA's.
    let e = refused(|b| {
        let at = after(b, b"kimi-k3.attention.head_count_kv") + 16;
        b[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(e.contains("blk.1."), "{e}");
}

#[test]
fn kimi_k3_gguf_stores_are_not_exported_back() {
    let (tmp, dir) = convert();
    let out = tmp.path().join("back.gguf");
    let e = coli_tools::export::run(&dir, &out).unwrap_err().to_string();
    assert!(
        e.contains("kimi-k3") && e.contains("not written back"),
        "{e}"
    );
    assert!(!out.exists());
}

#[test]
fn kimi_k3_plan_from_the_gguf_header_matches_the_store() {
    let (_tmp, dir) = convert();
    let p =
        coli_convert::memory_plan::plan_from_config(&coli_convert::memory_plan::ConfigPlanArgs {
            checkpoint: None,
            config: None,
            gguf: Some(&gguf()),
            total_ram: 25 << 30,
            context: Some(256),
            disk_gib_s: Some(2.0),
            experts: None,
            mtp: None,
            chosen: None,
        })
        .unwrap();
    let store = open_store(&dir, false, IoPreference::Auto);
    let records: u64 = store.index().iter().map(|r| r.length.get()).sum();
    assert_eq!(p.expert_bytes_total, records, "expert bytes");
    assert_eq!(p.experts as usize, store.index().len(), "records");
    assert_eq!(
        p.rows[0].dense_bytes,
        store.manifest().dense_file.length,
        "dense bytes"
    );
    assert!(p.from_gguf && p.rows[0].fits);
}
