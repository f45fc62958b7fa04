//! The MTP block llama.cpp appends to GLM and DeepSeek GGUFs is the store's MTP layer, and
//! DeepSeek-V3.2's `deepseek32` files convert (issue 46).
//!
//! llama.cpp's converter keeps the MTP layer of GLM-4.5/4.6/4.7 (`Glm4MoeModel`, a `glm4moe`
//! file), GLM-5.x (`GlmMoeDsaModel`, `glm-dsa`), GLM-4.7-Flash (`Glm4MoeLiteModel`, `deepseek2`)
//! and DeepSeek-V3.2 (`DeepseekV32Model`, `deepseek32`) as block L = the decoder's layer count: its
//! decoder tensors under the usual block names plus `blk.L.nextn.{eh_proj, enorm, hnorm,
//! shared_head_norm}` and, where the checkpoint has them, `nextn.{embed_tokens,
//! shared_head_head}`, with `nextn_predict_layers` 1 (its `DeepseekV2Model` drops DeepSeek-V3's).
//! `tests/fixtures/gguf/make_mtp_ggufs.py` writes the GLM-4.5-family fixture
//! (`tiny/glm4_moe_fp8`: MTP layer without its own embedding and head, as GLM-4.6/4.7 publish
//! it), the GLM-5 fixture (`tiny/glm5_fp8`: with both), the DeepSeek-V3 fixture (through
//! GLM-4.7-Flash's class, a deepseek2 file with the block) and the DeepSeek-V3.2 fixture that
//! way, F32, and checks that every
//! tensor equals the fixture oracle's weights bit for bit. So the fixtures' own expected values
//! apply: the main model's greedy 32, teacher-forced top-1 and last logits, the MTP layer's top-1
//! and last logits (`mtp`, its reference), and `--speculate mtp` gives the oracle's tokens.

use coli_engine::{Engine, EngineOptions, GenerateParams, Logits, Speculate, SpeculationParams};
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{
    check_mtp, convert_fixture, expected, floats, greedy, ids, max_abs_diff, open_store,
    placement_keeps_greedy, top1,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// (GGUF fixture, the checkpoint fixture it was written from, the MTP tensors the main model's
/// stand in for).
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const CASES: [Case; 4] = [
    (
        "glm4_moe-mtp-f32",
        "glm4_moe_fp8",
        &[
            (
                "model.layers.3.embed_tokens.weight",
                "model.embed_tokens.weight",
            ),
            ("model.layers.3.shared_head.head.weight", "lm_head.weight"),
        ],
    ),
    ("glm_moe_dsa-mtp-f32", "glm5_fp8", &[]),
    // A deepseek2 file with a nextn block (written through GLM-4.7-Flash's class, which keeps
    // it), DeepSeek-V3's layer with its own embedding and head.
    ("deepseek_v3-mtp-f32", "deepseek_v3_fp8", &[]),
    // A deepseek32 file (DeepSeek-V3.2: the DSA indexer on every layer) with its nextn block.
    ("deepseek_v32-mtp-f32", "deepseek_v32_fp8", &[]),
];

fn written(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/gguf/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The committed GGUF fixture `name` (checked to be the file its script wrote: its JSON's
/// `gguf_sha256`) converted with the defaults, every tensor of it (the nextn ones included)
/// converted and the MTP layer kept: the temporary directory, the store's path, the report.
fn converted(name: &str) -> (tempfile::TempDir, std::path::PathBuf, coli_convert::Report) {
    let src = coli_tests::gguf_fixture(name);
    assert_eq!(
        coli_tests::sha256_hex(&std::fs::read(&src).unwrap()),
        written(name)["gguf_sha256"].as_str().unwrap(),
        "{name}: the committed GGUF is the one its script wrote"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let report = coli_tests::gguf_try_convert(&src, &dir).unwrap();
    assert!(
        report.not_converted.is_empty() && report.mtp_layer,
        "{name}: not converted {:?}, MTP layer {}",
        report.not_converted,
        report.mtp_layer
    );
    (tmp, dir, report)
}

/// Greedy generation of `n` tokens (past EOS) with MTP drafts of 3, ungated.
fn mtp_greedy(n: usize) -> GenerateParams {
    GenerateParams {
        max_tokens: n,
        sampling: Default::default(),
        stop_on_eos: false,
        speculation: SpeculationParams {
            mode: Speculate::Mtp,
            draft_tokens: 3,
            gate: false,
            ..Default::default()
        },
    }
}

/// The MTP layer's logits on the fixture's MTP reference inputs (`mtp.main_hidden`,
/// `mtp.next_ids`), one row per position.
fn mtp_rows(e: &mut Engine<'_>, exp: &Value) -> Vec<Vec<f32>> {
    let mtp = &exp["mtp"];
    let hidden: Vec<f32> = mtp["main_hidden"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(floats)
        .collect();
    e.mtp_logits(&hidden, &ids(&mtp["next_ids"])).unwrap()
}

/// The oracle's values for one file: the prompt, greedy tokens and last logits, the
/// teacher-forced ids and top-1, and the MTP layer's (`top1`, `last_logits`) on the fixture's
/// MTP inputs.
struct Oracle<'a> {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    last_logits: &'a Value,
    teacher_ids: Vec<u32>,
    teacher_top1: Vec<u32>,
    mtp: &'a Value,
}

/// Holds the engine on `store` to `want`: greedy, last logits within 1e-3, teacher-forced top-1,
/// the MTP layer on the fixture's (`exp`) MTP inputs, and `--speculate mtp` giving the greedy
/// tokens with drafts proposed.
fn holds_to<'s>(
    store: &'s coli_store::Store,
    exp: &Value,
    want: &Oracle<'_>,
    name: &str,
) -> Engine<'s> {
    let mut e = Engine::new(store, &EngineOptions::default()).unwrap();
    assert!(e.has_mtp(), "{name}: MTP layer");
    assert_eq!(
        greedy(&mut e, &want.prompt, want.greedy.len()),
        want.greedy,
        "{name}: greedy"
    );
    e.reset();
    let last = e
        .forward(&want.prompt, Logits::Last)
        .unwrap()
        .pop()
        .unwrap();
    let d = max_abs_diff(&last, &floats(want.last_logits));
    assert!(d < 1e-3, "{name}: last logits differ by {d}");
    let rows = e.forward_logits(&want.teacher_ids).unwrap();
    assert_eq!(
        top1(&rows),
        want.teacher_top1,
        "{name}: teacher-forced top-1"
    );
    check_mtp(&mut e, exp, want.mtp, &format!("{name} MTP"));
    // Drafting with it never changes the tokens, and it drafts.
    e.reset();
    let got = e
        .generate(&want.prompt, &mtp_greedy(want.greedy.len()), |_| Ok(true))
        .unwrap();
    assert_eq!(got.tokens, want.greedy, "{name}: --speculate mtp");
    let sp = &got.stats.speculation;
    assert!(
        got.stats.speculation_mode == Speculate::Mtp && sp.drafts_proposed > 0,
        "{name}: the MTP layer drafted ({sp:?})"
    );
    e
}

#[test]
fn mtp_ggufs_run_as_the_oracle() {
    for (name, fixture, shared) in CASES {
        let (_tmp, dir, report) = converted(name);
        let want: BTreeMap<String, String> = shared
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(report.mtp_shared, want, "{name}: report's stand-ins");
        let store = open_store(&dir, true, IoPreference::Auto);
        let m = store.manifest();
        assert_eq!(m.mtp_shared, want, "{name}: MANIFEST's stand-ins");
        assert_eq!(m.config["num_nextn_predict_layers"], 1, "{name}");
        assert_eq!(m.config["num_hidden_layers"], 3, "{name}");
        assert_eq!(m.num_layers, 4, "{name}: the MTP layer is a store layer");
        assert!(
            store.index().iter().any(|r| r.key().layer == 3),
            "{name}: the MTP layer's experts are records"
        );

        // The fixture's oracle (its MTP reference: the stand-ins serve the GLM-4.x one).
        let exp = expected(fixture);
        let want = Oracle {
            prompt: ids(&exp["prompt_ids"]),
            greedy: ids(&exp["greedy_lossless"]),
            last_logits: &exp["last_logits_lossless"],
            teacher_ids: ids(&exp["teacher_ids"]),
            teacher_top1: ids(&exp["teacher_top1_lossless"]),
            mtp: &exp["mtp"],
        };
        let mut e = holds_to(&store, &exp, &want, name);

        // The store converted from the checkpoint itself: the same MTP logits, up to the
        // kernels' sums (FP8 records there, F32 here).
        let (_t2, st) = convert_fixture(fixture, "lossless_store");
        let st = open_store(&st, true, IoPreference::Auto);
        let mut e2 = Engine::new(&st, &EngineOptions::default()).unwrap();
        let (a, b) = (mtp_rows(&mut e, &exp), mtp_rows(&mut e2, &exp));
        let d = max_abs_diff(a.last().unwrap(), b.last().unwrap());
        assert!(
            d < 1e-4,
            "{name}: GGUF and safetensors MTP layers differ by {d}"
        );
    }
}

/// Quantized MTP GGUFs (`make_mtp_quant_ggufs.py`): two of the F32 files above quantized by
/// llama.cpp (`Q4_K_M`, its fallbacks at these widths: Q5_0 / Q8_0 / F16, the MTP block
/// included), and the fixture they come from.
const QUANT_CASES: [(&str, &str); 2] = [
    ("glm_moe_dsa-mtp-q4_k_m", "glm5_fp8"),
    ("deepseek_v3-mtp-q4_k_m", "deepseek_v3_fp8"),
];

#[test]
fn quantized_mtp_ggufs_run_as_their_oracle() {
    // The oracle (each file's JSON): gguf-py's dequantization of the file through the fixtures'
    // numpy reference (mla_reference.py, the main model and the MTP layer), near ties refused.
    for (name, fixture) in QUANT_CASES {
        let w = written(name);
        let (_tmp, dir, _) = converted(name);
        let store = open_store(&dir, true, IoPreference::Auto);
        let m = store.manifest();
        assert_eq!(m.num_layers, 4, "{name}: the MTP layer is a store layer");
        // Every tensor in the type the file gives it, the MTP block's among them (which are
        // quantized is the file's: `mtp_block_types`).
        let types = w["tensor_types"].as_object().unwrap();
        let mut quantized_mtp = 0;
        for d in &m.dense {
            let g = coli_convert::gguf::arch::gguf_name(&m.family, &d.name).unwrap();
            let t = coli_tests::gguf_type_name(
                coli_store::Encoding::from_id(d.encoding, d.group_size).unwrap(),
            );
            assert_eq!(t, types[&g].as_str().unwrap(), "{name}: {}", d.name);
            quantized_mtp += usize::from(g.starts_with("blk.3.") && t.starts_with('Q'));
        }
        let buf = store.fetch_one(ExpertKey::new(3, 1)).unwrap();
        for (m, proj) in [buf.gate(), buf.up(), buf.down()]
            .iter()
            .zip(["gate", "up", "down"])
        {
            let t = coli_tests::gguf_type_name(m.encoding());
            let g = format!("blk.3.ffn_{proj}_exps.weight");
            assert_eq!(
                t,
                types[&g].as_str().unwrap(),
                "{name}: MTP expert 1 {proj}"
            );
            quantized_mtp += usize::from(t.starts_with('Q'));
        }
        assert!(
            quantized_mtp > 0,
            "{name}: the MTP block holds quantized blocks"
        );

        // The MTP layer on the fixture's reference inputs (`exp`), against the file's oracle.
        let exp = expected(fixture);
        let want = Oracle {
            prompt: ids(&w["prompt_ids"]),
            greedy: ids(&w["greedy"]),
            last_logits: &w["last_logits"],
            teacher_ids: ids(&w["teacher_ids"]),
            teacher_top1: ids(&w["teacher_top1"]),
            mtp: &w["mtp"],
        };
        holds_to(&store, &exp, &want, name);
    }
}

#[test]
fn mtp_ggufs_placement_never_changes_tokens() {
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
    for (name, _) in QUANT_CASES {
        let w = written(name);
        let (_tmp, dir) = coli_tests::gguf_convert(name);
        placement_keeps_greedy(
            &dir,
            ExpertKey::new(1, 0),
            &ids(&w["prompt_ids"]),
            &ids(&w["greedy"]),
            name,
        );
    }
}

#[test]
fn mtp_ggufs_plan_and_export() {
    for (name, _, _) in CASES {
        let (tmp, dir) = coli_tests::gguf_convert(name);
        let src = coli_tests::gguf_fixture(name);
        // `coli plan --gguf` counts what the store holds, the MTP layer included, and says
        // which of its dense bytes are the MTP layer's (its own embedding and head there, not
        // in the main model's).
        coli_tests::check_gguf_plan(&src, &dir, name);
        let p = coli_convert::memory_plan::plan_from_config(
            &coli_convert::memory_plan::ConfigPlanArgs {
                checkpoint: None,
                config: None,
                gguf: Some(&src),
                total_ram: 25 << 30,
                context: Some(256),
                disk_gib_s: None,
                experts: None,
                mtp: None,
                chosen: None,
            },
        )
        .unwrap();
        let store = open_store(&dir, false, IoPreference::Auto);
        let sum = |f: &dyn Fn(&str) -> bool| -> u64 {
            store
                .manifest()
                .dense
                .iter()
                .filter(|d| f(&d.name))
                .map(|d| d.length.div_ceil(64) * 64)
                .sum()
        };
        let row = &p.rows[0];
        assert_eq!(
            row.mtp_dense_bytes,
            sum(&|n| n.starts_with("model.layers.3.")),
            "{name}: MTP dense bytes"
        );
        assert_eq!(
            row.embedding_bytes,
            sum(&|n| n == "model.embed_tokens.weight" || n == "lm_head.weight"),
            "{name}: embedding and head bytes"
        );
        // The MTP block is in the store, so the file comes back whole.
        let out = tmp.path().join("back.gguf");
        coli_tools::export::run(&dir, &out).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap(),
            "{name}: the exported GGUF differs from the source"
        );
    }
}

#[test]
fn glm_gguf_with_an_undeclared_mtp_block_is_refused() {
    // nextn_predict_layers 0 with the block's tensors still there: the metadata makes block 3
    // a decoder layer, which `nextn` tensors contradict (converted, it would be a model with
    // a fourth decoder layer): refused naming the tensor and keys.
    let name = "glm4_moe-mtp-f32";
    let src = coli_tests::gguf_fixture(name);
    let e = coli_tests::gguf_refused(&src, "nomtp.gguf", |b| {
        let at = coli_tests::byte_after(b, b"glm4moe.nextn_predict_layers") + 4;
        b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    });
    assert!(
        e.contains("blk.3.nextn.") && e.contains("glm4moe.nextn_predict_layers"),
        "{e}"
    );
}

#[test]
fn deepseek2_mtp_block_without_its_own_embedding_is_left_out() {
    // DeepSeek-V3's spec (which deepseek2 files are read as) requires the MTP layer's own
    // embedding and head; a block without `nextn.embed_tokens` (renamed here) is not converted:
    // the main model converts and runs as before, the block's tensors listed as not converted.
    let name = "deepseek_v3-mtp-f32";
    let tmp = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(coli_tests::gguf_fixture(name)).unwrap();
    let at = coli_tests::byte_after(&b, b"blk.3.nextn.embed_tokens.weight");
    b[at - 8] = b'X';
    let src = tmp.path().join("noembed.gguf");
    std::fs::write(&src, &b).unwrap();
    let dir = tmp.path().join("store");
    let report = coli_tests::gguf_try_convert(&src, &dir).unwrap();
    assert!(!report.mtp_layer, "{name}: no MTP layer");
    assert!(
        report
            .not_converted
            .iter()
            .any(|t| t == "blk.3.nextn.eh_proj.weight"),
        "{:?}",
        report.not_converted
    );
    let store = open_store(&dir, true, IoPreference::Auto);
    assert_eq!(store.manifest().config["num_nextn_predict_layers"], 0);
    let exp = expected("deepseek_v3_fp8");
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(!e.has_mtp());
    let want = ids(&exp["greedy_lossless"]);
    assert_eq!(greedy(&mut e, &ids(&exp["prompt_ids"]), want.len()), want);
}

#[test]
fn glm_dsa_mtp_block_without_its_own_embedding_and_head_shares_the_main_ones() {
    // GLM-5.x publishes its MTP layer without `embed_tokens` and `shared_head.head`, so its
    // GGUFs have no `nextn.embed_tokens` / `nextn.shared_head_head` (renamed away here): the
    // main `token_embd` and `output` stand in, as for the checkpoint. Its MTP logits equal
    // those of the store converted from the checkpoint without the two tensors (FP8 records
    // there, F32 here).
    let name = "glm_moe_dsa-mtp-f32";
    let tmp = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(coli_tests::gguf_fixture(name)).unwrap();
    for t in [
        &b"blk.3.nextn.embed_tokens.weight"[..],
        &b"blk.3.nextn.shared_head_head.weight"[..],
    ] {
        let at = coli_tests::byte_after(&b, t);
        b[at - 8] = b'X';
    }
    let src = tmp.path().join("shared.gguf");
    std::fs::write(&src, &b).unwrap();
    let dir = tmp.path().join("store");
    let report = coli_tests::gguf_try_convert(&src, &dir).unwrap();
    let want: BTreeMap<String, String> = [
        (
            "model.layers.3.embed_tokens.weight",
            "model.embed_tokens.weight",
        ),
        ("model.layers.3.shared_head.head.weight", "lm_head.weight"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert!(report.mtp_layer);
    assert_eq!(report.mtp_shared, want);
    let store = open_store(&dir, true, IoPreference::Auto);
    assert_eq!(store.manifest().mtp_shared, want);
    let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
    assert!(e.has_mtp());

    let ck = tmp.path().join("checkpoint");
    coli_tests::copy_checkpoint_without(&coli_tests::fixture_dir("glm5_fp8"), &ck, |n| {
        n == "model.layers.3.embed_tokens.weight" || n == "model.layers.3.shared_head.head.weight"
    });
    let st = tmp.path().join("hf-store");
    coli_convert::run(&coli_convert::Options {
        input: ck,
        output: st.clone(),
        encodings: coli_convert::Encodings {
            experts: coli_tests::encoding("fp8"),
            dense: coli_tests::encoding("fp8"),
            roles: Default::default(),
            mtp: Some(coli_tests::encoding("fp8")),
            embeddings: None,
        },
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap();
    let st = open_store(&st, true, IoPreference::Auto);
    let mut e2 = Engine::new(&st, &EngineOptions::default()).unwrap();
    let exp = expected("glm5_fp8");
    let (a, b) = (mtp_rows(&mut e, &exp), mtp_rows(&mut e2, &exp));
    assert_eq!(top1(&a), top1(&b));
    let d = max_abs_diff(a.last().unwrap(), b.last().unwrap());
    assert!(
        d < 1e-4,
        "GGUF and checkpoint stand-in MTP layers differ by {d}"
    );
    // And drafting with it keeps the oracle's tokens.
    let want_greedy = ids(&exp["greedy_lossless"]);
    let got = e
        .generate(
            &ids(&exp["prompt_ids"]),
            &mtp_greedy(want_greedy.len()),
            |_| Ok(true),
        )
        .unwrap();
    assert_eq!(got.tokens, want_greedy);
}

/// The GGUF `b` with a `deepseek32.attention.indexer.types` of `types` inserted.
fn with_indexer_types(b: &mut Vec<u8>, types: &[bool]) {
    let mut value = Vec::new();
    value.extend(7u32.to_le_bytes()); // an array of bools
    value.extend((types.len() as u64).to_le_bytes());
    value.extend(types.iter().map(|&t| u8::from(t)));
    let kv = coli_tests::gguf_kv("deepseek32.attention.indexer.types", 9, &value);
    coli_tests::insert_gguf_kvs(b, &kv, 1);
}

#[test]
fn deepseek32_gguf_sharing_an_indexer_is_refused() {
    // DeepSeek-V3.2 runs its own indexer on every layer: every layer "full" converts (the
    // inserted key is well formed), layer 1 sharing one is refused naming the key.
    let src = coli_tests::gguf_fixture("deepseek_v32-mtp-f32");
    let tmp = tempfile::tempdir().unwrap();
    let mut b = std::fs::read(&src).unwrap();
    with_indexer_types(&mut b, &[true, true, true]);
    let full = tmp.path().join("full.gguf");
    std::fs::write(&full, &b).unwrap();
    coli_tests::gguf_try_convert(&full, &tmp.path().join("store")).unwrap();
    let e = coli_tests::gguf_refused(&src, "shared.gguf", |b| {
        with_indexer_types(b, &[true, false, true])
    });
    assert!(
        e.contains("deepseek32.attention.indexer.types") && e.contains("layer 1"),
        "{e}"
    );
}
