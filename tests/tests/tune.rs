//! `coli tune` on a converted fixture store: every candidate runs in interleaved rounds and
//! gives the default's tokens (checked inside the tune, an error otherwise), the table starts
//! with the default at ratio 1, the result is saved keyed by store id with this machine; the
//! saved settings then apply to the options a run is not given, and only on this machine.

use clap::Parser;
use coli_tests::convert_fixture;
use coli_tools::tune::{apply_saved, tune_path, Machine, Settings, TuneArgs, TuneResult};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    tune: TuneArgs,
}

fn args(a: &[&str]) -> TuneArgs {
    Cli::try_parse_from(std::iter::once("coli-tune").chain(a.iter().copied()))
        .unwrap_or_else(|e| panic!("{a:?}: {e}"))
        .tune
}

#[test]
fn tune_measures_saves_and_applies() {
    let (tmp, dir) = convert_fixture("olmoe_fp8", "int4_store");
    let state = tmp.path().join("state");
    // One test function: it sets the process's state directory.
    std::env::set_var("COLI_STATE_DIR", &state);
    let prompts = tmp.path().join("prompts.txt");
    std::fs::write(&prompts, "1,2,3,4,5\n7,8,9\n").unwrap();
    let s = dir.to_str().unwrap();
    let a = args(&[
        "--store",
        s,
        "--prompts",
        prompts.to_str().unwrap(),
        "--max-tokens",
        "4",
        "--rounds",
        "1",
        "--json",
    ]);
    let r = coli_tools::tune::tune(&a).expect("tune");
    assert_eq!(r.table[0].config, "default");
    assert_eq!(r.table[0].ratio, 1.0);
    let configs: Vec<&str> = r.table.iter().map(|row| row.config.as_str()).collect();
    for want in ["--queue-depth 2", "--no-prefetch", "--threads 1"] {
        assert!(configs.contains(&want), "{configs:?}");
    }
    assert!(r
        .table
        .iter()
        .all(|row| row.median_s > 0.0 && row.tok_s > 0.0));
    assert_eq!((r.prompts, r.max_tokens, r.rounds), (2, 4, 1));
    assert_eq!(r.machine, Machine::current(&dir));
    coli_tools::tune::run(&a).expect("tune and save");
    let path = tune_path(&r.store_id).unwrap();
    assert!(path.starts_with(&state), "{}", path.display());
    let saved: TuneResult = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved.store_id, r.store_id);

    // Known settings in the saved file: applied where not given, kept where given.
    let mut known = saved.clone();
    known.settings = Settings {
        queue_depth: Some(8),
        prefetch: Some(false),
        threads: Some(1),
        ..Settings::default()
    };
    std::fs::write(&path, serde_json::to_vec(&known).unwrap()).unwrap();
    let mut o = args(&["--store", s, "--threads", "2"]).engine;
    apply_saved(&mut o, &|id| id == "threads");
    assert_eq!(
        (o.queue_depth, o.no_prefetch, o.threads),
        (Some(8), true, Some(2))
    );
    // --no-tune ignores it.
    let mut o = args(&["--store", s, "--no-tune"]).engine;
    apply_saved(&mut o, &|_| false);
    assert_eq!((o.queue_depth, o.no_prefetch), (None, false));
    // Measured on another machine: ignored.
    known.machine.cpu_model.push_str(" (another)");
    std::fs::write(&path, serde_json::to_vec(&known).unwrap()).unwrap();
    let mut o = args(&["--store", s]).engine;
    apply_saved(&mut o, &|_| false);
    assert_eq!((o.queue_depth, o.no_prefetch), (None, false));
}
