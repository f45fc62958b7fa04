//! The real `coli mirror` and `coli-fsck --mirror` binaries on a small store: copy, plan and
//! stage (explicit, by layers, by a usage history, within a budget), verify, damage, repair.

use coli_store::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "coli-mirror-cli-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_store(dir: &Path) -> PathBuf {
    let target = dir.join("s.coli");
    let enc = Encoding::Int8;
    let spec = StoreSpec {
        family: "mixtral".into(),
        config_json: br#"{"model_type":"mixtral","hidden_size":16}"#.to_vec(),
        num_layers: 2,
        expert_layers: (0..2)
            .map(|layer| ExpertLayer {
                layer,
                num_experts: 4,
            })
            .collect(),
        expert_encoding: enc,
        alignment: 512,
        segment_max_bytes: 4096,
        converter_version: "test".into(),
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
    };
    let WriterStart::Fresh(mut w) = StoreWriter::create_or_resume(&target, spec).unwrap() else {
        panic!("fresh target expected")
    };
    for l in 0..2u32 {
        for e in 0..4u32 {
            let s = (l * 4 + e) as u8 + 3;
            w.add_expert(
                ExpertKey::new(l, e),
                16,
                8,
                [&mat(8, 16, s), &mat(8, 16, s + 1), &mat(16, 8, s + 2)],
            )
            .unwrap();
        }
    }
    w.finish().unwrap()
}

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
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
    let t = TempDir::new("copy");
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
}

#[test]
fn plan_ranks_by_usage_within_the_budget() {
    let t = TempDir::new("plan");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let m = t.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let ms = m.to_str().unwrap();
    let st = Store::open(&store).unwrap();
    let id = st.manifest().store_id.clone();
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
