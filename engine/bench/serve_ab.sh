#!/usr/bin/env bash
# Interleaved A/B of `coli serve` builds or options with serve_bench.py (issue 18/19): each
# variant runs --clients 1,8 (by default) REPS times, variants alternating within each rep so that
# the machine's drift falls on every variant alike; then one table of means and spreads.
#
#   VARIANTS="old=/tmp/coli_old:--speculate,auto new=/tmp/coli_new:--speculate,auto" \
#   REPS=3 OUT=engine/bench/results/NAME bash engine/bench/serve_ab.sh
#
# A variant is label=binary:server args, commas for spaces (the args after `--` of
# serve_bench.py, `--threads 2` prepended). STORE (demo/store), CLIENTS (1,8), TOKENS (128). Raw output: $OUT/<label>-<rep>.txt
# and .json, the summary in $OUT/summary.txt (SUMMARY_ONLY=1: the summary of files already there).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${VARIANTS:?set VARIANTS}" "${OUT:?set OUT}"
REPS=${REPS:-3}
STORE=${STORE:-demo/store}
CLIENTS=${CLIENTS:-1,8}
TOKENS=${TOKENS:-128}
mkdir -p "$OUT"
# SUMMARY_ONLY=1: only the table, from the raw files already in $OUT.
for rep in $(seq 1 "$REPS"); do
  [ "${SUMMARY_ONLY:-0}" = 1 ] && break
  for v in $VARIANTS; do
    label=${v%%=*}
    rest=${v#*=}
    bin=${rest%%:*}
    args=${rest#*:}
    [ "$args" = "$rest" ] && args=""
    args=${args//,/ }
    # shellcheck disable=SC2086
    python3 engine/bench/serve_bench.py --store "$STORE" --coli "$bin" --clients "$CLIENTS" \
      --tokens "$TOKENS" --warm --no-reference --label "$label-rep$rep" \
      --out "$OUT/$label-$rep.json" -- --threads 2 $args > "$OUT/$label-$rep.txt" 2>&1 || true
  done
done
python3 - "$OUT" "$REPS" $VARIANTS <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, reps, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"# serve_ab.sh: {reps} interleaved reps per variant; mean (min..max) over reps")
print(f"{'variant':<16} {'C':>2} {'tok/s':>22} {'steady ITL p50 ms':>20} {'p99 ms':>20} {'step ms':>18}")
def col(xs, scale=1.0):
    xs = [x * scale for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.1f} ({min(xs):.1f}..{max(xs):.1f})"
for v in variants:
    label = v.split("=", 1)[0]
    runs = {}
    for rep in range(1, reps + 1):
        try:
            d = json.load(open(f"{out}/{label}-{rep}.json"))
        except (OSError, ValueError):
            continue
        for r in d["runs"]:
            runs.setdefault(r["clients"], []).append(r)
    for c, rs in sorted(runs.items()):
        step = []
        for r in rs:
            h = [v for k, v in r.get("histograms", {}).items() if "decode_step" in k]
            step.append(h[0].get("mean") if h else None)
        print(f"{label:<16} {c:>2} {col([r['agg_tok_s'] for r in rs]):>22} "
              f"{col([r['itl_steady']['p50_s'] for r in rs], 1e3):>20} "
              f"{col([r['itl_steady']['p99_s'] for r in rs], 1e3):>20} {col(step, 1e3):>18}")
PY
