//! gpt-oss's published layout through the converter (tests/fixtures/tiny/gpt_oss_mxfp4 and
//! gpt_oss_bf16, made by tests/fixtures/make_gpt_oss_fixtures.py):
//!
//! - the lossless store keeps the published MXFP4 experts bit for bit: each record's gate rows
//!   are the even rows of `gate_up_proj_blocks`/`_scales` of that expert, up the odd rows, down
//!   the `down_proj` slice, biases the BF16 values widened, as transformers' `GptOssExperts`
//!   reads them (not as this code's own decoder would: the bytes are compared with the
//!   checkpoint's);
//! - the store's reference decode of expert 0's first gate rows equals the fixture script's
//!   independent numpy decode (`mxfp4_probe`);
//! - the BF16 re-release (fused `[E, H, 2I]` tensors) converts to the same dequantized weights;
//! - an e8m0 NaN scale and `--experts mxfp4` on BF16 experts are refused, naming the tensor;
//! - Inkling 2's MXFP8 experts (tests/fixtures/tiny/inkling2_mxfp8) convert to BF16 records
//!   holding `e4m3(code) * 2^(scale - 127)` exactly (checked against the codes and scales read
//!   from the checkpoint here, decoded with the OCP definitions written out in this test); a NaN
//!   scale, an e4m3 NaN code and a missing scale tensor are refused by name;
//! - transformers 5's fused layout of the per-expert families (`gate_up_proj` `[E, 2I, H]`,
//!   `down_proj` `[E, H, I]`) converts to the same expert records as per-expert tensors.

use coli_convert::checkpoint::Checkpoint;
use coli_convert::{Encodings, Options};
use coli_store::{Encoding, ExpertKey, IoPreference};
use coli_tests::{convert_fixture, expected, fixture_dir, open_store};

/// The expert-`e` slice of a fused tensor's bytes.
fn slice<'a>(ck: &'a Checkpoint, name: &str, e: usize, count: usize) -> &'a [u8] {
    let (shard, info) = ck.get(name).unwrap_or_else(|| panic!("{name} missing"));
    let per = info.nbytes() / count;
    &shard.data(info)[e * per..(e + 1) * per]
}

fn bf16s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
        .collect()
}

#[test]
fn lossless_store_keeps_the_published_mxfp4_experts_bit_for_bit() {
    let name = "gpt_oss_mxfp4";
    let exp = expected(name);
    let (_tmp, dir) = convert_fixture(name, "lossless_store");
    let store = open_store(&dir, true, IoPreference::Auto);
    // Version 2 (mxfp4, biases), 7 with the gate and up ([I, 64]) stored interleaved.
    assert!(store.index().iter().all(|r| r.is_interleaved()));
    assert_eq!(store.manifest().format_version, 7);
    let ck = Checkpoint::open(&fixture_dir(name)).unwrap();
    let dims = &exp["dims"];
    let (h, i) = (
        dims["hidden"].as_u64().unwrap() as usize,
        dims["moe_intermediate"].as_u64().unwrap() as usize,
    );
    let (layers, experts) = (
        dims["layers"].as_u64().unwrap() as usize,
        dims["experts"].as_u64().unwrap() as usize,
    );
    for l in 0..layers {
        let p = format!("model.layers.{l}.mlp.experts");
        for e in 0..experts {
            let mut buf = store.fetch_one(ExpertKey::new(l as u32, e as u32)).unwrap();
            assert_eq!(buf.encoding, Encoding::Mxfp4);
            // The published bytes are row-major (FORMAT.md section 5's order is their reorder).
            buf.deinterleave(|_| false);
            let gb = slice(&ck, &format!("{p}.gate_up_proj_blocks"), e, experts);
            let gs = slice(&ck, &format!("{p}.gate_up_proj_scales"), e, experts);
            let rows = |b: &[u8], w: usize, odd: usize| -> Vec<u8> {
                (0..i)
                    .flat_map(|r| b[(2 * r + odd) * w..(2 * r + odd + 1) * w].to_vec())
                    .collect()
            };
            assert_eq!(buf.gate().data(), &rows(gb, h / 2, 0)[..], "L{l} E{e} gate");
            assert_eq!(buf.up().data(), &rows(gb, h / 2, 1)[..], "L{l} E{e} up");
            assert_eq!(buf.gate().e8m0_scales(), &rows(gs, h / 32, 0)[..]);
            assert_eq!(buf.up().e8m0_scales(), &rows(gs, h / 32, 1)[..]);
            assert_eq!(
                buf.down().data(),
                slice(&ck, &format!("{p}.down_proj_blocks"), e, experts)
            );
            assert_eq!(
                buf.down().e8m0_scales(),
                slice(&ck, &format!("{p}.down_proj_scales"), e, experts)
            );
            let gub = bf16s(slice(&ck, &format!("{p}.gate_up_proj_bias"), e, experts));
            let even: Vec<f32> = gub.iter().step_by(2).copied().collect();
            let odd: Vec<f32> = gub.iter().skip(1).step_by(2).copied().collect();
            assert_eq!(buf.gate_bias().unwrap(), &even[..]);
            assert_eq!(buf.up_bias().unwrap(), &odd[..]);
            assert_eq!(
                buf.down_bias().unwrap(),
                &bf16s(slice(&ck, &format!("{p}.down_proj_bias"), e, experts))[..]
            );
        }
    }
    // The store's decode of layer 0 expert 0's gate rows against the fixture's numpy decode.
    let probe = &exp["mxfp4_probe"];
    let buf = &store.fetch(&[ExpertKey::new(0, 0)]).unwrap()[0];
    let want = probe["values_f32"]
        .as_array()
        .expect("mxfp4_probe.values_f32");
    let mut row = vec![0f32; h];
    for (r, w) in want.iter().enumerate() {
        buf.gate().dequantize_row(r, &mut row);
        let w: Vec<f32> = w
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(row, w, "gate row {r}");
    }
}

#[test]
fn bf16_re_release_converts_to_the_same_weights() {
    let (_a, mx) = convert_fixture("gpt_oss_mxfp4", "lossless_store");
    let (_b, bf) = convert_fixture("gpt_oss_bf16", "lossless_store");
    let (mx, bf) = (
        open_store(&mx, true, IoPreference::Auto),
        open_store(&bf, true, IoPreference::Auto),
    );
    let key = ExpertKey::new(1, 3);
    let (a, b) = (&mx.fetch(&[key]).unwrap()[0], &bf.fetch(&[key]).unwrap()[0]);
    assert_eq!(b.encoding, Encoding::Bf16);
    for (va, vb) in [(a.gate(), b.gate()), (a.up(), b.up()), (a.down(), b.down())] {
        let (mut ra, mut rb) = (vec![0f32; va.cols()], vec![0f32; vb.cols()]);
        for r in 0..va.rows() {
            va.dequantize_row(r, &mut ra);
            vb.dequantize_row(r, &mut rb);
            assert_eq!(ra, rb, "row {r}");
        }
    }
    assert_eq!(a.gate_bias(), b.gate_bias());
    assert_eq!(a.down_bias(), b.down_bias());
}

fn convert_err(dir: &std::path::Path, experts: Encoding) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("store");
    let r = coli_convert::run(&Options {
        input: dir.to_path_buf(),
        output: out.clone(),
        encodings: Encodings {
            experts,
            dense: Encoding::Bf16,
            roles: Default::default(),
            mtp: Some(Encoding::Int8),
            embeddings: None,
        },
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    });
    assert!(!out.exists(), "no store is published on an error");
    // Input errors leave nothing behind (resuming could not fix them).
    assert!(
        !tmp.path().join("store.partial").exists(),
        "a refused input left a partial store"
    );
    match r {
        Ok(_) => panic!("the conversion must fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn nan_scales_and_mxfp4_from_bf16_are_refused_by_name() {
    let err = convert_err(&fixture_dir("gpt_oss_bf16"), Encoding::Mxfp4);
    assert!(
        err.contains("model.layers.0.mlp.experts.gate_up_proj") && err.contains("mxfp4"),
        "{err}"
    );
    // A copy of the MXFP4 checkpoint with one e8m0 scale of layer 1 set to the NaN code.
    let src = fixture_dir("gpt_oss_mxfp4");
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("ck");
    std::fs::create_dir(&dst).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
    }
    let name = "model.layers.1.mlp.experts.down_proj_scales";
    let (file, at) = {
        let ck = Checkpoint::open(&dst).unwrap();
        let (shard, info) = ck.get(name).unwrap();
        (shard.path.clone(), info.start + info.nbytes() / 2)
    };
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at] = 0xFF;
    std::fs::write(&file, bytes).unwrap();
    let err = convert_err(&dst, Encoding::Mxfp4);
    assert!(err.contains(name) && err.contains("NaN"), "{err}");
}

/// e4m3 (OCP FP8 E4M3, "fn": no infinities, S.1111.111 is NaN) by its definition:
/// `(-1)^s 2^(e - 7) (1 + m / 8)`, subnormals `(-1)^s 2^-6 (m / 8)`.
fn e4m3(code: u8) -> f64 {
    let (s, e, m) = (code >> 7, (code >> 3) & 15, code & 7);
    let mag = if e == 0 {
        2f64.powi(-6) * m as f64 / 8.0
    } else {
        2f64.powi(e as i32 - 7) * (1.0 + m as f64 / 8.0)
    };
    if s == 1 {
        -mag
    } else {
        mag
    }
}

/// The lossless store of Inkling 2's MXFP8 experts (`--experts mxfp8`, format version 5) holds
/// each expert's published codes and e8m0 scales bit for bit (gate = even rows of `w13_weight`,
/// up = odd rows, down = `w2_weight`), and runs to the very same logits, bit for bit, as a
/// store that decoded them to BF16 (the same values in the same kernel order).
#[test]
fn mxfp8_store_keeps_the_published_codes_and_equals_the_bf16_store() {
    let name = "inkling2_mxfp8";
    let (_tmp, out) = convert_fixture(name, "lossless_store");
    let store = open_store(&out, true, IoPreference::Auto);
    assert_eq!(store.manifest().format_version, 5);
    let ck = Checkpoint::open(&fixture_dir(name)).unwrap();
    let (h, i, count) = (64usize, 32usize, 8usize);
    let layers = expected(name)["dims"]["layers"].as_u64().unwrap() as u32;
    for l in 0..layers {
        let p = format!("model.llm.layers.{l}.mlp.experts");
        for e in 0..count {
            let buf = &store.fetch(&[ExpertKey::new(l, e as u32)]).unwrap()[0];
            assert_eq!(buf.encoding, Encoding::Mxfp8);
            let gc = slice(&ck, &format!("{p}.w13_weight"), e, count);
            let gs = slice(&ck, &format!("{p}.w13_weight_scale"), e, count);
            let rows = |b: &[u8], w: usize, odd: usize| -> Vec<u8> {
                (0..i)
                    .flat_map(|r| b[(2 * r + odd) * w..(2 * r + odd + 1) * w].to_vec())
                    .collect()
            };
            assert_eq!(buf.gate().data(), &rows(gc, h, 0)[..], "L{l} E{e} gate");
            assert_eq!(buf.up().data(), &rows(gc, h, 1)[..], "L{l} E{e} up");
            assert_eq!(buf.gate().e8m0_scales(), &rows(gs, h / 32, 0)[..]);
            assert_eq!(buf.up().e8m0_scales(), &rows(gs, h / 32, 1)[..]);
            assert_eq!(
                buf.down().data(),
                slice(&ck, &format!("{p}.w2_weight"), e, count)
            );
            assert_eq!(
                buf.down().e8m0_scales(),
                slice(&ck, &format!("{p}.w2_weight_scale"), e, count)
            );
        }
    }
    let (_tmp2, bf16) = coli_tests::convert_fixture_with(
        name,
        &serde_json::json!({"experts": "bf16", "dense": "bf16"}),
        "bf16 experts",
    );
    let teacher = coli_tests::ids(&expected(name)["teacher_ids"]);
    let logits = |dir: &std::path::Path| {
        let s = open_store(dir, true, IoPreference::Auto);
        let mut e = coli_engine::Engine::new(&s, &coli_engine::EngineOptions::default()).unwrap();
        e.forward_logits(&teacher).unwrap()
    };
    let (a, b) = (logits(&out), logits(&bf16));
    for (t, (x, y)) in a.iter().zip(&b).enumerate() {
        let same = x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "position {t}: mxfp8 and bf16 stores differ");
    }
}

#[test]
fn mxfp8_experts_convert_exactly_and_bad_ones_are_refused_by_name() {
    let name = "inkling2_mxfp8";
    let (_tmp, out) = coli_tests::convert_fixture_with(
        name,
        &serde_json::json!({"experts": "bf16", "dense": "bf16"}),
        "bf16 experts",
    );
    let store = open_store(&out, true, IoPreference::Auto);
    let src = fixture_dir(name);
    let ck = Checkpoint::open(&src).unwrap();
    let (h, i, count) = (64usize, 32usize, 8usize);
    let p = "model.llm.layers.1.mlp.experts";
    for e in [0usize, 5] {
        let codes = slice(&ck, &format!("{p}.w13_weight"), e, count);
        let scales = slice(&ck, &format!("{p}.w13_weight_scale"), e, count);
        let dcodes = slice(&ck, &format!("{p}.w2_weight"), e, count);
        let dscales = slice(&ck, &format!("{p}.w2_weight_scale"), e, count);
        let value = |c: &[u8], s: &[u8], cols: usize, r: usize, k: usize| {
            e4m3(c[r * cols + k]) * 2f64.powi(s[r * cols / 32 + k / 32] as i32 - 127)
        };
        let buf = &store.fetch(&[ExpertKey::new(1, e as u32)]).unwrap()[0];
        assert_eq!(buf.encoding, Encoding::Bf16);
        let (gate, up, down) = (buf.gate(), buf.up(), buf.down());
        let mut row = vec![0f32; h];
        for r in 0..i {
            gate.dequantize_row(r, &mut row);
            for (k, &v) in row.iter().enumerate() {
                assert_eq!(
                    v as f64,
                    value(codes, scales, h, 2 * r, k),
                    "gate [{r}, {k}]"
                );
            }
            up.dequantize_row(r, &mut row);
            for (k, &v) in row.iter().enumerate() {
                assert_eq!(
                    v as f64,
                    value(codes, scales, h, 2 * r + 1, k),
                    "up [{r}, {k}]"
                );
            }
        }
        let mut row = vec![0f32; i];
        for r in 0..h {
            down.dequantize_row(r, &mut row);
            for (k, &v) in row.iter().enumerate() {
                assert_eq!(v as f64, value(dcodes, dscales, i, r, k), "down [{r}, {k}]");
            }
        }
    }
    // One byte of a copy of the checkpoint changed: a NaN scale, a NaN code.
    for (tensor, byte, what) in [
        (format!("{p}.w2_weight_scale"), 0xFFu8, "NaN"),
        (format!("{p}.w13_weight"), 0x7F, "e4m3 code 0x7F"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("ck");
        std::fs::create_dir(&dst).unwrap();
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
        }
        let (file, at) = {
            let ck = Checkpoint::open(&dst).unwrap();
            let (shard, info) = ck.get(&tensor).unwrap();
            (shard.path.clone(), info.start + info.nbytes() / 2)
        };
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[at] = byte;
        std::fs::write(&file, bytes).unwrap();
        for enc in [Encoding::Bf16, Encoding::Mxfp8] {
            let err = convert_err(&dst, enc);
            assert!(
                err.contains(&tensor) && err.contains(what),
                "{enc:?}: {err}"
            );
        }
    }
    // mxfp8 keeps MXFP8 experts only.
    let err = convert_err(&fixture_dir("inkling2_bf16"), Encoding::Mxfp8);
    assert!(
        err.contains("model.llm.layers.0.mlp.experts.w13_weight") && err.contains("mxfp8"),
        "{err}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("ck");
    let missing = format!("{p}.w2_weight_scale");
    coli_tests::copy_checkpoint_without(&src, &dst, |n| n == missing);
    let err = convert_err(&dst, Encoding::Bf16);
    assert!(err.contains(&missing) && err.contains("missing"), "{err}");
}

/// `--experts auto` follows the tensors: the published MXFP4 / MXFP8 experts are kept whatever
/// config.json declares, and experts that are not in them get int4-g64 even when config.json
/// still declares the quantization (a dequantized re-release).
#[test]
fn auto_experts_follow_the_tensors_not_the_declaration() {
    let tmp = tempfile::tempdir().unwrap();
    let with_quant = |name: &str, quant: Option<serde_json::Value>| {
        let dst = tmp.path().join(format!("{name}-{}", quant.is_some()));
        std::fs::create_dir(&dst).unwrap();
        for f in std::fs::read_dir(fixture_dir(name)).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dst.join(f.file_name())).unwrap();
        }
        let p = dst.join("config.json");
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        match quant {
            Some(q) => c["quantization_config"] = q,
            None => {
                c.as_object_mut().unwrap().remove("quantization_config");
            }
        }
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        Checkpoint::open(&dst).unwrap()
    };
    let auto = |ck: &Checkpoint| coli_convert::fused::auto_experts(ck);
    let int4 = Encoding::Int4 { group_size: 64 };
    for (name, want) in [
        ("gpt_oss_mxfp4", Encoding::Mxfp4),
        ("gpt_oss_bf16", int4),
        ("inkling2_mxfp8", Encoding::Mxfp8),
        ("inkling2_bf16", int4),
        ("mixtral_fp8", int4),
    ] {
        assert_eq!(
            auto(&Checkpoint::open(&fixture_dir(name)).unwrap()),
            want,
            "{name}"
        );
    }
    // A config that lost its declaration keeps the MXFP8 experts; one that keeps a declaration
    // its BF16 tensors no longer match gets int4-g64.
    assert_eq!(auto(&with_quant("inkling2_mxfp8", None)), Encoding::Mxfp8);
    let mxfp4 = serde_json::json!({"quant_method": "mxfp4"});
    assert_eq!(auto(&with_quant("gpt_oss_bf16", Some(mxfp4))), int4);
    let mxfp8 = serde_json::json!({"quant_method": "fp8", "weight_block_size": [1, 32]});
    assert_eq!(auto(&with_quant("inkling2_bf16", Some(mxfp8))), int4);
}

/// Writes a single-file safetensors checkpoint `dir/model.safetensors` holding `tensors`
/// (name, dtype, shape, bytes), in name order.
fn write_safetensors(dir: &std::path::Path, tensors: &[(String, &str, Vec<usize>, Vec<u8>)]) {
    let mut sorted: Vec<&(String, &str, Vec<usize>, Vec<u8>)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, dtype, shape, bytes) in &sorted {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + bytes.len()]}),
        );
        off += bytes.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, _, bytes) in &sorted {
        out.extend_from_slice(bytes);
    }
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
}

/// transformers 5's fused layout of a per-expert family (`Qwen3MoeExperts.gate_up_proj`
/// `[E, 2I, H]`, gate rows first, and `down_proj` `[E, H, I]`), built from the per-expert
/// qwen3_moe_bf16 fixture: the store's expert records are byte-identical to the per-expert
/// conversion's.
#[test]
fn transformers5_fused_experts_convert_like_per_expert_tensors() {
    let name = "qwen3_moe_bf16";
    let src = fixture_dir(name);
    let ck = Checkpoint::open(&src).unwrap();
    let exp = expected(name);
    let dims = &exp["dims"];
    let (e_count, layers) = (
        dims["experts"].as_u64().unwrap() as usize,
        dims["layers"].as_u64().unwrap() as usize,
    );
    let mut tensors: Vec<(String, &str, Vec<usize>, Vec<u8>)> = Vec::new();
    for (n, _) in ck.tensors.iter() {
        if n.contains(".mlp.experts.") {
            continue;
        }
        let (shard, info) = ck.get(n).unwrap();
        tensors.push((
            n.clone(),
            "BF16",
            info.shape.clone(),
            shard.data(info).to_vec(),
        ));
    }
    for l in 0..layers {
        let p = format!("model.layers.{l}.mlp.experts");
        let (mut gu, mut down) = (Vec::new(), Vec::new());
        let (mut h, mut i) = (0, 0);
        for e in 0..e_count {
            for m in ["gate_proj", "up_proj"] {
                let (shard, info) = ck.get(&format!("{p}.{e}.{m}.weight")).unwrap();
                (i, h) = (info.shape[0], info.shape[1]);
                gu.extend_from_slice(shard.data(info));
            }
            let (shard, info) = ck.get(&format!("{p}.{e}.down_proj.weight")).unwrap();
            down.extend_from_slice(shard.data(info));
        }
        tensors.push((
            format!("{p}.gate_up_proj"),
            "BF16",
            vec![e_count, 2 * i, h],
            gu,
        ));
        tensors.push((format!("{p}.down_proj"), "BF16", vec![e_count, h, i], down));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fused");
    std::fs::create_dir(&dir).unwrap();
    for f in ["config.json", "generation_config.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    write_safetensors(&dir, &tensors);
    let convert = |input: &std::path::Path, out: &std::path::Path| {
        coli_convert::run(&Options {
            input: input.to_path_buf(),
            output: out.to_path_buf(),
            encodings: Encodings {
                experts: Encoding::Int4 { group_size: 64 },
                dense: Encoding::Bf16,
                roles: Default::default(),
                mtp: Some(Encoding::Int8),
                embeddings: None,
            },
            matrix_order: coli_store::MatrixOrder::Interleaved,
            threads: Some(1),
            progress: false,
        })
        .unwrap_or_else(|e| panic!("{}: {e}", input.display()));
    };
    let (a, b) = (tmp.path().join("per-expert"), tmp.path().join("from-fused"));
    convert(&src, &a);
    convert(&dir, &b);
    let (a, b) = (
        open_store(&a, true, IoPreference::Auto),
        open_store(&b, true, IoPreference::Auto),
    );
    for l in 0..layers as u32 {
        for e in 0..e_count as u32 {
            let k = ExpertKey::new(l, e);
            let (x, y) = (&a.fetch(&[k]).unwrap()[0], &b.fetch(&[k]).unwrap()[0]);
            assert_eq!(x.bytes(), y.bytes(), "{k}");
        }
    }
}

/// Checkpoints transformers 5 itself saved in both layouts (tests/fixtures/transformers5, made by
/// make_transformers5_layouts.py: `save_pretrained` and `save_pretrained(...,
/// save_original_format=False)` of one model) convert to the same store: INDEX, dense.bin,
/// every expert record, the copied files and the MANIFEST but for its source list and store
/// id (which name the source files) are byte-identical. Mixtral's fused save also renames
/// `block_sparse_moe` to `mlp`: its dense tensors keep the published names in the store.
#[test]
fn checkpoints_saved_by_transformers5_fused_give_the_per_expert_store() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/transformers5");
    for family in ["mixtral", "qwen3_moe", "deepseek_v3"] {
        let tmp = tempfile::tempdir().unwrap();
        let store = |layout: &str| {
            let out = tmp.path().join(layout);
            coli_convert::run(&Options {
                input: root.join(family).join(layout),
                output: out.clone(),
                encodings: Encodings::new(
                    Encoding::Int4 { group_size: 64 },
                    Encoding::Bf16,
                    Encoding::Int8,
                ),
                matrix_order: coli_store::MatrixOrder::Interleaved,
                threads: Some(1),
                progress: false,
            })
            .unwrap_or_else(|e| panic!("{family} {layout}: {e}"));
            out
        };
        let (a, b) = (store("per_expert"), store("fused"));
        for f in ["INDEX", "dense.bin", "files/config.json"] {
            let same = std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap();
            assert!(same, "{family}: {f} differs");
        }
        let (sa, sb) = (
            open_store(&a, true, IoPreference::Auto),
            open_store(&b, true, IoPreference::Auto),
        );
        let mut ma = sa.manifest().clone();
        let mut mb = sb.manifest().clone();
        assert!(ma.dense.iter().all(|d| !d.name.contains(".mlp.experts.")));
        if family == "mixtral" {
            assert!(ma
                .dense
                .iter()
                .any(|d| d.name.contains("block_sparse_moe.gate")));
        }
        assert_ne!(ma.sources, mb.sources);
        for m in [&mut ma, &mut mb] {
            m.sources.clear();
            m.store_id = coli_store::StoreId([0; 16]);
        }
        assert_eq!(ma, mb, "{family}: MANIFEST");
        assert_eq!(sa.index().len(), sb.index().len());
        for r in sa.index() {
            let k = ExpertKey::new(r.layer.get(), r.expert.get());
            let same = sa.fetch(&[k]).unwrap()[0].bytes() == sb.fetch(&[k]).unwrap()[0].bytes();
            assert!(same, "{family}: expert {k} differs");
        }
    }
}
