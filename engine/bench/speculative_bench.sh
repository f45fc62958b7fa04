#!/usr/bin/env bash
# Issue 19: speculative decoding on the demo model (speculative_bench.py): prompt lookup
# (`--speculate ngram`) and `auto` against `off`, in the same run, resident (default budget) and
# streaming (`--ram-budget 8MiB --direct on`), on three input-grounded tasks (rewrite and
# summarise a given paragraph, edit a given function) and one open question. Targets: ngram /
# auto >= 1.5x `off` tok/s on the input-grounded tasks; auto >= 0.97x `off` on the open question.
# Greedy: every mode must give the same token ids (exit 1 otherwise).
#
#   bash engine/bench/speculative_bench.sh
#   DRAFT_TOKENS=2,3,4,6,8 bash engine/bench/speculative_bench.sh      # also sweep ngram's K
#
# Commands it runs, in order (root to drop the page cache before streaming runs; without root
# the script says so and goes on: expert reads are O_DIRECT either way):
#   cargo build --release -p coli-tools
#   python3 engine/bench/speculative_bench.py --coli target/release/coli --store demo/store \
#       --rounds 3 --max-tokens 160 --threads 2 --placements resident,streaming \
#       [--draft-tokens $DRAFT_TOKENS] [--label $LABEL] [-- $RUN_ARGS]
# Output: results/<date>-speculative[-LABEL].txt (the printed tables) and
# results/<date>-speculative[-LABEL]-{resident,streaming}.json (every run).
# Variables: ROUNDS (3), MAX_TOKENS (160), THREADS (2), PLACEMENTS (resident,streaming),
# TASKS (rewrite,summarise,edit,open), MODES (off,ngram,auto), DRAFT_TOKENS (empty: the
# binary's K; e.g. 2,3,4,6,8 for a sweep), LABEL, RUN_ARGS (extra `coli run` options for every
# run), SKIP_BUILD=1, CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
COLI="$TARGET/release/coli"
DATE="$(date -u +%Y-%m-%d)"
RES="$ROOT/engine/bench/results"
LABEL="${LABEL:-}"
# shellcheck disable=SC2206
EXTRA=(${RUN_ARGS:-})
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-tools)
if [ ! -f "$ROOT/demo/store/MANIFEST" ]; then
  echo "demo/store missing: run 'bash tools/demo/demo.sh' first (README command 1)" >&2
  exit 2
fi
mkdir -p "$RES"
args=(--coli "$COLI" --store "$ROOT/demo/store" --rounds "${ROUNDS:-3}"
  --max-tokens "${MAX_TOKENS:-160}" --threads "${THREADS:-2}"
  --placements "${PLACEMENTS:-resident,streaming}" --tasks "${TASKS:-rewrite,summarise,edit,open}"
  --modes "${MODES:-off,ngram,auto}" --out-dir "$RES")
[ -z "${DRAFT_TOKENS:-}" ] || args+=(--draft-tokens "$DRAFT_TOKENS")
[ -z "$LABEL" ] || args+=(--label "$LABEL")
[ ${#EXTRA[@]} -eq 0 ] || args+=(-- "${EXTRA[@]}")
OUT="$RES/$DATE-speculative${LABEL:+-$LABEL}.txt"
set +e
python3 "$ROOT/engine/bench/speculative_bench.py" "${args[@]}" | tee "$OUT"
rc=${PIPESTATUS[0]}
[ -s "$OUT" ] || rm -f "$OUT"   # e.g. a binary without --speculate: nothing was measured
exit "$rc"
