//! # coli-convert: Hugging Face MoE checkpoint to coli block store
//!
//! Reads a local safetensors checkpoint (FP8 e4m3 with 128x128 block scales, BF16, F16, F32),
//! checks everything the architecture needs before writing anything ([`plan::build`]), then
//! streams tensors through [`coli_store::StoreWriter`]: dense tensors first, then routed
//! experts layer by layer, quantized per docs/FORMAT.md section 6 ([`quant`]). Resumable after a
//! crash, deterministic for any thread count. The command line is documented in
//! docs/CONVERT.md.

mod byte_level;
pub mod checkpoint;
pub mod cli;
pub mod error;
pub mod fused;
pub mod gguf;
pub mod memory_plan;
pub mod pipeline;
pub mod plan;
pub mod quant;
pub mod safetensors;
pub mod tiktoken;

pub use error::{ConvertError, Result};
pub use pipeline::{parse_encoding, run, Options, Report};
pub use plan::{Encodings, RoleEncodings};
