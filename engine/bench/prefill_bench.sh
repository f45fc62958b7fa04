#!/usr/bin/env bash
# Issue 19 "Long prompts": time to first token of 512-, 2048- and 8192-token prompts on the
# realistic-routing OLMoE-shaped int4 store, streamed (prefill_bench.py), next to the bound
# max(expert bytes read / disk bandwidth, compute seconds) measured in the same run; target:
# TTFT <= 1.5x the bound at 2048 tokens. Each run: `coli run --prompt-ids <N seeded ids>
# --max-tokens 1 --json --speculate off --direct on --context N+8` in a cgroup-v1 memory cgroup
# of dense.bin + 25% of the expert bytes + 384 MiB + the KV cache of the sequence, --ram-budget
# fitted to it (streaming_bench.coli_budget), page cache dropped first; the disk bandwidth from
# `coli plan --probe-mib 1024` (O_DIRECT expert reads) in the same cgroup just before.
#
#   bash engine/bench/prefill_bench.sh [BENCH_DIR]      (default /work/bench-olmoe; disk-backed)
#
# The store is `BENCH_DIR/store-int4-serve` (made by serve_bench.sh: make_olmoe_shape.py seed 6,
# int4-g64 experts, bf16 dense, the demo tokenizer padded to 50304 ids; max_position_embeddings
# 16384). Runs: 512 and 2048 tokens x REPS (2) interleaved with the engine's own prefill chunk,
# 2048 once with --prefill-batch 32 (the old default; skipped when the plan chose 32 anyway),
# 512 and 2048 once each with ROOM (a cgroup with room for the plan to choose a whole-prompt
# chunk, same expert budget), LONG (8192) once (skipped when the 2048 runs extrapolate past
# LONG_MAX_S, 600 s). ~25 min on 2 cores.
# Commands it runs, in order (root: cgroups and drop_caches):
#   cargo build --release -p coli-tools
#   python3 engine/bench/prefill_bench.py --store $D/store-int4-serve --coli target/release/coli \
#       --lengths 512,2048 --reps 2 --long 8192 --compare 2048:32 --room 512,2048 --threads 2 \
#       --out results/<date>-prefill-olmoe.json [-- $RUN_ARGS]
# Output: results/<date>-prefill-olmoe.txt (the printed table) and .json (every run).
# Variables: LENGTHS (512,2048), REPS (2), LONG (8192; empty: none), LONG_MAX_S (600),
# COMPARE (2048:32), ROOM (512,2048; empty: none), THREADS (2), LABEL (file name suffix), RUN_ARGS (extra `coli run`
# and `coli plan` options), RESUME=1 (keep the runs already in the .json, run the rest, append to
# the .txt), USAGE (a usage-history file instead of learning one), COLI (the binary; e.g. a copy,
# so that a rebuild during the ~25 min does not change it between runs), SKIP_BUILD=1,
# CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-olmoe}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
COLI="${COLI:-$TARGET/release/coli}"
DATE="$(date -u +%Y-%m-%d)"
RES="$ROOT/engine/bench/results"
LABEL="${LABEL:-}"
S="$D/store-int4-serve"
# shellcheck disable=SC2206
EXTRA=(${RUN_ARGS:-})
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-tools)
if [ ! -f "$S/MANIFEST" ]; then
  echo "$S missing: make it with CONFIGS=streaming bash engine/bench/serve_bench.sh $D (its first step)" >&2
  exit 2
fi
mkdir -p "$RES"
OUT="$RES/$DATE-prefill-olmoe${LABEL:+-$LABEL}"
args=(--store "$S" --coli "$COLI" --lengths "${LENGTHS:-512,2048}" --reps "${REPS:-2}"
  --long "${LONG-8192}" --long-max-s "${LONG_MAX_S:-600}" --compare "${COMPARE-2048:32}"
  --threads "${THREADS:-2}" --out "$OUT.json")
[ -z "${ROOM-512,2048}" ] || args+=(--room "${ROOM-512,2048}")
[ "${RESUME:-0}" = 0 ] || args+=(--resume)
[ -z "${USAGE:-}" ] || args+=(--usage "$USAGE")
[ ${#EXTRA[@]} -eq 0 ] || args+=(-- "${EXTRA[@]}")
tee_mode=()
[ "${RESUME:-0}" = 0 ] || tee_mode=(-a)
set +e
python3 "$ROOT/engine/bench/prefill_bench.py" "${args[@]}" | tee ${tee_mode[@]+"${tee_mode[@]}"} "$OUT.txt"
exit "${PIPESTATUS[0]}"
