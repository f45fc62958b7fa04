#!/usr/bin/env python3
"""TTFT of a follow-up turn after a restart: resumed from a KV cache file vs recomputed.

Issue "Conversations that survive" (docs/KV_CACHE.md). For each round:

1. a `coli serve --kv-dir D` server prefills a HISTORY-token prompt and generates 4 tokens (the
   finished sequence is written to D), then stops;
2. page cache dropped when permitted (`/proc/sys/vm/drop_caches`; the output says whether);
3. *resumed*: a new server on D gets the follow-up prompt (the history plus a new turn): its
   TTFT, expert bytes read, the KV file bytes and seconds read back (from /metrics);
4. *recomputed*: a `--no-kv-disk` server gets the same follow-up prompt;
   the two orders alternate between rounds. Both must give the same text (greedy).

Also: the file's sequential read bound (its bytes over the O_DIRECT read speed of the same file,
measured with dd) against the measured restore time, and the spill (write) time.

With --cgroup-expert-share F (e.g. 0.25, the issue's streaming setup; root, cgroup v1), every
server runs in a fresh memory cgroup of dense.bin + F x the expert bytes + 512 MiB (the reserve
coli serve requires) + the KV cache at the context, with `--ram-budget` as streaming_bench.coli_budget computes it, `--direct on`
and `--kv-cache-budget 0` (a restart empties RAM anyway), page cache dropped first.

Usage: prefix_cache_bench.py STORE [--history 2048] [--rounds 3] [--threads 2]
       [--cgroup-expert-share F] [--out FILE.json] [-- EXTRA SERVE ARGS]
(run from the repository root after `cargo build --release -p coli-tools`).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLI = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "coli")


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


CG = "/sys/fs/cgroup/memory"


class Server:
    def __init__(self, store, log, *args, cgroup_limit=None):
        self.log = open(log, "w")
        cmd = [COLI, "serve", "--store", store, "--port", "0", "--max-batch", "1", *args]
        self.cg = None
        enter = None
        if cgroup_limit:
            self.cg = os.path.join(CG, f"coli-prefix-bench-{os.getpid()}-{time.time_ns()}")
            os.mkdir(self.cg)
            with open(os.path.join(self.cg, "memory.limit_in_bytes"), "w") as f:
                f.write(str(cgroup_limit))
            cg = self.cg

            def enter():
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=enter)
        self.url = None
        deadline = time.time() + 120
        while self.url is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("coli serve did not start:\n" + open(log).read())
            for line in open(log):
                if "listening on http://" in line:
                    self.url = line.rsplit("listening on ", 1)[1].strip()
            time.sleep(0.1)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log.close()
        self.peak = None
        if self.cg:
            with open(os.path.join(self.cg, "memory.max_usage_in_bytes")) as f:
                self.peak = int(f.read())
            os.rmdir(self.cg)

    def metrics(self):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=60).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def complete(self, prompt_ids, max_tokens):
        """(TTFT s, text, usage) of a streamed greedy completion of token ids."""
        body = json.dumps({"model": "m", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.time()
        ttft, text, usage = None, "", None
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    if ttft is None:
                        ttft = time.time() - t0
                    text += ev["choices"][0].get("text", "")
                if ev.get("usage"):
                    usage = ev["usage"]
        return ttft, text, usage


def dd_read_gib_s(path):
    """O_DIRECT sequential read speed of `path` (dd), GiB/s; None when dd cannot."""
    p = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"],
                       capture_output=True, text=True)
    for line in p.stderr.splitlines():
        if "copied" in line:
            secs = float(line.split(",")[-2].split()[0])
            size = int(line.split()[0])
            return size / secs / 2**30 if secs > 0 else None
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--history", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cgroup-expert-share", type=float)
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="prefix-bench-")
    context = a.history + 256
    common = ["--model-id", "m", "--context", str(context), "--threads", str(a.threads), "--speculate", "off",
              *a.extra]
    limit = None
    setup = {"store": a.store, "context": context}
    if a.cgroup_expert_share:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import streaming_bench
        dense, experts, record = streaming_bench.store_sizes(COLI, a.store)
        info = json.loads(subprocess.run([COLI, "plan", "--store", a.store, "--context", str(context),
                                          "--probe-mib", "0", "--json", "--ram-budget", "1G"],
                                         capture_output=True, text=True, check=True).stdout)
        kv = info["kv_bytes"]
        # coli serve refuses to start unless dense + budget + KV + its 512 MiB reserve fit.
        limit = dense + int(a.cgroup_expert_share * experts) + 512 * 2**20 + kv
        # streaming_bench.coli_budget's flat margin is 384 MiB; the server keeps 512 MiB aside.
        budget = streaming_bench.coli_budget(limit - kv - 128 * 2**20, dense, record)
        common += ["--ram-budget", str(budget), "--direct", "on", "--kv-cache-budget", "0"]
        setup.update(cgroup_limit_bytes=limit, dense_bytes=dense, expert_bytes=experts, kv_bytes=kv,
                     ram_budget=budget, expert_share=a.cgroup_expert_share)
    print(json.dumps({"setup": setup}), flush=True)
    # Token ids of ordinary BPE pieces (SmolLM2 vocabulary: ids 300..8000), deterministic.
    history = [300 + (i * 7919) % 7700 for i in range(a.history)]
    follow = history + [300 + (i * 104729) % 7700 for i in range(24)]
    rows = []
    for rnd in range(a.rounds):
        kv = os.path.join(work, f"kv{rnd}")
        s = Server(a.store, os.path.join(work, "first.log"), "--kv-dir", kv, *common, cgroup_limit=limit)
        first_ttft, _, _ = s.complete(history, 4)
        # The finished sequence is written after the stream ends: wait for it.
        deadline = time.time() + 60
        m = s.metrics()
        while m.get("coli_kv_file_written_bytes_total", 0.0) == 0 and time.time() < deadline:
            time.sleep(0.1)
            m = s.metrics()
        s.stop()
        files = [f for f in os.listdir(kv) if f.endswith(".kv")]
        size = sum(os.path.getsize(os.path.join(kv, f)) for f in files)
        write_s = m.get("coli_kv_file_write_seconds_total", 0.0)
        gib_s = dd_read_gib_s(os.path.join(kv, files[0])) if files else None
        res = {}
        order = ["resumed", "recomputed"] if rnd % 2 == 0 else ["recomputed", "resumed"]
        for mode in order:
            dropped = drop_caches()
            args = ["--kv-dir", kv] if mode == "resumed" else ["--no-kv-disk"]
            s = Server(a.store, os.path.join(work, f"{mode}.log"), *args, *common, cgroup_limit=limit)
            m0 = s.metrics()
            ttft, text, usage = s.complete(follow, 8)
            m1 = s.metrics()
            s.stop()
            res[mode] = {
                "ttft_s": ttft, "text": text,
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "expert_bytes_read": m1["coli_expert_read_bytes_total"] - m0["coli_expert_read_bytes_total"],
                "kv_file_read_bytes": m1.get("coli_kv_file_read_bytes_total", 0.0),
                "kv_file_read_s": m1.get("coli_kv_file_read_seconds_total", 0.0),
                "pages_dropped": dropped,
                "peak_cgroup_bytes": s.peak,
            }
        same = res["resumed"]["text"] == res["recomputed"]["text"]
        row = {"round": rnd, "history_tokens": a.history, "first_ttft_s": first_ttft, "file_bytes": size,
               "spill_s": write_s, "file_read_gib_s_dd_direct": gib_s, **res,
               "ttft_ratio": res["resumed"]["ttft_s"] / res["recomputed"]["ttft_s"], "same_text": same}
        if gib_s:
            row["restore_bound_s"] = size / (gib_s * 2**30)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not same:
            print("resumed and recomputed texts differ", file=sys.stderr)
            sys.exit(1)
    ratios = sorted(r["ttft_ratio"] for r in rows)
    summary = {"median_ttft_ratio": ratios[len(ratios) // 2], "setup": setup, "rounds": rows}
    print(json.dumps({"median_ttft_ratio": summary["median_ttft_ratio"]}))
    if a.out:
        json.dump(summary, open(a.out, "w"), indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
