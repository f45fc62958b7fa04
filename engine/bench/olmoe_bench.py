#!/usr/bin/env python3
"""OLMoE-shaped placement and I/O benchmark (issue 6): decode tok/s against the I/O bound.

    python3 engine/bench/olmoe_bench.py STORE [--budget 512MiB] [--reps 2] [--max-tokens 64]
        [--queue-depth 4] [--configs base,no-prefetch,pread,lru] [--coli PATH] [--out FILE]
        [--ref-coli PATH [--ref-args "ARGS"]]

STORE is a `coli-convert` store of the checkpoint written by `make_olmoe_shape.py` (no
tokenizer: prompts are token ids). Every run: greedy, `--direct on` (O_DIRECT expert reads),
`--ram-budget` BUDGET, `--json`, `--usage` a history file of this benchmark only.

Method:
1. Pages are dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`) before each run when the
   kernel allows it; the output says whether it did.
2. The usage history is learned on prompt set A (`--no-pin`, prefetch on), then saved.
3. On the held-out prompt set B, interleaved per repetition and prompt, the configurations:
   `base` (io_uring, prefetch, pinned hot set from A), `no-prefetch`, `pread` (--io pread),
   `lru` (--no-pin: plain LRU); `--configs` picks others (`lru-no-prefetch`, `lru-pread`,
   `pin-0.1`: --pin-share 0.1; `ref`: `--ref-coli`'s binary, e.g.
   the build before a change, with `--ref-args`); the first is the reference of the "vs" column. The history is restored before every run, so all start from
   the one learned on A. All configurations must give the same tokens (placement never
   changes output), or the script exits non-zero.
4. fio, in the same run, before and between the repetitions and after them: random O_DIRECT
   reads (io_uring, iodepth = the queue depth in use, block = the store's mean expert record
   rounded up to 4 KiB) over all segment files, 5 s each. fio bandwidth = the mean.
5. Bound: tokens/s = fio bandwidth / (all expert bytes read from disk per token run), where
   tokens run = prompt tokens + decode steps (the engine's per-token unit). Achieved rate on the
   same unit: tokens run / (prefill s + decode s); also decode tok/s (steps / decode s).
Standard library only (plus the fio and coli binaries).
"""

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Token-id prompts (the generated model has no tokenizer); 4 tokens each, vocab 50304.
SET_A = [[101, 2020, 310, 4410], [7777, 15, 923, 30001], [12345, 678, 9, 4242]]
SET_B = [[50, 31337, 2718, 1414], [27182, 8, 16180, 339]]
ALL_CONFIGS = {
    "base": [],  # io_uring, prefetch, pinned hot set from set A (default --pin-share 0.5)
    "no-prefetch": ["--no-prefetch"],
    "pread": ["--io", "pread"],
    "lru": ["--no-pin"],  # plain LRU (prefetch on)
    "lru-no-prefetch": ["--no-pin", "--no-prefetch"],
    "lru-pread": ["--no-pin", "--io", "pread"],
    "pin-0.1": ["--pin-share", "0.1"],
}
DEFAULT_CONFIGS = "base,no-prefetch,pread,lru"


def drop_caches():
    """True when the page cache was dropped."""
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def coli_run(a, ids, extra, usage, binary=None):
    cmd = [binary or a.coli, "run", "--store", a.store, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens",
           str(a.max_tokens), "--ram-budget", a.budget, "--direct", "on", "--queue-depth", str(a.queue_depth),
           "--usage", usage, "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout)


def fio(segments, bs, qd, seconds):
    cmd = ["fio", "--name=olmoe-bound", "--filename=" + ":".join(s.replace(":", "\\:") for s in segments),
           "--rw=randread", f"--bs={bs}", "--direct=1", "--ioengine=io_uring", f"--iodepth={qd}",
           f"--runtime={seconds}", "--time_based", "--invalidate=1", "--output-format=json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"fio failed: {' '.join(cmd)}\n{p.stderr}")
    j = json.loads(p.stdout)["jobs"][0]["read"]
    return j["bw_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--budget", default="512MiB")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--queue-depth", type=int, default=4)
    ap.add_argument("--fio-seconds", type=int, default=5)
    ap.add_argument("--coli", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                                                   "release", "coli"))
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help=f"comma-separated, the first is the reference; known: {','.join(ALL_CONFIGS)}")
    ap.add_argument("--out")
    ap.add_argument("--ref-coli", help="another coli binary (e.g. the build before a change): config `ref`")
    ap.add_argument("--ref-args", default="", help="flags of config `ref` (default: base's)")
    a = ap.parse_args()
    if a.ref_coli:
        ALL_CONFIGS["ref"] = a.ref_args.split()
    unknown = [n for n in a.configs.split(",") if n not in ALL_CONFIGS]
    if unknown:
        sys.exit(f"unknown config(s) {unknown}; known: {','.join(ALL_CONFIGS)} (`ref` needs --ref-coli)")
    CONFIGS = [(n, ALL_CONFIGS[n]) for n in a.configs.split(",")]
    a.budget = a.budget.replace("iB", "")  # coli takes 512M (= MiB)
    out = open(a.out, "w") if a.out else sys.stdout

    def say(s=""):
        print(s, file=out, flush=True)

    info = json.loads(subprocess.run([a.coli, "info", a.store, "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    ex = info["classes"]["routed_experts"]
    rec = ex["bytes"] / ex["count"]
    bs = int(math.ceil(rec / 4096) * 4096)
    segments = sorted(glob.glob(os.path.join(a.store, "segments", "seg-*.bin")))
    say(f"# OLMoE-shape benchmark {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    say(f"store {a.store}: experts {info['encodings']['experts']}, {ex['count']} expert records, "
        f"{ex['bytes'] / 2**30:.2f} GiB, mean record {rec / 2**20:.3f} MiB; {len(segments)} segment files")
    say(f"budget {a.budget}, max tokens {a.max_tokens}, reps {a.reps}, queue depth {a.queue_depth}, "
        f"coli {a.coli}" + (f", ref coli {a.ref_coli}" if a.ref_coli else "") + ", direct on; configs: " + "; ".join(f"{n} {' '.join(x) or '(defaults)'}" for n, x in CONFIGS))
    say(f"loadavg {os.getloadavg()}, nproc {os.cpu_count()}")
    say("df: " + subprocess.run(["df", "-T", a.store], capture_output=True, text=True).stdout.splitlines()[-1])
    dropped = drop_caches()
    say(f"drop_caches permitted: {dropped}" + ("" if dropped else
        " (no: /proc/sys/vm is read-only here; O_DIRECT expert reads bypass the guest page cache anyway, "
        "the dense weights are read buffered at load)"))

    fios = []

    def run_fio(tag):
        bw = fio(segments, bs, a.queue_depth, a.fio_seconds)
        fios.append(bw)
        say(f"fio {tag}: randread bs={bs} iodepth={a.queue_depth} io_uring O_DIRECT over {len(segments)} segments: "
            f"{bw / 2**30:.3f} GiB/s")

    state = tempfile.mkdtemp(prefix="coli-olmoe-bench-")
    usage = os.path.join(state, "usage.json")
    run_fio("start")
    say("\nlearning on set A (--no-pin):")
    for ids in SET_A:
        drop_caches()
        r = coli_run(a, ids, ["--no-pin"], usage)
        s = r["stats"]
        say(f"  A {ids}: decode {s['decode_tok_s']:.2f} tok/s, {s['expert_bytes_per_token'] / 2**20:.1f} MiB/token, "
            f"hit rate {s['hit_rate']:.3f}")
    saved = os.path.join(state, "usage-A.json")
    shutil.copyfile(usage, saved)
    plan = subprocess.run([a.coli, "plan", "--store", a.store, "--ram-budget", a.budget, "--usage", usage, "--json"],
                          capture_output=True, text=True)
    say("plan (after learning on set A): " + (plan.stdout or plan.stderr).replace("\n", " "))

    keys = ["prompt_tokens", "decode_steps_", "prefill_s", "decode_s", "expert_bytes_read", "demand_bytes",
            "prefetch_bytes", "hits", "misses", "pinned_hits", "inflight_waits", "prefetch_reads",
            "prefetch_used", "io_wait_s", "compute_s"]
    tot = {n: {k: 0.0 for k in keys + ["pp", "pr", "n"]} for n, _ in CONFIGS}
    tokens = {}
    say("\nraw: config prompt rep decode_tok_s run_tok_s MiB/token hit_rate pinned_hits precision recall "
        "io_wait_ms/token disk_GiB/s pinned_experts lru_capacity")
    for rep in range(a.reps):
        for pi, ids in enumerate(SET_B):
            for name, extra in CONFIGS:
                shutil.copyfile(saved, usage)
                drop_caches()
                r = coli_run(a, ids, extra, usage, a.ref_coli if name == "ref" else None)
                s = r["stats"]
                tokens.setdefault(pi, r["token_ids"])
                if r["token_ids"] != tokens[pi]:
                    sys.exit(f"placement changed the tokens: {name} prompt {pi}")
                t = tot[name]
                steps = max(0, s["generated_tokens"] - 1)
                s["decode_steps_"] = steps
                for k in keys:
                    t[k] += s[k]
                t["pp"] += s["prefetch_precision"]
                t["pr"] += s["prefetch_recall"]
                t["n"] += 1
                run_tok_s = (s["prompt_tokens"] + steps) / (s["prefill_s"] + s["decode_s"])
                say(f"{name:12s} {pi} {rep} {s['decode_tok_s']:.3f} {run_tok_s:.3f} "
                    f"{s['expert_bytes_per_token'] / 2**20:.1f} {s['hit_rate']:.3f} {s['pinned_hits']} "
                    f"{s['prefetch_precision']:.3f} {s['prefetch_recall']:.3f} "
                    f"{s['io_wait_s_per_token'] * 1e3:.1f} {s['disk_gib_s']:.3f} {s['pinned_experts']} "
                    f"{s['lru_capacity']} io={s['io_engine']} qd={s['queue_depth']}")
        run_fio(f"after rep {rep}")
    fio_bw = sum(fios) / len(fios)
    say(f"\nfio mean {fio_bw / 2**30:.3f} GiB/s (runs: {', '.join(f'{b / 2**30:.3f}' for b in fios)})")
    say("\nsummary (sums over set B prompts and repetitions; per token = per prompt token + decode step)")
    say(f"{'config':12s} {'decode tok/s':>12s} {'run tok/s':>9s} {'bound tok/s':>11s} {'% bound':>7s} "
        f"{'MiB/token':>9s} {'demand':>7s} {'prefetch':>8s} {'hit rate':>8s} {'pinned':>6s} {'precision':>9s} "
        f"{'recall':>6s} {'io wait ms/tok':>14s} {'disk GiB/s':>10s} {'vs ' + CONFIGS[0][0]:>7s} "
        f"{'compute tok/s':>13s} {'% of min(bound, compute)':>24s}")
    base = None
    for name, _ in CONFIGS:
        t = tot[name]
        run_tokens = t["prompt_tokens"] + t["decode_steps_"]
        secs = t["prefill_s"] + t["decode_s"]
        dec = t["decode_steps_"] / t["decode_s"]
        run = run_tokens / secs
        bpt = t["expert_bytes_read"] / run_tokens
        bound = fio_bw / bpt if bpt > 0 else float("inf")
        base = base or run
        hr = t["hits"] / max(1, t["hits"] + t["misses"])
        # The rate if every I/O wait vanished: time outside I/O waits is compute (and the
        # contention the reads cause), so min(bound, compute) is what this machine allows.
        compute = run_tokens / max(1e-9, secs - t["io_wait_s"])
        say(f"{name:12s} {dec:12.3f} {run:9.3f} {bound:11.3f} {100 * run / bound:6.1f}% {bpt / 2**20:9.1f} "
            f"{t['demand_bytes'] / run_tokens / 2**20:7.1f} {t['prefetch_bytes'] / run_tokens / 2**20:8.1f} "
            f"{hr:8.3f} {int(t['pinned_hits']):6d} {t['pp'] / t['n']:9.3f} {t['pr'] / t['n']:6.3f} "
            f"{t['io_wait_s'] / run_tokens * 1e3:14.1f} {t['expert_bytes_read'] / secs / 2**30:10.3f} "
            f"{run / base:6.2f}x {compute:13.3f} {100 * run / min(bound, compute):23.1f}%")
    shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
