//! # coli-tools: the library under the `coli` and `coli-fsck` binaries
//!
//! [`options`] turns the shared command-line options into an opened store and engine; [`info`],
//! [`plan`], [`mirror`] and [`serve`] are the `coli info`, `plan`, `mirror` and `serve`
//! commands. `src/bin/coli.rs` parses arguments, calls these, and keeps the terminal loops of
//! `run`, `chat` and `eval` (streaming text and statistics to stdout/stderr); `coli-fsck`
//! (`src/bin/coli-fsck.rs`) calls the store's fsck directly.

#![forbid(unsafe_code)]

/// What every binary does alike at its edges (one error format, a quiet exit on a closed
/// stdout): `coli_convert::cli`, shared with coli-convert.
pub use coli_convert::cli;
pub mod doctor;
pub mod export;
pub mod info;
pub mod kv;
pub mod mirror;
pub mod options;
pub mod plan;
pub mod serve;
pub mod session;
pub mod tune;
pub mod units;
