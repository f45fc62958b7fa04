//! # coli-tools: the library under the `coli` and `coli-fsck` binaries
//!
//! [`options`] turns the shared command-line options into an opened store and engine; [`info`],
//! [`plan`], [`mirror`] and [`serve`] are the `coli info`, `plan`, `mirror` and `serve`
//! commands. The binaries (`src/bin/`) parse arguments and call these.

#![forbid(unsafe_code)]

pub mod info;
pub mod mirror;
pub mod options;
pub mod plan;
pub mod serve;
