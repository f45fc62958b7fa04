//! The real `coli-fsck` binary on a small store: exit codes, --json, damage naming, --mirror.

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
            "coli-fsck-cli-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
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
        num_layers: 1,
        expert_layers: vec![ExpertLayer {
            layer: 0,
            num_experts: 3,
        }],
        expert_encoding: enc,
        alignment: 512,
        segment_max_bytes: 2048,
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
    for e in 0..3u32 {
        let s = e as u8 + 3;
        w.add_expert(
            ExpertKey::new(0, e),
            16,
            8,
            [&mat(8, 16, s), &mat(8, 16, s + 1), &mat(16, 8, s + 2)],
        )
        .unwrap();
    }
    let norm = EncodedMatrix {
        encoding: Encoding::Bf16,
        rows: 1,
        cols: 16,
        data: vec![0x3f; 32],
        scales: vec![],
    };
    w.add_dense("model.norm.weight", &[16], &norm).unwrap();
    w.add_file("tokenizer.json", b"{}").unwrap();
    w.finish().unwrap()
}

fn fsck(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_coli-fsck"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn flip(p: &Path, pos: usize) {
    let mut b = std::fs::read(p).unwrap();
    b[pos] ^= 0x04;
    std::fs::write(p, b).unwrap();
}

#[test]
fn exit_codes_json_and_naming() {
    let t = TempDir::new("main");
    let store = write_store(&t.0);
    let s = store.to_str().unwrap();
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("result: clean"), "{out}");
    let (code, out) = fsck(&[s, "--json", "--quick"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "clean");
    assert_eq!(v["quick"], true);

    // Damage expert (0, 1)'s record.
    let st = Store::open(&store).unwrap();
    let rec = *st.record(ExpertKey::new(0, 1)).unwrap();
    drop(st);
    let seg = store.join(format!("segments/seg-{:05}.bin", rec.segment.get()));
    flip(&seg, rec.offset.get() as usize + 5);
    let (code, out) = fsck(&[s, "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "damaged");
    assert_eq!(v["bad_records"].as_array().unwrap().len(), 1);
    assert_eq!(v["bad_records"][0]["layer"], 0);
    assert_eq!(v["bad_records"][0]["expert"], 1);
    assert_eq!(v["bad_records"][0]["offset"], rec.offset.get());
    assert_eq!(
        v["bad_records"][0]["expected"],
        format!("{:016x}", rec.checksum.get())
    );
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 1);
    assert!(out.contains("BAD RECORD: layer 0 expert 1"), "{out}");
    // --quick does not read records.
    assert_eq!(fsck(&[s, "--quick"]).0, 0);
    flip(&seg, rec.offset.get() as usize + 5);

    // Damage the MANIFEST body: structure named, exit 1.
    flip(&store.join("MANIFEST"), 40);
    let (code, out) = fsck(&[s, "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["problems"][0]["file"], "MANIFEST");
    flip(&store.join("MANIFEST"), 40);

    // Damage a copied file.
    flip(&store.join("files/tokenizer.json"), 0);
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 1);
    assert!(out.contains("BAD FILE: files/tokenizer.json"), "{out}");
    flip(&store.join("files/tokenizer.json"), 0);
    assert_eq!(fsck(&[s]).0, 0);

    // Unusable input.
    let missing = t.0.join("missing");
    let (code, out) = fsck(&[missing.to_str().unwrap(), "--json"]);
    assert_eq!(code, 2, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "unusable");
}

#[test]
fn mirrors() {
    let t = TempDir::new("mirror");
    let store = write_store(&t.0);
    let s = store.to_str().unwrap();
    let nseg = std::fs::read_dir(store.join("segments")).unwrap().count();
    assert!(nseg >= 2);
    let m = t.0.join("mirror");
    std::fs::create_dir_all(m.join("segments")).unwrap();
    std::fs::copy(
        store.join("segments/seg-00000.bin"),
        m.join("segments/seg-00000.bin"),
    )
    .unwrap();
    let ms = m.to_str().unwrap();
    let (code, out) = fsck(&[s, "--mirror", ms, "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mirrors"][0]["files"][0]["status"], "admitted");
    assert_eq!(v["mirrors"][0]["files"][1]["status"], "missing");
    // seg-00001 copied under seg-00000's name: mismatched.
    std::fs::copy(
        store.join("segments/seg-00001.bin"),
        m.join("segments/seg-00000.bin"),
    )
    .unwrap();
    let (code, out) = fsck(&[s, "--mirror", ms]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISMATCHED"), "{out}");
    // A damaged record in the copy.
    std::fs::copy(
        store.join("segments/seg-00000.bin"),
        m.join("segments/seg-00000.bin"),
    )
    .unwrap();
    flip(&m.join("segments/seg-00000.bin"), 600);
    let (code, out) = fsck(&[s, "--mirror", ms]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("DAMAGED"), "{out}");
}
