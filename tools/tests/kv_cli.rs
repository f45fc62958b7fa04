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

/// A KV cache file as docs/KV_CACHE.md lays it out (layout version 4): header with `tokens`
/// token ids and checksum, then `body` (not parsed by `ls`).
fn kv_file(tokens: &[u32], body: &[u8]) -> Vec<u8> {
    use xxhash_rust::xxh3::xxh3_64;
    let n = tokens.len();
    let mut b = Vec::new();
    b.extend_from_slice(b"COLIKV\0\0");
    b.extend_from_slice(&coli_engine::prefix_cache::file::KV_LAYOUT_VERSION.to_le_bytes());
    b.extend_from_slice(&((96 + 4 * n) as u32).to_le_bytes());
    b.extend_from_slice(&[0xab; 16]);
    b.extend_from_slice(&7u64.to_le_bytes()); // parameter hash
    b.extend_from_slice(&0u64.to_le_bytes()); // scope: shared
    b.extend_from_slice(&(n as u64).to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes()); // layers
    b.extend_from_slice(&0u32.to_le_bytes()); // flags
    b.extend_from_slice(&(body.len() as u64).to_le_bytes());
    b.extend_from_slice(&xxh3_64(body).to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // created
    for t in tokens {
        b.extend_from_slice(&t.to_le_bytes());
    }
    let h = xxh3_64(&b);
    b.extend_from_slice(&h.to_le_bytes());
    b.extend_from_slice(body);
    b
}

/// `ls` checks a file's length against its header's body length: a file cut short is listed
/// as truncated, one with bytes after its body as damaged, a whole one as ok; the table keeps
/// its columns for every row.
#[test]
fn kv_ls_reports_truncated_files() {
    let t = TempDir::new("kv-cli-trunc");
    let dir = t.path().join("kv");
    std::fs::create_dir_all(&dir).unwrap();
    let name = |i: u8| {
        format!(
            "{}-{}-{}-{:016x}.kv",
            "ab".repeat(16),
            "00".repeat(8),
            "0".repeat(16),
            i
        )
    };
    let whole = kv_file(&[1, 2, 3], &[9u8; 64]);
    std::fs::write(dir.join(name(1)), &whole).unwrap();
    std::fs::write(dir.join(name(2)), &whole[..whole.len() - 10]).unwrap();
    let mut long = whole.clone();
    long.extend_from_slice(b"extra");
    std::fs::write(dir.join(name(3)), &long).unwrap();
    let coli = env!("CARGO_BIN_EXE_coli");
    let d = dir.to_str().unwrap();
    let (code, out, err) = run(coli, &["kv", "ls", "--kv-dir", d, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let status: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["status"].as_str().unwrap())
        .collect();
    assert_eq!(status, ["ok", "truncated", "damaged"], "{v}");
    assert_eq!(v["files"][0]["tokens"], 3, "{v}");
    let (code, text, err) = run(coli, &["kv", "ls", "--kv-dir", d]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = text.lines().skip(2).collect();
    assert_eq!(rows.len(), 3, "{text}");
    // Every row starts with the store id in a 32-wide column.
    for r in &rows {
        assert!(r.starts_with(&"ab".repeat(16)), "{text}");
        assert_eq!(&r[32..34], "  ", "{text}");
    }
    assert!(rows[1].contains("truncated"), "{text}");
}
