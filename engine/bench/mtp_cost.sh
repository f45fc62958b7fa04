#!/usr/bin/env bash
# Issue 19: the cost of one MTP draft step relative to one main-model decode pass, on a
# GLM-5-shaped model with its MTP layer (make_glm5_shape.py --dims small, 12 decoder layers:
# 1 dense + 11 MoE, + the MTP layer; random weights, so acceptance is meaningless; see
# mtp_cost.py). Resident (default budget), 2 threads.
#
#   bash engine/bench/mtp_cost.sh [BENCH_DIR]      (default /work/bench-glm5-small)
#
# Commands it runs, in order:
#   cargo build --release -p coli-tools -p coli-convert
#   python3 engine/bench/make_glm5_shape.py $D/hf --dims small --layers 12 --dense-layers 1 --seed 5
#   target/release/coli-convert $D/hf $D/store --experts int4-g64 --dense bf16
#   python3 engine/bench/mtp_cost.py --coli target/release/coli --store $D/store \
#       --out results/<date>-mtp-cost.json | tee results/<date>-mtp-cost.txt
# Variables: SKIP_BUILD=1, CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-glm5-small}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
DATE="$(date -u +%Y-%m-%d)"
RES="$ROOT/engine/bench/results"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-tools -p coli-convert)
if [ ! -f "$D/store/MANIFEST" ]; then
  rm -rf "$D/hf" "$D/store"
  mkdir -p "$D"
  python3 "$ROOT/engine/bench/make_glm5_shape.py" "$D/hf" --dims small --layers 12 --dense-layers 1 --seed 5
  "$TARGET/release/coli-convert" "$D/hf" "$D/store" --experts int4-g64 --dense bf16
  rm -rf "$D/hf"
fi
python3 "$ROOT/engine/bench/mtp_cost.py" --coli "$TARGET/release/coli" --store "$D/store" \
  --out "$RES/$DATE-mtp-cost.json" | tee "$RES/$DATE-mtp-cost.txt"
