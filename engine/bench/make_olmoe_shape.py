#!/usr/bin/env python3
"""Write a random BF16 Hugging Face checkpoint of OLMoE-1B-7B's shape whose routing behaves like
a trained model's (issue 17 benchmark model).

Shape (allenai/OLMoE-1B-7B-0924 config): model_type olmoe, 16 layers, 64 experts, top-8,
hidden 2048, intermediate (per expert) 1024, vocab 50304, 16 heads (= 16 KV heads, head_dim 128),
q/k RMSNorm over the full projection, norm_topk_prob false, untied embeddings;
max_position_embeddings 16384 (the published 4096 raised so long-prompt benchmarks can run).
6.92e9 parameters, 13.8 GB in BF16; `coli-convert` makes ~3.6 GiB of it at int4 g64.
`--dims small` writes the same architecture at hidden 128 (2 heads of 64, expert 64, vocab 4096,
64 experts, top-8) for tests.

Weights are random, not trained: the benchmark measures placement and I/O, not text quality.
But a random model whose routing is degenerate makes every hit-rate, pinning and prefetch
figure optimistic, so the scales are chosen for routing that looks like a trained MoE's:

- the residual stream carries the token: embeddings are N(0, 1) (`--embed-std`), so every layer's
  router input depends on the token, and usage over varied input is balanced (a trained MoE's
  auxiliary balancing loss gives the same; OLMoE's router has no bias to calibrate);
- attention is sharp and token specific: q_norm/k_norm weights are `--qk-norm-gain` (2) x
  (1 + N(0, 0.1)), so a head attends to a few positions instead of averaging the whole context
  into one vector common to all tokens (that common vector is what made the previous generator's
  routing degenerate: layers 1-15 used 14-33 of 64 experts);
- every layer moves the stream by a controlled amount: o_proj std `--attn-out-gain`/sqrt(H)
  (0.5), experts' down_proj std `--expert-down-gain`/sqrt(I) (4), both times
  `--out-growth`^layer (1.15, so the relative change stays about constant as the stream grows).
  The router input of layer L+1 then differs from the stream after layer L's attention (where the
  engine's lookahead predicts it) by roughly 40-50% of its norm, and a next-layer lookahead
  recovers ~2/3 of the experts (colibri reports 71.6% on GLM-5.2).
- every other matrix (q/k/v, router, experts' gate/up, lm_head) is N(0, 1/fan_in), norm weights
  1 + N(0, 0.1).
`engine/bench/routing_stats.py` measures the result (usage entropy, experts used, lookahead
recall, consecutive top-k overlap) and refuses a model outside the ranges of issue 17.
`--routing degenerate` writes the previous generator's scales (every matrix and the embeddings
N(0, 0.02^2), q/k norms 1 + N(0, 0.1)) for the test that the statistics script refuses it.

Tensors are written streaming, one safetensors shard per layer (plus one for the embedding and
one for the final norm + lm_head), each under a temporary name renamed when complete, so memory
stays at a few tens of MiB whatever the model size. Values: a fixed pool of 4 Mi samples of
N(0, 1) (Python's `random.gauss`, seeded), scaled per distinct std and rounded to bf16 by
truncation; every tensor is a sequence of 64 KiB chunks taken from that pool at seeded random
offsets (so each router row is a different slice of it; `--dims small`: 256 Ki samples). No numpy is needed; the output is the
same bytes for the same options.

Usage: make_olmoe_shape.py OUT_DIR [--seed 6] [--layers 16] [--dims full|small]
           [--routing realistic|degenerate] [scale options, see --help]
"""
import argparse
import array
import json
import os
import random
import shutil
import struct
import sys

CHUNK = 64 * 1024  # bytes per copied chunk
POOL_VALUES = 4 * 1024 * 1024  # 8 MiB of bf16

CONFIG = {
    "architectures": ["OlmoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "clip_qkv": None,
    "dtype": "bfloat16",
    "eos_token_id": 50279,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 1024,
    "max_position_embeddings": 16384,
    "model_type": "olmoe",
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 16,
    "num_key_value_heads": 16,
    "output_router_logits": False,
    "pad_token_id": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 50304,
}


SMALL = {"hidden_size": 128, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
         "vocab_size": 4096, "eos_token_id": 4095}


def bf16_bytes(values) -> bytes:
    """f32 values -> little-endian bf16 bytes (truncation: the high half of each f32)."""
    f = array.array("f", values)
    if sys.byteorder != "little":
        f.byteswap()
    raw = f.tobytes()
    out = bytearray(2 * len(f))
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def scales(cfg: dict, args) -> dict:
    """Std of each weight class at layer L, and the q/k norm gain (see the module doc)."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    if args.routing == "degenerate":
        s = 0.02
        return {"embed": s, "in": lambda L: s, "router": s, "attn_out": lambda L: s,
                "expert_down": lambda L: s, "lm_head": s, "qk_gain": 1.0}
    g = args.out_growth
    return {
        "embed": args.embed_std,
        "in": lambda L: H ** -0.5,
        "router": args.router_gain * H ** -0.5,
        "attn_out": lambda L: args.attn_out_gain * g**L * H ** -0.5,
        "expert_down": lambda L: args.expert_down_gain * g**L * I ** -0.5,
        "lm_head": H ** -0.5,
        "qk_gain": args.qk_norm_gain,
    }


def tensor_specs(cfg: dict, sc: dict):
    """Shards as lists of (name, shape, kind, scale) in checkpoint order; kind 'w' (pool values
    times scale) or 'norm' (scale x (1 + N(0, 0.1)))."""
    H, I, V, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_experts"]
    shards = [[("model.embed_tokens.weight", (V, H), "w", sc["embed"])]]
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        s = [
            (p + "input_layernorm.weight", (H,), "norm", 1.0),
            (p + "self_attn.q_proj.weight", (H, H), "w", sc["in"](L)),
            (p + "self_attn.k_proj.weight", (H, H), "w", sc["in"](L)),
            (p + "self_attn.v_proj.weight", (H, H), "w", sc["in"](L)),
            (p + "self_attn.o_proj.weight", (H, H), "w", sc["attn_out"](L)),
            (p + "self_attn.q_norm.weight", (H,), "norm", sc["qk_gain"]),
            (p + "self_attn.k_norm.weight", (H,), "norm", sc["qk_gain"]),
            (p + "post_attention_layernorm.weight", (H,), "norm", 1.0),
            (p + "mlp.gate.weight", (E, H), "w", sc["router"]),
        ]
        for e in range(E):
            s.append((p + f"mlp.experts.{e}.gate_proj.weight", (I, H), "w", sc["in"](L)))
            s.append((p + f"mlp.experts.{e}.up_proj.weight", (I, H), "w", sc["in"](L)))
            s.append((p + f"mlp.experts.{e}.down_proj.weight", (H, I), "w", sc["expert_down"](L)))
        shards.append(s)
    shards.append([("model.norm.weight", (H,), "norm", 1.0), ("lm_head.weight", (V, H), "w", sc["lm_head"])])
    return shards


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("out", help="output checkpoint directory (created)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--layers", type=int, default=16, help="layers to write (16 = OLMoE-1B-7B)")
    ap.add_argument("--dims", choices=["full", "small"], default="full",
                    help="full: OLMoE-1B-7B; small: hidden 128, expert 64, vocab 4096 (tests)")
    ap.add_argument("--routing", choices=["realistic", "degenerate"], default="realistic",
                    help="degenerate: the previous generator's scales (all N(0, 0.02^2)), for tests")
    ap.add_argument("--embed-std", type=float, default=1.0)
    ap.add_argument("--router-gain", type=float, default=1.0, help="router std x sqrt(H)")
    ap.add_argument("--attn-out-gain", type=float, default=0.5, help="o_proj std x sqrt(H) at layer 0")
    ap.add_argument("--expert-down-gain", type=float, default=4.0, help="down_proj std x sqrt(I) at layer 0")
    ap.add_argument("--out-growth", type=float, default=1.15, help="o_proj/down_proj std factor per layer")
    ap.add_argument("--qk-norm-gain", type=float, default=2.0, help="q_norm/k_norm weights' mean")
    args = ap.parse_args()

    cfg = dict(CONFIG, num_hidden_layers=args.layers)
    if args.dims == "small":
        cfg.update(SMALL)
    sc = scales(cfg, args)
    cfg["initializer_range"] = sc["embed"]
    shards = tensor_specs(cfg, sc)
    need = sum(2 * (shape[0] * (shape[1] if len(shape) > 1 else 1)) for sh in shards for _, shape, _, _ in sh)
    os.makedirs(args.out, exist_ok=True)
    free = shutil.disk_usage(args.out).free
    print(f"writes {need / 1e9:.2f} GB of BF16 to {args.out} ({free / 1e9:.1f} GB free)", flush=True)
    if free < need + (256 << 20):
        print(f"error: {args.out}: {need / 1e9:.2f} GB needed, {free / 1e9:.2f} GB free", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    pool_values = POOL_VALUES if args.dims == "full" else POOL_VALUES // 16
    base = array.array("f", (rng.gauss(0.0, 1.0) for _ in range(pool_values)))
    pools: dict[float, bytes] = {}

    def pool(std: float) -> bytes:
        if std not in pools:
            pools[std] = bf16_bytes(v * std for v in base)
        return pools[std]

    max_off = (pool_values * 2 - CHUNK) // 2

    def weight_bytes(nbytes: int, std: float, f):
        p = pool(std)
        left = nbytes
        while left > 0:
            n = min(CHUNK, left)
            off = 2 * rng.randrange(max_off)
            f.write(p[off : off + n])
            left -= n

    total = len(shards)
    weight_map = {}
    total_size = 0
    for i, specs in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        header = {}
        off = 0
        for name, shape, _, _ in specs:
            n = 2
            for d in shape:
                n *= d
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[name] = fname
        total_size += off
        hjson = json.dumps(header, separators=(",", ":")).encode()
        hjson += b" " * ((8 - len(hjson) % 8) % 8)
        tmp = os.path.join(args.out, fname + ".tmp")
        with open(tmp, "wb", buffering=1 << 20) as f:
            f.write(struct.pack("<Q", len(hjson)))
            f.write(hjson)
            for name, shape, kind, scale in specs:
                if kind == "norm":
                    f.write(bf16_bytes(scale * (1.0 + rng.gauss(0.0, 0.1)) for _ in range(shape[0])))
                else:
                    weight_bytes(2 * shape[0] * shape[1], scale, f)
        os.replace(tmp, os.path.join(args.out, fname))
        print(f"{fname}: {off / 2**30:.2f} GiB", flush=True)
        # Pools of this layer's scales are not used again (the out-growth changes them).
        keep = {sc["embed"], sc["router"], sc["lm_head"], sc["in"](0)}
        for k in [k for k in pools if k not in keep]:
            del pools[k]

    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}, f, indent=2)
    print(f"wrote {total} shards, {total_size / 2**30:.2f} GiB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
