#!/usr/bin/env bash
# Issue 44: a hybrid model's state per sequence in resident memory against what the engine
# counts (Engine::kv_bytes_per_sequence, the figure `coli plan` and --max-sequences use).
# A random Qwen3-Next checkpoint with the released linear-attention heads on a small residual
# stream (hybrid_state_model.py), converted lossless; engine/examples/state_rss.rs prefills N
# sequences one after the other, keeps them live and prints VmRSS / RssAnon after each. The
# per-sequence cost is the RssAnon growth from sequence 2 to N over N - 2 (the first sequence
# also pays the pass's scratch and first-touch).
# Usage: bash engine/bench/hybrid_state_rss.sh [WORKDIR] [PYTHON]   (PYTHON: transformers 5.25)
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${1:-/tmp/hybrid-state-rss}"
py="${2:-python3}"
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$work"
[ -f "$work/ckpt/model.safetensors" ] || "$py" engine/bench/hybrid_state_model.py "$work/ckpt"
cargo build -q -p coli-convert -p coli-engine --example state_rss
[ -f "$work/store/MANIFEST" ] || "$target/debug/coli-convert" "$work/ckpt" "$work/store" --experts bf16 --dense bf16 > /dev/null
echo "# hybrid_state_rss.sh, $(git rev-parse --short HEAD), $(date -u), $(nproc) cores"
for run in "6 1024" "4 4096"; do
  set -- $run
  echo "== $1 sequences of $2 tokens"
  "$target/debug/examples/state_rss" "$work/store" "$1" "$2" | tee "$work/run-$1-$2.jsonl"
  python3 - "$work/run-$1-$2.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
head, seqs = rows[0], rows[1:]
n = len(seqs)
grow = (seqs[-1]["rss_anon"] - seqs[1]["rss_anon"]) / (n - 2)
held = seqs[-1]["kv_bytes_held"] / n
plan = head["engine_kv_bytes_per_sequence"]
print(f"per sequence: RssAnon growth {grow / 2**20:.1f} MiB, held (Sequence::kv_bytes) {held / 2**20:.1f} MiB, "
      f"engine/plan figure {plan / 2**20:.1f} MiB: measured / plan = {grow / plan:.3f}")
PY
done
