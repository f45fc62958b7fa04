//! The coli tools' numerics: q8a unless `--numerics` or `COLI_NUMERICS` says otherwise
//! (`options::numerics`), each checked against transformers on the qwen3_moe_bf16 fixture's
//! default store (int4-g64 experts, bf16 dense, so the q8a rule moves both the integer and the
//! bf16 products): `expected_q8a_bf16_dense.json` (tests/fixtures/make_q8a_expected.py, the
//! rule's activation step emulated by hooks) holds the q8a last logits and greedy tokens and the
//! exact numerics' last logits of the same store.

mod common;

use common::{convert_fixture, max_abs_diff, TempDir};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// `coli run` on `store` with `args` and `COLI_NUMERICS` set to `env` (unset when `None`):
/// exit code, stdout, stderr.
fn coli(store: &Path, args: &[&str], env: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_coli"));
    c.arg("run").arg("--store").arg(store).args(args);
    match env {
        Some(v) => c.env("COLI_NUMERICS", v),
        None => c.env_remove("COLI_NUMERICS"),
    };
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_tools_run_q8a_unless_told_exact() {
    let tmp = TempDir::new("numerics-cli");
    let store = tmp.path().join("store");
    convert_fixture("qwen3_moe_bf16", &store);
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny/qwen3_moe_bf16/expected_q8a_bf16_dense.json");
    let exp: Value = serde_json::from_slice(&std::fs::read(&fixture).unwrap()).unwrap();
    assert_eq!(exp["numerics"], "q8a");
    let prompt = exp["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let q8a = floats(&exp["last_logits"]);
    let exact = floats(&exp["exact_last_logits"]);
    let moved = max_abs_diff(&q8a, &exact);
    assert!(moved > 1e-3, "the two expectations differ by only {moved}");

    // (flag, COLI_NUMERICS, the numerics that must run)
    let cases: [(Option<&str>, Option<&str>, &str); 5] = [
        (None, None, "q8a"),
        (Some("exact"), None, "exact"),
        (None, Some("exact"), "exact"),
        (None, Some(""), "q8a"),
        (Some("exact"), Some("q8a"), "exact"),
    ];
    for (flag, env, want) in cases {
        let logits = tmp.path().join("logits.json");
        let mut args = vec![
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            "32",
            "--json",
            "--logits-out",
            logits.to_str().unwrap(),
        ];
        if let Some(f) = flag {
            args.extend(["--numerics", f]);
        }
        let (code, out, err) = coli(&store, &args, env);
        assert_eq!(code, 0, "--numerics {flag:?}, COLI_NUMERICS {env:?}: {err}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        let case = format!("--numerics {flag:?}, COLI_NUMERICS {env:?}");
        assert_eq!(v["stats"]["numerics"]["mode"], want, "{case}");
        let last: Vec<f32> = serde_json::from_slice(&std::fs::read(&logits).unwrap()).unwrap();
        let (to_want, to_other) = if want == "q8a" {
            (max_abs_diff(&last, &q8a), max_abs_diff(&last, &exact))
        } else {
            (max_abs_diff(&last, &exact), max_abs_diff(&last, &q8a))
        };
        assert!(
            to_want < 1e-3 && to_other > 1e-3,
            "{case}: last logits {to_want} from transformers' {want}, {to_other} from the other"
        );
        if want == "q8a" {
            // Greedy tokens as transformers gives them under the rule, through EOS.
            let greedy: Vec<u64> = exp["greedy"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect();
            let got: Vec<u64> = v["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect();
            assert!(
                !got.is_empty() && greedy.starts_with(&got),
                "{case}: tokens {got:?} against transformers' {greedy:?}"
            );
        }
    }

    // A COLI_NUMERICS that names no numerics: refused, naming the variable.
    let (code, _, err) = coli(&store, &["--prompt-ids", &prompt], Some("fast"));
    assert_ne!(code, 0, "COLI_NUMERICS=fast ran: {err}");
    assert!(
        err.contains("COLI_NUMERICS") && err.contains("exact") && err.contains("q8a"),
        "{err}"
    );
}
