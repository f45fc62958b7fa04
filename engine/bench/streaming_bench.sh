#!/usr/bin/env bash
# Issue 17, end to end on the OLMoE-1B-7B shape: realistic-routing model, coli stores, llama.cpp
# GGUFs of the same weights, routing gate, then streaming_bench.py at equal memory.
#
#   bash engine/bench/streaming_bench.sh [BENCH_DIR]     (default /work/bench-olmoe; disk-backed)
#
# Disk: the steps are ordered so the peak stays under ~36 GB (say so before each step):
#   1. make_olmoe_shape.py -> hf/ (13.8 GB BF16, ~1 min)
#   2. coli-convert -> store-int4 (--experts int4-g64 --dense bf16, 4.6 GB) and store-int4-d8
#      (--experts int4-g64 --dense int8 --embeddings int8, 4.1 GB)
#   3. routing_stats.py on store-int4: refuses the model if its routing is not realistic
#   4. olmoe_gguf.py -> olmoe-bf16.gguf (13.8 GB) + olmoe-q4_0.gguf (3.9 GB); hf/ deleted;
#      llama.cpp's quantizer -> olmoe-q8_0.gguf (7.3 GB); the BF16 GGUF deleted
#   5. hf/ regenerated from the seed (same bytes) -> store-int8 (--experts int8 --dense bf16,
#      7.4 GB); hf/ deleted
#   6. streaming_bench.py (needs root: cgroups, drop_caches) -> results/<date>-streaming-olmoe.txt
# llama-cpp-python lives in LLAMA_VENV (default /work/venv-llama; see README.md, never in CI);
# numpy + xxhash for routing_stats.py come from the same venv.
# Variables: REPS (3), LIMITS (10,50,100), DECODE_TOKENS (24), STREAM_TOKENS (32), SEED (6),
# SKIP_BUILD=1, CARGO_TARGET_DIR, LLAMA_VENV.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-olmoe}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PY="${LLAMA_VENV:-/work/venv-llama}/bin/python"
SEED="${SEED:-6}"
DATE="$(date -u +%Y-%m-%d)"
if [ "$(stat -f -c %T "$(dirname "$D")")" = tmpfs ]; then
  echo "BENCH_DIR must be disk-backed (O_DIRECT; tmpfs is RAM)" >&2
  exit 2
fi
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
free_gb() { df -BG --output=avail "$D" | tail -1 | tr -dc 0-9; }
need() { # GB, what
  echo "== $2: needs ~$1 GB, $(free_gb) GB free"
  if [ "$(free_gb)" -lt "$1" ]; then
    echo "not enough disk for: $2" >&2
    exit 2
  fi
}
gen() { [ -d "$D/hf" ] || python3 "$ROOT/engine/bench/make_olmoe_shape.py" "$D/hf" --seed "$SEED"; }
convert() { # NAME, then coli-convert flags
  local name="$1"
  shift
  [ -d "$D/store-$name" ] || "$TARGET/release/coli-convert" "$D/hf" "$D/store-$name" "$@" --json \
    >"$D/convert-$name.json"
}
if [ ! -d "$D/store-int4" ] || [ ! -d "$D/store-int4-d8" ]; then
  need 24 "checkpoint + int4 stores"
  gen
  convert int4 --experts int4-g64 --dense bf16
  convert int4-d8 --experts int4-g64 --dense int8 --embeddings int8
fi
"$PY" "$ROOT/engine/bench/routing_stats.py" "$D/store-int4" --coli "$TARGET/release/coli" \
  --out "$D/routing-int4.json" | tee "$ROOT/engine/bench/results/$DATE-routing-olmoe.txt"
if [ ! -f "$D/olmoe-q4_0.gguf" ] || [ ! -f "$D/olmoe-q8_0.gguf" ]; then
  gen
  need 18 "BF16 GGUF + Q4_0"
  "$PY" "$ROOT/engine/bench/olmoe_gguf.py" "$D/hf" "$D/olmoe" --types q4_0 --keep-bf16
  rm -rf "$D/hf"
  need 8 "Q8_0"
  "$PY" - "$D/olmoe-bf16.gguf" "$D/olmoe-q8_0.gguf" 2>"$D/quantize-q8_0.log" <<'EOF'
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
p.nthread = 2
tmp = sys.argv[2] + ".tmp"
if llama_cpp.llama_model_quantize(sys.argv[1].encode(), tmp.encode(), p) != 0:
    sys.exit("llama_model_quantize failed")
import os; os.replace(tmp, sys.argv[2])
EOF
  "$PY" "$ROOT/engine/bench/olmoe_gguf.py" --list "$D/olmoe-q8_0.gguf" >"$D/olmoe-q8_0.tensors.txt"
  rm -f "$D/olmoe-bf16.gguf"
fi
if [ ! -d "$D/store-int8" ]; then
  need 22 "checkpoint (regenerated from seed $SEED) + int8 store"
  gen
  convert int8 --experts int8 --dense bf16
  rm -rf "$D/hf"
fi
"$PY" "$ROOT/engine/bench/streaming_bench.py" --bench-dir "$D" --coli "$TARGET/release/coli" \
  --llama-python "$PY" --reps "${REPS:-3}" --limits "${LIMITS:-10,50,100}" \
  --decode-tokens "${DECODE_TOKENS:-24}" --stream-tokens "${STREAM_TOKENS:-32}" \
  --out "$ROOT/engine/bench/results/$DATE-streaming-olmoe.txt"
