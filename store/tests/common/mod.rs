//! Shared helpers of the store's integration tests: deterministic random models, writing them
//! (fresh or resumed), snapshots of store directories, and low-level rewriting of files.
#![allow(dead_code)]

use coli_store::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One expert to write: key, H, I, and gate/up/down.
pub type ExpertIn = (ExpertKey, usize, usize, [EncodedMatrix; 3]);

/// A model to write: spec, experts in write order, dense tensors, files.
pub struct Model {
    pub spec: StoreSpec,
    pub experts: Vec<ExpertIn>,
    pub dense: Vec<(String, Vec<usize>, EncodedMatrix)>,
    pub files: Vec<(String, Vec<u8>)>,
}

/// Random bytes that are a valid weight section of `enc` for [rows, cols]: fp8 avoids the NaN
/// codes, int4 with odd `cols` has 8 in the last high nibble of each row.
pub fn random_matrix(rng: &mut StdRng, enc: Encoding, rows: usize, cols: usize) -> EncodedMatrix {
    let mut data: Vec<u8> = (0..enc.weight_bytes(rows, cols))
        .map(|_| rng.gen())
        .collect();
    match enc {
        Encoding::Fp8 | Encoding::Mxfp8 => {
            for b in &mut data {
                if *b & 0x7f == 0x7f {
                    *b &= 0xfe;
                }
            }
        }
        Encoding::Int4 { .. } if cols % 2 == 1 => {
            let stride = cols.div_ceil(2);
            for r in 0..rows {
                let b = &mut data[r * stride + stride - 1];
                *b = (*b & 0x0f) | 0x80;
            }
        }
        _ => {}
    }
    if matches!(enc, Encoding::Mxfp4 | Encoding::Mxfp8) {
        // Any code byte (mxfp8: but the e4m3 NaN codes); e8m0 scales of every exponent but the
        // NaN code 255.
        let mut m = EncodedMatrix::new(enc, rows, cols, data, vec![]);
        m.e8m0_scales = (0..enc.scale_count(rows, cols))
            .map(|_| rng.gen_range(0u8..=254))
            .collect();
        return m;
    }
    let scales = (0..enc.scale_count(rows, cols))
        .map(|_| rng.gen_range(1e-4f32..1.0))
        .collect();
    EncodedMatrix {
        encoding: enc,
        rows,
        cols,
        data,
        scales,
        e8m0_scales: Vec::new(),
        bias: None,
    }
}

/// Parameters of a random model.
#[derive(Clone, Debug)]
pub struct ModelParams {
    pub seed: u64,
    pub hidden: usize,
    pub inter: usize,
    pub encoding: Encoding,
    pub alignment: usize,
    pub segment_max_bytes: u64,
    pub layers: u32,
    pub experts: u32,
    /// Encoding of an extra last "MTP" layer's experts, if any.
    pub mtp_encoding: Option<Encoding>,
    pub dense: usize,
}

impl Default for ModelParams {
    fn default() -> Self {
        ModelParams {
            seed: 7,
            hidden: 64,
            inter: 48,
            encoding: Encoding::Int4 { group_size: 32 },
            alignment: 512,
            segment_max_bytes: 16 * 1024,
            layers: 2,
            experts: 3,
            mtp_encoding: None,
            dense: 3,
        }
    }
}

pub const ENCODINGS: [Encoding; 6] = [
    Encoding::F32,
    Encoding::Bf16,
    Encoding::Fp8,
    Encoding::Int8,
    Encoding::Int4 { group_size: 32 },
    Encoding::Int4 { group_size: 64 },
];

pub fn make_model(p: &ModelParams) -> Model {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let total_layers = p.layers + p.mtp_encoding.is_some() as u32;
    let expert_layers: Vec<ExpertLayer> = (0..total_layers)
        .map(|l| ExpertLayer {
            layer: l,
            num_experts: p.experts,
        })
        .collect();
    let config = serde_json::json!({
        "model_type": "testmoe", "hidden_size": p.hidden, "num_hidden_layers": total_layers,
        "n_routed_experts": p.experts, "num_experts_per_tok": 2, "moe_intermediate_size": p.inter,
    });
    let spec = StoreSpec {
        family: "testmoe".into(),
        config_json: serde_json::to_vec(&config).unwrap(),
        num_layers: total_layers,
        expert_layers,
        expert_encoding: p.encoding,
        alignment: p.alignment,
        segment_max_bytes: p.segment_max_bytes,
        matrix_order: Default::default(),
        converter_version: "0.1.0-test".into(),
        parameter_defaults: Default::default(),
        parameters: BTreeMap::from([
            ("experts".to_string(), p.encoding.name()),
            ("dense".to_string(), "mixed".to_string()),
        ]),
        sources: vec![SourceFile {
            name: "model.safetensors".into(),
            size: 1234,
            header_xxh3: coli_store::Xxh3Sum(0x0123456789abcdef),
        }],
    };
    let mut experts = Vec::new();
    for l in 0..total_layers {
        let enc = if l >= p.layers {
            p.mtp_encoding.unwrap()
        } else {
            p.encoding
        };
        for e in 0..p.experts {
            let (h, i) = (p.hidden, p.inter);
            let mats = [
                random_matrix(&mut rng, enc, i, h),
                random_matrix(&mut rng, enc, i, h),
                random_matrix(&mut rng, enc, h, i),
            ];
            experts.push((ExpertKey::new(l, e), h, i, mats));
        }
    }
    let mut dense = Vec::new();
    for d in 0..p.dense {
        let enc = [Encoding::Bf16, Encoding::Int8, Encoding::F32, Encoding::Fp8][d % 4];
        let (name, shape) = match d % 3 {
            0 => (
                format!("model.layers.{d}.input_layernorm.weight"),
                vec![p.hidden],
            ),
            1 => (
                format!("model.layers.{d}.self_attn.q_proj.weight"),
                vec![p.hidden + d, p.hidden],
            ),
            _ => (
                format!("model.embed_tokens.{d}.weight"),
                vec![7 + d, p.hidden],
            ),
        };
        let (rows, cols) = if shape.len() == 1 {
            (1, shape[0])
        } else {
            (shape[0], shape[1])
        };
        dense.push((name, shape, random_matrix(&mut rng, enc, rows, cols)));
    }
    let files = vec![
        (
            "tokenizer.json".to_string(),
            br#"{"version":"1.0","model":{}}"#.to_vec(),
        ),
        (
            "chat_template.jinja".to_string(),
            b"{{ messages }}".to_vec(),
        ),
    ];
    Model {
        spec,
        experts,
        dense,
        files,
    }
}

/// Writes `m` to `target` (fresh or resuming, skipping done entries), interleaving dense
/// tensors between layers, and finishes. Returns the WriterStart kind.
pub fn write_model(target: &Path, m: &Model) -> &'static str {
    let (mut w, kind) = match StoreWriter::create_or_resume(target, m.spec.clone()).unwrap() {
        WriterStart::Fresh(w) => (w, "fresh"),
        WriterStart::Resumed(w, _) => (w, "resumed"),
        WriterStart::AlreadyComplete => return "complete",
    };
    add_all(&mut w, m).unwrap();
    w.finish().unwrap();
    kind
}

/// Adds every entry not yet done, in the model's deterministic order.
pub fn add_all(w: &mut StoreWriter, m: &Model) -> Result<(), StoreError> {
    let mut dense = m.dense.iter();
    let mut last_layer = None;
    for (k, h, i, mats) in &m.experts {
        if last_layer != Some(k.layer) {
            if let Some((name, shape, t)) = dense.next() {
                if !w.is_dense_done(name) {
                    w.add_dense(name, shape, t)?;
                }
            }
            last_layer = Some(k.layer);
        }
        if !w.is_expert_done(*k) {
            w.add_expert(*k, *h, *i, [&mats[0], &mats[1], &mats[2]])?;
        }
    }
    for (name, shape, t) in dense {
        if !w.is_dense_done(name) {
            w.add_dense(name, shape, t)?;
        }
    }
    for (name, bytes) in &m.files {
        w.add_file(name, bytes)?;
    }
    Ok(())
}

/// Every file under `dir` (relative path -> bytes).
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Rewrites the MANIFEST body through `f` (re-serialized, crc and length recomputed).
pub fn rewrite_manifest(dir: &Path, version: u32, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("MANIFEST");
    let b = std::fs::read(&p).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&b[24..]).unwrap();
    f(&mut v);
    let body = serde_json::to_vec(&v).unwrap();
    let mut out = b[..8].to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&crc32fast_hash(&body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    std::fs::write(&p, out).unwrap();
}

/// Rewrites INDEX records through `f` (crcs, count, and the MANIFEST's index_file recomputed).
pub fn rewrite_index(dir: &Path, f: impl FnOnce(&mut Vec<[u8; 64]>)) {
    let p = dir.join("INDEX");
    let b = std::fs::read(&p).unwrap();
    let mut header: [u8; 64] = b[..64].try_into().unwrap();
    let mut recs: Vec<[u8; 64]> = b[64..]
        .chunks_exact(64)
        .map(|c| c.try_into().unwrap())
        .collect();
    f(&mut recs);
    header[16..24].copy_from_slice(&(recs.len() as u64).to_le_bytes());
    let c = crc32fast_hash(&header[..60]);
    header[60..].copy_from_slice(&c.to_le_bytes());
    let mut out = header.to_vec();
    for r in &mut recs {
        let c = crc32fast_hash(&r[..60]);
        r[60..].copy_from_slice(&c.to_le_bytes());
        out.extend_from_slice(r);
    }
    std::fs::write(&p, &out).unwrap();
    let len = out.len();
    let sum = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&out));
    rewrite_manifest(dir, 1, |v| {
        v["index_file"] = serde_json::json!({"length": len, "xxh3": sum});
    });
}

pub fn crc32fast_hash(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("coli-store-test")
        .tempdir()
        .unwrap()
}

pub fn target_in(t: &tempfile::TempDir) -> PathBuf {
    t.path().join("store.coli")
}

/// Runs the current test binary's ignored test `name` as a child process with `envs`.
pub fn child(name: &str, envs: &[(&str, String)]) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.env_remove("COLI_FAILPOINT");
    c
}
