#!/usr/bin/env bash
# Interleaved A/B of decode tok/s after a 1024-token prompt (attention over ~1050 keys per
# decode step), OLD (a release build of an earlier revision) against NEW, on the OLMoE-shape
# store-int4 (bf16 dense, int4-g64 experts), every expert resident (unbounded budget).
#   OLD=/tmp/coli-old NEW=target/release/coli bash engine/bench/ab_decode_long.sh
OLD=${OLD:?} NEW=${NEW:?}
STORE=${STORE:-/work/bench-olmoe/store-int4}
P=$(python3 -c "import random; r=random.Random(21); print(','.join(str(r.randrange(1,50000)) for _ in range(1024)))")
run() { "$@" --store "$STORE" --prompt-ids $P --max-tokens 32 --threads 2 --context 1100 --speculate off --json 2>/dev/null | python3 -c "import json,sys; s=json.loads(sys.stdin.read().strip().splitlines()[-1])['stats']; print('decode', round(s['decode_tok_s'],2), 'tok/s; prefill', round(s['prefill_tok_s'],2), 'tok/s')"; }
for r in 1 2; do
  echo "round $r old $(run "$OLD" run)"
  echo "round $r new $(run "$NEW" run)"
done
