#!/usr/bin/env python3
"""Interleaved A/B of two `coli` binaries on one store: decode tok/s, same prompt, same options.

    python3 engine/bench/ab_decode.py STORE --ref OLD_COLI --new NEW_COLI
        [--prompt TEXT | --prompt-ids 1,2,3] [--max-tokens 64] [--reps 5] [--threads 2]
        [--args "extra coli run options"] [--out FILE]

Each repetition runs REF then NEW (the order alternates every repetition, so a slow drift of
the machine hits both), `coli run --json`, greedy. The binaries must produce the same tokens
(a refactor must not change output), else the script exits 1. Reports per binary the median
and spread of decode tok/s and prefill tok/s, and the ratio NEW / REF of the medians: these
machines are shared and noisy, so only the ratio of an interleaved run means anything. Also the
CPU seconds (user + system) of each whole run, which other tenants' load disturbs less than
wall-clock rates (with `--threads 1`, the work done).
Standard library only.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def run(coli, store, a):
    cmd = [coli, "run", "--store", store, "--max-tokens", str(a.max_tokens), "--json"]
    if a.prompt_ids:
        cmd += ["--prompt-ids", a.prompt_ids]
    else:
        cmd += ["--prompt", a.prompt]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    cmd += a.args.split()
    t0 = time.time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if p.returncode != 0:
        sys.exit(f"ab_decode: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    j = json.loads(p.stdout)
    s = j["stats"]
    return {
        "tokens": j["token_ids"],
        "decode_tok_s": s["decode_tok_s"],
        "prefill_tok_s": s.get("prefill_tok_s"),
        "wall_s": time.time() - t0,
        "cpu_s": cpu_s,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store")
    ap.add_argument("--ref", required=True, help="the reference coli binary (e.g. the build before a change)")
    ap.add_argument("--new", required=True, help="the coli binary under test")
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--prompt-ids", default=None)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--args", default="", help="extra options for both binaries")
    ap.add_argument("--out", default=None, help="also write the report here")
    a = ap.parse_args()
    lines = [
        f"# ab_decode {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} store={a.store}",
        f"# ref={a.ref} new={a.new} max_tokens={a.max_tokens} reps={a.reps} "
        f"threads={a.threads} args={a.args!r}",
        f"# load average before: {os.getloadavg()}",
    ]
    runs = {"ref": [], "new": []}
    tokens = None
    for rep in range(a.reps):
        order = ["ref", "new"] if rep % 2 == 0 else ["new", "ref"]
        for name in order:
            r = run(a.ref if name == "ref" else a.new, a.store, a)
            if tokens is None:
                tokens = r["tokens"]
            elif r["tokens"] != tokens:
                sys.exit(f"ab_decode: {name} produced other tokens: {r['tokens']} vs {tokens}")
            runs[name].append(r)
            lines.append(
                json.dumps({"rep": rep, "bin": name, "decode_tok_s": round(r["decode_tok_s"], 3),
                            "prefill_tok_s": r["prefill_tok_s"] and round(r["prefill_tok_s"], 3),
                            "wall_s": round(r["wall_s"], 3), "cpu_s": round(r["cpu_s"], 3)})
            )
    lines.append(f"# load average after: {os.getloadavg()}")
    med = {}
    cpu = {}
    for name, rs in runs.items():
        cpu[name] = statistics.median(r["cpu_s"] for r in rs)
        d = [r["decode_tok_s"] for r in rs]
        p = [r["prefill_tok_s"] for r in rs if r["prefill_tok_s"]]
        med[name] = statistics.median(d)
        lines.append(
            f"{name}: decode tok/s median {med[name]:.2f} (min {min(d):.2f}, max {max(d):.2f}); "
            f"prefill tok/s median {statistics.median(p) if p else float('nan'):.2f}; "
            f"CPU seconds per run median {cpu[name]:.3f}"
        )
    lines.append(f"ratio new/ref (decode tok/s medians): {med['new'] / med['ref']:.3f}")
    lines.append(f"ratio new/ref (CPU seconds per run medians, lower is faster): "
                 f"{cpu['new'] / cpu['ref']:.3f}")
    lines.append(f"tokens identical in all {2 * a.reps} runs: {len(tokens)} tokens")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
