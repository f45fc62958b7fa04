#!/usr/bin/env python3
"""Routing statistics of a benchmark store, and the gate that refuses a degenerate one (issue 17).

    routing_stats.py STORE --coli PATH [--tokens 1024] [--seed 17] [--check-tokens 6]
        [--check-layers 3] [--out FILE.json] [--no-gate] [--no-numpy-check]

A random-weight MoE can route nothing like a trained one (a few experts take every token), and
then every hit-rate, pinning and prefetch figure measured on it is optimistic. This script
measures, in every MoE layer of STORE's main model:

- usage entropy / log(E) (1 = perfectly balanced) and the number of experts ever selected;
- next-layer lookahead recall: the share of a token's routed experts that the engine's router
  lookahead predicted for it (layer L's router applied to the residual stream after layer L-1's
  attention, as `coli_engine::prefetch` does; for the first layer of the model, to the
  embeddings);
- the top-k overlap of consecutive tokens: |S_t & S_t-1| / k.

Method: TOKENS token ids drawn uniformly from the vocabulary (seeded: varied input, no
repetition structure), fed one per forward pass (`--prefill-batch 1`, teacher forcing: every
step routes a new token) through `coli run --routing-trace FILE --usage FILE --json`. The
statistics come from the routing trace; the trace is then checked against coli's two other
records of the same run: the usage history (the same experts used per layer, the same entropy
to 0.005) and the `--json` counter `prefetch_recall` (the same overall recall to 1e-6).

coli's counters are the code under test, so the routing of the first CHECK_TOKENS tokens in the
first CHECK_LAYERS MoE layers (and their lookahead predictions) is recomputed by an independent
numpy forward pass from the store's weights as the spec-written Python reader
(tests/python_reader/coli_reader.py) decodes them: OLMoE with the forward below, glm_moe_dsa /
deepseek_v3 with tests/fixtures/mla_reference.py's layers. Every comparison whose k-th and
(k+1)-th router scores are closer than 1e-4 (a near tie, where f32 vs f64 rounding may pick
either) is skipped and counted; any other difference fails the run. For a family that forward
does not cover (qwen3_5_moe_text), `--no-numpy-check` reports the statistics checked against
coli's two other records only, and says so.

Gate (issue 17), in every MoE layer: entropy >= 0.95, every expert selected, lookahead recall
in [0.50, 0.85] (DeepSeek-V4's hash-routed layers, whose experts are the token's `tid2eid` row,
have no lookahead and no recall). Exit status: 0 in range, 1 out of range (each failing layer named) or a
cross-check failed, 2 on a usage error. `--no-gate` reports without refusing.

Needs numpy and xxhash (tests/python_reader/requirements.txt).
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python_reader"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
import coli_reader  # noqa: E402

ENTROPY_MIN = 0.95
RECALL_RANGE = (0.50, 0.85)
TIE_GAP = 1e-4


def load_config(store: str) -> dict:
    with open(os.path.join(store, "files", "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg) if "text_config" in cfg and "hidden_size" not in cfg else cfg


def run_coli(a, ids, tmp):
    trace, usage = os.path.join(tmp, "trace.jsonl"), os.path.join(tmp, "usage.json")
    cmd = [a.coli, "run", "--store", a.store, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", "1",
           "--prefill-batch", "1", "--routing-trace", trace, "--usage", usage, "--no-pin", "--json",
           # f32 activations: the numpy forward below is the reference for the routing.
           "--numerics", "exact"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"coli run failed ({p.returncode}):\n{p.stderr}")
    out = json.loads(p.stdout)
    rows = [json.loads(line) for line in open(trace)]
    with open(usage) as f:
        hist = json.load(f)
    return out, rows, hist


def layer_stats(rows, num_experts: int, k: int) -> dict:
    """Per layer: entropy ratio, experts used, lookahead recall, consecutive overlap."""
    by_layer: dict[int, list] = {}
    for r in rows:
        by_layer.setdefault(r["layer"], []).append(r)
    out = {}
    for layer, rs in sorted(by_layer.items()):
        rs.sort(key=lambda r: r["pos"])
        counts = np.zeros(num_experts)
        hit = pred_n = 0
        overlap = []
        for i, r in enumerate(rs):
            counts[r["experts"]] += 1
            if r["predicted"] is not None:
                hit += len(set(r["predicted"]) & set(r["experts"]))
                pred_n += len(r["experts"])
            if i and rs[i - 1]["pos"] == r["pos"] - 1:
                overlap.append(len(set(rs[i - 1]["experts"]) & set(r["experts"])) / k)
        p = counts / counts.sum()
        nz = p[p > 0]
        out[layer] = {
            "tokens": len(rs),
            "entropy": float(-(nz * np.log(nz)).sum() / math.log(num_experts)),
            "experts_used": int(np.count_nonzero(counts)),
            "top16_share": float(np.sort(p)[::-1][:16].sum()),
            "lookahead_recall": hit / pred_n if pred_n else None,
            "lookahead_hits": hit,
            "lookahead_routed": pred_n,
            "consecutive_overlap": float(np.mean(overlap)) if overlap else None,
            "usage": p,
        }
    return out


def check_against_coli_records(stats, out, hist, num_experts) -> list[str]:
    """The trace against the usage history and the --json prefetch_recall of the same run."""
    errs = []
    counts = {}
    for e in hist["layers"]:  # the file may leave out trailing zero counts
        c = np.zeros(max(num_experts, len(e["counts"])))
        c[: len(e["counts"])] = e["counts"]
        counts[e["layer"]] = c
    for layer, s in stats.items():
        c = counts.get(layer)
        if c is None or len(c) != num_experts:
            errs.append(f"usage history: layer {layer} missing or with more than {num_experts} experts")
            continue
        used = int(np.count_nonzero(c > 0))
        p = c / c.sum()
        nz = p[p > 0]
        ent = float(-(nz * np.log(nz)).sum() / math.log(num_experts))
        if used != s["experts_used"] or abs(ent - s["entropy"]) > 0.005:
            errs.append(f"layer {layer}: usage history says {used} experts / entropy {ent:.4f}, "
                        f"trace {s['experts_used']} / {s['entropy']:.4f}")
        diff = float(np.abs(p - s["usage"]).max())
        if diff > 1e-3:  # decay between merges changes the shares by far less
            errs.append(f"layer {layer}: usage history shares differ from the trace's by {diff:.4f}")
    hits = sum(s["lookahead_hits"] for s in stats.values())
    routed = sum(s["lookahead_routed"] for s in stats.values())
    json_recall = out["stats"].get("prefetch_recall")
    if routed and (json_recall is None or abs(json_recall - hits / routed) > 1e-6):
        errs.append(f"--json prefetch_recall {json_recall} but the trace gives {hits / routed:.6f}")
    return errs


# ----------------------------------------------------------------------------- numpy oracle


class StoreWeights:
    """Hugging Face tensor names -> f64 arrays decoded by the spec-written reader (lazy)."""

    def __init__(self, store: coli_reader.Store, prefix: str):
        self.s = store
        self.prefix = prefix  # "mlp." or "block_sparse_moe."
        self.shapes = {d["name"]: d["shape"] for d in store.manifest["dense"]}
        self.cache: dict[str, np.ndarray] = {}

    def embed_rows(self, name: str, ids) -> np.ndarray:
        m = self.s.dense(name)
        one = coli_reader.Matrix(m.encoding, m.group_size, m.rows, m.cols, m.data, m.scales)
        # Decode only the needed rows: a row-major slice of the weight section (+ its scales).
        rows = []
        for i in ids:
            if m.encoding == coli_reader.BF16:
                raw = np.frombuffer(m.data, dtype="<u2", count=m.cols, offset=2 * i * m.cols)
                rows.append(coli_reader.bf16_to_f32(raw.reshape(1, -1))[0])
            else:
                rows.append(one.dequantize()[i])
        return np.asarray(rows, dtype=np.float64)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.cache:
            if ".experts." in name:
                rest = name.split(".experts.")[1]
                e, which = int(rest.split(".")[0]), rest.split(".")[1]
                layer = int(name.split(".")[2])
                x = self.s.read_expert(layer, e)
                mat = {"gate_proj": x.gate, "up_proj": x.up, "down_proj": x.down,
                       "w1": x.gate, "w3": x.up, "w2": x.down}[which]
                self.cache[name] = mat.dequantize().astype(np.float64)
            else:
                w = self.s.dense(name).dequantize().astype(np.float64)
                self.cache[name] = w.reshape(self.shapes[name])
        return self.cache[name]


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def top_k_with_gap(scores, k):
    order = np.argsort(-scores, kind="stable")
    return [int(e) for e in order[:k]], float(scores[order[k - 1]] - scores[order[k]])


def olmoe_routes(cfg, W: StoreWeights, ids, n_layers):
    """OLMoE forward (transformers' modeling_olmoe): q/k RMSNorm over the whole projection,
    rotate-half RoPE, causal softmax attention, softmax router top-k (no renormalization when
    norm_topk_prob is false), SwiGLU experts. Yields (layer, pos, routed, gap_r, predicted, gap_p)."""
    H, nh, E, k = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_experts"], cfg["num_experts_per_tok"]
    hd, eps, theta = H // nh, cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    T = len(ids)
    pos = np.arange(T)
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def router(L, h):
        p = f"model.layers.{L}."
        z = rms(h, W[p + "post_attention_layernorm.weight"], eps) @ W[p + "mlp.gate.weight"].T
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    h = W.embed_rows("model.embed_tokens.weight", ids)
    pred = [top_k_with_gap(r, k) for r in router(0, h)]
    for L in range(n_layers):
        p = f"model.layers.{L}.self_attn."
        x = rms(h, W[f"model.layers.{L}.input_layernorm.weight"], eps)
        q = rms(x @ W[p + "q_proj.weight"].T, W[p + "q_norm.weight"], eps)
        kk = rms(x @ W[p + "k_proj.weight"].T, W[p + "k_norm.weight"], eps)
        v = x @ W[p + "v_proj.weight"].T
        q, kk, v = (t.reshape(T, nh, hd).transpose(1, 0, 2) for t in (q, kk, v))
        s = rope(q) @ rope(kk).transpose(0, 2, 1) / math.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, H)
        h = h + o @ W[p + "o_proj.weight"].T
        next_pred = [top_k_with_gap(r, k) for r in router(L + 1, h)] if L + 1 < n_layers else None
        probs = router(L, h)
        xn = rms(h, W[f"model.layers.{L}.post_attention_layernorm.weight"], eps)
        out = np.zeros_like(h)
        for t in range(T):
            routed, gap = top_k_with_gap(probs[t], k)
            yield L, t, routed, gap, pred[t][0], pred[t][1]
            w = probs[t, routed]
            if cfg.get("norm_topk_prob"):
                w = w / w.sum()
            for e, we in zip(routed, w):
                ep = f"model.layers.{L}.mlp.experts.{e}."
                g, u = W[ep + "gate_proj.weight"] @ xn[t], W[ep + "up_proj.weight"] @ xn[t]
                out[t] += we * (W[ep + "down_proj.weight"] @ (g / (1 + np.exp(-g)) * u))
        h = h + out
        pred = next_pred


def mla_routes(cfg, W: StoreWeights, ids, n_moe_layers):
    """deepseek_v3 / glm_moe_dsa through tests/fixtures/mla_reference.py's layers (MLA with the
    DSA indexer, MLPs); routing as its `moe`: sigmoid scores + e_score_correction_bias for the
    choice (n_group 1 here: plain top-k of the biased scores)."""
    import mla_reference as mr

    c = mr.Cfg(cfg)
    if c.n_group != 1:
        raise SystemExit("cross-check: grouped routing (n_group > 1) is not implemented here")
    T = len(ids)
    cos, sin, sm = mr.rope_tables(c, T)

    def choice(L, h):
        p = f"model.layers.{L}."
        x = mr.rms_norm(h, W[p + "post_attention_layernorm.weight"], c.eps)
        sc = 1.0 / (1.0 + np.exp(-(x @ W[p + "mlp.gate.weight"].T)))
        return sc, sc + W[p + "mlp.gate.e_score_correction_bias"][None, :]

    h = W.embed_rows("model.embed_tokens.weight", ids)
    pred = None
    if c.is_moe(0):
        pred = [top_k_with_gap(r, c.k) for r in choice(0, h)[1]]
    done = 0
    for L in range(c.L):
        p = f"model.layers.{L}."
        a = mr.mla(c, W, p + "self_attn.", mr.rms_norm(h, W[p + "input_layernorm.weight"], c.eps), cos, sin, sm,
                   mr.Trace())
        h = h + a
        nxt = None
        if L + 1 < c.L and c.is_moe(L + 1):
            nxt = [top_k_with_gap(r, c.k) for r in choice(L + 1, h)[1]]
        x = mr.rms_norm(h, W[p + "post_attention_layernorm.weight"], c.eps)
        if c.is_moe(L):
            sc, ch = choice(L, h)
            out = np.zeros_like(h)
            for t in range(T):
                routed, gap = top_k_with_gap(ch[t], c.k)
                yield L, t, routed, gap, pred[t][0] if pred else None, pred[t][1] if pred else math.inf
                w = sc[t, routed]
                if c.norm_topk:
                    w = w / (w.sum() + 1e-20)
                for e, we in zip(routed, w * c.rsf):
                    out[t] += we * mr.mlp(W, f"{p}mlp.experts.{e}.", x[t : t + 1])[0]
            if c.n_shared:
                out += mr.mlp(W, p + "mlp.shared_experts.", x)
            h = h + out
            done += 1
            if done >= n_moe_layers:
                return
        else:
            h = h + mr.mlp(W, p + "mlp.", x)
        pred = nxt


def cross_check(a, cfg, rows) -> dict:
    store = coli_reader.Store(a.store)
    ids = a.ids[: a.check_tokens]
    W = StoreWeights(store, "mlp.")
    trace = {(r["layer"], r["pos"]): r for r in rows}
    if cfg["model_type"] == "olmoe":
        it = olmoe_routes(cfg, W, ids, a.check_layers)
    elif cfg["model_type"] in ("glm_moe_dsa", "deepseek_v3"):
        it = mla_routes(cfg, W, ids, a.check_layers)
    else:
        raise SystemExit(f"cross-check: model_type {cfg['model_type']} is not implemented")
    compared = skipped = 0
    errors = []
    for layer, t, routed, gap_r, predicted, gap_p in it:
        r = trace[(layer, t)]
        for what, mine, theirs, gap in (("routed", routed, r["experts"], gap_r),
                                         ("predicted", predicted, r["predicted"], gap_p)):
            if mine is None:
                continue
            if gap < TIE_GAP:
                skipped += 1
                continue
            compared += 1
            if set(mine) != set(theirs or []):
                errors.append(f"layer {layer} pos {t} {what}: numpy {sorted(mine)}, coli {sorted(theirs or [])}")
    return {"compared": compared, "skipped_near_ties": skipped, "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--coli", required=True, help="the coli binary")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--check-tokens", type=int, default=6, help="tokens of the numpy cross-check")
    ap.add_argument("--check-layers", type=int, default=3, help="MoE layers of the numpy cross-check")
    ap.add_argument("--out", help="write the statistics as JSON here")
    ap.add_argument("--no-gate", action="store_true", help="report without refusing")
    ap.add_argument("--no-numpy-check", action="store_true",
                    help="families the numpy forward does not cover (qwen3_5_moe_text): report the statistics "
                         "checked against coli's other records only, and say so")
    a = ap.parse_args()
    if a.tokens < 1024 and not a.no_gate:
        print("the gate needs --tokens >= 1024", file=sys.stderr)
        return 2
    cfg = load_config(a.store)
    if cfg["model_type"] not in ("olmoe", "glm_moe_dsa", "deepseek_v3") and not a.no_numpy_check:
        print(f"{a.store}: model_type {cfg['model_type']}: the numpy cross-check covers olmoe, glm_moe_dsa "
              "and deepseek_v3 only", file=sys.stderr)
        return 2
    if a.check_tokens < 1 or a.check_layers < 1 or a.tokens < 2:
        print("need --check-tokens >= 1, --check-layers >= 1 and --tokens >= 2", file=sys.stderr)
        return 2
    E = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    k = cfg["num_experts_per_tok"]
    rng = random.Random(a.seed)
    a.ids = [rng.randrange(cfg["vocab_size"]) for _ in range(a.tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        out, rows, hist = run_coli(a, a.ids, tmp)
    rows = [r for r in rows if r["pos"] < a.tokens]  # the prompt; not the one decode step
    stats = layer_stats(rows, E, k)
    record_errors = check_against_coli_records(stats, out, hist, E)
    first_moe = cfg.get("first_k_dense_replace", 0) if cfg["model_type"] != "olmoe" else 0
    want_layers = list(range(first_moe, cfg["num_hidden_layers"]))
    if sorted(stats) != want_layers:
        record_errors.append(f"the trace has MoE layers {sorted(stats)}, the config {want_layers}")
    for layer, st in stats.items():
        if st["tokens"] != a.tokens:
            record_errors.append(f"layer {layer}: {st['tokens']} tokens traced, {a.tokens} fed")
    if a.no_numpy_check:
        xc = {"compared": 0, "skipped_near_ties": 0, "errors": [], "skipped": "--no-numpy-check"}
    else:
        xc = cross_check(a, cfg, rows)
    if not a.no_numpy_check and xc["compared"] == 0 or xc["skipped_near_ties"] > xc["compared"]:
        xc["errors"].append(f"numpy cross-check compared {xc['compared']} routings "
                            f"({xc['skipped_near_ties']} near ties skipped): too few to check anything")

    print(f"store {a.store}: {cfg['model_type']}, {E} experts, top-{k}, {a.tokens} tokens (seed {a.seed}), "
          f"one per forward")
    print(f"{'layer':>5} {'entropy':>8} {'used':>5} {'top16':>6} {'recall':>7} {'overlap':>8}")
    fails = []
    for layer, s in stats.items():
        rec = s["lookahead_recall"]
        print(f"{layer:>5} {s['entropy']:>8.3f} {s['experts_used']:>5} {s['top16_share']:>6.3f} "
              f"{rec if rec is None else round(rec, 3)!s:>7} {s['consecutive_overlap'] or 0:>8.3f}")
        if s["entropy"] < ENTROPY_MIN:
            fails.append(f"layer {layer}: usage entropy {s['entropy']:.3f} < {ENTROPY_MIN}")
        if s["experts_used"] < E:
            fails.append(f"layer {layer}: {s['experts_used']} of {E} experts selected")
        if rec is None and cfg["model_type"] == "deepseek_v4":
            # A hash-routed layer: its experts are the token's row of tid2eid, not predicted.
            continue
        if rec is None or not RECALL_RANGE[0] <= rec <= RECALL_RANGE[1]:
            fails.append(f"layer {layer}: lookahead recall {rec} outside {RECALL_RANGE}")
    print(f"cross-checks: usage history and --json prefetch_recall "
          f"{'agree' if not record_errors else 'DISAGREE'}; numpy forward: {xc['compared']} routings compared, "
          f"{xc['skipped_near_ties']} near ties skipped, {len(xc['errors'])} differ")
    for e in record_errors + xc["errors"]:
        print(f"  {e}")
    for st in stats.values():
        st["usage"] = [round(float(x), 6) for x in st["usage"]]
    summary = {"store": a.store, "model_type": cfg["model_type"], "experts": E, "top_k": k, "tokens": a.tokens,
               "seed": a.seed, "layers": stats, "record_errors": record_errors, "numpy_cross_check": xc,
               "gate_failures": fails, "coli_stats": out["stats"]}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    if record_errors or xc["errors"]:
        print("error: coli's routing records disagree (see above)", file=sys.stderr)
        return 1
    if fails and not a.no_gate:
        print("refused: routing outside the ranges of a realistic benchmark model:", file=sys.stderr)
        for f_ in fails:
            print(f"  {f_}", file=sys.stderr)
        return 1
    print("routing in range" if not fails else f"{len(fails)} out of range (not gated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
