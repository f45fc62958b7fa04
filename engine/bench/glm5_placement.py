#!/usr/bin/env python3
"""Full-scale GLM-5 placement on a 25 GB machine, by simulation (issue 23).

    python3 engine/bench/glm5_placement.py [--coli target/release/coli]
        [--config docs/configs/glm-5.config.json] [--measure engine/bench/results/DATE-glm5-placement-measure.txt]
        [--store /work/bench-glm5-placement/store] [--total-ram 25G] [--context 8192]

We cannot hold GLM-5's 370 GB here, so the full 78-layer model is placed on paper from two
sources, neither of them a guess:

1. The resident set, the expert records and the KV cache: `coli plan --config` on GLM-5's
   published dimensions (docs/configs/glm-5.config.json: transformers' GlmMoeDsaConfig defaults,
   which follow the release), the converter's own per-tensor encoding rule, per dense
   configuration; expert cache = what --total-ram leaves; hit rate of an LRU of that size under
   uniform routing (a lower bound: trained models route unevenly).
2. The per-token costs, measured by engine/bench/glm5_placement.sh on a GLM-5-dimension store
   (1 dense + 1 MoE layer, published layout, --dense int4-g64 --embeddings int4-g64):
   * compute: `coli run`'s compute seconds per decoded token with every expert cached, divided
     by the weight bytes one token touches in that store (all of dense.bin but the embedding,
     of which one row is read, plus top-k expert records) = the bytes per second the CPU works
     through int4 weights. A decoded token is weight-bandwidth bound on a CPU, so the full
     model's compute time is its own touched bytes (resident set but the embeddings and the
     MTP layer, plus 75 MoE layers x top-8 records) at that rate. MLA attention over the KV
     cache is added: the latent cache of every earlier position is read per layer
     (kv_bytes_per_token x position, at the middle of the context).
   * fetch: `coli run` with one record of budget, pages dropped, no prefetch: every routed
     expert read from disk; its io wait per record against the record size gives the per-read
     overhead beyond bandwidth (reported; the prediction uses the stated bandwidths).

Prediction per disk bandwidth B (1, 3, 7 GB/s) and drive count (1 or 2 equal drives, experts
spread by coli's weighted per-expert drive assignment: aggregate 2B in the ideal case; colibri
measured +37.5% on two NVMe, shown as a second figure): expert bytes read per token = no-hit
bytes x (1 - hit rate); io time = bytes / (drives x B); decode tok/s = 1 / max(compute, io)
with prefetch overlapping them (the bound) and 1 / (compute + io) without overlap. Compute is
this 2-core VM's; the table also shows io-only tok/s, which is what a machine with a faster CPU
approaches. Compared with colibri's published figures (docs: field notes): 0.05-0.1 tok/s on a
25 GB box at ~1 GB/s, ~1.8 tok/s on a 128 GB desktop.

Writes the tables to stdout (engine/bench/results/DATE-glm5-placement.txt holds a run's output;
docs/WHAT_FITS.md quotes it). Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys

GB = 1e9
GIB = 1 << 30


def plan(coli, config, total_ram, context, disk, extra=()):
    cmd = [coli, "plan", "--config", config, "--total-ram", total_ram, "--context", str(context),
           "--disk-gib-s", str(disk), "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    return json.loads(p.stdout)


def manifest(store):
    with open(os.path.join(store, "MANIFEST"), "rb") as f:
        b = f.read()
    return json.loads(b[24:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--config", default="docs/configs/glm-5.config.json")
    ap.add_argument("--measure", required=True)
    ap.add_argument("--store", default="/work/bench-glm5-placement/store")
    ap.add_argument("--total-ram", default="25G")
    ap.add_argument("--context", type=int, default=8192)
    a = ap.parse_args()

    lines = [json.loads(l) for l in open(a.measure) if l.startswith("{")]
    runs = [l for l in lines if "mode" in l]
    resident = sorted(r["compute_s_per_token"] for r in runs if r["mode"] == "resident")
    streaming = [r for r in runs if r["mode"] == "streaming"]
    compute_s = resident[len(resident) // 2]
    # Weight bytes one decoded token touches in the measurement store.
    m = manifest(a.store)
    cfg = m["config"]
    dense_bytes = sum(d["length"] + d["scales_length"] for d in m["dense"])
    embed = sum(d["length"] + d["scales_length"] for d in m["dense"] if d["name"] == "model.embed_tokens.weight")
    with open(os.path.join(a.store, "INDEX"), "rb") as f:
        idx = f.read()
    # INDEX: 64-byte header, then 64-byte records; bytes 24..32 of a record = its length on disk,
    # alignment padding included (FORMAT.md section 3), as the plan counts it.
    record = int.from_bytes(idx[64 + 24:64 + 32], "little")
    top_k = cfg["num_experts_per_tok"]
    moe_layers_meas = cfg["num_hidden_layers"] - cfg["first_k_dense_replace"]
    touched_meas = dense_bytes - embed + moe_layers_meas * top_k * record
    rate = touched_meas / compute_s  # weight bytes per second of compute
    per_read = [r["io_wait_s_per_token"] * r["decode_passes"] / max(1, r["misses"]) for r in streaming]
    per_read_s = sorted(per_read)[len(per_read) // 2] if per_read else None
    print(f"# measured ({a.measure}; store {a.store}): record {record} bytes, dense.bin {dense_bytes} bytes "
          f"(embedding {embed}); weight bytes touched per token {touched_meas / GB:.3f} GB in {compute_s:.3f} s of "
          f"compute (median of {len(resident)}) = {rate / GB:.2f} GB/s of int4 weights on this machine")
    if per_read_s:
        gib_s = [r["disk_gib_s"] for r in streaming]
        print(f"# streaming: io wait per record read {per_read_s * 1e3:.1f} ms ({record / per_read_s / GB:.2f} GB/s "
              f"per record as coli waited for it; coli's disk_gib_s {min(gib_s):.2f}-{max(gib_s):.2f} GiB/s, this VM's disk)")

    p = plan(a.coli, a.config, a.total_ram, a.context, 1.0)
    full = p["rows"]
    with open(a.config) as f:
        gcfg = json.load(f)
    L = gcfg["num_hidden_layers"]
    moe_layers = L - gcfg["first_k_dense_replace"]
    kv_tok = p["kv_bytes_per_token"]
    print(f"# GLM-5 ({a.config}): {L} layers ({moe_layers} MoE) + MTP, {p['experts']} expert records of "
          f"{p['expert_record_bytes']} bytes ({p['expert_bytes_total'] / GIB:.1f} GiB), "
          f"{p['expert_bytes_per_token_no_hits'] / GIB:.2f} GiB per token with no hits; KV {kv_tok} bytes per token; "
          f"--total-ram {a.total_ram}, context {a.context}")
    print()
    print("## Resident set and expert cache (coli plan --config)")
    print()
    print("| --dense | --embeddings | resident | of which embeddings + head | of which MTP layer | KV at "
          f"{a.context} | expert cache | cached records | hit rate (uniform) | usable |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in full:
        print(f"| {r['dense_encoding']} | {r['embeddings_encoding']} | {r['dense_bytes'] / GIB:.2f} GiB | "
              f"{r['embedding_bytes'] / GIB:.2f} GiB | {r['mtp_dense_bytes'] / GIB:.2f} GiB | {r['kv_bytes'] / GIB:.2f} GiB | "
              f"{r['expert_cache_bytes'] / GIB:.2f} GiB | {r['cached_experts']} | {r['hit_rate_uniform'] * 100:.1f}% | "
              f"{'yes' if r['usable'] else 'no'} |")
    print()
    best = [r for r in full if r["usable"]]
    if not best:
        print("no usable configuration")
        return
    r = best[0]
    # Full-model weight bytes touched per decoded token: resident set but the embeddings (one row
    # read) and the MTP layer (not run in plain decode), plus the lm_head (counted in embeddings:
    # half of embedding_bytes, as embed and head are the same shape), plus the routed experts.
    head = r["embedding_bytes"] / 2
    touched_dense = r["dense_bytes"] - r["embedding_bytes"] - r["mtp_dense_bytes"] + head
    experts_tok = moe_layers * top_k * p["expert_record_bytes"]
    kv_read = kv_tok * (a.context // 2)
    compute_full = (touched_dense + experts_tok + kv_read) / rate
    miss_bytes = p["expert_bytes_per_token_no_hits"] * (1 - r["hit_rate_uniform"])
    print(f"## Decode prediction ({r['dense_encoding']} dense, {r['embeddings_encoding']} embeddings: the usable row)")
    print()
    print(f"Per token: weights touched {touched_dense / GB:.2f} GB resident + {experts_tok / GB:.2f} GB of experts "
          f"+ {kv_read / GB:.2f} GB of MLA latent cache (position {a.context // 2}) = compute "
          f"{compute_full:.2f} s at {rate / GB:.2f} GB/s (this 2-core VM); expert bytes read from disk "
          f"{miss_bytes / GB:.2f} GB (hit rate {r['hit_rate_uniform'] * 100:.1f}%).")
    print()
    print("| disk | drives | io s/token | tok/s, io only | tok/s, overlapped (max) | tok/s, serial (sum) |")
    print("|---|---|---|---|---|---|")
    for bw in (1, 3, 7):
        for drives, eff, label in ((1, 1.0, "1"), (2, 2.0, "2 (ideal 2x)"), (2, 1.375, "2 (colibri's measured 1.375x)")):
            io = miss_bytes / (bw * GB * eff)
            print(f"| {bw} GB/s | {label} | {io:.2f} | {1 / io:.3f} | {1 / max(io, compute_full):.3f} | "
                  f"{1 / (io + compute_full):.3f} |")
    print()
    print("colibri, published: 0.05-0.1 tok/s on a 25 GB box at ~1 GB/s; ~1.8 tok/s on a 128 GB desktop.")
    p128 = plan(a.coli, a.config, "128G", a.context, 1.0)
    r128 = next((x for x in p128["rows"] if x["dense_encoding"] == r["dense_encoding"]
                 and x["embeddings_encoding"] == r["embeddings_encoding"]), None)
    if r128:
        miss128 = p128["expert_bytes_per_token_no_hits"] * (1 - r128["hit_rate_uniform"])
        print(f"The same configuration at 128 GiB: expert cache {r128['expert_cache_bytes'] / GIB:.1f} GiB, uniform hit "
              f"rate {r128['hit_rate_uniform'] * 100:.1f}%, {miss128 / GB:.2f} GB read per token: io-only "
              + ", ".join(f"{1 / (miss128 / (bw * GB)):.2f} tok/s at {bw} GB/s" for bw in (1, 3, 7)) + ".")


if __name__ == "__main__":
    main()
