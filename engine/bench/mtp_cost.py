#!/usr/bin/env python3
"""Issue 19: the cost of one MTP draft step relative to one main-model decode pass.

    mtp_cost.py --coli target/release/coli --store STORE [--rounds 3] [--tokens 64] [--threads 2]

STORE is a GLM-5-shaped store with its MTP layer (mtp_cost.sh makes one with
make_glm5_shape.py --dims small). Random weights: MTP acceptance is meaningless here (the drafts
of an untrained MTP layer are almost never the main model's tokens); what this measures is time.
Per round, interleaved: `--speculate off` (plain decode: seconds per decode pass = decode_s /
decode_passes) and `--speculate mtp --no-draft-gate --draft-tokens K` for K in 1 and 3 (seconds
of drafting per draft token = draft_s / drafts_proposed: the MTP layer's catch-up over the
positions it has not seen plus the chained steps). Every run must give the tokens of the `off`
run (exit 1 otherwise). Prints a table and writes every run's JSON to --out.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def run(a, mode, k):
    ids = ",".join(str((i * 7919 + 13) % 16000 + 10) for i in range(a.prompt_len))
    cmd = [a.coli, "run", "--store", a.store, "--prompt-ids", ids, "--max-tokens", str(a.tokens),
           "--json", "--threads", str(a.threads), "--speculate", mode, "--no-draft-gate"]
    if mode == "mtp":
        cmd += ["--draft-tokens", str(k)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    out = json.loads(p.stdout)
    out["wall_s"] = time.time() - t0
    out["variant"] = mode if mode == "off" else f"mtp-k{k}"
    # stop_on_eos stays on; the random model rarely hits its EOS, and both modes stop alike.
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--store", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    runs = []
    variants = [("off", 0), ("mtp", 1), ("mtp", 3)]
    for r in range(a.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for mode, k in order:
            runs.append(run(a, mode, k))
            s = runs[-1]["stats"]
            print(f"# round {r} {runs[-1]['variant']:7s} decode {s['decode_s']:.3f} s, "
                  f"{s['decode_passes']} passes, draft {s['speculation']['draft_s']:.3f} s, "
                  f"{s['speculation']['drafts_proposed']} drafts", flush=True)
    with open(a.out, "w") as f:
        json.dump({"store": a.store, "rounds": a.rounds, "tokens": a.tokens, "runs": runs}, f, indent=1)
    base = [x for x in runs if x["variant"] == "off"]
    want = base[0]["token_ids"]
    bad = [x["variant"] for x in runs if x["token_ids"] != want]
    plain = statistics.median(x["stats"]["decode_s"] / x["stats"]["decode_passes"] for x in base)
    print(f"plain decode pass: {plain * 1e3:.2f} ms (median of {len(base)} runs)")
    print("variant   draft ms/token  ratio to a plain pass  verify-pass ms  accepted/proposed")
    for v in ("mtp-k1", "mtp-k3"):
        xs = [x for x in runs if x["variant"] == v]
        per = statistics.median(x["stats"]["speculation"]["draft_s"] / x["stats"]["speculation"]["drafts_proposed"]
                                for x in xs)
        vp = statistics.median((x["stats"]["decode_s"] - x["stats"]["speculation"]["draft_s"])
                               / x["stats"]["decode_passes"] for x in xs)
        acc = sum(x["stats"]["speculation"]["drafts_accepted"] for x in xs)
        prop = sum(x["stats"]["speculation"]["drafts_proposed"] for x in xs)
        print(f"{v:8s}  {per * 1e3:14.2f}  {per / plain:21.3f}  {vp * 1e3:14.2f}  {acc}/{prop}")
    if bad:
        print(f"TOKEN MISMATCH with --speculate off: {bad}")
        return 1
    print("every variant gave the tokens of --speculate off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
