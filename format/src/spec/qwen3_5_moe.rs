//! Qwen3.5 / Qwen3.6 MoE (`model_type: qwen3_5_moe`, its language model `text_config` of type
//! `qwen3_5_moe_text`; Qwen3.5-397B-A17B, Qwen3.5-122B-A10B, Qwen3.5/3.6-35B-A3B), as
//! transformers 5.25 `Qwen3_5MoeTextConfig` / `modeling_qwen3_5_moe.py`.
//!
//! The architecture of [`super::qwen3_next`] (Gated DeltaNet and gated full-attention layers,
//! zero-centred norms, softmax top-k experts with a gated shared expert), with:
//! - split Gated DeltaNet input projections (`Qwen3_5MoeGatedDeltaNet`: `in_proj_qkv`,
//!   `in_proj_z`, `in_proj_b`, `in_proj_a`, [`GatedDeltaInput::Split`]);
//! - every layer MoE (`Qwen3_5MoeDecoderLayer` has no dense layers: `mlp_only_layers` and
//!   `decoder_sparse_step` are not read), the top-k always renormalized
//!   (`Qwen3_5MoeTopKRouter`; `norm_topk_prob` is not read);
//! - defaults of `Qwen3_5MoeTextConfig` (256 experts, 2 KV heads, head_dim 256, 32768
//!   positions: `qwen3_next::configure_hybrid`);
//! - interleaved multimodal RoPE (`mrope_section`, `mrope_interleaved`): for text every
//!   position id of the three sections is the token's position, so each rotary frequency `i`
//!   turns by `position * theta^(-2i/d)` whichever section supplies it: 1-D partial RoPE;
//! - the published checkpoints nest the language model (`model.language_model.*`, read through
//!   [`ModelSpec::canonical_tensor_name`]) beside a vision tower (`model.visual.*`, not
//!   converted) and store each layer's experts fused (`mlp.experts.gate_up_proj` `[E, 2I, H]`,
//!   `mlp.experts.down_proj` `[E, H, I]`, read as [`super::ExpertStorage::FusedConcat`]);
//! - the MTP layer (`mtp_num_hidden_layers`, default 1) at the top level beside them
//!   (`mtp.*`, per-expert experts as published), as vLLM's `qwen3_5_mtp.py` runs it: the MTP
//!   of [`super::qwen3_next`].

use super::build;
use super::json::Fields;
use super::qwen3_next::{check_shared, configure_hybrid, hybrid_tensors};
use super::{
    Family, GatedDeltaInput, GatedDeltaSpec, ModelSpec, ModelTensors, Routing, TensorClass,
};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    s.num_experts = f.usize("num_experts")?.unwrap_or(256);
    s.moe_intermediate_size = f.usize("moe_intermediate_size")?.unwrap_or(512);
    s.norm_topk_prob = true;
    s.routing = Routing::SoftmaxTopK { renormalize: true };
    if f.bool("mtp_use_dedicated_embeddings")? == Some(true) {
        return Err(FormatError::Unsupported(format!(
            "{}mtp_use_dedicated_embeddings true (an MTP layer with its own embedding; the releases share the main one)",
            f.prefix
        )));
    }
    configure_hybrid(f, s, Family::Qwen35Moe)?;
    s.moe_layers = vec![true; s.num_layers];
    check_shared(f, s)
}

/// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
fn split_input(p: &str, g: &GatedDeltaSpec, h: usize) -> GatedDeltaInput {
    let c = TensorClass::Dense;
    let vd = g.value_heads * g.value_head_dim;
    GatedDeltaInput::Split {
        qkv: build::linear(&format!("{p}.in_proj_qkv"), g.conv_channels(), h, false, c),
        z: build::linear(&format!("{p}.in_proj_z"), vd, h, false, c),
        b: build::linear(&format!("{p}.in_proj_b"), g.value_heads, h, false, c),
        a: build::linear(&format!("{p}.in_proj_a"), g.value_heads, h, false, c),
    }
}

pub(crate) fn tensors(s: &ModelSpec) -> ModelTensors {
    hybrid_tensors(s, split_input)
}
