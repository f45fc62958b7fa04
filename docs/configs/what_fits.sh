#!/usr/bin/env bash
# "What fits where" for the published configs in docs/configs/ (dimensions only, transcribed;
# nothing downloaded): `coli plan --config` at 25 GiB and 64 GiB of RAM, 8192 tokens of
# context, a 3 GiB/s disk. Writes docs/configs/what_fits.txt and the table docs/WHAT_FITS.md quotes
# (docs/configs/what_fits.md, by what_fits_table.py).
# Usage: bash docs/configs/what_fits.sh [COLI_BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
coli="${1:-${CARGO_TARGET_DIR:-target}/release/coli}"
out=docs/configs/what_fits.txt
: > "$out"
for c in glm-5 glm-5.1 glm-5.2 deepseek-v3 deepseek-v3.2 kimi-k2 qwen3-235b-a22b glm-4.5 glm-4.6 glm-4.5-air minimax-m2 gpt-oss-120b inkling inkling-2 qwen3-next-80b-a3b qwen3.6-35b-a3b qwen3.5-397b-a17b kimi-linear-48b-a3b glm-5.3-flash deepseek-v4-flash deepseek-v4-pro kimi-k3; do
  for ram in 25G 64G; do
    echo "== $c, --total-ram $ram --context 8192 --disk-gib-s 3" >> "$out"
    "$coli" plan --config "docs/configs/$c.config.json" --total-ram "$ram" --context 8192 \
      --disk-gib-s 3 >> "$out" 2>&1
    echo >> "$out"
  done
done
python3 docs/configs/what_fits_table.py "$coli" > docs/configs/what_fits.md
# DeepSeek-V4 at long contexts (its compressed KV is the point): 25, 64, 128 GiB at 128K and 1M.
python3 docs/configs/what_fits_table.py "$coli" --long > docs/configs/what_fits_long.md
# Kimi K3 (2.8T, 1.35 TiB of MXFP4 experts) at 64 and 128 GiB.
python3 docs/configs/what_fits_table.py "$coli" --large > docs/configs/what_fits_large.md
echo "wrote $out, docs/configs/what_fits.md, what_fits_long.md and what_fits_large.md"
