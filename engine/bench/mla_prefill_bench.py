#!/usr/bin/env python3
"""MLA prefill: layer-major (each cached latent expanded through kv_b once per prompt) against
token-major (`--token-major-prefill`: every chunk expands the whole cache again), same binary,
same store, interleaved runs.

    mla_prefill_bench.py [--dir DIR] [--coli PATH] [--convert PATH] [--lengths 512,1024,2048]
        [--prefill-batch 64] [--reps 2] [--threads 2] [--out FILE.json]

Model: a GLM-5-shaped checkpoint with GLM-5's full attention dimensions (hidden 6144, 64 heads,
q_lora 2048, kv_lora 512, nope 192, rope 64, v 256, DSA indexer 32 x 128 with index_topk 2048)
and small experts (8 of moe_intermediate 256, top-2, dense MLP 1024, vocab 16384), 3 layers
(1 dense), no MTP, written by make_glm5_shape.py (--seed 7) into DIR/hf and converted
(coli-convert defaults) into DIR/store once. Random weights: the figure is time, not text.
Every layer runs its own indexer in GLM-5, so each layer is its own layer-major group.

Runs: `coli run --store DIR/store --prompt-ids <L seeded ids> --max-tokens 1 --json
--speculate off --prefill-batch B --context L+8 --ram-budget 64GiB --threads T` with and
without `--token-major-prefill`, the order alternating per rep; all weights resident (the
store is small), so prefill time is compute: the attention, the kv_b expansions, the
projections. Both orders must give the same first token (exit 1 otherwise).

Cost model (per layer, DeepSeek/GLM MLA): token-major expands every cached latent once per
chunk, sum over chunks of (cached + chunk) x heads x (nope + v) x kv_lora MACs, about
L^2 / (2B) x 64 x 448 x 512; layer-major expands each position once, L x 64 x 448 x 512.
Output: the table on stdout, every run in --out. Python 3 standard library only.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(d, convert):
    store = os.path.join(d, "store")
    if os.path.isfile(os.path.join(store, "MANIFEST")):
        return store
    hf = os.path.join(d, "hf")
    if not os.path.isfile(os.path.join(hf, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "engine/bench/make_glm5_shape.py"), hf,
                        "--dims", "full", "--layers", "3", "--dense-layers", "1", "--no-mtp",
                        "--experts", "8", "--top-k", "2", "--moe-inter", "256", "--inter", "1024",
                        "--vocab", "16384", "--seed", "7"], check=True)
    subprocess.run([convert, hf, store], check=True)
    return store


def run(coli, store, ids, batch, threads, token_major):
    cmd = [coli, "run", "--store", store, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "1",
           "--json", "--speculate", "off", "--prefill-batch", str(batch), "--context", str(len(ids) + 8),
           "--ram-budget", "64GiB", "--threads", str(threads)]
    if token_major:
        cmd.append("--token-major-prefill")
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"coli run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    j = json.loads(p.stdout)
    return {"order": "token" if token_major else "layer", "prompt": len(ids), "wall_s": wall,
            "prefill_s": j["stats"]["prefill_s"], "ttft_s": j["stats"]["ttft_s"],
            "token_ids": j["token_ids"], "json": j}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/work/bench-glm5-mla")
    ap.add_argument("--coli", default=os.path.join(ROOT, "target/release/coli"))
    ap.add_argument("--convert", default=os.path.join(ROOT, "target/release/coli-convert"))
    ap.add_argument("--lengths", default="512,1024,2048")
    ap.add_argument("--prefill-batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    store = build(a.dir, a.convert)
    rng = random.Random(a.seed)
    lengths = [int(x) for x in a.lengths.split(",")]
    ids_all = [rng.randrange(100, 16000) for _ in range(max(lengths))]
    print(f"# store {store}, prefill batch {a.prefill_batch}, threads {a.threads}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", flush=True)
    runs = []
    for rep in range(a.reps):
        for length in lengths:
            orders = [False, True] if rep % 2 == 0 else [True, False]
            for tm in orders:
                r = run(a.coli, store, ids_all[:length], a.prefill_batch, a.threads, tm)
                r["rep"] = rep
                runs.append(r)
                print(f"# rep {rep} {length:5d} tok {r['order']}-major: prefill {r['prefill_s']:.2f} s "
                      f"(wall {r['wall_s']:.2f} s)", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"args": vars(a), "runs": runs}, f, indent=1)
    bad = False
    print("\n| prompt | layer-major prefill s (median) | token-major prefill s (median) | token / layer |")
    print("|---|---|---|---|")
    for length in lengths:
        lm = [r for r in runs if r["prompt"] == length and r["order"] == "layer"]
        tm = [r for r in runs if r["prompt"] == length and r["order"] == "token"]
        firsts = {json.dumps(r["token_ids"]) for r in lm + tm}
        if len(firsts) != 1:
            print(f"FAIL {length}: the orders gave different tokens: {firsts}")
            bad = True
        a_s = statistics.median(r["prefill_s"] for r in lm)
        b_s = statistics.median(r["prefill_s"] for r in tm)
        print(f"| {length} | {a_s:.2f} | {b_s:.2f} | {b_s / a_s:.2f} |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
