//! The routing trace (`coli run --routing-trace`, `coli_engine::trace`) on every family's tiny
//! fixture: it never changes the tokens; it has one line per token and MoE layer of the main
//! model, each with the layer's top-k distinct experts; and the lookahead recall it gives equals
//! the expert cache's own prediction counters of the same run; the engine's expert map (`coli
//! web`'s heat map) counts the same routings.

use coli_engine::trace::RoutingTrace;
use coli_engine::{Engine, EngineOptions, GenerateParams, SamplingParams};
use coli_store::IoPreference;
use coli_tests::{convert_fixture, expected, ids, open_store};

const FAMILIES: [&str; 5] = [
    "mixtral_fp8",
    "qwen3_moe_fp8",
    "olmoe_fp8",
    "deepseek_v3_fp8",
    "glm5_fp8",
];

#[test]
fn routing_trace_matches_the_run_and_changes_nothing() {
    for name in FAMILIES {
        let exp = expected(name);
        let (tmp, dir) = convert_fixture(name, "int4_store");
        let prompt = ids(&exp["prompt_ids"]);
        let want = ids(&exp["greedy_int4_g64"]);
        let store = open_store(&dir, true, IoPreference::Auto);
        let opts = EngineOptions {
            ram_budget: Some(u64::MAX),
            prefill_batch: 1,
            ..Default::default()
        };
        let mut e = Engine::new(&store, &opts).unwrap();
        let path = tmp.path().join("trace.jsonl");
        e.set_routing_trace(Some(RoutingTrace::create(&path).unwrap()));
        let params = GenerateParams {
            max_tokens: want.len(),
            sampling: SamplingParams::default(),
            stop_on_eos: true,
            speculation: coli_engine::SpeculationParams::off(),
        };
        let g = e.generate(&prompt, &params, |_| Ok(true)).unwrap();
        e.set_routing_trace(None).unwrap().finish().unwrap();
        assert_eq!(g.tokens, want, "{name}: tokens with the trace on");

        let spec = e.spec();
        let k = spec.top_k;
        let moe_layers: Vec<u32> = (0..spec.num_layers as u32)
            .filter(|&l| spec.is_moe_layer(l as usize))
            .collect();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Tokens run: the prompt, then every generated token but the last.
        let run = prompt.len() + g.tokens.len() - 1;
        assert_eq!(
            rows.len(),
            run * moe_layers.len(),
            "{name}: one line per token and MoE layer"
        );
        let (mut hits, mut routed) = (0u64, 0u64);
        // The expert map's routing counts (what `coli web` draws) equal the trace's.
        let mut per_expert: std::collections::BTreeMap<(u32, u32), u64> = Default::default();
        for r in &rows {
            for x in ids(&r["experts"]) {
                *per_expert
                    .entry((r["layer"].as_u64().unwrap() as u32, x))
                    .or_insert(0) += 1;
            }
        }
        let map = e.expert_map();
        let mut from_map: std::collections::BTreeMap<(u32, u32), u64> = Default::default();
        for l in &map.layers {
            for (x, &n) in l.routed.iter().enumerate() {
                if n > 0 {
                    from_map.insert((l.layer, x as u32), n);
                }
                // An unbounded cache keeps every expert it read.
                let held = matches!(
                    l.residency[x],
                    Some(coli_engine::Residency::Cached | coli_engine::Residency::Pinned)
                );
                assert!(
                    n == 0 || held,
                    "{name}: routed expert {x} of layer {} not held",
                    l.layer
                );
            }
        }
        assert_eq!(from_map, per_expert, "{name}: expert map vs trace");
        assert_eq!(map.routed_total, (rows.len() * k) as u64, "{name}");
        for r in &rows {
            let experts = ids(&r["experts"]);
            let mut distinct = experts.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), k, "{name}: {r}");
            assert!(moe_layers.contains(&(r["layer"].as_u64().unwrap() as u32)));
            assert!((r["pos"].as_u64().unwrap() as usize) < run);
            let predicted = ids(&r["predicted"]);
            assert_eq!(
                predicted.len(),
                k,
                "{name}: one token per pass predicts its top-k: {r}"
            );
            hits += predicted.iter().filter(|p| experts.contains(p)).count() as u64;
            routed += k as u64;
        }
        let s = e.cache_stats();
        assert_eq!(
            (hits, routed),
            (s.predicted_used, s.demanded_after_prediction),
            "{name}: trace vs cache prediction counters"
        );
    }
}
