#!/usr/bin/env bash
# I/O engines and queue depths against fio, in the same run: random fetch of ~16 MiB expert
# records from a >= 4 GiB store (written by fetch_bench.rs if missing), pages dropped before each
# run (and, for the buffered mmap engine, each record's pages after its batch), checksums
# verified, for each queue depth QD in QDS:
#   coli uring (O_DIRECT; default: whole records, each hashed on a pool thread as it lands),
#   coli uring piece=1048576 (each record read in 1 MiB pieces one after the other, each hashed
#   as it lands), coli pread (O_DIRECT, 1 MiB pieces hashed by the reading threads), coli mmap
#   (page cache), coli uring and pread without verification, fio io_uring iodepth=QD and fio
#   psync numjobs=QD (16 MiB, O_DIRECT).
# The machine is shared, so everything is interleaved ROUNDS times, each group after `uptime`.
# Raw output goes to store/bench/results/engine_bench-STAMP.txt.
#
# usage: store/bench/engine_bench.sh [STORE_DIR] [SECONDS] [ROUNDS] [QDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
STORE=${1:-/tmp/coli-fetch-bench.coli}
SECS=${2:-5}
ROUNDS=${3:-2}
QDS=${4:-"1 4 8"}
OUT=store/bench/results
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build -q -p coli-store --example fetch_bench
BIN=$CARGO_TARGET_DIR/debug/examples/fetch_bench
command -v fio >/dev/null || { echo "fio is needed: apt-get install fio" >&2; exit 2; }
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/engine_bench-$STAMP.txt
fio_json() {
  python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(json.dumps({"fio": sys.argv[1], "qd": int(sys.argv[2]), "MBps": j["bw_bytes"]/1e6, "GiBps": j["bw_bytes"]/2**30, "iops": j["iops"], "lat_ms_p50": j["clat_ns"]["percentile"]["50.000000"]/1e6, "lat_ms_p99": j["clat_ns"]["percentile"]["99.000000"]/1e6}))' "$1" "$2"
}
{
  echo "# engine_bench $STAMP store=$STORE seconds=$SECS rounds=$ROUNDS qds=$QDS"
  uname -a; nproc; df -T "$(dirname "$STORE")" | tail -1; fio --version
  echo "# RLIMIT_MEMLOCK (KiB): $(ulimit -l)"
  [ -f "$STORE/MANIFEST" ] || "$BIN" write "$STORE" 4 2>&1
  ls -l "$STORE/segments"
  SEG=$STORE/segments/seg-00000.bin
  for round in $(seq 1 "$ROUNDS"); do
    for qd in $QDS; do
      echo "# round $round qd $qd: $(uptime)"
      "$BIN" read "$STORE" "$qd" "$SECS" engine=uring
      "$BIN" read "$STORE" "$qd" "$SECS" engine=uring piece=1048576
      "$BIN" read "$STORE" "$qd" "$SECS" engine=pread
      "$BIN" read "$STORE" "$qd" "$SECS" engine=mmap
      "$BIN" read "$STORE" "$qd" "$SECS" engine=uring noverify
      "$BIN" read "$STORE" "$qd" "$SECS" engine=pread noverify
      fio --name=uring-qd$qd --filename="$SEG" --rw=randread --bs=16M --direct=1 \
          --ioengine=io_uring --iodepth="$qd" --runtime="$SECS" --time_based \
          --invalidate=1 --output-format=json | fio_json io_uring "$qd"
      fio --name=psync-qd$qd --filename="$SEG" --rw=randread --bs=16M --direct=1 \
          --ioengine=psync --numjobs="$qd" --group_reporting --runtime="$SECS" --time_based \
          --invalidate=1 --output-format=json | fio_json psync "$qd"
    done
  done
} 2>&1 | tee "$RAW"
echo "raw output: $RAW"
