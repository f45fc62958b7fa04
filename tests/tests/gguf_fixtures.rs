//! GGUF input (issue 46): GGUF files written by llama.cpp's own converter and quantizer
//! (`tests/fixtures/gguf/make_gguf_fixtures.py`) converted by `coli-convert FILE.gguf`, run by
//! the engine and compared with transformers on gguf-py's dequantization of the same file
//! (greedy 32, teacher-forced top-1, last logits within 1e-3). The store keeps every block bit
//! for bit (sha256 of an expert's three slices and of a dense tensor, as gguf-py reads them),
//! each tensor in its GGUF type, a mixed Q4_K/Q6_K expert record included (format version 4).
//! Placement (budget of one record, threads, prefetch, I/O mode) never changes the tokens.

use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, Logits};
use coli_format::Encoding;
use coli_store::{ExpertKey, IoPreference};
use coli_tests::{floats, gguf_type_name, greedy, ids, max_abs_diff, open_store, top1};
use serde_json::Value;
use std::path::{Path, PathBuf};

const FIXTURES: [&str; 12] = coli_tests::GGUF_FIXTURES;

/// Fixtures holding i-quants or GGUF's MXFP4: format version 6 (FORMAT.md section 12).
const VERSION_6: [&str; 3] = ["olmoe-iq2", "qwen3_moe-iq1", "gpt_oss-mxfp4"];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf")
}

fn expected(name: &str) -> Value {
    let p = dir().join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn convert(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    coli_convert::gguf::run(&Options {
        input: dir().join(format!("{name}.gguf")),
        output: out.clone(),
        encodings: Encodings::new(Encoding::Bf16, Encoding::Bf16, Encoding::Bf16),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap_or_else(|e| panic!("converting {name}: {e}"));
    (tmp, out)
}

#[test]
fn gguf_stores_match_transformers_and_keep_the_blocks() {
    for name in FIXTURES {
        let exp = expected(name);
        let (_tmp, store_dir) = convert(name);
        let store = open_store(&store_dir, true, IoPreference::Auto);
        let version = if VERSION_6.contains(&name) { 6 } else { 4 };
        assert_eq!(
            store.manifest().format_version,
            version,
            "{name}: ggml encodings of version {version}"
        );

        // Blocks bit for bit, in their GGUF types.
        coli_tests::check_gguf_probe(&store, &exp["probe"], name);
        // Every dense tensor in the type the GGUF gives it.
        let types = exp["tensor_types"].as_object().unwrap();
        for e in &store.manifest().dense {
            let g = coli_convert::gguf::arch::gguf_name(&store.manifest().family, &e.name).unwrap();
            let enc = Encoding::from_id(e.encoding, e.group_size).unwrap();
            assert_eq!(
                gguf_type_name(enc),
                types[&g].as_str().unwrap(),
                "{name}: {}",
                e.name
            );
        }

        // transformers on gguf-py's dequantization of the same file.
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let prompt = ids(&exp["prompt_ids"]);
        assert_eq!(
            greedy(&mut e, &prompt, 32),
            ids(&exp["greedy"]),
            "{name}: greedy 32 tokens"
        );
        e.reset();
        let last = e.forward(&prompt, Logits::Last).unwrap().pop().unwrap();
        let d = max_abs_diff(&last, &floats(&exp["last_logits"]));
        assert!(d < 1e-3, "{name}: last logits differ by {d}");
        let rows = e.forward_logits(&ids(&exp["teacher_ids"])).unwrap();
        assert_eq!(
            top1(&rows),
            ids(&exp["teacher_top1"]),
            "{name}: teacher-forced top-1"
        );
    }
}

#[test]
fn gguf_placement_never_changes_tokens() {
    // Every fixture: k-quant mixes, both i-quant files (every i-quant and MXFP4 in records and
    // dense), deepseek2 and glm-dsa (MLA from llama.cpp's attn_k_b / attn_v_b, the DSA
    // indexer's selection), glm4moe, gpt-oss (expert biases).
    for name in FIXTURES {
        let exp = expected(name);
        let (_tmp, store_dir) = convert(name);
        coli_tests::placement_keeps_greedy(
            &store_dir,
            ExpertKey::new(1, 2),
            &ids(&exp["prompt_ids"]),
            &ids(&exp["greedy"]),
            name,
        );
    }
}

#[test]
fn gguf_mla_decode_forms_equal_the_prefill() {
    // deepseek2's split kv_b (attn_k_b transposed per head, attn_v_b): the absorbed decode
    // reads k_b's rows as W_kb's columns, the expanded prefill transposes them; one token at a
    // time in either form equals one prefill of the teacher ids within 1e-4 at every position
    // (GLM-5: past index_topk keys, the indexer's selection too).
    for name in ["deepseek_v3-q4_k_m", "glm_moe_dsa-q4_k_m"] {
        let exp = expected(name);
        let (_tmp, store_dir) = convert(name);
        let store = open_store(&store_dir, true, IoPreference::Auto);
        let mut e = Engine::new(&store, &EngineOptions::default()).unwrap();
        let teacher = ids(&exp["teacher_ids"]);
        let full = e.forward_logits(&teacher).unwrap();
        coli_tests::decode_forms_match_prefill(&mut e, &teacher, &full, name);
    }
}

#[test]
fn converting_again_resumes_to_the_same_store() {
    let name = "qwen3_moe-q2_k";
    let (tmp, store_dir) = convert(name);
    let opts = Options {
        input: dir().join(format!("{name}.gguf")),
        output: store_dir.clone(),
        encodings: Encodings::new(Encoding::Bf16, Encoding::Bf16, Encoding::Bf16),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    };
    let r = coli_convert::gguf::run(&opts).unwrap();
    assert_eq!(r.status, "already_complete");
    drop(tmp);
}

/// Converts a damaged copy of `olmoe-q8_0.gguf` (made by `damage`, written as `file_name`) and
/// returns the error text; nothing may be published or left half-written.
fn refused(file_name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    refused_from("olmoe-q8_0", file_name, damage)
}

/// [`refused`] on a damaged copy of fixture `fixture`.
fn refused_from(fixture: &str, file_name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    coli_tests::gguf_refused(&dir().join(format!("{fixture}.gguf")), file_name, damage)
}

#[test]
fn bad_gguf_inputs_are_refused_naming_the_key_or_tensor() {
    // Truncated: the last tensors' data runs past the end of the file.
    let e = refused("cut.gguf", |b| b.truncate(b.len() / 2));
    let half = std::fs::metadata(dir().join("olmoe-q8_0.gguf"))
        .unwrap()
        .len()
        / 2;
    assert!(
        e.contains("cut.gguf")
            && e.contains("(the data section starts at byte ")
            && e.contains(&format!(", past its end ({half} bytes)"))
            && e.contains("truncated"),
        "{e}"
    );
    // Truncated inside the header.
    let e = refused("head.gguf", |b| b.truncate(100));
    assert!(e.contains("truncated") && e.contains("head.gguf"), "{e}");
    // Not a GGUF.
    let e = refused("magic.gguf", |b| b[0] = b'X');
    assert!(e.contains("not a GGUF file"), "{e}");
    // An unknown ggml type id in a tensor info (the type u32 follows name, n_dims, dims).
    let e = refused("type.gguf", |b| {
        let at = coli_tests::byte_after(b, b"blk.0.attn_q.weight") + 4 + 2 * 8;
        b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    });
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("unknown ggml type id 99"),
        "{e}"
    );
    // A type coli does not decode (TQ2_0 is smaller than Q8_0: the extents stay valid).
    let e = refused("tq2.gguf", |b| {
        let at = coli_tests::byte_after(b, b"blk.0.attn_q.weight") + 4 + 2 * 8;
        b[at..at + 4].copy_from_slice(&35u32.to_le_bytes());
    });
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("TQ2_0") && e.contains("does not decode"),
        "{e}"
    );
    // An architecture coli does not convert from GGUF.
    let e = refused("arch.gguf", |b| {
        let at = coli_tests::byte_after(b, b"general.architecture") + 4 + 8;
        b[at..at + 5].copy_from_slice(b"bloom");
    });
    assert!(
        e.contains("general.architecture") && e.contains("bloom"),
        "{e}"
    );
    // A llama GGUF without experts (a dense model).
    let e = refused("dense.gguf", |b| {
        let at = coli_tests::byte_after(b, b"general.architecture") + 4 + 8;
        b[at..at + 5].copy_from_slice(b"llama");
    });
    assert!(
        e.contains("llama.expert_count") && e.contains("Mixture-of-Experts"),
        "{e}"
    );
    // Metadata contradicting the tensors' shapes.
    let e = refused("shape.gguf", |b| {
        let at = coli_tests::byte_after(b, b"olmoe.embedding_length") + 4;
        b[at..at + 4].copy_from_slice(&128u32.to_le_bytes());
    });
    assert!(
        e.contains("token_embd.weight") && e.contains("olmoe.embedding_length"),
        "{e}"
    );
    // A key the model needs, missing (renamed).
    let e = refused("key.gguf", |b| {
        let at = coli_tests::byte_after(b, b"olmoe.expert_count") - 1;
        b[at] = b'X';
    });
    assert!(e.contains("olmoe.expert_count"), "{e}");
    // One file of a split GGUF without the others.
    let e = refused("m-00001-of-00002.gguf", |_| {});
    assert!(
        e.contains("m-00002-of-00002.gguf") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn export_writes_back_the_same_gguf() {
    for name in FIXTURES {
        let (tmp, store_dir) = convert(name);
        let out = tmp.path().join("back.gguf");
        coli_tools::export::run(&store_dir, &out).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let src = std::fs::read(dir().join(format!("{name}.gguf"))).unwrap();
        let back = std::fs::read(&out).unwrap();
        // llama.cpp's writer packs the tensors in order at 32-byte alignment, as coli's does:
        // the whole file comes back, metadata and tensor data byte for byte.
        assert_eq!(back.len(), src.len(), "{name}: size");
        assert!(
            back == src,
            "{name}: the exported GGUF differs from the source"
        );
    }
    // A store converted from a Hugging Face checkpoint has nothing to write back.
    let (_t, hf_store) = coli_tests::convert_fixture("qwen3_moe_bf16", "lossless_store");
    let e = coli_tools::export::run(&hf_store, &hf_store.with_extension("gguf")).unwrap_err();
    assert!(
        format!("{e:#}").contains("not converted from a GGUF"),
        "{e:#}"
    );
    assert!(!hf_store.with_extension("gguf").exists());
}

#[test]
fn plan_from_the_gguf_header_matches_the_store() {
    for name in [
        "olmoe-q4_k_m",
        "qwen3_moe-q2_k",
        "deepseek_v3-q4_k_m",
        "glm_moe_dsa-q4_k_m",
    ] {
        let (_tmp, store_dir) = convert(name);
        coli_tests::check_gguf_plan(&dir().join(format!("{name}.gguf")), &store_dir, name);
    }
}

#[test]
fn deepseek2_metadata_coli_cannot_honour_is_refused() {
    let ds = "deepseek_v3-q4_k_m";
    // DeepSeek-V2's softmax routing (llama.cpp's expert_gating_func 1; a u32 after the type).
    let e = refused_from(ds, "softmax.gguf", |b| {
        let at = coli_tests::byte_after(b, b"deepseek2.expert_gating_func") + 4;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(
        e.contains("deepseek2.expert_gating_func") && e.contains("softmax"),
        "{e}"
    );
    // YaRN without the log multiplier that sets its attention scale (key renamed).
    let e = refused_from(ds, "yarn.gguf", |b| {
        let at = coli_tests::byte_after(b, b"deepseek2.rope.scaling.yarn_log_multiplier") - 1;
        b[at] = b'X';
    });
    assert!(e.contains("yarn_log_multiplier"), "{e}");
    // Metadata that drops tensors the file holds: a block count of 1 (u32 after the type),
    // no shared experts.
    let e = refused_from(ds, "blocks.gguf", |b| {
        let at = coli_tests::byte_after(b, b"deepseek2.block_count") + 4;
        b[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
    });
    assert!(e.contains("past deepseek2.block_count 1"), "{e}");
    let e = refused_from(ds, "shared.gguf", |b| {
        let at = coli_tests::byte_after(b, b"deepseek2.expert_shared_count") + 4;
        b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
    });
    assert!(
        e.contains("expert_shared_count is 0") && e.contains("_shexp"),
        "{e}"
    );
    // A log multiplier of 0 (llama.cpp then applies its own YaRN scale; an f32 after the type).
    let e = refused_from(ds, "yarn0.gguf", |b| {
        let at = coli_tests::byte_after(b, b"deepseek2.rope.scaling.yarn_log_multiplier") + 4;
        b[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    });
    assert!(e.contains("yarn_log_multiplier is 0"), "{e}");
    // glm-dsa: indexer types whose array claims another element type (strings).
    let e = refused_from("glm_moe_dsa-q4_k_m", "ixtypes.gguf", |b| {
        // The array's element type (GGUF type 7, bool) follows the key and the array type 9.
        let at = coli_tests::byte_after(b, b"glm-dsa.attention.indexer.types") + 4;
        b[at..at + 4].copy_from_slice(&8u32.to_le_bytes());
    });
    assert!(e.contains("glm-dsa.attention.indexer.types"), "{e}");
    // Neither form of the MLA up-projection (attn_k_b renamed; attn_kv_b absent).
    let e = refused_from(ds, "kvb.gguf", |b| {
        let at = coli_tests::byte_after(b, b"blk.0.attn_k_b.weight") - 8;
        b[at] = b'X';
    });
    assert!(e.contains("attn_k_b") && e.contains("attn_kv_b"), "{e}");
}

#[test]
fn bad_gguf_metadata_values_are_refused() {
    // A NaN rms eps (f32 value patched) is refused, not replaced by a default.
    let e = refused("nan.gguf", |b| {
        let at = coli_tests::byte_after(b, b"olmoe.attention.layer_norm_rms_epsilon") + 4;
        b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    assert!(
        e.contains("layer_norm_rms_epsilon") && e.contains("finite"),
        "{e}"
    );
    // An array count far beyond the file is refused before anything is allocated for it.
    let e = refused("count.gguf", |b| {
        // general.architecture's string length: u64 after the key and its type.
        let at = coli_tests::byte_after(b, b"general.architecture") + 4;
        b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    });
    assert!(e.contains("general.architecture"), "{e}");
}

#[test]
fn fused_tensors_read_as_the_unfused_file() {
    // llama.cpp's converter with its fusing options (tests/fixtures/gguf/make_fused_ggufs.py,
    // which checked that every part of each fused tensor is the unfused file's tensor bit for
    // bit): --fuse-gate-up-exps --fuse-qkv on the Qwen3.5-MoE fixture against
    // qwen3_5_moe-q8_0.gguf (whose oracle the fused store then runs), and --fuse-qkv on a tiny
    // Mixtral, whose q and k rows llama.cpp permutes before fusing them. The stores are the
    // same bits, dense tensors and expert records.
    for (name, oracle) in [
        ("qwen3_5_moe-fused-q8_0", true),
        ("mixtral-fused-q8_0", false),
    ] {
        let exp = expected(name);
        assert_eq!(
            coli_tests::sha256_hex(&std::fs::read(dir().join(format!("{name}.gguf"))).unwrap()),
            exp["gguf_sha256"].as_str().unwrap(),
            "{name}"
        );
        let plain = exp["unfused"].as_str().unwrap().trim_end_matches(".gguf");
        let fused = exp["fused"].as_object().unwrap();
        assert!(fused.keys().any(|k| k.contains("attn_qkv")), "{name}");
        let (_t1, d1) = coli_tests::gguf_convert(name);
        let (_t2, d2) = coli_tests::gguf_convert(plain);
        let (a, b) = (
            open_store(&d1, true, IoPreference::Auto),
            open_store(&d2, true, IoPreference::Auto),
        );
        let (ma, mb) = (a.manifest(), b.manifest());
        assert_eq!(ma.config, mb.config, "{name}");
        let names =
            |m: &coli_store::Manifest| m.dense.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(ma), names(mb), "{name}");
        for d in &ma.dense {
            let (x, y) = (a.dense(&d.name).unwrap(), b.dense(&d.name).unwrap());
            assert!(
                (x.encoding, x.shape, x.data, x.scales) == (y.encoding, y.shape, y.data, y.scales),
                "{name}: {}",
                d.name
            );
        }
        let mut records = 0;
        for l in &ma.expert_layers {
            for e in 0..l.num_experts {
                let k = ExpertKey::new(l.layer, e);
                assert!(
                    a.fetch_one(k).unwrap().bytes() == b.fetch_one(k).unwrap().bytes(),
                    "{name}: expert {e} of layer {}",
                    l.layer
                );
                records += 1;
            }
        }
        assert!(records > 0, "{name}");
        let gguf = dir().join(format!("{name}.gguf"));
        coli_tests::check_gguf_plan(&gguf, &d1, name);
        if oracle {
            let mut e = Engine::new(&a, &EngineOptions::default()).unwrap();
            coli_tests::check_oracle(&mut e, &expected(plain), "", name);
        } else {
            // Exported, the fused store writes the unfused file's tensors (llama.cpp's own).
            let out = d1.with_extension("gguf");
            coli_tools::export::run(&d1, &out).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let back = coli_convert::gguf::file::Gguf::open(&out).unwrap();
            let want =
                coli_convert::gguf::file::Gguf::open(&dir().join(format!("{plain}.gguf"))).unwrap();
            // (The same tensors; the parts sit where the fused tensor was, llama.cpp's writer
            // put them in name order within the block: order does not matter to a reader.)
            let sorted = |v: &[String]| {
                let mut v = v.to_vec();
                v.sort();
                v
            };
            assert_eq!(
                sorted(&back.order),
                sorted(&want.order),
                "{name}: exported tensors"
            );
            for n in &want.order {
                let (x, y) = (&back.tensors[n], &want.tensors[n]);
                assert!(
                    (x.dims.clone(), x.ggml_type, back.data(x))
                        == (y.dims.clone(), y.ggml_type, want.data(y)),
                    "{name}: exported {n}"
                );
            }
        }
        // A fused q/k/v whose rows are not the three projections' is refused naming it.
        let fused_qkv = fused
            .keys()
            .find(|k| k.contains("attn_qkv"))
            .unwrap()
            .clone();
        let e = refused_from(name, "bad.gguf", |b| {
            let at = coli_tests::byte_after(b, fused_qkv.as_bytes());
            // The tensor's second dimension (rows), after its dimension count and first one.
            let rows = u64::from_le_bytes(b[at + 12..at + 20].try_into().unwrap());
            b[at + 12..at + 20].copy_from_slice(&(rows - 1).to_le_bytes());
        });
        assert!(e.contains(&fused_qkv), "{name}: {e}");
    }
}
