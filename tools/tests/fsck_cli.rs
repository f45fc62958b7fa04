//! The real `coli-fsck` binary on a small store: exit codes, --json, damage naming, --mirror.

mod common;
use coli_store::{ExpertKey, Store};
use common::{run, write_tiny_store, TempDir, TinyStore};
use std::path::{Path, PathBuf};

fn write_store(dir: &Path) -> PathBuf {
    write_tiny_store(
        dir,
        &TinyStore {
            layers: 1,
            experts: 3,
            segment_max_bytes: 2048,
            norm_and_tokenizer: true,
        },
    )
}

fn fsck(args: &[&str]) -> (i32, String) {
    let (code, out, _) = run(env!("CARGO_BIN_EXE_coli-fsck"), args);
    (code, out)
}

fn flip(p: &Path, pos: usize) {
    let mut b = std::fs::read(p).unwrap();
    b[pos] ^= 0x04;
    std::fs::write(p, b).unwrap();
}

#[test]
fn exit_codes_json_and_naming() {
    let t = TempDir::new("fsck-cli-main");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("result: clean"), "{out}");
    // `--store DIR` as run/chat/plan/serve take it, the same as the positional argument; both
    // at once, or neither, is a usage error (exit 2).
    let (code, out2) = fsck(&["--store", s]);
    assert_eq!(code, 0, "{out2}");
    assert!(out2.contains("result: clean"), "{out2}");
    assert_eq!(fsck(&[s, "--store", s]).0, 2);
    assert_eq!(fsck(&[]).0, 2);
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
    assert!(out.contains("run with --repair"), "{out}");
    // --repair with no good copy (no mirror): not repaired, and the verdict says what is
    // missing instead of suggesting --repair again.
    let (code, out) = fsck(&[s, "--repair"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no verified copy") && !out.contains("run with --repair"),
        "{out}"
    );
    // --quick does not read records.
    assert_eq!(fsck(&[s, "--quick"]).0, 0);
    flip(&seg, rec.offset.get() as usize + 5);

    // Damage the MANIFEST body: structure named, exit 1.
    flip(&store.join("MANIFEST"), 40);
    let (code, out) = fsck(&[s, "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["problems"][0]["file"], "MANIFEST");
    // --repair rewrites records only: the verdict does not send the user there.
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("re-convert the store") && !out.contains("run with --repair"),
        "{out}"
    );
    flip(&store.join("MANIFEST"), 40);

    // Damage a copied file.
    flip(&store.join("files/tokenizer.json"), 0);
    let (code, out) = fsck(&[s]);
    assert_eq!(code, 1);
    assert!(out.contains("BAD FILE: files/tokenizer.json"), "{out}");
    flip(&store.join("files/tokenizer.json"), 0);
    assert_eq!(fsck(&[s]).0, 0);

    // Unusable input.
    let missing = t.path().join("missing");
    let (code, out) = fsck(&[missing.to_str().unwrap(), "--json"]);
    assert_eq!(code, 2, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "unusable");
}

#[test]
fn mirrors() {
    let t = TempDir::new("fsck-cli-mirror");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let nseg = std::fs::read_dir(store.join("segments")).unwrap().count();
    assert!(nseg >= 2);
    let m = t.path().join("mirror");
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

#[test]
fn nonexistent_mirror_is_a_usage_error() {
    let t = TempDir::new("fsck-cli-nomirror");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let missing = t.path().join("no-such-mirror");
    let (code, out) = fsck(&[s, "--mirror", missing.to_str().unwrap(), "--json"]);
    assert_eq!(code, 2, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "unusable");
    assert!(v["problems"][0]["what"]
        .as_str()
        .unwrap()
        .contains("does not exist"));
    // A file given as a mirror: also exit 2.
    let f = t.path().join("file");
    std::fs::write(&f, b"x").unwrap();
    assert_eq!(fsck(&[s, "--mirror", f.to_str().unwrap()]).0, 2);
}

#[test]
fn repair_rewrites_damaged_copies_from_a_good_one() {
    let t = TempDir::new("fsck-cli-repair");
    let store = write_store(t.path());
    let s = store.to_str().unwrap();
    let m = t.path().join("mirror");
    std::fs::create_dir_all(m.join("segments")).unwrap();
    let names: Vec<String> = std::fs::read_dir(store.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for n in &names {
        std::fs::copy(store.join("segments").join(n), m.join("segments").join(n)).unwrap();
    }
    let ms = m.to_str().unwrap();
    let st = Store::open(&store).unwrap();
    let r1 = *st.record(ExpertKey::new(0, 1)).unwrap();
    let r2 = *st.record(ExpertKey::new(0, 2)).unwrap();
    drop(st);
    let seg1 = format!("segments/seg-{:05}.bin", r1.segment.get());
    let seg2 = format!("segments/seg-{:05}.bin", r2.segment.get());
    // One record damaged in the mirror, another in the primary.
    flip(&m.join(&seg1), r1.offset.get() as usize + 9);
    flip(&store.join(&seg2), r2.offset.get() as usize + 9);
    let (code, out) = fsck(&[s, "--mirror", ms]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = fsck(&[s, "--mirror", ms, "--repair"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.matches("REPAIRED:").count(), 2, "{out}");
    assert!(out.contains("result: clean"), "{out}");
    for n in &names {
        assert_eq!(
            std::fs::read(store.join("segments").join(n)).unwrap(),
            std::fs::read(m.join("segments").join(n)).unwrap(),
            "{n} differs after repair"
        );
    }
    // A truncated copy is not rewritten: damage remains, exit 1, the file is untouched.
    let p = m.join(&seg1);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 512).unwrap();
    drop(f);
    let before = std::fs::read(&p).unwrap();
    let (code, out) = fsck(&[s, "--mirror", ms, "--repair", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "damaged");
    assert_eq!(std::fs::read(&p).unwrap(), before);
}
