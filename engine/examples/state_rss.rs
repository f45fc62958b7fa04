//! What N live sequences cost in resident memory, against what the engine (and `coli plan`)
//! counts per sequence (`Engine::kv_bytes_per_sequence`): issue 44's "state bytes per sequence
//! as the plan says (measured RSS)". Driven by `engine/bench/hybrid_state_rss.sh`.
//!
//! Usage: `state_rss STORE SEQUENCES TOKENS`: opens the store (context = TOKENS), prefills
//! SEQUENCES sequences of TOKENS pseudo-random ids one after the other and keeps them all
//! live; after each, prints one JSON line with the process's `VmRSS` and `RssAnon` (from
//! `/proc/self/status`), the sequences' own `Sequence::kv_bytes` and the engine's per-sequence
//! figure. The growth from sequence 1 to N, over N - 1, is a sequence's measured cost (the
//! first sequence also pays the pass's scratch and first-touch of the weights).

use coli_engine::{BatchItem, Engine, EngineOptions, Logits};
use std::path::Path;

fn status(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: state_rss STORE SEQUENCES TOKENS");
        std::process::exit(2);
    }
    let (n, tokens): (usize, usize) = match (args[2].parse(), args[3].parse()) {
        (Ok(n), Ok(t)) if n >= 2 && t >= 1 => (n, t),
        _ => {
            eprintln!("state_rss: SEQUENCES (at least 2) and TOKENS must be positive integers");
            std::process::exit(2);
        }
    };
    let store = coli_store::Store::open(Path::new(&args[1])).unwrap_or_else(|e| {
        eprintln!("state_rss: {}: {e}", args[1]);
        std::process::exit(1);
    });
    let mut e = Engine::new(
        &store,
        &EngineOptions {
            context: Some(tokens),
            max_sequences: n + 1,
            ..Default::default()
        },
    )
    .unwrap_or_else(|err| {
        eprintln!("state_rss: {err}");
        std::process::exit(1);
    });
    let vocab = e.spec().vocab_size as u64;
    let per_seq = e.kv_bytes_per_sequence();
    let batch = e.prefill_batch().max(1);
    println!(
        "{{\"sequences\": 0, \"vm_rss\": {}, \"rss_anon\": {}, \"engine_kv_bytes_per_sequence\": {per_seq}, \"tokens\": {tokens}, \"prefill_batch\": {batch}}}",
        status("VmRSS:"),
        status("RssAnon:")
    );
    let mut live = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..n {
        let ids: Vec<u32> = (0..tokens)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % vocab) as u32
            })
            .collect();
        let mut seq = e.new_sequence().unwrap();
        for span in coli_engine::prefill::spans(0, ids.len(), batch, e.prefill_align()) {
            let mut items = [BatchItem {
                seq: &mut seq,
                ids: &ids[span],
                logits: Some(Logits::Last),
                verify: false,
            }];
            e.forward_many(&mut items).unwrap();
        }
        live.push(seq);
        let held: u64 = live.iter().map(|s| s.kv_bytes()).sum();
        println!(
            "{{\"sequences\": {}, \"vm_rss\": {}, \"rss_anon\": {}, \"kv_bytes_held\": {held}}}",
            i + 1,
            status("VmRSS:"),
            status("RssAnon:")
        );
    }
}
