//! GLM-5 (`model_type: glm_moe_dsa`), as transformers 5.23 `GlmMoeDsaConfig` /
//! `modeling_glm_moe_dsa.py`: DeepSeek-V3's architecture ([`super::deepseek_v3`]) with
//!
//! - Layers: `mlp_layer_types` (`"dense"` / `"sparse"`, one per layer) when given, else
//!   `first_k_dense_replace` / `moe_layer_freq`;
//! - Attention: MLA with RoPE always interleaved, plus the DSA lightning indexer
//!   (`self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`) on every `"full"` layer of
//!   `indexer_types` (`"shared"` layers reuse the previous full layer's selection; the MTP
//!   layer runs its own); the indexer needs `q_lora_rank` (it reads the q latent);
//! - Routing: as DeepSeek-V3 (default `rms_norm_eps` 1e-5).

use super::build;
use super::deepseek_v3::{configure_mla, mla_tensors};
use super::json::Fields;
use super::{Family, IndexerSpec, ModelSpec, ModelTensors};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    configure_dsa(f, s, Family::GlmMoeDsa)
}

/// The MLA configuration of a family with the DSA indexer (GLM-5, DeepSeek-V3.2), which needs
/// `q_lora_rank`.
pub(crate) fn configure_dsa(
    f: &Fields<'_>,
    s: &mut ModelSpec,
    family: Family,
) -> Result<(), FormatError> {
    configure_mla(f, s, family)?;
    let m = s.mla.as_ref().expect("set by configure_mla");
    if m.q_lora_rank.is_none() {
        return Err(f.err("the DSA indexer needs q_lora_rank (it reads the q latent)"));
    }
    Ok(())
}

/// Every tensor of GLM-5 or DeepSeek-V3.2: DeepSeek-V3's with the DSA indexer of each full
/// layer. GLM-5's MTP layer may come without `embed_tokens` and `shared_head.head` (the
/// published GLM-5, 5.1 and 5.2 checkpoints share the main model's embedding and lm_head:
/// vLLM PR #34385, vllm-ascend's GLM-5 `adjust_weight.py`); DeepSeek-V3.2's releases hold
/// real copies (its MTP head differs from lm_head), so they stay required there.
pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    let m = s.mla.as_ref().expect("MLA families have an MLA spec");
    let d = m
        .dsa
        .as_ref()
        .expect("glm_moe_dsa and deepseek_v32 have a DSA spec");
    let rq = m.q_lora_rank.expect("checked in configure");
    let h = s.hidden_size;
    let shared_mtp_embed_and_head = s.family == Family::GlmMoeDsa;
    mla_tensors(
        s,
        |i, c| {
            d.is_full(i).then(|| {
                let p = format!("model.layers.{i}.self_attn.indexer");
                IndexerSpec {
                    wq_b: build::linear(&format!("{p}.wq_b"), d.n_heads * d.head_dim, rq, false, c),
                    wk: build::linear(&format!("{p}.wk"), d.head_dim, h, false, c),
                    k_norm_weight: build::norm(format!("{p}.k_norm.weight"), d.head_dim, c),
                    k_norm_bias: build::norm(format!("{p}.k_norm.bias"), d.head_dim, c),
                    weights_proj: build::linear(
                        &format!("{p}.weights_proj"),
                        d.n_heads,
                        h,
                        false,
                        c,
                    ),
                    kpool: None,
                }
            })
        },
        shared_mtp_embed_and_head,
    )
}
