#!/usr/bin/env python3
"""The "what fits where" table of docs/WHAT_FITS.md: `coli plan --config --json` for each
published config in docs/configs/ at 25 and 64 GiB of RAM, 8192 tokens, a 3 GiB/s disk; one row
per dense configuration. Usage: python3 docs/configs/what_fits_table.py [COLI] > docs/configs/what_fits.md
With --long: the long-context table of the DeepSeek-V4 configs (25, 64 and 128 GiB of RAM at 128K
and 1M tokens; a context column added), > docs/configs/what_fits_long.md.
With --large: Kimi K3 (1.35 TiB of MXFP4 experts) at 64 and 128 GiB, > docs/configs/what_fits_large.md.
With --gguf DIR: the header-only GGUFs of gguf_headers.py (what_fits_gguf.sh), > docs/configs/what_fits_gguf.md.
Standard library only."""
import json
import subprocess
import sys

GGUF_DIR = sys.argv[sys.argv.index("--gguf") + 1] if "--gguf" in sys.argv else None
ARGS = [a for a in sys.argv[1:] if a not in ("--long", "--large", "--gguf", GGUF_DIR)]
LONG = "--long" in sys.argv[1:]
LARGE = "--large" in sys.argv[1:]
GIB = 1 << 30
COLI = ARGS[0] if ARGS else "target/release/coli"
# With --gguf DIR: the header-only GGUFs gguf_headers.py wrote there (llama.cpp's mixes of the
# flagships), `coli plan --gguf` at 25 and 64 GiB, > docs/configs/what_fits_gguf.md.
GGUF_FILES = ["glm-5.1-IQ2_M", "glm-5.1-Q2_K", "glm-5.1-Q4_K_M", "deepseek-v3-Q4_K_M", "kimi-k2-IQ1_S", "kimi-k2-Q2_K"]
if GGUF_DIR:
    import os
    print("| GGUF (llama.cpp's mix) | file | expert types | expert GiB / token, no hits | RAM | resident | "
          "expert cache | hit rate | tok/s bound | usable |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for f in GGUF_FILES:
        path = os.path.join(GGUF_DIR, f + ".gguf")
        for ram in ("25G", "64G"):
            p = json.loads(subprocess.run(
                [COLI, "plan", "--gguf", path, "--total-ram", ram, "--context", "8192", "--disk-gib-s", "3",
                 "--json"], check=True, capture_output=True, text=True).stdout)
            r = p["rows"][0]
            tok = r["decode_tok_s_bound"]
            head = (f"{f} | {os.path.getsize(path) / GIB:.1f} GiB | {p['expert_encoding']} | "
                    f"{p['expert_bytes_per_token_no_hits'] / GIB:.2f}") if ram == "25G" else " | | | "
            print(f"| {head} | {ram[:-1]} GiB | {r['dense_bytes'] / GIB:.2f} GiB | "
                  f"{r['expert_cache_bytes'] / GIB:.2f} GiB | {r['hit_rate_uniform'] * 100:.1f}% | "
                  f"{f'{tok:.2f}' if tok is not None else ('-' if r['fits'] else 'no fit')} | "
                  f"{'yes' if r['usable'] else ('no' if r['fits'] else 'no fit')} |")
    sys.exit(0)
MODELS = ["glm-5", "glm-5.1", "glm-5.2", "deepseek-v3", "deepseek-v3.2", "kimi-k2", "qwen3-235b-a22b", "glm-4.5", "glm-4.6",
          "glm-4.5-air", "minimax-m2", "gpt-oss-120b", "inkling", "inkling-2", "qwen3-next-80b-a3b",
          "qwen3.6-35b-a3b", "qwen3.5-397b-a17b", "kimi-linear-48b-a3b", "glm-5.3-flash", "deepseek-v4-flash",
          "deepseek-v4-pro", "kimi-k3"]
RAMS, CONTEXTS = ("25G", "64G"), ("8192",)
if LARGE:
    MODELS, RAMS = ["kimi-k3"], ("64G", "128G")
if LONG:
    MODELS, RAMS, CONTEXTS = ["deepseek-v4-flash", "deepseek-v4-pro"], ("25G", "64G", "128G"), ("131072", "1048576")
CTX_HEAD = "context | KV / sequence | " if LONG else ""
print("| model | experts | expert GiB / token, no hits | KV / token | " + CTX_HEAD + "RAM | --dense | --embeddings | "
      "resident | expert cache | hit rate | tok/s bound | usable |")
print("|---|---|---|---|" + ("---|---|" if LONG else "") + "---|---|---|---|---|---|---|---|")
for m in MODELS:
  for ctx in CONTEXTS:
    for ram in RAMS:
        p = json.loads(subprocess.run(
            [COLI, "plan", "--config", f"docs/configs/{m}.config.json", "--total-ram", ram, "--context", ctx,
             "--disk-gib-s", "3", "--json"], check=True, capture_output=True, text=True).stdout)
        head = (f"{m} | {p['expert_bytes_total'] / GIB:.1f} GiB ({p['experts']} x {p['expert_encoding']}) | "
                f"{p['expert_bytes_per_token_no_hits'] / GIB:.2f} | {p['kv_bytes_per_token'] // 1024} KiB")
        for i, r in enumerate(p["rows"]):
            first = head if (i == 0 and ram == RAMS[0] and ctx == CONTEXTS[0]) else " | | | "
            if LONG:
                ctx_cell = (f"{int(ctx) // 1024}K | {p['kv_bytes_per_sequence'] / GIB:.2f} GiB | "
                            if (i == 0 and ram == RAMS[0]) else " | | ")
                first += " | " + ctx_cell[:-3]
            ram_cell = ram[:-1] + " GiB" if i == 0 else ""
            tok = r["decode_tok_s_bound"]
            print(f"| {first} | {ram_cell} | {r['dense_encoding']} | {r['embeddings_encoding']} | "
                  f"{r['dense_bytes'] / GIB:.2f} GiB | {r['expert_cache_bytes'] / GIB:.2f} GiB | "
                  f"{r['hit_rate_uniform'] * 100:.1f}% | "
                  f"{f'{tok:.2f}' if tok is not None else ('-' if r['fits'] else 'no fit')} | "
                  f"{'yes' if r['usable'] else ('no' if r['fits'] else 'no fit')} |")
