#!/usr/bin/env bash
# The long fuzzing campaign of issue 42: tests/tests/fuzz_parsers.rs with COLI_FUZZ_CASES damaged
# inputs per parser and seed set (default 1,000,000), every parser of outside input (MANIFEST,
# INDEX, segment header, config.json through the model spec, safetensors headers, the request
# bodies of /v1/chat/completions, /v1/completions and /v1/messages, chat-template messages and
# sources on the committed release templates, prefix-cache files). Target: 0 panics, 0 hangs,
# 0 out-of-memory. Prints the cases, the wall and CPU seconds per test, and the verdict.
# Usage: bash engine/bench/fuzz_parsers.sh [CASES [TEST...]] > engine/bench/results/DATE-fuzz-parsers.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
cases="${1:-1000000}"
shift || true
# Optional test names after CASES: only those (default: every parser).
cargo build -q --tests -p coli-tests
echo "# fuzz_parsers: $cases cases per parser, $(date -u +%FT%TZ), $(git rev-parse --short HEAD), $(nproc) cores"
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(store_headers_never_panic configs_through_the_model_spec_never_panic
         safetensors_headers_never_panic request_bodies_never_panic
         chat_template_inputs_never_panic prefix_cache_files_never_panic)
fi
for t in "${tests[@]}"; do
  start=$(date +%s.%N)
  status=0
  out=$( { /usr/bin/time -f "cpu_s %U+%S max_rss_kb %M" env COLI_FUZZ_CASES="$cases" \
      cargo test -q -p coli-tests --test fuzz_parsers -- --exact "$t" --nocapture 2>&1; } 2>&1 ) || status=$?
  end=$(date +%s.%N)
  echo "$out" | grep "^fuzz "
  echo "$t: $(echo "$out" | grep -E "^test result" | head -1); wall $(echo "$end - $start" | bc) s; $(echo "$out" | grep cpu_s)"
  if [ "$status" != 0 ]; then echo "$out" | tail -40; fi
done
