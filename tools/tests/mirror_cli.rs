//! The real `coli mirror` and `coli-fsck --mirror` binaries on a small store: copy, plan and
//! stage (explicit, by layers, by a usage history, within a budget), verify, damage, repair.

mod common;
use coli_store::*;
use common::{run, write_tiny_store, TempDir, TinyStore};
use std::path::{Path, PathBuf};

fn write_store(dir: &Path) -> PathBuf {
    write_tiny_store(
        dir,
        &TinyStore {
            layers: 2,
            experts: 4,
            segment_max_bytes: 4096,
            norm_and_tokenizer: false,
        },
    )
}

fn coli(args: &[&str]) -> (i32, String, String) {
    run(env!("CARGO_BIN_EXE_coli"), args)
}

fn fsck(args: &[&str]) -> (i32, String, String) {
    run(env!("CARGO_BIN_EXE_coli-fsck"), args)
}

#[test]
fn copy_stage_verify_damage_and_repair() {
    let t = TempDir::new("mirror-cli-copy");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let m = t.path().join("m1");
    let ms = m.to_str().unwrap();
    // The mirror directory must exist.
    let (code, _, err) = coli(&["mirror", "copy", "--store", s, "--mirror", ms]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    std::fs::create_dir(&m).unwrap();
    // Explicit records, then a layer, into two staged segments.
    let (code, out, err) = coli(&[
        "mirror",
        "stage",
        "--store",
        s,
        "--mirror",
        ms,
        "--experts",
        "0:1,1:3",
        "--reserve",
        "0",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records"], 2);
    assert!(m.join("staged/stg-00000.bin").is_file());
    let (code, out, err) = coli(&[
        "mirror",
        "stage",
        "--store",
        s,
        "--mirror",
        ms,
        "--layers",
        "1",
        "--reserve",
        "0",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records"], 3, "1:3 is already on the mirror: {v}");
    assert_eq!(v["already_held"], 1);
    // Verify: clean, staged files admitted.
    let (code, out, _) = coli(&["mirror", "verify", "--store", s, "--mirror", ms]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches("(staged, ").count(), 2, "{out}");
    // Damage a staged record: verify and fsck say so; --repair fixes it from the primary.
    let st = Store::open(&store).unwrap();
    drop(st);
    let p = m.join("staged/stg-00001.bin");
    let mut b = std::fs::read(&p).unwrap();
    let n = b.len();
    b[n - 700] ^= 0x20;
    std::fs::write(&p, &b).unwrap();
    let (code, out, _) = coli(&["mirror", "verify", "--store", s, "--mirror", ms]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DAMAGED"), "{out}");
    // A check that cannot run is not a verdict: exit 2 (as coli-fsck), naming the directory.
    let missing = t.path().join("no-such-mirror");
    let ms2 = missing.to_str().unwrap();
    let (code, _, err) = coli(&["mirror", "verify", "--store", s, "--mirror", ms2]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no-such-mirror") && err.contains("does not exist"),
        "{err}"
    );
    let (code, _, err) = coli(&["mirror", "verify", "--store", ms2, "--mirror", ms]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no-such-mirror"), "{err}");
    let (code, out, _) = fsck(&[s, "--mirror", ms, "--repair"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("REPAIRED: layer 1"), "{out}");
    // Full copies next to the staged files; a second copy keeps them.
    let (code, out, err) = coli(&[
        "mirror",
        "copy",
        "--store",
        s,
        "--mirror",
        ms,
        "--reserve",
        "0",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("copied segments/seg-00000.bin"), "{out}");
    let (code, out, _) = coli(&[
        "mirror",
        "copy",
        "--store",
        s,
        "--mirror",
        ms,
        "--reserve",
        "0",
    ]);
    assert_eq!(code, 0);
    assert!(!out.contains("copied"), "{out}");
    let (code, out, _) = fsck(&[s, "--mirror", ms]);
    assert_eq!(code, 0, "{out}");
    // A truncated copy blocks a re-copy and stays damaged.
    let seg = m.join("segments/seg-00000.bin");
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    let (code, out, _) = coli(&[
        "mirror",
        "copy",
        "--store",
        s,
        "--mirror",
        ms,
        "--reserve",
        "0",
    ]);
    assert_eq!(code, 1);
    assert!(out.contains("BLOCKED segments/seg-00000.bin"), "{out}");
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), 1000);
    assert_eq!(fsck(&[s, "--mirror", ms]).0, 1);
    // A primary whose structure is damaged (fsck stops before the mirrors): a message naming
    // the damage and coli-fsck, no panic.
    let idx = store.join("INDEX");
    let mut b = std::fs::read(&idx).unwrap();
    b[10] ^= 0x01;
    std::fs::write(&idx, &b).unwrap();
    let (code, _, err) = coli(&["mirror", "verify", "--store", s, "--mirror", ms]);
    assert!(code == 1 || code == 2, "{code}: {err}");
    assert!(
        err.contains("INDEX") && err.contains("coli-fsck") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn plan_ranks_by_usage_within_the_budget() {
    let t = TempDir::new("mirror-cli-plan");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let m = t.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let ms = m.to_str().unwrap();
    let st = Store::open(&store).unwrap();
    let id = st.manifest().store_id;
    let rec_len = st.index()[0].length.get();
    drop(st);
    let usage = t.path().join("usage.json");
    let u = serde_json::json!({"version": 1, "store_id": id, "half_life_tokens": 8192.0,
        "tokens": 100.0, "layers": [
            {"layer": 0, "counts": [1.0, 50.0, 0.0, 7.0]},
            {"layer": 1, "counts": [30.0, 0.0, 2.0, 0.0]}]});
    std::fs::write(&usage, serde_json::to_vec(&u).unwrap()).unwrap();
    let us = usage.to_str().unwrap();
    // Budget for exactly 3 records: header + index (512 + 512) + 3 records.
    let budget = (1024 + 3 * rec_len).to_string();
    let (code, out, err) = coli(&[
        "mirror", "plan", "--store", s, "--mirror", ms, "--usage", us, "--budget", &budget,
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranked_by"], "usage");
    assert_eq!(
        v["experts"],
        serde_json::json!([[0, 1], [1, 0], [0, 3]]),
        "hottest first: {v}"
    );
    assert_eq!(v["bytes"], 1024 + 3 * rec_len);
    assert!(
        m.read_dir().unwrap().next().is_none(),
        "plan writes nothing"
    );
    // Stage it; a second stage with the same budget takes the next hottest.
    let (code, out, err) = coli(&[
        "mirror",
        "stage",
        "--store",
        s,
        "--mirror",
        ms,
        "--usage",
        us,
        "--budget",
        &budget,
        "--reserve",
        "0",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = coli(&[
        "mirror", "plan", "--store", s, "--mirror", ms, "--usage", us, "--top", "5", "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["experts"], serde_json::json!([[1, 2], [0, 0]]), "{v}");
    // A usage history of another store is refused; no selection at all too.
    let mut bad = u.clone();
    bad["store_id"] = serde_json::Value::from("0".repeat(32));
    std::fs::write(&usage, serde_json::to_vec(&bad).unwrap()).unwrap();
    let (code, _, err) = coli(&[
        "mirror", "plan", "--store", s, "--mirror", ms, "--usage", us, "--top", "2",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("usage history"), "{err}");
    let (code, _, err) = coli(&["mirror", "plan", "--store", s, "--mirror", ms]);
    assert_eq!(code, 1);
    assert!(err.contains("--budget"), "{err}");
}
