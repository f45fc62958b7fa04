//! The real `coli` binary reads the settings `coli tune` saved: it says on stderr which it uses
//! (only those not given on its command line), and `--no-tune` ignores them.

mod common;
use coli_tools::tune::{tune_path, Machine, Settings, TuneResult};
use common::{write_small_store, TempDir};
use std::process::Command;

fn coli(state: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env("COLI_STATE_DIR", state)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn run_says_which_tuned_settings_it_uses() {
    let t = TempDir::new("tune-cli");
    let store = write_small_store(t.path());
    let state = t.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let id = coli_store::Store::open(&store)
        .unwrap()
        .manifest()
        .store_id
        .to_string();
    let saved = TuneResult {
        store_id: id.clone(),
        machine: Machine::current(&store),
        settings: Settings {
            queue_depth: Some(8),
            prefetch: Some(false),
            ..Settings::default()
        },
        ratio: 0.9,
        table: Vec::new(),
        prompts: 1,
        max_tokens: 1,
        rounds: 1,
        measured_at: 0,
    };
    std::env::set_var("COLI_STATE_DIR", &state);
    let path = tune_path(&id).unwrap();
    std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
    let s = store.to_str().unwrap();
    let base = [
        "run",
        "--store",
        s,
        "--prompt-ids",
        "1",
        "--max-tokens",
        "1",
    ];
    // (The tiny store holds no loadable model: the run fails after choosing its options.)
    let err = coli(&state, &base);
    assert!(
        err.contains("tuned settings from") && err.contains("--queue-depth 8 --no-prefetch"),
        "{err}"
    );
    let mut given = base.to_vec();
    given.extend(["--queue-depth", "2"]);
    let err = coli(&state, &given);
    assert!(err.contains("tuned settings from"), "{err}");
    assert!(
        !err.contains("--queue-depth 8"),
        "a given option wins: {err}"
    );
    let mut off = base.to_vec();
    off.push("--no-tune");
    let err = coli(&state, &off);
    assert!(!err.contains("tuned settings"), "{err}");
}

/// `coli tune` measures under the numerics run uses: a `COLI_NUMERICS` that `coli run` refuses
/// is refused before anything is measured or saved.
#[test]
fn tune_refuses_an_unknown_coli_numerics() {
    let t = TempDir::new("tune-numerics");
    let store = write_small_store(t.path());
    let state = t.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(["tune", "--store", store.to_str().unwrap()])
        .env("COLI_STATE_DIR", &state)
        .env("COLI_NUMERICS", "fast")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("COLI_NUMERICS") && err.contains("\"fast\""),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&state).unwrap().count(),
        0,
        "nothing saved"
    );
}
