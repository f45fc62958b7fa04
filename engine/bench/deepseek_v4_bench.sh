#!/usr/bin/env bash
# Issue 47: decode of a DeepSeek-V4-Flash-shaped store at 10% and 50% of its experts in RAM,
# against min(I/O bound, compute bound) in the same run (olmoe_bench.py: fio, the compute rate).
#
#   bash engine/bench/deepseek_v4_bench.sh [BENCH_DIR]     (default /work/bench-v4; disk-backed)
#
# Steps: deepseek_v4_shape.py -> hf/ (4.8 GB, ~1 min), coli-convert -> store/ (5.2 GB; FP4
# experts kept as mxfp4, FP8 dense to bf16), hf/ deleted; routing_stats.py gates the routing;
# olmoe_bench.py at --budget 245MiB and 1224MiB (10% and 50% of 2448 MiB of experts).
# Needs: numpy (the generator; VENV, default /work/venv-tf525), numpy + xxhash (routing_stats.py;
# STATS_PY, default .venv-demo/bin/python), fio. Writes results/<date>-{routing-deepseek-v4,deepseek-v4-flash-shape}.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-v4}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PY="${VENV:-/work/venv-tf525}/bin/python"
STATS_PY="${STATS_PY:-$ROOT/.venv-demo/bin/python}"
DATE="$(date -u +%Y-%m-%d)"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
if [ ! -d "$D/store" ]; then
  "$PY" "$ROOT/engine/bench/deepseek_v4_shape.py" "$D/hf"
  "$TARGET/release/coli-convert" "$D/hf" "$D/store" --json > "$D/convert.json"
  rm -rf "$D/hf"
fi
"$STATS_PY" "$ROOT/engine/bench/routing_stats.py" "$D/store" --coli "$TARGET/release/coli" --tokens 1024 \
  --no-numpy-check --out "$D/routing.json" | tee "$ROOT/engine/bench/results/$DATE-routing-deepseek-v4.txt"
out="$ROOT/engine/bench/results/$DATE-deepseek-v4-flash-shape.txt"
: > "$out"
for b in 245MiB 1224MiB; do
  python3 "$ROOT/engine/bench/olmoe_bench.py" "$D/store" --budget "$b" --reps 2 --max-tokens 24 \
    --configs base,lru --coli "$TARGET/release/coli" --out "$D/bench-$b.txt"
  { echo "## --budget $b"; cat "$D/bench-$b.txt"; echo; } >> "$out"
done
echo "wrote $out"
