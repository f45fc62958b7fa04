//! The memory plan before any conversion or download: what `coli plan --checkpoint DIR` /
//! `coli plan --config FILE` print and `coli-convert --total-ram` checks in its preflight. From the model spec (`coli_format::spec`, the one reader of
//! config.json) and the converter's own encoding rule per tensor
//! (`crate::plan::dense_encoding`), for each dense encoding: the resident bytes, the
//! expert record size and count, the bytes a decoded token reads with no hits, the KV cache, what
//! remains of `--total-ram` for the expert cache, the hit rate an LRU of that size has under
//! uniform routing, and the decode bound at `--disk-gib-s`.
//!
//! With `--checkpoint` the safetensors headers give each tensor's dtype (nothing else is read);
//! with `--config` the published layout is assumed: BF16, with linear weights in FP8 when
//! config.json declares `quantization_config.quant_method: fp8` (then the few BF16 linear weights
//! such checkpoints keep, e.g. DeepSeek's `eh_proj`, are counted as FP8).

use crate::safetensors::Dtype;
use crate::Encodings;
use anyhow::{bail, Context, Result};
use coli_format::spec::{TensorClass, TensorKind, TensorSpec};
use coli_format::{Encoding, ModelSpec, RecordLayout};
use serde::Serialize;
use std::path::Path;

/// RAM left for the runtime (buffers, activations, allocator), bytes: the engine's budget
/// reserve `coli_engine::placement::BUDGET_RESERVE_BYTES` (512 MiB; the converter does not
/// depend on the engine, a test of `coli-tools` checks that the two agree).
pub const RUNTIME_RESERVE_BYTES: u64 = 512 << 20;
/// A configuration is usable when its expert cache gets at least this much at
/// [`USABLE_CONTEXT`] tokens.
pub const USABLE_CACHE_BYTES: u64 = 8 << 30;
/// The context of the usability rule, tokens.
pub const USABLE_CONTEXT: usize = 8192;
/// Store record alignment the converter uses, bytes.
const ALIGNMENT: usize = 4096;

/// One configuration of the plan (a dense encoding and an embeddings encoding).
#[derive(Debug, Serialize)]
pub struct ConfigRow {
    /// `--dense`.
    pub dense_encoding: String,
    /// `--embeddings` (`source`: as in the checkpoint).
    pub embeddings_encoding: String,
    /// The configuration asked for ([`ConfigPlanArgs::chosen`], the converter's options).
    pub chosen: bool,
    /// Resident bytes: every dense tensor at the encoding the converter gives it (embeddings,
    /// attention, dense MLPs, shared experts, routers, norms, the MTP layer's dense part, the
    /// output head), without the store's section padding (at most 126 bytes a tensor).
    pub dense_bytes: u64,
    /// Of which the embedding and output head.
    pub embedding_bytes: u64,
    /// Of which the MTP layer(s).
    pub mtp_dense_bytes: u64,
    /// KV cache at `context` tokens.
    pub kv_bytes: u64,
    /// What `total_ram` leaves for the expert cache after dense, KV and the runtime reserve.
    pub expert_cache_bytes: u64,
    /// The same at [`USABLE_CONTEXT`] tokens.
    pub expert_cache_bytes_at_8k: u64,
    /// Main-layer expert records the cache holds.
    pub cached_experts: u64,
    /// Hit rate of an LRU of `cached_experts` of the main layers' experts under uniform
    /// routing (`min(1, cached / total)`).
    pub hit_rate_uniform: f64,
    /// Expert bytes read per decoded token at that hit rate.
    pub expert_bytes_per_token: f64,
    /// Decode tokens per second if the disk were the only limit (`--disk-gib-s`); `None`
    /// without one, when every expert is cached, or when the configuration does not fit.
    pub decode_tok_s_bound: Option<f64>,
    /// The dense set, the KV cache at `context` and the runtime reserve fit in `total_ram`.
    pub fits: bool,
    /// RAM this configuration needs to be usable at `context`: dense, KV cache, reserve and
    /// the usable expert cache (8 GiB, or every main-layer expert when they take less), bytes.
    pub usable_ram_bytes: u64,
    /// At least 8 GiB of expert cache at `context` tokens (the run's default context unless
    /// `--context` is given; WHAT_FITS.md uses 8192: the
    /// issue's rule), or room for every main-layer expert for a model whose experts take less.
    pub usable: bool,
}

/// The config-only plan (JSON output).
#[derive(Debug, Serialize)]
pub struct ConfigPlan {
    /// The checkpoint directory or config file.
    pub source: String,
    /// `model_type`.
    pub model_type: String,
    /// Whether dtypes came from file headers (the safetensors headers of `--checkpoint`, the
    /// GGUF header of `--gguf`) or were assumed as the release publishes them.
    pub dtypes_from_headers: bool,
    /// Whether the plan is of a GGUF (`--gguf`): its types, from its header.
    pub from_gguf: bool,
    /// `--total-ram`, bytes.
    pub total_ram_bytes: u64,
    /// Context, tokens.
    pub context: usize,
    /// `--disk-gib-s`.
    pub disk_gib_s: Option<f64>,
    /// Expert encoding of the main layers.
    pub expert_encoding: String,
    /// Bytes of one main-layer expert record on disk (4096-aligned).
    pub expert_record_bytes: u64,
    /// Main-layer expert records.
    pub experts: u64,
    /// Their bytes.
    pub expert_bytes_total: u64,
    /// MTP expert records (at `--mtp`'s encoding) and their bytes.
    pub mtp_experts: u64,
    /// See `mtp_experts`.
    pub mtp_expert_bytes_total: u64,
    /// Expert bytes one decoded token reads with no hit: MoE layers x top-k x record.
    pub expert_bytes_per_token_no_hits: u64,
    /// KV cache per token of context (f32, as the engine caches it), bytes.
    pub kv_bytes_per_token: u64,
    /// KV cache of one sequence at the plan's context, bytes ([`kv_bytes_per_sequence`]).
    pub kv_bytes_per_sequence: u64,
    /// The part of `kv_bytes_per_sequence` that is the same at any context, bytes: a hybrid
    /// model's recurrent states with their convolution rows, checkpoints and pin
    /// ([`recurrent_state_bytes`]); 0 for the other families.
    pub kv_state_bytes_per_sequence: u64,
    /// One row per dense encoding.
    pub rows: Vec<ConfigRow>,
}

/// KV bytes of one sequence of `context` positions as the engine caches them:
/// [`kv_bytes_per_token`] x `context`, or Inkling's bounded windows and convolution state
/// (`InklingSpec::kv_values`), plus a hybrid model's recurrent states
/// (`GatedDeltaSpec::held_values` per Gated DeltaNet layer). Checked against
/// `Engine::kv_bytes_per_sequence`.
pub fn kv_bytes_per_sequence(spec: &ModelSpec, context: usize) -> u64 {
    let grows = match (&spec.inkling, &spec.deepseek_v4) {
        (Some(ink), _) => (ink.kv_values(spec, context) * 4) as u64,
        (None, Some(v)) => (v.kv_values(spec.head_dim, context) * 4) as u64,
        (None, None) => kv_bytes_per_token(spec).saturating_mul(context as u64),
    };
    grows + recurrent_state_bytes(spec)
}

/// Bytes a hybrid model holds per sequence whatever its length: each linear-attention layer's
/// state, convolution rows, checkpoints and pinned copy (`GatedDeltaSpec::held_values`, f32);
/// 0 for models without such layers.
pub fn recurrent_state_bytes(spec: &ModelSpec) -> u64 {
    let values = spec
        .gated_delta
        .as_ref()
        .map_or(0, |g| g.linear_layer_count() * g.held_values());
    (values * 4) as u64
}

/// KV bytes per token of context as the engine caches them (f32): per GQA layer keys and
/// values (`2 * kv_heads * head_dim`, every position, sliding layers too); per MLA layer the
/// latent and the rope key (`kv_lora_rank + qk_rope_head_dim`) plus the DSA indexer's key on
/// its full layers (and GLM-5.3-Flash's pooling logits, `DsaSpec::cached_dim`); none per linear-attention layer of a hybrid model; Inkling: the keys and values of its full layers (what grows with the
/// context; [`kv_bytes_per_sequence`] adds the bounded rest); DeepSeek-V4: a compressed
/// layer's entry per block (`DeepseekV4Spec::values_per_token`; its window is bounded). Checked against
/// `Engine::kv_bytes_per_token` by `tests/tests/plan.rs`.
pub fn kv_bytes_per_token(spec: &ModelSpec) -> u64 {
    if let Some(v) = &spec.deepseek_v4 {
        // What grows: one pooled entry per closed block of the compressed layers.
        return (v.values_per_token(spec.head_dim) * 4) as u64;
    }
    if let Some(ink) = &spec.inkling {
        // What grows with the context: the full layers' keys and values.
        let values: usize = (0..spec.num_layers)
            .map(|l| ink.layer_dims(spec, l))
            .filter(|d| d.window.is_none())
            .map(|d| 2 * d.kv_heads * d.head_dim)
            .sum();
        return (values * 4) as u64;
    }
    // Hybrid models: only the full-attention layers keep keys and values per position.
    let linear = |l: usize| {
        spec.gated_delta
            .as_ref()
            .is_some_and(|g| g.linear_layers.get(l).copied().unwrap_or(false))
    };
    let values: usize = match &spec.mla {
        Some(m) => (0..spec.num_layers)
            .filter(|&l| !linear(l))
            .map(|l| {
                let dsa = m
                    .dsa
                    .as_ref()
                    .filter(|d| d.full.get(l).copied().unwrap_or(false))
                    .map_or(0, |d| d.cached_dim());
                m.kv_lora_rank + m.qk_rope_head_dim + dsa
            })
            .sum(),
        None => {
            let full = (0..spec.num_layers).filter(|&l| !linear(l)).count();
            full * 2 * spec.num_kv_heads * spec.head_dim
        }
    };
    (values * 4) as u64
}

/// Bytes of tensor `t` stored in `enc`: weight and scale sections (a vector as one row).
fn tensor_bytes(t: &TensorSpec, enc: Encoding) -> u64 {
    let (rows, cols) = coli_format::matrix_dims(&t.shape).unwrap_or((1, 1));
    (enc.weight_bytes(rows, cols) + enc.scale_bytes(rows, cols)) as u64
}

/// The dtype each tensor has: from the headers, or assumed (see the module docs).
enum Dtypes<'a> {
    Headers(&'a crate::checkpoint::Checkpoint),
    Assumed { fp8: bool },
}

impl Dtypes<'_> {
    /// `None`: the checkpoint lacks this (optional) tensor. Without a checkpoint, an MTP
    /// layer's optional embedding and head are assumed absent where every release of the
    /// family leaves them out (`ModelSpec::releases_share_mtp_embed_and_head`: GLM-5.x).
    fn of(&self, t: &TensorSpec, spec: &ModelSpec) -> Option<Dtype> {
        match self {
            Dtypes::Headers(ck) => ck.get(&t.name).map(|(_, i)| i.dtype),
            Dtypes::Assumed { .. }
                if t.optional
                    && t.class == TensorClass::Mtp
                    && spec.releases_share_mtp_embed_and_head() =>
            {
                None
            }
            Dtypes::Assumed { fp8 } => Some(if *fp8 && t.kind == TensorKind::Linear {
                Dtype::F8E4M3
            } else {
                Dtype::Bf16
            }),
        }
    }

    fn fp8_checkpoint(&self) -> bool {
        match self {
            Dtypes::Headers(ck) => ck.has_block_fp8(),
            Dtypes::Assumed { fp8 } => *fp8,
        }
    }
}

/// Arguments of the config-only plan.
pub struct ConfigPlanArgs<'a> {
    /// A checkpoint directory (config.json and safetensors headers).
    pub checkpoint: Option<&'a Path>,
    /// A config.json (no checkpoint).
    pub config: Option<&'a Path>,
    /// A GGUF file (its header only: metadata and tensor types; `coli plan --gguf`): one row,
    /// the GGUF's own types, as `coli-convert FILE.gguf` keeps them.
    pub gguf: Option<&'a Path>,
    /// RAM for everything, bytes.
    pub total_ram: u64,
    /// Context, tokens; `None`: the run's default (`ModelSpec::default_context`,
    /// `min(max_position_embeddings, 4096)`, as `coli run` and `coli plan --store` use).
    pub context: Option<usize>,
    /// Disk read bandwidth, GiB/s.
    pub disk_gib_s: Option<f64>,
    /// Main-layer expert encoding (`None`: the converter's default: mxfp4 / mxfp8 for experts
    /// published in them (a checkpoint's tensors, or a config's declaration), else int4-g64).
    pub experts: Option<Encoding>,
    /// MTP layer encoding (`--mtp`, default int8); `None` (`--mtp none`): the MTP layer is
    /// not counted.
    pub mtp: Option<Encoding>,
    /// A configuration to plan first, marked as chosen (the converter's own options; its
    /// `experts` and `mtp` are replaced by the two fields above).
    pub chosen: Option<Encodings>,
}

/// `--dense` of a configuration, with its per-role choices (`int4-g64 attention=int8`).
pub fn dense_label(enc: &Encodings) -> String {
    let mut s = enc.dense.name();
    for (k, e) in enc.roles.chosen() {
        s.push_str(&format!(" {k}={}", e.name()));
    }
    s
}

/// The converter options of a row (`--dense int4-g64 --embeddings int4-g64`), for a warning
/// that names the configurations that fit.
pub fn row_options(r: &ConfigRow) -> String {
    let mut it = r.dense_encoding.split(' ');
    let mut s = format!("--dense {}", it.next().unwrap_or_default());
    for kv in it {
        if let Some((k, v)) = kv.split_once('=') {
            s.push_str(&format!(" --{} {v}", k.replace('_', "-")));
        }
    }
    if r.embeddings_encoding != "source" {
        s.push_str(&format!(" --embeddings {}", r.embeddings_encoding));
    }
    s
}

/// Builds the config-only plan.
///
/// # Errors
/// A config.json that does not parse or that the spec refuses; an unreadable checkpoint.
pub fn plan_from_config(a: &ConfigPlanArgs<'_>) -> Result<ConfigPlan> {
    let ck;
    let mut gguf = None;
    let (spec, dtypes, source, config) = match (a.checkpoint, a.config) {
        (None, None) if a.gguf.is_some() => {
            let path = a.gguf.expect("checked");
            let mut g = crate::gguf::file::Gguf::open(path)?;
            let config = crate::gguf::arch::config_json(&g)?;
            let spec = ModelSpec::from_config(&config, None)
                .with_context(|| format!("the model {} describes", path.display()))?;
            crate::gguf::fused::split_qkv(&mut g, &spec, &config)?;
            gguf = Some(g);
            (
                spec,
                Dtypes::Assumed { fp8: false },
                path.display().to_string(),
                config,
            )
        }
        (Some(dir), None) => {
            ck = crate::checkpoint::Checkpoint::open(dir)
                .with_context(|| format!("reading checkpoint {}", dir.display()))?;
            let config: serde_json::Value = serde_json::from_slice(&ck.config_bytes)
                .with_context(|| format!("{}/config.json", dir.display()))?;
            (
                ck.spec.clone(),
                Dtypes::Headers(&ck),
                dir.display().to_string(),
                config,
            )
        }
        (None, Some(file)) => {
            let text =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let config: serde_json::Value = serde_json::from_slice(&text)
                .with_context(|| format!("{}: not JSON", file.display()))?;
            let spec = ModelSpec::from_config(&config, None)
                .with_context(|| format!("{}", file.display()))?;
            // Block-FP8 weights (not Inkling 2's MXFP8 experts, whose dense tensors are BF16).
            let fp8 = config
                .pointer("/quantization_config/quant_method")
                .and_then(serde_json::Value::as_str)
                == Some("fp8")
                && !coli_format::spec::inkling2::declares_mxfp8(&config);
            (
                spec,
                Dtypes::Assumed { fp8 },
                file.display().to_string(),
                config,
            )
        }
        _ => bail!("give exactly one of --checkpoint DIR, --config FILE and --gguf FILE"),
    };
    let context = a.context.unwrap_or(spec.default_context());
    if context == 0 {
        bail!("--context must be at least 1 token");
    }
    if a.total_ram <= RUNTIME_RESERVE_BYTES {
        bail!(
            "--total-ram {} bytes leaves nothing beside the {} MiB runtime reserve: give the machine's RAM, e.g. 25G",
            a.total_ram,
            RUNTIME_RESERVE_BYTES >> 20
        );
    }
    if let Some(g) = a.disk_gib_s {
        if !(g.is_finite() && g > 0.0) {
            bail!("--disk-gib-s must be a positive number of GiB/s, got {g}");
        }
    }
    // The experts' native encoding: what the tensors hold (a checkpoint, as the converter's
    // `--experts auto` decides), else what config.json declares.
    let declared = match &dtypes {
        Dtypes::Headers(ck) => Some(crate::fused::auto_experts(ck))
            .filter(|e| matches!(e, Encoding::Mxfp4 | Encoding::Mxfp8)),
        Dtypes::Assumed { .. } => coli_format::spec::declared_expert_encoding(&config),
    };
    if let Some(e @ (Encoding::Mxfp4 | Encoding::Mxfp8)) = a.experts {
        if declared != Some(e) {
            bail!(
                "--experts {n} keeps published {N} experts; {source} {how}: choose int4-g64, int4-g32, int8, fp8 or bf16",
                n = e.name(),
                N = e.name().to_uppercase(),
                how = match (&dtypes, e) {
                    (Dtypes::Headers(_), _) => "holds none".to_string(),
                    (_, Encoding::Mxfp4) =>
                        "does not declare them (quantization_config.quant_method mxfp4)".into(),
                    _ => "does not declare them (quantization_config.weight_block_size [1, 32])"
                        .into(),
                },
            );
        }
    }
    let experts = a
        .experts
        .unwrap_or(declared.unwrap_or(Encoding::Int4 { group_size: 64 }));
    let record = |enc: Encoding, biases: bool| -> u64 {
        RecordLayout::new(
            enc,
            spec.expert_hidden(),
            spec.moe_intermediate_size,
            biases,
        )
        .record_len(ALIGNMENT) as u64
    };
    // Expert sets present (an MTP layer the checkpoint lacks is not converted).
    let sets: Vec<_> = spec
        .tensors
        .expert_sets()
        .into_iter()
        .filter(|s| match &dtypes {
            // A GGUF's MTP layer keeps its types, as its other layers (`gguf` below), whatever
            // `--mtp` says.
            _ if s.class == TensorClass::Mtp && gguf.is_some() => true,
            _ if s.class == TensorClass::Mtp && a.mtp.is_none() => false,
            Dtypes::Headers(ck) => s.class != TensorClass::Mtp || ck.has(&s.tensor_names(0)[0]),
            Dtypes::Assumed { .. } => true,
        })
        .collect();
    let (mut experts_n, mut experts_bytes, mut mtp_n, mut mtp_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut main_record = 0;
    let mut moe_layers = 0u64;
    for s in &sets {
        if s.class == TensorClass::Mtp {
            // A GGUF's MTP set is counted with its own types below.
            if let (Some(mtp), None) = (a.mtp, &gguf) {
                mtp_n += s.count as u64;
                mtp_bytes += s.count as u64 * record(mtp, s.biases);
            }
        } else {
            main_record = record(experts, s.biases);
            experts_n += s.count as u64;
            experts_bytes += s.count as u64 * main_record;
            moe_layers += 1;
        }
    }
    let mut no_hits = moe_layers * spec.top_k as u64 * main_record;
    // A GGUF's records: each layer's three types as the file has them (they may differ by layer).
    let mut gguf_dense = None;
    if let Some(g) = &gguf {
        let (mut n, mut bytes, mut per_token) = (0u64, 0u64, 0u64);
        for s in &sets {
            let encs = crate::gguf::convert::expert_encodings(g, s)?;
            let rec = RecordLayout::mixed(
                encs,
                spec.expert_hidden(),
                spec.moe_intermediate_size,
                false,
            )
            .record_len(ALIGNMENT) as u64;
            if s.class == TensorClass::Mtp {
                mtp_n += s.count as u64;
                mtp_bytes += s.count as u64 * rec;
                continue;
            }
            n += s.count as u64;
            bytes += s.count as u64 * rec;
            per_token += spec.top_k as u64 * rec;
        }
        experts_n = n;
        experts_bytes = bytes;
        no_hits = per_token;
        main_record = bytes.checked_div(n).unwrap_or(0);
        let (mut dense, mut embed, mut mtp) = (0u64, 0u64, 0u64);
        for t in spec.tensors.dense() {
            let Some(info) =
                crate::gguf::arch::gguf_name_in(&config, &t.name).and_then(|n| g.tensors.get(&n))
            else {
                continue;
            };
            let b = coli_format::encoding::align_up(info.nbytes, 64) as u64;
            dense += b;
            // As for a checkpoint: the embedding and head of the main model; the MTP layer's
            // own (GLM-4.5, DeepSeek-V3.2 files) count as the MTP layer's.
            if t.class == TensorClass::Mtp {
                mtp += b;
            } else if matches!(t.kind, TensorKind::Embedding | TensorKind::OutputHead) {
                embed += b;
            }
        }
        gguf_dense = Some((dense, embed, mtp));
    }
    let kv_tok = kv_bytes_per_token(&spec);
    let fp8 = dtypes.fp8_checkpoint();
    let int4 = Encoding::Int4 { group_size: 64 };
    let mut dense_choices = vec![(Encoding::Bf16, None), (Encoding::Int8, None)];
    if fp8 {
        dense_choices.push((Encoding::Fp8, None));
    }
    dense_choices.extend([(int4, None), (int4, Some(int4))]);
    let mut configs: Vec<(Encodings, bool)> = Vec::new();
    if let Some(c) = a.chosen {
        configs.push((
            Encodings {
                experts,
                mtp: a.mtp,
                ..c
            },
            true,
        ));
    }
    for (dense_enc, embeddings) in dense_choices {
        let e = Encodings {
            embeddings,
            mtp: a.mtp,
            ..Encodings::new(experts, dense_enc, Encoding::Int8)
        };
        if !configs.iter().any(|(c, _)| *c == e) {
            configs.push((e, false));
        }
    }
    if gguf_dense.is_some() {
        configs.clear();
        configs.push((
            Encodings::new(experts, Encoding::Bf16, Encoding::Int8),
            true,
        ));
    }
    let roles = spec.tensors.linear_roles();
    let mut rows = Vec::new();
    for (enc, chosen) in configs {
        let (mut dense, mut embed, mut mtp_dense) = (0u64, 0u64, 0u64);
        if let Some((d, e, m)) = gguf_dense {
            (dense, embed, mtp_dense) = (d, e, m);
        }
        for t in spec
            .tensors
            .dense()
            .into_iter()
            .filter(|_| gguf_dense.is_none())
        {
            if t.class == TensorClass::Mtp && a.mtp.is_none() {
                continue;
            }
            let Some(src) = dtypes.of(t, &spec) else {
                continue;
            };
            let role = roles.get(t.name.as_str()).copied();
            let e = crate::plan::dense_encoding(t, role, src, enc, fp8)
                .with_context(|| format!("planning --dense {}", dense_label(&enc)))?;
            let b = tensor_bytes(t, e);
            dense += b;
            if matches!(t.kind, TensorKind::Embedding | TensorKind::OutputHead)
                && t.class != TensorClass::Mtp
            {
                embed += b;
            }
            if t.class == TensorClass::Mtp {
                mtp_dense += b;
            }
        }
        // RAM before any expert cache: the dense set, the KV cache at `ctx` tokens, the reserve.
        let need = |ctx: usize| {
            dense
                .saturating_add(kv_bytes_per_sequence(&spec, ctx))
                .saturating_add(RUNTIME_RESERVE_BYTES)
        };
        let cache = |ctx: usize| a.total_ram.saturating_sub(need(ctx));
        let cache_bytes = cache(context);
        let fits = need(context) <= a.total_ram;
        let cached = cache_bytes
            .checked_div(main_record)
            .unwrap_or(0)
            .min(experts_n);
        let hit = if experts_n == 0 {
            1.0
        } else {
            cached as f64 / experts_n as f64
        };
        let per_token = no_hits as f64 * (1.0 - hit);
        let gguf_label = |l: String| {
            if gguf_dense.is_some() {
                "gguf".to_string()
            } else {
                l
            }
        };
        rows.push(ConfigRow {
            dense_encoding: gguf_label(dense_label(&enc)),
            embeddings_encoding: gguf_label(enc.embeddings.map_or("source".into(), Encoding::name)),
            chosen,
            dense_bytes: dense,
            embedding_bytes: embed,
            mtp_dense_bytes: mtp_dense,
            kv_bytes: kv_bytes_per_sequence(&spec, context),
            expert_cache_bytes: cache_bytes,
            expert_cache_bytes_at_8k: cache(USABLE_CONTEXT),
            cached_experts: cached,
            hit_rate_uniform: hit,
            expert_bytes_per_token: per_token,
            decode_tok_s_bound: a
                .disk_gib_s
                .filter(|_| per_token > 0.0 && fits)
                .map(|g| g * (1u64 << 30) as f64 / per_token),
            fits,
            usable_ram_bytes: need(context).saturating_add(USABLE_CACHE_BYTES.min(experts_bytes)),
            usable: cache_bytes >= USABLE_CACHE_BYTES.min(experts_bytes),
        });
    }
    Ok(ConfigPlan {
        source,
        model_type: spec.model_type.clone(),
        dtypes_from_headers: gguf.is_some() || matches!(dtypes, Dtypes::Headers(_)),
        from_gguf: gguf.is_some(),
        total_ram_bytes: a.total_ram,
        context,
        disk_gib_s: a.disk_gib_s,
        expert_encoding: match &gguf {
            Some(g) => {
                let mut t: Vec<String> = sets
                    .iter()
                    .flat_map(|s| crate::gguf::fused::expert_sources(g, s.layer))
                    .filter_map(|(n, _)| g.tensors.get(&n).map(|t| t.type_name()))
                    .collect();
                t.sort();
                t.dedup();
                t.join("+")
            }
            None => experts.name(),
        },
        expert_record_bytes: main_record,
        experts: experts_n,
        expert_bytes_total: experts_bytes,
        mtp_experts: mtp_n,
        mtp_expert_bytes_total: mtp_bytes,
        expert_bytes_per_token_no_hits: no_hits,
        kv_bytes_per_token: kv_tok,
        kv_bytes_per_sequence: kv_bytes_per_sequence(&spec, context),
        kv_state_bytes_per_sequence: recurrent_state_bytes(&spec),
        rows,
    })
}

/// A size in GiB (MiB below 1 GiB).
fn size(b: f64) -> String {
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// The plan as a table (lines ending in newlines).
pub fn render(p: &ConfigPlan) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{} ({}; dtypes {}): {} RAM, context {} tokens{}",
        p.source,
        p.model_type,
        if p.from_gguf {
            "from the GGUF header"
        } else if p.dtypes_from_headers {
            "from the safetensors headers"
        } else {
            "assumed as published"
        },
        size(p.total_ram_bytes as f64),
        p.context,
        p.disk_gib_s
            .map(|g| format!(", disk {g} GiB/s"))
            .unwrap_or_default()
    ));
    out.push('\n');
    let mtp = if p.mtp_experts > 0 {
        format!(
            "; MTP: {} records, {}",
            p.mtp_experts,
            size(p.mtp_expert_bytes_total as f64)
        )
    } else {
        String::new()
    };
    out.push_str(&format!(
        "experts: {} records of {} ({}), {} in all; {} per token with no hits{mtp}",
        p.experts,
        size(p.expert_record_bytes as f64),
        p.expert_encoding,
        size(p.expert_bytes_total as f64),
        size(p.expert_bytes_per_token_no_hits as f64),
    ));
    out.push('\n');
    let state = if p.kv_state_bytes_per_sequence > 0 {
        format!(
            " + {} of recurrent state per sequence whatever its length",
            size(p.kv_state_bytes_per_sequence as f64)
        )
    } else {
        String::new()
    };
    out.push_str(&format!(
        "KV cache: {} bytes per token{state}, {} at {} tokens (one sequence; coli serve also keeps finished \
         conversations' KV states in RAM, --kv-cache-budget, by default as much again: `coli plan \
         --store` counts it)",
        p.kv_bytes_per_token,
        size(p.kv_bytes_per_sequence as f64),
        p.context
    ));
    out.push('\n');
    let label = |r: &ConfigRow| {
        if r.chosen {
            format!("{} (chosen)", r.dense_encoding)
        } else {
            r.dense_encoding.clone()
        }
    };
    let label_width = p
        .rows
        .iter()
        .map(|r| label(r).len())
        .max()
        .unwrap_or(0)
        .max(8);
    out.push_str(&format!(
        "{:<w$} {:<12} {:>12} {:>12} {:>14} {:>9} {:>14} {:>12} {:>7}",
        "--dense",
        "--embeddings",
        "resident",
        "expert cache",
        "cached experts",
        "hit rate",
        "read/token",
        "tok/s bound",
        "usable",
        w = label_width
    ));
    out.push('\n');
    for r in &p.rows {
        out.push_str(&format!(
            "{:<w$} {:<12} {:>12} {:>12} {:>14} {:>8.1}% {:>14} {:>12} {:>7}",
            label(r),
            r.embeddings_encoding,
            size(r.dense_bytes as f64),
            size(r.expert_cache_bytes as f64),
            r.cached_experts,
            r.hit_rate_uniform * 100.0,
            size(r.expert_bytes_per_token),
            match r.decode_tok_s_bound {
                Some(t) => format!("{t:.2}"),
                None if !r.fits => "no fit".into(),
                None => "-".into(),
            },
            if r.usable {
                "yes"
            } else if r.fits {
                "no"
            } else {
                "no fit"
            },
            w = label_width
        ));
        out.push('\n');
    }
    out.push_str(&format!(
        "usable: at least {} of expert cache (or every expert) at {} tokens of context beside \
         the dense set, the KV cache and {} for the runtime; hit rate for uniform routing \
         (trained models route unevenly and hit more); \"no fit\": the dense set, the KV cache \
         and the reserve alone exceed the RAM; tok/s bound \"-\": no disk bandwidth given, or \
         every expert cached",
        size(USABLE_CACHE_BYTES as f64),
        p.context,
        size(RUNTIME_RESERVE_BYTES as f64)
    ));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn repo(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
    }

    fn args(config: &Path) -> ConfigPlanArgs<'_> {
        ConfigPlanArgs {
            gguf: None,
            checkpoint: None,
            config: Some(config),
            total_ram: 25 << 30,
            context: Some(8192),
            disk_gib_s: Some(3.0),
            experts: None,
            mtp: Some(Encoding::Int8),
            chosen: None,
        }
    }

    /// GLM-5.2 (IndexShare) against GLM-5: the same layers, experts and widths; the indexer
    /// on 21 of 78 main layers instead of 78, so per token 57 fewer indexer keys
    /// (`index_head_dim` 128 f32 each) and 57 fewer indexers in the resident set.
    #[test]
    fn glm_5_2_plans_its_shared_indexer_layers() {
        let glm5 = plan_from_config(&args(&repo("docs/configs/glm-5.config.json"))).unwrap();
        let glm52 = plan_from_config(&args(&repo("docs/configs/glm-5.2.config.json"))).unwrap();
        assert_eq!(glm52.model_type, "glm_moe_dsa");
        assert_eq!(glm52.experts, glm5.experts);
        assert_eq!(glm52.mtp_experts, 256, "the MTP layer counted");
        assert_eq!(
            glm5.kv_bytes_per_token - glm52.kv_bytes_per_token,
            57 * 128 * 4
        );
        // One indexer at bf16: wq_b [4096, 2048], wk [128, 6144], k_norm weight and bias,
        // weights_proj [32, 6144].
        let indexer_bf16 = (4096 * 2048 + 128 * 6144 + 2 * 128 + 32 * 6144) * 2;
        let bf16 = |p: &ConfigPlan| {
            p.rows
                .iter()
                .find(|r| r.dense_encoding == "bf16")
                .unwrap()
                .dense_bytes
        };
        assert_eq!(bf16(&glm5) - bf16(&glm52), 57 * indexer_bf16);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let oss = repo("docs/configs/gpt-oss-20b.config.json");
        let mixtral = repo("tests/fixtures/tiny/mixtral_fp8/config.json");
        let err = |a: ConfigPlanArgs<'_>| plan_from_config(&a).unwrap_err().to_string();
        assert!(err(ConfigPlanArgs {
            gguf: None,
            context: Some(0),
            ..args(&oss)
        })
        .contains("--context"));
        for g in [0.0, -3.0, f64::NAN, f64::INFINITY] {
            let e = err(ConfigPlanArgs {
                gguf: None,
                disk_gib_s: Some(g),
                ..args(&oss)
            });
            assert!(e.contains("--disk-gib-s"), "{g}: {e}");
        }
        let e = err(ConfigPlanArgs {
            gguf: None,
            experts: Some(Encoding::Mxfp4),
            ..args(&mixtral)
        });
        assert!(e.contains("does not declare"), "{e}");
        // A huge context saturates instead of overflowing: no room left, not usable.
        let p = plan_from_config(&ConfigPlanArgs {
            gguf: None,
            context: Some(usize::MAX / 2),
            ..args(&oss)
        })
        .unwrap();
        assert!(p
            .rows
            .iter()
            .all(|r| r.expert_cache_bytes == 0 && r.kv_bytes == u64::MAX));
        // The defaults: mxfp4 for a config declaring it, int4-g64 otherwise.
        assert_eq!(
            plan_from_config(&args(&oss)).unwrap().expert_encoding,
            "mxfp4"
        );
        assert_eq!(
            plan_from_config(&args(&mixtral)).unwrap().expert_encoding,
            "int4-g64"
        );
    }
}
