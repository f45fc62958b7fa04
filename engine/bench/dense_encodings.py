#!/usr/bin/env python3
"""Perplexity, resident bytes and decode speed of the demo model per dense encoding (issue 23).

    python3 engine/bench/dense_encodings.py [--checkpoint demo/checkpoint] [--coli target/release/coli]
        [--convert target/release/coli-convert] [--text tests/fixtures/demo/eval_text.txt]
        [--tokens 1024] [--reps 3] [--threads 2] [--out FILE.json]

Converts the demo checkpoint (tools/demo/make_demo_checkpoint.py: SmolLM2-135M split into a
Mixtral-layout FP8 MoE) once per configuration, all with int4-g64 experts (the converter's
default) and once with the checkpoint's FP8 experts (lossless: only the dense encoding differs),
and for each store: `coli eval` teacher-forced perplexity over the first `--tokens`
tokens of the committed public-domain text (the demo test's text and token count; transformers'
perplexities of the lossless and default stores are in tests/fixtures/demo/expected.json), the
size of dense.bin (the resident dense set), and decode tok/s of `coli run` (64 greedy tokens,
median of `--reps`, configurations interleaved per repetition; only ratios to the reference
rows mean anything on a shared machine). Ratios are against the first row of the same expert
encoding (bf16 dense). Prints a table and writes the raw numbers as JSON. Standard
library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONFIGS = [
    # Lossless experts (the checkpoint's FP8 bytes): only the dense encoding differs from the
    # lossless store (transformers' perplexity of that store: tests/fixtures/demo/expected.json).
    ("experts fp8, bf16", ["--experts", "fp8"]),
    ("experts fp8, int8", ["--experts", "fp8", "--dense", "int8"]),
    ("experts fp8, int4-g64", ["--experts", "fp8", "--dense", "int4-g64"]),
    ("experts fp8, int4-g32", ["--experts", "fp8", "--dense", "int4-g32"]),
    ("experts fp8, int4-g64 + embeddings int4-g64", ["--experts", "fp8", "--dense", "int4-g64", "--embeddings", "int4-g64"]),
    # The default int4-g64 experts.
    ("bf16 (default)", []),
    ("int8", ["--dense", "int8"]),
    ("int8 + embeddings int8", ["--dense", "int8", "--embeddings", "int8"]),
    ("int4-g64", ["--dense", "int4-g64"]),
    ("int4-g32", ["--dense", "int4-g32"]),
    ("int4-g32, attention int8", ["--dense", "int4-g32", "--attention", "int8"]),
    ("int4-g64 + embeddings int4-g64", ["--dense", "int4-g64", "--embeddings", "int4-g64"]),
    ("int4-g32 + embeddings int4-g32", ["--dense", "int4-g32", "--embeddings", "int4-g32"]),
]
PROMPT = "Once upon a time, in a small village by the sea,"


def run_json(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="demo/checkpoint")
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--convert", default="target/release/coli-convert")
    ap.add_argument("--text", default="tests/fixtures/demo/eval_text.txt")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for i, (label, args) in enumerate(CONFIGS):
            store = os.path.join(work, f"store{i}")
            subprocess.run([a.convert, a.checkpoint, store, *args, "--json"], check=True, capture_output=True)
            ev = run_json([a.coli, "eval", "--store", store, "--text", a.text, "--max-tokens", str(a.tokens),
                           "--threads", str(a.threads), "--json"])
            rows.append({
                "config": label, "args": args, "store": store, "ppl": ev["ppl"],
                "dense_bytes": os.path.getsize(os.path.join(store, "dense.bin")), "decode_tok_s": [],
            })
            print(f"{label}: perplexity {ev['ppl']:.4f}", flush=True)
        for rep in range(a.reps):
            order = rows if rep % 2 == 0 else list(reversed(rows))
            for r in order:
                out = run_json([a.coli, "run", "--store", r["store"], "--prompt", PROMPT, "--max-tokens", "64",
                                "--threads", str(a.threads), "--json"])
                r["decode_tok_s"].append(out["stats"]["decode_tok_s"])
    print(f"\n{'configuration':<46} {'perplexity':>10} {'vs bf16':>8} {'dense.bin':>10} {'vs bf16':>8} {'decode':>8}")
    for r in rows:
        fp8 = "--experts" in r["args"]
        base = next(b for b in rows if ("--experts" in b["args"]) == fp8)
        r.pop("store")
        r["decode_tok_s_median"] = statistics.median(r["decode_tok_s"])
        b_tok = statistics.median(base["decode_tok_s"])
        print(f"{r['config']:<46} {r['ppl']:>10.4f} {r['ppl'] / base['ppl']:>7.3f}x "
              f"{r['dense_bytes'] / 2**20:>7.1f} MiB {r['dense_bytes'] / base['dense_bytes']:>7.3f}x "
              f"{r['decode_tok_s_median'] / b_tok:>7.3f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"tokens": a.tokens, "text": a.text, "threads": a.threads, "reps": a.reps, "rows": rows}, f,
                      indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
