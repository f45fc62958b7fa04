#!/usr/bin/env bash
# Issue 18: the serving benchmark (serve_bench.py), both configurations of the issue:
#   1. demo store, resident (no cgroup): target 8 clients >= 2.5x the 1-client aggregate tok/s;
#   2. the realistic-routing OLMoE-shaped int4 store, streamed: O_DIRECT (--direct on), in a
#      cgroup-v1 memory cgroup of dense.bin + 25% of the expert bytes + 384 MiB (streaming_bench's
#      process overhead) + the KV caches of the 8 sequences at --context 512,
#      --ram-budget fitted to it; target 8 clients >= 4x.
# Both: clients 1,2,4,8 (a fresh server per count, pages dropped first), 128 tokens each, a
# warm-up request before each measurement; steady p99 ITL at 8 clients <= 3x the 1-client p50.
#
#   bash engine/bench/serve_bench.sh [BENCH_DIR]      (default /work/bench-olmoe; disk-backed)
#
# The streaming store is `BENCH_DIR/store-int4-serve`: the same weights as streaming_bench.sh's
# `store-int4` (make_olmoe_shape.py, seed 6; `--experts int4-g64 --dense bf16`), converted WITH a
# tokenizer, which `coli serve` needs and the benchmark model lacks: the demo store's tokenizer
# (SmolLM2, 49152 tokens) padded with plain added tokens to the model's 50304 ids, so every id the
# model can emit decodes to text. Made here if absent (~14 GB checkpoint, deleted after, + 4.6 GB
# store; ~3 min). Its routing is the one routing_stats.py gated for store-int4.
# Commands it runs, in order (root: cgroups and drop_caches):
#   cargo build --release -p coli-tools -p coli-convert
#   python3 engine/bench/make_olmoe_shape.py $D/hf --seed 6          (only if the store is missing)
#   (pad the tokenizer into $D/hf)  target/release/coli-convert $D/hf $D/store-int4-serve \
#       --experts int4-g64 --dense bf16 --json; rm -rf $D/hf
#   python3 engine/bench/serve_bench.py --store demo/store --clients 1,2,4,8 --tokens 128 --warm \
#       --target-speedup 2.5 --label demo-resident --out results/<date>-serve-demo.json \
#       -- --threads 2 $SERVE_ARGS
#   python3 engine/bench/serve_bench.py --store $D/store-int4-serve --cgroup-limit auto \
#       --expert-share 0.25 --learn --clients 1,2,4,8 --tokens 128 --warm --target-speedup 4 \
#       --label olmoe-int4-streaming --out results/<date>-serve-olmoe.json \
#       -- --ram-budget auto --context 512 --direct on --threads 2 $SERVE_ARGS
# Output: results/<date>-serve-{demo,olmoe}.txt (the printed tables) and .json (every timing).
# Variables: CONFIGS (demo,streaming), CLIENTS (1,2,4,8), TOKENS (128), THREADS (2), SEED (6),
# SERVE_ARGS (extra `coli serve` options for both, e.g. "--max-batch 8"), SKIP_BUILD=1,
# CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
D="${1:-/work/bench-olmoe}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
COLI="$TARGET/release/coli"
SEED="${SEED:-6}"
CLIENTS="${CLIENTS:-1,2,4,8}"
TOKENS="${TOKENS:-128}"
THREADS="${THREADS:-2}"
CONFIGS="${CONFIGS:-demo,streaming}"
# shellcheck disable=SC2206
EXTRA=(${SERVE_ARGS:-})
DATE="$(date -u +%Y-%m-%d)"
RES="$ROOT/engine/bench/results"
BENCH="$ROOT/engine/bench/serve_bench.py"
[ "${SKIP_BUILD:-0}" = 1 ] || (cd "$ROOT" && cargo build --release -p coli-tools -p coli-convert)
mkdir -p "$RES"

if [[ ",$CONFIGS," == *,demo,* ]]; then
  if [ ! -d "$ROOT/demo/store" ]; then
    echo "demo/store missing: run 'bash tools/demo/demo.sh' first (README command 1)" >&2
    exit 2
  fi
  python3 "$BENCH" --store "$ROOT/demo/store" --coli "$COLI" --clients "$CLIENTS" --tokens "$TOKENS" \
    --warm --target-speedup 2.5 --label demo-resident --out "$RES/$DATE-serve-demo.json" \
    -- --threads "$THREADS" "${EXTRA[@]}" | tee "$RES/$DATE-serve-demo.txt"
fi

if [[ ",$CONFIGS," == *,streaming,* ]]; then
  S="$D/store-int4-serve"
  if [ ! -d "$S" ]; then
    if [ "$(stat -f -c %T "$(dirname "$D")")" = tmpfs ]; then
      echo "BENCH_DIR must be disk-backed (O_DIRECT; tmpfs is RAM)" >&2
      exit 2
    fi
    mkdir -p "$D"
    free_gb="$(df -BG --output=avail "$D" | tail -1 | tr -dc 0-9)"
    echo "== checkpoint + int4 store with a tokenizer: needs ~20 GB, ${free_gb} GB free"
    if [ "$free_gb" -lt 20 ]; then
      echo "not enough disk for the serving store" >&2
      exit 2
    fi
    [ -d "$D/hf" ] || python3 "$ROOT/engine/bench/make_olmoe_shape.py" "$D/hf" --seed "$SEED"
    python3 - "$ROOT/demo/store/files" "$D/hf" <<'EOF'
# The demo tokenizer padded to the model's vocabulary with plain (not special) added tokens.
import json, os, sys
src, hf = sys.argv[1], sys.argv[2]
vocab = json.load(open(os.path.join(hf, "config.json")))["vocab_size"]
tok = json.load(open(os.path.join(src, "tokenizer.json")))
n = len(tok["model"]["vocab"])
ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
for i in range(n, vocab):
    if i not in ids:
        tok["added_tokens"].append({"id": i, "content": f"<|pad_{i}|>", "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": False})
json.dump(tok, open(os.path.join(hf, "tokenizer.json"), "w"), ensure_ascii=False)
cfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
cfg["vocab_size"] = vocab
cfg.pop("chat_template", None)
json.dump(cfg, open(os.path.join(hf, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=1)
print(f"tokenizer: {n} ids + {vocab - n} padding tokens = {vocab}")
EOF
    "$TARGET/release/coli-convert" "$D/hf" "$S" --experts int4-g64 --dense bf16 --json \
      >"$D/convert-int4-serve.json"
    rm -rf "$D/hf"
  fi
  python3 "$BENCH" --store "$S" --coli "$COLI" --cgroup-limit auto --expert-share 0.25 --learn \
    --clients "$CLIENTS" --tokens "$TOKENS" --warm --target-speedup 4 --label olmoe-int4-streaming \
    --out "$RES/$DATE-serve-olmoe.json" \
    -- --ram-budget auto --context 512 --direct on --threads "$THREADS" "${EXTRA[@]}" \
    | tee "$RES/$DATE-serve-olmoe.txt"
fi
