//! llama.cpp architectures coli converts from GGUF: each one's metadata keys turned into the
//! Hugging Face config.json its family reads (so the model spec stays the one reader of a
//! model's configuration), and its tensor names mapped to the checkpoint names the spec uses.
//!
//! Sources: the metadata keys are those llama.cpp's `convert_hf_to_gguf.py` writes
//! (`TextModel.set_gguf_parameters` and each model class: `OlmoeModel`, `Qwen3MoeModel` via
//! `Qwen2MoeModel`, `LlamaModel` for Mixtral, `DeepseekV2Model` and its `Glm4MoeLiteModel`,
//! `DeepseekV32Model` and `DeepseekV4Model` of `conversion/deepseek.py`, `GlmMoeDsaModel`,
//! `Glm4MoeModel` and `Glm5NextModel` of `conversion/glm.py`, `GptOssModel`, `MiniMaxM2Model`,
//! `KimiLinearModel` and `KimiK3Model` of `conversion/kimi_linear.py` / `kimi_k3.py`,
//! `Qwen3NextModel` and `Qwen3_5MoeTextModel` of `conversion/qwen.py`)
//! and `src/models/*.cpp` reads (`LLM_KV_*`,
//! each architecture's `load_arch_hparams`); the tensor names are gguf-py's `TensorNameMap`
//! (`tensor_mapping.py`) for those `MODEL_ARCH`s (`constants.py` `MODEL_TENSORS`). `LlamaModel` permutes the rows of
//! `q_proj` and `k_proj` (`LlamaModel.permute`: each head's two halves interleaved, for
//! llama.cpp's RoPE); [`row_permutation`] undoes it, moving whole rows of blocks, so every
//! tensor is still the checkpoint's bit for bit up to its type.

use super::file::{Gguf, Value};
use crate::error::{ConvertError, Result};
use serde_json::{json, Value as Json};

/// The architectures coli converts: (`general.architecture`, Hugging Face `model_type`).
pub const ARCHITECTURES: &[(&str, &str)] = &[
    ("olmoe", "olmoe"),
    ("qwen3moe", "qwen3_moe"),
    ("llama", "mixtral"),
    ("deepseek2", "deepseek_v3"),
    ("glm-dsa", "glm_moe_dsa"),
    ("deepseek32", "deepseek_v32"),
    ("glm4moe", "glm4_moe"),
    ("gpt-oss", "gpt_oss"),
    ("minimax-m2", "minimax_m2"),
    ("kimi-linear", "kimi_linear"),
    ("kimi-k3", "kimi_k3"),
    ("glm5-next", "glm5_next"),
    ("deepseek4", "deepseek_v4"),
    ("qwen3next", "qwen3_next"),
    ("qwen35moe", "qwen3_5_moe"),
];

fn cerr(g: &Gguf, what: impl Into<String>) -> ConvertError {
    ConvertError::Gguf {
        file: g.path().to_path_buf(),
        what: what.into(),
    }
}

/// The GGUF's `general.architecture`, checked against [`ARCHITECTURES`].
///
/// # Errors
/// [`ConvertError::Gguf`] naming the architecture and the ones coli converts.
pub fn architecture(g: &Gguf) -> Result<&'static str> {
    let a = g.str("general.architecture")?;
    ARCHITECTURES
        .iter()
        .find(|(x, _)| *x == a)
        .map(|(x, _)| *x)
        .ok_or_else(|| {
            cerr(
                g,
                format!(
                    "general.architecture {a:?}: coli converts GGUFs of {} (convert this model from its Hugging Face safetensors release instead)",
                    ARCHITECTURES.iter().map(|(x, _)| *x).collect::<Vec<_>>().join(", ")
                ),
            )
        })
}

/// RoPE scaling (YaRN, linear, ...) changes attention at every position: refused where the
/// config does not carry it. llama.cpp reads a factor without a type as linear scaling, and
/// applies attn_factor and an attention temperature whatever the type: none of them is carried
/// into the config.
fn refuse_unread_scaling(g: &Gguf, arch: &str) -> Result<()> {
    let k = |s: &str| format!("{arch}.{s}");
    if g.get(&k("rope.scaling.type")).is_none() {
        if let Some(f) = g.get(&k("rope.scaling.factor")).and_then(Value::as_f64) {
            if f != 1.0 {
                return Err(cerr(
                    g,
                    format!("{} is {f} without {} (llama.cpp then scales linearly): coli does not convert that RoPE scaling", k("rope.scaling.factor"), k("rope.scaling.type")),
                ));
            }
        }
    }
    for (key, neutral) in [
        ("rope.scaling.attn_factor", 1.0),
        ("attention.temperature_scale", 0.0),
    ] {
        if let Some(v) = g.get(&k(key)).and_then(Value::as_f64) {
            if v != neutral {
                return Err(cerr(
                    g,
                    format!("{} is {v}: coli does not convert this attention scaling (convert the Hugging Face release)", k(key)),
                ));
            }
        }
    }
    Ok(())
}

/// The config.json of the GGUF's model, from its metadata and tensor shapes.
///
/// # Errors
/// [`ConvertError::Gguf`] naming a missing or contradictory key.
pub fn config_json(g: &Gguf) -> Result<Json> {
    let arch = architecture(g)?;
    let k = |s: &str| format!("{arch}.{s}");
    let u = |s: &str| g.u64(&k(s)).map(|v| v as usize);
    if matches!(arch, "kimi-k3" | "kimi-linear" | "glm5-next" | "deepseek4") {
        refuse_unread_scaling(g, arch)?;
        let c = match arch {
            "glm5-next" => glm5_next(g)?,
            "deepseek4" => deepseek4(g)?,
            _ => kimi_kda(g, arch)?,
        };
        let t = c.get("text_config").unwrap_or(&c);
        let decoder = t["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        check_blocks(g, arch, u("block_count")?, decoder)?;
        return Ok(c);
    }
    if arch == "llama" && g.get("llama.expert_count").is_none() {
        return Err(cerr(
            g,
            "a llama GGUF without experts (no llama.expert_count): coli runs Mixture-of-Experts models (Mixtral-style llama GGUFs have experts)",
        ));
    }
    let hidden = u("embedding_length")?;
    let layers = u("block_count")?;
    let heads = u("attention.head_count")?;
    let kv_heads = match g.get(&k("attention.head_count_kv")) {
        Some(_) => u("attention.head_count_kv")?,
        None => heads,
    };
    let experts = u("expert_count")?;
    let topk = u("expert_used_count")?;
    let vocab = vocab_size(g, &k("embedding_length"), hidden)?;
    if heads == 0 || kv_heads == 0 || experts == 0 || topk == 0 || topk > experts {
        return Err(cerr(
            g,
            format!(
                "{}={heads}, {}={kv_heads}, {}={experts}, {}={topk}: not a MoE model coli can run",
                k("attention.head_count"),
                k("attention.head_count_kv"),
                k("expert_count"),
                k("expert_used_count")
            ),
        ));
    }
    refuse_unread_scaling(g, arch)?;
    if let Some(v) = g.get(&k("rope.scaling.type")) {
        // YaRN is read for deepseek2 and deepseek32 (their yarn_log_multiplier) and gpt-oss
        // (deepseek4 reads its own, `deepseek4`); llama.cpp's glm-dsa
        // reads no log multiplier, so its YaRN is not the one the config would say.
        let yarn_read = matches!(arch, "deepseek2" | "deepseek32" | "gpt-oss");
        if v.as_str() != Some("none") && !(yarn_read && v.as_str() == Some("yarn")) {
            return Err(cerr(
                g,
                format!("{} is {v}: coli does not convert RoPE scaling from GGUF metadata yet (convert the Hugging Face release)", k("rope.scaling.type")),
            ));
        }
    }
    if let Some(n) = g
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[Value]>::len)
    {
        if n > vocab {
            return Err(cerr(
                g,
                format!(
                    "tokenizer.ggml.tokens has {n} tokens but token_embd.weight only {vocab} rows"
                ),
            ));
        }
    }
    let tied = !g.tensors.contains_key("output.weight");
    let tok = |key: &str| token_id(g, key);
    let mut c = json!({
        "model_type": ARCHITECTURES.iter().find(|(x, _)| *x == arch).expect("checked").1,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_experts": experts,
        "num_experts_per_tok": topk,
        "max_position_embeddings": u("context_length")?,
        "rms_norm_eps": g.f64(&k("attention.layer_norm_rms_epsilon"))?,
        "rope_theta": match g.get(&k("rope.freq_base")) {
            Some(_) => g.f64(&k("rope.freq_base"))?,
            None => 10000.0,
        },
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": qkv_bias(g, 1),
        "bos_token_id": tok("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok("tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
    });
    let o = c.as_object_mut().expect("object");
    match arch {
        "olmoe" => {
            // llama.cpp's OLMoE graph (src/models/olmoe.cpp) never renormalizes the top-k.
            o.insert("intermediate_size".into(), u("feed_forward_length")?.into());
            o.insert("norm_topk_prob".into(), false.into());
        }
        "qwen3moe" => {
            let head_dim = match g.get(&k("attention.key_length")) {
                Some(_) => u("attention.key_length")?,
                None => hidden / heads,
            };
            o.insert("head_dim".into(), head_dim.into());
            o.insert(
                "moe_intermediate_size".into(),
                u("expert_feed_forward_length")?.into(),
            );
            o.insert(
                "intermediate_size".into(),
                g.get(&k("feed_forward_length"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
                    .into(),
            );
            // llama.cpp's Qwen3-MoE graph (src/models/qwen3moe.cpp) renormalizes the top-k
            // weights, as Qwen3-MoE releases' norm_topk_prob: true.
            o.insert("norm_topk_prob".into(), true.into());
            o.insert("decoder_sparse_step".into(), 1.into());
            o.insert("mlp_only_layers".into(), json!([]));
        }
        "llama" => {
            // A llama GGUF with experts is Mixtral (convert_hf_to_gguf.py's LlamaModel for
            // MixtralForCausalLM): softmax routing renormalized over the top-k, as transformers'.
            o.insert("num_local_experts".into(), experts.into());
            o.remove("num_experts");
            o.insert("intermediate_size".into(), u("feed_forward_length")?.into());
            o.insert("sliding_window".into(), Json::Null);
            if g.get(&k("attention.key_length")).is_some() {
                o.insert("head_dim".into(), u("attention.key_length")?.into());
            }
        }
        "deepseek2" | "glm-dsa" | "deepseek32" => mla(g, arch, o, heads, vocab)?,
        "glm4moe" => glm4moe(g, o)?,
        "gpt-oss" => gpt_oss(g, o)?,
        "minimax-m2" => minimax_m2(g, o)?,
        "qwen3next" | "qwen35moe" => qwen_hybrid(g, arch, o)?,
        _ => unreachable!("architecture() checked"),
    }
    let decoder = o["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    check_blocks(g, arch, layers, decoder)?;
    if arch == "qwen35moe" {
        // The release's wrapper, its language model in `text_config`.
        o.insert("model_type".into(), "qwen3_5_moe_text".into());
        return Ok(json!({
            "model_type": "qwen3_5_moe",
            "text_config": c,
            "tie_word_embeddings": tied,
        }));
    }
    Ok(c)
}

/// The keys of a `qwen3next` GGUF (`conversion/qwen.py` `Qwen3NextModel`, read by
/// `src/models/qwen3next.cpp`) or a `qwen35moe` one (`Qwen3_5MoeTextModel`,
/// `src/models/qwen35moe.cpp`) beyond the common ones: `attention.key_length` (`head_dim`,
/// `value_length` equal), `rope.dimension_count` (`rotary_dim`; Qwen3.5's interleaved
/// multimodal sections are the same 1-D rotation for text), `expert_feed_forward_length`,
/// `expert_shared_feed_forward_length` (else `feed_forward_length`, as llama.cpp falls back),
/// the Gated DeltaNet's `ssm.{conv_kernel, state_size (dk), group_count (Hk), time_step_rank
/// (Hv), inner_size (Hv dv)}`, the layer kinds from `attention.recurrent_layers` (else
/// `full_attention_interval`, default 4, as llama.cpp reads them). Both graphs make every layer
/// MoE with softmax routing renormalized over the top-k (`build_moe_ffn(..., norm_w = true,
/// ..., SOFTMAX)`); an `expert_weights_scale` other than 1 is refused (neither config has
/// one). The first MTP block (`nextn_predict_layers`; llama.cpp's converter renames `mtp.fc`,
/// `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm` to `blk.L.nextn.{eh_proj,
/// enorm, hnorm, shared_head_norm}` and `mtp.layers.0.*` to `blk.L.*`, L the decoder's layer
/// count, and adds the one to its norms too) is converted as the spec's MTP layer ([`gguf_name_in`]).
/// What the converter changed
/// is said with coli's keys: `zero_centered_norms` false (it adds the one to every RMSNorm but
/// the gated one), `linear_value_heads_tiled` (Qwen3.5's value heads reordered,
/// `_LinearAttentionVReorderBase`), `linear_attn_split_qkvz` (Qwen3-Next's `in_proj_qkvz` as
/// `attn_qkv` + `attn_gate`; absent in files of earlier converters, whose `ssm_in` is the
/// published `in_proj_qkvz`).
fn qwen_hybrid(g: &Gguf, arch: &str, o: &mut serde_json::Map<String, Json>) -> Result<()> {
    let keys = Keys { g, arch };
    let (k, u) = (|s: &str| keys.key(s), |s: &str| keys.u(s));
    let opt_u = |s: &str| keys.opt_u(s);
    let layers = decoder_layers(&keys, o)?;
    let (head_dim, v_dim) = (u("attention.key_length")?, u("attention.value_length")?);
    if head_dim != v_dim {
        return Err(cerr(
            g,
            format!(
                "{} {head_dim} and {} {v_dim} differ: the gated attention's heads have one size",
                k("attention.key_length"),
                k("attention.value_length")
            ),
        ));
    }
    if let Some(s) = keys.opt_f("expert_weights_scale")? {
        if s != 0.0 && s != 1.0 {
            return Err(cerr(
                g,
                format!(
                    "{} is {s}: Qwen3-Next and Qwen3.5 weight their experts unscaled",
                    k("expert_weights_scale")
                ),
            ));
        }
    }
    let (hk, hv, inner) = (
        u("ssm.group_count")?,
        u("ssm.time_step_rank")?,
        u("ssm.inner_size")?,
    );
    if hk == 0 || hv == 0 || !hv.is_multiple_of(hk) || !inner.is_multiple_of(hv) {
        return Err(cerr(
            g,
            format!(
                "{} {hv}, {} {hk}, {} {inner}: the value heads must be a multiple of the key heads, and the inner size of the value heads",
                k("ssm.time_step_rank"),
                k("ssm.group_count"),
                k("ssm.inner_size")
            ),
        ));
    }
    // One bool per block, MTP blocks included, or one for all (llama.cpp's `get_key_or_arr`
    // with `n_layer_all`).
    let blocks = u("block_count")?;
    let bad = || {
        cerr(
            g,
            format!(
                "{} must give one bool per block ({} {blocks}) or one for all",
                k("attention.recurrent_layers"),
                k("block_count")
            ),
        )
    };
    let as_bool = |x: &Value| x.as_bool().or_else(|| x.as_u64().map(|n| n != 0));
    let recurrent = match g.get(&k("attention.recurrent_layers")) {
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(as_bool)
                .collect::<Option<Vec<bool>>>()
                .filter(|v| v.len() == blocks)
                .ok_or_else(bad)?,
        ),
        Some(v) => Some(vec![as_bool(v).ok_or_else(bad)?; blocks]),
        None => None,
    };
    let linear: Vec<bool> = match recurrent {
        Some(r) => r[..layers].to_vec(),
        None => {
            let every = opt_u("full_attention_interval")?.unwrap_or(4);
            if every == 0 {
                return Err(cerr(g, format!("{} is 0", k("full_attention_interval"))));
            }
            (0..layers)
                .map(|i| !(i + 1).is_multiple_of(every))
                .collect()
        }
    };
    let shared = match opt_u("expert_shared_feed_forward_length")? {
        Some(s) => s,
        None => u("feed_forward_length")?,
    };
    o.insert("head_dim".into(), head_dim.into());
    o.insert("rotary_dim".into(), u("rope.dimension_count")?.into());
    o.insert(
        "moe_intermediate_size".into(),
        u("expert_feed_forward_length")?.into(),
    );
    o.insert("shared_expert_intermediate_size".into(), shared.into());
    o.insert(
        "linear_conv_kernel_dim".into(),
        u("ssm.conv_kernel")?.into(),
    );
    o.insert("linear_key_head_dim".into(), u("ssm.state_size")?.into());
    o.insert("linear_num_key_heads".into(), hk.into());
    o.insert("linear_num_value_heads".into(), hv.into());
    o.insert("linear_value_head_dim".into(), (inner / hv).into());
    o.insert(
        "layer_types".into(),
        linear
            .iter()
            .map(|&l| {
                if l {
                    "linear_attention"
                } else {
                    "full_attention"
                }
            })
            .collect::<Vec<_>>()
            .into(),
    );
    o.insert("attention_bias".into(), qkv_bias(g, layers).into());
    o.insert("zero_centered_norms".into(), false.into());
    let mtp = mtp_blocks(&keys, layers, false)?;
    if arch == "qwen35moe" {
        o.insert("mtp_num_hidden_layers".into(), mtp.into());
        o.insert("linear_value_heads_tiled".into(), true.into());
    } else {
        o.insert("num_nextn_predict_layers".into(), mtp.into());
        o.insert(
            "intermediate_size".into(),
            opt_u("feed_forward_length")?.unwrap_or(shared).into(),
        );
        o.insert("decoder_sparse_step".into(), 1.into());
        o.insert("mlp_only_layers".into(), json!([]));
        o.insert("norm_topk_prob".into(), true.into());
        o.insert(
            "linear_attn_split_qkvz".into(),
            any_layer_has(g, layers, "attn_qkv.weight").into(),
        );
    }
    Ok(())
}

/// Every `blk.N.` tensor belongs to a decoder layer or, past them, to an MTP block that holds
/// llama.cpp's `nextn` tensors, and no decoder block holds `nextn` tensors: a block count that
/// drops layers the file holds, or an MTP block the metadata does not declare, is refused, as
/// llama.cpp refuses a file with tensors it does not load.
fn check_blocks(g: &Gguf, arch: &str, layers: usize, decoder: usize) -> Result<()> {
    let k = |s: &str| format!("{arch}.{s}");
    for name in g.tensors.keys() {
        let Some(n) = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, _)| n.parse::<usize>().ok())
        else {
            continue;
        };
        if n >= layers {
            return Err(cerr(
                g,
                format!("tensor {name} is past {} {layers}", k("block_count")),
            ));
        }
        if n < decoder && name.contains(".nextn.") {
            return Err(cerr(
                g,
                format!(
                    "tensor {name} is an MTP block's, but {} and {} make block {n} a decoder layer: the metadata contradicts the tensors",
                    k("block_count"),
                    k("nextn_predict_layers")
                ),
            ));
        }
        if n >= decoder
            && !g
                .tensors
                .contains_key(&format!("blk.{n}.nextn.eh_proj.weight"))
        {
            return Err(cerr(
                g,
                format!(
                    "block {n} holds {name} but no nextn tensors, while {} makes it an MTP block: the metadata contradicts the tensors",
                    k("nextn_predict_layers")
                ),
            ));
        }
    }
    Ok(())
}

/// The GGUF dimensions (outermost first) of the spec tensor `hf` where they are more than its
/// 2-D matrix shape: llama.cpp's split MLA `attn_k_b` (`[heads, kv_lora, nope]`) and
/// `attn_v_b` (`[heads, v, kv_lora]`). None for every other tensor.
pub fn gguf_shape(config: &Json, hf: &str) -> Option<Vec<usize>> {
    // A wrapper's language-model keys (kimi-k3) are in its text_config.
    let c = config.get("text_config").unwrap_or(config);
    let get = |k: &str| c[k].as_u64().map(|v| v as usize);
    let (nh, rkv) = (get("num_attention_heads")?, get("kv_lora_rank")?);
    if hf.ends_with("self_attn.k_b_proj.weight") {
        Some(vec![nh, rkv, get("qk_nope_head_dim")?])
    } else if hf.ends_with("self_attn.v_b_proj.weight") {
        Some(vec![nh, get("v_head_dim")?, rkv])
    } else {
        None
    }
}

/// The vocabulary size: `token_embd.weight`'s rows, checked against the hidden size the
/// metadata key `hidden_key` gives.
fn vocab_size(g: &Gguf, hidden_key: &str, hidden: usize) -> Result<usize> {
    let emb = g.tensor("token_embd.weight")?;
    if emb.dims[0] as usize != hidden {
        return Err(cerr(
            g,
            format!(
                "token_embd.weight has rows of {} but {hidden_key} is {hidden}",
                emb.dims[0]
            ),
        ));
    }
    Ok(emb.dims.get(1).copied().unwrap_or(0) as usize)
}

/// Whether the attention of the first `layers` layers has q/k/v biases: `attn_q.bias`, or the
/// fused `attn_qkv.bias` of llama.cpp's `--fuse-qkv` (read as the three, `super::fused`).
fn qkv_bias(g: &Gguf, layers: usize) -> bool {
    any_layer_has(g, layers, "attn_q.bias") || any_layer_has(g, layers, "attn_qkv.bias")
}

/// Whether any of the first `layers` blocks holds `blk.N.{suffix}`.
fn any_layer_has(g: &Gguf, layers: usize, suffix: &str) -> bool {
    (0..layers).any(|i| g.tensors.contains_key(&format!("blk.{i}.{suffix}")))
}

/// Whether the MLA layers hold llama.cpp's split `attn_k_b` / `attn_v_b` (else a fused
/// `attn_kv_b`).
///
/// # Errors
/// [`ConvertError::Gguf`] when neither is there.
fn kv_b_split(g: &Gguf, layers: usize) -> Result<bool> {
    let split = any_layer_has(g, layers, "attn_k_b.weight");
    if !split && !any_layer_has(g, layers, "attn_kv_b.weight") {
        return Err(cerr(
            g,
            "no attn_k_b nor attn_kv_b tensor: the MLA up-projection is missing",
        ));
    }
    Ok(split)
}

/// A token id the metadata gives (`tokenizer.ggml.bos_token_id`, ...), or null.
fn token_id(g: &Gguf, key: &str) -> Json {
    g.get(key)
        .and_then(Value::as_u64)
        .map_or(Json::Null, Json::from)
}

/// An architecture's metadata keys (`{arch}.{name}`) of a GGUF.
struct Keys<'a> {
    g: &'a Gguf,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, s: &str) -> String {
        format!("{}.{s}", self.arch)
    }

    fn u(&self, s: &str) -> Result<usize> {
        self.g.u64(&self.key(s)).map(|v| v as usize)
    }

    fn opt_u(&self, s: &str) -> Result<Option<usize>> {
        match self.g.get(&self.key(s)) {
            Some(_) => Ok(Some(self.u(s)?)),
            None => Ok(None),
        }
    }

    fn opt_f(&self, s: &str) -> Result<Option<f64>> {
        match self.g.get(&self.key(s)) {
            Some(_) => Ok(Some(self.g.f64(&self.key(s))?)),
            None => Ok(None),
        }
    }
}

/// The MTP layers coli converts from the blocks llama.cpp appends after the `decoder` layers
/// (`nextn_predict_layers`, their tensors `blk.L.nextn.*` plus block L's decoder tensors): 1
/// when the file declares one and holds its `nextn.eh_proj` (coli runs at most one MTP layer;
/// a file converted with `--no-mtp`, or a trunk-only file, declares none or holds none), else 0.
/// `own_embed_and_head`: the family's spec requires the layer's own `embed_tokens` and
/// `shared_head.head` (DeepSeek-V3's, which `deepseek2` files are read as, and DeepSeek-V3.2's,
/// `deepseek32`): a block without `nextn.embed_tokens` and `nextn.shared_head_head` is then not
/// converted (0), where llama.cpp lets the main ones stand in.
fn mtp_blocks(keys: &Keys<'_>, decoder: usize, own_embed_and_head: bool) -> Result<usize> {
    let has = |t: &str| {
        keys.g
            .tensors
            .contains_key(&format!("blk.{decoder}.nextn.{t}.weight"))
    };
    Ok(usize::from(
        keys.opt_u("nextn_predict_layers")?.unwrap_or(0) > 0
            && has("eh_proj")
            && (!own_embed_and_head || (has("embed_tokens") && has("shared_head_head"))),
    ))
}

/// `num_hidden_layers`: `block_count` less the MTP blocks llama.cpp appends after the decoder
/// (`nextn_predict_layers`; the first is converted as the MTP layer where the family has one,
/// [`mtp_blocks`]). Returns it.
fn decoder_layers(keys: &Keys<'_>, o: &mut serde_json::Map<String, Json>) -> Result<usize> {
    let blocks = keys.u("block_count")?;
    let nextn = keys.opt_u("nextn_predict_layers")?.unwrap_or(0);
    if blocks == 0 {
        return Err(cerr(
            keys.g,
            format!("{} is 0: no decoder layer", keys.key("block_count")),
        ));
    }
    if nextn >= blocks {
        return Err(cerr(
            keys.g,
            format!(
                "{} {nextn} leaves no decoder layer of {} {blocks}",
                keys.key("nextn_predict_layers"),
                keys.key("block_count")
            ),
        ));
    }
    o.insert("num_hidden_layers".into(), (blocks - nextn).into());
    Ok(blocks - nextn)
}

/// The grouped-sigmoid routing and FFN sizes of deepseek2, deepseek32, glm-dsa and glm4moe, with
/// llama.cpp's defaults for absent keys (no shared experts, no leading dense block, no
/// scaling (or a scale of 0: skipped), no renormalization, one group).
fn grouped_sigmoid(keys: &Keys<'_>, o: &mut serde_json::Map<String, Json>) -> Result<()> {
    let (g, k) = (keys.g, |s: &str| keys.key(s));
    let opt_u = |s: &str| keys.opt_u(s);
    o.insert(
        "moe_intermediate_size".into(),
        keys.u("expert_feed_forward_length")?.into(),
    );
    o.insert(
        "intermediate_size".into(),
        opt_u("feed_forward_length")?.unwrap_or(0).into(),
    );
    let shared = opt_u("expert_shared_count")?.unwrap_or(0);
    if shared == 0 {
        if let Some(t) = g.tensors.keys().find(|n| n.contains("_shexp.")) {
            return Err(cerr(
                g,
                format!(
                    "{} is {} but the file holds shared-expert tensors ({t}): the metadata contradicts the tensors",
                    k("expert_shared_count"),
                    if g.get(&k("expert_shared_count")).is_some() { "0" } else { "absent" }
                ),
            ));
        }
    }
    o.insert("n_shared_experts".into(), shared.into());
    o.insert(
        "first_k_dense_replace".into(),
        opt_u("leading_dense_block_count")?.unwrap_or(0).into(),
    );
    o.insert(
        "routed_scaling_factor".into(),
        keys.opt_f("expert_weights_scale")?
            .filter(|&v| v != 0.0)
            .unwrap_or(1.0)
            .into(),
    );
    o.insert(
        "norm_topk_prob".into(),
        g.get(&k("expert_weights_norm"))
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| cerr(g, format!("{} is not a bool", k("expert_weights_norm"))))
            })
            .transpose()?
            .unwrap_or(false)
            .into(),
    );
    o.insert(
        "n_group".into(),
        opt_u("expert_group_count")?.unwrap_or(1).max(1).into(),
    );
    o.insert(
        "topk_group".into(),
        opt_u("expert_group_used_count")?.unwrap_or(1).max(1).into(),
    );
    o.insert("scoring_func".into(), "sigmoid".into());
    Ok(())
}

/// glm4moe (GLM-4.5, 4.6, 4.7: `Glm4MoeModel` in llama.cpp's `conversion/glm.py`, read back by
/// `src/models/glm4-moe.cpp`) as a `glm4_moe` config: `attention.key_length` is `head_dim`,
/// `rope.dimension_count / head_dim` the `partial_rotary_factor` (RoPE on the first dimensions
/// of each head, halves rotated: llama.cpp's NEOX type, transformers' `rotate_half`), q/k
/// RMSNorms when the GGUF has `attn_q_norm`, q/k/v biases when it has `attn_q.bias`, routing as
/// deepseek2's (sigmoid unless `expert_gating_func` says otherwise, which is refused; llama.cpp's
/// defaults for the absent `expert_weights_*`, groups, shared experts and leading dense
/// blocks). The first MTP block appended after the decoder (`nextn_predict_layers`; its
/// `nextn.*` tensors and block L's decoder tensors, [`mtp_blocks`]) is the spec's MTP layer;
/// where the file has no `nextn.embed_tokens` / `nextn.shared_head_head` (GLM-4.6 and 4.7
/// publish their MTP layer without them), the main embedding and output stand in, as for
/// the release.
fn glm4moe(g: &Gguf, o: &mut serde_json::Map<String, Json>) -> Result<()> {
    let keys = Keys { g, arch: "glm4moe" };
    let (k, u, opt_u) = (
        |s: &str| keys.key(s),
        |s: &str| keys.u(s),
        |s: &str| keys.opt_u(s),
    );
    let layers = decoder_layers(&keys, o)?;
    if let Some(f) = opt_u("expert_gating_func")?.filter(|&f| f != 0) {
        if f != 2 {
            return Err(cerr(
                g,
                format!(
                    "{} is {f}: coli runs glm4moe GGUFs with sigmoid routing (2)",
                    k("expert_gating_func")
                ),
            ));
        }
    }
    let heads = u("attention.head_count")?;
    let head_dim = match opt_u("attention.key_length")? {
        Some(d) => d,
        None => u("embedding_length")? / heads.max(1),
    };
    let rot = opt_u("rope.dimension_count")?.unwrap_or(head_dim / 2);
    if head_dim == 0 || rot == 0 || rot > head_dim || rot % 2 != 0 {
        return Err(cerr(
            g,
            format!(
                "{} {rot} must be even and at most the head dimension {head_dim}",
                k("rope.dimension_count")
            ),
        ));
    }
    let experts = u("expert_count")?;
    o.remove("num_experts");
    o.insert("n_routed_experts".into(), experts.into());
    o.insert("head_dim".into(), head_dim.into());
    o.insert(
        "partial_rotary_factor".into(),
        (rot as f64 / head_dim as f64).into(),
    );
    grouped_sigmoid(&keys, o)?;
    o.insert(
        "use_qk_norm".into(),
        g.tensors.contains_key("blk.0.attn_q_norm.weight").into(),
    );
    o.insert(
        "num_nextn_predict_layers".into(),
        mtp_blocks(&keys, layers, false)?.into(),
    );
    Ok(())
}

/// minimax-m2 (MiniMax-M2 / M2.1: `MiniMaxM2Model` in llama.cpp's `conversion/minimax.py`, read
/// back by `src/models/minimax-m2.cpp`) as a `minimax_m2` config: `expert_feed_forward_length`
/// the experts' width, `attention.key_length` the head size, `rope.dimension_count` the
/// `rotary_dim` (RoPE halves, llama.cpp's NEOX type, as transformers), sigmoid routing with the
/// selection bias `exp_probs_b`, renormalized over the top-k (llama.cpp's graph always
/// renormalizes); a `expert_weights_scale` other than 1 (or 0: none) and any gating but
/// sigmoid are refused, MiniMax-M2 having neither.
fn minimax_m2(g: &Gguf, o: &mut serde_json::Map<String, Json>) -> Result<()> {
    let keys = Keys {
        g,
        arch: "minimax-m2",
    };
    if keys.opt_u("expert_gating_func")? != Some(2) {
        return Err(cerr(
            g,
            format!(
                "{} is not 2 (sigmoid): MiniMax-M2 routes with sigmoid",
                keys.key("expert_gating_func")
            ),
        ));
    }
    if let Some(v) = keys
        .opt_f("expert_weights_scale")?
        .filter(|&v| v != 0.0 && v != 1.0)
    {
        return Err(cerr(
            g,
            format!(
                "{} is {v}: MiniMax-M2 does not scale its routing weights",
                keys.key("expert_weights_scale")
            ),
        ));
    }
    o.remove("num_experts");
    o.insert("num_local_experts".into(), keys.u("expert_count")?.into());
    o.insert(
        "intermediate_size".into(),
        keys.u("expert_feed_forward_length")?.into(),
    );
    o.insert("head_dim".into(), keys.u("attention.key_length")?.into());
    o.insert("rotary_dim".into(), keys.u("rope.dimension_count")?.into());
    o.insert("scoring_func".into(), "sigmoid".into());
    o.insert("use_qk_norm".into(), true.into());
    Ok(())
}

/// gpt-oss (`GptOssModel` in llama.cpp's `conversion/gpt_oss.py`, read back by
/// `src/models/openai-moe.cpp`) as a `gpt_oss` config: `attention.key_length` is `head_dim`,
/// `attention.sliding_window` the window, the sliding layers from
/// `attention.sliding_window_pattern` (a bool per layer, or a period n: layer i slides when
/// `i % n < n - 1`) or llama.cpp's default period 2 (even layers slide, as transformers'
/// default `layer_types`); YaRN from `rope.scaling.*` with `truncate` false, as every gpt-oss
/// release's config and transformers' `GptOssConfig` say (llama.cpp's own YaRN always rounds
/// the correction range: a small difference of llama.cpp's, not of the file). The clamped
/// SwiGLU's alpha 1.702 and limit 7 are the class defaults llama.cpp also hard-codes.
fn gpt_oss(g: &Gguf, o: &mut serde_json::Map<String, Json>) -> Result<()> {
    let keys = Keys { g, arch: "gpt-oss" };
    let (k, u, opt_f) = (
        |s: &str| keys.key(s),
        |s: &str| keys.u(s),
        |s: &str| keys.opt_f(s),
    );
    let layers = u("block_count")?;
    let experts = u("expert_count")?;
    o.remove("num_experts");
    o.insert("num_local_experts".into(), experts.into());
    o.insert(
        "intermediate_size".into(),
        u("expert_feed_forward_length")?.into(),
    );
    o.insert("head_dim".into(), u("attention.key_length")?.into());
    o.insert(
        "sliding_window".into(),
        u("attention.sliding_window")?.into(),
    );
    let sliding: Vec<bool> = match g.get(&k("attention.sliding_window_pattern")) {
        None => (0..layers).map(|i| i % 2 == 0).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(Value::as_bool)
            .collect::<Option<Vec<_>>>()
            .filter(|a| a.len() == layers)
            .ok_or_else(|| {
                cerr(
                    g,
                    format!(
                        "{} must list a bool for each of the {layers} layers",
                        k("attention.sliding_window_pattern")
                    ),
                )
            })?,
        Some(_) => {
            let n = u("attention.sliding_window_pattern")?;
            (0..layers).map(|i| n == 0 || i % n < n - 1).collect()
        }
    };
    o.insert(
        "layer_types".into(),
        sliding
            .iter()
            .map(|&s| {
                if s {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect::<Vec<_>>()
            .into(),
    );
    let theta = o["rope_theta"].clone();
    let rope = if g.get(&k("rope.scaling.type")).and_then(Value::as_str) == Some("yarn") {
        for key in ["rope.scaling.yarn_ext_factor"] {
            if let Some(v) = opt_f(key)? {
                if v != 1.0 {
                    return Err(cerr(
                        g,
                        format!(
                            "{} is {v}: coli's YaRN (transformers') has no such factor",
                            k(key)
                        ),
                    ));
                }
            }
        }
        json!({
            "rope_type": "yarn",
            "rope_theta": theta,
            "factor": g.f64(&k("rope.scaling.factor"))?,
            "original_max_position_embeddings": u("rope.scaling.original_context_length")?,
            "beta_fast": opt_f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
            "beta_slow": opt_f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            "truncate": false,
        })
    } else {
        json!({"rope_type": "default", "rope_theta": theta})
    };
    o.insert("rope_parameters".into(), rope);
    o.insert("attention_bias".into(), qkv_bias(g, 1).into());
    Ok(())
}

/// GLM-5.2's `indexer_types` (1: full), which llama.cpp's `src/models/glm-dsa.cpp`
/// (`GLM_5_2_DEFAULT_INDEXER_TYPES`) assumes for a glm-dsa GGUF of 1M context or more without
/// `attention.indexer.types` (shorter contexts: GLM-5 and 5.1, every layer full).
const GLM_5_2_INDEXER_TYPES: [u8; 78] = [
    1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0,
    0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0,
    0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0,
];

/// deepseek2 (DeepSeek-V3, Kimi-K2, GLM-4.7-Flash: `DeepseekV2Model` / `Glm4MoeLiteModel` in
/// llama.cpp's `conversion/deepseek.py` and `glm.py`, read back by `src/models/deepseek2.cpp`)
/// as a `deepseek_v3` config, glm-dsa (GLM-5.x: `GlmMoeDsaModel`, `src/models/glm-dsa.cpp`)
/// as a `glm_moe_dsa` one, and deepseek32 (DeepSeek-V3.2: `DeepseekV32Model`, deepseek2's keys
/// and YaRN plus the indexer's, every layer its own indexer) as a `deepseek_v32` one: MLA dimensions from the `*_mla` lengths, routing from the
/// `expert_*` keys with llama.cpp's defaults when absent (no `expert_weights_scale`: 1; no
/// `expert_weights_norm`: false; no groups: one; no `expert_gating_func`: sigmoid for glm-dsa
/// and for deepseek2's GLM-4.7-Flash shape (47 or 48 layers, 154880 tokens), else DeepSeek-V2's
/// softmax, refused), deepseek2's YaRN from `rope.scaling.*` (`mscale` = `mscale_all_dim` =
/// `yarn_log_multiplier / 0.1`, the converter's factor undone in f32 as llama.cpp does, which
/// is what its graph computes; `beta_fast` / `beta_slow` as the file gives them, the
/// release's values, where llama.cpp's deepseek2 keeps its defaults 32 and 1; glm-dsa's YaRN
/// is refused, llama.cpp reading no log multiplier for it), interleaved RoPE pairs (llama.cpp's deepseek2 RoPE is
/// `LLAMA_ROPE_TYPE_NORM`), the DSA indexer's `attention.indexer.*` keys. The first MTP block
/// appended after the decoder (`nextn_predict_layers`: glm-dsa and deepseek32 files and
/// GLM-4.7-Flash's deepseek2 ones; llama.cpp's `DeepseekV2Model` drops DeepSeek-V3's) is the
/// spec's MTP layer ([`mtp_blocks`]; for glm-dsa the main embedding and output stand in for an
/// absent `nextn.embed_tokens` / `nextn.shared_head_head`, as GLM-5's releases publish it; a
/// deepseek2 or deepseek32 block without them is left out). A GGUF holding `attn_k_b` / `attn_v_b` (every one written since
/// llama.cpp's MLA change) gets `mla_kv_b_split`: the spec reads the two tensors as they are.
fn mla(
    g: &Gguf,
    arch: &str,
    o: &mut serde_json::Map<String, Json>,
    heads: usize,
    vocab: usize,
) -> Result<()> {
    let keys = Keys { g, arch };
    let (k, u) = (|s: &str| keys.key(s), |s: &str| keys.u(s));
    let (opt_u, opt_f) = (|s: &str| keys.opt_u(s), |s: &str| keys.opt_f(s));
    let layers = decoder_layers(&keys, o)?;
    // llama.cpp's enum llama_expert_gating_func_type: 1 softmax, 2 sigmoid; its defaults when
    // the key is absent.
    let gating = opt_u("expert_gating_func")?
        .filter(|&f| f != 0)
        .or_else(|| {
            (arch == "glm-dsa" || (matches!(layers, 47 | 48) && vocab == 154_880)).then_some(2)
        });
    if gating != Some(2) {
        return Err(cerr(
            g,
            format!(
                "{} is {}: coli runs {arch} GGUFs with sigmoid routing (2: DeepSeek-V3, Kimi-K2, GLM); DeepSeek-V2's softmax routing is not run",
                k("expert_gating_func"),
                gating.map_or("absent (llama.cpp then assumes softmax)".to_string(), |v| v.to_string())
            ),
        ));
    }
    let dr = u("rope.dimension_count")?;
    let dk = match opt_u("attention.key_length_mla")? {
        Some(v) => v,
        None => u("attention.key_length")?,
    };
    let dv = match opt_u("attention.value_length_mla")? {
        Some(v) => v,
        None => u("attention.value_length")?,
    };
    if dr == 0 || dr >= dk {
        return Err(cerr(
            g,
            format!(
                "{} {dr} against a key length of {dk}: the MLA head is nope + rope dimensions",
                k("rope.dimension_count")
            ),
        ));
    }
    let rkv = u("attention.kv_lora_rank")?;
    if rkv == 0 {
        return Err(cerr(
            g,
            format!("{} is 0: MLA needs a latent", k("attention.kv_lora_rank")),
        ));
    }
    // DeepseekV2Model writes key_length = kv_lora_rank + qk_rope_head_dim (the MQA view); a
    // rope dimension count below it is a partial rotary factor, which coli's MLA lacks.
    if let Some(kl) = opt_u("attention.key_length_mla")?.and(opt_u("attention.key_length")?) {
        if kl != rkv + dr {
            return Err(cerr(
                g,
                format!(
                    "{} {dr} rotates part of the {} rope dimensions ({} {kl} - {} {rkv}): a partial rotary factor coli's MLA does not run",
                    k("rope.dimension_count"),
                    kl.saturating_sub(rkv),
                    k("attention.key_length"),
                    k("attention.kv_lora_rank")
                ),
            ));
        }
    }
    let experts = u("expert_count")?;
    o.remove("num_experts");
    o.insert("n_routed_experts".into(), experts.into());
    // MLA keeps every head's keys and values; the GGUF's head_count_kv (1) is llama.cpp's MQA
    // view of the latent cache.
    o.insert("num_key_value_heads".into(), heads.into());
    o.insert("q_lora_rank".into(), opt_u("attention.q_lora_rank")?.into());
    o.insert("kv_lora_rank".into(), rkv.into());
    o.insert("qk_rope_head_dim".into(), dr.into());
    o.insert("qk_nope_head_dim".into(), (dk - dr).into());
    o.insert("v_head_dim".into(), dv.into());
    o.insert("rope_interleave".into(), true.into());
    grouped_sigmoid(&keys, o)?;
    o.insert("moe_layer_freq".into(), 1.into());
    o.insert("topk_method".into(), "noaux_tc".into());
    o.insert(
        "num_nextn_predict_layers".into(),
        mtp_blocks(&keys, layers, matches!(arch, "deepseek2" | "deepseek32"))?.into(),
    );
    if g.get(&k("rope.scaling.type")).and_then(Value::as_str) == Some("yarn") {
        for (key, neutral) in [("rope.scaling.yarn_ext_factor", 1.0)] {
            if let Some(v) = opt_f(key)? {
                if v != neutral {
                    return Err(cerr(
                        g,
                        format!(
                            "{} is {v}: coli's YaRN (transformers') has no such factor",
                            k(key)
                        ),
                    ));
                }
            }
        }
        let log_mul = opt_f("rope.scaling.yarn_log_multiplier")?.ok_or_else(|| {
            cerr(
                g,
                format!(
                    "YaRN without {}: the attention scale it sets is unknown",
                    k("rope.scaling.yarn_log_multiplier")
                ),
            )
        })?;
        if log_mul == 0.0 {
            // llama.cpp then scales RoPE and the scores by its own YaRN factor, which
            // transformers' mscale_all_dim 0 does not.
            return Err(cerr(
                g,
                format!(
                    "{} is 0: llama.cpp's YaRN attention scale for it is not the config's",
                    k("rope.scaling.yarn_log_multiplier")
                ),
            ));
        }
        let mscale = f64::from(log_mul as f32 / 0.1f32);
        o.insert(
            "rope_scaling".into(),
            json!({
                "type": "yarn",
                "factor": g.f64(&k("rope.scaling.factor"))?,
                "original_max_position_embeddings": u("rope.scaling.original_context_length")?,
                "beta_fast": opt_f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                "beta_slow": opt_f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                "mscale": mscale,
                "mscale_all_dim": mscale,
            }),
        );
    }
    let split = g.tensors.contains_key("blk.0.attn_k_b.weight");
    if !split && !g.tensors.contains_key("blk.0.attn_kv_b.weight") {
        return Err(cerr(g, "neither blk.0.attn_k_b.weight nor blk.0.attn_kv_b.weight: the MLA up-projection is missing"));
    }
    o.insert("mla_kv_b_split".into(), split.into());
    if matches!(arch, "glm-dsa" | "deepseek32") {
        o.insert(
            "index_n_heads".into(),
            u("attention.indexer.head_count")?.into(),
        );
        o.insert(
            "index_head_dim".into(),
            u("attention.indexer.key_length")?.into(),
        );
        o.insert("index_topk".into(), u("attention.indexer.top_k")?.into());
        let full: Vec<bool> = match g.get(&k("attention.indexer.types")) {
            // As llama.cpp's get_key_or_arr: one value per decoder layer (bool or integer, 0 =
            // shared), or one for every layer.
            Some(v) => {
                let flag = |x: &Value| x.as_bool().or_else(|| x.as_u64().map(|n| n != 0));
                match v.as_array() {
                    Some(a) => a.iter().map(flag).collect::<Option<Vec<_>>>(),
                    None => flag(v).map(|f| vec![f; layers]),
                }
                .filter(|a| a.len() == layers)
                .ok_or_else(|| {
                    cerr(
                        g,
                        format!(
                            "{} must give a bool for each of the {layers} decoder layers",
                            k("attention.indexer.types")
                        ),
                    )
                })?
            }
            None if arch == "deepseek32" || u("context_length")? < 1 << 20 => vec![true; layers],
            None => (0..layers)
                .map(|i| GLM_5_2_INDEXER_TYPES.get(i) == Some(&1))
                .collect(),
        };
        if arch == "deepseek32" {
            // DeepSeek-V3.2 runs its own indexer on every layer (DeepseekV32Config has no
            // shared layers).
            if let Some(i) = full.iter().position(|&f| !f) {
                return Err(cerr(
                    g,
                    format!(
                        "{} makes layer {i} share another layer's indexer: DeepSeek-V3.2 runs its own on every layer",
                        k("attention.indexer.types")
                    ),
                ));
            }
            return Ok(());
        }
        o.insert(
            "indexer_types".into(),
            full.iter()
                .map(|&f| if f { "full" } else { "shared" })
                .collect::<Vec<_>>()
                .into(),
        );
    }
    Ok(())
}

/// The config.json of a `kimi-k3` GGUF (`conversion/kimi_k3.py` `KimiK3Model`) or a
/// `kimi-linear` one (`conversion/kimi_linear.py` `KimiLinearModel`): Kimi-Linear's keys
/// (`model_type` `kimi_linear`), for K3 inside the release's wrapper (`model_type` `kimi_k3`,
/// the language model's keys in `text_config`), from the metadata llama.cpp writes and, where
/// it writes none, from the tensors it holds (an MLA output gate, KDA's full-rank gate, the
/// latent MoE's norm) or its graph (`src/models/kimi-linear.cpp` always renormalizes the top-k:
/// `build_moe_ffn(..., norm_w = true, ...)`; K3's follows `expert_weights_norm`). The layer
/// kinds come from `attention.head_count_kv` (0 for a KDA layer, the converters' convention);
/// the routing is sigmoid (`expert_gating_func` 2); MLA is NoPE, its `kv_b` split as llama.cpp
/// writes it (`mla_kv_b_split`).
fn kimi_kda(g: &Gguf, arch: &str) -> Result<Json> {
    let k3 = arch == "kimi-k3";
    let keys = Keys { g, arch };
    let (k, u) = (|s: &str| keys.key(s), |s: &str| keys.u(s));
    let (opt_u, opt_f) = (|s: &str| keys.opt_u(s), |s: &str| keys.opt_f(s));
    let hidden = u("embedding_length")?;
    let layers = u("block_count")?;
    let heads = u("attention.head_count")?;
    let vocab = vocab_size(g, &k("embedding_length"), hidden)?;
    let kda = kda_layer_kinds(&keys, layers)?;
    let full: Vec<usize> = (0..layers).filter(|&i| !kda[i]).map(|i| i + 1).collect();
    let kda: Vec<usize> = (0..layers).filter(|&i| kda[i]).map(|i| i + 1).collect();
    if opt_u("expert_gating_func")? != Some(2) {
        return Err(cerr(
            g,
            format!(
                "{} must be 2 (sigmoid): Kimi K3 routes with sigmoid scores",
                k("expert_gating_func")
            ),
        ));
    }
    let dr = u("rope.dimension_count")?;
    let (dk, dv) = (
        u("attention.key_length_mla")?,
        u("attention.value_length_mla")?,
    );
    if dr >= dk {
        return Err(cerr(
            g,
            format!(
                "{} {dr} against {} {dk}: the MLA head is nope + rope dimensions",
                k("rope.dimension_count"),
                k("attention.key_length_mla")
            ),
        ));
    }
    let has = |suffix: &str| any_layer_has(g, layers, suffix);
    let split = kv_b_split(g, layers)?;
    let mut lin = json!({
        "full_attn_layers": full,
        "kda_layers": kda,
        "num_heads": heads,
        "head_dim": u("kda.head_dim")?,
        "short_conv_kernel_size": u("ssm.conv_kernel")?,
        // K3's graph always reads the full-rank `ssm_g` (`src/models/kimi-k3.cpp`).
        "use_full_rank_gate": k3 || has("ssm_g.weight"),
    });
    if let Some(lb) = opt_f("kda.gate_lower_bound")? {
        lin["gate_lower_bound"] = json!(lb);
    }
    let tok = |key: &str| token_id(g, key);
    let mut text = json!({
        "model_type": "kimi_linear",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": u("feed_forward_length")?,
        "moe_intermediate_size": u("expert_feed_forward_length")?,
        "num_experts": u("expert_count")?,
        "num_experts_per_token": u("expert_used_count")?,
        // Required by both graphs (`get_key`, no default).
        "num_shared_experts": u("expert_shared_count")?,
        "first_k_dense_replace": opt_u("leading_dense_block_count")?.unwrap_or(0),
        "routed_scaling_factor": opt_f("expert_weights_scale")?.filter(|&v| v != 0.0).unwrap_or(1.0),
        "moe_renormalize": !k3 || g.get(&k("expert_weights_norm")).and_then(Value::as_bool).unwrap_or(false),
        "moe_router_activation_func": "sigmoid",
        "num_expert_group": opt_u("expert_group_count")?.unwrap_or(1).max(1),
        "topk_group": opt_u("expert_group_used_count")?.unwrap_or(1).max(1),
        "q_lora_rank": opt_u("attention.q_lora_rank")?,
        "kv_lora_rank": u("attention.kv_lora_rank")?,
        "qk_rope_head_dim": dr,
        "qk_nope_head_dim": dk - dr,
        "v_head_dim": dv,
        "mla_use_nope": true,
        "mla_kv_b_split": split,
        "mla_use_output_gate": has("attn_gate.weight"),
        "linear_attn_config": lin,
        "rms_norm_eps": g.f64(&k("attention.layer_norm_rms_epsilon"))?,
        "max_position_embeddings": u("context_length")?,
        "vocab_size": vocab,
        "tie_word_embeddings": !g.tensors.contains_key("output.weight"),
        "bos_token_id": tok("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok("tokenizer.ggml.eos_token_id"),
        "num_nextn_predict_layers": 0,
    });
    let t = text.as_object_mut().expect("object");
    if k3 {
        // What K3's graph requires (`get_key` without a default) and reads: SiTU, the
        // attention residuals (a block size of 0: none), its own head (no tied embedding).
        t.insert("hidden_act".into(), "situ".into());
        t.insert(
            "activation_situ_beta".into(),
            g.f64(&k("activation.situ_beta"))?.into(),
        );
        t.insert(
            "activation_situ_linear_beta".into(),
            g.f64(&k("activation.situ_linear_beta"))?.into(),
        );
        let b = u("attn_res.block_size")?;
        if b > 0 {
            t.insert("attn_res_block_size".into(), b.into());
        }
        g.tensor("output.weight")?;
    } else {
        t.insert("hidden_act".into(), "silu".into());
    }
    if let Some(l) = opt_u("expert_latent_length")? {
        t.insert("routed_expert_hidden_size".into(), l.into());
        t.insert(
            "latent_moe_use_norm".into(),
            has("ffn_routed_norm.weight").into(),
        );
    }
    if !k3 {
        return Ok(text);
    }
    Ok(json!({
        "model_type": "kimi_k3",
        "text_config": text,
        "tie_word_embeddings": !g.tensors.contains_key("output.weight"),
        "bos_token_id": tok("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok("tokenizer.ggml.eos_token_id"),
    }))
}

/// The layer kinds of a KDA hybrid GGUF, true for a KDA layer: `attention.head_count_kv` has
/// one value per block, 0 for a KDA layer (the converters' convention); `layers` are the
/// decoder's (MTP blocks after them are not read). Refused unless both kinds are present.
fn kda_layer_kinds(keys: &Keys<'_>, layers: usize) -> Result<Vec<bool>> {
    let (g, k) = (keys.g, keys.key("attention.head_count_kv"));
    let kv: Vec<u64> = match g.get(&k) {
        Some(Value::Array(a)) => a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>(),
        _ => None,
    }
    .filter(|v| v.len() >= layers)
    .ok_or_else(|| {
        cerr(
            g,
            format!("{k} must list one value per layer ({layers}): 0 for a KDA layer, the attention layers' otherwise"),
        )
    })?;
    let kda: Vec<bool> = kv[..layers].iter().map(|&v| v == 0).collect();
    if kda.iter().all(|&x| x) || kda.iter().all(|&x| !x) {
        return Err(cerr(
            g,
            format!(
                "{k} makes every layer {}: the model mixes KDA and attention layers",
                if kda[0] { "KDA" } else { "an attention layer" }
            ),
        ));
    }
    Ok(kda)
}

/// deepseek4 (DeepSeek-V4-Flash / Pro: `DeepseekV4Model` in llama.cpp's `conversion/deepseek.py`,
/// read back by `src/models/deepseek4.cpp`) as a release-style `deepseek_v4` config.json:
/// `attention.{key_length (head_dim), q_lora_rank, output_group_count (o_groups),
/// output_lora_rank, sliding_window}`, `rope.dimension_count` (`qk_rope_head_dim`),
/// `rope.freq_base`, `attention.compress_rope_freq_base`, YaRN from `rope.scaling.{factor,
/// original_context_length, yarn_beta_fast, yarn_beta_slow}` (attention factor 1: a
/// `yarn_log_multiplier` other than 0 is refused), `expert_{count, used_count,
/// feed_forward_length, weights_scale}`, one shared expert, `expert_weights_norm` true and
/// `expert_gating_func` 4 (`sqrtsoftplus`; 2, sigmoid, also runs), `swiglu_clamp_{exp,shexp}`
/// (one limit), `hyper_connection.{count, sinkhorn_iterations, epsilon}`, `hash_layer_count`,
/// the indexer's `attention.indexer.{head_count, key_length, top_k}`. The layer kinds come from
/// `attention.compress_ratios` (one per layer; llama.cpp pools a layer every that many tokens):
/// 0 a sliding layer, else a compressed one, CSA where the block holds the indexer
/// (`indexer.attn_q_b`), HCA otherwise; the CSA layers' ratio and the HCA layers' are the
/// config's `compress_rates` (one each, else refused), which transformers' config keeps apart
/// from the kinds. The MTP layer (which llama.cpp's converter skips) is not converted.
fn deepseek4(g: &Gguf) -> Result<Json> {
    let arch = "deepseek4";
    let keys = Keys { g, arch };
    let (k, u) = (|s: &str| keys.key(s), |s: &str| keys.u(s));
    let (opt_u, opt_f) = (|s: &str| keys.opt_u(s), |s: &str| keys.opt_f(s));
    let mut o = serde_json::Map::new();
    let layers = decoder_layers(&keys, &mut o)?;
    let hidden = u("embedding_length")?;
    let vocab = vocab_size(g, &k("embedding_length"), hidden)?;
    let scoring = match opt_u("expert_gating_func")? {
        Some(4) => "sqrtsoftplus",
        Some(2) => "sigmoid",
        v => {
            return Err(cerr(
                g,
                format!(
                    "{} is {}: DeepSeek-V4 routes with sqrtsoftplus (4) or sigmoid (2) scores",
                    k("expert_gating_func"),
                    v.map_or("absent".to_string(), |v| v.to_string())
                ),
            ))
        }
    };
    if let Some(n) = opt_u("expert_shared_count")?.filter(|&n| n != 1) {
        return Err(cerr(
            g,
            format!(
                "{} is {n}: DeepSeek-V4 has one shared expert",
                k("expert_shared_count")
            ),
        ));
    }
    if g.get(&k("expert_weights_norm")).and_then(Value::as_bool) == Some(false) {
        return Err(cerr(
            g,
            format!(
                "{} is false: DeepSeek-V4 renormalizes its top-k weights",
                k("expert_weights_norm")
            ),
        ));
    }
    if let Some(m) = opt_f("rope.scaling.yarn_log_multiplier")?.filter(|&m| m != 0.0) {
        return Err(cerr(
            g,
            format!(
                "{} is {m}: DeepSeek-V4's YaRN has attention factor 1",
                k("rope.scaling.yarn_log_multiplier")
            ),
        ));
    }
    // Layer kinds and the two pooling rates from the per-layer ratios.
    let ratios: Vec<usize> = g
        .get(&k("attention.compress_ratios"))
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_u64().map(|x| x as usize))
                .collect::<Option<Vec<_>>>()
        })
        .filter(|a| a.len() >= layers)
        .ok_or_else(|| {
            cerr(
                g,
                format!(
                    "{} must give a ratio for each of the {layers} layers",
                    k("attention.compress_ratios")
                ),
            )
        })?;
    let (mut kinds, mut csa, mut hca) = (Vec::new(), None, None);
    for (i, &r) in ratios[..layers].iter().enumerate() {
        let kind = if r == 0 {
            "sliding_attention"
        } else if g
            .tensors
            .contains_key(&format!("blk.{i}.indexer.attn_q_b.weight"))
        {
            "compressed_sparse_attention"
        } else {
            "heavily_compressed_attention"
        };
        let rate = if kind.starts_with("compressed") {
            &mut csa
        } else {
            &mut hca
        };
        if r != 0 {
            if rate.is_some_and(|x| x != r) {
                return Err(cerr(
                    g,
                    format!(
                        "{} gives layer {i} ratio {r}, another layer of its kind ({kind}) {}: coli runs one rate per kind",
                        k("attention.compress_ratios"),
                        rate.unwrap_or(0)
                    ),
                ));
            }
            *rate = Some(r);
        }
        kinds.push(kind);
    }
    let hash = opt_u("hash_layer_count")?.unwrap_or(0);
    if hash > layers {
        return Err(cerr(
            g,
            format!(
                "{} {hash} is more than the {layers} layers",
                k("hash_layer_count")
            ),
        ));
    }
    let hc = u("hyper_connection.count")?;
    if let Some(out) = opt_u("embedding_length_out")?.filter(|&x| x != hidden * hc) {
        return Err(cerr(
            g,
            format!(
                "{} {out} is not {} {hidden} x {} {hc}",
                k("embedding_length_out"),
                k("embedding_length"),
                k("hyper_connection.count")
            ),
        ));
    }
    let limit = one_swiglu_limit(&keys, "DeepSeek-V4")?;
    let tok = |key: &str| token_id(g, key);
    let mut c = json!({
        "model_type": "deepseek_v4",
        "hidden_size": hidden,
        "num_attention_heads": u("attention.head_count")?,
        "num_key_value_heads": 1,
        "head_dim": u("attention.key_length")?,
        "qk_rope_head_dim": u("rope.dimension_count")?,
        "q_lora_rank": u("attention.q_lora_rank")?,
        "o_groups": u("attention.output_group_count")?,
        "o_lora_rank": u("attention.output_lora_rank")?,
        "sliding_window": u("attention.sliding_window")?,
        "layer_types": kinds,
        "compress_rates": {
            "compressed_sparse_attention": csa.unwrap_or(4),
            "heavily_compressed_attention": hca.unwrap_or(128),
        },
        "num_hash_layers": hash,
        "mlp_layer_types": (0..layers).map(|i| if i < hash { "hash_moe" } else { "moe" }).collect::<Vec<_>>(),
        "n_routed_experts": u("expert_count")?,
        "num_experts_per_tok": u("expert_used_count")?,
        "moe_intermediate_size": u("expert_feed_forward_length")?,
        "n_shared_experts": 1,
        "norm_topk_prob": true,
        "scoring_func": scoring,
        "topk_method": "noaux_tc",
        "routed_scaling_factor": opt_f("expert_weights_scale")?.filter(|&v| v != 0.0).unwrap_or(1.0),
        "index_n_heads": u("attention.indexer.head_count")?,
        "index_head_dim": u("attention.indexer.key_length")?,
        "index_topk": u("attention.indexer.top_k")?,
        "hc_mult": hc,
        "hc_sinkhorn_iters": u("hyper_connection.sinkhorn_iterations")?,
        "hc_eps": g.f64(&k("hyper_connection.epsilon"))?,
        "rope_theta": opt_f("rope.freq_base")?.unwrap_or(10_000.0),
        "compress_rope_theta": g.f64(&k("attention.compress_rope_freq_base"))?,
        "rms_norm_eps": g.f64(&k("attention.layer_norm_rms_epsilon"))?,
        "max_position_embeddings": u("context_length")?,
        "vocab_size": vocab,
        "tie_word_embeddings": !g.tensors.contains_key("output.weight"),
        "hidden_act": "silu",
        "bos_token_id": tok("tokenizer.ggml.bos_token_id"),
        "eos_token_id": tok("tokenizer.ggml.eos_token_id"),
        "num_nextn_predict_layers": 0,
    });
    if let Some(l) = limit {
        c["swiglu_limit"] = json!(l);
    }
    match g.get(&k("rope.scaling.type")).and_then(Value::as_str) {
        None | Some("none") => {}
        Some("yarn") => {
            c["rope_scaling"] = json!({
                "type": "yarn",
                "factor": g.f64(&k("rope.scaling.factor"))?,
                "original_max_position_embeddings": u("rope.scaling.original_context_length")?,
                "beta_fast": opt_f("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                "beta_slow": opt_f("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            });
        }
        Some(t) => {
            return Err(cerr(
                g,
                format!(
                    "{} is {t:?}: DeepSeek-V4 runs with YaRN or no scaling",
                    k("rope.scaling.type")
                ),
            ))
        }
    }
    let m = c.as_object_mut().expect("object");
    m.extend(o);
    Ok(c)
}

/// The one SwiGLU limit of every layer, routed and shared experts alike, from
/// `swiglu_clamp_exp` / `swiglu_clamp_shexp` (a value or one per layer, as llama.cpp's converters
/// write them); None when neither key is there.
///
/// # Errors
/// Limits that differ between layers or between the routed and shared experts, naming the keys
/// (`family` runs one limit).
fn one_swiglu_limit(keys: &Keys<'_>, family: &str) -> Result<Option<f64>> {
    let (g, k) = (keys.g, |s: &str| keys.key(s));
    let clamp = |key: &str| -> Result<Option<f64>> {
        let Some(v) = g.get(&k(key)) else {
            return Ok(None);
        };
        let vals: Option<Vec<f64>> = match v {
            Value::Array(a) => a.iter().map(Value::as_f64).collect(),
            v => v.as_f64().map(|x| vec![x]),
        };
        match vals.as_deref() {
            Some([first, rest @ ..]) if rest.iter().all(|x| x == first) => Ok(Some(*first)),
            _ => Err(cerr(
                g,
                format!("{} must give one limit for every layer", k(key)),
            )),
        }
    };
    match (clamp("swiglu_clamp_exp")?, clamp("swiglu_clamp_shexp")?) {
        (Some(a), Some(b)) if a == b => Ok(Some(a)),
        (Some(a), None) => Ok(Some(a)),
        (None, None) => Ok(None),
        (a, b) => Err(cerr(
            g,
            format!(
                "{} {a:?} and {} {b:?}: coli runs {family} with one SwiGLU limit for its routed and shared experts",
                k("swiglu_clamp_exp"),
                k("swiglu_clamp_shexp")
            ),
        )),
    }
}

/// The config.json of a `glm5-next` GGUF (GLM-5.3-Flash; `conversion/glm.py` `Glm5NextModel`,
/// `src/models/glm5-next.cpp`): the release's wrapper (`model_type` `glm5_next`, the language
/// model `glm5_next_text` in `text_config`) with transformers' keys. KDA layers from
/// `attention.head_count_kv` (0), the others DSA (NoPE MLA: `rope.dimension_count` 0; `kv_b`
/// split) with the k-pool indexer (`attention.indexer.{head_count, key_length, top_k, kpool,
/// kpool_select_tail, types}`), the hyper-connections (`hyper_connection.{count,
/// sinkhorn_iterations, epsilon}`), the SwiGLU clamp (`swiglu_clamp_exp` /
/// `swiglu_clamp_shexp`, one limit for every layer and both), grouped sigmoid routing
/// (`expert_gating_func` absent: sigmoid, as the graph assumes); the MTP blocks llama.cpp
/// appends (`nextn_predict_layers`) are not converted.
fn glm5_next(g: &Gguf) -> Result<Json> {
    let arch = "glm5-next";
    let keys = Keys { g, arch };
    let (k, u) = (|s: &str| keys.key(s), |s: &str| keys.u(s));
    let (opt_u, opt_f) = (|s: &str| keys.opt_u(s), |s: &str| keys.opt_f(s));
    let mut text = serde_json::Map::new();
    let layers = decoder_layers(&keys, &mut text)?;
    let heads = u("attention.head_count")?;
    let hidden = u("embedding_length")?;
    let vocab = vocab_size(g, &k("embedding_length"), hidden)?;
    let kda = kda_layer_kinds(&keys, layers)?;
    if let Some(f) = opt_u("expert_gating_func")?.filter(|&f| f != 0 && f != 2) {
        return Err(cerr(
            g,
            format!(
                "{} is {f}: GLM-5.3-Flash routes with sigmoid scores (2)",
                k("expert_gating_func")
            ),
        ));
    }
    let rope = u("rope.dimension_count")?;
    if rope != 0 {
        return Err(cerr(
            g,
            format!(
                "{} is {rope}: GLM-5.3-Flash's DSA layers have no RoPE",
                k("rope.dimension_count")
            ),
        ));
    }
    let split = kv_b_split(g, layers)?;
    let limit = one_swiglu_limit(&keys, "GLM-5.3-Flash")?
        .ok_or_else(|| cerr(g, format!("{} is missing", k("swiglu_clamp_exp"))))?;
    // transformers' `indexer_types` has one entry per layer (the KDA layers' are not read), as
    // the converter writes them; a list of the DSA layers' only is read too.
    let dsa: Vec<usize> = (0..layers).filter(|&i| !kda[i]).collect();
    let indexer_types: Vec<&str> = match g.get(&k("attention.indexer.types")) {
        Some(Value::Array(a)) => {
            let v = a
                .iter()
                .map(|x| x.as_bool().or_else(|| x.as_u64().map(|n| n != 0)))
                .collect::<Option<Vec<_>>>()
                .filter(|v| v.len() == dsa.len() || v.len() >= layers)
                .ok_or_else(|| {
                    cerr(
                        g,
                        format!(
                            "{} must give a bool per layer",
                            k("attention.indexer.types")
                        ),
                    )
                })?;
            let per_layer: Vec<bool> = if v.len() >= layers {
                v[..layers].to_vec()
            } else {
                let mut d = v.iter();
                (0..layers)
                    .map(|i| kda[i] || *d.next().expect("one per DSA layer"))
                    .collect()
            };
            per_layer
                .iter()
                .map(|&f| if f { "full" } else { "shared" })
                .collect()
        }
        _ => vec!["full"; layers],
    };
    let mut lin = json!({
        "num_heads": heads,
        "head_dim": u("kda.head_dim")?,
        "short_conv_kernel_size": u("ssm.conv_kernel")?,
    });
    if let Some(lb) = opt_f("kda.gate_lower_bound")? {
        lin["gate_lower_bound"] = json!(lb);
    }
    let dense_lead = opt_u("leading_dense_block_count")?.unwrap_or(0);
    let tok = |key: &str| token_id(g, key);
    let t = json!({
        "model_type": "glm5_next_text",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": u("feed_forward_length")?,
        "moe_intermediate_size": u("expert_feed_forward_length")?,
        "n_routed_experts": u("expert_count")?,
        "num_experts_per_tok": u("expert_used_count")?,
        "n_shared_experts": opt_u("expert_shared_count")?.unwrap_or(0),
        "n_group": opt_u("expert_group_count")?.unwrap_or(1).max(1),
        "topk_group": opt_u("expert_group_used_count")?.unwrap_or(1).max(1),
        "routed_scaling_factor": opt_f("expert_weights_scale")?.filter(|&v| v != 0.0).unwrap_or(1.0),
        "norm_topk_prob": g.get(&k("expert_weights_norm")).and_then(Value::as_bool).unwrap_or(false),
        "q_lora_rank": u("attention.q_lora_rank")?,
        "kv_lora_rank": u("attention.kv_lora_rank")?,
        "qk_nope_head_dim": u("attention.key_length_mla")?,
        "qk_rope_head_dim": 0,
        "v_head_dim": u("attention.value_length_mla")?,
        "mla_kv_b_split": split,
        "layer_types": kda.iter().map(|&x| if x { "linear_attention" } else { "full_attention" }).collect::<Vec<_>>(),
        "mlp_layer_types": (0..layers).map(|i| if i < dense_lead { "dense" } else { "sparse" }).collect::<Vec<_>>(),
        "linear_attn_config": lin,
        "index_n_heads": u("attention.indexer.head_count")?,
        "index_head_dim": u("attention.indexer.key_length")?,
        "index_topk": u("attention.indexer.top_k")?,
        "index_kpool": u("attention.indexer.kpool")?,
        "index_kpool_always_select_tail": g.get(&k("attention.indexer.kpool_select_tail")).and_then(Value::as_bool).unwrap_or(true),
        "indexer_types": indexer_types,
        "hc_mult": u("hyper_connection.count")?,
        "hc_sinkhorn_iters": u("hyper_connection.sinkhorn_iterations")?,
        "hc_eps": g.f64(&k("hyper_connection.epsilon"))?,
        "swiglu_limit": limit,
        "rms_norm_eps": g.f64(&k("attention.layer_norm_rms_epsilon"))?,
        "max_position_embeddings": u("context_length")?,
        "vocab_size": vocab,
        "tie_word_embeddings": !g.tensors.contains_key("output.weight"),
        "attention_bias": false,
        "hidden_act": "silu",
        "eos_token_id": tok("tokenizer.ggml.eos_token_id"),
        "num_nextn_predict_layers": 0,
    });
    let mut t = t.as_object().expect("object").clone();
    t.extend(text);
    Ok(json!({
        "model_type": "glm5_next",
        "text_config": t,
        "tie_word_embeddings": !g.tensors.contains_key("output.weight"),
    }))
}

/// [`gguf_name`] in the model `config` describes (the config.json [`config_json`] writes):
/// there a KDA hybrid's `self_attn.g_proj` is named by its layer's kind, KDA's full-rank gate
/// `ssm_g` or an MLA layer's output gate `attn_gate` (`linear_attn_config.full_attn_layers`,
/// 1-based).
pub fn gguf_name_in(config: &Json, hf: &str) -> Option<String> {
    let model_type = config["model_type"].as_str().unwrap_or_default();
    if let Some(rest) = hf.strip_prefix("mtp.") {
        return qwen_mtp_name(config, model_type, rest);
    }
    let name = gguf_name(model_type, hf)?;
    let layer = hf
        .strip_prefix("model.layers.")
        .and_then(|r| r.strip_suffix(".self_attn.g_proj.weight"))
        .and_then(|n| n.parse::<u64>().ok());
    let t = config.get("text_config").unwrap_or(config);
    match (layer, t.pointer("/linear_attn_config/full_attn_layers")) {
        (Some(i), Some(Json::Array(full))) if full.iter().any(|v| v.as_u64() == Some(i + 1)) => {
            Some(name.replace(".ssm_g.", ".attn_gate."))
        }
        _ => Some(name),
    }
}

/// The GGUF name of Qwen3-Next's / Qwen3.5's MTP tensor `mtp.{rest}` (spec name): llama.cpp's
/// converter writes the MTP block as block L = `num_hidden_layers` (`conversion/qwen.py`,
/// `_QwenMtpMixin`): `fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden`, `norm` as
/// `blk.L.nextn.{eh_proj, enorm, hnorm, shared_head_norm}`, `layers.k.*` as block L + k's.
fn qwen_mtp_name(config: &Json, model_type: &str, rest: &str) -> Option<String> {
    if !matches!(model_type, "qwen3_next" | "qwen3_5_moe") {
        return None;
    }
    let t = config.get("text_config").unwrap_or(config);
    let l = t["num_hidden_layers"].as_u64()?;
    let nextn = |n: &str| Some(format!("blk.{l}.nextn.{n}.weight"));
    match rest {
        "fc.weight" => nextn("eh_proj"),
        "pre_fc_norm_embedding.weight" => nextn("enorm"),
        "pre_fc_norm_hidden.weight" => nextn("hnorm"),
        "norm.weight" => nextn("shared_head_norm"),
        _ => {
            let (k, inner) = rest.strip_prefix("layers.")?.split_once('.')?;
            let k: u64 = k.parse().ok()?;
            gguf_name(model_type, &format!("model.layers.{}.{inner}", l + k))
        }
    }
}

/// The values of a spec tensor a `kimi-k3`, `kimi-linear`, `glm5-next`, `qwen3next` or
/// `qwen35moe` GGUF holds in another form, from the GGUF tensor's F32 `data` (None for every
/// other tensor: its bytes are copied):
/// - `A_log`: llama.cpp's converters (`KimiK3Model`, `KimiLinearModel`, `Glm5NextModel`,
///   `Qwen3NextModel` and its subclasses) fold `-exp(A_log)` into `ssm_a`;
///   `A_log = ln(-ssm_a)`, computed in f64 and rounded once (the engine's `-exp` of it gives
///   `ssm_a` back within an ulp);
/// - the attention-residual queries: llama.cpp fuses `*_res_norm * *_res_proj` into one
///   `*_res_score`; the proj takes the score and the norm ones, so the engine's product is the
///   score exactly.
///
/// # Errors
/// The index and value of an `ssm_a` entry that is not negative and finite (`-exp` of a real
/// number is).
pub fn derived_values(
    config: &Json,
    hf: &str,
    data: &[u8],
) -> Option<std::result::Result<Vec<u8>, String>> {
    if config["model_type"].as_str() == Some("deepseek_v4") && hf.ends_with(".ffn.gate.tid2eid") {
        return Some(tid2eid_values(config, data));
    }
    if !matches!(
        config["model_type"].as_str(),
        Some("kimi_k3" | "kimi_linear" | "glm5_next" | "qwen3_next" | "qwen3_5_moe")
    ) {
        return None;
    }
    let f32s = || {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    };
    let bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    if hf.ends_with(".A_log") {
        let mut out = Vec::with_capacity(data.len() / 4);
        for (i, a) in f32s().enumerate() {
            if !(a < 0.0 && a.is_finite()) {
                return Some(Err(format!(
                    "value {i} is {a}: llama.cpp writes -exp(A_log) there, a negative number"
                )));
            }
            out.push((-f64::from(a)).ln() as f32);
        }
        return Some(Ok(bytes(out)));
    }
    if hf.ends_with("_res_norm.weight") {
        return Some(Ok(bytes(vec![1.0; data.len() / 4])));
    }
    None
}

/// The ggml type a GGUF holds the spec tensor `hf` in where [`derived_values`] turns it back:
/// I32 (26) for DeepSeek-V4's hash-routing tables (`tid2eid`, which llama.cpp's converter writes
/// as I32), F32 (0) for the rest.
pub fn derived_source_type(config: &Json, hf: &str) -> u32 {
    if config["model_type"].as_str() == Some("deepseek_v4") && hf.ends_with(".ffn.gate.tid2eid") {
        26
    } else {
        0
    }
}

/// DeepSeek-V4's hash-routing table from llama.cpp's I32 `ffn_gate_tid2eid` (`data`, little
/// endian): the same expert ids as exact f32 values (the spec's tensor, as the checkpoint path
/// stores the release's I64 table).
fn tid2eid_values(config: &Json, data: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let experts = config["n_routed_experts"].as_u64().unwrap_or(0) as i64;
    let mut out = Vec::with_capacity(data.len());
    for (i, c) in data.chunks_exact(4).enumerate() {
        let id = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        if !(0..experts).contains(&i64::from(id)) {
            return Err(format!(
                "entry {i} is {id}, not an expert id (0..{experts})"
            ));
        }
        out.extend_from_slice(&(id as f32).to_le_bytes());
    }
    Ok(out)
}

/// The GGUF name of the checkpoint tensor `hf` (the spec's name) in a GGUF of the family
/// `model_type` (the config's, e.g. `glm4_moe`), or None for a name this map does not know.
/// Routed experts are not here: they are slices of `blk.N.ffn_*_exps.weight`
/// ([`expert_tensors`]). The map is gguf-py's `tensor_mapping.py` inverted; where an
/// architecture names a tensor its own way (GLM-4.x's `post_attention_layernorm` is
/// `post_attention_norm`, llama.cpp's `LLM_TENSOR_ATTN_POST_NORM`), `model_type` decides.
pub fn gguf_name(model_type: &str, hf: &str) -> Option<String> {
    if model_type == "deepseek_v4" {
        return deepseek_v4_name(hf);
    }
    match hf {
        "model.output_attn_res_norm.weight" | "model.output_attn_res_proj.weight"
            if matches!(model_type, "kimi_k3" | "kimi_linear") =>
        {
            return Some("output_res_score.weight".into())
        }
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (n, rest) = rest.split_once('.')?;
    n.parse::<u32>().ok()?;
    if rest == "mlp.gate.e_score_correction_bias" {
        return Some(format!("blk.{n}.exp_probs_b.bias"));
    }
    if rest == "block_sparse_moe.e_score_correction_bias" {
        // MiniMax-M2's selection bias, on the block.
        return Some(format!("blk.{n}.exp_probs_b.bias"));
    }
    // A K3 store's family is its language model's, `kimi_linear`; GLM-5.3-Flash's KDA layers
    // have the same names.
    if matches!(
        model_type,
        "kimi_k3" | "kimi_linear" | "glm5_next" | "glm5_next_text"
    ) {
        if let Some(name) = kimi_k3_name(n, rest) {
            return Some(name);
        }
    }
    if matches!(model_type, "qwen3_next" | "qwen3_5_moe") {
        if let Some(name) = qwen_linear_name(n, rest) {
            return Some(name);
        }
    }
    if rest == "self_attn.sinks" {
        // gpt-oss's per-head attention sinks (`LLM_TENSOR_ATTN_SINKS`).
        return Some(format!("blk.{n}.attn_sinks.weight"));
    }
    let (stem, suffix) = rest.rsplit_once('.')?;
    let g = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm"
            if matches!(
                model_type,
                "glm4_moe" | "gpt_oss" | "qwen3_next" | "qwen3_5_moe"
            ) =>
        {
            "post_attention_norm"
        }
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate" | "block_sparse_moe.gate" | "mlp.router" => "ffn_gate_inp",
        // deepseek2 (gguf-py MODEL_TENSORS[DEEPSEEK2]).
        "self_attn.q_a_proj" => "attn_q_a",
        "self_attn.q_a_layernorm" => "attn_q_a_norm",
        "self_attn.q_b_proj" => "attn_q_b",
        "self_attn.kv_a_proj_with_mqa" => "attn_kv_a_mqa",
        "self_attn.kv_a_layernorm" => "attn_kv_a_norm",
        "self_attn.kv_b_proj" => "attn_kv_b",
        "self_attn.k_b_proj" => "attn_k_b",
        "self_attn.v_b_proj" => "attn_v_b",
        // glm-dsa (gguf-py MODEL_TENSORS[GLM_DSA]).
        "self_attn.indexer.wq_b" => "indexer.attn_q_b",
        "self_attn.indexer.wk" => "indexer.attn_k",
        "self_attn.indexer.k_norm" => "indexer.k_norm",
        "self_attn.indexer.weights_proj" => "indexer.proj",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.shared_experts.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_experts.up_proj" => "ffn_up_shexp",
        "mlp.shared_experts.down_proj" => "ffn_down_shexp",
        // Qwen3-Next / Qwen3.5's one gated shared expert.
        "mlp.shared_expert.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" => "ffn_down_shexp",
        "mlp.shared_expert_gate" => "ffn_gate_inp_shexp",
        // The MTP layer of deepseek2, deepseek32, glm-dsa and glm4moe files (gguf-py's NEXTN_*
        // tensors):
        // block L = the decoder's layer count.
        "eh_proj" => "nextn.eh_proj",
        "enorm" => "nextn.enorm",
        "hnorm" => "nextn.hnorm",
        "embed_tokens" => "nextn.embed_tokens",
        "shared_head.head" => "nextn.shared_head_head",
        "shared_head.norm" => "nextn.shared_head_norm",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}.{suffix}"))
}

/// The GGUF name of DeepSeek-V4's tensor `hf` (the release's name, the spec's) as llama.cpp's
/// `DeepseekV4Model._map_dsv4_tensor_name` writes it (gguf-py `MODEL_TENSORS[DEEPSEEK4]`).
fn deepseek_v4_name(hf: &str) -> Option<String> {
    let root = match hf {
        "embed.weight" => Some("token_embd.weight"),
        "norm.weight" => Some("output_norm.weight"),
        "head.weight" => Some("output.weight"),
        "hc_head_fn" => Some("output_hc_fn.weight"),
        "hc_head_base" => Some("output_hc_base.weight"),
        "hc_head_scale" => Some("output_hc_scale.weight"),
        _ => None,
    };
    if let Some(r) = root {
        return Some(r.to_string());
    }
    let (n, rest) = hf.strip_prefix("layers.")?.split_once('.')?;
    n.parse::<u32>().ok()?;
    let g = match rest {
        "hc_attn_fn" => "hc_attn_fn.weight",
        "hc_attn_base" => "hc_attn_base.weight",
        "hc_attn_scale" => "hc_attn_scale.weight",
        "hc_ffn_fn" => "hc_ffn_fn.weight",
        "hc_ffn_base" => "hc_ffn_base.weight",
        "hc_ffn_scale" => "hc_ffn_scale.weight",
        "attn.attn_sink" => "attn_sinks.weight",
        "attn.wq_a.weight" => "attn_q_a.weight",
        "attn.wq_b.weight" => "attn_q_b.weight",
        "attn.q_norm.weight" => "attn_q_a_norm.weight",
        "attn.wkv.weight" => "attn_kv.weight",
        "attn.kv_norm.weight" => "attn_kv_a_norm.weight",
        "attn.wo_a.weight" => "attn_output_a.weight",
        "attn.wo_b.weight" => "attn_output_b.weight",
        "attn.compressor.ape" => "attn_compressor_ape.weight",
        "attn.compressor.wkv.weight" => "attn_compressor_kv.weight",
        "attn.compressor.wgate.weight" => "attn_compressor_gate.weight",
        "attn.compressor.norm.weight" => "attn_compressor_norm.weight",
        "attn.indexer.wq_b.weight" => "indexer.attn_q_b.weight",
        "attn.indexer.weights_proj.weight" => "indexer.proj.weight",
        "attn.indexer.compressor.ape" => "indexer_compressor_ape.weight",
        "attn.indexer.compressor.wkv.weight" => "indexer_compressor_kv.weight",
        "attn.indexer.compressor.wgate.weight" => "indexer_compressor_gate.weight",
        "attn.indexer.compressor.norm.weight" => "indexer_compressor_norm.weight",
        "attn_norm.weight" => "attn_norm.weight",
        "ffn_norm.weight" => "ffn_norm.weight",
        "ffn.gate.weight" => "ffn_gate_inp.weight",
        "ffn.gate.bias" => "exp_probs_b.bias",
        "ffn.gate.tid2eid" => "ffn_gate_tid2eid.weight",
        "ffn.shared_experts.w1.weight" => "ffn_gate_shexp.weight",
        "ffn.shared_experts.w2.weight" => "ffn_down_shexp.weight",
        "ffn.shared_experts.w3.weight" => "ffn_up_shexp.weight",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}"))
}

/// Kimi K3's and Kimi-Linear's own tensors of layer `n` (`rest` after `model.layers.{n}.`), as
/// `KimiK3Model` / `KimiLinearModel` name them (gguf-py `MODEL_TENSORS[KIMI_K3]`,
/// `[KIMI_LINEAR]`); None for the ones they share with the other architectures (norms,
/// q/k/v/o, MLA, router, shared experts, the dense MLP).
fn kimi_k3_name(n: &str, rest: &str) -> Option<String> {
    let g = match rest {
        "self_attention_res_norm.weight" | "self_attention_res_proj.weight" => {
            "attn_res_score.weight"
        }
        "mlp_res_norm.weight" | "mlp_res_proj.weight" => "ffn_res_score.weight",
        "self_attn.q_conv1d.weight" => "ssm_conv1d_q.weight",
        "self_attn.k_conv1d.weight" => "ssm_conv1d_k.weight",
        "self_attn.v_conv1d.weight" => "ssm_conv1d_v.weight",
        "self_attn.f_a_proj.weight" => "ssm_f_a.weight",
        "self_attn.f_b_proj.weight" => "ssm_f_b.weight",
        "self_attn.b_proj.weight" => "ssm_beta.weight",
        "self_attn.A_log" => "ssm_a",
        "self_attn.dt_bias" => "ssm_dt.bias",
        "self_attn.o_norm.weight" => "ssm_norm.weight",
        // KDA's full-rank gate; an MLA layer's output gate of the same name is `attn_gate`
        // ([`gguf_name_in`]).
        "self_attn.g_proj.weight" => "ssm_g.weight",
        // Kimi-Linear's low-rank gate.
        "self_attn.g_a_proj.weight" => "ssm_g_a.weight",
        "self_attn.g_b_proj.weight" => "ssm_g_b.weight",
        "block_sparse_moe.gate.weight" => "ffn_gate_inp.weight",
        "block_sparse_moe.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "block_sparse_moe.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "block_sparse_moe.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "block_sparse_moe.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        "block_sparse_moe.routed_expert_down_proj.weight" => "ffn_routed_down.weight",
        "block_sparse_moe.routed_expert_up_proj.weight" => "ffn_routed_up.weight",
        "block_sparse_moe.routed_expert_norm.weight" => "ffn_routed_norm.weight",
        // GLM-5.3-Flash: the hyper-connections and the k-pool indexer's compressor
        // (`Glm5NextModel.modify_tensors` names them by map_tensor_name + ".weight").
        "hc_attn_fn" => "hc_attn_fn.weight",
        "hc_attn_base" => "hc_attn_base.weight",
        "hc_attn_scale" => "hc_attn_scale.weight",
        "hc_ffn_fn" => "hc_ffn_fn.weight",
        "hc_ffn_base" => "hc_ffn_base.weight",
        "hc_ffn_scale" => "hc_ffn_scale.weight",
        "self_attn.indexer.index_kpool_compress_ape" => "indexer_compressor_ape.weight",
        "self_attn.indexer.index_kpool_compress_gate" => "indexer_compressor_gate.weight",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}"))
}

/// The Gated DeltaNet tensors of layer `n` (`rest` after `model.layers.{n}.`) as llama.cpp's
/// `Qwen3NextModel` / `Qwen3_5MoeTextModel` name them (gguf-py `MODEL_TENSORS[QWEN3NEXT]`,
/// `[QWEN35MOE]`): `ssm_in` is the published `in_proj_qkvz` (earlier converters), `attn_qkv`
/// and `attn_gate` its split (or Qwen3.5's `in_proj_qkv` / `in_proj_z`), `ssm_ba` the
/// grouped `in_proj_ba`, `ssm_beta` / `ssm_alpha` Qwen3.5's `in_proj_b` / `in_proj_a`.
fn qwen_linear_name(n: &str, rest: &str) -> Option<String> {
    let g = match rest.strip_prefix("linear_attn.")? {
        "in_proj_qkvz.weight" => "ssm_in.weight",
        "in_proj_qkv.weight" => "attn_qkv.weight",
        "in_proj_z.weight" => "attn_gate.weight",
        "in_proj_ba.weight" => "ssm_ba.weight",
        "in_proj_b.weight" => "ssm_beta.weight",
        "in_proj_a.weight" => "ssm_alpha.weight",
        "conv1d.weight" => "ssm_conv1d.weight",
        "dt_bias" => "ssm_dt.bias",
        "A_log" => "ssm_a",
        "norm.weight" => "ssm_norm.weight",
        "out_proj.weight" => "ssm_out.weight",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}"))
}

/// For a tensor whose rows the architecture's converter reordered, the reordering to undo:
/// row `q` of the checkpoint tensor (the spec's name `hf`, `rows` rows) is row `perm[q]` of the
/// GGUF tensor. llama's `q_proj` (heads = `num_attention_heads`) and `k_proj` (heads =
/// `num_key_value_heads`): GGUF row `h hd + 2j + s` holds checkpoint row `h hd + s hd/2 + j`.
/// None for every other tensor.
pub fn row_permutation(config: &Json, hf: &str, rows: usize) -> Option<Vec<usize>> {
    if config["model_type"] != "mixtral" {
        return None;
    }
    let heads = if hf.ends_with("self_attn.q_proj.weight") {
        config["num_attention_heads"].as_u64()?
    } else if hf.ends_with("self_attn.k_proj.weight") {
        config["num_key_value_heads"].as_u64()?
    } else {
        return None;
    } as usize;
    let hd = rows / heads;
    let mut perm = vec![0; rows];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..hd / 2 {
                perm[h * hd + s * hd / 2 + j] = h * hd + 2 * j + s;
            }
        }
    }
    Some(perm)
}

/// Rows of `data` (`perm.len()` rows of equal length) in the order `perm` gives: output row `q`
/// is input row `perm[q]`.
pub fn permute_rows(data: &[u8], perm: &[usize]) -> Vec<u8> {
    let rb = data.len() / perm.len().max(1);
    let mut out = Vec::with_capacity(data.len());
    for &p in perm {
        out.extend_from_slice(&data[p * rb..(p + 1) * rb]);
    }
    out
}

/// The inverse of a permutation.
pub fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (q, &p) in perm.iter().enumerate() {
        inv[p] = q;
    }
    inv
}

/// The stacked expert tensors of layer `layer`: gate, up, down (`[E, I, H]`, `[E, I, H]`,
/// `[E, H, I]` outermost first).
pub fn expert_tensors(layer: u32) -> [String; 3] {
    ["gate", "up", "down"].map(|m| format!("blk.{layer}.ffn_{m}_exps.weight"))
}

/// The stacked expert biases of layer `layer` (gpt-oss): gate, up, down (`[E, I]`, `[E, I]`,
/// `[E, H]`, F32).
pub fn expert_bias_tensors(layer: u32) -> [String; 3] {
    ["gate", "up", "down"].map(|m| format!("blk.{layer}.ffn_{m}_exps.bias"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            gguf_name("olmoe", "model.layers.3.self_attn.o_proj.weight").unwrap(),
            "blk.3.attn_output.weight"
        );
        assert_eq!(
            gguf_name("olmoe", "model.layers.0.mlp.gate.weight").unwrap(),
            "blk.0.ffn_gate_inp.weight"
        );
        assert_eq!(
            gguf_name("olmoe", "model.layers.0.self_attn.q_proj.bias").unwrap(),
            "blk.0.attn_q.bias"
        );
        assert_eq!(
            gguf_name("olmoe", "model.layers.0.mlp.experts.1.up_proj.weight"),
            None
        );
        assert_eq!(expert_tensors(2)[2], "blk.2.ffn_down_exps.weight");
    }

    #[test]
    fn kimi_k3_names_and_derived_values() {
        for (hf, g) in [
            ("model.layers.4.self_attn.A_log", "blk.4.ssm_a"),
            ("model.layers.4.self_attn.dt_bias", "blk.4.ssm_dt.bias"),
            (
                "model.layers.4.self_attn.g_proj.weight",
                "blk.4.ssm_g.weight",
            ),
            (
                "model.layers.4.mlp_res_norm.weight",
                "blk.4.ffn_res_score.weight",
            ),
            (
                "model.layers.4.mlp_res_proj.weight",
                "blk.4.ffn_res_score.weight",
            ),
            (
                "model.output_attn_res_proj.weight",
                "output_res_score.weight",
            ),
            (
                "model.layers.4.self_attn.q_proj.weight",
                "blk.4.attn_q.weight",
            ),
        ] {
            assert_eq!(gguf_name("kimi_k3", hf).as_deref(), Some(g), "{hf}");
        }
        assert_eq!(
            gguf_name("kimi_linear", "model.layers.0.self_attn.g_a_proj.weight").as_deref(),
            Some("blk.0.ssm_g_a.weight")
        );
        // Other families keep their map.
        assert_eq!(
            gguf_name("deepseek_v3", "model.layers.4.self_attn.A_log"),
            None
        );
        let k3 = json!({"model_type": "kimi_k3"});
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let a_log = [0.25f32, -1.5, 3.0];
        let ssm_a: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
        let back = derived_values(&k3, "model.layers.1.self_attn.A_log", &le(&ssm_a))
            .unwrap()
            .unwrap();
        for (i, c) in back.chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            assert!(
                (v - a_log[i]).abs() <= 2.0 * f32::EPSILON * a_log[i].abs(),
                "{v}"
            );
            assert_eq!(-v.exp(), ssm_a[i]);
        }
        let e = derived_values(&k3, "model.layers.1.self_attn.A_log", &le(&[-1.0, 0.0]))
            .unwrap()
            .unwrap_err();
        assert!(e.contains("value 1 is 0"), "{e}");
        let ones = derived_values(&k3, "model.layers.1.mlp_res_norm.weight", &le(&[7.0, 8.0]));
        assert_eq!(ones.unwrap().unwrap(), le(&[1.0, 1.0]));
        assert!(derived_values(&k3, "model.layers.1.mlp_res_proj.weight", &le(&[7.0])).is_none());
        let other = json!({"model_type": "deepseek_v3"});
        assert!(derived_values(&other, "model.layers.1.self_attn.A_log", &le(&[-1.0])).is_none());
    }
}
