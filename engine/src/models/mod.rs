//! The supported architectures. Each file says how one family's checkpoint maps onto the shared
//! blocks of [`crate::layers`] (tensor names, q/k norms, routing rule); [`Model`] is the result.

pub mod deepseek_v3;
pub mod mixtral;
pub mod mtp;
pub mod olmoe;
pub mod qwen3_moe;

use crate::config::{Family, ModelConfig};
use crate::error::{EngineError, Result};
use crate::layers::linear::load_matrix;
use crate::layers::{
    Attention, DecoderLayer, Ffn, Linear, MoeBlock, QkNorm, RmsNorm, Rope, SelfAttn,
};
use coli_store::{MatrixView, Store};

/// A loaded model: dense weights borrowed from the store's memory map (norms copied to f32),
/// routed experts left in the store (read through the expert cache).
pub struct Model<'s> {
    /// The config it was built from.
    pub config: ModelConfig,
    /// `model.embed_tokens.weight` `[vocab, H]`.
    pub embed: MatrixView<'s>,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<'s>>,
    /// `model.norm.weight`.
    pub final_norm: RmsNorm,
    /// `lm_head.weight` `[vocab, H]`, or the embedding when tied.
    pub lm_head: MatrixView<'s>,
    /// Rotary frequencies.
    pub rope: Rope,
    /// The multi-token-prediction layer (MLA families whose store holds it).
    pub mtp: Option<mtp::MtpLayer<'s>>,
}

impl<'s> Model<'s> {
    /// Builds the model of `config.family` from `store`.
    ///
    /// # Errors
    /// Missing or misshapen tensors, or a store whose expert layers disagree with the config.
    pub fn load(store: &'s Store, config: ModelConfig) -> Result<Model<'s>> {
        match config.family {
            Family::Mixtral => mixtral::load(store, config),
            Family::Qwen3Moe => qwen3_moe::load(store, config),
            Family::Olmoe => olmoe::load(store, config),
            Family::DeepseekV3 | Family::GlmMoeDsa => deepseek_v3::load(store, config),
        }
    }
}

/// Experts the store holds for `layer` (0 when the layer has none).
pub(crate) fn store_experts(store: &Store, layer: usize) -> usize {
    store
        .manifest()
        .expert_layers
        .iter()
        .find(|l| l.layer as usize == layer)
        .map_or(0, |l| l.num_experts as usize)
}

/// Loads the attention block at `model.layers.{i}.self_attn`.
pub(crate) fn load_attention<'s>(
    store: &'s Store,
    c: &ModelConfig,
    i: usize,
    qk_norm: QkNorm,
) -> Result<Attention<'s>> {
    let p = format!("model.layers.{i}.self_attn");
    let (qd, kvd) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    Ok(Attention {
        q: Linear::load(
            store,
            &format!("{p}.q_proj"),
            qd,
            c.hidden_size,
            c.attention_bias,
        )?,
        k: Linear::load(
            store,
            &format!("{p}.k_proj"),
            kvd,
            c.hidden_size,
            c.attention_bias,
        )?,
        v: Linear::load(
            store,
            &format!("{p}.v_proj"),
            kvd,
            c.hidden_size,
            c.attention_bias,
        )?,
        o: Linear::load(
            store,
            &format!("{p}.o_proj"),
            c.hidden_size,
            qd,
            c.attention_bias,
        )?,
        qk_norm,
        clip_qkv: c.clip_qkv,
        num_heads: c.num_heads,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        window: c.sliding_window,
    })
}

/// Loads the MoE block of layer `i` with the router at the first of `router_names` present.
pub(crate) fn load_moe<'s>(
    store: &'s Store,
    c: &ModelConfig,
    i: usize,
    router_prefixes: &[String],
) -> Result<MoeBlock<'s>> {
    let n = store_experts(store, i);
    if n != c.num_experts {
        return Err(EngineError::Config {
            file: "config.json".into(),
            what: format!(
                "layer {i} should have {} routed experts but the store holds {n}",
                c.num_experts
            ),
        });
    }
    let prefix = router_prefixes
        .iter()
        .find(|p| store.has_dense(&format!("{p}.weight")))
        .ok_or_else(|| EngineError::MissingTensor {
            name: format!("{}.weight", router_prefixes[0]),
            why: format!("router of MoE layer {i}"),
        })?;
    Ok(MoeBlock {
        layer: i as u32,
        router: Linear::load(store, prefix, c.num_experts, c.hidden_size, false)?,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk: c.norm_topk_prob,
        hidden: c.hidden_size,
        inter: c.moe_intermediate_size,
    })
}

/// The output projection `lm_head.weight` [vocab, H], or the token embedding `embed` when the
/// store has no lm_head and config.json says `tie_word_embeddings`.
///
/// # Errors
/// [`EngineError::MissingTensor`] when neither applies; shape errors from the store.
pub(crate) fn load_lm_head<'s>(
    store: &'s Store,
    c: &ModelConfig,
    embed: MatrixView<'s>,
) -> Result<MatrixView<'s>> {
    if store.has_dense("lm_head.weight") {
        load_matrix(
            store,
            "lm_head.weight",
            c.vocab_size,
            c.hidden_size,
            "output projection",
        )
    } else if c.tie_word_embeddings {
        Ok(embed)
    } else {
        Err(EngineError::MissingTensor {
            name: "lm_head.weight".into(),
            why: "tie_word_embeddings is false in config.json".into(),
        })
    }
}

/// Assembles a model from per-layer parts built by `layer`.
pub(crate) fn assemble<'s>(
    store: &'s Store,
    config: ModelConfig,
    mut layer: impl FnMut(usize) -> Result<(QkNorm, Ffn<'s>)>,
) -> Result<Model<'s>> {
    let c = &config;
    // Layers the store holds experts for must be MoE layers of the config and vice versa.
    for l in &store.manifest().expert_layers {
        if l.layer as usize >= c.num_layers || !c.is_moe_layer(l.layer as usize) {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: format!(
                    "the store holds experts for layer {} which is not a MoE layer of the config",
                    l.layer
                ),
            });
        }
    }
    let embed = load_matrix(
        store,
        "model.embed_tokens.weight",
        c.vocab_size,
        c.hidden_size,
        "token embedding",
    )?;
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let (qk_norm, ffn) = layer(i)?;
        let p = format!("model.layers.{i}");
        layers.push(DecoderLayer {
            input_norm: RmsNorm::load(
                store,
                &format!("{p}.input_layernorm.weight"),
                c.hidden_size,
                c.rms_norm_eps,
            )?,
            attn: SelfAttn::Gqa(load_attention(store, c, i, qk_norm)?),
            post_norm: RmsNorm::load(
                store,
                &format!("{p}.post_attention_layernorm.weight"),
                c.hidden_size,
                c.rms_norm_eps,
            )?,
            ffn,
        });
    }
    let final_norm = RmsNorm::load(store, "model.norm.weight", c.hidden_size, c.rms_norm_eps)?;
    let lm_head = load_lm_head(store, c, embed)?;
    let rope = Rope::new(c.head_dim, c.rope_theta);
    Ok(Model {
        config,
        embed,
        layers,
        final_norm,
        lm_head,
        rope,
        mtp: None,
    })
}
