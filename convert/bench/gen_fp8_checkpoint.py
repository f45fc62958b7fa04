#!/usr/bin/env python3
"""Writes a synthetic Qwen3-MoE-shaped FP8 checkpoint of about SIZE GiB for benchmarking
coli-convert (standard library only; the safetensors bytes are written by hand).

Usage: gen_fp8_checkpoint.py OUT_DIR SIZE_GIB

Shapes: hidden 2048, moe_intermediate 768, 64 experts per layer, 4 heads of 128 (attention
small), as many layers as SIZE needs. FP8 weights are random e4m3 codes without the NaN codes
(0x7F/0xFF); F32 block scales [ceil(out/128), ceil(in/128)]; BF16 norms/router/embeddings.
One shard per layer, experts' down scales in the next shard.
"""

import json
import os
import struct
import sys

H, I, E, V = 2048, 768, 64, 4096
NO_NAN = bytes.maketrans(b"\x7f\xff", b"\x7e\xfe")


def fp8(n):
    return os.urandom(n).translate(NO_NAN)


def scales(r, c):
    br, bc = -(-r // 128), -(-c // 128)
    return struct.pack("<%df" % (br * bc), *([0.002] * (br * bc))), [br, bc]


def bf16_ones(n):
    return b"\x80\x3f" * n


def write_shard(path, tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in tensors:
            f.write(t[3])


def main():
    out, size_gib = sys.argv[1], float(sys.argv[2])
    per_layer = E * 3 * H * I
    layers = max(1, int(size_gib * (1 << 30) // per_layer))
    os.makedirs(out, exist_ok=True)
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": H, "moe_intermediate_size": I, "intermediate_size": 4 * H,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": E, "num_experts_per_tok": 8, "vocab_size": V,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
        "rope_theta": 1e6, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    n_shards = layers + 1
    names = ["model-%05d-of-%05d.safetensors" % (k + 1, n_shards) for k in range(n_shards)]
    shards = [[] for _ in range(n_shards)]
    shards[0].append(("model.embed_tokens.weight", "BF16", [V, H], bf16_ones(V * H)))
    shards[0].append(("model.norm.weight", "BF16", [H], bf16_ones(H)))
    shards[0].append(("lm_head.weight", "BF16", [V, H], bf16_ones(V * H)))
    for l in range(layers):
        s = shards[l + 1]
        p = "model.layers.%d" % l
        for n in ("input_layernorm", "post_attention_layernorm"):
            s.append(("%s.%s.weight" % (p, n), "BF16", [H], bf16_ones(H)))
        for n in ("q_norm", "k_norm"):
            s.append(("%s.self_attn.%s.weight" % (p, n), "BF16", [128], bf16_ones(128)))
        for n, r, c in (("q_proj", 512, H), ("k_proj", 512, H), ("v_proj", 512, H), ("o_proj", H, 512)):
            name = "%s.self_attn.%s.weight" % (p, n)
            sc, shp = scales(r, c)
            s.append((name, "F8_E4M3", [r, c], fp8(r * c)))
            s.append((name + "_scale_inv", "F32", shp, sc))
        s.append(("%s.mlp.gate.weight" % p, "BF16", [E, H], bf16_ones(E * H)))
        for e in range(E):
            for n, r, c in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
                name = "%s.mlp.experts.%d.%s.weight" % (p, e, n)
                sc, shp = scales(r, c)
                s.append((name, "F8_E4M3", [r, c], fp8(r * c)))
                dst = shards[(l + 2) % n_shards] if n == "down_proj" else s
                dst.append((name + "_scale_inv", "F32", shp, sc))
    wm = {}
    for name, ts in zip(names, shards):
        write_shard(os.path.join(out, name), ts)
        for t in ts:
            wm[t[0]] = name
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    print("wrote %d layers, %d shards to %s" % (layers, n_shards, out))


if __name__ == "__main__":
    main()
