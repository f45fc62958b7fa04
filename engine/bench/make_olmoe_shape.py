#!/usr/bin/env python3
"""Write a random BF16 Hugging Face checkpoint of OLMoE-1B-7B's shape (issue #6 benchmark).

Shape (allenai/OLMoE-1B-7B-0924 config): model_type olmoe, 16 layers, 64 experts, top-8,
hidden 2048, intermediate (per expert) 1024, vocab 50304, 16 heads (= 16 KV heads, head_dim 128),
q/k RMSNorm over the full projection, norm_topk_prob false, untied embeddings. 6.92e9
parameters, 13.8 GB in BF16 (12.9 GiB); `coli-convert` makes ~3.6 GiB of it at int4 g64.

Weights are random, not trained: the benchmark measures placement and I/O, not text quality.
Tensors are written streaming, one safetensors shard per layer (plus one for the embedding and
one for the final norm + lm_head), so memory stays at a few MiB whatever the model size.

Values: a fixed pool of 4 Mi BF16 samples of N(0, std) (Python's `random.gauss`, seed fixed,
f32 -> bf16 by truncation), and every tensor is a sequence of 64 KiB chunks taken from that
pool at seeded random offsets. Each router row (2048 values = 4 KiB) is therefore a different
slice of the pool, so routing is not degenerate; norm weights are 1 + N(0, 0.1). No numpy is
needed (the bench machine has none); the output is the same bytes for the same --seed.

Usage: make_olmoe_shape.py OUT_DIR [--seed 6] [--std 0.02] [--layers 16]
"""
import argparse
import array
import json
import os
import random
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
    "max_position_embeddings": 4096,
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


def tensor_specs(layer_count: int):
    """Shards as lists of (name, shape, kind) in checkpoint order; kind is 'w' or 'norm'."""
    H, I, V, E = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"], CONFIG["num_experts"]
    shards = [[("model.embed_tokens.weight", (V, H), "w")]]
    for L in range(layer_count):
        p = f"model.layers.{L}."
        s = [
            (p + "input_layernorm.weight", (H,), "norm"),
            (p + "self_attn.q_proj.weight", (H, H), "w"),
            (p + "self_attn.k_proj.weight", (H, H), "w"),
            (p + "self_attn.v_proj.weight", (H, H), "w"),
            (p + "self_attn.o_proj.weight", (H, H), "w"),
            (p + "self_attn.q_norm.weight", (H,), "norm"),
            (p + "self_attn.k_norm.weight", (H,), "norm"),
            (p + "post_attention_layernorm.weight", (H,), "norm"),
            (p + "mlp.gate.weight", (E, H), "w"),
        ]
        for e in range(E):
            s.append((p + f"mlp.experts.{e}.gate_proj.weight", (I, H), "w"))
            s.append((p + f"mlp.experts.{e}.up_proj.weight", (I, H), "w"))
            s.append((p + f"mlp.experts.{e}.down_proj.weight", (H, I), "w"))
        shards.append(s)
    shards.append([("model.norm.weight", (H,), "norm"), ("lm_head.weight", (V, H), "w")])
    return shards


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output checkpoint directory (created)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--layers", type=int, default=16, help="layers to write (16 = OLMoE-1B-7B)")
    args = ap.parse_args()

    cfg = dict(CONFIG, num_hidden_layers=args.layers, initializer_range=args.std)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    pool = bf16_bytes(rng.gauss(0.0, args.std) for _ in range(POOL_VALUES))
    max_off = (len(pool) - CHUNK) // 2

    def weight_bytes(nbytes: int, f):
        left = nbytes
        while left > 0:
            n = min(CHUNK, left)
            off = 2 * rng.randrange(max_off)
            f.write(pool[off : off + n])
            left -= n

    shards = tensor_specs(args.layers)
    total = len(shards)
    weight_map = {}
    total_size = 0
    for i, specs in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{total:05d}.safetensors"
        header = {}
        off = 0
        for name, shape, _ in specs:
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
            for name, shape, kind in specs:
                if kind == "norm":
                    f.write(bf16_bytes(1.0 + rng.gauss(0.0, 0.1) for _ in range(shape[0])))
                else:
                    weight_bytes(2 * shape[0] * shape[1], f)
        os.replace(tmp, os.path.join(args.out, fname))
        print(f"{fname}: {off / 2**30:.2f} GiB", flush=True)

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
