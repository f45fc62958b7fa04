#!/usr/bin/env python3
"""Interleaved A/B of prefill time: two coli binaries on one store and the same prompts.

    ab_prefill.py --store DIR --a OLD --b NEW [--lengths 2048] [--reps 2] [--threads 2]
        [--seed 23] --vocab V [--out FILE.json] [-- EXTRA COLI RUN ARGS...]

Per rep and length, A then B (B then A on odd reps): `coli run --store DIR --prompt-ids <N
seeded ids> --max-tokens 1 --json --speculate off --context N+8 --ram-budget 64GiB --threads
T`; every weight resident (the store must fit), so prefill time is compute. Both binaries
must give the same first token (exit 1 otherwise). Prints TTFT per run and the median ratio
A/B per length (> 1: B faster). Python 3 standard library only.
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import time


def run(coli, store, ids, threads, extra):
    cmd = [coli, "run", "--store", store, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "1",
           "--json", "--speculate", "off", "--context", str(len(ids) + 8), "--ram-budget", "64GiB",
           "--threads", str(threads)] + extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{coli} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    j = json.loads(p.stdout.strip().splitlines()[-1])
    return {"ttft_s": j["stats"]["ttft_s"], "wall_s": time.time() - t0, "tokens": j.get("token_ids"),
            "stats": j["stats"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--vocab", type=int, required=True, help="prompt ids are drawn from 1..vocab")
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lengths = [int(x) for x in a.lengths.split(",")]
    ids = [rng.randrange(1, a.vocab) for _ in range(max(lengths))]
    print(f"# ab_prefill.py store {a.store}, A {a.a}, B {a.b}, lengths {lengths}, reps {a.reps}, "
          f"threads {a.threads}, extra {a.extra}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    runs = []
    for rep in range(a.reps):
        for n in lengths:
            order = [("A", a.a), ("B", a.b)]
            if rep % 2:
                order.reverse()
            for tag, coli in order:
                r = run(coli, a.store, ids[:n], a.threads, a.extra)
                r.update(tag=tag, n=n, rep=rep)
                runs.append(r)
                print(f"rep {rep} {n:>6} tokens {tag}: TTFT {r['ttft_s']:.2f} s "
                      f"({n / r['ttft_s']:.1f} prompt tok/s), first token {r['tokens']}", flush=True)
    bad = False
    for n in lengths:
        ta = [r["ttft_s"] for r in runs if r["n"] == n and r["tag"] == "A"]
        tb = [r["ttft_s"] for r in runs if r["n"] == n and r["tag"] == "B"]
        toks = {json.dumps(r["tokens"]) for r in runs if r["n"] == n}
        same = len(toks) == 1
        bad |= not same
        print(f"{n} tokens: median TTFT A {statistics.median(ta):.2f} s, B {statistics.median(tb):.2f} s, "
              f"A/B {statistics.median(ta) / statistics.median(tb):.2f}x; first token "
              f"{'the same in every run' if same else 'DIFFERS: ' + ' '.join(toks)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
