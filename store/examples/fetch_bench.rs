//! Random-fetch benchmark of a large store (see `store/bench/fetch_bench.sh`).
//!
//! ```text
//! fetch_bench write DIR GIB            write a store of about GIB GiB of ~16 MiB int8 records
//! fetch_bench read DIR QD SECONDS [OPTION...]
//!                                      random fetches, batches of QD records with QD in
//!                                      flight, after dropping the segment files' pages
//!                                      (posix_fadvise DONTNEED; with a buffered engine also
//!                                      each record's pages after its batch, so every read is
//!                                      cold); prints one JSON line. OPTIONs: `noverify`,
//!                                      `engine=auto|uring|pread|mmap`, `buffered`,
//!                                      `piece=BYTES` (verify piece size, 0 = whole record)
//! fetch_bench hash MIB                 xxh3 throughput on MIB-MiB buffers (store's run-time
//!                                      dispatched AVX2 loop vs xxhash-rust as compiled), hot
//!                                      (one buffer, cached) and cold (64 buffers); one JSON line
//! ```

use coli_store::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

const H: usize = 2048;
const I: usize = 2730;
const EXPERTS_PER_LAYER: u32 = 32;

fn write(dir: &Path, gib: u64) -> Result<(), Box<dyn std::error::Error>> {
    let enc = Encoding::Int8;
    let rec = RecordLayout::new(enc, H, I, false).record_len(4096) as u64;
    let n = (gib << 30).div_ceil(rec);
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
    let mut mat = |rows: usize, cols: usize| {
        let data = (0..rows * cols)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        EncodedMatrix {
            encoding: enc,
            rows,
            cols,
            data,
            scales: vec![0.01; rows],
            e8m0_scales: Vec::new(),
            bias: None,
        }
    };
    let (g, u, d) = (mat(I, H), mat(I, H), mat(H, I));
    let mut w = match StoreWriter::create_or_resume(dir, spec)? {
        WriterStart::Fresh(w) | WriterStart::Resumed(w, _) => w,
        WriterStart::AlreadyComplete => return Ok(()),
    };
    let t = Instant::now();
    for layer in 0..layers {
        for e in 0..EXPERTS_PER_LAYER {
            let k = ExpertKey::new(layer, e);
            if !w.is_expert_done(k) {
                w.add_expert(k, H, I, [&g, &u, &d])?;
            }
        }
    }
    w.finish()?;
    let bytes = layers as u64 * EXPERTS_PER_LAYER as u64 * rec;
    eprintln!(
        "wrote {bytes} bytes in {:.1} s ({:.0} MB/s), record {rec} bytes",
        t.elapsed().as_secs_f64(),
        bytes as f64 / 1e6 / t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn drop_pages(dir: &Path, segments: u32) {
    use std::os::fd::AsRawFd;
    for id in 0..segments {
        let f = std::fs::File::open(dir.join(format!("segments/seg-{id:05}.bin"))).unwrap();
        // SAFETY: plain advisory syscall on an open descriptor.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise failed");
    }
}

/// Drops the cached pages of `len` bytes at `off` of `file`.
fn drop_range(file: &std::fs::File, off: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain advisory syscall on an open descriptor.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            off as i64,
            len as i64,
            libc::POSIX_FADV_DONTNEED,
        )
    };
}

fn read(
    dir: &Path,
    qd: usize,
    seconds: f64,
    opts: &[String],
) -> Result<(), Box<dyn std::error::Error>> {
    let mut o = OpenOptions {
        fetch_threads: qd,
        queue_depth: Some(qd),
        ..Default::default()
    };
    for a in opts {
        match a.split_once('=') {
            None if a == "noverify" => o.verify_checksums = false,
            None if a == "buffered" => o.io = IoPreference::Buffered,
            Some(("engine", e)) => o.engine = e.parse()?,
            Some(("piece", n)) => o.verify_piece_bytes = Some(n.parse()?),
            _ => return Err(format!("unknown read option {a:?}").into()),
        }
    }
    let verify = o.verify_checksums;
    let store = Store::open_with(dir, &o)?;
    drop_pages(dir, store.manifest().segment_count);
    let buffered = store.io_mode() == IoMode::Buffered;
    let segs: Vec<std::fs::File> = (0..store.manifest().segment_count)
        .map(|id| std::fs::File::open(dir.join(format!("segments/seg-{id:05}.bin"))))
        .collect::<Result<_, _>>()?;
    let keys: Vec<ExpertKey> = store.index().iter().map(|r| r.key()).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys[(x % keys.len() as u64) as usize]
    };
    let t = Instant::now();
    let mut lat = Vec::new();
    while t.elapsed().as_secs_f64() < seconds {
        let batch: Vec<ExpertKey> = (0..qd).map(|_| next()).collect();
        let t0 = Instant::now();
        let bufs = store.fetch(&batch)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
        assert_eq!(bufs.len(), qd);
        if buffered {
            for k in &batch {
                let r = store.record(*k).unwrap();
                drop_range(
                    &segs[r.segment.get() as usize],
                    r.offset.get(),
                    r.length.get(),
                );
            }
        }
    }
    let el = t.elapsed().as_secs_f64();
    let s = store.stats();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "{{\"qd\":{qd},\"engine\":\"{}\",\"engine_desc\":\"{}\",\"io_mode\":\"{:?}\",\"verify\":{verify},\"piece\":\"{:?}\",\"seconds\":{el:.2},\"records\":{},\"bytes\":{},\"MBps\":{:.1},\"MiBps\":{:.1},\"GiBps\":{:.3},\"io_wait_s\":{:.2},\"verify_s\":{:.2},\"batch_ms_p50\":{:.2},\"batch_ms_p99\":{:.2}}}",
        store.io_engine(),
        store.io_engine_description(),
        store.io_mode(),
        o.verify_piece_bytes,
        s.reads,
        s.bytes_read,
        s.bytes_read as f64 / 1e6 / el,
        s.bytes_read as f64 / (1 << 20) as f64 / el,
        s.bytes_read as f64 / (1u64 << 30) as f64 / el,
        s.io_wait_ns as f64 / 1e9,
        s.verify_ns as f64 / 1e9,
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}

fn hash(mib: usize) {
    let n = mib << 20;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let bufs: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect();
    type HashFn = fn(&[u8], u64) -> u64;
    let fns: [(&str, HashFn); 2] = [
        ("store_checksum", coli_store::checksum::xxh3_64_with_seed),
        ("xxhash_rust", xxhash_rust::xxh3::xxh3_64_with_seed),
    ];
    let mut out = Vec::new();
    for (name, f) in fns {
        let mut sum = 0u64;
        let t = Instant::now();
        for _ in 0..16 {
            sum ^= f(&bufs[0], 7);
        }
        let hot = 16.0 * n as f64 / 1e9 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for b in &bufs {
            sum ^= f(b, 7);
        }
        let cold = 64.0 * n as f64 / 1e9 / t.elapsed().as_secs_f64();
        out.push(format!(
            "\"{name}\":{{\"hot_GBps\":{hot:.2},\"cold_GBps\":{cold:.2},\"xor\":\"{sum:016x}\"}}"
        ));
    }
    println!("{{\"hash_mib\":{mib},{}}}", out.join(","));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("write") if a.len() == 4 => write(Path::new(&a[2]), a[3].parse()?),
        Some("read") if a.len() >= 5 => read(
            Path::new(&a[2]),
            a[3].parse()?,
            a[4].parse()?,
            &a[5..],
        ),
        Some("hash") if a.len() == 3 => {
            hash(a[2].parse()?);
            Ok(())
        }
        _ => Err(
            "usage: fetch_bench write DIR GIB | fetch_bench read DIR QD SECONDS [noverify] [engine=E] [buffered] [piece=N] | fetch_bench hash MIB".into(),
        ),
    }
}
