#!/usr/bin/env bash
# Interleaved A/B of MLA (fused kv_b_proj) decode and prefill: a release build of an earlier
# revision (OLD, default /tmp/old-target/release/coli) against target/release/coli on the
# GLM-5-shaped store of mla_prefill_bench.py (STORE, default /work/bench-mla/store): decode 32
# tokens after a 16-token prompt (the absorbed form), and a 512-token prompt (the expanded
# form, layer-major). Prints tok/s and the generated ids, which must agree.
OLD=${OLD:-/tmp/old-target/release/coli}
NEW=${NEW:-/work/main/target/release/coli}
STORE=${1:-/work/bench-mla/store}
ROUNDS=${2:-3}
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(1,16000)) for _ in range($2)))"; }
P16=$(ids 16 16); P512=$(ids 512 512)
run() { "$1" run --store "$STORE" --prompt-ids "$2" --max-tokens "$3" --threads 2 --speculate off --ram-budget 64GiB --context 600 --json 2>/dev/null | python3 -c "
import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); s=j['stats']
print(round(s['decode_tok_s'],2), round(s['prefill_tok_s'],2), j.get('token_ids', j.get('ids','')))"; }
for r in $(seq 1 "$ROUNDS"); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    echo "round $r $b decode32 $(run $bin $P16 32)"
    echo "round $r $b prefill512 $(run $bin $P512 1)"
  done
done
