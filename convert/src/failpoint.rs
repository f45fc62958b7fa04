//! Named failpoints for crash tests: the environment variable `COLI_FAILPOINT` (shared with
//! the store writer, which has its own names) holds a comma-separated list of names. The
//! converter's names:
//!
//! - `convert.after_preflight`: abort once preflight passed, before the store is created;
//! - `convert.after_expert:N`: abort after N expert records were written by this run;
//! - `convert.after_dense`: abort after the dense tensors were written.
//!
//! Hitting one calls [`std::process::abort`] (like a crash: no cleanup, no flush).

use std::sync::OnceLock;

fn list() -> &'static [String] {
    static L: OnceLock<Vec<String>> = OnceLock::new();
    L.get_or_init(|| {
        std::env::var("COLI_FAILPOINT")
            .unwrap_or_default()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    })
}

/// Aborts the process if failpoint `name` is set.
pub fn hit(name: &str) {
    if list().iter().any(|f| f == name) {
        eprintln!("coli-convert: failpoint {name} hit, aborting");
        std::process::abort();
    }
}

/// Aborts the process if `convert.after_expert:N` is set and `written == N`.
pub fn after_expert(written: u64) {
    for f in list() {
        if let Some(n) = f.strip_prefix("convert.after_expert:") {
            if n.parse::<u64>().ok() == Some(written) {
                eprintln!("coli-convert: failpoint {f} hit, aborting");
                std::process::abort();
            }
        }
    }
}
