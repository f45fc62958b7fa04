//! `coli kv ls|clear` (tools/src/kv.rs) on a KV cache directory: only files named as coli
//! names them are listed or removed; quarantined files are counted and cleared.

mod common;
use common::*;

#[test]
fn kv_ls_and_clear_touch_only_coli_files_and_see_the_quarantine() {
    let t = TempDir::new("kv-cli");
    let dir = t.path().join("kv");
    std::fs::create_dir_all(dir.join("quarantine")).unwrap();
    let name = format!(
        "{}-{}-{}-{}.kv",
        "ab".repeat(16),
        "01".repeat(8),
        "0".repeat(16),
        "cd".repeat(8)
    );
    // A coli-named file whose bytes are not a KV cache file: listed as damaged.
    std::fs::write(dir.join(&name), b"not a kv cache file, far too short").unwrap();
    // Somebody else's `.kv` file (e.g. a Kivy layout): never listed, never removed.
    std::fs::write(dir.join("layout.kv"), b"<Widget>:").unwrap();
    std::fs::write(
        dir.join("quarantine")
            .join(format!("{}.123.kv", &name[..name.len() - 3])),
        b"x",
    )
    .unwrap();
    let coli = env!("CARGO_BIN_EXE_coli");
    let d = dir.to_str().unwrap();
    let (code, out, err) = run(coli, &["kv", "ls", "--kv-dir", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let files = v["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{v}");
    assert_eq!(files[0]["file"], name.as_str());
    assert_eq!(files[0]["status"], "damaged", "{v}");
    assert_eq!(v["quarantined"], 1, "{v}");
    let (code, text, err) = run(coli, &["kv", "ls", "--kv-dir", d]);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("1 quarantined file"), "{text}");
    // Another store's id: nothing removed.
    let (code, _, err) = run(
        coli,
        &["kv", "clear", "--kv-dir", d, "--store-id", &"ef".repeat(16)],
    );
    assert_eq!(code, 0, "{err}");
    assert!(dir.join(&name).exists());
    let (code, out, err) = run(coli, &["kv", "clear", "--kv-dir", d]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("removed 1 KV cache file(s)") && out.contains("and 1 quarantined"),
        "{out}"
    );
    assert!(!dir.join(&name).exists());
    assert!(
        dir.join("layout.kv").exists(),
        "a file coli did not name is left alone"
    );
    assert_eq!(
        std::fs::read_dir(dir.join("quarantine")).unwrap().count(),
        0
    );
}
