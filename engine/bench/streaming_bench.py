#!/usr/bin/env python3
"""coli vs llama.cpp at equal total memory on a model that does not fit (issue 17).

    streaming_bench.py --bench-dir DIR --out FILE [--reps 3] [--threads 2] [--limits 10,50,100]
        [--decode-tokens 24] [--stream-tokens 32] [--engines LIST] [--coli PATH]
        [--llama-python PATH] [--workloads decode,stream] [--limit-group GROUP]

DIR holds what `streaming_bench.sh` made from the OLMoE-shaped benchmark model
(`make_olmoe_shape.py`, routing checked by `routing_stats.py`): coli stores `store-int4`
(`--experts int4-g64 --dense bf16`), `store-int4-d8` (`--experts int4-g64 --dense int8
--embeddings int8`), `store-int4-d4` (`--experts int4-g64 --dense int4-g64 --embeddings int4-g64`,
the bits of llama.cpp's Q4_0 everywhere), `store-int8` (`--experts int8 --dense bf16`), and llama.cpp GGUFs of the same
weights `olmoe-q4_0.gguf`, `olmoe-q8_0.gguf` (`olmoe_gguf.py`: llama.cpp's own quantizer; the
type of every tensor is listed in `olmoe-<type>.tensors.txt`). Engines missing from DIR are
skipped (and said so).

Equal memory. Every run is a fresh process inside its own cgroup-v1 memory cgroup
(`/sys/fs/cgroup/memory/coli-bench-*`, created, `memory.limit_in_bytes` set, removed after), which
counts RSS AND page cache, so an engine that pages its weights through mmap gets no more memory
than one that reads them into its own buffers. Before every run: `sync; echo 3 >
/proc/sys/vm/drop_caches` (cold). Runs are interleaved: for each limit, repetition, workload,
every engine once, in turn.

Limits, per bit-width group (int4: coli int4, coli int4-d8 and llama.cpp Q4_0; int8: coli int8 and
llama.cpp Q8_0), from that group's coli store with bf16 dense weights: dense.bin + P% of the expert
records + 384 MiB (KV cache at --context 512, code, buffers), for each P of --limits (100 holds
the whole model); `--limit-group G` runs every engine at group G's limits instead (equal memory
across encodings: an IQ2_XS store at the int4 store's limits holds a larger share of its experts;
a row's limit_pct is then G's percentage, not a share of its own experts). coli is configured at its best for the limit: `--ram-budget` (the expert cache,
pinned set included) = (limit - its own dense.bin - its margin) x record bytes / bytes a record's
buffer holds (a buffer is its record's length rounded to the page size). The margin
(`--coli-margin measured`, the default since 2026-12-07; `coli_budget_measured`) is coli's
overhead on that store and workload x 1.1 + 16 MiB, the overhead measured in the same run by
`calibrate_overhead` (cold runs in an unconstraining cgroup with 10% and 40% of the experts as
budget: peak cgroup memory - dense.bin - budget, i.e. KV cache, activations, reads in flight,
code and heap, fitted as a line in the budget); each coli row records the overhead it had
(`overhead_bytes`); `--coli-margin flat` gives the flat 384 MiB of earlier runs (`coli_budget`),
which left coli's cgroup partly unused where its overhead is smaller (the 4-layer OLMoE shape:
~60-175 MB against 384 MiB) while llama.cpp's page cache takes the whole limit. The usage history is learned on
other token ids before the first run (so it may pin its hottest experts). llama.cpp: mmap on
(its default, the way it runs models larger than RAM) and weight repacking OFF
(`use_extra_bufts = false`, `--no-repack` in its CLI): with repacking, its CPU backend copies the
Q4_0 weights into anonymous memory at load, which holds the whole model in RAM and is killed in
a cgroup smaller than the model. At the whole-model limit llama.cpp also runs with repacking on
(`llama-q4_0-repack`), its fastest configuration when everything fits.

Workloads (token ids; the model has no tokenizer):
- decode: 8 varied prompt ids, then --decode-tokens greedy tokens (TTFT, decode tok/s);
- stream: --stream-tokens varied ids fed ONE PER FORWARD (teacher forcing: every step routes a
  new token, the I/O-heavy case); tok/s = ids / seconds.

Reported per engine, limit and workload: tok/s (median of the repetitions, min-max), TTFT,
bytes read from disk per token (the same measure for every engine: the process's read_bytes from
wait4's rusage, ru_inblock x 512, = /proc/PID/io read_bytes at exit, load included, divided by
the tokens run; coli's own expert counter beside it), peak cgroup memory
(memory.max_usage_in_bytes), OOM kills, hit rate (coli). Tokens: each coli store must give the
same tokens at every limit (placement invariance; the script exits 1 otherwise); llama.cpp's are
reported. Bounds, next to each coli figure, in the same run: the I/O bound = fio bandwidth
(random O_DIRECT reads at the store's expert record size and coli's queue depth, io_uring,
over its segment files) / coli's expert bytes read per token; the compute bound = coli's tok/s
with every expert resident (whole-model budget, every expert pinned at load) ; and coli's
share of min(I/O bound, compute bound).
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from olmoe_bench import drop_caches  # noqa: E402
import streaming_report  # noqa: E402
CG = "/sys/fs/cgroup/memory"
MiB = 1 << 20
OVERHEAD = 384 * MiB
CONTEXT = 512

# name: (kind, file in bench dir, group, extra args)
ENGINES = {
    # f32 activations (`--numerics exact`; the coli tools' default before 2026-12-07).
    "coli-int4": ("coli", "store-int4", "int4", ["--numerics", "exact"]),
    "coli-int4-d8": ("coli", "store-int4-d8", "int4", ["--numerics", "exact"]),
    "coli-int4-d4": ("coli", "store-int4-d4", "int4", ["--numerics", "exact"]),
    "coli-int8": ("coli", "store-int8", "int8", ["--numerics", "exact"]),
    # The same stores under integer activations (q8a revision 5, ENGINE.md "Numerics").
    "coli-int4-q8a": ("coli", "store-int4", "int4", ["--numerics", "q8a"]),
    "coli-int4-d4-q8a": ("coli", "store-int4-d4", "int4", ["--numerics", "q8a"]),
    "coli-int8-q8a": ("coli", "store-int8", "int8", ["--numerics", "q8a"]),
    "llama-q4_0": ("llama", "olmoe-q4_0.gguf", "int4", ["--repack", "off"]),
    "llama-q8_0": ("llama", "olmoe-q8_0.gguf", "int8", ["--repack", "off"]),
    "llama-q4_0-repack": ("llama", "olmoe-q4_0.gguf", "int4", ["--repack", "cpu"]),
    # One GGUF file run by both (issue 46): coli's store of it (`coli-convert FILE.gguf`, the
    # blocks bit for bit) against llama.cpp on the file (gguf_iquant.py writes them).
    "coli-gguf-q4_k-q8a": ("coli", "store-gguf-q4_k", "q4_k", ["--numerics", "q8a"]),
    "llama-q4_k": ("llama", "olmoe-q4_k.gguf", "q4_k", ["--repack", "off"]),
    "llama-q4_k-repack": ("llama", "olmoe-q4_k.gguf", "q4_k", ["--repack", "cpu"]),
    "coli-gguf-iq2_xs-q8a": ("coli", "store-gguf-iq2_xs", "iq2_xs", ["--numerics", "q8a"]),
    "llama-iq2_xs": ("llama", "olmoe-iq2_xs.gguf", "iq2_xs", ["--repack", "off"]),
}
GROUP_REF = {"int4": "store-int4", "int8": "store-int8", "q4_k": "store-gguf-q4_k",
             "iq2_xs": "store-gguf-iq2_xs"}


def store_sizes(coli: str, store: str) -> tuple[int, int, int]:
    """(dense.bin bytes, routed expert record bytes, mean record bytes) from `coli info --json`."""
    p = subprocess.run([coli, "info", store, "--json"], capture_output=True, text=True, check=True)
    c = json.loads(p.stdout)["classes"]["routed_experts"]
    return os.path.getsize(os.path.join(store, "dense.bin")), c["bytes"], c["bytes"] // c["count"]


def coli_budget_measured(limit: int, dense: int, record: int, fit: dict) -> int:
    """coli's --ram-budget B for a cgroup of `limit` bytes from its measured overhead: `fit`
    (`calibrate_overhead`) models the overhead at budget B as a + b B (bytes), and B is the
    largest budget with dense.bin + B + 1.1 (a + b B) + 16 MiB <= limit, times record / held
    bytes per record (as `coli_budget`)."""
    held = -(-record // 4096) * 4096
    a, b = fit["overhead_at_0"], fit["overhead_per_budget_byte"]
    budget = (limit - dense - 1.1 * a - 16 * MiB) / (1 + 1.1 * b)
    if budget < 16 * MiB:
        sys.exit(f"a limit of {limit} bytes does not hold dense.bin ({dense}), coli's measured overhead "
                 f"({a:.0f} + {b:.3f} x budget) x 1.1 + 16 MiB and a 16 MiB expert budget")
    return int(budget) * record // held


def coli_budget(limit: int, dense: int, record: int) -> int:
    """coli's --ram-budget for a cgroup of `limit` bytes: what is left after dense.bin and
    384 MiB (KV cache at --context 512 = 128 MiB on the OLMoE shape, code, heap, reads in
    flight), times record / held bytes per record. Since f6c4acf a record buffer is its length
    rounded up to the page size and the expert cache charges exactly that (`held_bytes_for`,
    store/src/io/mod.rs), so the factor is 1 for page-multiple records (OLMoE's), and at the
    whole-model limit the budget holds every expert: coli preloads them all at start. (Before
    f6c4acf buffers of 2 MiB or more were rounded up to 2 MiB multiples while the cache charged
    the record length: an int4 record of 3.375 MiB held 4 MiB, and this function scaled the
    budget down by record / held; with a flat 384 MiB margin, first run
    results/2026-12-01-streaming-olmoe-run1.txt, coli filled its cgroup at 50% and re-read
    evicted dense.bin pages.)"""
    held = -(-record // 4096) * 4096
    return max((limit - dense - OVERHEAD) * record // held, 16 * MiB)


def run_in_cgroup(name: str, limit: int, cmd: list, env=None) -> dict:
    """Runs cmd in a fresh memory cgroup of `limit` bytes, cold; returns stdout, rc, wall time,
    read_bytes (rusage), peak cgroup memory, OOM kills."""
    cg = os.path.join(CG, f"coli-bench-{name}-{os.getpid()}")
    if os.path.isdir(cg):
        os.rmdir(cg)
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        dropped = drop_caches()
        out = tempfile.TemporaryFile()
        err = tempfile.TemporaryFile()

        def enter():
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write("0")

        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, preexec_fn=enter, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)

        def rd(f):
            with open(os.path.join(cg, f)) as h:
                return h.read()

        oom = 0
        for line in rd("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                oom = int(line.split()[1])
        return {
            "rc": p.returncode, "stdout": out.read().decode(), "stderr": err.read().decode()[-4000:],
            "wall_s": wall, "read_bytes": ru.ru_inblock * 512, "maxrss_bytes": ru.ru_maxrss * 1024,
            "cpu_s": ru.ru_utime + ru.ru_stime, "peak_cgroup_bytes": int(rd("memory.max_usage_in_bytes")),
            "failcnt": int(rd("memory.failcnt")), "oom_kills": oom, "dropped_caches": dropped,
        }
    finally:
        # Charges of the page cache left behind move to the parent when the group is removed.
        for _ in range(50):
            try:
                os.rmdir(cg)
                break
            except OSError:
                time.sleep(0.1)


def calibrate_overhead(a, name, path, w, ids, usage, extra) -> dict:
    """coli's memory beyond dense.bin and its expert cache on store `path` for workload `w`,
    measured at two budgets and fitted as a line: two cold runs in a memory cgroup that does not
    constrain them (the whole store + 1 GiB), with an expert budget of 10% and of 40% of the
    experts (at least 16 MiB), each of which the run must fill (it must evict: a cache never
    filled would leave part of its budget unused and the overhead undercounted); overhead =
    peak cgroup memory - dense.bin - the budget (the KV cache, the activations, reads in flight,
    the code and the heap, and whatever grows with the cache: the first fit, one point at 10%,
    undercounted a run at 271 MiB by 10 MiB). The line through the two points, its slope
    clamped at 0, is `overhead_at_0` + `overhead_per_budget_byte` x budget."""
    dense, experts, _ = store_sizes(a.coli, path)
    points = []
    for share in (10, 40):
        budget = max(experts * share // 100, 16 * MiB)
        u = usage + ".calibrate"
        shutil.copy(usage, u)
        res = run_in_cgroup(name + "-cal", dense + experts + 1024 * MiB,
                            coli_cmd(a, path, w, ids, budget, u, extra))
        if res["rc"] != 0:
            sys.exit(f"{name} calibration run failed: {res['stderr']}")
        s = json.loads(res["stdout"].strip().splitlines()[-1])["stats"]
        if s["evictions"] == 0:
            sys.exit(f"{name} {w}: the calibration run at budget {budget} evicted nothing, so its cache may not "
                     f"have filled and its overhead would be undercounted")
        points.append({"budget": budget, "peak_cgroup_bytes": res["peak_cgroup_bytes"],
                       "overhead_bytes": res["peak_cgroup_bytes"] - dense - budget,
                       "evictions": s["evictions"], "hit_rate": s["hit_rate"]})
    (b1, o1), (b2, o2) = ((p["budget"], p["overhead_bytes"]) for p in points)
    if b2 <= b1:
        sys.exit(f"{name}: the store's experts ({experts} bytes) are too few for two calibration budgets")
    slope = max((o2 - o1) / (b2 - b1), 0.0)
    if min(o1, o2) <= 0 or o1 - slope * b1 <= 0:
        sys.exit(f"{name} {w}: calibration points {points} give no positive overhead: peak cgroup memory did not "
                 f"count dense.bin and the budget, so the margin cannot be measured this way")
    return {"calibrate": name, "workload": w, "dense_bytes": dense, "points": points,
            "overhead_at_0": o1 - slope * b1, "overhead_per_budget_byte": slope}


def fio_bandwidth(store: str, block: int, qd: int, seconds: int = 5, jobs: int = 2) -> float:
    """Random O_DIRECT reads (io_uring) over the store's segment files: GiB/s. Two jobs of
    depth `qd` by default: coli reads a layer's demand misses and the lookahead's prefetch on two
    threads, each with up to `qd` reads in flight (one job at qd 4 measured ~0.7 GiB/s here while
    coli read at ~1.2 GiB/s)."""
    seg_dir = os.path.join(store, "segments")
    files = ":".join(os.path.join(seg_dir, f) for f in sorted(os.listdir(seg_dir)))
    bs = (block + 4095) // 4096 * 4096
    p = subprocess.run(["fio", "--name=coli", f"--filename={files}", "--rw=randread", f"--bs={bs}",
                        "--direct=1", "--ioengine=io_uring", f"--iodepth={qd}", "--runtime=" + str(seconds),
                        "--time_based", "--readonly", f"--numjobs={jobs}", "--group_reporting",
                        "--output-format=json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"fio failed: {p.stderr}")
    j = json.loads(p.stdout)
    return j["jobs"][0]["read"]["bw_bytes"] / 2**30


def coli_cmd(a, store, workload, ids, budget, usage, extra=()):
    cmd = [a.coli, "run", "--store", store, "--prompt-ids", ",".join(map(str, ids)), "--ram-budget",
           str(budget), "--context", str(CONTEXT), "--threads", str(a.threads), "--usage", usage, "--json"]
    if workload == "decode":
        cmd += ["--max-tokens", str(a.decode_tokens)]
    else:
        cmd += ["--max-tokens", "1", "--prefill-batch", "1"]
    return cmd + list(extra)


def llama_cmd(a, gguf, workload, ids, extra):
    cmd = [a.llama_python, os.path.join(ROOT, "engine", "bench", "llamacpp_run.py"), "--model", gguf,
           "--workload", workload, "--prompt-ids", ",".join(map(str, ids)), "--threads", str(a.threads),
           "--ctx", str(CONTEXT), "--mmap", "on"] + list(extra)
    if workload == "decode":
        cmd += ["--max-tokens", str(a.decode_tokens)]
    return cmd


def summarize(kind, workload, res, n_tokens):
    """Common figures from one run's JSON (coli --json or llamacpp_run.py)."""
    j = json.loads(res["stdout"].strip().splitlines()[-1])
    if kind == "coli":
        s = j["stats"]
        tokens = j["token_ids"]
        if workload == "decode":
            tok_s, ttft = s["decode_tok_s"], s["ttft_s"]
        else:
            tok_s, ttft = s["prompt_tokens"] / s["prefill_s"], None
        extra = {"hit_rate": s["hit_rate"], "coli_expert_bytes_per_token": s["expert_bytes_per_token"],
                 "coli_expert_bytes_read": s["expert_bytes_read"], "io_wait_s": s.get("io_wait_s"),
                 "load_s": s["load_s"], "queue_depth": s["queue_depth"]}
    else:
        tokens = j["tokens"]
        tok_s, ttft = j["decode_tok_s"], j.get("ttft_s")
        extra = {"load_s": j.get("load_s"), "rss_peak_bytes": j.get("rss_peak_bytes")}
    return dict(tok_s=tok_s, ttft_s=ttft, tokens=tokens, read_bytes_per_token=res["read_bytes"] / n_tokens,
                **extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limits", default="10,50,100", help="percent of the experts held, besides dense")
    ap.add_argument("--decode-tokens", type=int, default=24)
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--workloads", default="decode,stream")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--coli", default=os.path.join(ROOT, "target", "release", "coli"))
    ap.add_argument("--llama-python", default="/work/venv-llama/bin/python")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--gguf-prefix", default="olmoe",
                    help="the GGUFs are PREFIX-q4_0.gguf / PREFIX-q8_0.gguf in the bench dir (qwen35: qwen35_gguf.py)")
    ap.add_argument("--coli-margin", choices=["measured", "flat"], default="measured",
                    help="coli's --ram-budget at a limit: the limit less dense.bin and its overhead measured by "
                         "calibration runs (x 1.1 + 16 MiB), or less the flat 384 MiB (runs before 2026-12-07)")
    ap.add_argument("--bounds-from", help="reuse the bounds lines of an earlier results file of this script")
    ap.add_argument("--limit-group", choices=sorted(GROUP_REF),
                    help="run every engine at this group's limits (equal memory across encodings, e.g. an IQ2_XS "
                         "store at int4's limits); default: each engine at its own group's")
    a = ap.parse_args()
    if not os.path.isdir(CG):
        sys.exit(f"{CG}: no cgroup-v1 memory controller here")

    log = open(a.out, "w")

    def emit(obj):
        line = json.dumps(obj) if not isinstance(obj, str) else obj
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    emit(f"# streaming_bench.py {' '.join(sys.argv[1:])}")
    emit(f"# host {os.uname().nodename}, {os.cpu_count()} CPUs, git {git.stdout.strip()}, "
         f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    engines = []
    for name in a.engines.split(","):
        kind, f, group, extra = ENGINES[name]
        if kind == "llama":
            f = f.replace("olmoe-", a.gguf_prefix + "-", 1)
        path = os.path.join(a.bench_dir, f)
        if not os.path.exists(path):
            emit(f"# skipped {name}: {path} missing")
            continue
        engines.append((name, kind, path, group, extra))
    rng = random.Random(a.seed)
    # The vocabulary of the model: store-int4's config, else the first coli engine's store's.
    cfg_store = os.path.join(a.bench_dir, "store-int4")
    if not os.path.isdir(cfg_store):
        cfg_store = next(p for _, k, p, _, _ in engines if k == "coli")
    with open(os.path.join(cfg_store, "files", "config.json")) as f:
        cfg = json.load(f)
        vocab = cfg["vocab_size"] if "vocab_size" in cfg else cfg["text_config"]["vocab_size"]
    prompt = [rng.randrange(vocab) for _ in range(8)]
    stream_ids = [rng.randrange(vocab) for _ in range(a.stream_tokens)]
    learn_ids = [rng.randrange(vocab) for _ in range(256)]
    emit({"prompt_ids": prompt, "stream_ids": stream_ids})

    groups = {}
    for g, ref in GROUP_REF.items():
        p = os.path.join(a.bench_dir, ref)
        if os.path.isdir(p):
            dense, experts, rec = store_sizes(a.coli, p)
            groups[g] = {p_: dense + experts * int(p_) // 100 + OVERHEAD for p_ in a.limits.split(",")}
            emit({"group": g, "ref_store": ref, "dense_bytes": dense, "expert_bytes": experts,
                  "record_bytes": rec, "limits": groups[g]})

    if a.limit_group and a.limit_group not in groups:
        sys.exit(f"--limit-group {a.limit_group}: its reference store {GROUP_REF[a.limit_group]} is not in {a.bench_dir}")

    tmp = tempfile.mkdtemp(prefix="coli-bench-")
    usage = {}
    # Usage histories learned on other ids (teacher forcing), once per store.
    for name, kind, path, group, extra in engines:
        if kind == "coli":
            usage[name] = os.path.join(tmp, f"usage-{name}.json")
            subprocess.run(coli_cmd(a, path, "stream", learn_ids, 1 << 40, usage[name], ["--no-pin", *extra]),
                           capture_output=True, check=True)
    # coli's measured overhead per store and workload (--coli-margin measured).
    overhead = {}
    if a.coli_margin == "measured":
        for name, kind, path, group, extra in engines:
            if kind != "coli":
                continue
            for w in a.workloads.split(","):
                c = calibrate_overhead(a, name, path, w, prompt if w == "decode" else stream_ids, usage[name], extra)
                overhead[(name, w)] = c
                emit(c)
    # Bounds: fio and everything resident, per coli store.
    bounds = {}
    if a.bounds_from:
        for line in open(a.bounds_from):
            if line.startswith('{"bounds"'):
                b = json.loads(line)
                name = b.pop("bounds")
                bounds[name] = b
                emit({"reused_bounds": name, "from": a.bounds_from, **b})
    for name, kind, path, group, extra in engines:
        if kind != "coli" or name in bounds:
            continue
        dense, experts, rec = store_sizes(a.coli, path)
        qd = 0
        b = {"fio_gib_s": None, "compute_tok_s": {}}
        for w in a.workloads.split(","):
            ids = prompt if w == "decode" else stream_ids
            vals = []
            for _ in range(a.reps):
                saved = usage[name] + ".resident"
                shutil.copy(usage[name], saved)
                r = subprocess.run(coli_cmd(a, path, w, ids, experts + 64 * MiB, saved, ["--pin-share", "1.0", *extra]),
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{name} resident run failed: {r.stderr}")
                s = summarize("coli", w, {"stdout": r.stdout, "read_bytes": 0}, 1)
                vals.append(s["tok_s"])
                qd = s["queue_depth"]
            b["compute_tok_s"][w] = statistics.median(vals)
        b["fio_gib_s"] = fio_bandwidth(path, rec, qd or 8)
        b["fio_block"], b["fio_qd"], b["fio_jobs"] = rec, qd, 2
        bounds[name] = b
        emit({"bounds": name, **b})

    results = []
    reference_tokens = {}
    failures = []
    for limit_p in a.limits.split(","):
        for rep in range(a.reps):
            for w in a.workloads.split(","):
                ids = prompt if w == "decode" else stream_ids
                n_tokens = len(ids) + (a.decode_tokens - 1 if w == "decode" else 0)
                for name, kind, path, group, extra in engines:
                    if group not in groups:
                        continue
                    if name.endswith("-repack") and limit_p != "100":
                        continue
                    limit = groups[a.limit_group or group][limit_p]
                    if kind == "coli":
                        dense, experts, rec = store_sizes(a.coli, path)
                        if a.coli_margin == "measured":
                            budget = coli_budget_measured(limit, dense, rec, overhead[(name, w)])
                        else:
                            budget = coli_budget(limit, dense, rec)
                        u = os.path.join(tmp, f"u-{name}-{limit_p}-{rep}-{w}.json")
                        shutil.copy(usage[name], u)
                        cmd = coli_cmd(a, path, w, ids, budget, u, extra)
                    else:
                        budget = None
                        cmd = llama_cmd(a, path, w, ids, extra)
                    subprocess.run(["uptime"], stdout=log)
                    res = run_in_cgroup(name, limit, cmd)
                    row = {"engine": name, "limit_pct": int(limit_p), "limit_bytes": limit, "rep": rep,
                           "workload": w, "budget": budget, "rc": res["rc"], "wall_s": res["wall_s"],
                           "read_bytes": res["read_bytes"], "peak_cgroup_bytes": res["peak_cgroup_bytes"],
                           "oom_kills": res["oom_kills"], "cpu_s": res["cpu_s"], "maxrss_bytes": res["maxrss_bytes"],
                           "dropped_caches": res["dropped_caches"]}
                    if kind == "coli":
                        # What the run held beyond dense.bin and its budget (capped at what every
                        # expert takes), against the calibration's prediction.
                        row["overhead_bytes"] = res["peak_cgroup_bytes"] - dense - min(budget, experts)
                    if res["rc"] == 0:
                        row.update(summarize(kind, w, res, n_tokens))
                        if kind == "coli":
                            key = (name, w)
                            ref = reference_tokens.setdefault(key, row["tokens"])
                            if row["tokens"] != ref:
                                failures.append(f"{name} {w} limit {limit_p}%: tokens differ {row['tokens']} vs {ref}")
                    else:
                        row["stderr"] = res["stderr"][-600:]
                    results.append(row)
                    emit(row)

    log.close()
    # The tables (streaming_report.py over this run's file), on stdout.
    streaming_report.main([a.out])
    log = open(a.out, "a")
    for f_ in failures:
        emit(f"# PLACEMENT INVARIANCE FAILED: {f_}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
