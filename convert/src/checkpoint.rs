//! A local Hugging Face checkpoint directory: config, index, shards, tokenizer files.

use crate::error::{ConvertError, Result};
use crate::safetensors::{parse_json_strict, Shard, TensorInfo};
use crate::tiktoken::Tiktoken;
use coli_format::{FormatError, ModelSpec};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The index file name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Model files copied into the store's `files/` when present (config.json is copied by the
/// writer from [`coli_store::StoreSpec::config_json`]).
pub const COPIED_FILES: &[&str] = &[
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
];

/// An opened, validated checkpoint (headers parsed, shards memory-mapped, no data read yet).
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// config.json bytes, unchanged.
    pub config_bytes: Vec<u8>,
    /// The model spec read from config.json (and generation_config.json): every tensor the
    /// model needs.
    pub spec: ModelSpec,
    /// Shards, sorted by file name.
    pub shards: Vec<Shard>,
    /// Every tensor: name -> index into `shards`. Names are the spec's
    /// ([`ModelSpec::canonical_tensor_name`]): a multimodal wrapper's language-model prefix is
    /// removed, its other tensors are in `outside_model` instead; transformers 5's renaming of
    /// the family is undone (Mixtral's `mlp` is `block_sparse_moe` again).
    pub tensors: BTreeMap<String, usize>,
    /// Tensors of a multimodal wrapper outside its language model (vision tower, projector),
    /// as named in the checkpoint: not converted.
    pub outside_model: Vec<String>,
    /// The checkpoint's own name of every tensor whose name in `tensors` differs (a wrapper's
    /// prefix, transformers 5's renaming), for errors: spec name -> checkpoint name.
    pub renamed: BTreeMap<String, String>,
    /// Optional model files present (name, bytes), in [`COPIED_FILES`] order; a tokenizer.json
    /// written from `tiktoken.model` when the checkpoint has none ([`crate::tiktoken`]).
    pub extra_files: Vec<(String, Vec<u8>)>,
    /// What became of a `tiktoken.model` (written as tokenizer.json, or skipped and why), for
    /// the conversion report; None without one.
    pub tokenizer_note: Option<String>,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| ConvertError::io(path, e))
}

impl Checkpoint {
    /// Opens a checkpoint directory: parses config.json, the index (or the single
    /// model.safetensors), and every shard header the index names.
    ///
    /// # Errors
    /// [`ConvertError::Config`] for a missing/invalid config.json or index, a shard name with a
    /// path separator, or an index entry whose shard lacks the tensor; [`ConvertError::Safetensors`]
    /// for a shard named in the index that is missing or invalid (see [`Shard::open`]) or a
    /// tensor present in two shards.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.is_file() {
            return Err(ConvertError::Config {
                file: cfg_path,
                what: "missing: INPUT_DIR must be a Hugging Face checkpoint directory with config.json".into(),
            });
        }
        let config_bytes = read(&cfg_path)?;
        let cfg_text = std::str::from_utf8(&config_bytes).map_err(|e| ConvertError::Config {
            file: cfg_path.clone(),
            what: format!("not UTF-8: {e}"),
        })?;
        let cfg_json = parse_json_strict(cfg_text).map_err(|e| ConvertError::Config {
            file: cfg_path.clone(),
            what: format!("invalid JSON: {e}"),
        })?;
        let gen_path = dir.join("generation_config.json");
        let gen_json = if gen_path.is_file() {
            let text = read(&gen_path)?;
            let v = std::str::from_utf8(&text)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_json_strict(t).map_err(|e| e.to_string()))
                .map_err(|e| ConvertError::Config {
                    file: gen_path.clone(),
                    what: format!("invalid JSON: {e}"),
                })?;
            Some(v)
        } else {
            None
        };
        let spec = ModelSpec::from_config(&cfg_json, gen_json.as_ref())
            .map_err(|e| spec_error(e, &cfg_path, &gen_path))?;

        let index_path = dir.join(INDEX_FILE);
        let mut weight_map: BTreeMap<String, String> = BTreeMap::new();
        let shard_names: Vec<String> = if index_path.exists() {
            let text = read(&index_path)?;
            let bad = |what: String| ConvertError::Config {
                file: index_path.clone(),
                what,
            };
            let text = std::str::from_utf8(&text).map_err(|e| bad(format!("not UTF-8: {e}")))?;
            let v = parse_json_strict(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
            let wm = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
            for (k, f) in wm {
                let f = f
                    .as_str()
                    .ok_or_else(|| bad(format!("weight_map[\"{k}\"] is not a file name")))?;
                if f.is_empty() || f.contains('/') || f.contains('\\') || f == "." || f == ".." {
                    return Err(bad(format!(
                        "weight_map[\"{k}\"] = \"{f}\" is not a plain file name in the checkpoint directory"
                    )));
                }
                weight_map.insert(k.clone(), f.to_string());
            }
            let mut names: Vec<String> = weight_map.values().cloned().collect();
            names.sort();
            names.dedup();
            if names.is_empty() {
                return Err(bad("weight_map is empty".into()));
            }
            names
        } else if dir.join(SINGLE_FILE).exists() {
            vec![SINGLE_FILE.to_string()]
        } else {
            return Err(ConvertError::Config {
                file: index_path,
                what: format!(
                    "missing, and there is no {SINGLE_FILE} either: not a safetensors checkpoint"
                ),
            });
        };

        let mut shards = Vec::with_capacity(shard_names.len());
        for name in &shard_names {
            let p = dir.join(name);
            if !p.exists() {
                return Err(ConvertError::Safetensors {
                    file: p,
                    what: format!(
                        "shard named in {INDEX_FILE} is missing: download it (the checkpoint is incomplete)"
                    ),
                });
            }
            shards.push(Shard::open(&p, name)?);
        }
        let mut tensors = BTreeMap::new();
        for (i, s) in shards.iter().enumerate() {
            for name in s.tensors.keys() {
                if let Some(&j) = tensors.get(name) {
                    let other: &Shard = &shards[j];
                    return Err(ConvertError::Safetensors {
                        file: s.path.clone(),
                        what: format!(
                            "tensor {name} is also in {}: a tensor must be in one shard only",
                            other.name
                        ),
                    });
                }
                tensors.insert(name.clone(), i);
            }
        }
        for (t, f) in &weight_map {
            let i = shard_names.binary_search(f).expect("shard listed");
            if !shards[i].tensors.contains_key(t) {
                return Err(ConvertError::Config {
                    file: index_path.clone(),
                    what: format!(
                        "weight_map says {t} is in {f}, but {f}'s header has no such tensor"
                    ),
                });
            }
        }
        let mut outside_model = Vec::new();
        let mut renamed = BTreeMap::new();
        if spec.wrapper.is_some() || !spec.transformers5_renames().is_empty() {
            tensors.clear();
            for (i, shard) in shards.iter_mut().enumerate() {
                let own = std::mem::take(&mut shard.tensors);
                for (name, info) in own {
                    match spec.canonical_tensor_name(&name) {
                        Some(c) => {
                            let c = c.into_owned();
                            if c != name {
                                renamed.insert(c.clone(), name.clone());
                            }
                            if tensors.insert(c.clone(), i).is_some() {
                                return Err(ConvertError::Safetensors {
                                    file: shard.path.clone(),
                                    what: format!(
                                        "tensor {name} and another tensor both name the language model's {c}"
                                    ),
                                });
                            }
                            shard.tensors.insert(c, info);
                        }
                        None => outside_model.push(name),
                    }
                }
            }
        }
        if coli_format::spec::kimi_linear::declares_mxfp4_pack(&cfg_json) {
            read_packed_mxfp4(&mut shards, &mut tensors, &mut renamed);
        }
        let mut extra_files = Vec::new();
        let mut tokenizer_note = None;
        for f in COPIED_FILES {
            let p = dir.join(f);
            if p.is_file() {
                extra_files.push((f.to_string(), read(&p)?));
            } else if *f == "tokenizer.json" {
                match crate::tiktoken::convert(dir)? {
                    Some(Tiktoken::Converted {
                        tokenizer_json,
                        note,
                    }) => {
                        extra_files.push((f.to_string(), tokenizer_json));
                        tokenizer_note = Some(note);
                    }
                    Some(Tiktoken::Skipped(why)) => tokenizer_note = Some(why),
                    None => {}
                }
            }
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config_bytes,
            spec,
            shards,
            tensors,
            outside_model,
            renamed,
            extra_files,
            tokenizer_note,
        })
    }

    /// The shard and header entry of a tensor.
    pub fn get(&self, name: &str) -> Option<(&Shard, &TensorInfo)> {
        let &i = self.tensors.get(name)?;
        let s = &self.shards[i];
        Some((s, &s.tensors[name]))
    }

    /// `e` with a tensor named as the checkpoint names it (where [`Checkpoint::renamed`] has
    /// it, or, for a tensor the checkpoint lacks, as its other renamed tensors would: a
    /// wrapper's `model.language_model.` prefix), the spec's name added.
    pub fn in_checkpoint_names(&self, e: ConvertError) -> ConvertError {
        match e {
            ConvertError::Tensor { tensor, what } => {
                match self
                    .renamed
                    .get(&tensor)
                    .cloned()
                    .or_else(|| self.own_name(&tensor))
                {
                    Some(own) => ConvertError::Tensor {
                        tensor: own,
                        what: format!("(read as {tensor}) {what}"),
                    },
                    None => ConvertError::Tensor { tensor, what },
                }
            }
            e => e,
        }
    }

    /// The name a `model.`-prefixed tensor would have in this checkpoint, by the prefix its
    /// renamed `model.` tensors carry (`model.language_model.` for `model.`); None when none is
    /// renamed so.
    fn own_name(&self, canonical: &str) -> Option<String> {
        let rest = canonical.strip_prefix("model.")?;
        self.renamed.iter().find_map(|(c, own)| {
            let tail = c.strip_prefix("model.")?;
            let prefix = own.strip_suffix(tail)?;
            (prefix != "model.").then(|| format!("{prefix}{rest}"))
        })
    }

    /// True if the checkpoint has this tensor.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Whether the checkpoint holds block-FP8 weights: an F8_E4M3 tensor with its 128x128
    /// block scale ([`Checkpoint::scale_of`]: the published FP8 layout `--dense fp8` keeps).
    /// MXFP8 experts (U8 `_scale` per 32 columns) are not: their dense tensors are high
    /// precision.
    pub fn has_block_fp8(&self) -> bool {
        self.tensors.keys().any(|name| {
            self.get(name)
                .is_some_and(|(_, info)| info.dtype == crate::safetensors::Dtype::F8E4M3)
                && self.scale_of(name).is_some()
        })
    }

    /// The block-scale companion the checkpoint holds for weight `name`: `{name}_scale_inv`
    /// (the FP8 layout of DeepSeek-V3 and most releases: inverse scales in F32/BF16), else the
    /// `{stem}.scale` of a `{stem}.weight` (DeepSeek-V4's FP8 and FP4 weights: F8_E8M0 powers of
    /// two).
    pub fn scale_of(&self, name: &str) -> Option<String> {
        let inv = format!("{name}_scale_inv");
        if self.has(&inv) {
            return Some(inv);
        }
        let scale = format!("{}.scale", name.strip_suffix(".weight")?);
        self.has(&scale).then_some(scale)
    }

    /// The weight whose block-scale companion tensor `name` is ([`Checkpoint::scale_of`]): a
    /// `{stem}.scale` beside an F8_E4M3 or I8 `{stem}.weight`. None for anything else (a
    /// `_scale_inv` is checked on its own; a `.scale` of a model's own, such as Inkling 2's
    /// `q_l2_clip.scale`, has no such weight).
    pub fn weight_of_scale(&self, name: &str) -> Option<String> {
        use crate::safetensors::Dtype;
        let w = format!("{}.weight", name.strip_suffix(".scale")?);
        self.get(&w)
            .is_some_and(|(_, i)| matches!(i.dtype, Dtype::F8E4M3 | Dtype::I8))
            .then_some(w)
    }
}

/// compressed-tensors' `mxfp4-pack-quantized` weights (Kimi K3's routed experts): a
/// `{stem}.weight_packed` U8 `[rows, cols / 2]` (e2m1 codes, element `2i` in the low nibble)
/// with its `{stem}.weight_scale` U8 `[rows, cols / 32]` (e8m0) are MXFP4's bits in
/// DeepSeek-V4's FP4 layout, which the converter reads as an I8 `{stem}.weight` with its
/// `{stem}.scale`: the pair is listed under those names (the checkpoint's own names kept in
/// `renamed` for errors) and the codes' dtype read as I8 (the same bytes; some re-saves store
/// them as I8 already). Only the routed experts' (`.experts.E.`), and only when config.json
/// declares `mxfp4-pack-quantized` (the caller checks): other packed tensors keep their names,
/// which the converter refuses. A `weight_packed` without its scale is renamed alone (the
/// converter then names the missing `weight_scale`).
fn read_packed_mxfp4(
    shards: &mut [Shard],
    tensors: &mut BTreeMap<String, usize>,
    renamed: &mut BTreeMap<String, String>,
) {
    use crate::safetensors::Dtype;
    let packed: Vec<String> = tensors
        .keys()
        .filter(|n| n.ends_with(".weight_packed"))
        .cloned()
        .collect();
    for name in packed {
        let stem = name.trim_end_matches(".weight_packed");
        let scale = format!("{stem}.weight_scale");
        let i = tensors[&name];
        let taken = tensors.contains_key(&format!("{stem}.weight"))
            || tensors.contains_key(&format!("{stem}.scale"));
        let codes = matches!(shards[i].tensors[&name].dtype, Dtype::U8 | Dtype::I8);
        if !codes || taken || !name.contains(".experts.") {
            continue;
        }
        let own_stem = renamed
            .get(&name)
            .map_or(stem, |own| own.trim_end_matches(".weight_packed"))
            .to_string();
        // Without its scale the codes still read as FP4, so that the error names the missing
        // `weight_scale` (recorded as the checkpoint's name of `{stem}.scale`).
        let mut pairs = vec![(name.clone(), format!("{stem}.weight"), i)];
        match tensors.get(&scale).copied() {
            Some(j) => pairs.push((scale, format!("{stem}.scale"), j)),
            None => {
                renamed.insert(format!("{stem}.scale"), format!("{own_stem}.weight_scale"));
            }
        }
        for (from, to, shard) in pairs {
            let mut info = shards[shard].tensors.remove(&from).expect("listed");
            if from.ends_with("_packed") {
                info.dtype = Dtype::I8;
            }
            shards[shard].tensors.insert(to.clone(), info);
            tensors.remove(&from);
            tensors.insert(to.clone(), shard);
            let own = renamed.remove(&from).unwrap_or(from);
            renamed.insert(to, own);
        }
    }
}

/// A spec error as the converter reports it: naming the full path of the config file.
fn spec_error(e: FormatError, config: &Path, generation_config: &Path) -> ConvertError {
    let file = |f: &str| {
        if f == "generation_config.json" {
            generation_config.to_path_buf()
        } else {
            config.to_path_buf()
        }
    };
    match e {
        FormatError::Config { file: f, what } | FormatError::Format { file: f, what } => {
            ConvertError::Config {
                file: file(&f),
                what,
            }
        }
        e @ (FormatError::Unsupported(_) | FormatError::NewerVersion { .. }) => {
            ConvertError::Config {
                file: config.to_path_buf(),
                what: e.to_string(),
            }
        }
    }
}
