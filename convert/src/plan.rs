//! The conversion plan: every tensor's role and target encoding, checked before anything is
//! written (preflight).

use crate::checkpoint::Checkpoint;
use crate::error::{ConvertError, Result};
use crate::family::layer_of;
use crate::quant::{ScaleSource, SourceMatrix};
use crate::safetensors::Dtype;
use coli_store::encoding::{align_up, FP8_BLOCK, SECTION_ALIGN};
use coli_store::{Encoding, ExpertKey, ExpertLayer, RecordLayout};
use std::collections::BTreeSet;

/// The user's encoding choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encodings {
    /// Routed experts of the main layers.
    pub experts: Encoding,
    /// Linear weights outside the routed experts (attention, shared experts, dense MLP, indexer).
    pub dense: Encoding,
    /// Every linear weight of the MTP layer(s), their routed experts included.
    pub mtp: Encoding,
    /// The token embedding `model.embed_tokens.weight` and `lm_head.weight`: `None` keeps
    /// them as in the source (the default), `Some(Encoding::Int8)` stores them with per-row
    /// int8 scales (halves the bytes the output projection reads per decoded token; one row
    /// of the embedding is read per token).
    pub embeddings: Option<Encoding>,
}

/// Class of a tensor for the quantization error report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Routed experts of the main layers.
    Experts,
    /// Attention linear weights (`self_attn.*`, the GLM indexer included).
    Attention,
    /// Other linear weights of the main layers (shared experts, dense MLP layers).
    DenseMlp,
    /// Every linear weight of the MTP layer(s), experts included.
    Mtp,
    /// The token embedding and `lm_head` when `--embeddings` quantizes them.
    Embeddings,
    /// Kept as in the source: norms, router, biases, embeddings, lm_head.
    Kept,
}

impl Class {
    /// Key in the report.
    pub fn key(self) -> &'static str {
        match self {
            Class::Experts => "experts",
            Class::Attention => "attention",
            Class::DenseMlp => "dense_mlp",
            Class::Mtp => "mtp",
            Class::Embeddings => "embeddings",
            Class::Kept => "kept",
        }
    }
}

/// One dense tensor to write.
#[derive(Clone, Debug)]
pub struct DenseItem {
    /// Name as in the checkpoint (and in the store).
    pub name: String,
    /// Shape as in the checkpoint (1-D or 2-D).
    pub shape: Vec<usize>,
    /// Target encoding.
    pub encoding: Encoding,
    /// Error class.
    pub class: Class,
}

/// One routed expert to write.
#[derive(Clone, Debug)]
pub struct ExpertItem {
    /// (layer, expert).
    pub key: ExpertKey,
    /// gate, up, down tensor names.
    pub names: [String; 3],
    /// Target encoding.
    pub encoding: Encoding,
    /// [`Class::Experts`] or [`Class::Mtp`].
    pub class: Class,
}

/// The whole plan, in write order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Dense tensors, sorted (non-layer tensors first, then by layer, then by name).
    pub dense: Vec<DenseItem>,
    /// Experts, by layer then expert.
    pub experts: Vec<ExpertItem>,
    /// Every layer holding routed experts.
    pub expert_layers: Vec<ExpertLayer>,
    /// Decoder layers including MTP layers.
    pub num_layers: u32,
    /// MTP layer indices (>= num_hidden_layers).
    pub mtp_layers: Vec<u32>,
    /// Source bytes to read (weights and scales), for progress.
    pub bytes_in: u64,
    /// Estimated store size, bytes.
    pub estimated_out: u64,
}

fn terr(tensor: &str, what: impl Into<String>) -> ConvertError {
    ConvertError::Tensor {
        tensor: tensor.to_string(),
        what: what.into(),
    }
}

/// Is this tensor kept exactly as in the source (not a linear weight)?
pub fn kept_as_source(name: &str, shape: &[usize]) -> bool {
    if shape.len() != 2 {
        return true;
    }
    let base = name.strip_suffix(".weight").unwrap_or(name);
    let last = base.rsplit('.').next().unwrap_or(base);
    last.contains("norm")
        || name.ends_with("mlp.gate.weight")
        || name.ends_with("block_sparse_moe.gate.weight")
        || name.contains("e_score_correction_bias")
        || name.contains("embed_tokens")
        || name == "lm_head.weight"
        || name.ends_with("shared_head.head.weight")
        || !name.ends_with(".weight")
}

/// A matrix view of a checkpoint tensor (1-D tensors as one row) with its FP8 scale.
pub fn source_matrix<'a>(
    ck: &'a Checkpoint,
    name: &'a str,
) -> Result<(
    SourceMatrix<'a>,
    Vec<(
        &'a crate::safetensors::Shard,
        &'a crate::safetensors::TensorInfo,
    )>,
)> {
    let (shard, info) = ck
        .get(name)
        .ok_or_else(|| terr(name, "missing from the checkpoint"))?;
    let (rows, cols) = match info.shape.len() {
        1 => (1, info.shape[0]),
        2 => (info.shape[0], info.shape[1]),
        0 => (1, 1),
        n => {
            return Err(terr(
                name,
                format!(
                    "has {n} dimensions {:?} ({}); only 1-D and 2-D tensors are supported",
                    info.shape, shard.name
                ),
            ))
        }
    };
    let mut regions = vec![(shard, info)];
    let scales = if info.dtype == Dtype::F8E4M3 {
        let sname_owned = format!("{name}_scale_inv");
        let Some((sk, si)) = ck.get(&sname_owned) else {
            return Err(terr(
                name,
                format!(
                    "is F8_E4M3 ({}) but its block scale {sname_owned} is missing",
                    shard.name
                ),
            ));
        };
        let sname: &'a str = ck.tensors.get_key_value(&sname_owned).expect("present").0;
        let (br, bc) = (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK));
        let ok_shape = si.shape == [br, bc] || (info.shape.len() == 1 && si.shape == [bc]);
        if !ok_shape {
            return Err(terr(
                sname,
                format!(
                    "scale shape {:?} ({}) does not match weight {name} {:?}: expected [{br}, {bc}] (128x128 blocks)",
                    si.shape, sk.name, info.shape
                ),
            ));
        }
        if si.dtype == Dtype::F8E4M3 {
            return Err(terr(
                sname,
                format!(
                    "scale dtype F8_E4M3 ({}); expected F32, BF16 or F16",
                    sk.name
                ),
            ));
        }
        regions.push((sk, si));
        Some(ScaleSource {
            name: sname,
            file: &sk.path,
            dtype: si.dtype,
            data: sk.data(si),
        })
    } else {
        None
    };
    Ok((
        SourceMatrix {
            name,
            file: &shard.path,
            dtype: info.dtype,
            rows,
            cols,
            data: shard.data(info),
            scales,
        },
        regions,
    ))
}

/// Builds and checks the plan: every tensor the architecture needs is present, shapes, dtypes
/// and scales are consistent, scales are finite, fp8 targets have FP8 sources.
///
/// # Errors
/// [`ConvertError::Tensor`] naming the tensor (missing, wrong shape, fused experts, unsupported
/// rank, fp8 refused, scale problems), [`ConvertError::NonFinite`] for a NaN/Inf scale,
/// [`ConvertError::Config`] for layers beyond the config.
pub fn build(ck: &Checkpoint, enc: Encodings, alignment: usize) -> Result<Plan> {
    let cfg = &ck.config;
    let nl = cfg.num_hidden_layers;
    let (h, i) = (cfg.hidden, cfg.intermediate);

    // Fused experts and stray layers.
    for name in ck.tensors.keys() {
        if name.contains(".experts.gate_up_proj")
            || name.contains(".experts.down_proj")
            || name.contains(".experts.w1")
            || name.contains(".experts.w13")
        {
            return Err(terr(
                name,
                "fused expert tensors (all experts in one [E, ...] tensor) are not supported: \
                 convert from a checkpoint with one tensor per expert matrix",
            ));
        }
        if let Some(l) = layer_of(name) {
            if l >= nl && !cfg.family.is_deepseek_like() {
                return Err(ConvertError::Config {
                    file: cfg.path.clone(),
                    what: format!("tensor {name} is in layer {l} but num_hidden_layers is {nl}"),
                });
            }
        }
    }
    let mtp_layers: Vec<u32> = ck
        .tensors
        .keys()
        .filter_map(|n| layer_of(n))
        .filter(|&l| l >= nl)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();

    // Required tensors.
    let mut required = cfg.required_global_tensors();
    for l in 0..nl {
        required.extend(cfg.required_layer_tensors(l));
    }
    for r in &required {
        if !ck.has(r) {
            let hint = if r == "model.norm.weight" || r == "lm_head.weight" {
                "is the last shard absent?"
            } else {
                "is a shard absent or the index incomplete?"
            };
            return Err(terr(r, format!("missing from the checkpoint: {hint}")));
        }
    }

    // Experts.
    let mut expert_layers = Vec::new();
    let mut experts = Vec::new();
    let mut expert_tensors = BTreeSet::new();
    let mut layers: Vec<(u32, bool)> = (0..nl)
        .filter(|&l| cfg.moe_layer[l as usize])
        .map(|l| (l, false))
        .collect();
    for &l in &mtp_layers {
        let any = (0..cfg.num_experts).any(|e| ck.has(&cfg.family.expert_names(l, e)[0]));
        if any {
            layers.push((l, true));
        }
    }
    for &(l, mtp) in &layers {
        expert_layers.push(ExpertLayer {
            layer: l,
            num_experts: cfg.num_experts,
        });
        let encoding = if mtp { enc.mtp } else { enc.experts };
        for e in 0..cfg.num_experts {
            let names = cfg.family.expert_names(l, e);
            let shapes = [[i, h], [i, h], [h, i]];
            for (n, want) in names.iter().zip(shapes) {
                let Some((shard, info)) = ck.get(n) else {
                    return Err(terr(
                        n,
                        format!(
                            "missing from the checkpoint (layer {l} expert {e}; config.json says {} experts per layer): is a shard absent?",
                            cfg.num_experts
                        ),
                    ));
                };
                if info.shape != want {
                    return Err(terr(
                        n,
                        format!(
                            "shape {:?} in {}, expected {want:?} (hidden_size {h}, intermediate size {i} from config.json)",
                            info.shape, shard.name
                        ),
                    ));
                }
                if encoding == Encoding::Fp8 && info.dtype != Dtype::F8E4M3 {
                    return Err(terr(
                        n,
                        format!(
                            "is {} in {}; the fp8 encoding keeps FP8 weights only: choose another encoding for experts",
                            info.dtype.name(),
                            shard.name
                        ),
                    ));
                }
                expert_tensors.insert(n.clone());
            }
            experts.push(ExpertItem {
                key: ExpertKey::new(l, e),
                names,
                encoding,
                class: if mtp { Class::Mtp } else { Class::Experts },
            });
        }
    }
    // Expert tensors that belong to no expected expert.
    for name in ck.tensors.keys() {
        let is_expert =
            name.contains(".mlp.experts.") || name.contains(".block_sparse_moe.experts.");
        if is_expert && !name.ends_with("_scale_inv") && !expert_tensors.contains(name) {
            return Err(terr(
                name,
                format!(
                    "routed expert tensor not expected by config.json ({} experts per layer, MoE layers {:?})",
                    cfg.num_experts,
                    layers.iter().map(|x| x.0).collect::<Vec<_>>()
                ),
            ));
        }
    }

    // Dense tensors.
    let fp8_checkpoint = ck
        .shards
        .iter()
        .any(|s| s.tensors.values().any(|t| t.dtype == Dtype::F8E4M3));
    let mut dense = Vec::new();
    for (name, &si) in &ck.tensors {
        if expert_tensors.contains(name) {
            continue;
        }
        let info = &ck.shards[si].tensors[name];
        if let Some(w) = name.strip_suffix("_scale_inv") {
            match ck.get(w) {
                Some((_, wi)) if wi.dtype == Dtype::F8E4M3 => continue,
                Some((ws, wi)) => {
                    return Err(terr(
                        name,
                        format!(
                            "is a block scale but its weight {w} is {} in {}, not F8_E4M3",
                            wi.dtype.name(),
                            ws.name
                        ),
                    ))
                }
                None => {
                    return Err(terr(
                        name,
                        format!("is a block scale but its weight {w} is missing"),
                    ))
                }
            }
        }
        if info.shape.len() > 2 {
            return Err(terr(
                name,
                format!(
                    "has {} dimensions {:?} ({}); only 1-D and 2-D tensors are supported",
                    info.shape.len(),
                    info.shape,
                    ck.shards[si].name
                ),
            ));
        }
        let layer = layer_of(name);
        let in_mtp = layer.is_some_and(|l| l >= nl);
        let is_embedding = name == "model.embed_tokens.weight" || name == "lm_head.weight";
        let (encoding, class) = if let (true, 2, Some(e)) =
            (is_embedding, info.shape.len(), enc.embeddings)
        {
            (e, Class::Embeddings)
        } else if kept_as_source(name, &info.shape) {
            let e = match info.dtype {
                Dtype::Bf16 => Encoding::Bf16,
                Dtype::F16 | Dtype::F32 => Encoding::F32,
                Dtype::F8E4M3 => Encoding::Fp8,
            };
            (e, Class::Kept)
        } else {
            let e = if in_mtp { enc.mtp } else { enc.dense };
            let class = if in_mtp {
                Class::Mtp
            } else if name.contains(".self_attn.") {
                Class::Attention
            } else {
                Class::DenseMlp
            };
            if e == Encoding::Fp8 && info.dtype != Dtype::F8E4M3 && fp8_checkpoint {
                // An FP8 checkpoint publishes a few linear weights in high precision (DeepSeek's
                // MTP eh_proj, GLM's indexer.weights_proj): the lossless store keeps them as in
                // the source.
                let keep = match info.dtype {
                    Dtype::Bf16 => Encoding::Bf16,
                    _ => Encoding::F32,
                };
                (keep, Class::Kept)
            } else if e == Encoding::Fp8 && info.dtype != Dtype::F8E4M3 {
                return Err(terr(
                    name,
                    format!(
                        "is {} in {} and the checkpoint has no FP8 weights; --{} fp8 keeps FP8 weights only: choose bf16 or int8",
                        info.dtype.name(),
                        ck.shards[si].name,
                        if in_mtp { "mtp" } else { "dense" }
                    ),
                ));
            } else {
                (e, class)
            }
        };
        dense.push(DenseItem {
            name: name.clone(),
            shape: info.shape.clone(),
            encoding,
            class,
        });
    }
    dense.sort_by(|a, b| {
        let ka = layer_of(&a.name).map_or(-1, i64::from);
        let kb = layer_of(&b.name).map_or(-1, i64::from);
        (ka, &a.name).cmp(&(kb, &b.name))
    });

    // Scales: shape, dtype, finite values (cheap: 1/16384 of the weights).
    let mut bytes_in = 0u64;
    let mut estimated_out = 0u64;
    let check = |name: &str| -> Result<(usize, usize, u64)> {
        let (m, regions) = source_matrix(ck, name)?;
        m.scales_f32()?;
        let b = regions.iter().map(|(_, t)| t.nbytes() as u64).sum();
        Ok((m.rows, m.cols, b))
    };
    for d in &dense {
        let (r, c, b) = check(&d.name)?;
        bytes_in += b;
        estimated_out += align_up(d.encoding.weight_bytes(r, c), SECTION_ALIGN) as u64
            + align_up(d.encoding.scale_bytes(r, c), SECTION_ALIGN) as u64;
    }
    for x in &experts {
        for n in &x.names {
            bytes_in += check(n)?.2;
        }
        estimated_out += RecordLayout::new(x.encoding, h, i).record_len(alignment) as u64;
    }
    estimated_out += 1 << 20; // headers, index, manifest, files
    Ok(Plan {
        dense,
        experts,
        expert_layers,
        num_layers: nl + mtp_layers.len() as u32,
        mtp_layers,
        bytes_in,
        estimated_out,
    })
}
