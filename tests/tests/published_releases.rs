//! Layout replicas of the releases coli claims (issue 41): for each, a checkpoint with exactly
//! the release's tensor names and dtypes (tests/fixtures/published/<release>.tensors.txt, read
//! from the release's index or a public loader that lists it; `coli_tests::published`) and its
//! config.json at tiny widths must convert with the default options, load, generate 8 tokens,
//! and be read by `coli plan --checkpoint`. Every listed tensor the converter leaves out must
//! be one the listing declares as not read (`# not-read:`), so that a tensor a release ships
//! and coli silently ignores fails here.

use coli_convert::{Encodings, Options};
use coli_engine::{Engine, EngineOptions, GenerateParams};
use coli_store::{Encoding, IoPreference};
use coli_tests::open_store;
use coli_tests::published::write_replica;

/// Converts, runs and plans the replica of `release`; returns the store's MANIFEST.
fn replica_runs(release: &str) -> coli_store::Manifest {
    let tmp = tempfile::tempdir().unwrap();
    let r = write_replica(release, &tmp.path().join("ckpt"), 4);
    let not_read = |n: &str| r.listing.not_read.iter().any(|p| n.starts_with(p.as_str()));
    let unknown: Vec<&String> = r.unknown.iter().filter(|n| !not_read(n)).collect();
    assert!(
        unknown.is_empty(),
        "{release}: listed tensors the model spec does not know: {unknown:?}"
    );
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.dir.join("config.json")).unwrap()).unwrap();
    let experts = if coli_format::spec::gpt_oss::declares_mxfp4(&cfg) {
        Encoding::Mxfp4
    } else {
        Encoding::Int4 { group_size: 64 }
    };
    let out = tmp.path().join("store");
    let report = coli_convert::run(&Options {
        input: r.dir.clone(),
        output: out.clone(),
        encodings: Encodings::new(experts, Encoding::Bf16, Encoding::Int8),
        threads: None,
        progress: false,
    })
    .unwrap_or_else(|e| panic!("{release}: conversion refused: {e}"));
    let silently_dropped: Vec<&String> = report
        .not_converted
        .iter()
        .filter(|n| !not_read(n))
        .collect();
    assert!(
        silently_dropped.is_empty(),
        "{release}: the converter left out listed tensors: {silently_dropped:?}"
    );
    let store = open_store(&out, true, IoPreference::Auto);
    let mut e = Engine::new(&store, &EngineOptions::default())
        .unwrap_or_else(|e| panic!("{release}: the store does not load: {e}"));
    let params = GenerateParams {
        max_tokens: 8,
        sampling: Default::default(),
        stop_on_eos: false,
        speculation: Default::default(),
    };
    let g = e
        .generate(&[1, 2, 3, 4], &params, |_| Ok(true))
        .unwrap_or_else(|e| panic!("{release}: generation failed: {e}"));
    assert_eq!(g.tokens.len(), 8, "{release}");
    let plan =
        coli_convert::memory_plan::plan_from_config(&coli_convert::memory_plan::ConfigPlanArgs {
            checkpoint: Some(&r.dir),
            config: None,
            total_ram: 25 << 30,
            context: Some(4096),
            disk_gib_s: Some(3.0),
            experts: None,
            mtp: Some(Encoding::Int8),
            chosen: None,
        })
        .unwrap_or_else(|e| panic!("{release}: coli plan --checkpoint: {e:#}"));
    assert_eq!(
        plan.experts + plan.mtp_experts,
        store.index().len() as u64,
        "{release}: the plan's expert records"
    );
    store.manifest().clone()
}
