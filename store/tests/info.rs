//! `coli info` (tools/src/info.rs, included here so that it is tested with the store).

mod common;
#[path = "../../tools/src/info.rs"]
mod info;
use common::*;

#[test]
fn info_reports_classes_and_provenance() {
    let t = tempdir();
    let target = target_in(&t);
    let p = ModelParams {
        dense: 6,
        ..Default::default()
    };
    let m = make_model(&p);
    write_model(&target, &m);
    let r = info::report(&target).unwrap();
    assert_eq!(r["family"], "testmoe");
    assert_eq!(r["dims"]["hidden_size"], 64);
    assert_eq!(r["dims"]["num_layers"], 2);
    assert_eq!(r["dims"]["num_experts"], 3);
    assert_eq!(r["dims"]["top_k"], 2);
    assert_eq!(r["encodings"]["experts"], "int4-g32");
    assert_eq!(r["classes"]["routed_experts"]["count"], 6);
    let store = coli_store::Store::open(&target).unwrap();
    let expert_bytes: u64 = store.index().iter().map(|r| r.length.get()).sum();
    assert_eq!(r["classes"]["routed_experts"]["bytes"], expert_bytes);
    // make_model names: d%3 == 0 norm, 1 attention, 2 embeddings.
    assert_eq!(r["classes"]["norms"]["count"], 2);
    assert_eq!(r["classes"]["attention"]["count"], 2);
    assert_eq!(r["classes"]["embeddings"]["count"], 2);
    assert_eq!(r["classes"]["other_dense"]["count"], 0);
    assert_eq!(r["store_id"], m.spec.store_id().to_string());
    assert_eq!(r["format_version"], 1);
    assert_eq!(r["provenance"]["converter"]["version"], "0.1.0-test");
    assert_eq!(r["provenance"]["parameters"]["experts"], "int4-g32");
    assert_eq!(r["provenance"]["sources"][0]["name"], "model.safetensors");
    info::run(&target, false).unwrap();
    info::run(&target, true).unwrap();
    let e = info::run(&t.path().join("missing"), false).unwrap_err();
    assert!(format!("{e:#}").contains("coli-fsck"), "{e:#}");
    assert_eq!(
        info::dense_class("model.layers.0.mlp.gate.weight"),
        "other_dense"
    );
    assert_eq!(info::dense_class("lm_head.weight"), "embeddings");
}
