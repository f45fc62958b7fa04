//! Converts the committed tiny fixtures (tests/fixtures/tiny/*, made by
//! make_tiny_fixtures.py) with their lossless and default parameters, and checks the store
//! opens with every expert, and the int4 probe of expected.json.

mod common;
use coli_store::{ExpertKey, Store};
use common::*;
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    for p in &v {
        assert!(
            p.join("config.json").exists() && p.join("expected.json").exists(),
            "fixture {} lacks config.json or expected.json",
            p.display()
        );
    }
    v
}

fn params(v: &Value) -> Vec<String> {
    let mut a = Vec::new();
    for k in ["experts", "dense", "mtp"] {
        if let Some(x) = v.get(k).and_then(Value::as_str) {
            a.push(format!("--{k}"));
            a.push(x.to_string());
        }
    }
    a
}

#[test]
fn tiny_fixtures_convert_and_match_probe() {
    let fx = fixtures();
    assert!(
        fx.len() >= 6,
        "expected the 6 committed fixtures, found {}",
        fx.len()
    );
    for dir in fx {
        let exp: Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let dims = &exp["dims"];
        let layers = dims["layers"].as_u64().unwrap() as usize;
        let experts = dims["experts"].as_u64().unwrap() as usize;
        let tmp = tempfile::tempdir().unwrap();
        for (label, p) in [
            ("lossless", &exp["lossless_store"]),
            ("int4", &exp["int4_store"]),
        ] {
            let out = tmp.path().join(label);
            let args = params(p);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = convert(&dir, &out, &args);
            assert!(
                o.status.success(),
                "{} {label}: {}",
                dir.display(),
                stderr(&o)
            );
            let st = Store::open(&out).unwrap();
            let cfg: Value =
                serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
            let first_dense = cfg
                .get("first_k_dense_replace")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize;
            let mtp = cfg
                .get("num_nextn_predict_layers")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize;
            // A fixture whose dense layers are not the first ones (Inkling's mlp_layer_types)
            // states its MoE layer count.
            let moe_layers = dims
                .get("moe_layers")
                .and_then(Value::as_u64)
                .map_or(layers - first_dense + mtp, |n| n as usize);
            assert_eq!(st.index().len(), moe_layers * experts, "{}", dir.display());
            assert_eq!(st.manifest().expert_layers.len(), moe_layers);
            if let Some(ml) = dims.get("mtp_layer").and_then(Value::as_u64) {
                // MTP experts get the --mtp encoding (int8 by default, fp8 in the lossless store).
                let x = st.fetch_one(ExpertKey::new(ml as u32, 0)).unwrap();
                let want = match p.get("mtp").and_then(Value::as_str) {
                    Some("fp8") => coli_store::Encoding::Fp8,
                    Some("bf16") => coli_store::Encoding::Bf16,
                    _ => coli_store::Encoding::Int8,
                };
                assert_eq!(
                    x.gate().encoding(),
                    want,
                    "{} {label} MTP expert",
                    dir.display()
                );
            }
            let Some(probe) = exp.get("int4_probe") else {
                continue;
            };
            let layer = probe["layer"].as_u64().unwrap() as u32;
            let expert = probe["expert"].as_u64().unwrap() as u32;
            let x = st.fetch_one(ExpertKey::new(layer, expert)).unwrap();
            let g = x.gate();
            let cols = probe["cols"].as_u64().unwrap() as usize;
            let rows: Vec<usize> = probe["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap() as usize)
                .collect();
            let key = if label == "int4" {
                "int4_dequantized"
            } else {
                "lossless_f32"
            };
            for (k, &r) in rows.iter().enumerate() {
                let mut row = vec![0f32; cols];
                g.dequantize_row(r, &mut row);
                let want: Vec<f32> = probe[key][k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                for c in 0..cols {
                    let tol = 1e-6 * want[c].abs();
                    assert!(
                        (row[c] - want[c]).abs() <= tol,
                        "{} {label} row {r} col {c}: store {} vs expected {}",
                        dir.display(),
                        row[c],
                        want[c]
                    );
                }
            }
        }
    }
}
