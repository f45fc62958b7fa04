#!/usr/bin/env python3
"""Issue 19 "Long prompts": time to first token of long prompts on a streamed store, next to its
bound measured in the same run.

    prefill_bench.py [--store DIR] [--coli PATH] [--lengths 512,2048] [--reps 2] [--long 8192]
        [--long-max-s 600] [--compare 2048:32] [--room LENGTHS] [--expert-share 0.25]
        [--threads 2] [--seed 19] [--probe-mib 1024] [--usage FILE | --no-learn]
        [--out FILE.json] [--dry-run] [-- EXTRA COLI RUN ARGS...]

Method (engine/bench/README.md, "Issue 19: long prompts"):
- prompts: one sequence of token ids drawn from a seeded PRNG (`random.Random(--seed)`, uniform
  in the model's vocabulary); a prompt of N tokens is its first N ids, fed with
  `coli run --prompt-ids ... --max-tokens 1 --json --speculate off --direct on`
  at `--context N + 8` (the store's max_position_embeddings must cover it);
- memory: every run is a fresh process in its own cgroup-v1 memory cgroup (streaming_bench's
  `run_in_cgroup`: RSS and page cache counted, page cache dropped first) of dense.bin +
  --expert-share of the routed expert bytes + streaming_bench's process overhead (384 MiB) +
  the KV cache of one sequence at that context (`kv_bytes_per_token` of `coli plan --json` x
  context); `--ram-budget` = streaming_bench.coli_budget(limit - KV, ...), as serve_bench fits it;
- usage history: learned once (no cgroup, every expert resident, --no-pin) by a 512-token prefill
  of other ids; every measured run gets a fresh copy (`--usage`), so every run pins the same
  experts (`--no-learn`: an empty history, `--usage FILE`: that file);
- the bound, per run: right before it, in a fresh cgroup of the same limit, `coli plan` with the
  run's engine options and `--probe-mib` (its disk probe: expert records spread over the store,
  read with `Store::fetch`, O_DIRECT, checksums off, 4 at a time, until --probe-mib MiB or 3 s)
  gives the disk bandwidth B (`disk_gib_s`); bound = max(expert_bytes_read / B, compute_s) with
  expert_bytes_read and compute_s (prefill + decode seconds not waiting for expert reads) from
  the run's own JSON; ratio = ttft_s / bound (target: <= 1.5 at 2048 tokens);
- the prefill chunk: `--prefill-batch` when given, else what the engine chose from its memory plan
  (`placement::budget::prefill_chunk`), as `coli run --json` reports it (`stats.prefill_batch`),
  checked against the run: expert requests (hits + misses) / (passes x MoE layers) is the mean
  union of experts a chunk's tokens route to, which cannot exceed the expert count;
- order: for each rep, every --lengths prompt (default chunk) in turn, the order reversed on odd
  reps; then each --compare LEN:BATCH (e.g. 2048:32, the old default) once (skipped when the
  default runs of LEN already used chunks of BATCH: the same run) and each --room LEN (the cgroup
  enlarged by what the plan needs to choose min(LEN, MAX_CHUNK) rows, + 64 MiB; the expert budget
  unchanged) once;
  then each --long length once, skipped when a linear extrapolation of the longest measured
  default prompt's TTFT exceeds --long-max-s (a lower bound: attention grows with the square);
- correctness: the chunk never changes results, so every run of a length must give the same
  first token (exit 1 otherwise);
- --resume: the successful runs already in --out (same store, seed, ids, share, extra options) are
  kept and the plan goes on with the others (the usage history is learned again: the same ids
  give the same counts; or pass --usage).

Output: the table on stdout; every run (commands with the ids elided, cgroup figures, the plan's
and the run's whole JSON) in --out, rewritten after every run. Python 3 standard library only;
root for cgroups and drop_caches.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import streaming_bench  # noqa: E402  (CG, OVERHEAD, store_sizes, coli_budget, run_in_cgroup)

MiB = 1 << 20
GiB = 1 << 30
# engine/src/placement/budget.rs
BUDGET_RESERVE = 512 * MiB
# MAX_AUTO_PREFILL_CHUNK: the largest chunk the memory plan chooses.
MAX_CHUNK = 512
# Context beyond the prompt.
CONTEXT_PAD = 8
# Added to --room's cgroup beyond the activation rows: the cgroup's usage when the engine reads
# its memory limit (binary, libraries, early heap).
ROOM_MARGIN = 64 * MiB
LEARN_TOKENS = 512


def prefill_row_bytes(cfg: dict) -> int:
    """placement::budget::prefill_row_bytes for a GQA model (Mixtral, Qwen3-MoE, OLMoE): f32
    residual stream, norm output and delta (3 H), q/k/v/context (2 heads x head_dim + 2 kv_heads x
    head_dim), the top-k experts' inputs, gate/up products and outputs (2 H + 2 I each) plus a
    dense MLP's (2 H + 2 intermediate_size), a logits row."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or h // heads
    moe_i = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    top_k = cfg["num_experts_per_tok"]
    attn = 2 * heads * head_dim + 2 * kv_heads * head_dim
    experts = top_k * (2 * h + 2 * moe_i) + (2 * h + 2 * cfg.get("intermediate_size", 0))
    return (3 * h + attn + experts + cfg["vocab_size"]) * 4


def busy_cpu_s() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat: user, nice,
    system, irq, softirq, steal), to tell how much CPU others took during a run."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def elide(cmd: list) -> list:
    """The command with the --prompt-ids value shortened (the ids are saved once)."""
    out = list(cmd)
    if "--prompt-ids" in out:
        i = out.index("--prompt-ids") + 1
        out[i] = f"<{out[i].count(',') + 1} ids: prompt_ids[:N]>"
    return out


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 usage="%(prog)s [options] [-- EXTRA COLI RUN ARGS...]")
    ap.add_argument("--store", default="/work/bench-olmoe/store-int4-serve")
    ap.add_argument("--coli", default=os.path.join(ROOT, "target", "release", "coli"))
    ap.add_argument("--lengths", default="512,2048", help="prompt lengths run --reps times, interleaved")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--long", default="8192", help="prompt lengths run once, last ('' for none)")
    ap.add_argument("--long-max-s", type=float, default=600,
                    help="skip a --long length whose extrapolated TTFT exceeds this")
    ap.add_argument("--compare", default="2048:32",
                    help="LEN:BATCH,... runs once each with --prefill-batch BATCH ('' for none)")
    ap.add_argument("--room", default="",
                    help="LEN,... runs once each in a cgroup with room for min(LEN, 2048) prefill rows")
    ap.add_argument("--expert-share", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--probe-mib", type=int, default=1024, help="coli plan's disk probe size (3 s at most)")
    ap.add_argument("--usage", help="usage history copied in for every run (default: learned)")
    ap.add_argument("--no-learn", action="store_true", help="an empty usage history")
    ap.add_argument("--run-timeout", type=int, default=1200, help="seconds; a run past it is killed")
    ap.add_argument("--target", type=float, default=1.5, help="TTFT / bound target at --target-length")
    ap.add_argument("--target-length", type=int, default=2048)
    ap.add_argument("--out", help="raw JSON of every run")
    ap.add_argument("--resume", action="store_true",
                    help="keep the successful runs already in --out (same store, seed and lengths) and run the rest")
    ap.add_argument("--dry-run", action="store_true", help="print the plan of runs and the commands only")
    a = ap.parse_args(argv)
    if "--prefill-batch" in extra or "--usage" in extra or "--context" in extra or "--ram-budget" in extra:
        sys.exit("--prefill-batch, --usage, --context and --ram-budget are the script's")

    with open(os.path.join(a.store, "files", "config.json")) as f:
        cfg = json.load(f)
    vocab, max_pos = cfg["vocab_size"], cfg.get("max_position_embeddings")
    lengths = [int(x) for x in a.lengths.split(",") if x]
    longs = [int(x) for x in a.long.split(",") if x]
    compares = [tuple(int(y) for y in x.split(":")) for x in a.compare.split(",") if x]
    rooms = [int(x) for x in a.room.split(",") if x]
    n_max = max(lengths + longs + [c[0] for c in compares] + rooms)
    if max_pos is not None and n_max + CONTEXT_PAD > max_pos:
        sys.exit(f"{n_max} + {CONTEXT_PAD} tokens exceed max_position_embeddings {max_pos}")
    rng = random.Random(a.seed)
    prompt = [rng.randrange(vocab) for _ in range(n_max)]
    rng_learn = random.Random(a.seed + 1)
    learn_ids = [rng_learn.randrange(vocab) for _ in range(LEARN_TOKENS)]
    row = prefill_row_bytes(cfg)
    n_layers_moe = cfg["num_hidden_layers"]  # every layer is MoE in the GQA families benchmarked here
    n_experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")

    # The runs, in order: (name, length, prefill batch or None, room?)
    plan = []
    for rep in range(a.reps):
        order = lengths if rep % 2 == 0 else lengths[::-1]
        plan += [("default", n, None, False, rep) for n in order]
    plan += [(f"batch{b}", n, b, False, 0) for n, b in compares]
    plan += [("room", n, None, True, 0) for n in rooms]
    plan += [("default", n, None, False, 0) for n in longs]

    def engine_args(n, budget, batch):
        args = ["--store", a.store, "--ram-budget", str(budget), "--context", str(n + CONTEXT_PAD),
                "--threads", str(a.threads), "--direct", "on"]
        if batch:
            args += ["--prefill-batch", str(batch)]
        return args + extra

    def run_cmd(n, budget, batch, usage):
        return ([a.coli, "run"] + engine_args(n, budget, batch)
                + ["--prompt-ids", ",".join(map(str, prompt[:n])), "--max-tokens", "1", "--json",
                   "--speculate", "off", "--usage", usage])

    def plan_cmd(n, budget, batch, usage, probe):
        return ([a.coli, "plan"] + engine_args(n, budget, batch)
                + ["--usage", usage, "--probe-mib", str(probe), "--json"])

    if a.dry_run:
        print(f"# {len(plan)} runs (+ as many `coli plan` probes), store {a.store}, "
              f"max_position_embeddings {max_pos}, vocab {vocab}, prefill row {row} B")
        for name, n, b, room, rep in plan:
            print(f"# {name} {n} tokens rep {rep}" + (" (room)" if room else "") + ":")
            print("  " + " ".join(elide(plan_cmd(n, "BUDGET", b, "USAGE", a.probe_mib))))
            print("  " + " ".join(elide(run_cmd(n, "BUDGET", b, "USAGE"))))
        return 0
    if not os.path.isdir(streaming_bench.CG):
        sys.exit(f"{streaming_bench.CG}: no cgroup-v1 memory controller here")
    if not os.path.exists(a.coli):
        sys.exit(f"{a.coli} missing: cargo build --release -p coli-tools")

    dense, experts, rec = streaming_bench.store_sizes(a.coli, a.store)
    p = subprocess.run([a.coli, "plan", "--store", a.store, "--probe-mib", "0", "--json"],
                       capture_output=True, text=True, check=True)
    kv_per_token = json.loads(p.stdout)["kv_bytes_per_token"]
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip() != ""
    import hashlib
    with open(a.coli, "rb") as f:
        coli_sha = hashlib.sha256(f.read()).hexdigest()
    meta = {
        "script": "prefill_bench.py", "argv": sys.argv[1:], "store": os.path.abspath(a.store),
        "coli": a.coli, "coli_sha256": coli_sha,
        "coli_mtime_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.path.getmtime(a.coli))), "host": os.uname().nodename, "cpus": os.cpu_count(),
        "git": git.stdout.strip() + ("-dirty" if dirty else ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "max_position_embeddings": max_pos, "vocab_size": vocab, "dense_bytes": dense,
        "expert_bytes": experts, "record_bytes": rec, "kv_bytes_per_token": kv_per_token,
        "prefill_row_bytes": row, "expert_share": a.expert_share, "overhead_bytes": streaming_bench.OVERHEAD,
        "seed": a.seed, "prompt_ids": prompt, "learn_ids": learn_ids, "extra_args": extra,
    }
    out = {"meta": meta, "runs": [], "skipped": []}
    done_keys = set()
    if a.resume and a.out and os.path.exists(a.out):
        with open(a.out) as f:
            old = json.load(f)
        om = old["meta"]
        for k in ("store", "seed", "prompt_ids", "learn_ids", "expert_share", "extra_args", "coli_sha256"):
            if om.get(k) != meta[k]:
                sys.exit(f"--resume: {a.out} was made with another {k}")
        out["runs"] = [r for r in old["runs"] if r.get("rc") == 0]
        done_keys = {(r["variant"], r["length"], r["rep"]) for r in out["runs"]}
        meta["resumed_from"] = [{k: om.get(k) for k in ("date_utc", "git", "argv")}] + om.get("resumed_from", [])
        meta["date_utc_first"] = om.get("date_utc_first", om.get("date_utc"))

    def save():
        if a.out:
            tmp_out = a.out + ".tmp"
            with open(tmp_out, "w") as f:
                json.dump(out, f)
            os.replace(tmp_out, a.out)

    print(f"# prefill_bench.py {' '.join(sys.argv[1:])}")
    print(f"# store {a.store}, git {meta['git']}, {meta['cpus']} CPUs, {meta['date_utc']} UTC")
    print(f"# coli {a.coli}: built {meta['coli_mtime_utc']} UTC, sha256 {coli_sha[:16]}")
    print(f"# dense {dense / MiB:.1f} MiB, experts {experts / MiB:.1f} MiB ({rec / MiB:.3f} MiB/record), "
          f"KV {kv_per_token / 1024:.0f} KiB/token, prefill row {row / 1024:.1f} KiB, "
          f"max_position_embeddings {max_pos}")
    print(f"# prompt: {n_max} ids from random.Random({a.seed}), {len(set(prompt))} distinct; usage history "
          f"learned on {LEARN_TOKENS} ids from random.Random({a.seed + 1})")

    tmp = tempfile.mkdtemp(prefix="coli-prefill-bench-")
    usage_src = a.usage
    meta["usage_source"] = a.usage or ("empty" if a.no_learn else "learned")
    if not usage_src and not a.no_learn:
        usage_src = os.path.join(tmp, "usage-learned.json")
        cmd = [a.coli, "run", "--store", a.store, "--prompt-ids", ",".join(map(str, learn_ids)),
               "--max-tokens", "1", "--json", "--speculate", "off", "--ram-budget", str(experts + 64 * MiB),
               "--no-pin", "--context", str(LEARN_TOKENS + CONTEXT_PAD), "--threads", str(a.threads),
               "--usage", usage_src]
        t0 = time.monotonic()
        subprocess.run(cmd, capture_output=True, check=True)
        meta["usage_learn"] = {"cmd": elide(cmd), "wall_s": time.monotonic() - t0}
        print(f"# usage history learned on {LEARN_TOKENS} other ids in {meta['usage_learn']['wall_s']:.1f} s")

    failures = []
    first_token = {}
    for name, n, batch, room, rep in plan:
        if (name, n, rep) in done_keys:
            r = next(r for r in out["runs"] if (r["variant"], r["length"], r["rep"]) == (name, n, rep))
            print(f"# {name:8s} {n:5d} tok rep {rep}: kept from {a.out} (TTFT {r['ttft_s']:.2f} s)", flush=True)
            continue
        if batch:
            same = [r for r in out["runs"] if r["variant"] == "default" and r["length"] == n and r.get("chunk")]
            if same and all(r["chunk"] == batch for r in same):
                msg = (f"{name} at {n} tokens skipped: the default runs of {n} tokens already prefilled in "
                       f"chunks of {batch} (the same command but for --prefill-batch)")
                print(f"# {msg}", flush=True)
                out["skipped"].append(msg)
                save()
                continue
        if name == "default" and n in longs and rep == 0 and n not in lengths:
            done = [r for r in out["runs"] if r["variant"] == "default" and r.get("ttft_s")]
            if done:
                ref_n = max(r["length"] for r in done)
                ref_t = statistics.median(r["ttft_s"] for r in done if r["length"] == ref_n)
                est = ref_t * n / ref_n
                if est > a.long_max_s:
                    msg = (f"{n} tokens skipped: {ref_t:.0f} s at {ref_n} tokens extrapolates to "
                           f">= {est:.0f} s > --long-max-s {a.long_max_s:.0f}")
                    print(f"# {msg}", flush=True)
                    out["skipped"].append(msg)
                    save()
                    continue
        context = n + CONTEXT_PAD
        kv = kv_per_token * context
        limit_base = dense + int(experts * a.expert_share) + streaming_bench.OVERHEAD + kv
        budget = streaming_bench.coli_budget(limit_base - kv, dense, rec)
        base_free = limit_base - dense - budget - kv - BUDGET_RESERVE
        extra_room = max(0, min(n, MAX_CHUNK) * row + ROOM_MARGIN - base_free) if room else 0
        limit = limit_base + extra_room
        usage = os.path.join(tmp, f"usage-{name}-{n}-{rep}.json")
        if usage_src and os.path.exists(usage_src):
            shutil.copy(usage_src, usage)
        pcmd = plan_cmd(n, budget, batch, usage, a.probe_mib)
        pres = streaming_bench.run_in_cgroup(f"prefill-plan-{n}", limit, pcmd)
        if pres["rc"] != 0:
            sys.exit(f"coli plan failed ({pres['rc']}): {pres['stderr'][-2000:]}")
        pj = json.loads(pres["stdout"])
        if usage_src and os.path.exists(usage_src):
            shutil.copy(usage_src, usage)  # plan does not write it, but start equal regardless
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        cmd = run_cmd(n, budget, batch, usage)
        cpu0 = busy_cpu_s()
        res = streaming_bench.run_in_cgroup(f"prefill-{n}", limit,
                                            ["timeout", "-s", "KILL", str(a.run_timeout)] + cmd)
        other_cpu = busy_cpu_s() - cpu0 - res["cpu_s"]
        r = {"variant": name, "length": n, "rep": rep, "context": context, "prefill_batch_arg": batch,
             "room_bytes": extra_room, "cgroup_limit_bytes": limit, "kv_bytes": kv, "ram_budget": budget,
             "loadavg_before": load, "other_cpu_s": other_cpu, "cmd": elide(cmd), "plan_cmd": elide(pcmd), "plan": pj,
             "plan_cgroup": {k: v for k, v in pres.items() if k != "stdout"},
             **{k: res[k] for k in ("rc", "wall_s", "read_bytes", "maxrss_bytes", "cpu_s", "peak_cgroup_bytes",
                                    "failcnt", "oom_kills", "dropped_caches")}}
        if res["rc"] != 0:
            r["stderr"] = res["stderr"]
            out["runs"].append(r)
            save()
            failures.append(f"{name} {n} tokens rep {rep}: rc {res['rc']}: {res['stderr'][-300:]}")
            print(f"# {name} {n} rep {rep}: FAILED rc {res['rc']}: {res['stderr'][-300:]}", flush=True)
            continue
        j = json.loads(res["stdout"].strip().splitlines()[-1])
        s = j["stats"]
        bw = pj.get("disk_gib_s")
        free = (pj["memory_limit_bytes"] - pj["dense_bytes"] - pj["budget"] - pj["kv_bytes"] - BUDGET_RESERVE
                if pj.get("memory_limit_bytes") is not None else None)
        chunk = s["prefill_batch"]
        if batch and chunk != batch:
            failures.append(f"{name} {n} rep {rep}: --prefill-batch {batch} but the run reports chunks of {chunk}")
        passes = -(-n // chunk)
        requests = s["hits"] + s["misses"]
        io_s = s["expert_bytes_read"] / (bw * GiB) if bw else None
        bound = max(io_s, s["compute_s"]) if io_s is not None else None
        r.update({
            "result": j, "token_ids": j["token_ids"], "ttft_s": s["ttft_s"], "prefill_s": s["prefill_s"],
            "prefill_tok_s": s["prefill_tok_s"], "expert_bytes_read": s["expert_bytes_read"],
            "expert_bytes_per_prompt_token": s["expert_bytes_read"] / n, "io_wait_s": s["io_wait_s"],
            "io_hidden_s": s.get("io_hidden_s"), "compute_s": s["compute_s"], "disk_gib_s": s["disk_gib_s"],
            "hit_rate": s["hit_rate"], "load_s": s["load_s"], "probe_gib_s": bw,
            "plan_memory_limit_bytes": pj.get("memory_limit_bytes"), "plan_free_bytes": free,
            "chunk": chunk, "chunk_source": "--prefill-batch" if batch else "memory plan (stats.prefill_batch)",
            "passes": passes, "mean_union": requests / (passes * n_layers_moe),
            "io_s": io_s, "bound_s": bound, "ratio": s["ttft_s"] / bound if bound else None,
            "other_read_bytes": res["read_bytes"] - s["expert_bytes_read"] - dense,
        })
        if n_experts and r["mean_union"] > n_experts + 1e-9:
            failures.append(f"{name} {n} rep {rep}: {requests} expert requests over {passes} passes x "
                            f"{n_layers_moe} layers exceed {n_experts} experts per layer: the chunk is not {chunk}")
        ref = first_token.setdefault(n, (name, rep, j["token_ids"]))
        if j["token_ids"] != ref[2]:
            failures.append(f"{n} tokens: {name} rep {rep} gave {j['token_ids']}, {ref[0]} rep {ref[1]} "
                            f"gave {ref[2]}")
        out["runs"].append(r)
        save()
        print(f"# {name:8s} {n:5d} tok rep {rep}: TTFT {s['ttft_s']:.2f} s, bound {bound:.2f} s "
              f"(I/O {io_s:.2f} s at {bw:.2f} GiB/s, compute {s['compute_s']:.2f} s), chunk {chunk}, "
              f"{s['expert_bytes_read'] / GiB:.1f} GiB read, I/O wait {s['io_wait_s']:.2f} s, "
              f"peak {res['peak_cgroup_bytes'] / MiB:.0f}/{limit / MiB:.0f} MiB, CPU {res['cpu_s']:.0f} s "
              f"(others {other_cpu:.0f} s), load {' '.join(load)}",
              flush=True)

    report(out, a)
    for f_ in failures:
        print(f"# FAILED: {f_}")
    out["failures"] = failures
    save()
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


def report(out: dict, a) -> None:
    runs = [r for r in out["runs"] if r.get("ttft_s") is not None]
    groups = {}
    for r in runs:
        groups.setdefault((r["variant"], r["length"]), []).append(r)
    med = statistics.median

    def others(rs):
        v = [r.get("other_cpu_s") for r in rs]
        return "-" if None in v else f"{max(v):.0f}"
    print()
    print("| prompt | variant | runs | chunk | TTFT s (min-max) | bound s | I/O s | compute s | TTFT/bound "
          "| I/O wait s | prefill tok/s | expert MiB/prompt tok | GiB read | hit rate | probe GiB/s "
          "| run GiB/s | peak/limit MiB | CPU s (others) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (v, n), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0] != "default", kv[0][0])):
        t = [r["ttft_s"] for r in rs]
        rng = f" ({min(t):.1f}-{max(t):.1f})" if len(rs) > 1 else ""
        chunks = sorted({r["chunk"] for r in rs})
        print(f"| {n} | {v} | {len(rs)} | {'/'.join(map(str, chunks))} | {med(t):.2f}{rng} "
              f"| {med(r['bound_s'] for r in rs):.2f} | {med(r['io_s'] for r in rs):.2f} "
              f"| {med(r['compute_s'] for r in rs):.2f} | {med(r['ratio'] for r in rs):.2f} "
              f"| {med(r['io_wait_s'] for r in rs):.2f} | {med(r['prefill_tok_s'] for r in rs):.1f} "
              f"| {med(r['expert_bytes_per_prompt_token'] for r in rs) / MiB:.2f} "
              f"| {med(r['expert_bytes_read'] for r in rs) / GiB:.1f} | {med(r['hit_rate'] for r in rs):.3f} "
              f"| {med(r['probe_gib_s'] for r in rs):.2f} | {med(r['disk_gib_s'] for r in rs):.2f} "
              f"| {max(r['peak_cgroup_bytes'] for r in rs) / MiB:.0f}/{rs[0]['cgroup_limit_bytes'] / MiB:.0f} "
              f"| {med(r['cpu_s'] for r in rs):.0f} ({others(rs)}) |")
    for s in out["skipped"]:
        print(f"\n{s}")
    tgt = groups.get(("default", a.target_length))
    if tgt:
        ratio = med(r["ratio"] for r in tgt)
        print(f"\ntarget: TTFT <= {a.target}x bound at {a.target_length} tokens (default chunk): "
              f"{ratio:.2f}x -> {'PASS' if ratio <= a.target else 'FAIL'}")
    for (v, n), rs in sorted(groups.items()):
        if v == "default" or (("default", n) not in groups):
            continue
        d = groups[("default", n)]
        print(f"{v} vs default at {n} tokens: expert bytes read x"
              f"{med(r['expert_bytes_read'] for r in rs) / med(r['expert_bytes_read'] for r in d):.2f}, "
              f"TTFT x{med(r['ttft_s'] for r in rs) / med(r['ttft_s'] for r in d):.2f} "
              f"(chunk {rs[0]['chunk']} vs {d[0]['chunk']})")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
