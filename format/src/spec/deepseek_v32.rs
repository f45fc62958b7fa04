//! DeepSeek-V3.2 (`model_type: deepseek_v32`), as transformers 5.23 `DeepseekV32Config` /
//! `modeling_deepseek_v32.py`: DeepSeek-V3's architecture ([`super::deepseek_v3`]: MLA, grouped
//! sigmoid routing with shared experts, dense first layers, the MTP layer) with the DSA
//! lightning indexer GLM-5 also has ([`super::glm_moe_dsa`]; same tensors
//! `self_attn.indexer.{wq_b, wk, k_norm, weights_proj}`, same scoring), where:
//!
//! - every layer runs its own indexer (no `indexer_types` / shared layers);
//! - the indexer's RoPE on its first `qk_rope_head_dim` dimensions is half-split
//!   (`rotate_half`, `apply_rotary_pos_emb` in `DeepseekV32Indexer`), while the MLA attention's
//!   is interleaved (`apply_rotary_pos_emb_interleave`) as in GLM-5; GLM-5's indexer is
//!   interleaved too;
//! - defaults are `DeepseekV32Config`'s (n_group 8, topk_group 4, 3 dense layers, 64 indexer
//!   heads of 128, `index_topk` 2048, `rms_norm_eps` 1e-6); the indexer needs `q_lora_rank`.
//!
//! The reference implementation's Hadamard rotation and FP8 scoring of the indexer are left out
//! by transformers (an orthogonal rotation preserves the dot products; FP8 is a precision
//! shortcut); coli follows transformers.

use super::glm_moe_dsa::configure_dsa;
use super::json::Fields;
use super::{Family, ModelSpec};
use crate::FormatError;

pub(crate) fn configure(f: &Fields<'_>, s: &mut ModelSpec) -> Result<(), FormatError> {
    configure_dsa(f, s, Family::DeepseekV32)
}
