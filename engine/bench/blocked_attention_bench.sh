#!/usr/bin/env bash
# Issue 43 item 4 (blocked attention): TTFT of long prompts on the streamed OLMoE shape, the
# build before blocking against the blocked build, with prefill_bench.py's method (cgroup of
# dense + 25% of the experts + KV, page cache dropped, usage history learned per invocation).
# Runs, in this order: OLD at 2048 tokens; NEW at 2048 then 8192; NEW under --numerics q8a at
# 2048 then 8192; OLD at 8192 (last: about 15 minutes). Results:
# $OUT-{old,new,new-q8a,old-8192}.{txt,json}.
#
#   OLD=/tmp/coli-old NEW=/tmp/coli-new STORE=/work/bench-olmoe/store-int4 \
#       OUT=engine/bench/results/2026-12-04-blocked-attention bash engine/bench/blocked_attention_bench.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
OLD=${OLD:?the coli binary before blocking}
NEW=${NEW:?the coli binary with blocked attention}
STORE=${STORE:-/work/bench-olmoe/store-int4}
OUT=${OUT:?a results prefix}
mkdir -p "$(dirname "$OUT")"
common=(--store "$STORE" --reps 1 --compare '' --long-max-s 1500 --run-timeout 1500)
python3 "$here/prefill_bench.py" "${common[@]}" --coli "$OLD" --lengths 2048 --long '' \
    --out "$OUT-old.json" | tee "$OUT-old.txt"
python3 "$here/prefill_bench.py" "${common[@]}" --coli "$NEW" --lengths 2048 --long 8192 \
    --out "$OUT-new.json" | tee "$OUT-new.txt"
python3 "$here/prefill_bench.py" "${common[@]}" --coli "$NEW" --lengths 2048 --long 8192 \
    --out "$OUT-new-q8a.json" -- --numerics q8a | tee "$OUT-new-q8a.txt"
python3 "$here/prefill_bench.py" "${common[@]}" --coli "$OLD" --lengths '' --long 8192 \
    --out "$OUT-old-8192.json" | tee "$OUT-old-8192.txt"
