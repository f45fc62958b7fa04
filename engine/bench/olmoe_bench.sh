#!/usr/bin/env bash
# OLMoE-shaped benchmark of issue 6, end to end:
#   1. make_olmoe_shape.py writes a random BF16 checkpoint of OLMoE-1B-7B's shape (13.8 GB),
#   2. coli-convert makes an int4-g64 store (4.6 GB; 3.4 GiB of experts) and an int8 one (7.4 GB),
#   3. the checkpoint is deleted,
#   4. olmoe_bench.py runs each store (budget 512 MiB, O_DIRECT, pages dropped, fio bound).
#
#   bash engine/bench/olmoe_bench.sh [BENCH_DIR]     (default /work/bench-olmoe; disk-backed,
#                                                     ~26 GB free while converting)
# Variables: REPS (2), MAX_TOKENS (64), BUDGET (512MiB), INT8_REPS (REPS), SKIP_BUILD=1,
# CARGO_TARGET_DIR. Results: engine/bench/results/<UTC date>-olmoe-{int4,int8}.txt
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BENCH_DIR="${1:-/work/bench-olmoe}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
REPS="${REPS:-2}"
DATE="$(date -u +%Y-%m-%d)"
if [ "$(stat -f -c %T "$(dirname "$BENCH_DIR")")" = tmpfs ]; then
  echo "BENCH_DIR must be disk-backed (O_DIRECT; tmpfs is RAM)" >&2
  exit 2
fi
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$BENCH_DIR"
if [ ! -d "$BENCH_DIR/store-int4" ] || [ ! -d "$BENCH_DIR/store-int8" ]; then
  python3 "$ROOT/engine/bench/make_olmoe_shape.py" "$BENCH_DIR/hf-bf16"
  for enc in int4-g64 int8; do
    out="$BENCH_DIR/store-${enc%%-*}"
    [ -d "$out" ] || "$TARGET/release/coli-convert" "$BENCH_DIR/hf-bf16" "$out" --experts "$enc" \
      --dense bf16 --json >"$BENCH_DIR/convert-${enc%%-*}.json"
  done
  rm -rf "$BENCH_DIR/hf-bf16"
fi
for enc in int4 int8; do
  reps="$REPS"
  [ "$enc" = int8 ] && reps="${INT8_REPS:-$REPS}"
  python3 "$ROOT/engine/bench/olmoe_bench.py" "$BENCH_DIR/store-$enc" --reps "$reps" \
    --max-tokens "${MAX_TOKENS:-64}" --budget "${BUDGET:-512MiB}" --coli "$TARGET/release/coli" \
    --out "$ROOT/engine/bench/results/$DATE-olmoe-$enc.txt"
done
