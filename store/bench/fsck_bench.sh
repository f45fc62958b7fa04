#!/usr/bin/env bash
# coli-fsck throughput next to a plain sequential read of the same cold files, in the same run.
#
#   store/bench/fsck_bench.sh STORE_DIR [ROUNDS]
#
# Before each measurement the store's files are dropped from the page cache with
# posix_fadvise(DONTNEED) (no root needed). Reports GiB/s of `cat` over every file of the store and
# of `coli-fsck STORE --json` (full verification: every record, dense tensor and copied file), and
# their ratio. Target (issue 2): fsck >= 85% of the sequential read.
set -euo pipefail
cd "$(dirname "$0")/../.."
store=${1:?usage: fsck_bench.sh STORE_DIR [ROUNDS]}
rounds=${2:-2}
cargo build -q --release -p coli-tools
fsck=${CARGO_TARGET_DIR:-target}/release/coli-fsck

drop() {
  python3 - "$store" <<'PY'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(root, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
bytes=$(du -sb "$store" | cut -f1)
echo "store $store: $bytes bytes; $(nproc) cores; fsck $fsck"
for r in $(seq 1 "$rounds"); do
  echo "round $r: $(uptime)"
  drop
  t0=$(date +%s.%N); find "$store" -type f -exec cat {} + > /dev/null; t1=$(date +%s.%N)
  drop
  t2=$(date +%s.%N); "$fsck" "$store" --json > /tmp/fsck_bench_report.json; t3=$(date +%s.%N)
  python3 - "$bytes" "$t0" "$t1" "$t2" "$t3" <<'PY'
import sys
b, t0, t1, t2, t3 = int(sys.argv[1]), *map(float, sys.argv[2:])
cat, fsck = b / (t1 - t0) / 2**30, b / (t3 - t2) / 2**30
print(f"  cat  {cat:.3f} GiB/s ({t1 - t0:.2f} s)")
print(f"  fsck {fsck:.3f} GiB/s ({t3 - t2:.2f} s)")
print(f"  fsck / cat = {fsck / cat:.2f}")
PY
done
