//! Bytes a model needs, from its config.json alone (before any download or conversion), by the
//! same spec and record layout the converter and the engine use:
//!
//! ```sh
//! cargo run -q -p coli-format --example config_bytes -- docs/configs/gpt-oss-20b.config.json mxfp4
//! ```
//!
//! Prints JSON: the expert record (payload and on-disk bytes at 4096 alignment) in the given
//! expert encoding (`mxfp4`, `int4-g64`, `int4-g32`, `int8`, `bf16`), the routed-expert bytes one
//! decoded token reads when every expert is a miss (`top_k` records per MoE layer), all experts,
//! the dense (resident) tensors at 2 bytes per value (BF16, as the published checkpoints and the
//! converter's default keep them), the dense bytes read per token (all but the embedding, of
//! which one row is read), and the f32 KV cache per token of context (`2 * kv_heads * head_dim *
//! 4` bytes per layer, as the engine caches every position of every layer).

use coli_format::spec::TensorKind;
use coli_format::{Encoding, ModelSpec, RecordLayout};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(enc)) = (args.first(), args.get(1)) else {
        eprintln!("usage: config_bytes CONFIG.json mxfp4|int4-g64|int4-g32|int8|bf16");
        std::process::exit(2);
    };
    let encoding = match enc.as_str() {
        "mxfp4" => Encoding::Mxfp4,
        "int4-g64" => Encoding::Int4 { group_size: 64 },
        "int4-g32" => Encoding::Int4 { group_size: 32 },
        "int8" => Encoding::Int8,
        "bf16" => Encoding::Bf16,
        other => {
            eprintln!("config_bytes: unknown encoding {other}");
            std::process::exit(2);
        }
    };
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        eprintln!("config_bytes: {path}: {e}");
        std::process::exit(1);
    });
    let config: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        eprintln!("config_bytes: {path}: {e}");
        std::process::exit(1);
    });
    let spec = ModelSpec::from_config(&config, None).unwrap_or_else(|e| {
        eprintln!("config_bytes: {path}: {e}");
        std::process::exit(1);
    });
    let sets = spec.tensors.expert_sets();
    let biases = sets.iter().any(|s| s.biases);
    let layout = RecordLayout::new(
        encoding,
        spec.hidden_size,
        spec.moe_intermediate_size,
        biases,
    );
    let record = layout.record_len(4096) as u64;
    let moe_layers = sets.len() as u64;
    let experts_total: u64 = sets.iter().map(|s| s.count as u64 * record).sum();
    let elems = |shape: &[usize]| shape.iter().product::<usize>() as u64;
    let dense = spec.tensors.dense();
    let dense_bytes: u64 = dense.iter().map(|t| 2 * elems(&t.shape)).sum();
    let embed: u64 = dense
        .iter()
        .filter(|t| t.kind == TensorKind::Embedding)
        .map(|t| 2 * elems(&t.shape))
        .sum();
    let dense_read = dense_bytes - embed + 2 * spec.hidden_size as u64;
    let kv = (spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * 4) as u64;
    let out = serde_json::json!({
        "config": path,
        "model_type": spec.model_type,
        "layers": spec.num_layers,
        "moe_layers": moe_layers,
        "experts_per_layer": spec.num_experts,
        "top_k": spec.top_k,
        "expert_encoding": encoding.name(),
        "expert_biases": biases,
        "record_payload_bytes": layout.payload_len,
        "record_bytes_4k": record,
        "expert_bytes_per_token_all_miss": moe_layers * spec.top_k as u64 * record,
        "experts_total_bytes": experts_total,
        "dense_bytes_bf16": dense_bytes,
        "dense_bytes_read_per_token": dense_read,
        "kv_bytes_per_token_f32": kv,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
}
