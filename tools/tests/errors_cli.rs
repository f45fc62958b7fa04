//! Errors reach the user once each: every error adds its context by wrapping once (its message
//! shows the inner error, or `source()` returns it, never both), and the CLI prints the chain
//! as it is. A message naming the file and the OS error must not repeat either.

mod common;
use common::{run, write_small_store, TempDir};

#[test]
fn an_os_error_is_printed_once_with_its_file() {
    let t = TempDir::new("errors-cli");
    let store = write_small_store(t.path());
    // INDEX replaced by a directory: reading it fails with EISDIR.
    let index = store.join("INDEX");
    std::fs::remove_file(&index).unwrap();
    std::fs::create_dir(&index).unwrap();
    let s = store.to_str().unwrap();
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_coli"),
        &[
            "run",
            "--store",
            s,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
        ],
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("INDEX"), "{err}");
    assert_eq!(err.matches("os error 21").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A missing store directory: no OS error to repeat, what it is and how to make one, once.
    let missing = t.path().join("no-such-store");
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_coli"),
        &["info", missing.to_str().unwrap()],
    );
    assert_ne!(code, 0, "{err}");
    assert_eq!(err.matches("does not exist").count(), 1, "{err}");
    assert!(
        err.contains("no-such-store") && err.contains("coli-convert"),
        "{err}"
    );
    assert!(
        !err.contains("os error") && !err.contains("panicked"),
        "{err}"
    );
}

/// `coli chat --kv-dir DIR` without `--session`: refused, saying what it needs (a chat without
/// a session keeps nothing on disk, so the directory would be silently ignored).
#[test]
fn chat_kv_dir_without_a_session_is_refused() {
    let t = TempDir::new("errors-cli-chat");
    let kv = t.path().join("kv");
    let (code, _, err) = run(
        env!("CARGO_BIN_EXE_coli"),
        &[
            "chat",
            "--store",
            t.path().join("no-store").to_str().unwrap(),
            "--kv-dir",
            kv.to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("--kv-dir needs --session NAME"), "{err}");
    assert!(!kv.exists(), "nothing created");
}
