#!/usr/bin/env python3
"""Write a random BF16 checkpoint of Qwen3.6-35B-A3B's shape (issue 44 benchmark model), in the
published layout (`qwen3_5_moe` config with `text_config`, `model.language_model.*`, fused
experts; no vision tower, no MTP layer), whose routing behaves like a trained model's.

Shape, `--dims bench` (default): Qwen3.6-35B-A3B's per-layer widths (docs/configs/
qwen3.6-35b-a3b.config.json: hidden 2048; Gated DeltaNet Hk 16 x dk 128, Hv 32 x dv 128, 4-tap
convolution; gated attention 16 / 2 heads of 256, partial rotary 0.25, theta 1e7; experts of 512,
top-8, a shared expert of 512) at a smaller depth and expert count so that it fits this
machine's disk three times over (BF16 checkpoint, BF16 GGUF, stores): 8 layers (6 Gated DeltaNet,
2 full attention, the release's 3:1 pattern), 128 experts per layer, vocabulary 65536.
2.3e9 parameters, 4.7 GB in BF16; `coli-convert --experts int4-g64` makes ~1.4 GiB of it.
`--dims tiny` writes the same architecture at hidden 64 (dk = dv = 16, as llama.cpp's graph
requires), 4 layers, 16 experts top-4, vocabulary 1024, and with `--oracle` also the last-position
logits transformers 5.25 (`Qwen3_5MoeForConditionalGeneration.from_pretrained` of the written
directory, float32) gives for three prompts, in `oracle.json`: `qwen35_gguf.py --selftest` holds
llama.cpp to them.

Routing (the scales of make_olmoe_shape.py, which engine/bench/routing_stats.py accepts there):
embeddings N(0, 1); q/k norms 2 (1 + N(0, 0.1)) (stored zero-centred: w = 2 (1 + n) - 1);
attention o_proj and Gated DeltaNet out_proj std 0.5 / sqrt(fan_in), routed and shared experts'
down_proj std 4 / sqrt(I), both times 1.15^layer; every other matrix N(0, 1 / fan_in); norms
1 + N(0, 0.1) (stored w = N(0, 0.1)); the gated norm's weight 1 + N(0, 0.1) as is; A_log
log U(1, 16) as transformers initializes it, dt_bias 1. Values from a fixed pool of N(0, 1)
samples (numpy, seeded), scaled and rounded to BF16; one shard per layer, written under a
temporary name and renamed.

Usage: python qwen3_5_moe_shape.py OUT_DIR [--dims bench|tiny] [--seed N] [--oracle]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

DIMS = {
    "bench": dict(vocab=65536, hidden=2048, layers=8, heads=16, kv_heads=2, head_dim=256, hk=16, hv=32,
                  dk=128, dv=128, conv=4, experts=128, top_k=8, moe_inter=512, shared_inter=512),
    "tiny": dict(vocab=1024, hidden=64, layers=4, heads=4, kv_heads=2, head_dim=32, hk=2, hv=4,
                 dk=16, dv=16, conv=4, experts=16, top_k=4, moe_inter=32, shared_inter=32),
}
LM = "model.language_model."


def config(d: dict) -> dict:
    lt = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(d["layers"])]
    text = {
        "model_type": "qwen3_5_moe_text", "vocab_size": d["vocab"], "hidden_size": d["hidden"],
        "num_hidden_layers": d["layers"], "layer_types": lt, "full_attention_interval": 4,
        "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"], "head_dim": d["head_dim"],
        "linear_num_key_heads": d["hk"], "linear_num_value_heads": d["hv"], "linear_key_head_dim": d["dk"],
        "linear_value_head_dim": d["dv"], "linear_conv_kernel_dim": d["conv"], "num_experts": d["experts"],
        "num_experts_per_tok": d["top_k"], "moe_intermediate_size": d["moe_inter"],
        "shared_expert_intermediate_size": d["shared_inter"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "attention_bias": False,
        "attn_output_gate": True, "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    }
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "text_config": text, "tie_word_embeddings": False, "dtype": "bfloat16",
            "image_token_id": d["vocab"] + 3, "video_token_id": d["vocab"] + 2,
            "vision_start_token_id": d["vocab"] + 1, "vision_end_token_id": d["vocab"],
            "vision_config": {"model_type": "qwen3_5_moe_vision", "depth": 1, "hidden_size": 32,
                              "intermediate_size": 64, "num_heads": 2, "out_hidden_size": d["hidden"],
                              "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
                              "num_position_embeddings": 16}}


class Pool:
    """A fixed pool of N(0, 1) samples; tensors read it cyclically from a per-tensor offset."""

    def __init__(self, seed: int, n: int = 1 << 22):
        self.v = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        self.pos = 0

    def take(self, n: int) -> np.ndarray:
        idx = (self.pos + np.arange(n)) % self.v.size
        self.pos = (self.pos + n * 7919) % self.v.size
        return self.v[idx]


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tensors_of_layer(d: dict, pool: Pool, L: int):
    H, growth = d["hidden"], 1.15 ** L
    hk, hv, dk, dv, K = d["hk"], d["hv"], d["dk"], d["dv"], d["conv"]
    E, I, S = d["experts"], d["moe_inter"], d["shared_inter"]
    nh, nkv, hd = d["heads"], d["kv_heads"], d["head_dim"]
    p = f"{LM}layers.{L}."

    def normal(shape, std):
        return pool.take(int(np.prod(shape))).reshape(shape) * np.float32(std)

    out = [(p + "input_layernorm.weight", normal((H,), 0.1)),
           (p + "post_attention_layernorm.weight", normal((H,), 0.1))]
    if (L + 1) % 4:
        a = p + "linear_attn."
        c = 2 * hk * dk + hv * dv
        out += [(a + "in_proj_qkv.weight", normal((c, H), 1 / math.sqrt(H))),
                (a + "in_proj_z.weight", normal((hv * dv, H), 1 / math.sqrt(H))),
                (a + "in_proj_b.weight", normal((hv, H), 1 / math.sqrt(H))),
                (a + "in_proj_a.weight", normal((hv, H), 1 / math.sqrt(H))),
                (a + "conv1d.weight", normal((c, 1, K), 1 / math.sqrt(K))),
                (a + "dt_bias", np.ones(hv, np.float32)),
                (a + "A_log", np.log(np.random.default_rng(L).uniform(1.0, 16.0, hv)).astype(np.float32)),
                (a + "norm.weight", 1.0 + normal((dv,), 0.1)),
                (a + "out_proj.weight", normal((H, hv * dv), 0.5 * growth / math.sqrt(hv * dv)))]
    else:
        a = p + "self_attn."
        out += [(a + "q_proj.weight", normal((2 * nh * hd, H), 1 / math.sqrt(H))),
                (a + "k_proj.weight", normal((nkv * hd, H), 1 / math.sqrt(H))),
                (a + "v_proj.weight", normal((nkv * hd, H), 1 / math.sqrt(H))),
                (a + "o_proj.weight", normal((H, nh * hd), 0.5 * growth / math.sqrt(nh * hd))),
                (a + "q_norm.weight", 2.0 * (1.0 + normal((hd,), 0.1)) - 1.0),
                (a + "k_norm.weight", 2.0 * (1.0 + normal((hd,), 0.1)) - 1.0)]
    m = p + "mlp."
    out += [(m + "gate.weight", normal((E, H), 1 / math.sqrt(H))),
            (m + "experts.gate_up_proj", normal((E, 2 * I, H), 1 / math.sqrt(H))),
            (m + "experts.down_proj", normal((E, H, I), 4.0 * growth / math.sqrt(I))),
            (m + "shared_expert.gate_proj.weight", normal((S, H), 1 / math.sqrt(H))),
            (m + "shared_expert.up_proj.weight", normal((S, H), 1 / math.sqrt(H))),
            (m + "shared_expert.down_proj.weight", normal((H, S), 4.0 * growth / math.sqrt(S))),
            (m + "shared_expert_gate.weight", normal((1, H), 1 / math.sqrt(H)))]
    return out


def write_shard(path: str, tensors) -> list[str]:
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        if name.endswith("A_log"):
            b, dt = np.ascontiguousarray(a, np.float32).tobytes(), "F32"
        else:
            b, dt = bf16_bits(a).tobytes(), "BF16"
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return [n for n, _ in tensors]


def oracle(out: str, d: dict) -> None:
    import torch
    import transformers
    torch.set_num_threads(1)
    model = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
    rng = np.random.default_rng(5)
    prompts = [[int(x) for x in rng.integers(3, d["vocab"], n)] for n in (8, 64, 150)]
    res = []
    with torch.no_grad():
        for p in prompts:
            logits = model(input_ids=torch.tensor([p]), use_cache=False).logits[0, -1].float()
            res.append({"prompt_ids": p, "last_logits": [float(x) for x in logits]})
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": res},
              open(os.path.join(out, "oracle.json"), "w"))
    print(f"wrote {out}/oracle.json ({len(res)} prompts)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dims", choices=sorted(DIMS), default="bench")
    ap.add_argument("--seed", type=int, default=44)
    ap.add_argument("--oracle", action="store_true")
    a = ap.parse_args()
    d = DIMS[a.dims]
    os.makedirs(a.out, exist_ok=True)
    pool = Pool(a.seed)
    shards, weight_map = [], {}
    n = d["layers"] + 2
    name = lambda k: f"model-{k + 1:05d}-of-{n:05d}.safetensors"  # noqa: E731
    first = [(LM + "embed_tokens.weight", pool.take(d["vocab"] * d["hidden"]).reshape(d["vocab"], d["hidden"]))]
    shards.append((name(0), first))
    for k, (sname, ts) in enumerate([(name(0), first)]):
        for t in write_shard(os.path.join(a.out, sname), ts):
            weight_map[t] = sname
    for L in range(d["layers"]):
        sname = name(L + 1)
        for t in write_shard(os.path.join(a.out, sname), tensors_of_layer(d, pool, L)):
            weight_map[t] = sname
        print(f"layer {L} written", flush=True)
    last = [(LM + "norm.weight", pool.take(d["hidden"]) * np.float32(0.1)),
            ("lm_head.weight", pool.take(d["vocab"] * d["hidden"]).reshape(d["vocab"], d["hidden"])
             / np.float32(math.sqrt(d["hidden"])))]
    sname = name(n - 1)
    for t in write_shard(os.path.join(a.out, sname), last):
        weight_map[t] = sname
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=1)
    json.dump(config(d), open(os.path.join(a.out, "config.json"), "w"), indent=1)
    json.dump({"bos_token_id": 1, "eos_token_id": 2},
              open(os.path.join(a.out, "generation_config.json"), "w"))
    print(f"wrote {a.out} ({a.dims})")
    if a.oracle:
        oracle(a.out, d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
