#!/usr/bin/env bash
# Resident prefill A/B: OLD vs NEW coli (release builds), 16-layer OLMoE store-int4d4 preloaded
# whole, q8a, 2 threads, a prompt of N ids (q8a_bench.py's: random.Random(N), ids 1..50000) and
# one token; rounds alternate order. Prints prefill tok/s, TTFT and a hash of the token ids
# (equal on every line: a kernel change may change speed only).
#   OLD=/tmp/coli-old NEW=target/release/coli N=2048 R=3 bash engine/bench/ab_prefill.sh
# B=BUDGET streams instead: --ram-budget BUDGET, pages dropped before each run (root);
# X="--prefill-batch 128" passes more options to both builds; T=1 runs 1 thread (default 2).
S=${S:-/work/bench-olmoe/store-int4d4}; R=${R:-3}; N=${N:-2048}; B=${B:-}; X=${X:-}
OLD=${OLD:?set OLD to the earlier release build of coli}; NEW=${NEW:?set NEW}
IDS=$(python3 -c "import random; r=random.Random($N); print(','.join(str(r.randrange(1, 50000)) for _ in range($N)))")
U=$(mktemp -d)/usage.json
BUDGET=()
if [ -n "$B" ]; then BUDGET=(--ram-budget "$B"); fi
run() {
  if [ -n "$B" ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
  $1 run --store $S --prompt-ids $IDS --max-tokens 1 --threads ${T:-2} --numerics q8a --usage $U --no-pin \
    ${BUDGET[@]+"${BUDGET[@]}"} $X --context $((N + 32)) --json 2>/dev/null | tail -1 | python3 -c "
import json,sys,hashlib; j=json.loads(sys.stdin.read()); s=j['stats']
print('prefill_tok_s', round(s['prefill_tok_s'],2), 'ttft_s', round(s['ttft_s'],2), 'read_MB', round(s['expert_bytes_read']/1e6),
      'io_wait_s', round(s['io_wait_s'], 2), hashlib.sha256(str(j['token_ids']).encode()).hexdigest()[:12])"
}
echo "# ab_prefill.sh: OLD $OLD NEW $NEW store $S N $N budget ${B:-all} options '$X' $(date -u +%FT%TZ)"
for i in $(seq $R); do
  if [ $((i % 2)) = 1 ]; then echo "old $(run $OLD)"; echo "new $(run $NEW)"
  else echo "new $(run $NEW)"; echo "old $(run $OLD)"; fi
done
