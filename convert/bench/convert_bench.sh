#!/usr/bin/env bash
# Benchmark coli-convert on a synthetic FP8 checkpoint (default 4 GiB):
#   cold read of the shards (cat to /dev/null) vs conversion, with peak RssAnon of the converter.
# Usage: convert/bench/convert_bench.sh [WORK_DIR] [SIZE_GIB] [extra coli-convert args...]
# Env: COLI_CONVERT_BIN=path (use this binary instead of building), PAIRS=n (repeat the
#   cat/convert pair n times, default 1; useful on a loaded machine). The load average is printed.
# Needs: cargo, python3, awk (no other tools). Dropping the page cache needs root (else the numbers are warm reads).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-/tmp/coli-convert-bench}
SIZE=${2:-4}
shift 2 || true
mkdir -p "$WORK"
if [ -n "${COLI_CONVERT_BIN:-}" ]; then
  BIN=$COLI_CONVERT_BIN
else
  cargo build --release -p coli-convert >&2
  BIN=${CARGO_TARGET_DIR:-target}/release/coli-convert
fi
CK="$WORK/ckpt"
if [ ! -f "$CK/model.safetensors.index.json" ]; then
  python3 convert/bench/gen_fp8_checkpoint.py "$CK" "$SIZE"
fi
drop() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; else echo "(not root: page cache not dropped)" >&2; fi
}
BYTES=$(cat "$CK"/*.safetensors | wc -c)
echo "binary: $BIN; args: ${*:-(defaults)}"
for PAIR in $(seq 1 "${PAIRS:-1}"); do
echo "== pair $PAIR; load: $(uptime | sed 's/.*load average/load average/')"
drop
t0=$(date +%s.%N)
cat "$CK"/*.safetensors > /dev/null
t1=$(date +%s.%N)
CAT_S=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
rm -rf "$WORK/store" "$WORK/store.partial"
drop
t0=$(date +%s.%N)
"$BIN" "$CK" "$WORK/store" --json "$@" > "$WORK/report.json" &
PID=$!
PEAK=0
TICKS=0
while kill -0 "$PID" 2>/dev/null; do
  R=$(awk '/^RssAnon:/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
  [ -n "$R" ] && [ "$R" -gt "$PEAK" ] && PEAK=$R
  # utime + stime of all threads (clock ticks; the last sample misses at most 0.1 s)
  T=$(awk '{print $14 + $15}' /proc/$PID/stat 2>/dev/null || echo 0)
  [ -n "$T" ] && [ "$T" -gt "$TICKS" ] && TICKS=$T
  sleep 0.1
done
wait "$PID"
t1=$(date +%s.%N)
CONV_S=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
CPU_S=$(awk -v t="$TICKS" -v hz="$(getconf CLK_TCK)" 'BEGIN{print t/hz}')
awk -v b="$BYTES" -v c="$CAT_S" -v v="$CONV_S" -v p="$PEAK" -v d="$CK" -v u="$CPU_S" 'BEGIN{
  printf "checkpoint: %.2f GiB in %s\n", b/1073741824, d;
  printf "cold cat:   %.2f s (%.0f MiB/s, %.3f GiB/s)\n", c, b/1048576/c, b/1073741824/c;
  printf "convert:    %.2f s (%.0f MiB/s, %.3f GiB/s), peak RssAnon %d MiB\n", v, b/1048576/v, b/1073741824/v, p/1024;
  printf "ratio convert/cat: %.1f%%\n", 100*c/v;
  printf "converter CPU time (user+sys, all threads): %.1f s = %.2f s/GiB\n", u, u/(b/1073741824) }'
cat "$WORK/report.json"; echo
done
