//! Building blocks shared by the model families: linear projections over store matrices, RMSNorm,
//! rotary embeddings, grouped-query attention with a KV cache, the MoE block (router + experts
//! through the expert cache), the dense SwiGLU MLP, and the decoder layer that composes them.
//!
//! Activations are f32 row-major `[tokens, features]` slices; weights stay in their store
//! encoding and are multiplied by `coli_kernels` (matvec for one token, matmul for a batch: row
//! `t` of matmul is bit-identical to matvec, so prefill and decode agree).

pub mod attention;
pub mod attn_res;
pub mod decoder;
pub mod deepseek_v4;
pub mod dsa_indexer;
pub mod gated_delta;
pub mod hyper;
pub mod inkling;
pub mod inkling2;
pub mod linear;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod sigmoid_router;

pub use attention::{Attention, LayerKv, QkNorm, RecurrentCheckpoint};
pub use decoder::{
    DecoderLayer, Ffn, HeldUsage, LayerCtx, LayerHyper, OutputConvs, SelfAttn, Span,
};
pub use gated_delta::{GatedDeltaNet, GatedDeltaProjections};
pub use linear::Linear;
pub use mla::Mla;
pub use mlp::{Glu, Mlp};
pub use moe::MoeBlock;
pub use norm::RmsNorm;
pub use rope::Rope;
pub use sigmoid_router::SigmoidMoe;
