//! `coli plan` against the engine it plans for, on a converted fixture store: the budget,
//! context and KV bytes are the engine's, and the pinned set it reports from a usage history is
//! the one the engine then pins (same experts' count and bytes) for every pin share; without a
//! history it assumes uniform routing; its disk probe reads through the store as a run opens it.
//! Its KV figures match the model's config, and the sequences it says fit follow from the
//! memory limit, dense set and budget it reports.

use clap::Parser;
use coli_engine::{Engine, EngineOptions};
use coli_store::IoPreference;
use coli_tests::{convert_fixture, expected, greedy, ids, open_store};
use coli_tools::plan::{plan, Plan, PlanArgs};

/// RAM the engine leaves out of the default budget (`BUDGET_RESERVE_BYTES`), bytes.
const RESERVE: u64 = 512 << 20;

/// KV cache bytes per token of a GQA model from its config.json: keys and values (f32) of
/// `num_key_value_heads * head_dim` per layer.
fn gqa_kv_bytes_per_token(cfg: &serde_json::Value) -> u64 {
    let n = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("config.json {k}"));
    let head_dim = cfg["head_dim"]
        .as_u64()
        .unwrap_or_else(|| n("hidden_size") / n("num_attention_heads"));
    2 * n("num_hidden_layers") * n("num_key_value_heads") * head_dim * 4
}

/// Sequences of `p.kv_bytes` that fit in the plan's memory limit beside its dense set, budget,
/// prefix cache and the reserve, at most 4096.
fn sequences_fit(p: &Plan) -> Option<usize> {
    let room = p
        .memory_limit_bytes?
        .saturating_sub(p.kv_cache_budget_bytes)
        .saturating_sub(p.dense_bytes)
        .saturating_sub(p.budget.min(p.expert_bytes_total))
        .saturating_sub(RESERVE);
    // No KV at all: the most reported.
    Some(
        room.checked_div(p.kv_bytes)
            .map_or(4096, |n| n.min(4096) as usize),
    )
}

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

    // KV: per token from the config, per sequence at the context; the JSON output names them.
    let per_token = gqa_kv_bytes_per_token(store.model_config());
    assert!(per_token > 0);
    assert_eq!(p.kv_bytes_per_token, per_token);
    assert_eq!(p.kv_bytes, per_token * p.context as u64);
    assert!(p.memory_limit_bytes.is_some_and(|m| m > 0), "{p:?}");
    assert_eq!(p.sequences_fit, sequences_fit(&p), "{p:?}");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["kv_bytes_per_token"], per_token);
    assert_eq!(json["kv_bytes"], per_token * p.context as u64);
    assert_eq!(json["memory_limit_bytes"], p.memory_limit_bytes.unwrap());
    assert_eq!(json["sequences_fit"], p.sequences_fit.unwrap());
    // A long context: each sequence takes a share of the memory (the tiny model's KV at 512
    // tokens fits the 4096 sequences reported at most).
    let long = plan_of(&[
        "--store",
        store_s,
        "--ram-budget",
        "1",
        "--context",
        "1000000",
        "--probe-mib",
        "0",
    ]);
    assert_eq!(long.kv_bytes, per_token * 1_000_000);
    assert_eq!(long.sequences_fit, sequences_fit(&long), "{long:?}");

    // The default budget comes from the memory limit and leaves room for one sequence and the
    // prefix cache.
    let d = plan_of(&["--store", store_s, "--context", "64", "--probe-mib", "0"]);
    assert!(d.budget_from_available_memory);
    assert_eq!(d.kv_bytes, per_token * 64);
    let limit = d.memory_limit_bytes.expect("memory limit");
    let largest = store.index().iter().map(|r| r.length.get()).max().unwrap();
    // The prefix cache of chat and serve defaults to one sequence's KV cache.
    assert_eq!(d.kv_cache_budget_bytes, d.kv_bytes, "{d:?}");
    let left = limit.saturating_sub(d.dense_bytes + d.kv_bytes + d.kv_cache_budget_bytes + RESERVE);
    assert_eq!(d.budget, left.max(largest), "{d:?}");
    if left >= largest && d.budget <= d.expert_bytes_total {
        assert_eq!(d.sequences_fit, Some(1), "{d:?}");
    }
    // A budget above the experts' total is counted as that total, which frees the rest for KV.
    assert!(
        d.budget > d.expert_bytes_total && d.sequences_fit > Some(1),
        "{d:?}"
    );
    assert_eq!(d.sequences_fit, sequences_fit(&d), "{d:?}");

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

/// `coli plan --checkpoint` (nothing converted, headers only) against the store `coli-convert`
/// then writes from the same checkpoint with the same encodings: the same expert record size and
/// count (main layers and MTP), the same dense bytes (the manifest's sections, padding aside),
/// and the KV bytes per token the engine allocates. Families: GQA (OLMoE), MLA with an MTP layer
/// and FP8 (DeepSeek-V3, lossless and int4), fused MXFP4 experts with biases (gpt-oss), Inkling,
/// hybrid linear attention (Qwen3-Next: recurrent states counted per sequence), DeepSeek-V4
/// (compressed entries per block; FP4 experts kept as mxfp4 records, FP8 dense).
#[test]
fn plan_from_a_checkpoint_predicts_the_store() {
    use coli_convert::memory_plan::{plan_from_config, ConfigPlanArgs};
    for (name, variant) in [
        ("olmoe_fp8", "int4_store"),
        ("deepseek_v3_fp8", "lossless_store"),
        ("deepseek_v3_fp8", "int4_store"),
        ("gpt_oss_mxfp4", "lossless_store"),
        ("glm4_moe_fp8", "int4_store"),
        ("inkling_bf16", "lossless_store"),
        ("qwen3_next_bf16", "int4_store"),
        ("qwen3_5_moe_bf16", "int4_store"),
        ("kimi_linear_bf16", "int4_store"),
        ("glm5_next_bf16", "int4_store"),
        ("deepseek_v4_bf16", "int4_store"),
        ("deepseek_v4_fp8", "lossless_store"),
    ] {
        let exp = expected(name);
        let params = &exp[variant];
        let enc =
            |k: &str, default: &str| coli_tests::encoding(params[k].as_str().unwrap_or(default));
        let p = plan_from_config(&ConfigPlanArgs {
            gguf: None,
            checkpoint: Some(&coli_tests::fixture_dir(name)),
            config: None,
            total_ram: 16 << 30,
            context: Some(1024),
            disk_gib_s: Some(2.0),
            experts: Some(enc("experts", "")),
            mtp: Some(enc("mtp", "int8")),
            chosen: None,
        })
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let (_tmp, dir) = convert_fixture(name, variant);
        let store = open_store(&dir, false, IoPreference::Buffered);
        let m = store.manifest();
        // The MTP layer's index is num_hidden_layers (the manifest's num_layers counts it).
        let num_layers = m.config["num_hidden_layers"]
            .as_u64()
            .or_else(|| m.config["text_config"]["num_hidden_layers"].as_u64())
            .unwrap() as u32;
        let (main, mtp): (Vec<&coli_store::IndexRecord>, Vec<&coli_store::IndexRecord>) = store
            .index()
            .iter()
            .partition(|r| r.layer.get() < num_layers);
        assert_eq!(p.experts, main.len() as u64, "{name} {variant}");
        assert!(
            main.iter().all(|r| r.length.get() == p.expert_record_bytes),
            "{name} {variant}"
        );
        assert_eq!(p.mtp_experts, mtp.len() as u64, "{name} {variant}");
        assert_eq!(
            p.mtp_expert_bytes_total,
            mtp.iter().map(|r| r.length.get()).sum::<u64>(),
            "{name} {variant}"
        );
        let dense_enc = params["dense"].as_str().unwrap();
        let row = p
            .rows
            .iter()
            .find(|r| r.dense_encoding == dense_enc)
            .unwrap_or_else(|| panic!("{name}: no {dense_enc} row"));
        let sections: u64 = m.dense.iter().map(|d| d.length + d.scales_length).sum();
        assert_eq!(row.dense_bytes, sections, "{name} {variant}: dense bytes");
        let eng = Engine::new(
            &store,
            &EngineOptions {
                context: Some(8),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            p.kv_bytes_per_token,
            eng.kv_bytes_per_token(),
            "{name}: KV bytes per token"
        );
        assert_eq!(
            coli_convert::memory_plan::kv_bytes_per_sequence(eng.spec(), 8),
            eng.kv_bytes_per_sequence(),
            "{name}: KV bytes per sequence"
        );
        // A recurrent model's fixed state: the engine's bytes per sequence less its bytes per
        // token times the context.
        if eng.spec().gated_delta.is_some() {
            assert_eq!(
                p.kv_state_bytes_per_sequence,
                eng.kv_bytes_per_sequence() - 8 * eng.kv_bytes_per_token(),
                "{name}: recurrent state per sequence"
            );
        } else {
            assert_eq!(p.kv_state_bytes_per_sequence, 0, "{name}");
        }
        // The figures follow from each other.
        assert_eq!(row.kv_bytes, p.kv_bytes_per_sequence);
        assert_eq!(
            row.expert_cache_bytes,
            (16u64 << 30) - row.dense_bytes - row.kv_bytes - (512 << 20)
        );
        assert_eq!(row.hit_rate_uniform, 1.0, "a tiny model fits");
        // Usable: 8 GiB of cache at 8k tokens, or every expert (a tiny model's all fit).
        assert!(row.usable && row.expert_cache_bytes_at_8k >= p.expert_bytes_total);
    }
}

/// The plan of the converter's own choices (`coli-convert --total-ram`: int4 dense, per-role
/// and embeddings choices) gives the dense bytes of the store those choices produce, exactly.
#[test]
fn plan_of_chosen_encodings_predicts_the_store() {
    use coli_convert::memory_plan::{plan_from_config, ConfigPlanArgs};
    for name in ["glm5_fp8", "deepseek_v3_fp8", "glm4_moe_fp8"] {
        let p = coli_tests::fixture_dir(name).join("expected_int4_dense.json");
        let exp: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        let mut params = exp["store"].clone();
        params["attention"] = "int8".into();
        let (_tmp, dir) =
            coli_tests::convert_fixture_with(name, &params, "int4 dense, int8 attention");
        let store = open_store(&dir, false, IoPreference::Buffered);
        let m = store.manifest();
        let e = |k: &str| coli_tests::encoding(params[k].as_str().unwrap());
        let chosen = coli_convert::Encodings {
            embeddings: Some(e("embeddings")),
            roles: coli_convert::RoleEncodings {
                attention: Some(coli_format::Encoding::Int8),
                ..Default::default()
            },
            ..coli_convert::Encodings::new(e("experts"), e("dense"), e("mtp"))
        };
        let plan = plan_from_config(&ConfigPlanArgs {
            gguf: None,
            checkpoint: Some(&coli_tests::fixture_dir(name)),
            config: None,
            total_ram: 16 << 30,
            context: Some(1024),
            disk_gib_s: None,
            experts: Some(chosen.experts),
            mtp: chosen.mtp,
            chosen: Some(chosen),
        })
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let row = &plan.rows[0];
        assert!(row.chosen && plan.rows[1..].iter().all(|r| !r.chosen));
        assert_eq!(
            row.dense_encoding,
            format!("{} attention=int8", params["dense"].as_str().unwrap())
        );
        let sections: u64 = m.dense.iter().map(|d| d.length + d.scales_length).sum();
        assert_eq!(
            row.dense_bytes, sections,
            "{name}: dense bytes of the chosen encodings"
        );
        assert!(
            plan.rows
                .iter()
                .any(|r| r.dense_encoding == "int4-g64" && r.embeddings_encoding == "int4-g64"),
            "{name}: the standard int4 rows are planned too"
        );
    }
}

/// `coli info` classes dense tensors by their role in the spec's tree (as the converter's
/// per-role options do), not by name: on GLM-5 (MLA with a DSA indexer, a dense first layer,
/// shared experts, an MTP layer) every role's tensors land in their class.
#[test]
fn info_classes_follow_the_spec_roles() {
    let (_tmp, dir) = coli_tests::convert_fixture("glm5_fp8", "int4_store");
    let r = coli_tools::info::report(&dir).unwrap();
    let c = &r["classes"];
    let store = coli_store::Store::open(&dir).unwrap();
    let m = store.manifest();
    let spec = coli_format::spec::ModelSpec::from_config(store.model_config(), None).unwrap();
    let roles = spec.tensors.linear_roles();
    let n = spec.num_layers as u64;
    let named = |f: &dyn Fn(&str) -> bool| m.dense.iter().filter(|d| f(&d.name)).count() as u64;
    let layer = |name: &str| -> Option<u64> {
        name.strip_prefix("model.layers.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    };
    let main = |name: &str| layer(name).is_some_and(|l| l < n);
    // Independent of `classify`: counts from the tensor names of the main layers.
    assert_eq!(
        c["shared_experts"]["count"],
        named(&|s| main(s) && s.contains(".mlp.shared_experts."))
    );
    assert_eq!(
        c["indexer"]["count"],
        named(&|s| main(s)
            && s.contains(".self_attn.indexer.")
            && s.ends_with("weight")
            && !s.contains("norm"))
    );
    assert_eq!(
        c["mtp"]["count"],
        named(&|s| layer(s).is_some_and(|l| l >= n))
    );
    assert!(c["dense_mlp"]["count"].as_u64().unwrap() > 0, "{c}");
    assert!(c["mtp"]["count"].as_u64().unwrap() > 0, "{c}");
    let total: u64 = coli_tools::info::CLASSES[1..]
        .iter()
        .map(|k| c[k]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(total, m.dense.len() as u64);
    assert!(!roles.is_empty());
    for name in [
        "model.layers.0.self_attn.q_a_proj.weight",
        "model.embed_tokens.weight",
    ] {
        assert!(m.dense.iter().any(|d| d.name == name), "{name}");
    }
    assert_eq!(
        coli_tools::info::classify("model.layers.0.self_attn.q_a_proj.weight", &roles, Some(n)),
        "attention"
    );
    assert_eq!(
        coli_tools::info::classify("model.embed_tokens.weight", &roles, Some(n)),
        "embeddings"
    );
}

/// `coli run`, `coli plan --checkpoint/--config` and the converter's memory plan share one
/// default context (`ModelSpec::default_context`: min(max_position_embeddings, 4096)).
#[test]
fn every_plan_and_the_engine_share_the_default_context() {
    let name = "qwen3_moe_bf16";
    let (_tmp, dir) = coli_tests::convert_fixture(name, "int4_store");
    let store = coli_tests::open_store(&dir, true, coli_store::IoPreference::Auto);
    let e = coli_engine::Engine::new(&store, &coli_engine::EngineOptions::default()).unwrap();
    let ck = coli_tests::fixture_dir(name);
    let config = ck.join("config.json");
    for (checkpoint, config) in [(Some(ck.as_path()), None), (None, Some(config.as_path()))] {
        let p = coli_convert::memory_plan::plan_from_config(
            &coli_convert::memory_plan::ConfigPlanArgs {
                gguf: None,
                checkpoint,
                config,
                total_ram: 8 << 30,
                context: None,
                disk_gib_s: None,
                experts: None,
                mtp: Some(coli_store::Encoding::Int8),
                chosen: None,
            },
        )
        .unwrap();
        assert_eq!(p.context, e.context(), "{checkpoint:?} {config:?}");
    }
    assert_eq!(e.context(), e.spec().default_context());
}
