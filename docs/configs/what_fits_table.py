#!/usr/bin/env python3
"""The "what fits where" table of docs/WHAT_FITS.md: `coli plan --config --json` for each
published config in docs/configs/ at 25 and 64 GiB of RAM, 8192 tokens, a 3 GiB/s disk; one row
per dense configuration. Usage: python3 docs/configs/what_fits_table.py [COLI] > docs/configs/what_fits.md
Standard library only."""
import json
import subprocess
import sys

COLI = sys.argv[1] if len(sys.argv) > 1 else "target/release/coli"
MODELS = ["glm-5", "glm-5.1", "glm-5.2", "deepseek-v3", "deepseek-v3.2", "kimi-k2", "qwen3-235b-a22b", "glm-4.5", "glm-4.6",
          "glm-4.5-air", "minimax-m2", "gpt-oss-120b", "inkling", "inkling-2", "qwen3-next-80b-a3b",
          "qwen3.6-35b-a3b", "qwen3.5-397b-a17b", "kimi-linear-48b-a3b", "glm-5.3-flash"]
GIB = 1 << 30
print("| model | experts | expert GiB / token, no hits | KV / token | RAM | --dense | --embeddings | resident | "
      "expert cache | hit rate | tok/s bound | usable |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in MODELS:
    for ram in ("25G", "64G"):
        p = json.loads(subprocess.run(
            [COLI, "plan", "--config", f"docs/configs/{m}.config.json", "--total-ram", ram, "--context", "8192",
             "--disk-gib-s", "3", "--json"], check=True, capture_output=True, text=True).stdout)
        head = (f"{m} | {p['expert_bytes_total'] / GIB:.1f} GiB ({p['experts']} x {p['expert_encoding']}) | "
                f"{p['expert_bytes_per_token_no_hits'] / GIB:.2f} | {p['kv_bytes_per_token'] // 1024} KiB")
        for i, r in enumerate(p["rows"]):
            first = head if (i == 0 and ram == "25G") else " | | | "
            ram_cell = ram[:-1] + " GiB" if i == 0 else ""
            tok = r["decode_tok_s_bound"]
            print(f"| {first} | {ram_cell} | {r['dense_encoding']} | {r['embeddings_encoding']} | "
                  f"{r['dense_bytes'] / GIB:.2f} GiB | {r['expert_cache_bytes'] / GIB:.2f} GiB | "
                  f"{r['hit_rate_uniform'] * 100:.1f}% | "
                  f"{f'{tok:.2f}' if tok is not None else ('-' if r['fits'] else 'no fit')} | "
                  f"{'yes' if r['usable'] else ('no' if r['fits'] else 'no fit')} |")
