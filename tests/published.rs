//! Layout replicas of published releases (issue 41): a checkpoint with exactly a release's
//! tensor *names* and dtypes, at tiny widths, written at test time from a committed listing
//! (`tests/fixtures/published/<release>.tensors.txt`; notation and sources in that directory's
//! README and `listing.py`).
//!
//! The listing is the independent part: it was read from the release's own index (or a public
//! loader that lists it), never from coli's spec. The spec only gives each listed tensor its
//! tiny shape (a tensor the spec does not know gets a small vector: the converter must then
//! report it as not converted, and the listing must say so in a `# not-read:` line). The
//! config is the release's `config.json` (`docs/configs/`) with its widths shrunk (the layer
//! and expert counts, which the names spell out, stay) plus the listing's `# tiny:` overrides.

use coli_format::spec::ExpertStorage;
use coli_format::ModelSpec;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// A parsed listing.
pub struct Listing {
    /// The release (`# release:`).
    pub release: String,
    /// `# config:`: the release's config.json, relative to the repository root.
    pub config: PathBuf,
    /// `# tiny:` JSON objects merged into the shrunk config (dotted keys reach into objects).
    pub tiny: Vec<Value>,
    /// `# not-read:` name prefixes the converter may leave out (vision towers, ...); an entry
    /// written `*SUFFIX` is a name suffix instead (`*.rotary_emb.inv_freq`, a derived buffer).
    pub not_read: Vec<String>,
    /// Every tensor: name -> dtype, expanded.
    pub tensors: BTreeMap<String, String>,
}

impl Listing {
    /// Whether the listing declares `name` as not read by coli (`# not-read:`).
    pub fn is_not_read(&self, name: &str) -> bool {
        self.not_read.iter().any(|p| match p.strip_prefix('*') {
            Some(suffix) => name.ends_with(suffix),
            None => name.starts_with(p.as_str()),
        })
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The listing file of `release`.
pub fn listing_path(release: &str) -> PathBuf {
    repo_root()
        .join("tests/fixtures/published")
        .join(format!("{release}.tensors.txt"))
}

/// Expands the brace sets of a listing name: `{0..2,5}` is 0, 1, 2 and 5; several sets give
/// every combination.
///
/// # Panics
/// On a malformed set.
pub fn expand(name: &str) -> Vec<String> {
    let Some(open) = name.find('{') else {
        return vec![name.to_string()];
    };
    let close = open + name[open..].find('}').expect("closing brace");
    let mut out = Vec::new();
    for part in name[open + 1..close].split(',') {
        let (a, b) = match part.split_once("..") {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let (a, b): (u64, u64) = (a.parse().expect("number"), b.parse().expect("number"));
        for v in a..=b {
            out.extend(expand(&format!(
                "{}{v}{}",
                &name[..open],
                &name[close + 1..]
            )));
        }
    }
    out
}

/// Reads the listing of `release`.
///
/// # Panics
/// On a malformed listing (the message names the line).
pub fn read_listing(release: &str) -> Listing {
    read_listing_file(&listing_path(release))
}

/// Reads the listing in the file `path`.
///
/// # Panics
/// On a malformed listing (the message names the line).
pub fn read_listing_file(path: &Path) -> Listing {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut l = Listing {
        release: String::new(),
        config: PathBuf::new(),
        tiny: Vec::new(),
        not_read: Vec::new(),
        tensors: BTreeMap::new(),
    };
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim();
            if let Some(v) = c.strip_prefix("release:") {
                l.release = v.trim().to_string();
            } else if let Some(v) = c.strip_prefix("config:") {
                l.config = PathBuf::from(v.split_whitespace().next().unwrap_or_default());
            } else if let Some(v) = c.strip_prefix("tiny:") {
                l.tiny
                    .push(serde_json::from_str(v.trim()).unwrap_or_else(|e| {
                        panic!("{}:{}: # tiny: is not JSON: {e}", path.display(), i + 1)
                    }));
            } else if let Some(v) = c.strip_prefix("not-read:") {
                l.not_read.extend(v.split_whitespace().map(|p| {
                    if p.starts_with('*') {
                        p.to_string()
                    } else {
                        p.trim_end_matches('*').to_string()
                    }
                }));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(name), Some(dtype), None) = (it.next(), it.next(), it.next()) else {
            panic!("{}:{}: expected `NAME DTYPE`", path.display(), i + 1);
        };
        for n in expand(name) {
            if l.tensors.insert(n.clone(), dtype.to_string()).is_some() {
                panic!("{}:{}: {n} listed twice", path.display(), i + 1);
            }
        }
    }
    assert!(
        !l.release.is_empty() && !l.config.as_os_str().is_empty(),
        "{}: needs `# release:` and `# config:` lines",
        path.display()
    );
    l
}

/// Widths shrunk to tiny sizes wherever a config names them (top level and `text_config`);
/// layer and expert counts are left as they are.
const TINY_WIDTHS: [(&str, u64); 17] = [
    ("hidden_size", 64),
    ("intermediate_size", 128),
    ("moe_intermediate_size", 64),
    ("dense_intermediate_size", 128),
    ("shared_expert_intermediate_size", 64),
    ("num_attention_heads", 4),
    ("num_key_value_heads", 2),
    ("head_dim", 16),
    ("q_lora_rank", 32),
    ("kv_lora_rank", 32),
    ("qk_nope_head_dim", 16),
    ("qk_rope_head_dim", 16),
    ("v_head_dim", 16),
    ("index_n_heads", 4),
    ("index_head_dim", 32),
    ("index_topk", 8),
    ("vocab_size", 256),
];

fn set_dotted(v: &mut Value, key: &str, value: Value) {
    match key.split_once('.') {
        Some((a, rest)) => set_dotted(&mut v[a], rest, value),
        None if value.is_null() => {
            if let Some(o) = v.as_object_mut() {
                o.remove(key);
            }
        }
        None => v[key] = value,
    }
}

fn shrink(cfg: &mut Value) {
    let vocab = TINY_WIDTHS
        .iter()
        .find(|(k, _)| *k == "vocab_size")
        .map(|t| t.1)
        .expect("vocab");
    let obj = cfg.as_object_mut().expect("config object");
    for (k, v) in TINY_WIDTHS {
        if obj.contains_key(k) {
            obj.insert(k.to_string(), json!(v));
        }
    }
    // Special token ids inside the tiny vocabulary.
    for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        let fix = |x: &Value| match x.as_u64() {
            Some(n) if n >= vocab => json!(vocab - 1 - (n % 8)),
            _ => x.clone(),
        };
        if let Some(x) = obj.get(k).cloned() {
            let y = match &x {
                Value::Array(a) => Value::Array(a.iter().map(fix).collect()),
                other => fix(other),
            };
            obj.insert(k.to_string(), y);
        }
    }
    if let Some(t) = obj.get_mut("text_config") {
        shrink(t);
    }
}

/// The replica's config.json: the release's, shrunk, with the listing's overrides.
///
/// # Panics
/// When the config file is unreadable.
pub fn tiny_config(l: &Listing) -> Value {
    let path = repo_root().join(&l.config);
    let mut cfg: Value = serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    shrink(&mut cfg);
    for o in &l.tiny {
        for (k, v) in o.as_object().expect("# tiny: takes a JSON object") {
            set_dotted(&mut cfg, k, v.clone());
        }
    }
    cfg
}

/// Every tensor the spec knows, by its checkpoint name: shape.
fn spec_shapes(spec: &ModelSpec) -> HashMap<String, Vec<usize>> {
    let mut m = HashMap::new();
    for t in spec.tensors.dense() {
        m.insert(t.name.clone(), t.shape.clone());
    }
    for set in spec.tensors.expert_sets() {
        match set.storage {
            ExpertStorage::PerExpert(_) => {
                for e in 0..set.count {
                    for t in set.tensors(e) {
                        m.insert(t.name.clone(), t.shape.clone());
                    }
                }
                // A release may store them fused instead (Qwen3.5: the converter reads that
                // layout as `FusedConcat`).
                let (e, h, i, p) = (
                    set.count as usize,
                    set.hidden,
                    set.intermediate,
                    &set.prefix,
                );
                m.insert(format!("{p}.gate_up_proj"), vec![e, 2 * i, h]);
                m.insert(format!("{p}.down_proj"), vec![e, h, i]);
            }
            _ => {
                for (n, s, _) in set.fused_tensors() {
                    m.insert(n, s);
                }
            }
        }
    }
    m
}

/// A small deterministic generator (xorshift64*), seeded by a tensor's name.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        Rng(h | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The bytes of tensor `name` (`dtype`, `shape`): random weights of scale 1/sqrt(cols), norms
/// near 1, biases near 0, FP8 codes of moderate magnitude, MXFP4 codes with e8m0 scales near
/// 2^-4.
fn tensor_bytes(name: &str, dtype: &str, shape: &[usize]) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let cols = *shape.last().unwrap_or(&1) as f32;
    let mut r = Rng::new(name);
    let norm = name.contains("norm");
    let bias = name.ends_with("bias") || name.contains("correction");
    let value = |r: &mut Rng| -> f32 {
        if norm {
            1.0 + 0.1 * r.unit()
        } else if bias {
            0.05 * r.unit()
        } else {
            r.unit() / cols.sqrt()
        }
    };
    match dtype {
        "BF16" => (0..n)
            .flat_map(|_| (((value(&mut r).to_bits() + 0x8000) >> 16) as u16).to_le_bytes())
            .collect(),
        "F16" => (0..n)
            .flat_map(|_| half_bits(value(&mut r)).to_le_bytes())
            .collect(),
        "F32" if name.ends_with("_scale_inv") => (0..n)
            .flat_map(|_| (0.02 * (1.0 + 0.5 * r.unit().abs())).to_le_bytes())
            .collect(),
        "F32" => (0..n).flat_map(|_| value(&mut r).to_le_bytes()).collect(),
        // e4m3 codes with exponents 4..=9 (|x| in [2^-3, 2^3)), random sign and mantissa.
        "F8_E4M3" => (0..n)
            .map(|_| {
                let x = r.next();
                ((x & 0x80) as u8) | ((4 + (x >> 8) % 6) as u8) << 3 | ((x >> 16) & 7) as u8
            })
            .collect(),
        "U8" if name.ends_with("_scales") || name.ends_with(".weight_scale") => {
            (0..n).map(|_| 121 + (r.next() % 4) as u8).collect()
        }
        "U8" | "I8" => (0..n).map(|_| r.next() as u8).collect(),
        // e8m0 block scales near 2^-4.
        "F8_E8M0" => (0..n).map(|_| 121 + (r.next() % 4) as u8).collect(),
        other => panic!("{name}: dtype {other} is not generated"),
    }
}

/// f32 -> IEEE half bits (round to nearest even; the replica's values are normal halves).
fn half_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if exp <= 0 {
        return sign;
    }
    let mant = b & 0x7f_ffff;
    let mut h = ((exp as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

/// A written replica.
pub struct Replica {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The listing it was written from.
    pub listing: Listing,
    /// Listed tensors the tiny spec has no shape for (written as 8-element vectors).
    pub unknown: Vec<String>,
}

/// Writes the replica of `release` into `dir` (created): config.json, `shards` safetensors
/// shards of the listing's tensors in name order, and model.safetensors.index.json.
///
/// # Panics
/// On a listing or config the spec cannot read, or I/O errors.
pub fn write_replica(release: &str, dir: &Path, shards: usize) -> Replica {
    write_replica_of(read_listing(release), dir, shards)
}

/// [`write_replica`] of a listing already read.
///
/// # Panics
/// As [`write_replica`].
pub fn write_replica_of(listing: Listing, dir: &Path, shards: usize) -> Replica {
    let release = listing.release.clone();
    let cfg = tiny_config(&listing);
    std::fs::create_dir_all(dir).expect("create replica dir");
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(&cfg).expect("config"),
    )
    .expect("write config");
    let spec = ModelSpec::from_config(&cfg, None)
        .unwrap_or_else(|e| panic!("{release}: the tiny config is refused: {e}"));
    let shapes = spec_shapes(&spec);
    let mut unknown = Vec::new();
    let shape_of = |name: &str, unknown: &mut Vec<String>| -> Vec<usize> {
        let canonical = spec
            .canonical_tensor_name(name)
            .map(|c| c.into_owned())
            .unwrap_or_else(|| name.to_string());
        if let Some(s) = shapes.get(&canonical) {
            return s.clone();
        }
        if let Some(w) = canonical.strip_suffix("_scale_inv") {
            if let Some(s) = shapes.get(w) {
                return s.iter().map(|d| d.div_ceil(128)).collect();
            }
        }
        // DeepSeek-V4's `.scale` beside a `.weight`: 128x128 blocks of an FP8 weight, one
        // e8m0 per 32 columns of a row of an FP4 (I8) one.
        if let Some(stem) = canonical.strip_suffix(".scale") {
            let w = format!("{stem}.weight");
            if let (Some(s), Some(dt)) = (shapes.get(&w), listing.tensors.get(&w)) {
                match (dt.as_str(), &s[..]) {
                    ("F8_E4M3", _) => return s.iter().map(|d| d.div_ceil(128)).collect(),
                    ("I8", [r, c]) => return vec![*r, c / 32],
                    _ => {}
                }
            }
        }
        // compressed-tensors MXFP4 (Kimi K3's experts): `weight_packed` [rows, cols / 2] codes
        // and `weight_scale` [rows, cols / 32] e8m0 of the spec's `{stem}.weight` [rows, cols].
        for (suffix, div) in [(".weight_packed", 2), (".weight_scale", 32)] {
            if let Some(stem) = canonical.strip_suffix(suffix) {
                if let Some([r, c]) = shapes.get(&format!("{stem}.weight")).map(|s| &s[..]) {
                    return vec![*r, c / div];
                }
            }
        }
        unknown.push(name.to_string());
        vec![8]
    };
    let names: Vec<(&String, &String)> = listing.tensors.iter().collect();
    let per = names.len().div_ceil(shards.max(1));
    let mut weight_map = serde_json::Map::new();
    let total = names.chunks(per).count();
    for (k, chunk) in names.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{total:05}.safetensors", k + 1);
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dtype) in chunk {
            let mut shape = shape_of(name, &mut unknown);
            let bytes = match dtype.as_str() {
                // FP4 codes, two per byte: the spec's [rows, cols] is [rows, cols / 2] bytes.
                "I8" if shape.len() == 2 => {
                    shape = vec![shape[0], shape[1] / 2];
                    tensor_bytes(name, dtype, &shape)
                }
                // A hash router's table: `top_k` distinct expert ids per token id.
                "I64" => {
                    let (rows, k) = (shape[0], shape.get(1).copied().unwrap_or(1));
                    (0..rows * k)
                        .map(|i| (((i / k) * k + i % k) % spec.num_experts.max(1)) as i64)
                        .flat_map(i64::to_le_bytes)
                        .collect()
                }
                _ => tensor_bytes(name, dtype, &shape),
            };
            header.insert(
                (*name).clone(),
                json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
            );
            data.extend_from_slice(&bytes);
            weight_map.insert((*name).clone(), json!(file));
        }
        let mut h = serde_json::to_vec(&Value::Object(header)).expect("header");
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&data);
        std::fs::write(dir.join(&file), out).expect("write shard");
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&json!({"metadata": {}, "weight_map": weight_map}))
            .expect("index"),
    )
    .expect("write index");
    Replica {
        dir: dir.to_path_buf(),
        listing,
        unknown,
    }
}
