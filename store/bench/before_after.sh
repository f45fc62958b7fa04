#!/usr/bin/env bash
# Interleaved comparison of two fetch_bench binaries (e.g. built from an older commit) and fio,
# verified fetches at queue depth 1 and 8, on a store written by fetch_bench.sh.
#
# usage: store/bench/before_after.sh OLD_BIN NEW_BIN [STORE_DIR] [SECONDS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=$1
NEW=$2
STORE=${3:-/tmp/coli-fetch-bench.coli}
SECS=${4:-6}
ROUNDS=${5:-2}
OUT=store/bench/results
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
SEG=$STORE/segments/seg-00000.bin
{
  echo "# before_after $STAMP old=$OLD new=$NEW store=$STORE seconds=$SECS rounds=$ROUNDS"
  for round in $(seq 1 "$ROUNDS"); do
    for qd in 1 8; do
      echo "# round $round qd $qd: $(uptime)"
      echo "# old"; "$OLD" read "$STORE" $qd "$SECS"
      echo "# new"; "$NEW" read "$STORE" $qd "$SECS"
      echo "# fio psync numjobs=$qd bs=16M direct=1"
      fio --name=randread-qd$qd --filename="$SEG" --rw=randread --bs=16M --direct=1 \
          --ioengine=psync --numjobs=$qd --group_reporting --runtime="$SECS" --time_based \
          --invalidate=1 --output-format=json | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(json.dumps({"fio_qd": '$qd', "MBps": j["bw_bytes"]/1e6, "lat_ms_p50": j["clat_ns"]["percentile"]["50.000000"]/1e6}))'
    done
  done
} 2>&1 | tee "$OUT/before_after-$STAMP.txt"
