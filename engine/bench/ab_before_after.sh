#!/usr/bin/env bash
# Interleaved A/B of decode tok/s: a release build of an earlier revision (/tmp/old-target/release/coli,
# e.g. `git worktree add /tmp/old REV && CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p coli-tools`)
# against target/release/coli, default and --no-preload, on the OLMoE-shape store-int4d4 (q8a_bench.py).
P=$(python3 -c "import random; r=random.Random(16); print(','.join(str(r.randrange(1,50000)) for _ in range(16)))")
run() { "$@" --store /work/bench-olmoe/store-int4d4 --prompt-ids $P --max-tokens 48 --threads 2 --usage /tmp/u.json --no-pin --context 256 --json 2>/dev/null | python3 -c "import json,sys; s=json.loads(sys.stdin.read().strip().splitlines()[-1])['stats']; print(round(s['decode_tok_s'],2), round(s['load_s'],2))"; }
for r in 1 2 3; do
  echo "round $r old $(run /tmp/old-target/release/coli run)"
  echo "round $r new $(run /work/main/target/release/coli run)"
  echo "round $r new-nopreload $(run /work/main/target/release/coli run --no-preload)"
done
