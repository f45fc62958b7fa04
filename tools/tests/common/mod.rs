//! Shared by the CLI tests: a temporary directory and a tiny int8 store written with the
//! store crate's writer.

use coli_store::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory named after `tag`, the process and the time.
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!("coli-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The shape of a tiny store.
pub struct TinyStore {
    /// Layers, each with `experts` routed experts (hidden 16, intermediate 8, int8).
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Segment file size limit, bytes.
    pub segment_max_bytes: u64,
    /// Also a bf16 `model.norm.weight` and a `tokenizer.json`.
    pub norm_and_tokenizer: bool,
}

/// [`write_tiny_store`] of one layer of 2 experts in one segment, with a norm and a
/// tokenizer (a store no model loads from: its config.json has only `model_type` and
/// `hidden_size`).
#[allow(dead_code)] // not every test binary uses it
pub fn write_small_store(dir: &Path) -> PathBuf {
    write_tiny_store(
        dir,
        &TinyStore {
            layers: 1,
            experts: 2,
            segment_max_bytes: 1 << 20,
            norm_and_tokenizer: true,
        },
    )
}

/// Writes `dir/s.coli` with the given shape; expert `(l, e)`'s matrices hold bytes
/// `i * seed` with seeds from `(l * experts + e) + 3`, scales 0.25.
pub fn write_tiny_store(dir: &Path, shape: &TinyStore) -> PathBuf {
    let target = dir.join("s.coli");
    let enc = Encoding::Int8;
    let spec = StoreSpec {
        family: "mixtral".into(),
        // A config the MANIFEST's other fields agree with (coli-fsck checks the model it
        // describes); the store holds only experts and a norm, so nothing can run it.
        config_json: serde_json::to_vec(&serde_json::json!({
            "model_type": "mixtral", "hidden_size": 16, "intermediate_size": 8,
            "num_hidden_layers": shape.layers, "num_attention_heads": 2,
            "num_key_value_heads": 1, "num_local_experts": shape.experts,
            "num_experts_per_tok": 1, "vocab_size": 32,
        }))
        .unwrap(),
        num_layers: shape.layers,
        expert_layers: (0..shape.layers)
            .map(|layer| ExpertLayer {
                layer,
                num_experts: shape.experts,
            })
            .collect(),
        expert_encoding: enc,
        alignment: 512,
        segment_max_bytes: shape.segment_max_bytes,
        matrix_order: Default::default(),
        converter_version: "test".into(),
        parameter_defaults: Default::default(),
        parameters: BTreeMap::from([("experts".to_string(), "int8".to_string())]),
        sources: vec![],
    };
    let mat = |rows: usize, cols: usize, seed: u8| EncodedMatrix {
        encoding: enc,
        rows,
        cols,
        data: (0..rows * cols)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect(),
        scales: vec![0.25; rows],
        e8m0_scales: Vec::new(),
        bias: None,
    };
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&target, spec).unwrap() else {
        panic!("fresh target expected")
    };
    for l in 0..shape.layers {
        for e in 0..shape.experts {
            let s = (l * shape.experts + e) as u8 + 3;
            w.add_expert(
                ExpertKey::new(l, e),
                16,
                8,
                [&mat(8, 16, s), &mat(8, 16, s + 1), &mat(16, 8, s + 2)],
            )
            .unwrap();
        }
    }
    if shape.norm_and_tokenizer {
        let norm = EncodedMatrix {
            encoding: Encoding::Bf16,
            rows: 1,
            cols: 16,
            data: vec![0x3f; 32],
            scales: vec![],
            e8m0_scales: Vec::new(),
            bias: None,
        };
        w.add_dense("model.norm.weight", &[16], &norm).unwrap();
        w.add_file("tokenizer.json", b"{}").unwrap();
    }
    w.finish().unwrap()
}

/// Runs `bin` with `args`: exit code (-1 when killed by a signal), stdout, stderr.
#[allow(dead_code)] // not every test binary runs a command
pub fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Converts the committed fixture `tests/fixtures/tiny/NAME` into the store `out`
/// (`--experts int4-g64 --dense bf16`); returns the fixture's directory.
#[allow(dead_code)] // not every test binary converts a fixture
pub fn convert_fixture(name: &str, out: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny")
        .join(name);
    convert_dir(&fixture, out);
    fixture
}

/// Converts the checkpoint directory `input` into the store `out` (`--experts int4-g64
/// --dense bf16`, one thread).
#[allow(dead_code)] // not every test binary converts a checkpoint
pub fn convert_dir(input: &Path, out: &Path) {
    coli_convert::run(&coli_convert::Options {
        input: input.to_path_buf(),
        output: out.to_path_buf(),
        encodings: coli_convert::Encodings::new(
            coli_store::Encoding::Int4 { group_size: 64 },
            coli_store::Encoding::Bf16,
            coli_store::Encoding::Int8,
        ),
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap_or_else(|e| panic!("converting {}: {e}", input.display()));
}

/// Opens the store at `dir` (checksums verified, the default I/O).
#[allow(dead_code)] // not every test binary opens a store
pub fn open_store(dir: &Path) -> Store {
    Store::open_with(dir, &OpenOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// A `coli serve` child (`coli serve ARGS`, with `--port 0` among them) once it listens: the
/// child and its `host:port`. Its log is drained in the background so that it never blocks on
/// a full pipe.
#[allow(dead_code)] // not every test binary serves
pub fn spawn_serve(args: &[&std::ffi::OsStr]) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_coli"))
        .arg("serve")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("coli serve exited before listening")
            .unwrap();
        if let Some(at) = line.find("listening on http://") {
            break line[at + "listening on http://".len()..].trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// The largest absolute difference between `a` and `b` (equal lengths).
#[allow(dead_code)] // not every test binary compares logits
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}
