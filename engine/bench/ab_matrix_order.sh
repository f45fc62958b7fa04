#!/usr/bin/env bash
# Format version 7's interleaved matrices, end to end: three engines on the 16-layer OLMoE shape
# (int4-g64 experts, int4-g32 dense, int4-g64 embeddings; q8a; release builds):
#   old    OLD (a build before format version 7) on S_RM, the store written row-major
#   new-rm NEW on S_RM (what NEW does with a row-major store: the reorder in memory, as before)
#   new-il NEW on S_IL, the same model converted with the default --matrix-order interleaved
# Workloads (rounds alternate the engines' order; every line prints a hash of the token ids,
# equal for every engine: the order on disk may change speed only):
#   cold     pages dropped (root), the whole model preloaded, 8 prompt ids + 8 tokens: load_s
#   decode2  warm page cache, resident, 8 prompt ids + 128 tokens, 2 threads: decode tok/s
#   decode1  the same, 1 thread, 64 tokens
#   prefill  resident, a prompt of 512 ids (ab_prefill.sh's), 2 threads: prefill tok/s
#   stream   pages dropped, --ram-budget 1GiB (records read on demand), 64 tokens: decode tok/s
#   OLD=/tmp/coli-old NEW=target/release/coli S_RM=/work/bench-olmoe/store-int4d4 \
#     S_IL=/work/bench-olmoe/store-int4d4-il R=3 bash engine/bench/ab_matrix_order.sh
# W="decode1 decode2" runs those workloads only.
R=${R:-3}; W=${W:-cold decode2 decode1 prefill stream}
OLD=${OLD:?set OLD to a release build from before format version 7}; NEW=${NEW:?set NEW}
S_RM=${S_RM:?set S_RM, the row-major store}; S_IL=${S_IL:?set S_IL, the interleaved store}
P8=29647,36685,30516,29611,33281,38494,12445,12101
P512=$(python3 -c "import random; r=random.Random(512); print(','.join(str(r.randrange(1, 50000)) for _ in range(512)))")
U=$(mktemp -d)/usage.json
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# run ENGINE WORKLOAD: one line of figures.
run() {
  local bin store
  case $1 in
    old) bin=$OLD; store=$S_RM ;;
    new-rm) bin=$NEW; store=$S_RM ;;
    new-il) bin=$NEW; store=$S_IL ;;
  esac
  local args=(run --store "$store" --numerics q8a --usage "$U" --json)
  case $2 in
    cold) drop; args+=(--prompt-ids $P8 --max-tokens 8 --threads 2 --context 256) ;;
    decode2) args+=(--prompt-ids $P8 --max-tokens 128 --threads 2 --context 256) ;;
    decode1) args+=(--prompt-ids $P8 --max-tokens 64 --threads 1 --context 256) ;;
    prefill) args+=(--prompt-ids $P512 --max-tokens 1 --threads 2 --context 544) ;;
    stream) drop; args+=(--prompt-ids $P8 --max-tokens 64 --threads 2 --context 256 --ram-budget 1GiB --no-pin) ;;
  esac
  "$bin" "${args[@]}" 2>/dev/null | tail -1 | python3 -c "
import json,sys,hashlib; j=json.loads(sys.stdin.read()); s=j['stats']
print('load_s', round(s['load_s'],2), 'prefill_tok_s', round(s['prefill_tok_s'],1), 'decode_tok_s', round(s['decode_tok_s'],2),
      'hit', round(s['hit_rate'],3), 'read_MB', round(s['expert_bytes_read']/1e6), hashlib.sha256(str(j['token_ids']).encode()).hexdigest()[:12])"
}
echo "# ab_matrix_order.sh: OLD $OLD NEW $NEW S_RM $S_RM S_IL $S_IL $(date -u +%FT%TZ)"
for w in $W; do
  for i in $(seq $R); do
    case $((i % 3)) in
      1) order="old new-rm new-il" ;;
      2) order="new-il old new-rm" ;;
      0) order="new-rm new-il old" ;;
    esac
    for e in $order; do echo "$w $e $(run $e $w)"; done
  done
done
