#!/usr/bin/env bash
# Issue 17 on the flagship's expert shape: a GLM-5-dimension glm_moe_dsa model (make_glm5_shape.py,
# published FP8 layout, 1 dense + 2 MoE layers by default), one encoding at a time:
#   generate (FP8 checkpoint) -> coli-convert -> delete the checkpoint -> routing gate
#   (routing_stats.py) -> streaming_bench.py (coli alone: llama.cpp's GGUF path has no GLM-DSA
#   model here) -> delete the store.
#
#   bash engine/bench/glm5_bench.sh [BENCH_DIR]      (default /work/bench-glm5; disk-backed)
#
# Disk per step (GLM-5 dimensions; one MoE layer = 9.9 GB of FP8 = 256 records of 21.2 MB int4):
#   checkpoint: 24.1 GB without the MTP layer, 37.8 GB with it (MTP=1: a third MoE layer plus the
#   byte copies of embed_tokens / lm_head that coli-convert needs in the MTP layer);
#   int4-g64 store: ~16 GB (~21 GB with MTP); int8 store: ~27 GB (~37 GB with MTP).
#   Peak = checkpoint + store: int4 40 GB (MTP: 59 GB), int8 51 GB (MTP: 75 GB). The script checks
#   the free space before each step and says what it needs.
# Variables: ENCODINGS ("int4-g64"; add int8 where the disk allows), MTP (0), LAYERS (3),
# DENSE_LAYERS (1), REPS (3), LIMITS (10,50,100), DECODE_TOKENS (16), STREAM_TOKENS (24),
# SEED (5), SKIP_BUILD=1, CARGO_TARGET_DIR, LLAMA_VENV (python with numpy + xxhash).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-glm5}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PY="${LLAMA_VENV:-/work/venv-llama}/bin/python"
DATE="$(date -u +%Y-%m-%d)"
MTP="${MTP:-0}"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
free_gb() { df -BG --output=avail "$D" | tail -1 | tr -dc 0-9; }
gen_args=(--layers "${LAYERS:-3}" --dense-layers "${DENSE_LAYERS:-1}" --seed "${SEED:-5}")
[ "$MTP" = 1 ] || gen_args+=(--no-mtp)
for enc in ${ENCODINGS:-int4-g64}; do
  case "$enc" in
  int4-g64) store_gb=$([ "$MTP" = 1 ] && echo 21 || echo 16) ;;
  int8) store_gb=$([ "$MTP" = 1 ] && echo 37 || echo 27) ;;
  *) echo "unknown encoding $enc" >&2; exit 2 ;;
  esac
  ckpt_gb=$([ "$MTP" = 1 ] && echo 38 || echo 25)
  echo "== $enc: checkpoint ${ckpt_gb} GB + store ~${store_gb} GB, $(free_gb) GB free"
  if [ "$(free_gb)" -lt $((ckpt_gb + store_gb + 1)) ]; then
    echo "not enough disk for $enc" >&2
    exit 2
  fi
  rm -rf "$D/hf" "$D/store-int4" "$D/store-int8"
  python3 "$ROOT/engine/bench/make_glm5_shape.py" "$D/hf" "${gen_args[@]}"
  name=$([ "$enc" = int8 ] && echo int8 || echo int4)
  "$TARGET/release/coli-convert" "$D/hf" "$D/store-$name" --experts "$enc" --dense bf16 --json \
    >"$D/convert-$name.json"
  rm -rf "$D/hf"
  "$PY" "$ROOT/engine/bench/routing_stats.py" "$D/store-$name" --coli "$TARGET/release/coli" \
    --check-tokens 4 --check-layers 2 --out "$D/routing-$name.json" \
    | tee "$ROOT/engine/bench/results/$DATE-routing-glm5-$name.txt"
  "$PY" "$ROOT/engine/bench/streaming_bench.py" --bench-dir "$D" --coli "$TARGET/release/coli" \
    --engines "coli-$name" --reps "${REPS:-3}" --limits "${LIMITS:-10,50,100}" \
    --decode-tokens "${DECODE_TOKENS:-16}" --stream-tokens "${STREAM_TOKENS:-24}" \
    --out "$ROOT/engine/bench/results/$DATE-streaming-glm5-$name.txt"
  rm -rf "$D/store-$name"
done
