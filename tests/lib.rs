//! Shared helpers for the cross-crate tests: the committed tiny fixtures
//! (`tests/fixtures/tiny/<name>/`, made by `tests/fixtures/make_*_fixtures.py`) and their
//! conversion into temporary stores.

use coli_convert::{Encodings, Options};
use coli_store::Encoding;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Every tiny fixture checkpoint of `tests/fixtures/tiny/`, one per family and source dtype.
pub const FIXTURE_FAMILIES: [&str; 18] = [
    "mixtral_fp8",
    "qwen3_moe_fp8",
    "olmoe_fp8",
    "qwen3_moe_bf16",
    "deepseek_v3_fp8",
    "glm5_fp8",
    "gpt_oss_mxfp4",
    "glm4_moe_fp8",
    "minimax_m2_fp8",
    "deepseek_v32_fp8",
    "inkling_bf16",
    "inkling2_bf16",
    "qwen3_next_bf16",
    "qwen3_5_moe_bf16",
    "kimi_linear_bf16",
    "kimi_k3_mxfp4",
    "glm5_next_bf16",
    "deepseek_v4_bf16",
];

/// The GGUF fixtures of `fixtures/gguf/` (`make_gguf_fixtures.py`): files written by
/// llama.cpp's converter and quantizer, with transformers' outputs under both numerics.
pub const GGUF_FIXTURES: [&str; 12] = [
    "olmoe-q4_k_m",
    "olmoe-q8_0",
    "qwen3_moe-q2_k",
    "qwen3_moe-iq4_xs",
    "mixtral-q4_k_m",
    "olmoe-iq2",
    "qwen3_moe-iq1",
    "deepseek_v3-q4_k_m",
    "glm_moe_dsa-q4_k_m",
    "glm4_moe-q4_k_m",
    "gpt_oss-mxfp4",
    "minimax_m2-q4_k_m",
];

/// Placement never changes semantics: the store at `dir` gives `want` as its 32 greedy tokens
/// after `prompt` with a RAM budget of one record (the length of record `key`) on 1 thread
/// without prefetch (buffered I/O) and on 2 threads with prefetch (automatic I/O), and with no
/// budget on 2 threads with prefetch (buffered I/O).
pub fn placement_keeps_greedy(
    dir: &Path,
    key: coli_store::ExpertKey,
    prompt: &[u32],
    want: &[u32],
    what: &str,
) {
    use coli_store::IoPreference;
    let one = {
        let s = open_store(dir, true, IoPreference::Auto);
        s.fetch_one(key).unwrap().len_bytes() as u64
    };
    for (budget, threads, prefetch, io) in [
        (Some(one), 1, false, IoPreference::Buffered),
        (Some(one), 2, true, IoPreference::Auto),
        (None, 2, true, IoPreference::Buffered),
    ] {
        let store = open_store(dir, false, io);
        let opts = coli_engine::EngineOptions {
            ram_budget: budget,
            threads: Some(threads),
            prefetch,
            ..Default::default()
        };
        let mut e = coli_engine::Engine::new(&store, &opts).unwrap();
        assert_eq!(
            greedy(&mut e, prompt, 32),
            want,
            "{what}: budget {budget:?} threads {threads} prefetch {prefetch} io {io:?}"
        );
    }
}

/// MLA decode in both forms: one token per call with the absorbed form, then with the expanded
/// form, each position's logits within 1e-4 of `full` (one prefill of `ids`). Returns the
/// decoded rows of each form (absorbed first).
pub fn decode_forms_match_prefill(
    e: &mut coli_engine::Engine<'_>,
    ids: &[u32],
    full: &[Vec<f32>],
    what: &str,
) -> Vec<Vec<Vec<f32>>> {
    let mut decoded = Vec::new();
    for absorbed in [true, false] {
        e.set_absorbed_decode(absorbed);
        e.reset();
        let mut rows = Vec::new();
        for (t, &id) in ids.iter().enumerate() {
            let l = e
                .forward(&[id], coli_engine::Logits::Last)
                .unwrap()
                .pop()
                .unwrap();
            let d = max_abs_diff(&l, &full[t]);
            assert!(
                d < 1e-4,
                "{what}: decode (absorbed {absorbed}) position {t} differs from prefill by {d}"
            );
            rows.push(l);
        }
        decoded.push(rows);
    }
    decoded
}

/// A chat template of `tests/fixtures/chat_templates/`, from its entry in one of the expected
/// files there (`file`, `special_tokens`) and that directory.
pub fn chat_template_fixture(entry: &Value, dir: &Path) -> coli_engine::ChatTemplate {
    coli_engine::ChatTemplate {
        source: std::fs::read_to_string(dir.join(entry["file"].as_str().unwrap())).unwrap(),
        special_tokens: entry["special_tokens"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect(),
        xtml: false,
    }
}

/// The checkpoint directory of fixture `name` (e.g. `mixtral_fp8`).
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tiny")
        .join(name)
}

/// Asserts that an engine's load warnings (`Engine::take_warnings`) are at most the budget's
/// own: a budget below some records' held bytes (the tests' smallest budgets, one record's
/// INDEX length) leaves them uncached and says so; any other warning fails.
///
/// # Panics
/// On any other warning.
pub fn assert_only_budget_warnings(w: &[String]) {
    assert!(
        w.iter()
            .all(|w| w.contains("read from disk each time a token uses")),
        "unexpected load warnings: {w:?}"
    );
}

/// The fixture's `expected.json` (transformers' outputs; schema in tests/fixtures/README.md).
///
/// # Panics
/// If the file is missing or not JSON.
pub fn expected(name: &str) -> Value {
    let p = fixture_dir(name).join("expected.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A JSON array of token ids.
///
/// # Panics
/// If `v` is not an array of non-negative integers.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("token id") as u32)
        .collect()
}

/// A `coli-convert` encoding name (`fp8`, `bf16`, `f32`, `int8`, `int4-g64`, `int4-g32`,
/// `mxfp4`).
///
/// # Panics
/// On another name.
pub fn encoding(s: &str) -> Encoding {
    match s {
        "fp8" => Encoding::Fp8,
        "bf16" => Encoding::Bf16,
        "f32" => Encoding::F32,
        "int8" => Encoding::Int8,
        "int4-g64" => Encoding::Int4 { group_size: 64 },
        "int4-g32" => Encoding::Int4 { group_size: 32 },
        "mxfp4" => Encoding::Mxfp4,
        "mxfp8" => Encoding::Mxfp8,
        other => panic!("unknown encoding {other}"),
    }
}

/// Converts fixture `name` with the encodings of `expected.json[variant]` (`experts`, `dense`,
/// the per-role `attention`, `indexer`, `shared_experts`, `dense_mlp` and `embeddings` when given,
/// and `mtp` when given, else int8) into a new temporary directory; returns the directory (keep
/// it alive) and the store path inside it.
///
/// # Panics
/// If the conversion fails.
pub fn convert_fixture(name: &str, variant: &str) -> (tempfile::TempDir, PathBuf) {
    convert_fixture_with(name, &expected(name)[variant], variant)
}

/// [`convert_fixture`] with the encodings given as a JSON object `params` (`what` names them
/// in a panic message).
///
/// # Panics
/// If the conversion fails.
pub fn convert_fixture_with(
    name: &str,
    params: &Value,
    what: &str,
) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("store");
    try_convert_dir(&fixture_dir(name), &out, params)
        .unwrap_or_else(|e| panic!("converting {name} ({what}): {e}"));
    (tmp, out)
}

/// Converts the checkpoint directory `input` into the store `out` with the encodings given as
/// a JSON object `params` (as [`convert_fixture_with`] reads them), one thread, no progress bar.
///
/// # Errors
/// The converter's.
pub fn try_convert_dir(
    input: &Path,
    out: &Path,
    params: &Value,
) -> coli_convert::Result<coli_convert::Report> {
    let enc = Encodings {
        experts: encoding(params["experts"].as_str().expect("experts encoding")),
        dense: encoding(params["dense"].as_str().expect("dense encoding")),
        roles: coli_convert::RoleEncodings {
            attention: params["attention"].as_str().map(encoding),
            indexer: params["indexer"].as_str().map(encoding),
            shared_experts: params["shared_experts"].as_str().map(encoding),
            dense_mlp: params["dense_mlp"].as_str().map(encoding),
        },
        mtp: match params["mtp"].as_str() {
            Some("none") => None,
            m => Some(m.map_or(Encoding::Int8, encoding)),
        },
        embeddings: params["embeddings"].as_str().map(encoding),
    };
    coli_convert::run(&Options {
        input: input.to_path_buf(),
        output: out.to_path_buf(),
        encodings: enc,
        // coli-convert's default unless `params` names one.
        matrix_order: match params["matrix_order"].as_str() {
            Some("row-major") => coli_store::MatrixOrder::RowMajor,
            None | Some("interleaved") => coli_store::MatrixOrder::Interleaved,
            Some(o) => panic!("matrix_order {o}: expected interleaved or row-major"),
        },
        threads: Some(1),
        progress: false,
    })
}

/// [`try_convert_dir`], panicking on an error.
///
/// # Panics
/// If the conversion fails.
pub fn convert_dir(input: &Path, out: &Path, params: &Value) -> coli_convert::Report {
    try_convert_dir(input, out, params)
        .unwrap_or_else(|e| panic!("converting {}: {e}", input.display()))
}

/// Opens a store with the given checksum verification and I/O preference.
///
/// # Panics
/// If the store does not open.
pub fn open_store(dir: &Path, verify: bool, io: coli_store::IoPreference) -> coli_store::Store {
    coli_store::Store::open_with(
        dir,
        &coli_store::OpenOptions {
            verify_checksums: verify,
            io,
            ..coli_store::OpenOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Greedy generation of up to `n` tokens after `prompt`, stopping at EOS.
///
/// # Panics
/// If generation fails.
pub fn greedy(engine: &mut coli_engine::Engine<'_>, prompt: &[u32], n: usize) -> Vec<u32> {
    let params = coli_engine::GenerateParams {
        max_tokens: n,
        sampling: coli_engine::SamplingParams::default(),
        stop_on_eos: true,
        speculation: Default::default(),
    };
    engine
        .generate(prompt, &params, |_| Ok(true))
        .expect("generate")
        .tokens
}

/// Copies the checkpoint directory `src` to `dst` without the tensors for which `drop(name)`
/// is true ([`rewrite_checkpoint`]).
///
/// # Panics
/// On I/O errors or a malformed safetensors file.
pub fn copy_checkpoint_without(src: &Path, dst: &Path, drop: impl Fn(&str) -> bool) {
    rewrite_checkpoint(src, dst, |n| (!drop(n)).then(|| n.to_string()));
}

/// Copies the checkpoint directory `src` to `dst`, naming each tensor `rename(name)` or leaving
/// it out when that is `None`, in the safetensors headers (the remaining tensors' bytes are
/// packed again, in their original order) and in `model.safetensors.index.json`'s weight_map.
/// Other files are copied unchanged.
///
/// # Panics
/// On I/O errors or a malformed safetensors file.
pub fn rewrite_checkpoint(src: &Path, dst: &Path, rename: impl Fn(&str) -> Option<String>) {
    std::fs::create_dir_all(dst).expect("create checkpoint copy");
    for entry in std::fs::read_dir(src).expect("read checkpoint") {
        let p = entry.expect("dir entry").path();
        let name = p
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        let out = dst.join(&name);
        if name.ends_with(".safetensors") {
            let bytes = std::fs::read(&p).expect("read shard");
            let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
            let header: serde_json::Map<String, Value> =
                serde_json::from_slice(&bytes[8..8 + n]).expect("safetensors header");
            let data = &bytes[8 + n..];
            let mut kept: Vec<(String, Value, usize, usize)> = header
                .into_iter()
                .filter_map(|(k, v)| {
                    if k == "__metadata__" {
                        Some((k, v))
                    } else {
                        rename(&k).map(|n| (n, v))
                    }
                })
                .map(|(k, v)| {
                    let off = v.get("data_offsets").and_then(Value::as_array).map(|o| {
                        (
                            o[0].as_u64().expect("offset") as usize,
                            o[1].as_u64().expect("offset") as usize,
                        )
                    });
                    let (a, b) = off.unwrap_or((0, 0));
                    (k, v, a, b)
                })
                .collect();
            kept.sort_by_key(|t| t.2);
            let mut new_header = serde_json::Map::new();
            let mut new_data = Vec::new();
            for (k, mut v, a, b) in kept {
                if k != "__metadata__" {
                    let start = new_data.len();
                    new_data.extend_from_slice(&data[a..b]);
                    v["data_offsets"] = serde_json::json!([start, new_data.len()]);
                }
                new_header.insert(k, v);
            }
            let mut h = serde_json::to_vec(&new_header).expect("header serializes");
            while !h.len().is_multiple_of(8) {
                h.push(b' ');
            }
            let mut out_bytes = (h.len() as u64).to_le_bytes().to_vec();
            out_bytes.extend_from_slice(&h);
            out_bytes.extend_from_slice(&new_data);
            std::fs::write(&out, out_bytes).expect("write shard");
        } else if name == "model.safetensors.index.json" {
            let mut v: Value =
                serde_json::from_slice(&std::fs::read(&p).expect("read index")).expect("index");
            if let Some(m) = v["weight_map"].as_object_mut() {
                let renamed: serde_json::Map<String, Value> = std::mem::take(m)
                    .into_iter()
                    .filter_map(|(k, f)| rename(&k).map(|n| (n, f)))
                    .collect();
                *m = renamed;
            }
            std::fs::write(&out, serde_json::to_vec_pretty(&v).expect("index")).expect("write");
        } else if p.is_file() {
            std::fs::copy(&p, &out).expect("copy file");
        }
    }
}

/// A JSON array of numbers as f32.
///
/// # Panics
/// If `v` is not an array of numbers.
pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array of numbers")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// The largest `|a[i] - b[i]|` of the engine's logits `a` and transformers' `b`. A padded
/// output head (Inkling's `unpadded_vocab_size`) gives `a` more entries than `b`: those must
/// be -inf (transformers drops them).
///
/// # Panics
/// If `a` is shorter than `b` or its extra entries are not -inf.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert!(
        a.len() >= b.len(),
        "{} logits, expected {}",
        a.len(),
        b.len()
    );
    assert!(
        a[b.len()..].iter().all(|&x| x == f32::NEG_INFINITY),
        "logits past the unpadded vocabulary must be -inf"
    );
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The argmax of every logits row.
pub fn top1(rows: &[Vec<f32>]) -> Vec<u32> {
    rows.iter()
        .map(|l| coli_engine::sampling::argmax(l))
        .collect()
}

/// The engine's MTP logits on the fixture's MTP inputs (`exp["mtp"]`: `main_hidden`,
/// `next_ids`) against `want` (`exp["mtp"]` or `exp["mtp_int8"]`): top-1 at every position
/// identical, last logits within 1e-3.
///
/// # Panics
/// On a mismatch (the message starts with `what`), or when the store has no MTP layer.
pub fn check_mtp(e: &mut coli_engine::Engine<'_>, exp: &Value, want: &Value, what: &str) {
    let m = &exp["mtp"];
    assert!(e.has_mtp(), "{what}: the store should hold the MTP layer");
    let hidden: Vec<f32> = m["main_hidden"]
        .as_array()
        .expect("main_hidden rows")
        .iter()
        .flat_map(floats)
        .collect();
    let rows = e
        .mtp_logits(&hidden, &ids(&m["next_ids"]))
        .expect("MTP logits");
    assert_eq!(top1(&rows), ids(&want["top1"]), "{what}: MTP top-1");
    let d = max_abs_diff(rows.last().expect("a row"), &floats(&want["last_logits"]));
    assert!(d < 1e-3, "{what}: MTP last logits differ by {d}");
}
pub mod published;

/// Hex sha256 of `b`.
pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The GGUF name of a store encoding (`Q4_K`, `MXFP4`, `F32`), as gguf-py names tensor types.
pub fn gguf_type_name(e: coli_format::Encoding) -> String {
    match e {
        coli_format::Encoding::Ggml(t) => t.gguf_name(),
        e => e.name().to_uppercase(),
    }
}

/// A GGUF fixture's block probe (its `<name>.json` `probe`: `layer`, `expert`, the sha256 and
/// gguf-py type of the expert's three slices, `dense_tensor` and its sha256, `dense_type` when
/// given) held against `store`: the blocks kept bit for bit, in their GGUF types.
///
/// # Panics
/// On any difference (`what` names the fixture).
pub fn check_gguf_probe(store: &coli_store::Store, p: &Value, what: &str) {
    let key = coli_store::ExpertKey::new(
        p["layer"].as_u64().expect("layer") as u32,
        p["expert"].as_u64().expect("expert") as u32,
    );
    let buf = store.fetch_one(key).expect("probe expert");
    for (i, m) in [buf.gate(), buf.up(), buf.down()].iter().enumerate() {
        assert_eq!(
            sha256_hex(m.data()),
            p["expert_sha256"][i].as_str().expect("sha256"),
            "{what}: {key} matrix {i}"
        );
        assert_eq!(
            gguf_type_name(m.encoding()),
            p["expert_types"][i].as_str().expect("type"),
            "{what}: {key} matrix {i}"
        );
    }
    let t = store
        .dense(p["dense_tensor"].as_str().expect("dense tensor"))
        .expect("dense probe");
    assert_eq!(
        sha256_hex(t.data),
        p["dense_sha256"].as_str().expect("sha256"),
        "{what}: dense probe"
    );
    if let Some(ty) = p["dense_type"].as_str() {
        assert_eq!(gguf_type_name(t.encoding), ty, "{what}: dense probe type");
    }
}

/// The GGUF fixture `name` (`tests/fixtures/gguf/{name}.gguf`).
pub fn gguf_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/gguf/{name}.gguf"))
}

/// `coli-convert FILE.gguf STORE` with the defaults (one thread, no progress).
///
/// # Errors
/// As [`coli_convert::gguf::run`].
pub fn gguf_try_convert(src: &Path, out: &Path) -> coli_convert::Result<coli_convert::Report> {
    coli_convert::gguf::run(&coli_convert::Options {
        input: src.to_path_buf(),
        output: out.to_path_buf(),
        encodings: coli_convert::Encodings::new(Encoding::Bf16, Encoding::Bf16, Encoding::Bf16),
        matrix_order: coli_store::MatrixOrder::RowMajor,
        threads: Some(1),
        progress: false,
    })
}

/// The GGUF fixture `name` converted into a temporary store: (its directory's guard, the store).
pub fn gguf_convert(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("store");
    gguf_try_convert(&gguf_fixture(name), &out)
        .unwrap_or_else(|e| panic!("converting {name}: {e}"));
    (tmp, out)
}

/// Byte offset just after the first occurrence of `needle` in `b`.
pub fn byte_after(b: &[u8], needle: &[u8]) -> usize {
    b.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{} not in the file", String::from_utf8_lossy(needle)))
        + needle.len()
}

/// Converts a copy of the GGUF `src` damaged by `damage` (written as `file_name`) and returns
/// the error text; asserts that nothing was published nor left half-written.
pub fn gguf_refused(src: &Path, file_name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut b = std::fs::read(src).expect("the GGUF fixture");
    damage(&mut b);
    let bad = tmp.path().join(file_name);
    std::fs::write(&bad, &b).expect("write the damaged copy");
    let out = tmp.path().join("store");
    let e = gguf_try_convert(&bad, &out)
        .err()
        .unwrap_or_else(|| panic!("{file_name}: the damaged GGUF was converted"));
    assert!(!out.exists(), "{file_name}: a store was published");
    assert!(
        !coli_convert::pipeline::partial_path(&out).exists(),
        "{file_name}: partial store left"
    );
    e.to_string()
}

/// `coli plan --gguf` of the file `gguf` (header only) against the store converted from it:
/// the same expert records and bytes, the same dense bytes, and the plan fits 25 GiB.
pub fn check_gguf_plan(gguf: &Path, store_dir: &Path, what: &str) {
    let p =
        coli_convert::memory_plan::plan_from_config(&coli_convert::memory_plan::ConfigPlanArgs {
            checkpoint: None,
            config: None,
            gguf: Some(gguf),
            total_ram: 25 << 30,
            context: Some(256),
            disk_gib_s: Some(2.0),
            experts: None,
            // `coli plan`'s default: a GGUF's MTP layer keeps its own types whatever it says.
            mtp: Some(coli_store::Encoding::Int8),
            chosen: None,
        })
        .unwrap_or_else(|e| panic!("{what}: plan: {e}"));
    let store = open_store(store_dir, false, coli_store::IoPreference::Auto);
    let records: u64 = store.index().iter().map(|r| r.length.get()).sum();
    assert_eq!(
        p.expert_bytes_total + p.mtp_expert_bytes_total,
        records,
        "{what}: expert bytes"
    );
    assert_eq!(
        (p.experts + p.mtp_experts) as usize,
        store.index().len(),
        "{what}: records"
    );
    assert_eq!(p.rows.len(), 1, "{what}: one row");
    assert_eq!(
        p.rows[0].dense_bytes,
        store.manifest().dense_file.length,
        "{what}: dense bytes"
    );
    assert!(
        p.from_gguf && p.dtypes_from_headers && p.rows[0].fits,
        "{what}: fits"
    );
}

/// A store against an oracle's results in `exp` (keys `greedy{s}`, `last_logits{s}`,
/// `teacher_top1{s}`, `greedy_long{s}`, `last_logits_long{s}` with the suffix `s`, and
/// `prompt_ids`, `teacher_ids`, `long_prompt_ids`): greedy 32 tokens, the prompt's last logits
/// within 1e-3, teacher-forced top-1, the long prompt's greedy tokens and last logits within
/// 1e-3. Returns the long prompt's last logits.
pub fn check_oracle(e: &mut coli_engine::Engine<'_>, exp: &Value, s: &str, what: &str) -> Vec<f32> {
    use coli_engine::Logits;
    let key = |k: &str| &exp[format!("{k}{s}")];
    let prompt = ids(&exp["prompt_ids"]);
    e.reset();
    assert_eq!(
        greedy(e, &prompt, 32),
        ids(key("greedy")),
        "{what}: greedy 32"
    );
    e.reset();
    let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last, &floats(key("last_logits")));
    assert!(
        d < 1e-3,
        "{what}: last logits differ from the oracle by {d}"
    );
    let rows = e.forward_logits(&ids(&exp["teacher_ids"])).unwrap();
    assert_eq!(
        top1(&rows),
        ids(key("teacher_top1")),
        "{what}: teacher-forced top-1"
    );
    e.reset();
    let long = ids(&exp["long_prompt_ids"]);
    let want = ids(key("greedy_long"));
    assert_eq!(greedy(e, &long, want.len()), want, "{what}: long prompt");
    e.reset();
    let last_long = e.forward(&long, Logits::Last).unwrap().pop().unwrap();
    let d = max_abs_diff(&last_long, &floats(key("last_logits_long")));
    assert!(
        d < 1e-3,
        "{what}: long prompt: last logits differ from the oracle by {d}"
    );
    last_long
}

/// The GGUF `b` with key-value pairs inserted before its first key: `kvs` are whole
/// entries (key length, key, value type, value, as gguf-py writes them) and their count; a
/// padding key is added so that the inserted bytes are a multiple of the 32-byte data alignment
/// (the tensors' offsets are relative to the aligned data start, which then moves with them).
pub fn insert_gguf_kvs(b: &mut Vec<u8>, kvs: &[u8], count: u64) {
    let mut kv = kvs.to_vec();
    let key = b"general.padding";
    kv.extend((key.len() as u64).to_le_bytes());
    kv.extend(key);
    kv.extend(8u32.to_le_bytes()); // a string
    let pad = (32 - (kv.len() + 8) % 32) % 32;
    kv.extend((pad as u64).to_le_bytes());
    kv.extend(std::iter::repeat_n(b'x', pad));
    assert_eq!(kv.len() % 32, 0);
    // The key count follows the magic, the version and the tensor count.
    let n = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")) + count + 1;
    b[16..24].copy_from_slice(&n.to_le_bytes());
    b.splice(24..24, kv);
}

/// One GGUF key-value entry: `key`, the value type id `ty` (gguf-py's `GGUFValueType`: 6 f32,
/// 7 bool, 9 array, ...) and the value's bytes.
pub fn gguf_kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut kv = Vec::new();
    kv.extend((key.len() as u64).to_le_bytes());
    kv.extend(key.as_bytes());
    kv.extend(ty.to_le_bytes());
    kv.extend(value);
    kv
}
