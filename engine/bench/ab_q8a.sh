#!/usr/bin/env bash
# Interleaved A/B of a kernel change on the OLMoE-1B-7B shape (store-int4d4 of q8a_bench.py):
# OLD (a release build of an earlier revision, e.g. `git worktree add /tmp/old REV &&
# CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p coli-tools`) against NEW
# (target/release/coli), under --numerics exact and q8a, decode (16-id prompt, 48 tokens) and
# prefill (512 ids), 1 and 2 threads, ROUNDS rounds in alternating order. Prints tok/s and
# whether OLD and NEW produced the same tokens (they must: a kernel change may change speed only).
#
#   OLD=/tmp/old-target/release/coli bash engine/bench/ab_q8a.sh [STORE] [ROUNDS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STORE="${1:-/work/bench-olmoe/store-int4d4}"
ROUNDS="${2:-3}"
OLD="${OLD:-/tmp/old-target/release/coli}"
NEW="${NEW:-$ROOT/target/release/coli}"
ids() { python3 -c "import random; r=random.Random($1); print(','.join(str(r.randrange(1,50000)) for _ in range($1)))"; }
D=$(ids 16)
P=$(ids 512)
run() { # BIN NUMERICS THREADS WORKLOAD -> "tok/s tokens"
  local prompt=$D max=48 ctx=256
  [ "$4" = prefill ] && prompt=$P max=1 ctx=1024
  "$1" run --store "$STORE" --prompt-ids "$prompt" --max-tokens $max --threads "$3" --numerics "$2" \
    --usage /tmp/ab-q8a-usage.json --no-pin --context $ctx --json 2>/dev/null |
    python3 -c "
import json, sys
j = json.loads(sys.stdin.read().strip().splitlines()[-1]); s = j['stats']
v = s['decode_tok_s'] if '$4' == 'decode' else 512 / s['prefill_s']
print(round(v, 2), ','.join(map(str, j['token_ids'])))"
}
echo "# ab_q8a.sh: OLD $OLD, NEW $NEW ($(git -C "$ROOT" rev-parse --short HEAD)), store $STORE, $ROUNDS rounds, $(date -u +%FT%TZ)"
echo "workload numerics threads round old_tok_s new_tok_s new/old same_tokens"
for w in decode prefill; do
  for num in exact q8a; do
    for th in 1 2; do
      for r in $(seq 1 "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then a=$(run "$OLD" $num $th $w); b=$(run "$NEW" $num $th $w)
        else b=$(run "$NEW" $num $th $w); a=$(run "$OLD" $num $th $w); fi
        python3 -c "
a, b = '$a'.split(' ', 1), '$b'.split(' ', 1)
print('$w $num $th $r', a[0], b[0], round(float(b[0]) / float(a[0]), 3), a[1] == b[1])"
      done
    done
  done
done
