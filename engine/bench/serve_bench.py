#!/usr/bin/env python3
"""Issue 18 serving benchmark: C concurrent streaming clients against `coli serve`.

    serve_bench.py --store DIR [--coli PATH] [--clients 1,2,4,8] [--tokens 128] [--warm]
        [--cgroup-limit BYTES|auto] [--expert-share 0.25] [--kv-reserve BYTES|auto]
        [--usage FILE | --learn] [--target-speedup X] [--out FILE.json] [--label NAME]
        [-- SERVER ARGS...]

Everything after `--` goes to `coli serve` unchanged (e.g. `--threads 2 --context 512
--direct on --max-batch 8`), except `--ram-budget auto`, replaced by the budget that fits the
cgroup (streaming_bench.coli_budget). The script picks the port (`--port 0`, the address the
server prints) and the usage-history file (`--usage` here, not after `--`).

Method (engine/bench/README.md, "Issue 18: serving benchmark"):
- for each client count C of --clients: a FRESH server (so caches start equal), pages dropped
  first (`sync; echo 3 > /proc/sys/vm/drop_caches`), optionally inside a cgroup-v1 memory cgroup
  (--cgroup-limit; `auto` = dense.bin + --expert-share of the routed expert bytes + streaming_bench's
  process overhead + --kv-reserve), the same usage history copied in for every start; waits for
  /health; optional warm-up request (--warm, not measured); /metrics scraped;
- C threads, each with its own connection, released together by a barrier, each send ONE streaming
  /v1/completions request (temperature 0, max_tokens --tokens, stream_options.include_usage) with
  its own prompt (client i gets PROMPTS[i mod 8]); per client: request start, arrival time of every
  SSE chunk with text, end, usage (completion tokens counted from usage, not chunks);
- /metrics scraped again, the server's VmHWM read, the cgroup's peak usage read, server stopped.
- With C = 1 (and no --no-reference), after the measurement, every other prompt used by the run is
  sent alone, one after the other, on the same server: the reference text of each prompt.
  Temperature 0: each client's text must equal its prompt's reference at every C (batching and
  placement must not change outputs); mismatches are reported and make the exit code 1.

Figures per C: aggregate tok/s = all completion tokens / (last end - first start); TTFT p50/p99
(first text chunk - request start); inter-token latency (ITL = gap between consecutive text
chunks of one client) p50/p99 in three disjoint classes:
  steady  = the gap starts at or after the last client's first token and ends at or before the
            first client's last token (every prompt prefilled, every client still decoding);
  prefill = the gap starts before the last client's first token (a prefill may be in flight);
  tail    = the rest (after the first client finished: the batch drains, no prefill);
"other" (the issue's "with prefill") = prefill + tail. Expert bytes read per generated token =
delta of the server's expert-read counter / completion tokens. Means of any batch-size /
tokens-per-forward histogram the server exports (names containing "batch" or "per_forward") and of
the decode-step histogram. Ratios against C = 1: aggregate tok/s(C) / tok/s(1) and steady ITL
p99(C) / steady ITL p50(1); the issue's targets at C = 8: speedup >= --target-speedup (4 on the
streaming store, 2.5 on the resident demo store) and steady p99 <= 3x single p50, PASS/FAIL.
Percentiles: linear interpolation between order statistics (numpy's default).
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import streaming_bench  # noqa: E402  (cgroup constants, store_sizes, coli_budget, drop_caches)

CG = streaming_bench.CG
MiB = 1 << 20

# Story openings, 31-42 tokens each with the demo store's tokenizer; varied topics so the sequences
# route differently. Chosen so that the demo model (SmolLM2-135M-Instruct) does not stop (EOS)
# before 128 tokens at temperature 0: the API has no ignore_eos, and a client that stops early
# shortens the steady window. Client i sends PROMPTS[i % len(PROMPTS)].
PROMPTS = [
    "The lighthouse keeper had not seen a ship in eleven years when, one foggy morning in late "
    "October, a small wooden boat with a torn red sail drifted into the harbor below his window.",
    "Maria opened the letter from her grandmother, which had been lost in the mail for almost "
    "thirty years, and the first line made her sit down on the kitchen floor.",
    "In the year 2157, the last library on Earth was kept by a robot named Theo. Every night he "
    "walked between the shelves and",
    "Chapter One. The train from the city arrived late, as it always did, and the small station "
    "was empty except for a boy with a suitcase and a letter that said",
    "Every winter the villagers raced across the frozen lake. This year, on the morning of the "
    "race, the ice began to crack near the old pier, and",
    "Dear diary, today I finally found out why the old clock in the hallway stops at exactly three "
    "in the morning. After dinner I went downstairs with a flashlight, and",
    "The detective looked at the muddy footprints, then at the open window, and then at the "
    "butler, who was sweating far more than a man with nothing to hide should.",
    "When the first colonists landed on the red plains of Mars, they expected dust, cold and "
    "silence. What they did not expect was the music coming from beneath the",
]
# Other prompts, for --learn (the usage history is learned on text the benchmark does not send).
LEARN_PROMPTS = [
    "A short history of the bicycle: the first two-wheeled machines appeared in Germany in 1817,",
    "The mountain trail was narrow and steep, and halfway up the storm caught us. We",
    "Here is how to plant tomatoes in a small garden: first choose a sunny spot, then",
    "The orchestra tuned their instruments while the young conductor, nervous on her first night,",
]
WARM_PROMPT = "Once upon a time"


def parse_bytes(s: str) -> int:
    """'2G', '512M', '1.5G', '123456' -> bytes (K/M/G/T binary)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", s, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def pct(xs, q):
    """q-th percentile (0..100), linear interpolation; None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


# ---------------------------------------------------------------- Prometheus text (tiny parser)

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict:
    """{'samples': {name: value summed over label sets}, 'types': {family: type}}."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        if m.group(1).endswith("_bucket"):
            continue  # bucket counts: not needed (means come from _sum / _count)
        samples[m.group(1)] = samples.get(m.group(1), 0.0) + v
    return {"samples": samples, "types": types}


def sample(m: dict, *names):
    """The first of `names` present, tolerating a `_total` suffix either way; None if absent."""
    s = m["samples"]
    for n in names:
        for cand in (n, n + "_total", n[:-6] if n.endswith("_total") else None):
            if cand and cand in s:
                return s[cand]
    return None


EXPERT_BYTES_NAMES = ("coli_expert_read_bytes_total", "coli_expert_bytes_read", "coli_expert_read_bytes",
                      "coli_expert_bytes_read_total")


def histogram_means(before: dict, after: dict) -> dict:
    """Mean over the run of every histogram of interest (batch size, tokens per forward, decode
    step): delta _sum / delta _count."""
    out = {}
    for fam, typ in after["types"].items():
        if typ != "histogram":
            continue
        if not ("batch" in fam or "per_forward" in fam or "decode_step" in fam or "inter_token" in fam):
            continue
        s1, c1 = after["samples"].get(fam + "_sum"), after["samples"].get(fam + "_count")
        s0 = before["samples"].get(fam + "_sum", 0.0)
        c0 = before["samples"].get(fam + "_count", 0.0)
        if s1 is None or c1 is None:
            continue
        n = c1 - c0
        out[fam] = {"count": n, "mean": (s1 - s0) / n if n > 0 else None}
    return out


# ---------------------------------------------------------------- server

class Server:
    """`coli serve` on a free port, optionally in a fresh cgroup-v1 memory cgroup."""

    def __init__(self, a, args: list, limit, tag: str, tmp: str):
        self.cg = None
        self.limit = limit
        self.dropped = streaming_bench.drop_caches()
        cmd = [a.coli, "serve", "--store", a.store, "--host", "127.0.0.1", "--port", "0"] + args
        self.cmd = cmd
        self.errpath = os.path.join(tmp, f"serve-{tag}.stderr")
        self.err = open(self.errpath, "w+b")
        preexec = None
        if limit:
            self.cg = os.path.join(CG, f"coli-serve-bench-{tag}-{os.getpid()}")
            if os.path.isdir(self.cg):
                os.rmdir(self.cg)
            os.mkdir(self.cg)
            with open(os.path.join(self.cg, "memory.limit_in_bytes"), "w") as f:
                f.write(str(limit))
            cg = self.cg

            def preexec():
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write("0")
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(cmd, stdout=self.err, stderr=self.err, preexec_fn=preexec)
        self.host, self.port = self._wait_ready(a.start_timeout)
        self.ready_s = time.monotonic() - self.t0

    def stderr_text(self) -> str:
        with open(self.errpath, "rb") as f:
            return f.read().decode(errors="replace")

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        addr = None
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                self.close()
                sys.exit(f"coli serve exited with {self.p.returncode} while starting:\n"
                         f"{' '.join(self.cmd)}\n{self.stderr_text()[-3000:]}")
            if addr is None:
                m = re.search(r"listening on http://([0-9.]+):(\d+)", self.stderr_text())
                if m:
                    addr = (m.group(1), int(m.group(2)))
            if addr is not None:
                try:
                    st, body = http_get(addr, "/health", 5)
                    if st == 200 and json.loads(body).get("status") == "ok":
                        return addr
                except (OSError, ValueError, http.client.HTTPException):
                    pass
            time.sleep(0.1)
        self.close()
        sys.exit(f"coli serve not ready after {timeout} s:\n{self.stderr_text()[-3000:]}")

    def wait_idle(self, timeout=60.0):
        """Waits until /health says nothing runs or waits: the server updates some counters (expert
        bytes read, hits, histograms) after a request's last event has reached its client, so a
        scrape right after [DONE] can miss that request's figures."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                st, body = http_get((self.host, self.port), "/health", 10)
                h = json.loads(body)
                if st == 200 and not h.get("running") and not h.get("queue_depth"):
                    return
            except (OSError, ValueError, http.client.HTTPException):
                pass
            time.sleep(0.02)
        print(f"# warning: the server did not report idle within {timeout} s; metrics may be short")

    def metrics(self) -> dict:
        self.wait_idle()
        st, body = http_get((self.host, self.port), "/metrics", 30)
        if st != 200:
            sys.exit(f"/metrics answered {st}")
        return parse_metrics(body)

    def memory(self) -> dict:
        """Peak RSS (VmHWM) of the server process and, in a cgroup, its peak usage, failcnt, OOM
        kills. Read while the server still runs."""
        out = {"vm_hwm_bytes": None}
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out["vm_hwm_bytes"] = int(line.split()[1]) * 1024
        except OSError:
            pass
        if self.cg:
            def rd(name):
                with open(os.path.join(self.cg, name)) as h:
                    return h.read()
            out["cgroup_limit_bytes"] = self.limit
            out["cgroup_peak_bytes"] = int(rd("memory.max_usage_in_bytes"))
            out["cgroup_failcnt"] = int(rd("memory.failcnt"))
            out["cgroup_oom_kills"] = 0
            for line in rd("memory.oom_control").splitlines():
                if line.startswith("oom_kill "):
                    out["cgroup_oom_kills"] = int(line.split()[1])
        return out

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()
        if self.cg:
            # Charges of the page cache left behind move to the parent when the group is removed.
            for _ in range(50):
                try:
                    os.rmdir(self.cg)
                    break
                except OSError:
                    time.sleep(0.1)
            self.cg = None


def http_get(addr, path, timeout):
    c = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


# ---------------------------------------------------------------- clients

def stream_completion(addr, model, prompt, max_tokens, timeout, barrier=None) -> dict:
    """One streaming /v1/completions request; times are time.monotonic() seconds."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    })
    rec = {"start": None, "chunk_times": [], "chunk_lens": [], "end": None, "text": "",
           "finish_reason": None, "usage": None, "status": None, "error": None}
    conn = http.client.HTTPConnection(addr[0], addr[1], timeout=timeout)
    try:
        conn.connect()
        if barrier is not None:
            barrier.wait()
        rec["start"] = time.monotonic()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            rec["error"] = r.read().decode(errors="replace")[:2000]
            rec["end"] = time.monotonic()
            return rec
        parts = []
        while True:
            line = r.readline()
            if not line:
                break
            now = time.monotonic()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, keep-alive comments
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            j = json.loads(data)
            if "error" in j:
                rec["error"] = j["error"]
                continue
            for ch in j.get("choices") or []:
                t = ch.get("text") or ""
                if t:
                    rec["chunk_times"].append(now)
                    rec["chunk_lens"].append(len(t))
                    parts.append(t)
                if ch.get("finish_reason"):
                    rec["finish_reason"] = ch["finish_reason"]
            if j.get("usage"):
                rec["usage"] = j["usage"]
        rec["end"] = time.monotonic()
        rec["text"] = "".join(parts)
    except Exception as e:  # noqa: BLE001 (recorded, reported)
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["end"] = time.monotonic()
    finally:
        conn.close()
    return rec


def run_clients(addr, model, prompts: list, max_tokens, timeout) -> list:
    """len(prompts) concurrent clients released together by a barrier."""
    barrier = threading.Barrier(len(prompts))
    recs = [None] * len(prompts)

    def client(i):
        recs[i] = stream_completion(addr, model, prompts[i], max_tokens, timeout, barrier)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return recs


def analyse(recs: list) -> dict:
    """Aggregate tok/s, TTFT and the three ITL classes of one client count."""
    ok = [r for r in recs if not r["error"] and r["chunk_times"]]
    t_first = min(r["start"] for r in recs)
    t_last = max(r["end"] for r in recs)
    tokens = sum((r["usage"] or {}).get("completion_tokens", 0) for r in recs)
    ttft = [r["chunk_times"][0] - r["start"] for r in ok]
    # Steady window: every client has its first token, none has its last.
    w0 = max(r["chunk_times"][0] for r in ok) if ok else None
    w1 = min(r["chunk_times"][-1] for r in ok) if ok else None
    steady, prefill, tail = [], [], []
    for r in ok:
        ts = r["chunk_times"]
        for a_, b_ in zip(ts, ts[1:]):
            if a_ < w0:
                prefill.append(b_ - a_)
            elif b_ <= w1:
                steady.append(b_ - a_)
            else:
                tail.append(b_ - a_)
    other = prefill + tail

    def stats(xs):
        return {"n": len(xs), "p50_s": pct(xs, 50), "p99_s": pct(xs, 99),
                "mean_s": statistics.fmean(xs) if xs else None}

    chunks = sum(len(r["chunk_times"]) for r in ok)
    return {
        "clients": len(recs), "errors": sum(1 for r in recs if r["error"]),
        "completion_tokens": tokens, "text_chunks": chunks, "wall_s": t_last - t_first,
        "agg_tok_s": tokens / (t_last - t_first) if t_last > t_first else None,
        "ttft": stats(ttft), "itl_steady": stats(steady), "itl_prefill": stats(prefill),
        "itl_tail": stats(tail), "itl_other": stats(other),
        "steady_window_s": [w0 - t_first, w1 - t_first] if ok else None,
        "finish_reasons": sorted({str(r["finish_reason"]) for r in recs}),
    }


# ---------------------------------------------------------------- main

def kv_bytes_per_sequence(a, server_args) -> int:
    """KV bytes of one sequence at the server's --context, from `coli plan --json` (0 if unknown)."""
    cmd = [a.coli, "plan", "--store", a.store, "--json"]
    if "--context" in server_args:
        cmd += ["--context", server_args[server_args.index("--context") + 1]]
    p = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return int(json.loads(p.stdout)["kv_bytes"])
    except (ValueError, KeyError, TypeError):
        print(f"# coli plan gave no kv_bytes; --kv-reserve auto = 0 ({p.stderr.strip()[:200]})")
        return 0


def main() -> int:
    argv = sys.argv[1:]
    server_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 usage="%(prog)s --store DIR [options] [-- SERVER ARGS...]")
    ap.add_argument("--store", required=True)
    ap.add_argument("--coli", default=os.path.join(ROOT, "target", "release", "coli"))
    ap.add_argument("--clients", default="1,2,4,8", help="client counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=128, help="max_tokens per client")
    ap.add_argument("--warm", action="store_true", help="one short request after start, not measured")
    ap.add_argument("--cgroup-limit", help="BYTES (K/M/G/T suffixes) or auto; default: no cgroup")
    ap.add_argument("--expert-share", type=float, default=0.25,
                    help="share of the routed expert bytes in --cgroup-limit auto (default 0.25)")
    ap.add_argument("--kv-reserve", default="auto",
                    help="bytes added to --cgroup-limit auto for the KV caches of the sequences; "
                         "auto = (max clients + 1) x one sequence's KV at --context (coli plan)")
    ap.add_argument("--usage", help="usage history copied in for every server start "
                    "(default: an empty history per start, or the one --learn makes)")
    ap.add_argument("--learn", action="store_true",
                    help="learn the usage history first: a server (no cgroup) runs LEARN_PROMPTS")
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the lone reference requests (texts are then compared across C only)")
    ap.add_argument("--target-speedup", type=float,
                    help="aggregate tok/s target at 8 clients vs 1 (default 4 with a cgroup, else 2.5)")
    ap.add_argument("--label", default="", help="a name for the configuration, printed and saved")
    ap.add_argument("--out", help="raw JSON output file")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=3600)
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.clients.split(",")]
    if "--usage" in server_args or "--port" in server_args:
        sys.exit("pass --usage to serve_bench.py itself (before `--`); the port is chosen here")
    if not os.path.exists(a.coli):
        sys.exit(f"{a.coli} missing: cargo build --release -p coli-tools")

    # Memory: cgroup limit and --ram-budget auto.
    dense, experts, rec = streaming_bench.store_sizes(a.coli, a.store)
    kv_seq = None
    limit = None
    kv_reserve = 0
    if a.cgroup_limit:
        if not os.path.isdir(CG):
            sys.exit(f"{CG}: no cgroup-v1 memory controller here")
        if a.cgroup_limit == "auto":
            if a.kv_reserve == "auto":
                kv_seq = kv_bytes_per_sequence(a, server_args)
                # Every sequence's KV at --context: coli serve reserves them all beside the budget
                # and its own 512 MiB (placement::budget::sequences_that_fit), which OVERHEAD
                # (384 MiB) plus the budget's rounding margin (coli_budget) covers.
                kv_reserve = (max(counts) + 1) * kv_seq  # one more: the process's own use
            else:
                kv_reserve = parse_bytes(a.kv_reserve)
            limit = dense + int(experts * a.expert_share) + streaming_bench.OVERHEAD + kv_reserve
        else:
            limit = parse_bytes(a.cgroup_limit)
    args = list(server_args)
    budget = None
    if "--ram-budget" in args:
        i = args.index("--ram-budget") + 1
        if args[i] == "auto":
            if not limit:
                sys.exit("--ram-budget auto needs --cgroup-limit")
            budget = streaming_bench.coli_budget(limit - kv_reserve, dense, rec)
            args[i] = str(budget)
    target = a.target_speedup or (4.0 if limit else 2.5)

    tmp = tempfile.mkdtemp(prefix="coli-serve-bench-")
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip() != ""
    meta = {
        "script": "serve_bench.py", "argv": sys.argv[1:], "label": a.label, "store": os.path.abspath(a.store),
        "host": os.uname().nodename, "cpus": os.cpu_count(), "git": git.stdout.strip() + ("-dirty" if dirty else ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "server_args": args,
        "dense_bytes": dense, "expert_bytes": experts, "record_bytes": rec, "cgroup_limit_bytes": limit,
        "kv_bytes_per_sequence": kv_seq, "kv_reserve_bytes": kv_reserve, "ram_budget_bytes": budget,
        "expert_share": a.expert_share if a.cgroup_limit == "auto" else None, "tokens": a.tokens,
        "clients": counts, "warm": a.warm, "target_speedup": target, "prompts": PROMPTS,
    }
    print(f"# serve_bench.py {' '.join(sys.argv[1:])}")
    print(f"# {meta['label'] or 'run'}: store {a.store}, git {meta['git']}, {meta['cpus']} CPUs, {meta['date_utc']} UTC")
    print(f"# dense {dense / MiB:.1f} MiB, experts {experts / MiB:.1f} MiB ({rec / MiB:.2f} MiB/record)"
          + (f", cgroup limit {limit / MiB:.0f} MiB" if limit else ", no cgroup")
          + (f" (kv reserve {kv_reserve / MiB:.0f} MiB)" if kv_reserve else "")
          + (f", --ram-budget {budget / MiB:.0f} MiB" if budget else ""))
    print(f"# server args: {' '.join(args)}")
    if limit and budget is None and "--ram-budget" not in args:
        print("# note: in a cgroup without --ram-budget the server sizes its cache from the host's "
              "MemAvailable, not the cgroup limit (pass `-- --ram-budget auto`)")

    # Usage history: one file copied in for every start, so every client count starts equal.
    usage_src = a.usage
    if a.learn and not usage_src:
        usage_src = os.path.join(tmp, "usage-learned.json")
        s = Server(a, args + ["--usage", usage_src], None, "learn", tmp)
        model = json.loads(http_get((s.host, s.port), "/v1/models", 30)[1])["data"][0]["id"]
        for p in LEARN_PROMPTS:
            r = stream_completion((s.host, s.port), model, p, a.tokens, a.request_timeout)
            if r["error"]:
                s.close()
                sys.exit(f"learning request failed: {r['error']}")
        s.close()
        print(f"# usage history learned on {len(LEARN_PROMPTS)} other prompts x {a.tokens} tokens")

    runs = []
    reference = {}  # prompt index -> text of the prompt alone
    failures = []
    for c in counts:
        tag = f"c{c}"
        usage = os.path.join(tmp, f"usage-{tag}.json")
        if usage_src and os.path.exists(usage_src):
            shutil.copy(usage_src, usage)
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        s = Server(a, args + ["--usage", usage], limit, tag, tmp)
        addr = (s.host, s.port)
        try:
            model = json.loads(http_get(addr, "/v1/models", 30)[1])["data"][0]["id"]
            if a.warm:
                w = stream_completion(addr, model, WARM_PROMPT, 4, a.request_timeout)
                if w["error"]:
                    sys.exit(f"warm-up request failed: {w['error']}")
            m0 = s.metrics()
            idx = [i % len(PROMPTS) for i in range(c)]
            recs = run_clients(addr, model, [PROMPTS[i] for i in idx], a.tokens, a.request_timeout)
            m1 = s.metrics()
            mem = s.memory()
            lone = {}
            if c == 1 and not a.no_reference:
                lone[idx[0]] = recs[0]["text"]
                for i in sorted({j % len(PROMPTS) for j in range(max(counts))} - {idx[0]}):
                    r = stream_completion(addr, model, PROMPTS[i], a.tokens, a.request_timeout)
                    if r["error"]:
                        failures.append(f"reference request for prompt {i} failed: {r['error']}")
                    lone[i] = r["text"]
                reference.update(lone)
            stderr_tail = s.stderr_text()[-4000:]
            ready_s = s.ready_s
        finally:
            s.close()
        res = analyse(recs)
        eb0, eb1 = sample(m0, *EXPERT_BYTES_NAMES), sample(m1, *EXPERT_BYTES_NAMES)
        res["expert_bytes_read"] = eb1 - eb0 if eb0 is not None and eb1 is not None else None
        res["expert_bytes_per_token"] = (res["expert_bytes_read"] / res["completion_tokens"]
                                         if res["expert_bytes_read"] is not None and res["completion_tokens"] else None)
        hits = [sample(m, "coli_expert_cache_hits_total") for m in (m0, m1)]
        miss = [sample(m, "coli_expert_cache_misses_total") for m in (m0, m1)]
        if None not in hits + miss and (hits[1] - hits[0]) + (miss[1] - miss[0]) > 0:
            res["hit_rate"] = (hits[1] - hits[0]) / ((hits[1] - hits[0]) + (miss[1] - miss[0]))
        res["histograms"] = histogram_means(m0, m1)
        res["metrics_before"], res["metrics_after"] = m0["samples"], m1["samples"]
        res.update(mem)
        res["server_ready_s"] = ready_s
        res["dropped_caches"] = s.dropped
        res["loadavg_before"] = load
        t_ref = min(r["start"] for r in recs)
        res["per_client"] = [{
            "client": k, "prompt": idx[k], "status": r["status"], "error": r["error"],
            "start_s": r["start"] - t_ref, "end_s": r["end"] - t_ref,
            "ttft_s": r["chunk_times"][0] - r["start"] if r["chunk_times"] else None,
            "chunk_times_s": [round(t - t_ref, 6) for t in r["chunk_times"]],
            "chunk_chars": r["chunk_lens"], "usage": r["usage"], "finish_reason": r["finish_reason"],
            "text": r["text"],
        } for k, r in enumerate(recs)]
        if lone:
            res["reference_texts"] = {str(k): v for k, v in lone.items()}
        res["server_stderr_tail"] = stderr_tail
        for k, r in enumerate(recs):
            if r["error"]:
                failures.append(f"{c} clients: client {k} failed: {r['error']}")
        runs.append(res)
        st = res["itl_steady"]
        print(f"# {c} clients: {res['completion_tokens']} tokens in {res['wall_s']:.2f} s, "
              f"{res['agg_tok_s']:.2f} tok/s, steady ITL p50 "
              f"{fmt_ms(st['p50_s'])} ms (n={st['n']}), load {' '.join(load)}", flush=True)

    # Correctness: same prompt -> same text at every client count.
    first_seen = {}
    mismatches = []
    for res in runs:
        for pc in res["per_client"]:
            ref = reference.get(pc["prompt"])
            if ref is None:
                ref = first_seen.setdefault(pc["prompt"], (res["clients"], pc["text"]))[1]
            if pc["text"] != ref:
                d = next((i for i, (x, y) in enumerate(zip(pc["text"], ref)) if x != y), min(len(pc["text"]), len(ref)))
                mismatches.append(f"{res['clients']} clients, client {pc['client']} (prompt {pc['prompt']}): "
                                  f"text differs from the reference at char {d}: {pc['text'][d:d + 40]!r} vs {ref[d:d + 40]!r}")
    report(runs, target, limit)
    base = next((r for r in runs if r["clients"] == 1), None)
    checks = targets(runs, base, target)
    for line in checks["lines"]:
        print(line)
    if mismatches:
        for mm in mismatches:
            print(f"# TEXT MISMATCH: {mm}")
    else:
        compared = sum(len(r["per_client"]) for r in runs)
        print(f"# texts: {compared} client texts compared with "
              f"{'each prompt alone (reference requests on the 1-client server)' if reference else 'the first run of each prompt'}: all identical")
    for f_ in failures:
        print(f"# FAILED: {f_}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "runs": runs, "reference_texts": {str(k): v for k, v in reference.items()},
                       "targets": checks["json"], "text_mismatches": mismatches, "failures": failures}, f, indent=1)
        print(f"# raw JSON: {a.out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if mismatches or failures else 0


def fmt_ms(x):
    return "-" if x is None else f"{x * 1000:.1f}"


def report(runs, target, limit):
    base = next((r for r in runs if r["clients"] == 1), None)
    hdr = (f"{'C':>3} {'tokens':>6} {'wall s':>7} {'tok/s':>7} {'xC=1':>5} {'TTFT p50':>8} {'p99':>8} "
           f"{'steady p50':>10} {'p99':>7} {'n':>5} {'prefill p50':>11} {'p99':>7} {'n':>5} "
           f"{'tail p99':>8} {'n':>4} {'MiB/tok':>8} {'batch':>5} {'step ms':>7} {'RSS MiB':>7}"
           + (f" {'cg MiB':>7}" if limit else ""))
    print(hdr)
    for r in runs:
        ratio = r["agg_tok_s"] / base["agg_tok_s"] if base and base["agg_tok_s"] and r["agg_tok_s"] else None
        batch = next((h["mean"] for n, h in r["histograms"].items() if "batch" in n and h["mean"] is not None), None)
        step = r["histograms"].get("coli_decode_step_seconds", {}).get("mean")
        ebt = r["expert_bytes_per_token"]
        print(f"{r['clients']:>3} {r['completion_tokens']:>6} {r['wall_s']:>7.2f} {r['agg_tok_s'] or 0:>7.2f} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>5} {fmt_ms(r['ttft']['p50_s']):>8} {fmt_ms(r['ttft']['p99_s']):>8} "
              f"{fmt_ms(r['itl_steady']['p50_s']):>10} {fmt_ms(r['itl_steady']['p99_s']):>7} {r['itl_steady']['n']:>5} "
              f"{fmt_ms(r['itl_prefill']['p50_s']):>11} {fmt_ms(r['itl_prefill']['p99_s']):>7} {r['itl_prefill']['n']:>5} "
              f"{fmt_ms(r['itl_tail']['p99_s']):>8} {r['itl_tail']['n']:>4} "
              f"{'-' if ebt is None else f'{ebt / MiB:.2f}':>8} {'-' if batch is None else f'{batch:.2f}':>5} "
              f"{fmt_ms(step):>7} {(r['vm_hwm_bytes'] or 0) / MiB:>7.0f}"
              + (f" {r.get('cgroup_peak_bytes', 0) / MiB:>7.0f}" if limit else ""))
    print("# ITL in ms between text chunks of one client; steady: every prompt prefilled, every client "
          "decoding; prefill: gap starts before the last client's first token; tail: after the first "
          "client finished. MiB/tok: expert MiB read per generated token. batch: mean of the server's "
          "batch-size histogram (- if it exports none). step: mean decode step (server histogram).")
    for r in runs:
        extra = []
        if r["text_chunks"] != r["completion_tokens"]:
            extra.append(f"{r['text_chunks']} text chunks for {r['completion_tokens']} tokens")
        if r["finish_reasons"] != ["length"]:
            extra.append(f"finish reasons {r['finish_reasons']}")
        if r.get("cgroup_oom_kills") or r.get("cgroup_failcnt"):
            extra.append(f"cgroup failcnt {r['cgroup_failcnt']}, OOM kills {r['cgroup_oom_kills']}")
        if not r["dropped_caches"]:
            extra.append("page cache NOT dropped (not root?)")
        if extra:
            print(f"# {r['clients']} clients: " + "; ".join(extra))


def targets(runs, base, target) -> dict:
    lines, js = [], {}
    if base is None:
        return {"lines": ["# targets: n/a (no 1-client run)"], "json": None}
    single_p50 = base["itl_steady"]["p50_s"]
    for r in runs:
        if r["clients"] == 1:
            continue
        sp = r["agg_tok_s"] / base["agg_tok_s"] if base["agg_tok_s"] and r["agg_tok_s"] else None
        p99 = r["itl_steady"]["p99_s"]
        lr = p99 / single_p50 if p99 is not None and single_p50 else None
        js[r["clients"]] = {"speedup": sp, "steady_p99_over_single_p50": lr}
        lines.append(f"# {r['clients']} clients vs 1: aggregate tok/s " + ("n/a" if sp is None else f"x{sp:.2f}")
                     + "; steady ITL p99 / single p50 = "
                     + ("n/a (no steady gaps: the clients never decoded together)" if lr is None else f"{lr:.2f}"))
    r8 = next((r for r in runs if r["clients"] == 8), None)
    if r8 is None:
        lines.append("# issue 18 targets (8 clients): n/a, no 8-client run")
    else:
        sp, lr = js[8]["speedup"], js[8]["steady_p99_over_single_p50"]
        ok1 = sp is not None and sp >= target
        ok2 = lr is not None and lr <= 3.0
        js["pass_speedup"], js["pass_latency"] = ok1, ok2
        lines.append(f"# TARGET aggregate tok/s at 8 clients >= {target:g}x single: "
                     + ("n/a" if sp is None else f"x{sp:.2f}") + " "
                     f"{'PASS' if ok1 else 'FAIL'} (issue: 4x on the streaming store, 2.5x on the resident demo store)")
        lines.append(f"# TARGET steady ITL p99 at 8 clients <= 3x single-client p50: "
                     + ("n/a" if lr is None else f"{lr:.2f}x") + f" {'PASS' if ok2 else 'FAIL'}")
    return {"lines": lines, "json": js}


if __name__ == "__main__":
    sys.exit(main())
