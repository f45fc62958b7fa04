#!/usr/bin/env bash
# Streamed decode A/B of a kernel change: OLD vs NEW coli (release builds; OLD e.g. a copy of
# target/release/coli taken before rebuilding), 16-layer OLMoE store-int4d4, --ram-budget BUDGET, q8a,
# 2 threads, 16 prompt ids then 32 tokens; pages dropped before each run (root); rounds alternate
# order. A kernel change may change speed only: tokens_sha must be equal on every line.
#   OLD=/tmp/coli-old B=1GiB R=4 bash engine/bench/ab_streamed.sh
S=${S:-/work/bench-olmoe/store-int4d4}; B=${B:-1GiB}; R=${R:-4}
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OLD=${OLD:?set OLD to the earlier release build of coli}; NEW=${NEW:-$ROOT/target/release/coli}
echo "# ab_streamed.sh: OLD $OLD NEW $NEW store $S budget $B $(date -u +%FT%TZ)"
echo "# columns: build decode_tok_s prefill_s hit_rate tokens_sha"
run() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  $1 run --store $S --prompt-ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --max-tokens 32 --threads 2 \
    --numerics q8a --ram-budget $B --context 256 --json 2>/dev/null | tail -1 | python3 -c "
import json,sys,hashlib; j=json.loads(sys.stdin.read()); s=j['stats']
print(round(s['decode_tok_s'],2), round(s['prefill_s'],2), round(s['hit_rate'],3), hashlib.sha256(str(j['token_ids']).encode()).hexdigest()[:12])"
}
for i in $(seq $R); do
  if [ $((i % 2)) = 1 ]; then echo "old $(run $OLD)"; echo "new $(run $NEW)"
  else echo "new $(run $NEW)"; echo "old $(run $OLD)"; fi
done
