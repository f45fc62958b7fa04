#!/usr/bin/env bash
# "What fits where" for GGUF quants of the flagships (issue 46): header-only GGUFs at llama.cpp's
# own quantization mixes (gguf_headers.py: the release's tensor names and shapes, converted by
# llama.cpp's convert_hf_to_gguf.py, each tensor's type chosen by `llama-quantize --dry-run`;
# sparse files, no data), then `coli plan --gguf` at 25 and 64 GiB of RAM, 8192 tokens of
# context, a 3 GiB/s disk. Writes docs/configs/gguf_headers.txt (the mixes),
# docs/configs/what_fits_gguf.txt (the plans) and docs/configs/what_fits_gguf.md (the table).
# Usage: bash docs/configs/what_fits_gguf.sh LLAMA_CPP_DIR LLAMA_QUANTIZE [COLI] [PYTHON]
#   LLAMA_CPP_DIR: the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp; LLAMA_QUANTIZE: its
#   tools/quantize built (cmake -B build && cmake --build build --target llama-quantize);
#   PYTHON: one with tests/fixtures/requirements.txt (torch, numpy, safetensors).
# The sparse files (1.3-2 TB each, no blocks) go to a temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
vendor="$1"
quantize="$2"
coli="${3:-${CARGO_TARGET_DIR:-target}/release/coli}"
py="${4:-python3}"
coli="$(cd "$(dirname "$coli")" && pwd)/$(basename "$coli")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" docs/configs/gguf_headers.py --llama-cpp "$vendor" --quantize "$quantize" --out "$tmp" \
  glm-5.1:IQ2_M,Q2_K,Q4_K_M deepseek-v3:Q4_K_M kimi-k2:IQ1_S,Q2_K > docs/configs/gguf_headers.txt
out=docs/configs/what_fits_gguf.txt
: > "$out"
for f in glm-5.1-IQ2_M glm-5.1-Q2_K glm-5.1-Q4_K_M deepseek-v3-Q4_K_M kimi-k2-IQ1_S kimi-k2-Q2_K; do
  for ram in 25G 64G; do
    echo "== $f.gguf, --total-ram $ram --context 8192 --disk-gib-s 3" >> "$out"
    # (run from the temporary directory: the plan names the file without its path)
    (cd "$tmp" && "$coli" plan --gguf "$f.gguf" --total-ram "$ram" --context 8192 --disk-gib-s 3) >> "$out" 2>&1
    echo >> "$out"
  done
done
python3 docs/configs/what_fits_table.py "$coli" --gguf "$tmp" > docs/configs/what_fits_gguf.md
echo "wrote docs/configs/gguf_headers.txt, $out and docs/configs/what_fits_gguf.md"
