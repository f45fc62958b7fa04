//! Shared helpers for the cross-crate tests: the committed tiny fixtures
//! (`tests/fixtures/tiny/<name>/`, made by `tests/fixtures/make_*_fixtures.py`) and their
//! conversion into temporary stores.

use coli_convert::{Encodings, Options};
use coli_store::Encoding;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The checkpoint directory of fixture `name` (e.g. `mixtral_fp8`).
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tiny")
        .join(name)
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

/// A `coli-convert` encoding name (`fp8`, `bf16`, `f32`, `int8`, `int4-g64`, `int4-g32`).
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
        other => panic!("unknown encoding {other}"),
    }
}

/// Converts fixture `name` with the encodings of `expected.json[variant]` (`experts`, `dense`,
/// and `mtp` when given, else int8) into a new temporary directory; returns the directory (keep
/// it alive) and the store path inside it.
///
/// # Panics
/// If the conversion fails.
pub fn convert_fixture(name: &str, variant: &str) -> (tempfile::TempDir, PathBuf) {
    let exp = expected(name);
    let params = &exp[variant];
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("store");
    let enc = Encodings {
        experts: encoding(params["experts"].as_str().expect("experts encoding")),
        dense: encoding(params["dense"].as_str().expect("dense encoding")),
        mtp: params["mtp"].as_str().map_or(Encoding::Int8, encoding),
        embeddings: params["embeddings"].as_str().map(encoding),
    };
    coli_convert::run(&Options {
        input: fixture_dir(name),
        output: out.clone(),
        encodings: enc,
        threads: Some(1),
        progress: false,
    })
    .unwrap_or_else(|e| panic!("converting {name} ({variant}): {e}"));
    (tmp, out)
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
    };
    engine
        .generate(prompt, &params, |_| Ok(true))
        .expect("generate")
        .tokens
}
