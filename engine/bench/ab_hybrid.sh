#!/usr/bin/env bash
# Interleaved A/B of a hybrid (recurrent-layer) model, old binary vs new: decode tok/s (64 tokens
# after a 4-token prompt, --speculate off) and prefill (1024 tokens in chunks of 256: the
# chunkwise form) on a store made by engine/bench/qwen3_next_prefill.sh (SHAPE=...).
# Usage: OLD=/tmp/old-target/release/coli bash engine/bench/ab_hybrid.sh STORE [ROUNDS]
set -euo pipefail
store="$1"
rounds="${2:-3}"
old="${OLD:-/tmp/old-target/release/coli}"
new="${NEW:-$(dirname "$0")/../../target/release/coli}"
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 8000)) for _ in range(1024)))")
stat() { python3 -c "import json,sys; s=json.loads(sys.stdin.read().strip().splitlines()[-1]); import hashlib; print(round(s['stats'][sys.argv[1]], 2), 'tokens-sha1', hashlib.sha1(str(s['token_ids']).encode()).hexdigest()[:12])" "$1"; }
for r in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    d=$("$bin" run --store "$store" --prompt-ids 5,6,7,8 --max-tokens 64 --speculate off --json 2>/dev/null | stat decode_tok_s)
    p=$("$bin" run --store "$store" --prompt-ids "$ids" --max-tokens 1 --prefill-batch 256 --json 2>/dev/null | stat prefill_tok_s)
    echo "round $r $which decode_tok_s $d prefill_tok_s $p"
  done
done
