#!/usr/bin/env bash
# Out of the box: a build whose coli defaults to --numerics exact (OLD, before cfc1006) against one that defaults to q8a (NEW),
# each run with no --numerics; a 4-layer OLMoE-shape store (make_olmoe_shape.py --layers 4; coli-convert --experts int4-g64
# --dense int4-g64 --embeddings int4-g64), resident, 2 threads; decode of 48 tokens after 16 ids and prefill of 512 ids,
# alternated. The tokens differ (two numerics); the speeds are what a user gets without options.
#   OLD=/tmp/coli-old bash engine/bench/ab_default_numerics.sh
S=${S:-/work/bench-ol4/store-int4d4}; OLD=${OLD:?set OLD to a release build whose default is exact (before cfc1006)}; NEW=${NEW:-target/release/coli}
P=$(python3 -c "import random; r=random.Random(16); print(','.join(str(r.randrange(1, 50000)) for _ in range(16)))")
L=$(python3 -c "import random; r=random.Random(512); print(','.join(str(r.randrange(1, 50000)) for _ in range(512)))")
run() { "$1" run --store $S --prompt-ids $2 --max-tokens $3 --threads 2 --usage /tmp/u-ab.json --no-pin --context 1024 --json 2>/dev/null | tail -1 | python3 -c "
import json,sys; j=json.loads(sys.stdin.read()); s=j['stats']; print(s['numerics']['mode'] if 'numerics' in s else '?', 'decode_tok_s', round(s['decode_tok_s'],2), 'prefill_tok_s', round(s['prefill_tok_s'],2))"; }
echo "# ab_default_numerics.sh: OLD $OLD NEW $NEW; store $S (4-layer OLMoE shape, int4-g64 everywhere), resident, 2 threads, no options but the prompt; $(date -u +%FT%TZ)"
for i in 1 2 3; do
  for w in "decode $P 48" "prefill $L 1"; do set -- $w
    if [ $((i % 2)) = 1 ]; then echo "old $1 $(run $OLD $2 $3)"; echo "new $1 $(run $NEW $2 $3)"
    else echo "new $1 $(run $NEW $2 $3)"; echo "old $1 $(run $OLD $2 $3)"; fi
  done
done
