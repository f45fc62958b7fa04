//! `coli info STORE [--json]`: what a store holds (classes of tensors, encodings, provenance).

use coli_store::Encoding;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Tensor classes reported by `coli info`: `routed_experts`, then the dense classes of
/// [`classify`].
pub const CLASSES: [&str; 9] = [
    "routed_experts",
    "attention",
    "indexer",
    "shared_experts",
    "dense_mlp",
    "mtp",
    "norms",
    "embeddings",
    "other_dense",
];

/// The class of dense tensor `name`: by its role in the model spec's tree when `roles` (from
/// `ModelTensors::linear_roles`) names it (`attention`, `indexer`, `shared_experts`,
/// `dense_mlp`, as the converter's options and report count them); `mtp` for a tensor of a
/// layer at or past `num_hidden_layers` (the MTP layer); else by name ([`dense_class`]).
pub fn classify(
    name: &str,
    roles: &std::collections::HashMap<&str, coli_format::spec::LinearRole>,
    num_hidden_layers: Option<u64>,
) -> &'static str {
    use coli_format::spec::LinearRole;
    if let Some(role) = roles.get(name) {
        return match role {
            LinearRole::Attention => "attention",
            LinearRole::Indexer | LinearRole::IndexerWeights => "indexer",
            LinearRole::SharedExperts => "shared_experts",
            LinearRole::DenseMlp => "dense_mlp",
        };
    }
    let layer = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse::<u64>().ok());
    if let (Some(l), Some(n)) = (layer, num_hidden_layers) {
        if l >= n {
            return "mtp";
        }
    }
    dense_class(name)
}

/// The class of a dense tensor from its checkpoint name alone (the fallback of [`classify`]
/// for tensors outside the spec's linear roles, or a config the spec cannot read):
/// `attention` (`self_attn`/`attn`), `norms` (`norm`), `embeddings` (`embed_tokens`,
/// `lm_head`, `embed`), else `other_dense` (routers, biases, gpt-oss sinks, ...).
pub fn dense_class(name: &str) -> &'static str {
    if name.contains("attn") {
        "attention"
    } else if name.contains("norm") {
        "norms"
    } else if name.contains("embed") || name.contains("lm_head") {
        "embeddings"
    } else {
        "other_dense"
    }
}

/// Whether the store holds an MTP layer: a layer index at or past config.json's
/// `num_hidden_layers` (the MTP layer is decoder layer `num_hidden_layers`).
fn has_mtp_layer(m: &coli_store::Manifest) -> bool {
    let main = config_u64(&m.config, &["num_hidden_layers", "n_layers"]);
    main.is_some_and(|n| u64::from(m.num_layers) > n)
}

fn encoding_name(id: u16, group_size: u16) -> String {
    Encoding::from_id(id, group_size)
        .map(|e| e.name())
        .unwrap_or_else(|_| format!("unknown({id})"))
}

fn config_u64(cfg: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| {
        cfg.get(k)
            .or_else(|| cfg.get("text_config").and_then(|t| t.get(k)))
            .and_then(Value::as_u64)
    })
}

/// Builds the `coli info` report of the store in `store` as JSON:
/// `family`, `dims` {hidden_size, num_layers, num_experts, top_k} (from config.json; null when
/// absent), `encodings` {experts, records, dense}, `classes` {CLASS: {count, bytes, encodings}}
/// for routed_experts / attention / indexer / shared_experts / dense_mlp / mtp / norms /
/// embeddings / other_dense ([`classify`]; bytes on disk, padding of expert records included), `provenance` {converter, parameters, sources}, `format_version`,
/// `store_id`, `mtp_layer` (the store holds an MTP layer), `mtp_shared` (the MTP layer's
/// tensors the main model's stand in for: MANIFEST `mtp_shared`), `alignment`, `segments`.
///
/// # Errors
/// When `store` is no store (no MANIFEST: the error says how to make one) or the store cannot
/// be opened (the error says why and suggests `coli-fsck`).
pub fn report(store: &Path) -> anyhow::Result<Value> {
    // Not a store (a missing path, a file, a directory without a MANIFEST): what it is and
    // how to make a store; a store that does not open: why, and coli-fsck (as `coli run`).
    let st = crate::options::open_store(store, &coli_store::OpenOptions::default())?;
    let m = st.manifest();
    let cfg = st.model_config();
    let mut classes: BTreeMap<&str, (u64, u64)> = CLASSES.iter().map(|c| (*c, (0, 0))).collect();
    let mut class_encodings: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
    let mut record_encodings: BTreeMap<String, u64> = BTreeMap::new();
    for r in st.index() {
        let e = classes.get_mut("routed_experts").expect("class exists");
        e.0 += 1;
        e.1 += r.length.get();
        let name = encoding_name(r.encoding.get(), r.group_size.get());
        *class_encodings
            .entry("routed_experts")
            .or_default()
            .entry(name.clone())
            .or_default() += 1;
        *record_encodings.entry(name).or_default() += 1;
    }
    let mut dense_encodings: BTreeMap<String, u64> = BTreeMap::new();
    // Roles from the spec's tree; a config the spec cannot read falls back to names.
    let spec = coli_format::spec::ModelSpec::from_config(cfg, None).ok();
    let roles = spec
        .as_ref()
        .map(|s| s.tensors.linear_roles())
        .unwrap_or_default();
    let main_layers = config_u64(cfg, &["num_hidden_layers", "n_layers"]);
    for d in &m.dense {
        let class = classify(&d.name, &roles, main_layers);
        let e = classes.get_mut(class).expect("class exists");
        e.0 += 1;
        e.1 += d.length + d.scales_length;
        let name = encoding_name(d.encoding, d.group_size);
        *class_encodings
            .entry(class)
            .or_default()
            .entry(name.clone())
            .or_default() += 1;
        *dense_encodings.entry(name).or_default() += 1;
    }
    let classes_json: serde_json::Map<String, Value> = CLASSES
        .iter()
        .map(|c| {
            let (n, b) = classes[c];
            let enc = class_encodings.get(c).cloned().unwrap_or_default();
            (
                c.to_string(),
                json!({"count": n, "bytes": b, "encodings": enc}),
            )
        })
        .collect();
    Ok(json!({
        "store": store.display().to_string(),
        "store_id": m.store_id,
        "format_version": m.format_version,
        "family": m.family,
        // The model spec (the one reader of config.json, each family's keys and aliases) when
        // the config parses; the common keys otherwise (a store of a model this build refuses).
        "dims": match coli_format::spec::ModelSpec::from_config(cfg, None) {
            Ok(s) => json!({
                "hidden_size": s.hidden_size,
                "num_layers": s.num_layers,
                "num_experts": s.num_experts,
                "top_k": s.top_k,
            }),
            Err(_) => json!({
                "hidden_size": config_u64(cfg, &["hidden_size", "d_model"]),
                "num_layers": config_u64(cfg, &["num_hidden_layers", "n_layers"]).or(Some(m.num_layers as u64)),
                "num_experts": config_u64(cfg, &["n_routed_experts", "num_local_experts", "num_experts"]),
                "top_k": config_u64(cfg, &["num_experts_per_tok", "moe_topk", "top_k"]),
            }),
        },
        "encodings": {
            "experts": m.expert_encoding.name,
            "records": record_encodings,
            "dense": dense_encodings,
        },
        "classes": classes_json,
        "mtp_layer": has_mtp_layer(m),
        "mtp_shared": m.mtp_shared,
        "alignment": m.alignment,
        "segments": m.segment_count,
        "provenance": {
            "converter": {"name": m.converter.name, "version": m.converter.version},
            "parameters": m.parameters,
            "sources": m.sources,
        },
    }))
}

/// Prints what the store in `store` holds: family and dims, encodings, count and bytes per
/// tensor class, provenance, format version and store id; as JSON (see [`report`]) when `json`.
///
/// # Errors
/// When the store cannot be opened.
pub fn run(store: &Path, json: bool) -> anyhow::Result<()> {
    let r = report(store)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let opt = |v: &Value| match v.as_u64() {
        Some(n) => n.to_string(),
        None => "?".into(),
    };
    println!("store:          {}", r["store"].as_str().unwrap_or(""));
    println!("store id:       {}", r["store_id"].as_str().unwrap_or(""));
    println!("format version: {}", r["format_version"]);
    println!("family:         {}", r["family"].as_str().unwrap_or(""));
    let d = &r["dims"];
    println!(
        "dims:           hidden {}, layers {}, experts {}, top-k {}",
        opt(&d["hidden_size"]),
        opt(&d["num_layers"]),
        opt(&d["num_experts"]),
        opt(&d["top_k"])
    );
    let fmt_counts = |v: &Value| {
        v.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, n)| format!("{k} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let e = &r["encodings"];
    println!(
        "encodings:      experts {} (records: {}); dense: {}",
        e["experts"].as_str().unwrap_or(""),
        fmt_counts(&e["records"]),
        fmt_counts(&e["dense"])
    );
    println!("tensors:");
    for c in CLASSES {
        let x = &r["classes"][c];
        // A class the model does not have (no indexer, no MTP layer, ...) is left out.
        if x["count"].as_u64() == Some(0) && c != "routed_experts" {
            continue;
        }
        let bytes = x["bytes"].as_u64().unwrap_or(0);
        println!(
            "  {:<15} {:>8}  {:>12}  ({} bytes)  {}",
            c,
            opt(&x["count"]),
            crate::units::bytes(bytes as f64),
            bytes,
            fmt_counts(&x["encodings"])
        );
    }
    if let Some(shared) = r["mtp_shared"].as_object() {
        for (mtp, main) in shared {
            let what = if mtp.contains("embed") {
                "MTP embedding:"
            } else {
                "MTP head:     "
            };
            println!(
                "{what}  the main {} ({mtp} is not in the release)",
                main.as_str().unwrap_or("")
            );
        }
    }
    println!(
        "layout:         alignment {} bytes, {} segment file(s)",
        r["alignment"], r["segments"]
    );
    let p = &r["provenance"];
    println!(
        "converter:      {} {}",
        p["converter"]["name"].as_str().unwrap_or(""),
        p["converter"]["version"].as_str().unwrap_or("")
    );
    if let Some(o) = p["parameters"].as_object() {
        // `mtp` is recorded for every store; it says something only when the store holds an
        // MTP layer (the JSON report keeps the parameters as recorded).
        let has_mtp = r["mtp_layer"].as_bool().unwrap_or(true);
        let s: Vec<String> = o
            .iter()
            .filter(|(k, v)| has_mtp || k.as_str() != "mtp" || v.as_str() == Some("none"))
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect();
        println!("parameters:     {}", s.join(" "));
    }
    if let Some(a) = p["sources"].as_array() {
        println!("sources:        {} file(s)", a.len());
        for s in a {
            println!(
                "  {} ({} bytes, header xxh3 {})",
                s["name"].as_str().unwrap_or(""),
                s["size"],
                s["header_xxh3"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}
