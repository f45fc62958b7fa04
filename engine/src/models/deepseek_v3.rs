//! DeepSeek-V3 / Kimi-K2 (`model_type: deepseek_v3` / `kimi_k2`), as transformers 5.23
//! `modeling_deepseek_v3.py` (details in `docs/MLA.md`):
//!
//! - attention: MLA ([`crate::layers::mla`]) with `q_a_proj`/`q_a_layernorm`/`q_b_proj` (or
//!   `q_proj` when `q_lora_rank` is null), `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`,
//!   `o_proj`; the two latent norms use eps 1e-6; YaRN RoPE with interleaved pairs;
//! - layer i has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size` when
//!   `i < first_k_dense_replace`, else the grouped sigmoid MoE
//!   ([`crate::layers::sigmoid_router`]) with `mlp.gate.weight`,
//!   `mlp.gate.e_score_correction_bias` and `mlp.shared_experts.*`;
//! - `glm_moe_dsa` (GLM-5) is the same model with always-interleaved RoPE, `mlp_layer_types`,
//!   and the DSA lightning indexer (`self_attn.indexer.*`, [`crate::layers::dsa_indexer`]) on
//!   every `"full"` layer of `indexer_types` (`"shared"` layers reuse the previous full
//!   layer's selection);
//! - the MTP layer at index `num_hidden_layers` is not part of the normal forward; it is loaded
//!   into [`Model::mtp`] ([`crate::models::mtp`]) when the store holds it.

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::layers::dsa_indexer::DsaIndexer;
use crate::layers::linear::{load_matrix, load_vector};
use crate::layers::mla::{Dsa, SelectionSlot};
use crate::layers::sigmoid_router::SigmoidRouting;
use crate::layers::{DecoderLayer, Ffn, Linear, Mla, Mlp, RmsNorm, SelfAttn, SigmoidMoe};
use crate::models::{load_lm_head, load_moe, Model};
use coli_store::Store;
use std::sync::{Arc, Mutex};

/// Eps of `q_a_layernorm` / `kv_a_layernorm` (constructed without eps in transformers).
const LATENT_NORM_EPS: f32 = 1e-6;

/// The MLA parameters of `c` (an error for a config of another family).
fn mla_of(c: &ModelConfig) -> Result<&crate::layers::mla::MlaConfig> {
    c.mla.as_ref().ok_or_else(|| EngineError::Config {
        file: "config.json".into(),
        what: format!("{} config without MLA parameters", c.family.name()),
    })
}

/// Builds a DeepSeek-V3 model over `store`.
///
/// # Errors
/// Missing or misshapen tensors (named), expert counts differing from the config, a store with
/// experts for a layer that is neither a MoE layer nor an MTP layer.
pub fn load(store: &Store, config: ModelConfig) -> Result<Model<'_>> {
    let c = &config;
    let m = mla_of(c)?.clone();
    for l in &store.manifest().expert_layers {
        let l = l.layer as usize;
        let mtp = l >= c.num_layers && l < c.num_layers + m.num_nextn_predict_layers;
        if !mtp && (l >= c.num_layers || !c.is_moe_layer(l)) {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: format!(
                    "the store holds experts for layer {l} which is not a MoE layer of the config"
                ),
            });
        }
    }
    let (rope, attention_factor) = m.rope();
    let embed = load_matrix(
        store,
        "model.embed_tokens.weight",
        c.vocab_size,
        c.hidden_size,
        "token embedding",
    )?;
    let mut layers = Vec::with_capacity(c.num_layers);
    let mut slot = None;
    for i in 0..c.num_layers {
        layers.push(load_layer(store, c, i, attention_factor, &mut slot)?);
    }
    let final_norm = RmsNorm::load(store, "model.norm.weight", c.hidden_size, c.rms_norm_eps)?;
    let lm_head = load_lm_head(store, c, embed)?;
    let mtp = crate::models::mtp::load(store, c, attention_factor, embed, lm_head)?;
    Ok(Model {
        config,
        embed,
        layers,
        final_norm,
        lm_head,
        rope,
        mtp,
    })
}

/// Loads the MLA block at `model.layers.{i}.self_attn` (with its DSA indexer on a GLM-5
/// `"full"` layer). `slot` carries the selection slot of the last full DSA layer loaded: a full
/// layer replaces it, a `"shared"` layer reuses it.
///
/// # Errors
/// Missing or misshapen tensors; a DSA config without `q_lora_rank` (the indexer reads the q
/// latent) or a shared layer with no full layer before it.
pub fn load_mla<'s>(
    store: &'s Store,
    c: &ModelConfig,
    i: usize,
    attention_factor: f32,
    slot: &mut Option<SelectionSlot>,
) -> Result<Mla<'s>> {
    let m = mla_of(c)?;
    let p = format!("model.layers.{i}.self_attn");
    let (h, nh) = (c.hidden_size, c.num_heads);
    let (dn, dr, dv, rkv) = (
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.kv_lora_rank,
    );
    let qd = nh * (dn + dr);
    let (q_a, q_b) = match m.q_lora_rank {
        Some(rq) => (
            Some((
                Linear::load(store, &format!("{p}.q_a_proj"), rq, h, false)?,
                RmsNorm::load(
                    store,
                    &format!("{p}.q_a_layernorm.weight"),
                    rq,
                    LATENT_NORM_EPS,
                )?,
            )),
            Linear::load(store, &format!("{p}.q_b_proj"), qd, rq, false)?,
        ),
        None => (
            None,
            Linear::load(store, &format!("{p}.q_proj"), qd, h, false)?,
        ),
    };
    let dsa = match &m.dsa {
        None => None,
        Some(d) if d.is_full(i) => {
            let rq = m.q_lora_rank.ok_or_else(|| EngineError::Config {
                file: "config.json".into(),
                what: "the DSA indexer needs q_lora_rank (it reads the q latent)".into(),
            })?;
            let s: SelectionSlot = Arc::new(Mutex::new(Vec::new()));
            *slot = Some(Arc::clone(&s));
            Some(Dsa::Full {
                indexer: Box::new(DsaIndexer::load(
                    store,
                    &format!("{p}.indexer"),
                    d,
                    rq,
                    h,
                    dr,
                )?),
                slot: s,
            })
        }
        Some(_) => Some(Dsa::Shared {
            slot: slot.clone().ok_or_else(|| EngineError::Config {
                file: "config.json".into(),
                what: format!("indexer_types[{i}] is \"shared\" with no full layer before it"),
            })?,
        }),
    };
    Ok(Mla {
        q_a,
        q_b,
        kv_a: Linear::load(
            store,
            &format!("{p}.kv_a_proj_with_mqa"),
            rkv + dr,
            h,
            false,
        )?,
        kv_norm: RmsNorm::load(
            store,
            &format!("{p}.kv_a_layernorm.weight"),
            rkv,
            LATENT_NORM_EPS,
        )?,
        kv_b: Linear::load(store, &format!("{p}.kv_b_proj"), nh * (dn + dv), rkv, false)?,
        o: Linear::load(store, &format!("{p}.o_proj"), h, nh * dv, false)?,
        num_heads: nh,
        nope: dn,
        rope_dim: dr,
        v_dim: dv,
        kv_lora_rank: rkv,
        softmax_scale: m.softmax_scale,
        attention_factor,
        interleave: m.rope_interleave,
        dsa,
        absorb_decode: true,
    })
}

/// Loads the grouped sigmoid MoE block at `model.layers.{i}.mlp`.
///
/// # Errors
/// Missing or misshapen tensors, expert count differing from the config.
pub fn load_sigmoid_moe<'s>(store: &'s Store, c: &ModelConfig, i: usize) -> Result<SigmoidMoe<'s>> {
    let m = mla_of(c)?;
    let p = format!("model.layers.{i}.mlp");
    let experts = load_moe(store, c, i, &[format!("{p}.gate")])?;
    let bias = load_vector(
        store,
        &format!("{p}.gate.e_score_correction_bias"),
        c.num_experts,
        "noaux_tc routing bias",
    )?;
    let shared = if m.n_shared_experts > 0 {
        Some(Mlp::load(
            store,
            &format!("{p}.shared_experts"),
            c.hidden_size,
            c.moe_intermediate_size * m.n_shared_experts,
        )?)
    } else {
        None
    };
    Ok(SigmoidMoe {
        experts,
        routing: SigmoidRouting {
            bias,
            n_group: m.n_group,
            topk_group: m.topk_group,
            scaling: m.routed_scaling_factor,
        },
        shared,
    })
}

/// Loads decoder layer `i` (MLA attention, dense MLP or grouped sigmoid MoE; `i >=
/// num_hidden_layers` is an MTP layer, always MoE). `slot`: as [`load_mla`].
///
/// # Errors
/// Missing or misshapen tensors.
pub fn load_layer<'s>(
    store: &'s Store,
    c: &ModelConfig,
    i: usize,
    attention_factor: f32,
    slot: &mut Option<SelectionSlot>,
) -> Result<DecoderLayer<'s>> {
    let p = format!("model.layers.{i}");
    let ffn = if c.is_moe_layer(i) || i >= c.num_layers {
        Ffn::SigmoidMoe(load_sigmoid_moe(store, c, i)?)
    } else {
        Ffn::Dense(Mlp::load(
            store,
            &format!("{p}.mlp"),
            c.hidden_size,
            c.intermediate_size,
        )?)
    };
    Ok(DecoderLayer {
        input_norm: RmsNorm::load(
            store,
            &format!("{p}.input_layernorm.weight"),
            c.hidden_size,
            c.rms_norm_eps,
        )?,
        attn: SelfAttn::Mla(load_mla(store, c, i, attention_factor, slot)?),
        post_norm: RmsNorm::load(
            store,
            &format!("{p}.post_attention_layernorm.weight"),
            c.hidden_size,
            c.rms_norm_eps,
        )?,
        ffn,
    })
}
