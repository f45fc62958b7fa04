#!/usr/bin/env bash
# OLMoE-shaped benchmark of issue 6, end to end:
#   1. make_olmoe_shape.py writes a random BF16 checkpoint of OLMoE-1B-7B's shape (13.8 GB),
#   2. coli-convert makes an int4-g64 store (4.6 GB; 3.4 GiB of experts), the same experts with
#      int8 dense weights and embeddings (`--dense int8 --embeddings int8`, 4.1 GB: less compute
#      per token on a CPU-bound machine) and an int8-experts one (7.4 GB),
#   3. the checkpoint is deleted,
#   4. olmoe_bench.py runs each store (budget 512 MiB, O_DIRECT, pages dropped, fio bound).
#
#   bash engine/bench/olmoe_bench.sh [BENCH_DIR]     (default /work/bench-olmoe; disk-backed,
#                                                     ~26 GB free while converting)
# Variables: REPS (2), MAX_TOKENS (64), BUDGET (512MiB), INT8_REPS (REPS), SKIP_BUILD=1,
# CARGO_TARGET_DIR, REF_COLI (another coli binary, e.g. the build before a change: adds config
# `ref` to the int4 and int8 runs). Results: engine/bench/results/<UTC date>-olmoe-{int4,int4-d8,int8}.txt
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
if [ ! -d "$BENCH_DIR/store-int4" ] || [ ! -d "$BENCH_DIR/store-int4-d8" ] \
  || [ ! -d "$BENCH_DIR/store-int8" ]; then
  [ -d "$BENCH_DIR/hf-bf16" ] || python3 "$ROOT/engine/bench/make_olmoe_shape.py" "$BENCH_DIR/hf-bf16"
  convert() { # NAME, then coli-convert flags
    local name="$1"
    shift
    [ -d "$BENCH_DIR/store-$name" ] || "$TARGET/release/coli-convert" "$BENCH_DIR/hf-bf16" \
      "$BENCH_DIR/store-$name" "$@" --json >"$BENCH_DIR/convert-$name.json"
  }
  convert int4 --experts int4-g64 --dense bf16
  convert int4-d8 --experts int4-g64 --dense int8 --embeddings int8
  convert int8 --experts int8 --dense bf16
  rm -rf "$BENCH_DIR/hf-bf16"
fi
for name in int4 int4-d8 int8; do
  reps="$REPS"
  [ "$name" = int8 ] && reps="${INT8_REPS:-$REPS}"
  configs=base,no-prefetch,pread,lru
  ref=()
  if [ -n "${REF_COLI:-}" ] && [ "$name" != int4-d8 ]; then
    configs=base,ref,no-prefetch,pread,lru
    ref=(--ref-coli "$REF_COLI")
  fi
  python3 "$ROOT/engine/bench/olmoe_bench.py" "$BENCH_DIR/store-$name" --reps "$reps" \
    --max-tokens "${MAX_TOKENS:-64}" --budget "${BUDGET:-512MiB}" --coli "$TARGET/release/coli" \
    --configs "$configs" "${ref[@]}" --out "$ROOT/engine/bench/results/$DATE-olmoe-$name.txt"
done
