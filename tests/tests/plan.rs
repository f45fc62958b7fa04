//! `coli plan` against the engine it plans for, on a converted fixture store: the budget,
//! context and KV bytes are the engine's, and the pinned set it reports from a usage history is
//! the one the engine then pins (same experts' count and bytes) for every pin share; without a
//! history it assumes uniform routing; its disk probe reads through the store as a run opens it.

use clap::Parser;
use coli_engine::{Engine, EngineOptions};
use coli_store::IoPreference;
use coli_tests::{convert_fixture, expected, greedy, ids, open_store};
use coli_tools::plan::{plan, PlanArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plan: PlanArgs,
}

fn plan_of(args: &[&str]) -> coli_tools::plan::Plan {
    let cli = Cli::try_parse_from(std::iter::once("coli-plan").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    plan(&cli.plan).unwrap_or_else(|e| panic!("{args:?}: {e:#}"))
}

#[test]
fn plan_reports_the_budget_and_pinned_set_the_engine_uses() {
    let name = "olmoe_fp8";
    let exp = expected(name);
    let (tmp, dir) = convert_fixture(name, "int4_store");
    let usage = tmp.path().join("usage.json");
    let (store_s, usage_s) = (dir.to_str().unwrap(), usage.to_str().unwrap());
    let store = open_store(&dir, true, IoPreference::Auto);
    let all: u64 = store.index().iter().map(|r| r.length.get()).sum();
    let budget = all / 2;
    let budget_s = budget.to_string();
    let base = [
        "--store",
        store_s,
        "--usage",
        usage_s,
        "--ram-budget",
        &budget_s,
    ];
    let plan_with = |extra: &[&str]| plan_of(&[&base[..], extra].concat());

    // No history yet: uniform routing, nothing pinned.
    let p = plan_with(&["--probe-mib", "1"]);
    assert_eq!(p.routing_model, "uniform routing");
    assert_eq!((p.pinned_experts, p.pinned_bytes), (0, 0));
    assert_eq!(p.budget, budget);
    assert_eq!(p.experts, store.index().len());
    assert_eq!(p.expert_bytes_total, all);
    assert!(p.probe_bytes > 0 && p.probe_s > 0.0, "{p:?}");

    // Learn a history with a real run, then plan and run with the same options.
    {
        let opts = EngineOptions {
            ram_budget: Some(budget),
            pin: false,
            usage: Some(usage.clone()),
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        greedy(&mut e, &ids(&exp["prompt_ids"]), 16);
    }
    for share in ["0.1", "0.5", "1"] {
        let p = plan_with(&["--pin-share", share, "--probe-mib", "0"]);
        assert_eq!(p.routing_model, "usage history", "{p:?}");
        assert!(p.usage_tokens > 0.0);
        let opts = EngineOptions {
            ram_budget: Some(budget),
            pin_share: share.parse().unwrap(),
            prefetch: false,
            usage: Some(usage.clone()),
            ..Default::default()
        };
        let e = Engine::new(&store, &opts).unwrap();
        let placed = e.placement();
        assert_eq!(p.budget, placed.budget);
        assert_eq!(p.context, e.context());
        assert_eq!(p.kv_bytes, e.kv_bytes_per_token() * e.context() as u64);
        assert_eq!(
            (p.pinned_experts, p.pinned_bytes),
            (placed.pinned_experts, placed.pinned_bytes),
            "pin share {share}"
        );
        assert_eq!(
            p.cache_capacity_bytes, placed.lru_capacity,
            "pin share {share}"
        );
        let share_bytes = (budget as f64 * share.parse::<f64>().unwrap()) as u64;
        assert!(p.pinned_bytes <= share_bytes, "pin share {share}: {p:?}");
        // 0.1 of this budget is less than one expert record; the larger shares pin some.
        assert_eq!(
            p.pinned_experts > 0,
            share != "0.1",
            "pin share {share}: {p:?}"
        );
        assert_eq!(p.probe_bytes, 0);
    }
    // --no-pin: nothing pinned, the whole budget is LRU.
    let p = plan_with(&["--no-pin", "--probe-mib", "0"]);
    assert_eq!((p.pinned_experts, p.cache_capacity_bytes), (0, budget));
}
