//! `coli info` (tools/src/info.rs) on a store written by the store crate's writer.

mod common;
use coli_tools::info;
use common::*;

#[test]
fn info_reports_classes_encodings_and_provenance() {
    let t = TempDir::new("info");
    let shape = TinyStore {
        layers: 2,
        experts: 3,
        segment_max_bytes: 1 << 20,
        norm_and_tokenizer: true,
    };
    let target = write_tiny_store(t.path(), &shape);
    let r = info::report(&target).unwrap();
    assert_eq!(r["family"], "mixtral");
    assert_eq!(r["dims"]["hidden_size"], 16);
    assert_eq!(r["dims"]["num_layers"], 2);
    assert_eq!(r["dims"]["num_experts"], 3, "{r}");
    assert_eq!(r["encodings"]["experts"], "int8");
    assert_eq!(r["encodings"]["records"]["int8"], 6);
    assert_eq!(r["encodings"]["dense"]["bf16"], 1);
    assert_eq!(r["classes"]["routed_experts"]["count"], 6);
    let store = coli_store::Store::open(&target).unwrap();
    let expert_bytes: u64 = store.index().iter().map(|r| r.length.get()).sum();
    assert!(expert_bytes > 0);
    assert_eq!(r["classes"]["routed_experts"]["bytes"], expert_bytes);
    assert_eq!(r["classes"]["norms"]["count"], 1);
    assert_eq!(r["classes"]["norms"]["bytes"], 32);
    assert_eq!(r["classes"]["routed_experts"]["encodings"]["int8"], 6);
    assert_eq!(r["classes"]["norms"]["encodings"]["bf16"], 1);
    for class in ["attention", "embeddings", "other_dense"] {
        assert_eq!(r["classes"][class]["count"], 0, "{class}");
    }
    assert_eq!(r["store_id"], store.manifest().store_id.to_string());
    assert_eq!(r["format_version"], 1);
    assert_eq!(r["mtp_layer"], false);
    assert_eq!(r["provenance"]["converter"]["version"], "test");
    assert_eq!(r["provenance"]["parameters"]["experts"], "int8");
    info::run(&target, false).unwrap();
    info::run(&target, true).unwrap();
}

#[test]
fn info_on_no_store_says_how_to_make_one_and_on_a_damaged_one_points_at_coli_fsck() {
    let t = TempDir::new("info-missing");
    // A missing path: said so, and how to make a store (as `coli run`, which opens stores
    // through the same function).
    let e = format!(
        "{:#}",
        info::run(&t.path().join("missing"), false).unwrap_err()
    );
    assert!(
        e.contains("does not exist") && e.contains("coli-convert"),
        "{e}"
    );
    // A plain file; a GGUF file, to be converted.
    let file = t.path().join("notes.txt");
    std::fs::write(&file, b"x").unwrap();
    let e = format!("{:#}", info::run(&file, false).unwrap_err());
    assert!(e.contains("is a file, not a coli store"), "{e}");
    let gguf = t.path().join("model.gguf");
    std::fs::write(&gguf, b"GGUF").unwrap();
    let e = format!("{:#}", info::run(&gguf, false).unwrap_err());
    assert!(e.contains("GGUF file") && e.contains("coli-convert"), "{e}");
    // A directory without a MANIFEST: how to make a store.
    let e = format!("{:#}", info::run(t.path(), false).unwrap_err());
    assert!(
        e.contains("not a coli store") && e.contains("coli-convert"),
        "{e}"
    );
    // A store whose MANIFEST does not parse: what is wrong, and coli-fsck.
    let shape = TinyStore {
        layers: 1,
        experts: 2,
        segment_max_bytes: 1 << 20,
        norm_and_tokenizer: false,
    };
    let t2 = TempDir::new("info-damaged");
    let target = write_tiny_store(t2.path(), &shape);
    std::fs::write(target.join("MANIFEST"), b"{ not json").unwrap();
    let e = format!("{:#}", info::run(&target, false).unwrap_err());
    assert!(e.contains("coli-fsck") && e.contains("MANIFEST"), "{e}");
    // `coli run`, `chat`, `serve`, `plan`, `tune` and `mirror` open stores the same way.
    let e = match coli_tools::options::open_store(&target, &Default::default()) {
        Ok(_) => panic!("a MANIFEST that does not parse opened"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("coli-fsck") && e.contains("MANIFEST"), "{e}");
    // Its other files without a MANIFEST: damaged or unfinished, for coli-fsck too.
    std::fs::remove_file(target.join("MANIFEST")).unwrap();
    let e = format!("{:#}", info::run(&target, false).unwrap_err());
    assert!(
        e.contains("no MANIFEST") && e.contains("coli-fsck") && !e.contains("not a coli store"),
        "{e}"
    );
}

#[test]
fn dense_tensors_are_classed_by_name() {
    assert_eq!(
        info::dense_class("model.layers.0.self_attn.q_proj.weight"),
        "attention"
    );
    assert_eq!(
        info::dense_class("model.layers.0.input_layernorm.weight"),
        "norms"
    );
    assert_eq!(info::dense_class("model.embed_tokens.weight"), "embeddings");
    assert_eq!(info::dense_class("lm_head.weight"), "embeddings");
    assert_eq!(
        info::dense_class("model.layers.0.mlp.gate.weight"),
        "other_dense"
    );
}

/// The `coli info` binary takes the store positionally or as `--store DIR` (as run, chat, plan
/// and serve do), with the same report; both at once or neither is a usage error (exit 2).
#[test]
fn info_takes_the_store_positionally_or_with_store() {
    let t = TempDir::new("info-cli");
    let store = write_tiny_store(
        t.path(),
        &TinyStore {
            layers: 1,
            experts: 2,
            segment_max_bytes: 4096,
            norm_and_tokenizer: true,
        },
    );
    let s = store.to_str().unwrap();
    let coli = env!("CARGO_BIN_EXE_coli");
    let (code, positional, err) = run(coli, &["info", s, "--json"]);
    assert_eq!(code, 0, "{err}");
    let (code, flag, err) = run(coli, &["info", "--store", s, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(positional, flag);
    assert!(positional.contains("\"experts\""), "{positional}");
    assert_eq!(run(coli, &["info", s, "--store", s]).0, 2);
    assert_eq!(run(coli, &["info"]).0, 2);
}
