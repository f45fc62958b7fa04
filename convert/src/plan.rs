//! The conversion plan: every tensor's role and target encoding, checked before anything is
//! written (preflight).

use crate::checkpoint::Checkpoint;
use crate::error::{ConvertError, Result};
use crate::quant::{ScaleSource, SourceMatrix};
use crate::safetensors::Dtype;
use coli_format::encoding::{align_up, FP8_BLOCK, SECTION_ALIGN};
use coli_format::spec::{
    layer_of, ExpertStorage, ExpertsSpec, Family, LinearRole, TensorClass, TensorKind, TensorSpec,
};
use coli_format::{Encoding, ExpertKey, RecordLayout};
use coli_store::ExpertLayer;
use std::collections::{BTreeMap, BTreeSet};

/// The user's encoding choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Encodings {
    /// Routed experts of the main layers.
    pub experts: Encoding,
    /// Linear weights outside the routed experts (attention, shared experts, dense MLP, indexer)
    /// whose role has no choice of its own in [`Encodings::roles`].
    pub dense: Encoding,
    /// Per-role choices that override `dense` (`--attention`, `--indexer`, `--shared-experts`,
    /// `--dense-mlp`); empty by default.
    pub roles: RoleEncodings,
    /// Every linear weight of the MTP layer(s), their routed experts included; `None`
    /// (`--mtp none`): the MTP layer is not converted (listed as not converted, like tensors the
    /// model does not read).
    pub mtp: Option<Encoding>,
    /// The token embedding `model.embed_tokens.weight` and `lm_head.weight`: `None` keeps
    /// them as in the source (the default), `Some(Encoding::Int8)` stores them with per-row
    /// int8 scales (halves the bytes the output projection reads per decoded token; one row
    /// of the embedding is read per token).
    pub embeddings: Option<Encoding>,
}

/// Per-role encodings of the main layers' dense linear weights ([`LinearRole`]); `None` follows
/// [`Encodings::dense`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoleEncodings {
    /// Attention projections (`--attention`).
    pub attention: Option<Encoding>,
    /// The DSA indexer's `wq_b` and `wk` (`--indexer`); its `weights_proj` too, except that
    /// an int4 choice keeps `weights_proj` as in the source.
    pub indexer: Option<Encoding>,
    /// Shared experts (`--shared-experts`).
    pub shared_experts: Option<Encoding>,
    /// The MLP of dense layers (`--dense-mlp`).
    pub dense_mlp: Option<Encoding>,
}

impl RoleEncodings {
    /// The choice for `role`, if one was made.
    pub fn get(&self, role: LinearRole) -> Option<Encoding> {
        match role {
            LinearRole::Attention => self.attention,
            LinearRole::Indexer | LinearRole::IndexerWeights => self.indexer,
            LinearRole::SharedExperts => self.shared_experts,
            LinearRole::DenseMlp => self.dense_mlp,
        }
    }

    /// The choices made, as `(option name, encoding)` in a fixed order (the store's
    /// conversion parameters).
    pub fn chosen(&self) -> Vec<(&'static str, Encoding)> {
        [
            ("attention", self.attention),
            ("indexer", self.indexer),
            ("shared_experts", self.shared_experts),
            ("dense_mlp", self.dense_mlp),
        ]
        .into_iter()
        .filter_map(|(k, e)| e.map(|e| (k, e)))
        .collect()
    }
}

impl Encodings {
    /// Experts `experts`, every dense linear weight `dense`, MTP `mtp`, embeddings as in the
    /// source, no per-role choices.
    pub fn new(experts: Encoding, dense: Encoding, mtp: Encoding) -> Encodings {
        Encodings {
            experts,
            dense,
            roles: RoleEncodings::default(),
            mtp: Some(mtp),
            embeddings: None,
        }
    }

    /// The encoding chosen for a main-layer linear weight of `role` (before the rules that
    /// keep some tensors as in the source).
    pub fn for_role(&self, role: LinearRole) -> Encoding {
        self.roles.get(role).unwrap_or(self.dense)
    }
}

/// Class of a tensor for the quantization error report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Routed experts of the main layers.
    Experts,
    /// Attention linear weights (`self_attn.*` but the DSA indexer).
    Attention,
    /// The DSA indexer's linear weights (`self_attn.indexer.*`).
    Indexer,
    /// Shared experts of the MoE layers.
    SharedExperts,
    /// The MLP of dense layers.
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
            Class::Indexer => "indexer",
            Class::SharedExperts => "shared_experts",
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

/// Where one routed expert's matrices are in the checkpoint.
#[derive(Clone, Debug)]
pub enum ExpertSource {
    /// One tensor each: gate, up, down tensor names.
    PerMatrix([String; 3]),
    /// A slice of the layer's fused tensors ([`crate::fused`]).
    Fused {
        /// The layer's experts as the spec describes them.
        set: ExpertsSpec,
        /// The fused layout the checkpoint has ([`crate::fused::resolve_storage`]).
        storage: ExpertStorage,
        /// The fused tensors' names (weights, scales, biases).
        tensors: Vec<String>,
    },
}

/// One routed expert to write.
#[derive(Clone, Debug)]
pub struct ExpertItem {
    /// (layer, expert).
    pub key: ExpertKey,
    /// Its tensors.
    pub source: ExpertSource,
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
    /// The MTP layer's optional tensors the checkpoint does not hold, each with the main
    /// model's tensor that stands in (`model.layers.78.shared_head.head.weight` ->
    /// `lm_head.weight`), as the store's MANIFEST records them (`mtp_shared`).
    pub mtp_shared: BTreeMap<String, String>,
    /// Source bytes to read (weights and scales), for progress.
    pub bytes_in: u64,
    /// Estimated store size, bytes.
    pub estimated_out: u64,
    /// Checkpoint tensors the model does not read (not in its spec), not converted: what
    /// transformers reports as unused weights when it loads such a checkpoint.
    pub unused: Vec<String>,
}

fn terr(tensor: &str, what: impl Into<String>) -> ConvertError {
    ConvertError::Tensor {
        tensor: tensor.to_string(),
        what: what.into(),
    }
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
    // N-D tensors (stacked shared experts, convolution weights) are their leading dimensions'
    // product of rows of the last one, as the store keeps them (coli_format::matrix_dims).
    let (rows, cols) = coli_format::matrix_dims(&info.shape).unwrap_or((1, 1));
    let mut regions = vec![(shard, info)];
    if info.dtype == Dtype::I8 {
        return fp4_source(ck, name, shard, info).map(|(m, scale)| {
            regions.push(scale);
            (m, regions)
        });
    }
    let scales = if info.dtype == Dtype::F8E4M3 {
        let Some(sname_owned) = ck.scale_of(name) else {
            return Err(terr(
                name,
                format!(
                    "is F8_E4M3 ({}) but its block scale {name}_scale_inv (or .scale) is missing",
                    shard.name
                ),
            ));
        };
        let (sk, si) = ck.get(&sname_owned).expect("scale_of found it");
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
        if !matches!(
            si.dtype,
            Dtype::F32 | Dtype::Bf16 | Dtype::F16 | Dtype::F8E8M0
        ) {
            return Err(terr(
                sname,
                format!(
                    "scale dtype {} ({}); expected F32, BF16, F16 or F8_E8M0",
                    si.dtype.name(),
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

/// The encoding the converter stores dense tensor `t` in, when the checkpoint holds it as
/// `src` (`fp8_checkpoint`: the checkpoint has FP8 weights), with encodings `enc`; `role` is
/// the tensor's entry in [`coli_format::spec::ModelTensors::linear_roles`] (`None` for MTP
/// layers and tensors that are not linear weights): what `coli plan --checkpoint` counts (the
/// same rule as the conversion).
///
/// # Errors
/// As the conversion: a U8 dense tensor, fp8 asked of a checkpoint without FP8 weights.
pub fn dense_encoding(
    t: &TensorSpec,
    role: Option<LinearRole>,
    src: Dtype,
    enc: Encodings,
    fp8_checkpoint: bool,
) -> Result<Encoding> {
    dense_target(t, role, src, enc, fp8_checkpoint, "the checkpoint").map(|(e, _)| e)
}

/// The converter option that chooses the encoding of the linear weights of `role`
/// (`attention`, `indexer`, `shared-experts`, `dense-mlp`: `--attention` ...), and what the
/// role's weights are called in messages.
fn role_flag(role: LinearRole) -> (&'static str, &'static str) {
    match role {
        LinearRole::Attention => ("attention", "attention"),
        LinearRole::Indexer | LinearRole::IndexerWeights => ("indexer", "DSA indexer"),
        LinearRole::SharedExperts => ("shared-experts", "shared-expert"),
        LinearRole::DenseMlp => ("dense-mlp", "dense-layer MLP"),
    }
}

/// The option that chose the encoding of a main-layer linear weight of `role`: its role's, when
/// given, else `dense`.
fn role_option(role: Option<LinearRole>, enc: &Encodings) -> &'static str {
    match role {
        Some(r) if enc.roles.get(r).is_some() => role_flag(r).0,
        _ => "dense",
    }
}

/// The dense tensor's class for the error report and its target encoding, from what the
/// spec says it is: norms, biases and routers stay as in the source; the main embedding and
/// lm_head follow `--embeddings`; linear weights follow their role's choice (`--attention`,
/// `--indexer`, `--shared-experts`, `--dense-mlp`, else `--dense`; `--mtp` in an MTP layer).
/// An MTP layer's own embedding and head copies stay as in the source. The linear weights an
/// FP8 checkpoint publishes in high precision stay as in the source when the choice is fp8
/// (lossless), and the indexer's `weights_proj` also when it is int4.
fn dense_target(
    t: &TensorSpec,
    role: Option<LinearRole>,
    src: Dtype,
    enc: Encodings,
    fp8_checkpoint: bool,
    shard: &str,
) -> Result<(Encoding, Class)> {
    let as_source = match src {
        Dtype::Bf16 => Encoding::Bf16,
        Dtype::F16 | Dtype::F32 => Encoding::F32,
        Dtype::F8E4M3 => Encoding::Fp8,
        Dtype::U8 => {
            return Err(terr(
                &t.name,
                format!("is U8 in {shard}: only MXFP4 expert blocks and scales may be U8"),
            ))
        }
        Dtype::I8 | Dtype::F8E8M0 => {
            return Err(terr(
                &t.name,
                format!(
                    "is {} in {shard}: only FP4 experts (I8) and block scales (F8_E8M0) have this dtype",
                    src.name()
                ),
            ))
        }
        Dtype::I64 if t.kind == TensorKind::Lookup => Encoding::F32,
        Dtype::I64 => {
            return Err(terr(
                &t.name,
                format!(
                    "is I64 in {shard}: only lookup tables (DeepSeek-V4's ffn.gate.tid2eid) may be integers"
                ),
            ))
        }
    };
    let keep_high = match src {
        Dtype::Bf16 => Encoding::Bf16,
        _ => Encoding::F32,
    };
    let mtp = t.class == TensorClass::Mtp;
    Ok(match t.kind {
        TensorKind::Embedding | TensorKind::OutputHead if !mtp => match enc.embeddings {
            Some(e) => (e, Class::Embeddings),
            None => (as_source, Class::Kept),
        },
        TensorKind::Linear => {
            let e = match (mtp, role) {
                (true, _) => enc.mtp.unwrap_or(enc.dense),
                (false, Some(r)) => enc.for_role(r),
                (false, None) => enc.dense,
            };
            let class = match (mtp, role) {
                (true, _) => Class::Mtp,
                (false, Some(LinearRole::Attention)) => Class::Attention,
                (false, Some(LinearRole::Indexer | LinearRole::IndexerWeights)) => Class::Indexer,
                (false, Some(LinearRole::SharedExperts)) => Class::SharedExperts,
                (false, Some(LinearRole::DenseMlp)) => Class::DenseMlp,
                (false, None) if t.name.contains(".self_attn.") => Class::Attention,
                (false, None) => Class::DenseMlp,
            };
            let kept_high_precision = role.is_some_and(LinearRole::kept_high_precision);
            if e == Encoding::Fp8 && src != Dtype::F8E4M3 && fp8_checkpoint {
                // An FP8 checkpoint publishes a few linear weights in high precision (DeepSeek's
                // MTP eh_proj, GLM's indexer.weights_proj): the lossless store keeps them as in
                // the source.
                (keep_high, Class::Kept)
            } else if e == Encoding::Fp8 && src != Dtype::F8E4M3 {
                let option = if mtp { "mtp" } else { role_option(role, &enc) };
                return Err(terr(
                    &t.name,
                    format!(
                        "is {} in {shard} and the checkpoint has no FP8 weights; --{option} fp8 keeps FP8 weights only: choose {}",
                        src.name(),
                        if mtp { "bf16 or int8" } else { "bf16, int8 or int4-g64" },
                    ),
                ));
            } else if matches!(e, Encoding::Int4 { .. }) && kept_high_precision {
                // The published checkpoints keep the indexer's head weights in BF16 (it scores
                // every cached token); int4 is not asked of them (issue 23).
                let keep = if src == Dtype::F8E4M3 {
                    Encoding::Fp8
                } else {
                    keep_high
                };
                (keep, Class::Kept)
            } else {
                (e, class)
            }
        }
        _ => (as_source, Class::Kept),
    })
}

/// Builds and checks the plan against the model spec (`coli_format::spec`): every tensor the
/// model needs is present with the spec's shape, an MTP layer is present whole or not at all,
/// dtypes and FP8 scales are consistent, scales are finite, fp8 targets have FP8 sources.
/// An FP4 expert matrix as DeepSeek-V4 publishes it: `{stem}.weight` I8 `[rows, cols / 2]`
/// (two e2m1 codes per byte, low nibble first) with `{stem}.scale` F8_E8M0 (or U8)
/// `[rows, cols / 32]`: MXFP4's bits, row by row (FORMAT.md section 6). The source matrix is
/// `rows x cols` (logical), dtype I8, its scale the e8m0 bytes.
///
/// # Errors
/// [`ConvertError::Tensor`] naming the weight or its scale: no scale, a shape or dtype that
/// does not pair up, an e8m0 NaN scale (0xFF).
#[allow(clippy::type_complexity)]
fn fp4_source<'a>(
    ck: &'a Checkpoint,
    name: &'a str,
    shard: &'a crate::safetensors::Shard,
    info: &'a crate::safetensors::TensorInfo,
) -> Result<(
    SourceMatrix<'a>,
    (
        &'a crate::safetensors::Shard,
        &'a crate::safetensors::TensorInfo,
    ),
)> {
    let [rows, packed] = info.shape[..] else {
        return Err(terr(
            name,
            format!(
                "is I8 {:?} in {}: an FP4 matrix is [rows, cols / 2]",
                info.shape, shard.name
            ),
        ));
    };
    let cols = 2 * packed;
    let Some(sname_owned) = ck.scale_of(name).filter(|s| s.ends_with(".scale")) else {
        let scale = format!("{}.scale", name.trim_end_matches(".weight"));
        return Err(terr(
            name,
            format!(
                "holds FP4 codes in {} but its e8m0 scale {} is missing",
                shard.name,
                ck.renamed.get(&scale).unwrap_or(&scale)
            ),
        ));
    };
    let (sk, si) = ck.get(&sname_owned).expect("scale_of found it");
    let sname: &'a str = ck.tensors.get_key_value(&sname_owned).expect("present").0;
    if !cols.is_multiple_of(32)
        || si.shape != [rows, cols / 32]
        || !matches!(si.dtype, Dtype::F8E8M0 | Dtype::U8)
    {
        return Err(terr(
            sname,
            format!(
                "is {} {:?} ({}); the FP4 weight {name} {:?} needs F8_E8M0 [{rows}, {}] (one scale per 32 columns)",
                si.dtype.name(),
                si.shape,
                sk.name,
                info.shape,
                cols / 32
            ),
        ));
    }
    let data = sk.data(si);
    if let Some(k) = data.iter().position(|&b| b == 0xFF) {
        return Err(terr(
            sname,
            format!(
                "e8m0 scale [{}, {}] ({}) is the NaN code 0xFF",
                k / (cols / 32),
                k % (cols / 32),
                sk.name
            ),
        ));
    }
    Ok((
        SourceMatrix {
            name,
            file: &shard.path,
            dtype: Dtype::I8,
            rows,
            cols,
            data: shard.data(info),
            scales: Some(ScaleSource {
                name: sname,
                file: &sk.path,
                dtype: si.dtype,
                data,
            }),
        },
        (sk, si),
    ))
}

/// Tensors the model does not read are not converted ([`Plan::unused`]), so that the store
/// holds exactly what the engine loads.
///
/// # Errors
/// [`ConvertError::Tensor`] naming the tensor (missing, wrong shape, not part of the model,
/// fused experts, unsupported rank, fp8 refused, scale problems), [`ConvertError::NonFinite`]
/// for a NaN/Inf scale, [`ConvertError::Config`] for layers beyond the config.
pub fn build(ck: &Checkpoint, enc: Encodings, alignment: usize) -> Result<Plan> {
    let spec = &ck.spec;
    let nl = spec.num_layers as u32;
    let mtp_index = spec.mtp_layer().map(|n| n as u32);

    // Tensors that say the config is not the checkpoint's: a tensor the family reads only with
    // a config key this config lacks (Kimi K3's), compressed-tensors packed weights coli does not
    // read (`Checkpoint::open` lists the MXFP4 routed experts under the FP4 layout's names).
    for (name, &si) in &ck.tensors {
        let shard = &ck.shards[si].name;
        if let Some(key) = spec.key_to_read(name) {
            return Err(terr(
                name,
                format!(
                    "is in {shard} but config.json does not set {}{key}, without which the model does not read it: the config and the tensors describe different models",
                    if spec.wrapper.is_some() { "text_config." } else { "" }
                ),
            ));
        }
        if name.ends_with(".weight_packed") || name.ends_with(".weight_scale") {
            return Err(terr(
                name,
                format!(
                    "is a compressed-tensors packed weight in {shard}: coli reads packed weights as MXFP4 routed experts only (`experts.E.wN.weight_packed` U8 or I8 with its U8 `weight_scale`, config.json's quantization_config format mxfp4-pack-quantized); dequantize this one to BF16"
                ),
            ));
        }
    }

    // Fused experts in a layout the spec does not read, and stray layers.
    let fused_prefixes: BTreeSet<String> = spec
        .tensors
        .expert_sets()
        .iter()
        .filter(|s| {
            !matches!(
                crate::fused::resolve_storage(ck, s),
                ExpertStorage::PerExpert(_)
            )
        })
        .map(|s| format!("{}.", s.prefix))
        .collect();
    for name in ck.tensors.keys() {
        if !fused_prefixes.iter().any(|p| name.starts_with(p.as_str()))
            && (name.contains(".experts.gate_up_proj")
                || name.contains(".experts.down_proj")
                || name.contains(".experts.w1")
                || name.contains(".experts.w13"))
        {
            return Err(terr(
                name,
                "fused expert tensors (all experts in one [E, ...] tensor) in a layout coli does not \
                 read for this family: convert from a checkpoint with one tensor per expert \
                 matrix, or with transformers 5's `mlp.experts.gate_up_proj` [E, 2I, H] and \
                 `down_proj` [E, H, I] under the spec's expert prefix",
            ));
        }
        if let Some(l) = layer_of(name) {
            let unconverted_mtp = (l as usize) < nl as usize + spec.unconverted_mtp_layers;
            if l >= nl && Some(l) != mtp_index && !unconverted_mtp {
                let nextn = if spec.family.is_mla()
                    || matches!(spec.family, Family::Glm4Moe | Family::Glm5Next)
                {
                    format!(
                        " and num_nextn_predict_layers is {}",
                        spec.num_mtp_layers + spec.unconverted_mtp_layers
                    )
                } else {
                    String::new()
                };
                let shown = ck.renamed.get(name).unwrap_or(name);
                return Err(ConvertError::Config {
                    file: ck.dir.join("config.json"),
                    what: format!(
                        "tensor {shown} is in layer {l} but num_hidden_layers is {nl}{nextn}"
                    ),
                });
            }
        }
    }
    // The MTP layers are converted when the checkpoint holds any of them, and then whole
    // (never with `--mtp none`).
    let mtp_present = enc.mtp.is_some()
        && (mtp_index.is_some_and(|n| ck.tensors.keys().any(|t| layer_of(t) == Some(n)))
            || spec
                .tensors
                .mtp
                .iter()
                .any(|m| m.dense().iter().any(|t| ck.has(&t.name))));
    let mtp_layers: Vec<u32> = mtp_index.filter(|_| mtp_present).into_iter().collect();

    // Dense tensors the model reads.
    let mut wanted: Vec<&TensorSpec> = spec.tensors.main_dense();
    if mtp_present {
        for m in &spec.tensors.mtp {
            wanted.extend(m.dense());
        }
    }
    let roles = spec.tensors.linear_roles();
    for role in LinearRole::ALL {
        if let Some(e) = enc.roles.get(role) {
            if !roles.values().any(|&r| role_flag(r).0 == role_flag(role).0) {
                let (option, what) = role_flag(role);
                return Err(ConvertError::Usage(format!(
                    "--{option} {}: this {} model has no {what} weights; drop the option",
                    e.name(),
                    spec.model_type,
                )));
            }
        }
    }
    let mut dense_spec: BTreeMap<&str, &TensorSpec> = BTreeMap::new();
    for t in wanted {
        dense_spec.insert(&t.name, t);
        if t.optional || ck.has(&t.name) {
            continue;
        }
        let hint = if t.class == TensorClass::Mtp {
            let which = if t.name.starts_with("model.mtp.") {
                "model.mtp.*".to_string()
            } else if t.name.starts_with("mtp.") {
                "mtp.*".to_string()
            } else {
                format!("model.layers.{}", mtp_index.unwrap_or(nl))
            };
            format!(
                "missing from the checkpoint, which holds part of the MTP layer {which}: convert a checkpoint with the whole MTP layer or none of it"
            )
        } else if t.name == "model.norm.weight" || t.name == "lm_head.weight" {
            "missing from the checkpoint: is the last shard absent?".into()
        } else if t.kind == TensorKind::Lookup {
            // Which layers route by token id is config.json's (DeepSeek-V4: num_hash_layers).
            "missing from the checkpoint: config.json makes this layer hash-routed (num_hash_layers counts the first layers that route by token id); is num_hash_layers larger than the checkpoint's tables, or a shard absent?".into()
        } else if let Some(other) = other_block_tensor(ck, &t.name, &all_spec_names(spec)) {
            // The block is there with other tensors: config.json describes another layer.
            format!(
                "missing from the checkpoint, whose block holds {other} instead, which config.json does not describe: do config.json's layer kinds (layer_types and the family's layer lists) match the checkpoint?"
            )
        } else {
            "missing from the checkpoint: is a shard absent or the index incomplete?".into()
        };
        return Err(terr(&t.name, hint));
    }

    // The main model's embedding and lm_head stand in for an MTP layer's absent optional ones.
    let mut mtp_shared = BTreeMap::new();
    if mtp_present {
        let head = if ck.has(&spec.tensors.lm_head.name) {
            &spec.tensors.lm_head
        } else {
            &spec.tensors.embed
        };
        for m in &spec.tensors.mtp {
            for (t, main) in [(&m.embed, &spec.tensors.embed), (&m.head, head)] {
                if let Some(t) = t.as_ref().filter(|t| t.optional && !ck.has(&t.name)) {
                    mtp_shared.insert(t.name.clone(), main.name.clone());
                }
            }
        }
    }

    // Experts.
    let mut expert_sets: Vec<&ExpertsSpec> = spec
        .tensors
        .layers
        .iter()
        .filter_map(|l| l.experts())
        .collect();
    if mtp_present {
        expert_sets.extend(spec.tensors.mtp.iter().filter_map(|m| m.layer.experts()));
    }
    let mut expert_layers = Vec::new();
    let mut experts = Vec::new();
    let mut expert_tensors = BTreeSet::new();
    for set in &expert_sets {
        let (l, mtp) = (set.layer, set.class == TensorClass::Mtp);
        expert_layers.push(ExpertLayer {
            layer: l,
            num_experts: set.count,
        });
        let encoding = match enc.mtp {
            Some(e) if mtp => e,
            _ => enc.experts,
        };
        let storage = crate::fused::resolve_storage(ck, set);
        if !matches!(storage, ExpertStorage::PerExpert(_)) {
            let tensors = crate::fused::check(ck, set, storage)?;
            if encoding == Encoding::Mxfp4 && storage != ExpertStorage::FusedMxfp4 {
                return Err(terr(
                    &tensors[0],
                    "is not MXFP4; the mxfp4 encoding keeps MXFP4 experts only (copied as published): choose int4-g64, int8 or bf16 for experts",
                ));
            }
            if encoding == Encoding::Mxfp8 && storage != ExpertStorage::FusedW13Mxfp8 {
                return Err(terr(
                    &tensors[0],
                    "is not MXFP8; the mxfp8 encoding keeps MXFP8 experts only (copied as published): choose int4-g64, int8 or bf16 for experts",
                ));
            }
            if encoding == Encoding::Fp8 {
                return Err(terr(
                    &tensors[0],
                    "is not F8_E4M3; the fp8 encoding keeps FP8 weights only: choose another encoding for experts",
                ));
            }
            expert_tensors.extend(tensors.iter().cloned());
            for e in 0..set.count {
                experts.push(ExpertItem {
                    key: ExpertKey::new(l, e),
                    source: ExpertSource::Fused {
                        set: (*set).clone(),
                        storage,
                        tensors: tensors.clone(),
                    },
                    encoding,
                    class: if mtp { Class::Mtp } else { Class::Experts },
                });
            }
            continue;
        }
        let fp4 = ck
            .get(&set.tensor_names(0)[0])
            .is_some_and(|(_, i)| i.dtype == Dtype::I8);
        if encoding == Encoding::Mxfp8 || (encoding == Encoding::Mxfp4 && !fp4) {
            let n = set.tensor_names(0)[0].clone();
            let name = encoding.name();
            let upper = name.to_uppercase();
            return Err(terr(
                &n,
                format!("is not {upper}; the {name} encoding keeps {upper} experts only (copied as published): choose int4-g64, int8 or bf16 for experts"),
            ));
        }
        for e in 0..set.count {
            let tensors = set.tensors(e);
            for t in &tensors {
                let n = &t.name;
                let Some((shard, info)) = ck.get(n) else {
                    return Err(terr(
                        n,
                        format!(
                            "missing from the checkpoint (layer {l} expert {e}; config.json says {} experts per layer): is a shard absent?",
                            set.count
                        ),
                    ));
                };
                // FP4 experts (I8) hold two codes per byte.
                let want = if info.dtype == Dtype::I8 {
                    vec![t.shape[0], t.shape[1] / 2]
                } else {
                    t.shape.clone()
                };
                if info.shape != want {
                    return Err(terr(
                        n,
                        format!(
                            "shape {:?} in {}, expected {:?} ({} {}, intermediate size {} from config.json)",
                            info.shape,
                            shard.name,
                            want,
                            spec.expert_hidden_key(),
                            set.hidden,
                            set.intermediate
                        ),
                    ));
                }
                if encoding == Encoding::Mxfp4 && info.dtype != Dtype::I8 {
                    return Err(terr(
                        n,
                        format!(
                            "is {} in {}, not FP4; the mxfp4 encoding keeps MXFP4 / FP4 experts only (copied as published): choose int4-g64, int8 or bf16 for experts",
                            info.dtype.name(),
                            shard.name
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
                source: ExpertSource::PerMatrix(tensors.map(|t| t.name)),
                encoding,
                class: if mtp { Class::Mtp } else { Class::Experts },
            });
        }
    }

    // Dense tensors.
    let fp8_checkpoint = ck.has_block_fp8();
    let mut dense = Vec::new();
    let mut unused = Vec::new();
    for (name, &si) in &ck.tensors {
        if expert_tensors.contains(name) {
            continue;
        }
        let shard = &ck.shards[si];
        let info = &shard.tensors[name];
        if ck.weight_of_scale(name).is_some() {
            // A `.scale` companion (DeepSeek-V4): read with its weight.
            continue;
        }
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
        let Some(t) = dense_spec.get(name.as_str()) else {
            unused.push(name.clone());
            continue;
        };
        if !t.accepts_shape(&info.shape) {
            return Err(terr(
                name,
                format!(
                    "shape {:?} in {}, expected {:?}{} from config.json",
                    info.shape,
                    shard.name,
                    t.shape,
                    t.padded_len
                        .map(|p| format!(" or [{p}] (padded)"))
                        .unwrap_or_default()
                ),
            ));
        }
        let role = roles.get(name.as_str()).copied();
        let (encoding, class) =
            dense_target(t, role, info.dtype, enc, fp8_checkpoint, &shard.name)?;
        if t.kind == TensorKind::Lookup {
            check_expert_table(name, shard, info, spec.num_experts)?;
        }
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
        let biases = match &x.source {
            ExpertSource::PerMatrix(names) => {
                for n in names {
                    bytes_in += check(n)?.2;
                }
                false
            }
            ExpertSource::Fused { set, tensors, .. } => {
                bytes_in += crate::fused::regions(ck, tensors, x.key.expert, set.count)
                    .iter()
                    .map(|(_, t)| t.nbytes() as u64)
                    .sum::<u64>();
                set.biases
            }
        };
        estimated_out += RecordLayout::new(
            x.encoding,
            spec.expert_hidden(),
            spec.moe_intermediate_size,
            biases,
        )
        .record_len(alignment) as u64;
    }
    estimated_out += 1 << 20; // headers, index, manifest, files
    Ok(Plan {
        dense,
        experts,
        expert_layers,
        num_layers: nl + mtp_layers.len() as u32,
        mtp_layers,
        mtp_shared,
        bytes_in,
        estimated_out,
        unused,
    })
}

/// A hash router's table (DeepSeek-V4's `ffn.gate.tid2eid`, `[vocab, top_k]`): every value an
/// expert id below `experts` (a whole number whatever the dtype).
///
/// # Errors
/// [`ConvertError::Tensor`] naming the table, the position and the value.
fn check_expert_table(
    name: &str,
    shard: &crate::safetensors::Shard,
    info: &crate::safetensors::TensorInfo,
    experts: usize,
) -> Result<()> {
    let data = shard.data(info);
    let cols = info.shape.last().copied().unwrap_or(1).max(1);
    let n = data.len() / info.dtype.size();
    for i in 0..n {
        let v = crate::quant::decode(info.dtype, data, i);
        if !(v >= 0.0 && v.fract() == 0.0 && (v as usize) < experts) {
            let shown = match info.dtype {
                Dtype::I64 => {
                    i64::from_le_bytes(data[8 * i..8 * i + 8].try_into().expect("8 bytes"))
                        .to_string()
                }
                _ => v.to_string(),
            };
            return Err(terr(
                name,
                format!(
                    "holds {shown} at [{}, {}] ({}): a hash router's entries are expert ids below n_routed_experts {experts}",
                    i / cols,
                    i % cols,
                    shard.name
                ),
            ));
        }
    }
    Ok(())
}

/// Every tensor name the spec knows (dense tensors of the main and MTP layers, every expert's).
fn all_spec_names(spec: &coli_format::ModelSpec) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = spec
        .tensors
        .dense()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    for e in spec.tensors.expert_sets() {
        match e.storage {
            ExpertStorage::PerExpert(_) => {
                for x in 0..e.count {
                    names.extend(e.tensor_names(x));
                }
            }
            _ => names.extend(e.fused_tensors().into_iter().map(|(n, _, _)| n)),
        }
        // A per-expert family may be stored fused (transformers 5, Qwen3.5 as published).
        names.extend(["gate_up_proj", "down_proj"].map(|m| format!("{}.{m}", e.prefix)));
    }
    names
}

/// A tensor of the checkpoint in the block of `missing` (its name up to the last two
/// components, e.g. `model.layers.2.self_attn.`) that the spec does not know: a sign that
/// config.json gives the layer another kind than the checkpoint's (a KDA layer where the
/// weights are MLA's). None when the block holds only spec tensors or nothing.
fn other_block_tensor(ck: &Checkpoint, missing: &str, known: &BTreeSet<String>) -> Option<String> {
    let parts: Vec<&str> = missing.split('.').collect();
    if parts.len() < 4 {
        return None;
    }
    let block = format!("{}.", parts[..parts.len() - 2].join("."));
    // The block is inside a layer (`model.layers.L.self_attn.`), never a whole layer list: a
    // layer's own tensor (`model.layers.L.hc_attn_fn`) has no block to compare with.
    layer_of(&block)?;
    ck.tensors
        .keys()
        // Weights only: buffers some releases ship (`rotary_emb.inv_freq`) are no sign.
        .find(|n| n.starts_with(&block) && n.ends_with(".weight") && !known.contains(n.as_str()))
        .cloned()
}
