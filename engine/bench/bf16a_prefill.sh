#!/usr/bin/env bash
# q8a revision 4 (bf16 matrices take bf16 activations, kernels/src/bf16a.rs) end to end, on
# issue 44's Qwen3.6-35B-A3B-shaped model (engine/bench/qwen3_5_moe_shape.py, seed 44: the
# release's per-layer widths, 8 layers, 128 experts top-8) as a `--experts int4-g64 --dense
# bf16` store: TTFT of a 2048-token prompt in the chunk the memory plan chooses (no
# --prefill-batch: 512 on a machine with a few GiB free), in chunks of 256 and token by token
# (--prefill-batch 1), under --numerics exact and q8a, interleaved, REPS rounds; then one
# 24-token decode per numerics. The exact path did not change with revision 4, so exact / q8a
# in the same binary is the before / after of the bf16 products (the int4 experts run the
# integer rule under q8a in both revisions).
#
#   bash engine/bench/bf16a_prefill.sh [BENCH_DIR]     (default /work/bench-q35; disk-backed)
#
# Disk: hf/ 4.7 GB (deleted at the end unless KEEP_HF=1), store-int4 ~2.5 GB.
# Variables: REPS (2), PREFILL_TOKENS (2048), BATCHES ("auto 256 1"; auto: no --prefill-batch),
# SKIP_BUILD=1, CARGO_TARGET_DIR, TF_PY (python with tests/fixtures/requirements.txt, for the
# generator).
# Output: $OUT (default engine/bench/results/<date>-bf16a-prefill.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-q35}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
TF_PY="${TF_PY:-/work/venv-llama/bin/python}"
REPS="${REPS:-2}"
N="${PREFILL_TOKENS:-2048}"
BATCHES="${BATCHES:-auto 256 1}"
OUT="${OUT:-$ROOT/engine/bench/results/$(date -u +%Y-%m-%d)-bf16a-prefill.txt}"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-convert -p coli-tools)
mkdir -p "$D"
if [ ! -d "$D/store-int4" ]; then
  [ -d "$D/hf" ] || "$TF_PY" "$ROOT/engine/bench/qwen3_5_moe_shape.py" "$D/hf" --seed 44
  "$TARGET/release/coli-convert" "$D/hf" "$D/store-int4" --experts int4-g64 --dense bf16 --json \
    >"$D/convert-int4.json"
fi
[ "${KEEP_HF:-0}" = 1 ] || rm -rf "$D/hf"
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 65000)) for _ in range($N)))")
stats() { # numerics, prefill batch (auto: the plan's), rep
  local flag=(--prefill-batch "$2")
  [ "$2" = auto ] && flag=()
  "$TARGET/release/coli" run --store "$D/store-int4" --prompt-ids "$ids" --max-tokens 1 \
    ${flag[@]+"${flag[@]}"} --numerics "$1" --json 2>/dev/null |
    python3 -c "import json, sys; j = json.load(sys.stdin); s = j['stats']; print(json.dumps({'rep': $3, 'numerics': '$1', 'prefill_batch': '$2', 'chunk': s['prefill_batch'], 'tokens': $N, 'ttft_s': round(s['ttft_s'], 3), 'prefill_tok_s': round(s['prefill_tok_s'], 1), 'first_token': j['token_ids'][0]}))"
}
{
  echo "# bf16a_prefill.sh: $N prompt tokens, $D/store-int4 (--experts int4-g64 --dense bf16), $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' + working tree'), $(date -u)"
  echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) threads"
  for rep in $(seq 1 "$REPS"); do
    for num in exact q8a; do
      for batch in $BATCHES; do
        stats "$num" "$batch" "$rep"
      done
    done
  done
  for num in exact q8a; do
    "$TARGET/release/coli" run --store "$D/store-int4" --prompt-ids "${ids%%,*}" --max-tokens 24 \
      --numerics "$num" --json 2>/dev/null |
      python3 -c "import json, sys; s = json.load(sys.stdin)['stats']; print(json.dumps({'numerics': '$num', 'decode_tok_s': round(s['decode_tok_s'], 2)}))"
  done
} | tee "$OUT"
python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and "ttft_s" in l]
med = lambda num, b: statistics.median(r["prefill_tok_s"] for r in rows if r["numerics"] == num and str(r["prefill_batch"]) == b)
seen = {str(r["prefill_batch"]) for r in rows}
batches = sorted(seen - {"1"})
# "auto (512)": the plan's chunk as the runs reported it.
name = lambda b: f"{b} ({'/'.join(sorted({str(r['chunk']) for r in rows if str(r['prefill_batch']) == b}))})" if b == "auto" else b
lines = []
for num in ("exact", "q8a"):
    for b in batches:
        if "1" in seen:
            lines.append(f"# {num}: chunks of {name(b)}: {med(num, b):.1f} tok/s, token by token {med(num, '1'):.1f} tok/s: chunked / token by token {med(num, b) / med(num, '1'):.2f}x")
        else:
            lines.append(f"# {num}: chunks of {name(b)}: {med(num, b):.1f} tok/s")
for b in sorted(seen):
    lines.append(f"# q8a / exact, chunks of {name(b)}: {med('q8a', b) / med('exact', b):.2f}x (medians)")
with open(sys.argv[1], "a") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
