//! `coli run`'s statistics name the prefill chunk it ran with (`--prefill-batch`, else the
//! memory plan's), the same figure `--json` reports as `stats.prefill_batch`.

mod common;

use common::{convert_fixture, run, TempDir};

#[test]
fn run_statistics_name_the_prefill_chunk() {
    let tmp = TempDir::new("run-stats");
    let store = tmp.path().join("store");
    convert_fixture("qwen3_moe_bf16", &store);
    let coli = env!("CARGO_BIN_EXE_coli");
    let s = store.to_str().unwrap();
    let base = [
        "run",
        "--store",
        s,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
    ];
    let with = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let (code, out, err) = run(coli, &args);
        assert_eq!(code, 0, "coli run {extra:?}: {out}{err}");
        (out, err)
    };
    let (_, err) = with(&["--prefill-batch", "64"]);
    assert!(err.contains("up to 64 per pass"), "{err}");
    // Without the option: the plan's chunk, as --json says it.
    let (out, _) = with(&["--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let chunk = v["stats"]["prefill_batch"].as_u64().unwrap();
    let (_, err) = with(&[]);
    assert!(err.contains(&format!("up to {chunk} per pass")), "{err}");
}
