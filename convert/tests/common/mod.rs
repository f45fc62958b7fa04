//! Test helpers: hand-written safetensors checkpoints (header JSON + bytes written here, no
//! library), running the binary, and comparing directories.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// One tensor to write: safetensors dtype string, shape, raw little-endian bytes.
#[derive(Clone, Debug)]
pub struct T {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A deterministic xorshift64* generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

pub fn bf16_tensor(name: &str, shape: &[usize], rng: &mut Rng, scale: f32) -> T {
    let n: usize = shape.iter().product();
    let data = (0..n)
        .flat_map(|_| bf16_bits(rng.unit() * scale).to_le_bytes())
        .collect();
    T {
        name: name.into(),
        dtype: "BF16".into(),
        shape: shape.to_vec(),
        data,
    }
}

pub fn ones_bf16(name: &str, n: usize) -> T {
    T {
        name: name.into(),
        dtype: "BF16".into(),
        shape: vec![n],
        data: (0..n).flat_map(|_| 0x3F80u16.to_le_bytes()).collect(),
    }
}

/// An FP8 weight (random e4m3 codes, never the NaN codes) and its `_scale_inv`
/// ([ceil(r/128), ceil(c/128)], dtype `scale_dtype`: "F32" or "BF16").
pub fn fp8_pair(name: &str, rows: usize, cols: usize, rng: &mut Rng, scale_dtype: &str) -> (T, T) {
    let data: Vec<u8> = (0..rows * cols)
        .map(|_| {
            let b = rng.below(256) as u8;
            if b & 0x7F == 0x7F {
                0x7E
            } else {
                b
            }
        })
        .collect();
    let (br, bc) = (rows.div_ceil(128), cols.div_ceil(128));
    let scales: Vec<f32> = (0..br * bc)
        .map(|_| 0.001 + 0.01 * rng.unit().abs())
        .collect();
    let sdata: Vec<u8> = match scale_dtype {
        "F32" => scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
        "BF16" => scales
            .iter()
            .flat_map(|s| bf16_bits(*s).to_le_bytes())
            .collect(),
        _ => panic!("scale dtype"),
    };
    (
        T {
            name: name.into(),
            dtype: "F8_E4M3".into(),
            shape: vec![rows, cols],
            data,
        },
        T {
            name: format!("{name}_scale_inv"),
            dtype: scale_dtype.into(),
            shape: vec![br, bc],
            data: sdata,
        },
    )
}

/// Serializes tensors into safetensors bytes (in the given order, contiguous data).
pub fn safetensors_bytes(tensors: &[T]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.data.len()]}),
        );
        off += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    raw_safetensors(
        &h,
        &tensors
            .iter()
            .flat_map(|t| t.data.clone())
            .collect::<Vec<_>>(),
    )
}

/// A safetensors file from a literal header and data section.
pub fn raw_safetensors(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// A checkpoint before it is written: config and shards (file name, tensors).
#[derive(Clone, Debug)]
pub struct Ckpt {
    pub config: Value,
    pub shards: Vec<(String, Vec<T>)>,
    pub extra: Vec<(String, Vec<u8>)>,
}

impl Ckpt {
    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&self.config).unwrap(),
        )
        .unwrap();
        let mut wm = serde_json::Map::new();
        for (f, ts) in &self.shards {
            for t in ts {
                wm.insert(t.name.clone(), json!(f));
            }
            std::fs::write(dir.join(f), safetensors_bytes(ts)).unwrap();
        }
        let index = json!({"metadata": {"total_size": 0}, "weight_map": wm});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index).unwrap(),
        )
        .unwrap();
        for (n, b) in &self.extra {
            std::fs::write(dir.join(n), b).unwrap();
        }
    }

    /// Finds a tensor (shard index, position) by name.
    pub fn find(&self, name: &str) -> (usize, usize) {
        for (i, (_, ts)) in self.shards.iter().enumerate() {
            if let Some(j) = ts.iter().position(|t| t.name == name) {
                return (i, j);
            }
        }
        panic!("no tensor {name}");
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut T {
        let (i, j) = self.find(name);
        &mut self.shards[i].1[j]
    }

    pub fn remove(&mut self, name: &str) -> T {
        let (i, j) = self.find(name);
        self.shards[i].1.remove(j)
    }
}

/// Tiny Mixtral, all BF16: hidden 80, intermediate 48, 4 heads of 20, 2 kv heads, vocab 64,
/// `layers` layers of `experts` experts, 2 shards (experts split across them).
pub fn tiny_mixtral_bf16(layers: usize, experts: usize) -> Ckpt {
    let (h, i, v) = (80usize, 48usize, 64usize);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let config = json!({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": h, "intermediate_size": i, "num_hidden_layers": layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 20,
        "num_local_experts": experts, "num_experts_per_tok": 2, "vocab_size": v,
        "rms_norm_eps": 1e-5, "rope_theta": 1e6, "rope_scaling": null,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16"
    });
    let mut s0 = vec![bf16_tensor(
        "model.embed_tokens.weight",
        &[v, h],
        &mut rng,
        1.0,
    )];
    let mut s1 = vec![];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        s0.push(ones_bf16(&format!("{p}.input_layernorm.weight"), h));
        s0.push(ones_bf16(
            &format!("{p}.post_attention_layernorm.weight"),
            h,
        ));
        for (n, r, c) in [
            ("q_proj", 80, h),
            ("k_proj", 40, h),
            ("v_proj", 40, h),
            ("o_proj", h, 80),
        ] {
            s0.push(bf16_tensor(
                &format!("{p}.self_attn.{n}.weight"),
                &[r, c],
                &mut rng,
                0.2,
            ));
        }
        s0.push(bf16_tensor(
            &format!("{p}.block_sparse_moe.gate.weight"),
            &[experts, h],
            &mut rng,
            0.5,
        ));
        for e in 0..experts {
            let dst = if e < experts / 2 { &mut s0 } else { &mut s1 };
            for (n, r, c) in [("w1", i, h), ("w3", i, h), ("w2", h, i)] {
                dst.push(bf16_tensor(
                    &format!("{p}.block_sparse_moe.experts.{e}.{n}.weight"),
                    &[r, c],
                    &mut rng,
                    0.3,
                ));
            }
        }
    }
    s1.push(ones_bf16("model.norm.weight", h));
    s1.push(bf16_tensor("lm_head.weight", &[v, h], &mut rng, 0.5));
    Ckpt {
        config,
        shards: vec![
            ("model-00001-of-00002.safetensors".into(), s0),
            ("model-00002-of-00002.safetensors".into(), s1),
        ],
        extra: vec![
            (
                "generation_config.json".into(),
                b"{\"eos_token_id\": 2}\n".to_vec(),
            ),
            ("chat_template.jinja".into(), b"{{ messages }}".to_vec()),
        ],
    }
}

/// Tiny Qwen3-MoE, FP8 (F32 scales for experts, BF16 scales for attention): hidden 80,
/// intermediate 48, 4 heads of 40 (q_proj [160, 80] -> scale [2, 1]; o_proj [80, 160] ->
/// [1, 2]), 3 shards; experts spread over all shards; some scales in another shard than their
/// weight. Norms, router, embeddings, lm_head BF16.
pub fn tiny_qwen3_fp8(layers: usize, experts: usize) -> Ckpt {
    let (h, i, v) = (80usize, 48usize, 64usize);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let config = json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": h, "moe_intermediate_size": i, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 40, "num_experts": experts, "num_experts_per_tok": 2, "vocab_size": v,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "tie_word_embeddings": false,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    });
    let mut sh: Vec<Vec<T>> = vec![vec![], vec![], vec![]];
    sh[0].push(bf16_tensor(
        "model.embed_tokens.weight",
        &[v, h],
        &mut rng,
        1.0,
    ));
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        sh[0].push(ones_bf16(&format!("{p}.input_layernorm.weight"), h));
        sh[0].push(ones_bf16(
            &format!("{p}.post_attention_layernorm.weight"),
            h,
        ));
        sh[0].push(ones_bf16(&format!("{p}.self_attn.q_norm.weight"), 40));
        sh[0].push(ones_bf16(&format!("{p}.self_attn.k_norm.weight"), 40));
        for (k, (n, r, c)) in [
            ("q_proj", 160, h),
            ("k_proj", 80, h),
            ("v_proj", 80, h),
            ("o_proj", h, 160),
        ]
        .into_iter()
        .enumerate()
        {
            let (w, s) = fp8_pair(&format!("{p}.self_attn.{n}.weight"), r, c, &mut rng, "BF16");
            sh[0].push(w);
            // q_proj's scale lives in the last shard.
            sh[if k == 0 { 2 } else { 0 }].push(s);
        }
        sh[1].push(bf16_tensor(
            &format!("{p}.mlp.gate.weight"),
            &[experts, h],
            &mut rng,
            0.5,
        ));
        for e in 0..experts {
            let home = (l * experts + e) % 3;
            for (k, (n, r, c)) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
                .into_iter()
                .enumerate()
            {
                let (w, s) = fp8_pair(
                    &format!("{p}.mlp.experts.{e}.{n}.weight"),
                    r,
                    c,
                    &mut rng,
                    "F32",
                );
                sh[home].push(w);
                // every down scale in the next shard
                sh[if k == 2 { (home + 1) % 3 } else { home }].push(s);
            }
        }
    }
    sh[2].push(ones_bf16("model.norm.weight", h));
    sh[2].push(bf16_tensor("lm_head.weight", &[v, h], &mut rng, 0.5));
    let shards = sh
        .into_iter()
        .enumerate()
        .map(|(k, ts)| (format!("model-{:05}-of-00003.safetensors", k + 1), ts))
        .collect();
    Ckpt {
        config,
        shards,
        extra: vec![("tokenizer.json".into(), b"{\"version\": \"1.0\"}".to_vec())],
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_coli-convert")
}

pub fn convert(input: &Path, output: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .arg(input)
        .arg(output)
        .args(args)
        .env_remove("COLI_FAILPOINT")
        .output()
        .expect("run coli-convert")
}

pub fn convert_env(input: &Path, output: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.arg(input)
        .arg(output)
        .args(args)
        .env_remove("COLI_FAILPOINT");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run coli-convert")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every file under `dir` (relative path -> bytes).
pub fn read_tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let mut es: Vec<_> = std::fs::read_dir(d).unwrap().flatten().collect();
        es.sort_by_key(|e| e.path());
        for e in es {
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                out.insert(
                    p.strip_prefix(base).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Asserts two trees hold the same files with the same bytes.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let ta = read_tree(a);
    let tb = read_tree(b);
    let ka: Vec<_> = ta.keys().collect();
    let kb: Vec<_> = tb.keys().collect();
    assert_eq!(
        ka,
        kb,
        "file lists differ between {} and {}",
        a.display(),
        b.display()
    );
    for (k, v) in &ta {
        assert!(
            v == &tb[k],
            "{} differs between {} and {}",
            k.display(),
            a.display(),
            b.display()
        );
    }
}

pub fn partial(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_os_string();
    s.push(".partial");
    PathBuf::from(s)
}
