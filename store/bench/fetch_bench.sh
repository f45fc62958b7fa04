#!/usr/bin/env bash
# Random fetch of ~16 MiB expert records from a >= 4 GiB store, queue depth 1 and 8, pages
# dropped (posix_fadvise DONTNEED) before each run, next to fio on the same segment file with
# the same block size, depth and O_DIRECT. Raw output goes to store/bench/results/.
#
# usage: store/bench/fetch_bench.sh [STORE_DIR] [GIB] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
STORE=${1:-/tmp/coli-fetch-bench.coli}
GIB=${2:-4}
SECS=${3:-10}
ROUNDS=${4:-2}
OUT=store/bench/results
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build -q -p coli-store --example fetch_bench
BIN=$CARGO_TARGET_DIR/debug/examples/fetch_bench
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/fetch_bench-$STAMP.txt
{
  echo "# fetch_bench $STAMP store=$STORE gib=$GIB seconds=$SECS rounds=$ROUNDS"
  uname -a; nproc; df -T "$(dirname "$STORE")" | tail -1
  "$BIN" write "$STORE" "$GIB" 2>&1
  ls -l "$STORE/segments"
  "$BIN" hash 16
  # Machine load from other jobs varies, so coli and fio are interleaved, ROUNDS times, and
  # each line is preceded by the load average.
  SEG=$STORE/segments/seg-00000.bin
  for round in $(seq 1 "$ROUNDS"); do
    for qd in 1 8; do
      echo "# round $round qd $qd: $(uptime)"
      "$BIN" read "$STORE" $qd "$SECS"
      "$BIN" read "$STORE" $qd "$SECS" noverify
      echo "# fio psync numjobs=$qd bs=16M direct=1 (same depth as fetch threads)"
      fio --name=randread-qd$qd --filename="$SEG" --rw=randread --bs=16M --direct=1 \
          --ioengine=psync --numjobs=$qd --group_reporting --runtime="$SECS" --time_based \
          --invalidate=1 --output-format=json | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(json.dumps({"fio_qd": '$qd', "MiBps": j["bw"]/1024, "MBps": j["bw_bytes"]/1e6, "iops": j["iops"], "lat_ms_p50": j["clat_ns"]["percentile"]["50.000000"]/1e6, "lat_ms_p99": j["clat_ns"]["percentile"]["99.000000"]/1e6}))'
    done
  done
} 2>&1 | tee "$RAW"
