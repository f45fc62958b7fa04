//! DeepSeek-V3 / Kimi-K2 (`model_type: deepseek_v3` / `kimi_k2`), GLM-5 (`glm_moe_dsa`) and
//! DeepSeek-V3.2 (`deepseek_v32`: GLM-5's indexer with half-split indexer RoPE), as
//! transformers 5.23 `modeling_deepseek_v3.py` / `modeling_glm_moe_dsa.py` (details in
//! `docs/MLA.md`; tensors and config in `coli_format::spec::{deepseek_v3, glm_moe_dsa}`):
//!
//! - attention: MLA ([`crate::layers::mla`]) with `q_a_proj`/`q_a_layernorm`/`q_b_proj` (or
//!   `q_proj` when `q_lora_rank` is null), `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`,
//!   `o_proj`; the two latent norms use eps 1e-6; YaRN RoPE with interleaved pairs;
//! - a layer has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size` where the spec
//!   says so (`first_k_dense_replace`, GLM-5's `mlp_layer_types`), else the grouped sigmoid MoE
//!   ([`crate::layers::sigmoid_router`]) with `mlp.gate.weight`,
//!   `mlp.gate.e_score_correction_bias` and `mlp.shared_experts.*`;
//! - GLM-5 adds the DSA lightning indexer (`self_attn.indexer.*`,
//!   [`crate::layers::dsa_indexer`]) on every `"full"` layer of `indexer_types` (`"shared"`
//!   layers reuse the previous full layer's selection);
//! - the MTP layer at index `num_hidden_layers` is not part of the normal forward; it is loaded
//!   into [`crate::models::Model::mtp`] ([`crate::models::mtp`]) when the store holds it.

use crate::error::{EngineError, Result};
use crate::layers::dsa_indexer::DsaIndexer;
use crate::layers::mla::{mla_rope, Dsa, KvB, SelectionSlot};
use crate::layers::sigmoid_router::{HashTable, LatentMoe, Score, SigmoidRouting};
use crate::layers::{DecoderLayer, Ffn, Mla, SelfAttn, SigmoidMoe};
use crate::models::{load_lm_head, load_mlp, load_moe, Parts};
use crate::weights::Weights;
use coli_format::spec::{
    AttentionSpec, FfnSpec, LayerSpec, MlaKvBSpec, MlaQuerySpec, MlaSpec, MoeSpec, Routing,
};
use coli_format::ModelSpec;
use std::sync::{Arc, Mutex};

/// The MLA parameters of `spec` (an error for a spec of another family).
pub(crate) fn mla_of(spec: &ModelSpec) -> Result<&MlaSpec> {
    spec.mla.as_ref().ok_or_else(|| EngineError::Config {
        file: "config.json".into(),
        what: format!("{} config without MLA parameters", spec.family.name()),
    })
}

/// Loads a DeepSeek-V3 / GLM-5 model's weights (and its MTP layer when the store holds it
/// whole; an incomplete one is skipped with a warning in `warnings`).
///
/// # Errors
/// Missing or misshapen tensors (named).
pub(crate) fn load<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    warnings: &mut Vec<String>,
) -> Result<Parts<'s>> {
    let m = mla_of(spec)?;
    let (rope, attention_factor) = mla_rope(m);
    let t = &spec.tensors;
    let embed = w.matrix(&t.embed)?;
    let mut layers = Vec::with_capacity(t.layers.len());
    let mut slot = None;
    for l in &t.layers {
        layers.push(load_layer(w, spec, l, attention_factor, &mut slot)?);
    }
    let final_norm = w.rms_norm(&t.final_norm, spec.rms_norm_eps)?;
    let lm_head = load_lm_head(w, spec, embed)?;
    let mtp = crate::models::mtp::load(w, spec, (embed, lm_head), warnings, |w, l| {
        load_layer(w, spec, l, attention_factor, &mut None)
    })?;
    Ok(Parts {
        embed,
        embed_norm: None,
        output: crate::models::OutputScaling::identity(spec.vocab_size),
        layers,
        final_norm,
        lm_head,
        rope,
        mtp,
        mtp_chain: Vec::new(),
        blocks: None,
    })
}

/// Loads the MLA block of `layer` (with its DSA indexer on a GLM-5 `"full"` layer). `slot`
/// carries the selection slot of the last full DSA layer loaded: a full layer replaces it, a
/// `"shared"` layer reuses it.
///
/// # Errors
/// Missing or misshapen tensors; a shared DSA layer with no full layer before it.
pub fn load_mla<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    layer: &LayerSpec,
    attention_factor: f32,
    slot: &mut Option<SelectionSlot>,
) -> Result<Mla<'s>> {
    let m = mla_of(spec)?;
    let AttentionSpec::Mla {
        q,
        kv_a,
        kv_norm,
        kv_b,
        o,
        indexer,
        gate,
    } = &layer.attention
    else {
        return Err(EngineError::Config {
            file: "config.json".into(),
            what: format!("layer {} has no MLA attention", layer.index),
        });
    };
    let (q_a, q_b) = match q {
        MlaQuerySpec::Lora { a, norm, b } => (
            Some((w.linear(a)?, w.rms_norm(norm, m.latent_norm_eps)?)),
            w.linear(b)?,
        ),
        MlaQuerySpec::Direct(l) => (None, w.linear(l)?),
    };
    let dsa = match (&m.dsa, indexer) {
        (None, _) => None,
        (Some(d), Some(ix)) => {
            let s: SelectionSlot = Arc::new(Mutex::new(Vec::new()));
            *slot = Some(Arc::clone(&s));
            Some(Dsa::Full {
                indexer: Box::new(DsaIndexer::load(w, ix, d, m.qk_rope_head_dim)?),
                slot: s,
            })
        }
        (Some(_), None) => Some(Dsa::Shared {
            slot: slot.clone().ok_or_else(|| EngineError::Config {
                file: "config.json".into(),
                what: format!(
                    "indexer_types[{}] is \"shared\" with no full layer before it",
                    layer.index
                ),
            })?,
        }),
    };
    Ok(Mla {
        q_a,
        q_b,
        kv_a: w.linear(kv_a)?,
        kv_norm: w.rms_norm(kv_norm, m.latent_norm_eps)?,
        // Multiplied with f32 activations under any numerics (mla::KvB).
        kv_b: match kv_b {
            MlaKvBSpec::Fused(l) => KvB::Fused(w.exact_linear(l)?),
            MlaKvBSpec::Split { k, v } => KvB::Split {
                k: w.exact_linear(k)?,
                v: w.exact_linear(v)?,
            },
        },
        o: w.linear(o)?,
        gate: match gate {
            Some(g) => Some(w.linear(g)?),
            None => None,
        },
        num_heads: spec.num_heads,
        nope: m.qk_nope_head_dim,
        rope_dim: m.qk_rope_head_dim,
        v_dim: m.v_head_dim,
        kv_lora_rank: m.kv_lora_rank,
        softmax_scale: m.softmax_scale,
        attention_factor,
        interleave: m.rope_interleave,
        dsa,
        absorb_decode: true,
    })
}

/// Loads a grouped sigmoid MoE block (routing parameters from `spec.routing`, which must be
/// [`Routing::GroupedSigmoid`], or DeepSeek-V4's [`Routing::SqrtSoftplus`] with its hash
/// table on hash-routed layers).
///
/// # Errors
/// Missing or misshapen tensors; a spec with another routing; a hash table holding anything
/// but expert ids.
pub fn load_sigmoid_moe<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    moe: &MoeSpec,
) -> Result<SigmoidMoe<'s>> {
    let (n_group, topk_group, scaling, score) = match spec.routing {
        Routing::GroupedSigmoid {
            n_group,
            topk_group,
            scaling,
            ..
        } => (n_group, topk_group, scaling, Score::Sigmoid),
        Routing::SqrtSoftplus { scaling } => (1, 1, scaling, Score::SqrtSoftplus),
        _ => {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: format!(
                    "{} has a sigmoid MoE block but routes as {:?}",
                    spec.family.name(),
                    spec.routing
                ),
            })
        }
    };
    let bias = match &moe.router_bias {
        Some(b) => w.vector(b)?,
        None => vec![0.0; spec.num_experts],
    };
    let hash = match &moe.hash_table {
        Some(t) => {
            let values = w.vector(t)?;
            let experts = values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if v >= 0.0 && v.fract() == 0.0 && (v as usize) < spec.num_experts {
                        Ok(v as u32)
                    } else {
                        Err(EngineError::Invalid(format!(
                            "{}: entry {} (token {}) is {v}, not an expert id below {}",
                            t.name,
                            i,
                            i / spec.top_k.max(1),
                            spec.num_experts
                        )))
                    }
                })
                .collect::<Result<Vec<u32>>>()?;
            Some(HashTable {
                experts,
                k: spec.top_k,
            })
        }
        None => None,
    };
    Ok(SigmoidMoe {
        experts: load_moe(w, spec, moe)?,
        routing: SigmoidRouting {
            bias,
            n_group,
            topk_group,
            scaling,
            score,
            hash,
        },
        shared: match &moe.shared {
            Some(s) => Some(load_mlp(w, spec, s)?),
            None => None,
        },
        latent: match &moe.latent {
            Some(l) => Some(LatentMoe {
                down: w.linear(&l.down)?,
                up: w.linear(&l.up)?,
                norm: match &l.norm {
                    Some(t) => Some(w.rms_norm(t, spec.rms_norm_eps)?),
                    None => None,
                },
            }),
            None => None,
        },
    })
}

/// Loads decoder layer `layer` (MLA attention, dense MLP or grouped sigmoid MoE; an MTP layer
/// is always MoE). `slot`: as [`load_mla`].
///
/// # Errors
/// Missing or misshapen tensors.
pub fn load_layer<'s>(
    w: &mut Weights<'s>,
    spec: &ModelSpec,
    layer: &LayerSpec,
    attention_factor: f32,
    slot: &mut Option<SelectionSlot>,
) -> Result<DecoderLayer<'s>> {
    let ffn = match &layer.ffn {
        FfnSpec::Moe(m) => Ffn::SigmoidMoe(load_sigmoid_moe(w, spec, m)?),
        FfnSpec::Dense(m) => Ffn::Dense(load_mlp(w, spec, m)?),
        FfnSpec::FusedDense(_) | FfnSpec::SinkMoe(_) => {
            return Err(EngineError::Config {
                file: "config.json".into(),
                what: format!("layer {} has an Inkling MLP in an MLA model", layer.index),
            })
        }
    };
    Ok(DecoderLayer {
        input_norm: w.rms_norm(&layer.input_norm, spec.rms_norm_eps)?,
        attn: SelfAttn::Mla(load_mla(w, spec, layer, attention_factor, slot)?),
        post_norm: w.rms_norm(&layer.post_norm, spec.rms_norm_eps)?,
        ffn,
        output_convs: None,
        hyper: None,
        attn_res: None,
        kv_input_norms: None,
    })
}
