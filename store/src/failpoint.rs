//! Named failpoints for crash tests: the one place that reads `COLI_FAILPOINT`.
//!
//! The variable holds a comma-separated list of `name` or `name:N`. A listed `name` aborts the
//! process ([`std::process::abort`]: no cleanup, no flush, like a crash) when [`hit`] reaches
//! it; `name:N` aborts when [`hit_nth`] reaches it for the N-th time (counted by the caller,
//! from 1). Tests run the program as a child process with the variable set and check what a
//! crash at that point leaves behind (kill -9 tests use real signals the same way).
//!
//! Points of the store writer (`writer.*`, docs/FORMAT.md section 10) and of `coli-convert`
//! (`convert.*`, docs/CONVERT.md):
//!
//! | name | where |
//! |---|---|
//! | `writer.after_record:N` | after the bytes of the N-th expert record, before its journal line |
//! | `writer.after_journal:N` | after the journal line of the N-th expert record |
//! | `writer.after_dense:N` | after the bytes of the N-th dense tensor, before its journal line |
//! | `writer.before_index` | in `finish`, after the segment headers, before INDEX |
//! | `writer.before_manifest` | in `finish`, after INDEX and fsyncs, before MANIFEST |
//! | `writer.before_rename` | in `finish`, after MANIFEST and the removal of spec/journal |
//! | `writer.after_rename` | in `finish`, after the rename, before the parent fsync |
//! | `convert.after_preflight` | once preflight passed, before the store is created |
//! | `convert.after_expert:N` | after N expert records were written by this run |
//! | `convert.after_dense` | after the dense tensors were written |
//!
//! In-process fault injection (I/O errors, torn writes at any file operation) goes through the
//! writer's file backend instead ([`crate::WriterFs`]).

use std::sync::OnceLock;

/// The parsed variable: (name, N) pairs.
fn points() -> &'static [(String, Option<u64>)] {
    static P: OnceLock<Vec<(String, Option<u64>)>> = OnceLock::new();
    P.get_or_init(|| {
        std::env::var("COLI_FAILPOINT")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.rsplit_once(':') {
                Some((name, n)) if n.parse::<u64>().is_ok() => {
                    (name.to_string(), n.parse::<u64>().ok())
                }
                _ => (s.to_string(), None),
            })
            .collect()
    })
}

fn abort(point: &str) -> ! {
    eprintln!("coli: failpoint {point} reached (COLI_FAILPOINT), aborting");
    std::process::abort()
}

/// Aborts the process when `name` is listed (without a count).
pub fn hit(name: &str) {
    if points().iter().any(|(n, c)| n == name && c.is_none()) {
        abort(name);
    }
}

/// Aborts the process when `name:n` is listed.
pub fn hit_nth(name: &str, n: u64) {
    if points().iter().any(|(p, c)| p == name && *c == Some(n)) {
        abort(&format!("{name}:{n}"));
    }
}
