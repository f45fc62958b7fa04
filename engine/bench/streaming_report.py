#!/usr/bin/env python3
"""Markdown tables from one or more `streaming_bench.py` result files (issue 17).

    streaming_report.py FILE [FILE ...]

Rows are keyed by (engine, limit %, workload); a later file replaces every row of that key from
earlier files (e.g. a coli-only re-run at one limit with a corrected budget margin keeps the
llama.cpp rows of the first run). Bounds come from the last file that has them. Prints, per
workload, one table: median tok/s (min-max over the repetitions), TTFT, disk MB read per token
(rusage, load included), coli's expert MB per token, peak cgroup MiB, hit rate, OOM kills, and
for coli the I/O bound, the compute bound and coli's share of min(I/O bound, compute bound);
then the coli / llama.cpp ratios at the same bits.
"""

import json
import statistics
import sys


def main(files) -> int:
    rows, bounds, limits = {}, {}, {}
    for f in files:
        seen = {}
        for line in open(f):
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            if "bounds" in j:
                bounds[j["bounds"]] = j
            elif "reused_bounds" in j:
                bounds[j["reused_bounds"]] = j
            elif "group" in j:
                limits.setdefault(j["group"], {}).update(j["limits"])
            elif "engine" in j:
                key = (j["engine"], j["limit_pct"], j["workload"])
                if key not in seen:
                    seen[key] = []
                seen[key].append(j)
        rows.update(seen)
    workloads = sorted({k[2] for k in rows})
    engines = []
    for k in rows:
        if k[0] not in engines:
            engines.append(k[0])
    pcts = sorted({k[1] for k in rows})
    for w in workloads:
        print(f"\n{w}:\n")
        print("| limit | engine | tok/s median (min-max) | TTFT s | disk MB/token | coli expert MB/token | "
              "peak cgroup MiB | hit rate | I/O bound | compute bound | share of min |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for p in pcts:
            for e in engines:
                rs = rows.get((e, p, w))
                if not rs:
                    continue
                ok = [r for r in rs if r["rc"] == 0]
                lim = rs[0]["limit_bytes"] / 2**20
                if not ok:
                    print(f"| {p}% ({lim:.0f} MiB) | {e} | failed (exit {rs[0]['rc']}, OOM kills "
                          f"{max(r['oom_kills'] for r in rs)}) | | | | | | | | |")
                    continue
                ts = [r["tok_s"] for r in ok]
                med = statistics.median(ts)
                ttft = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
                disk = statistics.median(r["read_bytes_per_token"] for r in ok) / 1e6
                peak = max(r["peak_cgroup_bytes"] for r in ok) / 2**20
                cells = [f"{p}% ({lim:.0f} MiB)", e, f"{med:.2f} ({min(ts):.2f}-{max(ts):.2f})",
                         f"{statistics.median(ttft):.2f}" if ttft else "-", f"{disk:.0f}"]
                if e.startswith("coli"):
                    eb = statistics.median(r["coli_expert_bytes_per_token"] for r in ok)
                    hr = statistics.median(r["hit_rate"] for r in ok)
                    b = bounds.get(e)
                    if b:
                        io = b["fio_gib_s"] * 2**30 / eb if eb else float("inf")
                        cb = b["compute_tok_s"][w]
                        tail = [f"{io:.2f}", f"{cb:.2f}", f"{med / min(io, cb):.0%}"]
                    else:
                        tail = ["-", "-", "-"]
                    cells += [f"{eb / 1e6:.0f}", f"{peak:.0f}", f"{hr:.3f}"] + tail
                else:
                    cells += ["-", f"{peak:.0f}", "-", "-", "-", "-"]
                print("| " + " | ".join(cells) + " |")
        print()
        # Every coli engine against each llama.cpp engine of its bits (int4 stores: Q4_0, int8: Q8_0;
        # a GGUF's store, coli-gguf-TYPE-*: llama.cpp on the same file, llama-TYPE).
        def peer(c):
            if c.startswith("coli-gguf-"):
                return "llama-" + c.split("-")[2]
            return "llama-q8_0" if c.startswith("coli-int8") else "llama-q4_0"
        pairs = [(c, l) for c in engines if c.startswith("coli-")
                 for l in engines if l.startswith(peer(c))]
        for c, l in pairs:
            for p in pcts:
                a, b = rows.get((c, p, w)), rows.get((l, p, w))
                if not a or not b:
                    continue
                ma = [r["tok_s"] for r in a if r["rc"] == 0]
                mb = [r["tok_s"] for r in b if r["rc"] == 0]
                if ma and mb:
                    print(f"- {w}, {p}%: {c} / {l} = {statistics.median(ma) / statistics.median(mb):.2f}x")
    print("\nbounds:", json.dumps({k: {"fio_gib_s": round(v["fio_gib_s"], 3), "compute_tok_s": v["compute_tok_s"]}
                                   for k, v in bounds.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
