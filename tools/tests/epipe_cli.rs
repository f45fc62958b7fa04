//! A closed standard output ends every printing subcommand quietly: `coli SUB ... | head -c1`
//! must exit 0 with nothing on standard error (no "failed printing to stdout: Broken pipe"
//! panic), as ripgrep does. `coli run` stops generating at the closed pipe (as before) and
//! still prints its run summary, which always goes to standard error: there the check is
//! status 0 and no panic or error line. The reader end of the pipe is closed before the binary starts, so
//! its first print fails with EPIPE whatever the output's size.

mod common;
use common::{convert_fixture, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `bin args` with its standard output a pipe nobody reads; returns (status, stderr).
fn closed_stdout(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin)
        .args(args)
        .env(
            "COLI_STATE_DIR",
            std::env::temp_dir().join("coli-epipe-state"),
        )
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_printing_subcommand_exits_quietly_on_a_closed_pipe() {
    let tmp = TempDir::new("epipe");
    let store = tmp.path().join("store");
    let fixture = convert_fixture("qwen3_moe_bf16", &store);
    let (s, f) = (store.to_str().unwrap(), fixture.to_str().unwrap());
    let glm5 = repo().join("docs/configs/glm-5.config.json");
    let glm5 = glm5.to_str().unwrap();
    let kv = tmp.path().join("kv");
    std::fs::create_dir(&kv).unwrap();
    let kv = kv.to_str().unwrap();
    let coli = env!("CARGO_BIN_EXE_coli");
    let fsck = env!("CARGO_BIN_EXE_coli-fsck");
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (coli, vec!["info", s]),
        (coli, vec!["info", "--json", s]),
        (coli, vec!["plan", "--store", s]),
        (coli, vec!["plan", "--store", s, "--json"]),
        (coli, vec!["plan", "--config", glm5, "--total-ram", "25G"]),
        (
            coli,
            vec!["plan", "--checkpoint", f, "--total-ram", "25G", "--json"],
        ),
        (
            coli,
            vec![
                "run",
                "--store",
                s,
                "--prompt-ids",
                "1,2,3",
                "--max-tokens",
                "8",
            ],
        ),
        (
            coli,
            vec![
                "run",
                "--store",
                s,
                "--prompt-ids",
                "1,2,3",
                "--max-tokens",
                "8",
                "--json",
            ],
        ),
        (coli, vec!["doctor", "--store", s]),
        (coli, vec!["kv", "ls", "--kv-dir", kv]),
        (coli, vec!["--help"]),
        (fsck, vec![s]),
        (fsck, vec!["--json", s]),
    ];
    for (bin, args) in cases {
        let (code, err) = closed_stdout(bin, &args);
        assert_eq!(code, Some(0), "{bin} {args:?}: {err}");
        if args[0] == "run" {
            assert!(
                !err.contains("panicked") && !err.contains("error"),
                "{args:?}: {err}"
            );
        } else {
            assert!(err.trim().is_empty(), "{bin} {args:?}: stderr {err:?}");
        }
    }
}
