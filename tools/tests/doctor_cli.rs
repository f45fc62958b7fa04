//! The real `coli doctor` binary: a line per check with PASS/WARN/FAIL and fixes, `--json`,
//! exit 1 when a check fails (here: a store whose config.json no model loads from, so the
//! memory plan cannot be made), 2 when there is no store to check.

mod common;
use common::{run, write_small_store, TempDir};

fn doctor(args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["doctor"];
    a.extend_from_slice(args);
    run(env!("CARGO_BIN_EXE_coli"), &a)
}

#[test]
fn exit_codes_text_and_json() {
    let t = TempDir::new("doctor-cli");
    let store = write_small_store(t.path());
    let s = store.to_str().unwrap();
    let (code, out, err) = doctor(&["--store", s, "--probe-mib", "1"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with(&format!("coli doctor: {s} (store ")),
        "{out}"
    );
    assert!(
        out.contains("\nFAIL  memory     the memory plan failed"),
        "{out}"
    );
    assert!(out.contains("\nPASS  fsck "), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("fix: ")),
        "{out}"
    );
    assert!(
        out.contains("failed\n") && out.contains("result: "),
        "{out}"
    );
    let (code, out, _) = doctor(&["--store", s, "--probe-mib", "0", "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["store_id"].as_str().unwrap().len(), 32);
    let checks = v["checks"].as_array().unwrap();
    assert!(checks
        .iter()
        .any(|c| c["name"] == "memory" && c["level"] == "FAIL" && c["fix"].is_string()));
    // A damaged INDEX: the quick fsck fails, and its fix does not send the user to --repair
    // (which rewrites expert records, none of which is named).
    let idx = store.join("INDEX");
    let mut b = std::fs::read(&idx).unwrap();
    b[10] ^= 0x01;
    std::fs::write(&idx, &b).unwrap();
    let (code, out, err) = doctor(&["--store", s, "--probe-mib", "0"]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(out.contains("\nFAIL  fsck "), "{out}{err}");
    assert!(
        out.contains("convert again") && !out.contains("rewrites bad records"),
        "{out}"
    );
    b[10] ^= 0x01;
    std::fs::write(&idx, &b).unwrap();
    // No store: the doctor cannot run.
    let missing = t.path().join("nothing-here");
    let (code, out, err) = doctor(&["--store", missing.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("cannot check") && err.contains("nothing-here"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
}

/// The numerics check names what a run would compute under: q8a by default, `--numerics` or
/// `COLI_NUMERICS` otherwise, and fails on a `COLI_NUMERICS` that `coli run` refuses.
#[test]
fn the_numerics_check_names_the_runs_numerics() {
    let t = TempDir::new("doctor-numerics");
    let store = write_small_store(t.path());
    let s = store.to_str().unwrap();
    let numerics = |args: &[&str], env: Option<&str>| -> serde_json::Value {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_coli"));
        c.args(["doctor", "--store", s, "--probe-mib", "0", "--json"])
            .args(args);
        match env {
            Some(v) => c.env("COLI_NUMERICS", v),
            None => c.env_remove("COLI_NUMERICS"),
        };
        let o = c.output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "numerics")
            .expect("a numerics check")
            .clone()
    };
    let c = numerics(&[], None);
    assert!(
        c["level"] == "PASS"
            && c["detail"]
                .as_str()
                .unwrap()
                .starts_with("q8a (the default; id "),
        "{c}"
    );
    let c = numerics(&["--numerics", "exact"], Some("q8a"));
    assert!(
        c["level"] == "PASS"
            && c["detail"]
                .as_str()
                .unwrap()
                .starts_with("exact (--numerics; id "),
        "{c}"
    );
    let c = numerics(&[], Some("exact"));
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .starts_with("exact (COLI_NUMERICS; id "),
        "{c}"
    );
    let c = numerics(&[], Some("fast"));
    assert!(
        c["level"] == "FAIL"
            && c["detail"].as_str().unwrap().contains("COLI_NUMERICS")
            && c["fix"].is_string(),
        "{c}"
    );
}
