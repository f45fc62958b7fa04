#!/usr/bin/env bash
# Cold load A/B: OLD vs NEW coli (release builds), 16-layer OLMoE store-int4d4 preloaded whole,
# q8a, 2 threads, 8 prompt ids then 8 tokens; pages dropped before each run (root); rounds
# alternate order. Prints stats.load_s, decode tok/s, the hit rate, a hash of the tokens (equal
# on every line: a load change may change speed only) and /usr/bin/time's wall/user/sys.
#   OLD=/tmp/coli-old NEW=target/release/coli R=4 bash engine/bench/ab_load.sh
# S_OLD / S_NEW give each build its own store (default S for both): e.g. a row-major store for
# OLD and the same model converted with --matrix-order interleaved (format version 7) for NEW.
S=${S:-/work/bench-olmoe/store-int4d4}; R=${R:-3}
S_OLD=${S_OLD:-$S}; S_NEW=${S_NEW:-$S}
OLD=${OLD:?set OLD to the earlier release build of coli}; NEW=${NEW:?set NEW}
run() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  /usr/bin/time -f "%e %U %S %M" -o /tmp/tm.txt $1 run --store $2 --prompt-ids 29647,36685,30516,29611,33281,38494,12445,12101 --max-tokens 8 --threads 2 \
    --numerics q8a --context 256 --json 2>/dev/null | tail -1 | python3 -c "
import json,sys,hashlib; j=json.loads(sys.stdin.read()); s=j['stats']
print('load_s', round(s['load_s'],2), 'decode', round(s['decode_tok_s'],2), 'hit', s['hit_rate'], hashlib.sha256(str(j['token_ids']).encode()).hexdigest()[:12], end=' ')"
  echo "wall/user/sys/maxrss_kb $(cat /tmp/tm.txt)"
}
echo "# ab_load.sh: OLD $OLD on $S_OLD, NEW $NEW on $S_NEW $(date -u +%FT%TZ)"
for i in $(seq $R); do
  if [ $((i % 2)) = 1 ]; then echo "old $(run $OLD $S_OLD)"; echo "new $(run $NEW $S_NEW)"
  else echo "new $(run $NEW $S_NEW)"; echo "old $(run $OLD $S_OLD)"; fi
done
