#!/usr/bin/env python3
"""A DeepSeek-V4-Flash-shaped random checkpoint in the release's layout (issue 47 benchmark model).

    python3 engine/bench/deepseek_v4_shape.py OUT_DIR [--experts 64] [--seed 47]

Dimensions as DeepSeek-V4-Flash publishes them (docs/configs/deepseek-v4-flash.config.json):
hidden 4096, 64 query heads of 512 (64 rotated) over one key-value head, q LoRA 1024, the grouped
output in 8 groups of 1024, a window of 128, CSA blocks of 4 with the lightning indexer (64 heads
of 128, top 512), HCA blocks of 128, 4 residual streams, experts of width 2048 top-6 plus a
shared one, vocabulary 129280. Depth and expert count are cut to what this machine's disk holds:
3 layers, one of each kind (sliding and hash-routed, CSA, HCA), `--experts` per layer (64: 2.4
GiB of FP4 experts instead of Flash's 256 x 43 = 137 GiB). The layout is the release's: FP8
linears with F8_E8M0 `.scale` blocks, FP4 experts (I8 e2m1 codes with F8_E8M0 scales per 32
columns), an I64 `tid2eid` on the hash layer, BF16 norms and compressors, F32 hyper-connections.

Weights are random, not trained (the benchmark measures placement and I/O). Scales follow
make_olmoe_shape.py's rule for routing that behaves like a trained model's: embeddings N(0, 1)
(the router input carries the token), projections about N(0, 1/fan_in) (FP8 codes of magnitude
~1 times a power-of-two block scale; FP4 codes uniform over e2m1 times 2^-8 for the experts'
gate/up), the sublayers' outputs at make_olmoe_shape.py's gains (attention output ~0.5 /
sqrt(fan_in) over two stages, experts' down ~4 / sqrt(I)), router rows N(0, 1/H), no selection
bias.
routing_stats.py measures what that gives (usage entropy, experts used, lookahead recall).

Tensors are written one shard per layer (plus embedding and head shards), each streamed through
numpy with a fixed seed: the same bytes for the same arguments.
"""

import argparse
import json
import os
import struct

import numpy as np

H, NH, HD, RD, QR, G, OR, W = 4096, 64, 512, 64, 1024, 8, 1024, 128
IH, ID, TOPK = 64, 128, 512
I, K, N, VOCAB = 2048, 6, 4, 129280
KINDS = [0, 4, 128]


class Shard:
    """A safetensors file written tensor by tensor (header first, sizes known up front)."""

    def __init__(self, path, entries):
        self.path, self.entries = path, entries

    def write(self):
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape, data in self.entries:
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
            off += len(data)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        tmp = self.path + ".partial"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for _, _, _, data in self.entries:
                f.write(data)
        os.replace(tmp, self.path)
        return {name: os.path.basename(self.path) for name, _, _, _ in self.entries}


def bf16(rng, shape, std, mean=0.0):
    x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean))
    return (x.view(np.uint32) + 0x8000 >> 16).astype(np.uint16).tobytes()


def f32(rng, shape, std, mean=0.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)).tobytes()


def fp8(rng, name, rows, cols, shift=0):
    """E4M3 codes of magnitude ~1 (exponent field 6..8, random sign and mantissa: rms ~1.5) with
    one e8m0 scale 2^(shift - round(log2(sqrt(cols)))) per 128x128 block: values of size about
    1.5 * 2^shift / sqrt(cols)."""
    sign = rng.integers(0, 2, (rows, cols), dtype=np.uint8) << 7
    exp = rng.integers(6, 9, (rows, cols), dtype=np.uint8) << 3
    mant = rng.integers(0, 8, (rows, cols), dtype=np.uint8)
    e = 127 + shift - int(round(np.log2(np.sqrt(cols))))
    scale = np.full((-(-rows // 128), -(-cols // 128)), e, np.uint8)
    return [(name + ".weight", "F8_E4M3", (rows, cols), (sign | exp | mant).tobytes()),
            (name + ".scale", "F8_E8M0", scale.shape, scale.tobytes())]


def fp4(rng, name, rows, cols, exp):
    codes = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    scale = np.full((rows, cols // 32), 127 + exp, np.uint8)
    return [(name + ".weight", "I8", (rows, cols // 2), codes.tobytes()),
            (name + ".scale", "F8_E8M0", scale.shape, scale.tobytes())]


def layer(rng, i, kind, experts):
    p = f"layers.{i}"
    out = [(f"{p}.attn_norm.weight", "BF16", (H,), bf16(rng, (H,), 0.1, 1.0)),
           (f"{p}.ffn_norm.weight", "BF16", (H,), bf16(rng, (H,), 0.1, 1.0))]
    for hc in ("hc_attn", "hc_ffn"):
        out += [(f"{p}.{hc}_fn", "F32", ((2 + N) * N, N * H), f32(rng, ((2 + N) * N, N * H), 0.02)),
                (f"{p}.{hc}_base", "F32", ((2 + N) * N,), f32(rng, ((2 + N) * N,), 0.0)),
                (f"{p}.{hc}_scale", "F32", (3,), f32(rng, (3,), 0.0, 1.0))]
    a = f"{p}.attn"
    out += [(f"{a}.q_norm.weight", "BF16", (QR,), bf16(rng, (QR,), 0.1, 1.0)),
            (f"{a}.kv_norm.weight", "BF16", (HD,), bf16(rng, (HD,), 0.1, 1.0)),
            (f"{a}.attn_sink", "F32", (NH,), f32(rng, (NH,), 1.0))]
    out += fp8(rng, f"{a}.wq_a", QR, H) + fp8(rng, f"{a}.wq_b", NH * HD, QR) + fp8(rng, f"{a}.wkv", HD, H)
    # The attention moves the stream by a controlled amount (make_olmoe_shape.py's o_proj gain).
    out += fp8(rng, f"{a}.wo_a", G * OR, NH * HD // G, -1) + fp8(rng, f"{a}.wo_b", H, G * OR, -2)

    def compressor(c, width, rate, d):
        return [(f"{c}.wkv.weight", "BF16", (width, H), bf16(rng, (width, H), H ** -0.5)),
                (f"{c}.wgate.weight", "BF16", (width, H), bf16(rng, (width, H), H ** -0.5)),
                (f"{c}.ape", "F32", (rate, width), f32(rng, (rate, width), 0.5)),
                (f"{c}.norm.weight", "BF16", (d,), bf16(rng, (d,), 0.1, 1.0))]

    if kind:
        out += compressor(f"{a}.compressor", 2 * HD if kind == 4 else HD, kind, HD)
    if kind == 4:
        out += fp8(rng, f"{a}.indexer.wq_b", IH * ID, QR)
        out += [(f"{a}.indexer.weights_proj.weight", "BF16", (IH, H), bf16(rng, (IH, H), H ** -0.5))]
        out += compressor(f"{a}.indexer.compressor", 2 * ID, 4, ID)
    f = f"{p}.ffn"
    out.append((f"{f}.gate.weight", "BF16", (experts, H), bf16(rng, (experts, H), H ** -0.5)))
    if i == 0:
        table = np.stack([rng.choice(experts, K, replace=False) for _ in range(VOCAB)]).astype("<i8")
        out.append((f"{f}.gate.tid2eid", "I64", (VOCAB, K), table.tobytes()))
    else:
        out.append((f"{f}.gate.bias", "F32", (experts,), f32(rng, (experts,), 0.0)))
    # e2m1 codes uniform over the 16 values have rms 2.93: gate/up at 2^-8 (~0.73 / sqrt(H)),
    # down at 2^-5 (make_olmoe_shape.py's expert down gain, ~4 / sqrt(I)).
    for e in range(experts):
        out += fp4(rng, f"{f}.experts.{e}.w1", I, H, -8) + fp4(rng, f"{f}.experts.{e}.w3", I, H, -8)
        out += fp4(rng, f"{f}.experts.{e}.w2", H, I, -7)
    out += fp8(rng, f"{f}.shared_experts.w1", I, H, -1) + fp8(rng, f"{f}.shared_experts.w3", I, H, -1)
    out += fp8(rng, f"{f}.shared_experts.w2", H, I, 0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--seed", type=int, default=47)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    n = len(KINDS) + 2
    names = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    weight_map = {}
    weight_map |= Shard(os.path.join(a.out, names[0]), [
        ("embed.weight", "BF16", (VOCAB, H), bf16(rng, (VOCAB, H), 1.0))]).write()
    for i, kind in enumerate(KINDS):
        weight_map |= Shard(os.path.join(a.out, names[1 + i]), layer(rng, i, kind, a.experts)).write()
        print(f"layer {i} written", flush=True)
    weight_map |= Shard(os.path.join(a.out, names[-1]), [
        ("norm.weight", "BF16", (H,), bf16(rng, (H,), 0.1, 1.0)),
        ("hc_head_fn", "F32", (N, N * H), f32(rng, (N, N * H), 0.02)),
        ("hc_head_base", "F32", (N,), f32(rng, (N,), 0.0)),
        ("hc_head_scale", "F32", (1,), f32(rng, (1,), 0.0, 1.0)),
        ("head.weight", "BF16", (VOCAB, H), bf16(rng, (VOCAB, H), H ** -0.5))]).write()
    cfg = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "../../docs/configs/deepseek-v4-flash.config.json")))
    cfg.update({"num_hidden_layers": len(KINDS), "n_routed_experts": a.experts, "num_hash_layers": 1,
                "compress_ratios": KINDS + [0], "num_nextn_predict_layers": 0,
                "max_position_embeddings": 65536})
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
