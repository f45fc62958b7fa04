//! OLMoE (`model_type: olmoe`), as transformers 5.23 `modeling_olmoe.py`:
//!
//! - attention: q/k/v/o projections (bias when `attention_bias`), then ONE RMSNorm over the
//!   whole projected q vector (`q_norm`, `hidden_size` = heads * head_dim values) and one over
//!   the whole k vector (`k_norm`, kv_heads * head_dim values), then, when `clip_qkv` is set,
//!   q, k and v clamped to `[-clip_qkv, clip_qkv]`, then RoPE; no sliding window;
//! - every layer is sparse: router `mlp.gate`, softmax (f32), top-k, renormalized only when
//!   `norm_topk_prob`.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{Ffn, QkNorm, RmsNorm};
use crate::models::{assemble, load_moe, Model};
use coli_store::Store;

/// Builds an OLMoE model over `store`.
///
/// # Errors
/// Missing or misshapen tensors (named), expert counts differing from the config.
pub fn load(store: &Store, config: ModelConfig) -> Result<Model<'_>> {
    let c = config.clone();
    assemble(store, config, |i| {
        let p = format!("model.layers.{i}.self_attn");
        let qk = QkNorm::Full {
            q: RmsNorm::load(
                store,
                &format!("{p}.q_norm.weight"),
                c.num_heads * c.head_dim,
                c.rms_norm_eps,
            )?,
            k: RmsNorm::load(
                store,
                &format!("{p}.k_norm.weight"),
                c.num_kv_heads * c.head_dim,
                c.rms_norm_eps,
            )?,
        };
        let routers = [format!("model.layers.{i}.mlp.gate")];
        Ok((qk, Ffn::Moe(load_moe(store, &c, i, &routers)?)))
    })
}
