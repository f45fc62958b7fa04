#!/usr/bin/env bash
# Issue 44's prefill target on a Qwen3-Next-shaped random model (engine/bench/qwen3_next_shape.py:
# the release's linear-attention and attention heads at hidden 1024, 8 layers, 32 experts), and
# issue 45's on a Kimi-Linear-shaped one with SHAPE=kimi_linear (engine/bench/kimi_linear_shape.py:
# KDA heads 32 x 128 and the release's MLA at the same width, depth and experts), and on a
# GLM-5.3-Flash-shaped one with SHAPE=glm5_next (engine/bench/glm5_next_shape.py: KDA heads
# 64 x 128 with the safe gate, the release's DSA layers and k-pool indexer, 4 residual streams):
# TTFT of a 2048-token prompt prefilled in chunks (projections as matmuls, the Gated DeltaNet
# layers' chunkwise form over whole aligned chunks of 64) against token by token
# (--prefill-batch 1: matvecs, the recurrent form), interleaved, REPS times, same binary.
# BATCHES (default "auto 256 1"): the prefill batches run; auto passes no --prefill-batch (the
# memory plan's chunk, reported as "chunk": 512 on a machine with a few GiB free).
# Usage: [SHAPE=kimi_linear] bash engine/bench/qwen3_next_prefill.sh [DIR] (default
# /tmp/coli-<SHAPE>-bench; needs the fixture venv of tests/fixtures/requirements.txt as $PY,
# default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
shape="${SHAPE:-qwen3_next}"
dir="${1:-/tmp/coli-$shape-bench}"
py="${PY:-python3}"
reps="${REPS:-2}"
n="${TOKENS:-2048}"
batches="${BATCHES:-auto 256 1}"
[ -d "$dir/hf" ] || "$py" "engine/bench/${shape}_shape.py" "$dir/hf"
cargo build -q --release -p coli-convert -p coli-tools
[ -d "$dir/store" ] || target/release/coli-convert "$dir/hf" "$dir/store" --experts int4-g64 --dense bf16
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 8000)) for _ in range($n)))")
for rep in $(seq 1 "$reps"); do
  for batch in $batches; do
    flag=(--prefill-batch "$batch")
    [ "$batch" = auto ] && flag=()
    target/release/coli run --store "$dir/store" --prompt-ids "$ids" --max-tokens 1 \
      ${flag[@]+"${flag[@]}"} --json 2>/dev/null |
      python3 -c "import json, sys; s = json.load(sys.stdin)['stats']; print(json.dumps({'rep': $rep, 'prefill_batch': '$batch', 'chunk': s['prefill_batch'], 'tokens': $n, 'ttft_s': round(s['ttft_s'], 3), 'prefill_tok_s': round(s['prefill_tok_s'], 1)}))"
  done
done
