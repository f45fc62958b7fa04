//! Mirror benchmark over throttled drives (issue 7; run by `store/bench/mirror_bench.sh`).
//!
//! ```text
//! mirror_bench DIR [MIB] [PRIMARY_MIBPS] [MIRROR_MIBPS] [PASSES]
//! ```
//!
//! Writes a store of about MIB MiB (default 384) of ~1 MiB int8 expert records in `DIR/s.coli`
//! and a full mirror of it in `DIR/m` (kept for later runs), then reads every expert, in a fixed
//! shuffled order, through the store's real pread and io_uring engines wrapped in the TEST-ONLY
//! token-bucket throttle of `store/tests/throttle/mod.rs` (one bucket per directory: the primary
//! at PRIMARY_MIBPS, default 200, the mirror at MIRROR_MIBPS, default 100; burst 256 KiB), with
//! `disk_weights` set to the ratio of the limits. Runs, each PASSES times (default 2) over all
//! experts:
//!
//! - `primary-only`: no mirror (checks the throttle: about PRIMARY_MIBPS);
//! - `unstriped tN`: demand batches of 8 experts on N threads (1, 2 and 4: one batch in flight,
//!   or several as with prefetch beside demand), each expert from its assigned drive;
//! - `striped`: one record per fetch, every record above the stripe threshold (256 KiB), split
//!   over both drives in proportion to the weights.
//!
//! Prints one JSON line per run: aggregate MiB/s and its percentage of the sum of the limits and
//! of the split bound (the most the run's byte split allows: total bytes over the longest
//! `bytes_d / limit_d`), and each drive's bytes, share (next to its weight's share) and MiB/s
//! (next to its limit). The
//! throttle's own per-drive byte counts are checked against the store's mirror stats.

#[path = "../tests/throttle/mod.rs"]
mod throttle;

use coli_store::mirror::copy::copy_segments;
use coli_store::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

const H: usize = 1024;
const I: usize = 352;
const EXPERTS_PER_LAYER: u32 = 64;
const BATCH: usize = 8;
const BURST: u64 = 256 << 10;

fn write(dir: &Path, mib: u64) -> Result<(), Box<dyn std::error::Error>> {
    let enc = Encoding::Int8;
    let rec = RecordLayout::new(enc, H, I, false).record_len(4096) as u64;
    let n = (mib << 20).div_ceil(rec);
    let layers = n.div_ceil(EXPERTS_PER_LAYER as u64) as u32;
    let spec = StoreSpec {
        family: "bench".into(),
        config_json: br#"{"model_type":"bench"}"#.to_vec(),
        num_layers: layers,
        expert_layers: (0..layers)
            .map(|layer| ExpertLayer {
                layer,
                num_experts: EXPERTS_PER_LAYER,
            })
            .collect(),
        expert_encoding: enc,
        alignment: 4096,
        segment_max_bytes: DEFAULT_SEGMENT_MAX_BYTES,
        matrix_order: Default::default(),
        converter_version: "bench".into(),
        parameter_defaults: Default::default(),
        parameters: BTreeMap::new(),
        sources: vec![],
    };
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut mat = |rows: usize, cols: usize| EncodedMatrix {
        encoding: enc,
        rows,
        cols,
        data: (0..rows * cols)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
        scales: vec![0.01; rows],
        e8m0_scales: Vec::new(),
        bias: None,
    };
    let (g, u, d) = (mat(I, H), mat(I, H), mat(H, I));
    let mut w = match StoreWriter::create_or_resume(dir, spec)? {
        WriterStart::Fresh(w) | WriterStart::Resumed(w, _) => w,
        WriterStart::AlreadyComplete => return Ok(()),
    };
    for layer in 0..layers {
        for e in 0..EXPERTS_PER_LAYER {
            let k = ExpertKey::new(layer, e);
            if !w.is_expert_done(k) {
                w.add_expert(k, H, I, [&g, &u, &d])?;
            }
        }
    }
    w.finish()?;
    eprintln!(
        "wrote {} records of {rec} bytes ({} MiB)",
        layers * EXPERTS_PER_LAYER,
        (layers as u64 * EXPERTS_PER_LAYER as u64 * rec) >> 20
    );
    Ok(())
}

struct Run<'a> {
    store: &'a Path,
    mirror: &'a Path,
    limits: [f64; 2],
    passes: usize,
}

impl Run<'_> {
    /// One measured run; returns the JSON-ish line.
    fn go(
        &self,
        engine: IoEngineChoice,
        mirrored: bool,
        striped: bool,
        threads: usize,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let mut spec = vec![(self.store.to_path_buf(), self.limits[0])];
        if mirrored {
            spec.push((self.mirror.to_path_buf(), self.limits[1]));
        }
        let drives = throttle::drives(&spec, BURST);
        let store = Store::open_with(
            self.store,
            &OpenOptions {
                engine,
                mirrors: if mirrored {
                    vec![self.mirror.to_path_buf()]
                } else {
                    vec![]
                },
                disk_weights: mirrored.then(|| self.limits.to_vec()),
                stripe_threshold: if striped { 256 << 10 } else { u64::MAX },
                queue_depth: Some(8),
                engine_wrapper: Some(throttle::wrapper(drives.clone())),
                ..OpenOptions::default()
            },
        )?;
        // Every expert, in a fixed shuffled order (xorshift permutation).
        let mut keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in (1..keys.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            keys.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let t = Instant::now();
        for _ in 0..self.passes {
            if striped {
                for &k in &keys {
                    store.fetch_one(k)?;
                }
            } else {
                let batches: Vec<&[ExpertKey]> = keys.chunks(BATCH).collect();
                std::thread::scope(|s| -> Result<(), StoreError> {
                    let hs: Vec<_> = (0..threads)
                        .map(|t| {
                            let (store, batches) = (&store, &batches);
                            s.spawn(move || -> Result<(), StoreError> {
                                for b in batches.iter().skip(t).step_by(threads) {
                                    store.fetch(b)?;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    for h in hs {
                        h.join().expect("fetch thread panicked")?;
                    }
                    Ok(())
                })?;
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let bytes: Vec<u64> = drives
            .iter()
            .map(|d| d.bytes.load(Ordering::Relaxed))
            .collect();
        if let Some(st) = store.mirror_stats() {
            let counted: Vec<u64> = st.drives.iter().map(|d| d.bytes).collect();
            if counted != bytes {
                return Err(
                    format!("throttle saw {bytes:?} bytes, mirror stats {counted:?}").into(),
                );
            }
            if striped && st.striped_reads != (keys.len() * self.passes) as u64 {
                return Err(format!("only {} striped reads", st.striped_reads).into());
            }
        }
        let total: u64 = bytes.iter().sum();
        let limit_sum: f64 = spec.iter().map(|s| s.1).sum();
        let agg = total as f64 / 1048576.0 / secs;
        let mode = match (mirrored, striped) {
            (false, _) => "primary-only".to_string(),
            (true, false) => format!("unstriped t{threads}"),
            (true, true) => "striped".to_string(),
        };
        // The most the byte split allows: the drive with the most bytes per unit of bandwidth
        // finishes last, at best after bytes_d / limit_d.
        let split_bound = total as f64
            / 1048576.0
            / bytes
                .iter()
                .zip(&spec)
                .map(|(b, s)| *b as f64 / 1048576.0 / s.1)
                .fold(0.0, f64::max);
        let mut line = format!(
            "{{\"engine\":\"{}\",\"mode\":\"{mode}\",\"io\":\"{:?}\",\"records\":{},\"MiB\":{:.1},\"secs\":{secs:.3},\"agg_MiBps\":{agg:.1},\"agg_GiBps\":{:.3},\"limit_sum_MiBps\":{limit_sum:.0},\"pct_of_limits\":{:.1},\"split_bound_MiBps\":{split_bound:.1},\"pct_of_split_bound\":{:.1},\"drives\":[",
            store.io_engine(),
            store.io_mode(),
            keys.len() * self.passes,
            total as f64 / 1048576.0,
            agg / 1024.0,
            100.0 * agg / limit_sum,
            100.0 * agg / split_bound
        );
        for (i, (b, s)) in bytes.iter().zip(&spec).enumerate() {
            line += &format!(
                "{}{{\"limit_MiBps\":{:.0},\"MiB\":{:.1},\"share\":{:.3},\"weight_share\":{:.3},\"MiBps\":{:.1}}}",
                if i > 0 { "," } else { "" },
                s.1,
                *b as f64 / 1048576.0,
                *b as f64 / total as f64,
                s.1 / limit_sum,
                *b as f64 / 1048576.0 / secs
            );
        }
        line += "]}";
        Ok(line)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().map(PathBuf::from) else {
        return Err("usage: mirror_bench DIR [MIB] [PRIMARY_MIBPS] [MIRROR_MIBPS] [PASSES]".into());
    };
    let num = |i: usize, d: f64| -> Result<f64, Box<dyn std::error::Error>> {
        match args.get(i) {
            Some(s) => Ok(s
                .parse::<f64>()
                .map_err(|e| format!("argument {}: {s:?}: {e}", i + 1))?),
            None => Ok(d),
        }
    };
    let (mib, p, m, passes) = (num(1, 384.0)?, num(2, 200.0)?, num(3, 100.0)?, num(4, 2.0)?);
    std::fs::create_dir_all(&dir)?;
    let store_dir = dir.join("s.coli");
    let mirror = dir.join("m");
    write(&store_dir, mib as u64)?;
    // Copies the segments not yet in the mirror (kept from an earlier run when admitted).
    std::fs::create_dir_all(&mirror)?;
    let c = copy_segments(&Store::open(&store_dir)?, &mirror, 0)?;
    eprintln!("mirror: {c:?}");
    let run = Run {
        store: &store_dir,
        mirror: &mirror,
        limits: [p, m],
        passes: passes as usize,
    };
    for engine in [
        IoEngineChoice::Engine("pread"),
        IoEngineChoice::Engine("uring"),
    ] {
        println!("{}", run.go(engine, false, false, 2)?);
        println!("{}", run.go(engine, true, false, 1)?);
        println!("{}", run.go(engine, true, false, 2)?);
        println!("{}", run.go(engine, true, false, 4)?);
        println!("{}", run.go(engine, true, true, 1)?);
    }
    Ok(())
}
