//! GGUF input: `coli-convert FILE.gguf STORE` (docs/CONVERT.md, "From a GGUF"). [`mod@file`]
//! reads the format, [`arch`] maps llama.cpp's architectures to coli's model spec,
//! [`tokenizer`] writes the tokenizer files, [`fused`] reads llama.cpp's fused tensors as the
//! ones they join, [`convert`] streams the tensors into the store,
//! [`mod@write`] writes a store converted from a GGUF back as one (`coli export --gguf`).

pub mod arch;
pub mod convert;
pub mod file;
pub mod fused;
pub mod tokenizer;
pub mod write;

pub use convert::{is_gguf, run};
