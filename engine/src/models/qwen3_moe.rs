//! Qwen3-MoE (`model_type: qwen3_moe`), as transformers 5.23 `modeling_qwen3_moe.py`:
//!
//! - attention: q/k/v/o projections (bias when `attention_bias`), then RMSNorm of EACH HEAD of
//!   q and k (`q_norm`/`k_norm` weights of `head_dim` values) before RoPE; sliding window only
//!   when `use_sliding_window`;
//! - layer i is sparse when it is not in `mlp_only_layers` and `(i + 1) % decoder_sparse_step
//!   == 0`, else it has a dense SwiGLU `mlp.{gate,up,down}_proj` of `intermediate_size`;
//! - router `mlp.gate`: softmax (f32) over all experts, top-k, renormalized only when
//!   `norm_topk_prob`; experts of `moe_intermediate_size`.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{Ffn, Mlp, QkNorm, RmsNorm};
use crate::models::{assemble, load_moe, Model};
use coli_store::Store;

/// Builds a Qwen3-MoE model over `store`.
///
/// # Errors
/// Missing or misshapen tensors (named), expert counts differing from the config.
pub fn load(store: &Store, config: ModelConfig) -> Result<Model<'_>> {
    let c = config.clone();
    assemble(store, config, |i| {
        let p = format!("model.layers.{i}");
        let qk = QkNorm::PerHead {
            q: RmsNorm::load(
                store,
                &format!("{p}.self_attn.q_norm.weight"),
                c.head_dim,
                c.rms_norm_eps,
            )?,
            k: RmsNorm::load(
                store,
                &format!("{p}.self_attn.k_norm.weight"),
                c.head_dim,
                c.rms_norm_eps,
            )?,
        };
        let ffn = if c.is_moe_layer(i) {
            Ffn::Moe(load_moe(store, &c, i, &[format!("{p}.mlp.gate")])?)
        } else {
            Ffn::Dense(Mlp::load(
                store,
                &format!("{p}.mlp"),
                c.hidden_size,
                c.intermediate_size,
            )?)
        };
        Ok((qk, ffn))
    })
}
