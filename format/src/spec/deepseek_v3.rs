//! DeepSeek-V3 and Kimi-K2 (`model_type: deepseek_v3` / `kimi_k2`, one architecture), as
//! transformers 5.23 `DeepseekV3Config` / `modeling_deepseek_v3.py` (details in docs/MLA.md).
//!
//! - Layers: layer i has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size` when
//!   `i < first_k_dense_replace` or `i % moe_layer_freq != 0`, else a MoE block. The MTP layer
//!   (`num_nextn_predict_layers` = 1) is decoder layer `num_hidden_layers` of the checkpoint:
//!   `embed_tokens`, `enorm`, `hnorm`, `eh_proj`, a full MLA + MoE decoder layer,
//!   `shared_head.norm`, `shared_head.head` (the published checkpoints hold their own copies of
//!   the embedding and head); checkpoints may omit the whole layer, not part of it.
//! - Attention: MLA with `q_a_proj`/`q_a_layernorm`/`q_b_proj` (or `q_proj` when
//!   `q_lora_rank` is null), `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`;
//!   YaRN or default RoPE on `qk_rope_head_dim`, interleaved pairs unless `rope_interleave` is
//!   false.
//! - Routing: grouped sigmoid with `mlp.gate.e_score_correction_bias` (`topk_method`
//!   `noaux_tc`, `scoring_func` sigmoid), `routed_scaling_factor`, `n_shared_experts` shared
//!   experts `mlp.shared_experts.*` of `moe_intermediate_size * n_shared_experts`.

use super::build;
use super::json::Fields;
use super::mla::MlaSpec;
use super::{
    AttentionSpec, Family, FfnSpec, IndexerSpec, LayerSpec, MlaKvBSpec, MlaQuerySpec, ModelSpec,
    ModelTensors, MoeSpec, MtpSpec, Routing, TensorClass, TensorKind, TensorSpec,
};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    configure_mla(f, s, Family::DeepseekV3)
}

/// The configuration shared by the MLA families (`glm` adds the DSA keys).
pub(crate) fn configure_mla(
    f: &Fields<'_>,
    s: &mut ModelSpec,
    family: Family,
) -> Result<(), FormatError> {
    s.num_experts = f.req_usize("n_routed_experts")?;
    s.moe_intermediate_size = f.req_usize("moe_intermediate_size")?;
    s.norm_topk_prob = f.bool("norm_topk_prob")?.unwrap_or(true);
    s.attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    if s.attention_bias {
        // transformers would add biases to q_a_proj, kv_a_proj_with_mqa and o_proj; no
        // published MLA checkpoint has them and coli's MLA has none.
        return Err(FormatError::Unsupported(
            "attention_bias true for an MLA model (biased q_a_proj / kv_a_proj_with_mqa / o_proj)"
                .into(),
        ));
    }
    let m = MlaSpec::read(f, s.num_experts, family.default_theta(), family)?;
    s.rope_theta = m.rope_theta;
    s.routing = Routing::GroupedSigmoid {
        n_group: m.n_group,
        topk_group: m.topk_group,
        renormalize: s.norm_topk_prob,
        scaling: m.routed_scaling_factor,
    };
    s.moe_layers = (0..s.num_layers)
        .map(|l| s.num_experts > 0 && m.is_moe_layer(l))
        .collect();
    s.n_shared_experts = m.n_shared_experts;
    s.num_mtp_layers = m.num_nextn_predict_layers;
    s.mla = Some(m);
    Ok(())
}

/// The MLA attention block of layer `i` (with the DSA indexer when `indexer` is given).
pub(crate) fn mla_attention(
    s: &ModelSpec,
    m: &MlaSpec,
    i: usize,
    class: TensorClass,
    indexer: Option<IndexerSpec>,
) -> AttentionSpec {
    let p = format!("model.layers.{i}.self_attn");
    let (h, nh) = (s.hidden_size, s.num_heads);
    let (dn, dr, dv, rkv) = (
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.kv_lora_rank,
    );
    let qd = nh * (dn + dr);
    let q = match m.q_lora_rank {
        Some(rq) => MlaQuerySpec::Lora {
            a: build::linear(&format!("{p}.q_a_proj"), rq, h, false, class),
            norm: build::norm(format!("{p}.q_a_layernorm.weight"), rq, class),
            b: build::linear(&format!("{p}.q_b_proj"), qd, rq, false, class),
        },
        None => MlaQuerySpec::Direct(build::linear(&format!("{p}.q_proj"), qd, h, false, class)),
    };
    AttentionSpec::Mla {
        q,
        kv_a: build::linear(
            &format!("{p}.kv_a_proj_with_mqa"),
            rkv + dr,
            h,
            false,
            class,
        ),
        kv_norm: build::norm(format!("{p}.kv_a_layernorm.weight"), rkv, class),
        kv_b: if m.kv_b_split {
            MlaKvBSpec::Split {
                k: build::linear(&format!("{p}.k_b_proj"), nh * rkv, dn, false, class),
                v: build::linear(&format!("{p}.v_b_proj"), nh * dv, rkv, false, class),
            }
        } else {
            MlaKvBSpec::Fused(build::linear(
                &format!("{p}.kv_b_proj"),
                nh * (dn + dv),
                rkv,
                false,
                class,
            ))
        },
        o: build::linear(&format!("{p}.o_proj"), h, nh * dv, false, class),
        indexer: indexer.map(Box::new),
        gate: None,
    }
}

/// The grouped-sigmoid MoE block of layer `i` (with `s.n_shared_experts` shared experts).
pub(crate) fn sigmoid_moe(s: &ModelSpec, i: usize, class: TensorClass) -> FfnSpec {
    sigmoid_moe_named(s, i, class, "mlp", ["gate_proj", "up_proj", "down_proj"])
}

/// [`sigmoid_moe`] under `model.layers.{i}.{block}` with the experts' matrices named
/// `matrices` (gate, up, down): Kimi-Linear's `block_sparse_moe` with `w1`, `w3`, `w2`.
pub(crate) fn sigmoid_moe_named(
    s: &ModelSpec,
    i: usize,
    class: TensorClass,
    block: &str,
    matrices: [&'static str; 3],
) -> FfnSpec {
    let p = format!("model.layers.{i}.{block}");
    let (h, e) = (s.hidden_size, s.num_experts);
    FfnSpec::Moe(MoeSpec {
        latent: None,
        hash_table: None,
        router: TensorSpec::new(
            format!("{p}.gate.weight"),
            &[e, h],
            class,
            TensorKind::Router,
        ),
        router_bias: Some(TensorSpec::new(
            format!("{p}.gate.e_score_correction_bias"),
            &[e],
            class,
            TensorKind::Bias,
        )),
        router_logit_bias: None,
        shared: (s.n_shared_experts > 0).then(|| {
            Box::new(build::mlp(
                &format!("{p}.shared_experts"),
                h,
                s.moe_intermediate_size * s.n_shared_experts,
                class,
            ))
        }),
        shared_gate: None,
        experts: super::ExpertsSpec {
            layer: i as u32,
            count: e as u32,
            hidden: h,
            intermediate: s.moe_intermediate_size,
            class: if class == TensorClass::Mtp {
                TensorClass::Mtp
            } else {
                TensorClass::RoutedExpert
            },
            prefix: format!("{p}.experts"),
            storage: super::ExpertStorage::PerExpert(matrices),
            biases: false,
        },
    })
}

/// The feed-forward block of layer `i` of a DeepSeek-style model: the grouped-sigmoid MoE on a
/// MoE layer and on the MTP layer (`class` Mtp), else a dense SwiGLU of `intermediate_size`.
pub(crate) fn sigmoid_moe_or_dense(s: &ModelSpec, i: usize, class: TensorClass) -> FfnSpec {
    if class == TensorClass::Mtp || s.is_moe_layer(i) {
        sigmoid_moe(s, i, class)
    } else {
        FfnSpec::Dense(build::mlp(
            &format!("model.layers.{i}.mlp"),
            s.hidden_size,
            s.intermediate_size,
            class,
        ))
    }
}

/// Every tensor of an MLA family; `indexer(i, class)` gives layer i's DSA indexer (GLM-5).
/// `mtp_shared_embed_and_head`: the MTP layer's `embed_tokens` and `shared_head.head` are
/// optional ([`mtp_spec`]; GLM-5's releases share the main model's).
pub(crate) fn mla_tensors(
    s: &ModelSpec,
    indexer: impl Fn(usize, TensorClass) -> Option<IndexerSpec>,
    mtp_shared_embed_and_head: bool,
) -> ModelTensors {
    let m = s.mla.as_ref().expect("MLA families have an MLA spec");
    let layer = |i: usize, class: TensorClass| -> LayerSpec {
        build::layer(
            s,
            i,
            mla_attention(s, m, i, class, indexer(i, class)),
            sigmoid_moe_or_dense(s, i, class),
            class,
        )
    };
    let layers = (0..s.num_layers)
        .map(|i| layer(i, TensorClass::Dense))
        .collect();
    let mtp = s
        .mtp_layer()
        .map(|n| mtp_spec(s, layer(n, TensorClass::Mtp), mtp_shared_embed_and_head))
        .into_iter()
        .collect();
    build::model(s, layers, mtp)
}

/// The MTP layer `model.layers.{N}` around its decoder layer `layer`: `embed_tokens`,
/// `enorm`, `hnorm`, `eh_proj`, `shared_head.{norm, head}`. `shared_embed_and_head`: the
/// layer's own `embed_tokens` and `shared_head.head` are optional, the main model's embedding
/// and lm_head standing in (GLM-4.6/4.7 and GLM-5/5.1/5.2 publish their MTP layer without
/// them).
pub(crate) fn mtp_spec(s: &ModelSpec, layer: LayerSpec, shared_embed_and_head: bool) -> MtpSpec {
    let c = TensorClass::Mtp;
    let (v, h) = (s.vocab_size, s.hidden_size);
    let p = format!("model.layers.{}", layer.index);
    let maybe = |t: TensorSpec| {
        if shared_embed_and_head {
            t.optional()
        } else {
            t
        }
    };
    MtpSpec {
        embed: Some(maybe(TensorSpec::new(
            format!("{p}.embed_tokens.weight"),
            &[v, h],
            c,
            TensorKind::Embedding,
        ))),
        enorm: build::norm(format!("{p}.enorm.weight"), h, c),
        hnorm: build::norm(format!("{p}.hnorm.weight"), h, c),
        eh_proj: build::linear(&format!("{p}.eh_proj"), h, 2 * h, false, c),
        head_norm: Some(build::norm(format!("{p}.shared_head.norm.weight"), h, c)),
        head: Some(maybe(TensorSpec::new(
            format!("{p}.shared_head.head.weight"),
            &[v, h],
            c,
            TensorKind::OutputHead,
        ))),
        hidden_first: false,
        chain_normed: false,
        layer,
    }
}

/// DeepSeek-V3's and Kimi-K2's releases hold real copies of the embedding and head in their
/// MTP layer: both are required.
pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    mla_tensors(s, |_, _| None, false)
}
