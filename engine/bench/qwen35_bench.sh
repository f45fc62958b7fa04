#!/usr/bin/env bash
# Issue 44's targets on a Qwen3.6-35B-A3B-shaped random model (engine/bench/qwen3_5_moe_shape.py:
# the release's per-layer widths, 8 layers, 128 experts of 512 top-8 + a shared expert, realistic
# routing scales), end to end:
#   1. qwen3_5_moe_shape.py -> hf/ (4.7 GB BF16)
#   2. coli-convert -> store-int4 (--experts int4-g64 --dense bf16) and store-int4-d4 (--dense
#      int4-g64 --embeddings int4-g64: 4-bit everywhere, as llama.cpp's Q4_0 file)
#   3. routing_stats.py on store-int4, its gate of a realistic model (entropy, every expert used,
#      lookahead recall); its independent numpy forward covers OLMoE and MLA only, so it runs
#      with --no-numpy-check (coli's trace still checked against its usage history and counters)
#   4. qwen35_gguf.py -> qwen35-bf16.gguf -> llama.cpp's quantizer -> qwen35-q4_0.gguf; the BF16
#      GGUF and hf/ deleted (hf/ is regenerated from the seed when needed: same bytes)
#   5. prefill: TTFT of a 2048-token prompt in chunks of 256 (coli's chunkwise Gated DeltaNet form
#      and matmuls) against token by token (--prefill-batch 1), interleaved, REPS times
#   6. streaming_bench.py (needs root: memory cgroups, drop_caches, fio): decode and stream
#      workloads of coli int4, coli int4-d4 and llama.cpp Q4_0 (repack off; and on at 100%) at LIMITS % of the experts,
#      equal memory
# Before any speed: `qwen35_gguf.py --selftest` on a tiny model of the same architecture holds
# llama.cpp to transformers (all-F32 GGUF within 1e-3).
# Results: engine/bench/results/<date>-qwen35-{selftest,routing,prefill,streaming}.txt
# Variables: REPS (2), LIMITS (10,50,100), DECODE_TOKENS (24), STREAM_TOKENS (32), SEED (44),
# PREFILL_TOKENS (2048), SKIP_BUILD=1, CARGO_TARGET_DIR, LLAMA_VENV (/work/venv-llama),
# TF_PY (python with tests/fixtures/requirements.txt, for the generator and the oracle).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-q35}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
PY="${LLAMA_VENV:-/work/venv-llama}/bin/python"
TF_PY="${TF_PY:-/work/venv-tf525/bin/python}"
SEED="${SEED:-44}"
REPS="${REPS:-2}"
DATE="$(date -u +%Y-%m-%d)"
RES="$ROOT/engine/bench/results"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
gen() { [ -d "$D/hf" ] || "$TF_PY" "$ROOT/engine/bench/qwen3_5_moe_shape.py" "$D/hf" --seed "$SEED"; }

# 0. llama.cpp runs this architecture on the weights qwen35_gguf.py writes.
tiny="$(mktemp -d)"
"$TF_PY" "$ROOT/engine/bench/qwen3_5_moe_shape.py" "$tiny/hf" --dims tiny --oracle >/dev/null 2>&1
"$PY" "$ROOT/engine/bench/qwen35_gguf.py" --selftest "$tiny/hf" | tee "$RES/$DATE-qwen35-selftest.txt"
rm -rf "$tiny"

# 1-2. checkpoint and coli store
if [ ! -d "$D/store-int4" ]; then
  gen
  "$TARGET/release/coli-convert" "$D/hf" "$D/store-int4" --experts int4-g64 --dense bf16 --json \
    >"$D/convert-int4.json"
fi
if [ ! -d "$D/store-int4-d4" ]; then
  gen
  "$TARGET/release/coli-convert" "$D/hf" "$D/store-int4-d4" --experts int4-g64 --dense int4-g64 \
    --embeddings int4-g64 --json >"$D/convert-int4-d4.json"
fi
# 3. routing statistics (reported)
"$PY" "$ROOT/engine/bench/routing_stats.py" "$D/store-int4" --coli "$TARGET/release/coli" --no-numpy-check \
  --out "$D/routing-int4.json" 2>&1 | tee "$RES/$DATE-qwen35-routing.txt"
# 4. llama.cpp GGUFs of the same weights
if [ ! -f "$D/qwen35-q4_0.gguf" ]; then
  gen
  "$PY" "$ROOT/engine/bench/qwen35_gguf.py" "$D/hf" "$D/qwen35" --types q4_0
fi
rm -rf "$D/hf"

# 5. prefill, chunked vs token by token
n="${PREFILL_TOKENS:-2048}"
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 65000)) for _ in range($n)))")
{
  echo "# qwen35_bench.sh prefill: $n prompt tokens, store-int4, $(git -C "$ROOT" rev-parse --short HEAD), $(date -u)"
  for rep in $(seq 1 "$REPS"); do
    for batch in 256 1; do
      "$TARGET/release/coli" run --store "$D/store-int4" --prompt-ids "$ids" --max-tokens 1 \
        --prefill-batch "$batch" --json 2>/dev/null |
        python3 -c "import json, sys; s = json.load(sys.stdin)['stats']; print(json.dumps({'rep': $rep, 'prefill_batch': $batch, 'tokens': $n, 'ttft_s': round(s['ttft_s'], 3), 'prefill_tok_s': round(s['prefill_tok_s'], 1)}))"
    done
  done
} | tee "$RES/$DATE-qwen35-prefill.txt"

# 6. decode and stream at equal memory
"$PY" "$ROOT/engine/bench/streaming_bench.py" --bench-dir "$D" --coli "$TARGET/release/coli" \
  --llama-python "$PY" --gguf-prefix qwen35 --reps "$REPS" --limits "${LIMITS:-10,50,100}" \
  --engines coli-int4,coli-int4-d4,llama-q4_0,llama-q4_0-repack \
  --decode-tokens "${DECODE_TOKENS:-24}" --stream-tokens "${STREAM_TOKENS:-32}" \
  --out "$RES/$DATE-qwen35-streaming.txt"
