//! Mixtral (`model_type: mixtral`), as transformers 5.23 `modeling_mixtral.py`:
//!
//! - attention: q/k/v/o projections without bias, no q/k norm, RoPE, GQA, optional
//!   `sliding_window`;
//! - every layer is sparse: router `block_sparse_moe.gate` (legacy checkpoint name) or
//!   `mlp.gate` (transformers 5 name), softmax over the f32 logits, top-k, and the top-k weights
//!   ALWAYS renormalized to sum to 1 (`MixtralTopKRouter`);
//! - experts: SwiGLU `w2(silu(w1 x) * w3 x)` (gate, up, down in the store's expert records).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{Ffn, QkNorm};
use crate::models::{assemble, load_moe, Model};
use coli_store::Store;

/// Builds a Mixtral model over `store`.
///
/// # Errors
/// Missing or misshapen tensors (named), expert counts differing from the config.
pub fn load(store: &Store, config: ModelConfig) -> Result<Model<'_>> {
    let c = config.clone();
    assemble(store, config, |i| {
        let routers = [
            format!("model.layers.{i}.block_sparse_moe.gate"),
            format!("model.layers.{i}.mlp.gate"),
        ];
        Ok((QkNorm::None, Ffn::Moe(load_moe(store, &c, i, &routers)?)))
    })
}
