#!/usr/bin/env bash
# Issue 23: the measured costs behind the full-scale GLM-5 placement simulation
# (engine/bench/glm5_placement.py, docs/WHAT_FITS.md).
#
#   bash engine/bench/glm5_placement.sh [BENCH_DIR]     (default /work/bench-glm5-placement)
#
# A GLM-5-dimension glm_moe_dsa model of 1 dense + 1 MoE layer (make_glm5_shape.py --dims full:
# GLM-5-FP8's published layout, names and shapes; random weights; no MTP layer), converted as
# the 25 GB configuration stores it (--dense int4-g64 --embeddings int4-g64, int4-g64 experts),
# then, 2 threads, 16 greedy tokens after an 8-token prompt, `coli run --json`:
#   resident  every expert cached (budget above the store's expert bytes), pages warm: compute
#             seconds per token with no I/O (REPS runs);
#   streaming pages dropped before each run, a budget of one record (21M), no prefetch: every routed
#             expert is read from disk (io_wait per token, the disk GiB/s coli saw) (REPS runs).
# Disk: checkpoint ~14.5 GB (deleted after the conversion), store ~6.5 GB. Needs root to drop
# the page cache. Writes engine/bench/results/DATE-glm5-placement-measure.txt: the convert
# report, then one JSON line per run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-glm5-placement}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
REPS="${REPS:-3}"
OUT="$ROOT/engine/bench/results/$(date -u +%Y-%m-%d)-glm5-placement-measure.txt"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
if [ ! -f "$D/store/MANIFEST" ]; then
  rm -rf "$D/hf" "$D/store"
  python3 "$ROOT/engine/bench/make_glm5_shape.py" "$D/hf" --dims full --layers 2 --dense-layers 1 \
    --no-mtp --seed 5
  "$TARGET/release/coli-convert" "$D/hf" "$D/store" --dense int4-g64 --embeddings int4-g64 --json \
    >"$D/convert.json"
  rm -rf "$D/hf"
fi
PROMPT=118588,146740,122067,118445,133127,153979,49781,48407
{
  echo "# glm5_placement.sh: host $(hostname), $(nproc) CPUs, git $(git -C "$ROOT" rev-parse --short HEAD), $(date -u '+%F %T') UTC"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({"convert": {k: r[k] for k in ("parameters","tensors","experts","store_bytes")}}))' "$D/convert.json"
  du -b "$D/store/dense.bin" | awk '{print "{\"dense_bin_bytes\": " $1 "}"}'
  for rep in $(seq 1 "$REPS"); do
    for mode in resident streaming; do
      if [ "$mode" = streaming ]; then
        sync && echo 3 >/proc/sys/vm/drop_caches
        args=(--ram-budget 21M --no-prefetch --no-pin)
      else
        args=(--ram-budget 64G --no-pin)
      fi
      "$TARGET/release/coli" run --store "$D/store" --prompt-ids "$PROMPT" --max-tokens 16 --threads 2 \
        "${args[@]}" --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); s=d["stats"]; print(json.dumps({"mode": sys.argv[1], "rep": int(sys.argv[2]), "tokens": d["token_ids"], **{k: s[k] for k in ("decode_tok_s","compute_s_per_token","io_wait_s_per_token","expert_bytes_per_token","hit_rate","disk_gib_s","misses","generated_tokens","decode_passes","prefill_s","decode_s","kernels","io_engine","queue_depth")}}))' "$mode" "$rep"
    done
  done
} | tee "$OUT"
echo "wrote $OUT"
