#!/usr/bin/env python3
"""Tiered expert cache benchmark (issue 6): bytes read from disk per token, hit rate, prefetch
precision/recall and decode tok/s with router lookahead prefetch on vs off and the pinned hot
set on vs off, at an expert budget below the model's expert set.

    python3 engine/bench/placement_bench.py STORE [--budget 16MiB] [--reps 2] [--max-tokens 32]
        [--coli PATH] [--out FILE]

Method: the usage history is learned with `coli run` on prompt set A (its own state directory,
fresh for each benchmark), then every configuration runs on the held-out prompt set B,
interleaved (for each repetition, for each prompt: LRU only, prefetch, pin, pin + prefetch), so
a drift of the shared machine hits all of them alike. Every run: greedy, `--json`, the budget
given; the tokens of all configurations must be identical (placement never changes output).
Standard library only. Reports per configuration the sums over prompts and repetitions.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Prompt set A (learning) and B (held out); plain text, tokenized by the store's tokenizer.
SET_A = [
    "The history of the printing press begins",
    "Photosynthesis converts light into",
    "A recipe for bread needs flour, water and",
    "The rules of chess say that a bishop",
]
SET_B = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain how a bicycle stays upright.",
    "List three uses of copper.",
]
CONFIGS = [
    ("lru", ["--no-pin", "--no-prefetch"]),
    ("prefetch", ["--no-pin"]),
    ("pin", ["--no-prefetch"]),
    ("pin+prefetch", []),
]


def coli_run(coli, store, prompt, budget, max_tokens, extra, env):
    cmd = [coli, "run", "--store", store, "--prompt", prompt, "--chat", "--max-tokens", str(max_tokens),
           "--ram-budget", budget, "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--budget", default="16MiB")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--coli", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                                                   "release", "coli"))
    ap.add_argument("--out")
    a = ap.parse_args()
    out = open(a.out, "w") if a.out else sys.stdout

    def say(s=""):
        print(s, file=out, flush=True)

    state = tempfile.mkdtemp(prefix="coli-placement-bench-")
    env = dict(os.environ, COLI_STATE_DIR=state)
    say(f"# placement benchmark {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    say(f"store {a.store}, budget {a.budget}, max tokens {a.max_tokens}, reps {a.reps}, coli {a.coli}")
    say(f"uptime: {os.getloadavg()}")
    plan = subprocess.run([a.coli, "plan", "--store", a.store, "--ram-budget", a.budget, "--json"],
                          capture_output=True, text=True, env=env)
    say("plan (before learning): " + plan.stdout.replace("\n", " "))
    # Learn the usage history on set A (pinning off so the runs do not depend on each other).
    for p in SET_A:
        coli_run(a.coli, a.store, p, a.budget, a.max_tokens, ["--no-pin"], env)
    plan = subprocess.run([a.coli, "plan", "--store", a.store, "--ram-budget", a.budget, "--json"],
                          capture_output=True, text=True, env=env)
    say("plan (after learning on set A): " + plan.stdout.replace("\n", " "))
    # Measuring on set B must not change the history between configurations: copy it back.
    hist = [f for f in os.listdir(state) if f.endswith(".json")]
    saved = {f: open(os.path.join(state, f), "rb").read() for f in hist}
    keys = ["prompt_tokens", "decode_s", "expert_bytes_read", "demand_bytes", "prefetch_bytes", "hits",
            "misses", "pinned_hits", "inflight_waits", "prefetch_reads", "prefetch_used", "io_wait_s",
            "compute_s", "evictions"]
    tot = {name: {k: 0.0 for k in keys + ["steps", "tokens_run", "pred_p", "pred_r", "n"]} for name, _ in CONFIGS}
    tokens = {}
    say("\nraw: config prompt rep decode_tok_s bytes/token hit_rate precision recall io_wait_ms/token")
    for rep in range(a.reps):
        for pi, p in enumerate(SET_B):
            for name, extra in CONFIGS:
                for f, b in saved.items():
                    open(os.path.join(state, f), "wb").write(b)
                r = coli_run(a.coli, a.store, p, a.budget, a.max_tokens, extra, env)
                s = r["stats"]
                tokens.setdefault(pi, r["token_ids"])
                if r["token_ids"] != tokens[pi]:
                    sys.exit(f"placement changed the tokens: {name} prompt {pi}")
                t = tot[name]
                for k in keys:
                    t[k] += s[k]
                steps = s["generated_tokens"] - 1 if s["generated_tokens"] > 0 else 0
                t["steps"] += steps
                t["tokens_run"] += s["prompt_tokens"] + steps
                t["pred_p"] += s["prefetch_precision"]
                t["pred_r"] += s["prefetch_recall"]
                t["n"] += 1
                say(f"{name:13s} {pi} {rep} {s['decode_tok_s']:.2f} {s['expert_bytes_per_token'] / 2**20:.3f}MiB "
                    f"{s['hit_rate']:.3f} {s['prefetch_precision']:.3f} {s['prefetch_recall']:.3f} "
                    f"{s['io_wait_s_per_token'] * 1e3:.2f}")
    say("\nsummary (sums over prompts and repetitions)")
    say(f"{'config':13s} {'decode tok/s':>12s} {'MiB/token':>10s} {'demand':>8s} {'prefetch':>9s} {'hit rate':>9s} "
        f"{'pinned hits':>11s} {'in-flight':>9s} {'pf used/read':>12s} {'precision':>9s} {'recall':>7s} "
        f"{'io wait ms/tok':>14s}")
    base = None
    for name, _ in CONFIGS:
        t = tot[name]
        tok_s = t["steps"] / t["decode_s"] if t["decode_s"] > 0 else 0.0
        base = base or tok_s
        per = lambda v: v / t["tokens_run"] / 2**20
        hr = t["hits"] / max(1, t["hits"] + t["misses"])
        used = f"{int(t['prefetch_used'])}/{int(t['prefetch_reads'])}"
        say(f"{name:13s} {tok_s:12.2f} {per(t['expert_bytes_read']):10.3f} {per(t['demand_bytes']):8.3f} "
            f"{per(t['prefetch_bytes']):9.3f} {hr:9.3f} {int(t['pinned_hits']):11d} {int(t['inflight_waits']):9d} "
            f"{used:>12s} {t['pred_p'] / t['n']:9.3f} {t['pred_r'] / t['n']:7.3f} "
            f"{t['io_wait_s'] / t['tokens_run'] * 1e3:14.2f}   tok/s vs lru {tok_s / base:.2f}x")


if __name__ == "__main__":
    main()
