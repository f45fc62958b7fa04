#!/usr/bin/env python3
"""Resident decode and prefill on the OLMoE-1B-7B shape: coli `--numerics exact` and `q8a`
against llama.cpp on GGUFs of the same weights (issue 43 targets), same run, interleaved.

Models (engine/bench/streaming_bench.sh steps 1-5 make them; this script only runs):
  STORE_INT4  coli-convert --experts int4-g64 --dense bf16      vs  olmoe-q4_0.gguf
  STORE_INT8  coli-convert --experts int8 --dense bf16          vs  olmoe-q8_0.gguf
  store-gguf-q4_0  coli-convert olmoe-q4_0.gguf (the GGUF itself) vs  olmoe-q4_0.gguf
                   (pair `gguf-q4_0:q4_0`: the same bytes in both engines)
Everything is resident: coli's default budget holds every expert on this machine (24 GiB), so
it preloads them at start (stderr says so; the load is not in the decode or prefill figures);
llama.cpp maps its file with MAP_POPULATE (--mmap on). llama.cpp runs with --repack cpu (the
CPU_REPACK kernels its default "on" would pick on an x86 CPU without AMX; this VM's llama.cpp
build has no AMX path here either), OMP_WAIT_POLICY=ACTIVE by default (llama.cpp's default:
its threads spin, the fastest setting while nothing else runs; PASSIVE measured 22 tok/s at 2
threads where ACTIVE gave 35-38 on int4d4/q4_0). Pages of the models are not dropped: both read from the
page cache at load; the figures are compute.

Per configuration (model pair x threads), REPS rounds; in each round every engine runs once,
in a rotated order. Decode: the prompt (16 ids) then --max-tokens DECODE_TOKENS greedy tokens,
decode tok/s = (tokens - 1) / decode seconds. Prefill: PREFILL ids, one forward (coli
--max-tokens 1 with the default prefill batch; llama.cpp one llama_decode of the whole prompt),
prefill tok/s = ids / prefill seconds. Medians, and ratios against llama.cpp.

Usage: q8a_bench.py [--dir /work/bench-olmoe] [--threads 1,2] [--reps 3] [--out FILE]
       [--llama-python /work/venv-llama/bin/python] [--coli target/release/coli]
       [--workloads decode,prefill512,prefill2048]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ids(n, seed):
    r = random.Random(seed)
    return [r.randrange(1, 50000) for _ in range(n)]


def run_coli(a, store, numerics, workload, threads, usage):
    n = 16 if workload == "decode" else int(workload[len("prefill"):])
    cmd = [a.coli, "run", "--store", store, "--prompt-ids", ",".join(map(str, ids(n, n))),
           "--max-tokens", str(a.decode_tokens if workload == "decode" else 1),
           "--threads", str(threads), "--numerics", numerics, "--usage", usage, "--no-pin",
           "--context", str(max(n + a.decode_tokens + 8, 256)), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"coli failed: {' '.join(cmd)}\n{p.stderr}")
    if "holds all" not in p.stderr:
        sys.exit(f"coli did not preload the model (not resident): {p.stderr}")
    s = json.loads(p.stdout.strip().splitlines()[-1])["stats"]
    if workload == "decode":
        return s["decode_tok_s"]
    return n / s["prefill_s"]


def run_llama(a, gguf, workload, threads):
    n = 16 if workload == "decode" else int(workload[len("prefill"):])
    cmd = [a.llama_python, os.path.join(ROOT, "engine", "bench", "llamacpp_run.py"), "--model", gguf,
           "--workload", "decode", "--prompt-ids", ",".join(map(str, ids(n, n))), "--threads",
           str(threads), "--ctx", str(max(n + a.decode_tokens + 8, 256)), "--mmap", "on",
           "--repack", "cpu", "--max-tokens", str(a.decode_tokens if workload == "decode" else 1)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_WAIT_POLICY": a.omp})
    if p.returncode != 0:
        sys.exit(f"llama.cpp failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    j = json.loads(p.stdout.strip().splitlines()[-1])
    if workload == "decode":
        return j["decode_tok_s"]
    return n / j["prefill_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/work/bench-olmoe")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--workloads", default="decode,prefill512")
    ap.add_argument("--pairs", default="int4:q4_0,int8:q8_0")
    ap.add_argument("--coli", default=os.path.join(ROOT, "target", "release", "coli"))
    ap.add_argument("--llama-python", default="/work/venv-llama/bin/python")
    ap.add_argument("--omp", default="ACTIVE",
                    help="OMP_WAIT_POLICY for llama.cpp: ACTIVE (its default, fastest while nothing "
                         "else runs: the engines here run one at a time) or PASSIVE")
    ap.add_argument("--out")
    a = ap.parse_args()
    usage = os.path.join(tempfile.mkdtemp(prefix="coli-q8a-"), "usage.json")
    lines = []

    def say(s):
        print(s, flush=True)
        lines.append(s)

    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    say(f"# q8a_bench.py: coli {rev} ({a.coli}), llama-cpp-python 0.3.36 --repack cpu --mmap on "
        f"OMP_WAIT_POLICY={a.omp}, "
        f"reps {a.reps}, decode tokens {a.decode_tokens}, OLMoE-1B-7B shape in {a.dir}")
    say("workload     pair        threads  coli_exact  coli_q8a  llama.cpp  exact/llama  q8a/llama  q8a/exact")
    for workload in a.workloads.split(","):
        for pair in a.pairs.split(","):
            st, gg = pair.split(":")
            store = os.path.join(a.dir, f"store-{st}")
            gguf = os.path.join(a.dir, f"olmoe-{gg}.gguf")
            for threads in map(int, a.threads.split(",")):
                res = {"exact": [], "q8a": [], "llama": []}
                order = ["exact", "q8a", "llama"]
                for r in range(a.reps):
                    for who in order[r % 3:] + order[:r % 3]:
                        if who == "llama":
                            res[who].append(run_llama(a, gguf, workload, threads))
                        else:
                            res[who].append(run_coli(a, store, who, workload, threads, usage))
                    say(f"#   round {r}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in res.items()))
                m = {k: statistics.median(v) for k, v in res.items()}
                say(f"{workload:<12} {st}/{gg:<7} {threads:>7} {m['exact']:>11.2f} {m['q8a']:>9.2f} "
                    f"{m['llama']:>10.2f} {m['exact'] / m['llama']:>12.2f} {m['q8a'] / m['llama']:>10.2f} "
                    f"{m['q8a'] / m['exact']:>10.2f}")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
