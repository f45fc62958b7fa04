//! The store read from C through the C ABI (`store/ffi`, header `coli_store.h`): the tiny
//! fixture checkpoints are converted with `coli_convert` into temporary stores, and the C
//! program `tests/c/coli_c_check.c` (built with the system C compiler against
//! `libcoli_store_ffi.a`) checks every expert and dense tensor against the SOURCE safetensors
//! files, which it parses itself, with its own dequantization: bit-exact for lossless stores,
//! exact scales/q and within half an int4/int8 step for quantized ones. Two runs go under
//! valgrind when it is installed. A damaged source copy must make the C program fail.

use coli_convert::{Encodings, Options};
use coli_store::Encoding;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn fixture_dir(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tiny").join(name)
}

/// The directory holding `libcoli_store_ffi.a` of this build: cargo writes the ffi crate's
/// staticlib next to this test executable (target/<profile>/deps) when it builds the crate as a
/// dev-dependency; `cargo build -p coli-store-ffi` also puts one in target/<profile>.
fn ffi_lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    for d in [
        deps.clone(),
        deps.parent().map(Path::to_path_buf).unwrap_or_default(),
    ] {
        if d.join("libcoli_store_ffi.a").is_file() {
            return d;
        }
    }
    panic!(
        "libcoli_store_ffi.a not found next to {} nor in its parent: run `cargo build -p coli-store-ffi`",
        exe.display()
    );
}

/// Builds the C test program once per test binary; returns its path.
fn c_checker() -> &'static Path {
    static BIN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, bin) = BIN.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("coli_c_check");
        let out = Command::new("bash")
            .arg(repo_root().join("tests/c/build.sh"))
            .arg(ffi_lib_dir())
            .arg(&bin)
            .output()
            .expect("run bash tests/c/build.sh (needs bash and a C compiler, gcc by default)");
        assert!(
            out.status.success(),
            "tests/c/build.sh failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (tmp, bin)
    });
    bin
}

fn convert(input: &Path, out: &Path, experts: Encoding, dense: Encoding) {
    let enc = Encodings {
        experts,
        dense,
        roles: Default::default(),
        mtp: Some(Encoding::Int8),
        embeddings: None,
    };
    coli_convert::run(&Options {
        input: input.to_path_buf(),
        output: out.to_path_buf(),
        encodings: enc,
        matrix_order: coli_store::MatrixOrder::Interleaved,
        threads: Some(1),
        progress: false,
    })
    .unwrap_or_else(|e| panic!("converting {}: {e}", input.display()));
}

fn have_valgrind() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the C checker on (store, checkpoint), under valgrind when asked and installed.
fn run_checker(store: &Path, checkpoint: &Path, valgrind: bool) -> std::process::Output {
    let bin = c_checker();
    let mut cmd = if valgrind && have_valgrind() {
        // Rayon's fetch threads end asynchronously after coli_store_close, so their thread-local
        // blocks show as "possibly lost" at exit; definite and indirect leaks are errors.
        // Valgrind does not model io_uring (the kernel's writes into a caller's buffer would
        // look uninitialised): under it the store reads with the pread engine, whose read
        // syscalls valgrind follows.
        let mut c = Command::new("valgrind");
        c.env("COLI_IO_URING", "off");
        c.args([
            "--error-exitcode=1",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect",
            "-q",
        ])
        .arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.arg(store)
        .arg(checkpoint)
        .output()
        .expect("run the C checker")
}

fn assert_checker_passes(store: &Path, checkpoint: &Path, valgrind: bool) {
    let out = run_checker(store, checkpoint, valgrind);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(": ok"),
        "C checker failed on {} vs {} (status {:?}):\n{stdout}{}",
        store.display(),
        checkpoint.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_program_reads_lossless_stores_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (name, enc)) in [
        ("mixtral_fp8", Encoding::Fp8),
        ("olmoe_fp8", Encoding::Fp8),
        ("qwen3_moe_fp8", Encoding::Fp8),
        ("qwen3_moe_bf16", Encoding::Bf16),
        // Fused MXFP4 experts with biases (format version 2), BF16 dense as published.
        ("gpt_oss_mxfp4", Encoding::Mxfp4),
    ]
    .into_iter()
    .enumerate()
    {
        let store = tmp.path().join(format!("{name}-lossless"));
        let dense = if enc == Encoding::Mxfp4 {
            Encoding::Bf16
        } else {
            enc
        };
        convert(&fixture_dir(name), &store, enc, dense);
        assert_checker_passes(&store, &fixture_dir(name), i == 0);
    }
}

#[test]
fn c_program_reads_quantized_stores_within_half_a_step() {
    let tmp = tempfile::tempdir().unwrap();
    let int4 = Encoding::Int4 { group_size: 64 };
    for (i, (name, experts, dense)) in [
        ("mixtral_fp8", int4, Encoding::Bf16),
        ("olmoe_fp8", int4, Encoding::Bf16),
        (
            "qwen3_moe_fp8",
            Encoding::Int4 { group_size: 32 },
            Encoding::Int8,
        ),
        // MLA: shared experts and the MTP layer (int8 experts) besides the int4 routed ones.
        ("deepseek_v3_fp8", int4, Encoding::Bf16),
        // MXFP4 source requantized to int4 (w_src = e2m1 * 2^(e - 127)), biases kept.
        ("gpt_oss_mxfp4", int4, Encoding::Bf16),
    ]
    .into_iter()
    .enumerate()
    {
        let store = tmp.path().join(format!("{name}-{}", experts.name()));
        convert(&fixture_dir(name), &store, experts, dense);
        assert_checker_passes(&store, &fixture_dir(name), i == 0);
    }
}

/// Changes element [3][5] of the FP8 weight `tensor` in a copy of the checkpoint `name`: to
/// e4m3 448 (0x7E, the largest value), or to 0 when it already is 448. Returns the copy.
///
/// Either way an int4 requantization of the changed source differs at [3][5] or in the scale of
/// its group: a new group maximum changes the scale; with the scale unchanged, q goes from
/// rint(w / s) <= 6 (every e4m3 value below 448 is at most 416 = 6.5 steps, rounded to even)
/// to 7, or from 7 to 0.
fn damaged_checkpoint(name: &str, tensor: &str, dir: &Path) -> PathBuf {
    let src = fixture_dir(name);
    let dst = dir.join(format!("{name}-damaged"));
    std::fs::create_dir_all(&dst).unwrap();
    let mut flipped = false;
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            if let Some(t) = header.get(tensor) {
                let start = t["data_offsets"][0].as_u64().unwrap() as usize;
                let cols = t["shape"][1].as_u64().unwrap() as usize;
                let b = &mut bytes[8 + n + start + 3 * cols + 5];
                *b = if *b == 0x7E { 0x00 } else { 0x7E };
                flipped = true;
            }
        }
        std::fs::write(dst.join(p.file_name().unwrap()), bytes).unwrap();
    }
    assert!(flipped, "{tensor} not found in {name}");
    dst
}

#[test]
fn c_program_detects_a_store_that_differs_from_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "mixtral_fp8";
    let tensor = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
    let store = tmp.path().join("lossless");
    convert(&fixture_dir(name), &store, Encoding::Fp8, Encoding::Fp8);
    let damaged = damaged_checkpoint(name, tensor, tmp.path());
    // The lossless store: the changed FP8 byte differs from the store's.
    let out = run_checker(&store, &damaged, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a mismatch exit:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("{tensor} row 3: fp8 bytes differ")),
        "{stderr}"
    );
    // The int4 store of the intact checkpoint: the changed source value changes its group's q
    // or scale (see damaged_checkpoint), which the C program's exact requantization notices.
    let int4 = tmp.path().join("int4");
    convert(
        &fixture_dir(name),
        &int4,
        Encoding::Int4 { group_size: 64 },
        Encoding::Bf16,
    );
    let out = run_checker(&int4, &damaged, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a mismatch exit:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("{tensor} [3][5]")) || stderr.contains(&format!("{tensor} row 3")),
        "{stderr}"
    );
}

/// A changed e2m1 byte in gpt-oss's fused `gate_up_proj_blocks` (expert 3, source row 5 = up
/// row 2) and a changed e8m0 scale (expert 1, gate row 0): the C program names both.
#[test]
fn c_program_detects_an_mxfp4_store_that_differs_from_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let name = "gpt_oss_mxfp4";
    let store = tmp.path().join("lossless");
    convert(&fixture_dir(name), &store, Encoding::Mxfp4, Encoding::Bf16);
    let dst = tmp.path().join("damaged");
    std::fs::create_dir_all(&dst).unwrap();
    let mut changed = 0;
    for e in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let p = e.unwrap().path();
        let mut bytes = std::fs::read(&p).unwrap();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            for (tensor, expert, row) in [
                ("model.layers.1.mlp.experts.gate_up_proj_blocks", 3, 5),
                ("model.layers.1.mlp.experts.gate_up_proj_scales", 1, 0),
            ] {
                if let Some(t) = header.get(tensor) {
                    let shape: Vec<usize> = t["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|d| d.as_u64().unwrap() as usize)
                        .collect();
                    let row_bytes: usize = shape[2..].iter().product();
                    let start = t["data_offsets"][0].as_u64().unwrap() as usize;
                    let at = 8 + n + start + (expert * shape[1] + row) * row_bytes;
                    bytes[at] ^= 0x11;
                    changed += 1;
                }
            }
        }
        std::fs::write(dst.join(p.file_name().unwrap()), bytes).unwrap();
    }
    assert_eq!(changed, 2);
    let out = run_checker(&store, &dst, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a mismatch exit:\n{stderr}"
    );
    let base = "model.layers.1.mlp.experts.gate_up_proj";
    assert!(
        stderr.contains(&format!(
            "{base} expert 3 up_proj row 2: mxfp4 bytes differ"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{base} expert 1 gate_proj row 0: e8m0 scales differ"
        )),
        "{stderr}"
    );
}

/// The example program of docs/C_API.md ("## Example"), compiled and run on a converted store.
#[test]
fn c_api_doc_example_compiles_and_runs() {
    let doc = std::fs::read_to_string(repo_root().join("docs/C_API.md")).unwrap();
    let after = &doc[doc
        .find("## Example")
        .expect("docs/C_API.md has an Example section")..];
    let start = after
        .find("```c\n")
        .expect("a C code block in the Example section")
        + 5;
    let code = &after[start..start + after[start..].find("\n```").unwrap()];
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("example.c");
    std::fs::write(&src, code).unwrap();
    let bin = tmp.path().join("example");
    let lib = ffi_lib_dir().join("libcoli_store_ffi.a");
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo_root().join("store/ffi/include"))
        .arg(&src)
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("run {cc}: {e}"));
    assert!(
        out.status.success(),
        "example does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = tmp.path().join("olmoe.coli");
    convert(
        &fixture_dir("olmoe_fp8"),
        &store,
        Encoding::Int4 { group_size: 64 },
        Encoding::Bf16,
    );
    let out = Command::new(&bin).arg(&store).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "example failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 8 experts in the batch + 1 into the program's buffer; 1 int4-g64 layout line per expert.
    assert!(
        stdout.starts_with("olmoe: 2 layers, 2 with experts, encoding 5 group 64\n"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("gate [160, 96], row 0 sum").count(),
        8,
        "{stdout}"
    );
    assert!(
        stdout.contains("model.norm.weight: 1-D, 96 values, encoding 2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("missing expert: COLI_ERR_NOT_FOUND ("),
        "{stdout}"
    );
    assert!(stdout.contains("layer 1073741824 expert 0)"), "{stdout}");
    assert!(stdout.contains("\n9 reads, "), "{stdout}");
}
