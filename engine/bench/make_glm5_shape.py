#!/usr/bin/env python3
"""Write a random GLM-5 shaped checkpoint (model_type glm_moe_dsa) in the published FP8 layout.

    make_glm5_shape.py OUT_DIR [--layers 3] [--dense-layers 1] [--no-mtp] [--dims full|small]
                       [--seed 5] [std options] [--bias-file FILE] [--dry-run]

Benchmark model for streaming GLM-5 experts from disk: the tensor names, shapes, dtypes and
config.json of zai-org's GLM-5-FP8 release (transformers' GlmMoeDsaForCausalLM), with fewer
layers and random weights. Weights are not trained: the model measures placement, routing and
I/O, not text quality.

Shape (--dims full, GLM-5's config.json): hidden 6144, vocab 154880, 64 heads (MLA: q_lora_rank
2048, kv_lora_rank 512, qk_nope 192, qk_rope 64, v 256), DSA indexer on every layer (32 heads of
128, index_topk 2048), dense MLP 12288, 256 routed experts of moe_intermediate 2048, top-8, one
shared expert, sigmoid routing with e_score_correction_bias (noaux_tc, n_group 1,
routed_scaling_factor 2.5), rope_theta 1e6 (interleaved), max_position_embeddings 202752.
--layers N decoder layers, the first --dense-layers D dense (first_k_dense_replace), the rest
MoE; with MTP (default; --no-mtp drops it, num_nextn_predict_layers 0) one more MoE layer is
written as model.layers.N (as the release does). One full MoE layer is 9.9 GB.

--dims small: hidden 768, vocab 16384, 8 heads (q_lora 256, kv_lora 64, nope 48, rope 16, v 64),
indexer 8 heads of 32 (index_topk 256), dense MLP 1536, 64 experts of 256, top-8: 39 MB per
MoE layer, 0.23 GB at the default 3 layers + MTP. Any dimension can be overridden
(--hidden, --vocab, --heads, --q-lora, --kv-lora, --nope, --rope, --v-head, --inter,
--moe-inter, --experts, --top-k, --shared-experts, --index-heads, --index-dim, --index-topk).

Layout (as GLM-5-FP8 publishes it):
  * F8_E4M3 + F32 `<name>_scale_inv` [ceil(out/128), ceil(in/128)] (128x128 blocks): attention
    q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj; indexer wq_b, wk; dense MLP,
    shared expert and routed expert gate/up/down_proj (the MTP layer's too);
  * BF16: model.embed_tokens, lm_head, every norm (input/post_attention_layernorm,
    q_a_layernorm, kv_a_layernorm, model.norm, MTP enorm/hnorm/shared_head.norm), indexer
    k_norm.weight/.bias (a LayerNorm) and weights_proj, router mlp.gate.weight, MTP eh_proj;
  * F32: mlp.gate.e_score_correction_bias;
  * MTP layer N: embed_tokens, enorm, hnorm, eh_proj [H, 2H], a full MoE decoder layer,
    shared_head.norm, shared_head.head. embed_tokens / shared_head.head are byte copies of
    model.embed_tokens / lm_head (as DeepSeek-V3 and coli's spec have them; coli-convert
    needs them); the GLM-5 family releases seem to leave them out (runtimes bind the main
    embedding and lm_head): --no-mtp-copies writes that layout.
  * config.json as the release's (first_k_dense_replace, no mlp_layer_types/indexer_types),
    quantization_config {quant_method fp8, fmt e4m3, activation_scheme dynamic,
    weight_block_size [128, 128]}; generation_config.json (eos/pad ids: GLM-5's, or the same
    distance from the end of a smaller vocab); generator.json records every option.

Values. FP8 weights are 64 KiB chunks copied, at seeded random offsets, from a 16 MiB pool of
e4m3 codes of N(0,1) * 64 (|values| <= ~280, under e4m3's 448; the pool is drawn by inverse
CDF from 16-bit uniform samples, so tails stop at ~4.3 sigma); every weight_scale_inv block is
std / 64, so each weight is effectively N(0, std^2). BF16 weights are chunks of an 8 MiB pool of
N(0, std^2) bf16 values (one pool per std, same draws scaled). Norm weights and biases are drawn
per element. No numpy needed. Every tensor's chunk offsets come from its own generator seeded
by (--seed, tensor name): the same options give the same bytes, a tensor does not change when
other tensors are added or removed (e.g. --layers 1 vs 3 share layer 0), and changing a std
rescales the same draws (FP8: only weight_scale_inv changes).

Standard deviations (fan_in = a linear weight's input width; printed before writing):
  --embed-std S        model.embed_tokens (and the MTP copy).                 default 1.0
  --lm-head-std S      lm_head (and the MTP copy).                    default 1/sqrt(hidden)
  --in-std-gain G      gain/sqrt(fan_in): q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj,
                       indexer wq_b, wk, weights_proj, MTP eh_proj, and every gate_proj /
                       up_proj (routed experts, shared expert, dense MLP).        default 1.0
  --out-std-gain G     gain/sqrt(fan_in): o_proj and every down_proj (routed, shared, dense,
                       MTP's).                                                    default 0.5
  --out-growth R       out-projection std of decoder layer L times R**L (the MTP layer is
                       L = N).                                                    default 1.0
  --router-std-gain G  mlp.gate.weight std gain/sqrt(hidden).                     default 1.0
  --norm-jitter J      norm weights 1 + N(0, J^2).                                default 0.1
  --attn-norm-gain A   q_a_layernorm, kv_a_layernorm and indexer k_norm.weight are A times
                       (1 + N(0, J^2)); k_norm.bias is A * N(0, J^2).             default 1.0
  --routing degenerate every weight, the embeddings and lm_head N(0, 0.02^2) (the scales of
                       the old OLMoE generator, whose routing collapsed): for the test that
                       engine/bench/routing_stats.py refuses such a model.
  --bias-file FILE     e_score_correction_bias per MoE layer from JSON {"<layer>": [E floats]}
                       (the MTP layer is "<N>"); layers not in the file get zeros (default:
                       all zeros). This is how a benchmark calibrates expert balance, as
                       DeepSeek-V3's auxiliary-loss-free balancing does during training.
                       A malformed file exits 2 before anything is written.

Files. One shard per decoder layer, one for model.embed_tokens first and one for model.norm +
lm_head last; a layer over --max-shard-gb (default 5, GB = 1e9 bytes) is split between its
tensors (its routed experts over several shards). Each shard is written as NAME.tmp and renamed
when complete; model.safetensors.index.json, config.json and generation_config.json are written
last (an existing index/config in OUT_DIR is removed first, so an interrupted run never looks
complete). Memory stays under ~100 MB. Before writing, the total is compared with the free
space of OUT_DIR's filesystem: less than total + 1 GiB exits 2 without writing anything.

  --dry-run          print the shard plan (tensor names, dtypes, shapes, bytes; routed experts
                     folded into ranges unless --verbose) and the disk check, write nothing.
  --max-shard-gb X   shard size limit (default 5).
  --seed N           (default 5).
"""
import argparse
import array
import bisect
import json
import math
import os
import random
import re
import struct
import sys
import time
from statistics import NormalDist

CHUNK = 64 * 1024  # bytes per copied chunk
FP8_POOL = 16 * 1024 * 1024  # e4m3 codes
BF16_POOL = 4 * 1024 * 1024  # bf16 values (8 MiB)
DEGENERATE_STD = 0.02  # --routing degenerate: the old OLMoE generator's one std
FP8_UNIT = 64.0  # pool codes hold N(0,1) * FP8_UNIT; scale_inv = std / FP8_UNIT
BLOCK = 128
BATCH = 256  # chunks per writev
MARGIN = 1 << 30  # free space required beyond the bytes written
GLM5_EOS = (154820, 154827, 154829)  # GLM-5 eos ids; pad = the first
GLM5_VOCAB = 154880

DIMS = {
    "full": dict(hidden=6144, vocab=154880, heads=64, q_lora=2048, kv_lora=512, nope=192, rope=64,
                 v_head=256, inter=12288, moe_inter=2048, experts=256, top_k=8, shared_experts=1,
                 index_heads=32, index_dim=128, index_topk=2048),
    "small": dict(hidden=768, vocab=16384, heads=8, q_lora=256, kv_lora=64, nope=48, rope=16,
                  v_head=64, inter=1536, moe_inter=256, experts=64, top_k=8, shared_experts=1,
                  index_heads=8, index_dim=32, index_topk=256),
}

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1}


# ----------------------------------------------------------------------------- encodings


def bf16_code(x: float) -> int:
    """f32 value -> bf16 bits, round to nearest even."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_bytes(values) -> bytes:
    a = array.array("H", (bf16_code(v) for v in values))
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def f32_bytes(values) -> bytes:
    a = array.array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def e4m3_encoder():
    """float -> e4m3fn code (round to nearest, saturating at +-448)."""
    vals = []
    for c in range(127):  # 0x7f is NaN
        e, m = c >> 3, c & 7
        vals.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    mids = [(vals[i] + vals[i + 1]) / 2 for i in range(126)]

    def enc(x: float) -> int:
        c = bisect.bisect_left(mids, abs(x))
        return c | 0x80 if x < 0 else c

    return enc, vals


def e4m3_value(code: int, vals) -> float:
    v = vals[code & 0x7F]
    return -v if code & 0x80 else v


# ----------------------------------------------------------------------------- pools


class Pools:
    """Fixed pools of random codes; tensors are sequences of chunks copied from them."""

    def __init__(self, seed: int):
        self.seed = seed
        nd = NormalDist()
        # 16-bit inverse CDF table: uniform u16 -> N(0,1) quantile
        self.z = [nd.inv_cdf((k + 0.5) / 65536.0) for k in range(65536)]
        enc, self.e4m3_vals = e4m3_encoder()
        table = bytes(enc(z * FP8_UNIT) for z in self.z)
        idx = self._u16(f"{seed}/pool/fp8", FP8_POOL)
        self.fp8 = memoryview(bytes(map(table.__getitem__, idx)))
        rms = math.sqrt(sum(e4m3_value(c, self.e4m3_vals) ** 2 for c in table) / 65536.0)
        self.fp8_rms = rms / FP8_UNIT  # std of a pool value in units of FP8_UNIT (~1)
        self._bf16_idx = self._u16(f"{seed}/pool/bf16", BF16_POOL)
        self._bf16 = {}

    @staticmethod
    def _u16(key: str, n: int) -> array.array:
        a = array.array("H", random.Random(key).randbytes(2 * n))
        if sys.byteorder != "little":
            a.byteswap()
        return a

    def bf16(self, std: float) -> memoryview:
        p = self._bf16.get(std)
        if p is None:
            table = array.array("H", (bf16_code(z * std) for z in self.z))
            a = array.array("H", map(table.__getitem__, self._bf16_idx))
            if sys.byteorder != "little":
                a.byteswap()
            p = self._bf16[std] = memoryview(a.tobytes())
        return p

    def chunks(self, pool: memoryview, nbytes: int, key: str, align: int):
        """nbytes as memoryview chunks of `pool` at offsets drawn by a generator seeded by key."""
        rng = random.Random(f"{self.seed}/{key}")
        top = (len(pool) - CHUNK) // align
        left = nbytes
        while left > 0:
            n = min(CHUNK, left)
            off = align * rng.randrange(top)
            yield pool[off : off + n]
            left -= n


# ----------------------------------------------------------------------------- plan


class T:
    """One tensor of the plan: name, dtype, shape, and how to make its bytes."""

    __slots__ = ("name", "dtype", "shape", "kind", "std", "src", "extra")

    def __init__(self, name, dtype, shape, kind, std=0.0, src=None, extra=None):
        self.name, self.dtype, self.shape, self.kind = name, dtype, tuple(shape), kind
        self.std, self.src, self.extra = std, src or name, extra

    @property
    def nbytes(self) -> int:
        n = DTYPE_SIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


def blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


def build_plan(a, d):
    """Returns (list of shards, each a list of units (lists of T)), stds table."""
    H, V = d["hidden"], d["vocab"]
    nh, qr, kr = d["heads"], d["q_lora"], d["kv_lora"]
    dn, dr, dv = d["nope"], d["rope"], d["v_head"]
    I, MI, E, S = d["inter"], d["moe_inter"], d["experts"], d["shared_experts"]
    ih, idim = d["index_heads"], d["index_dim"]
    N, D = a.layers, a.dense_layers
    lm_std = a.lm_head_std if a.lm_head_std is not None else 1.0 / math.sqrt(H)
    J, A = a.norm_jitter, a.attn_norm_gain
    router_std = a.router_std_gain / math.sqrt(H)
    if a.routing == "degenerate":
        lm_std = router_std = DEGENERATE_STD

    def gin(fan_in):
        if a.routing == "degenerate":
            return DEGENERATE_STD
        return a.in_std_gain / math.sqrt(fan_in)

    def gout(fan_in, layer):
        if a.routing == "degenerate":
            return DEGENERATE_STD
        return a.out_std_gain / math.sqrt(fan_in) * a.out_growth**layer

    def fp8(name, out_f, in_f, std):
        return [T(name + ".weight", "F8_E4M3", (out_f, in_f), "fp8", std),
                T(name + ".weight_scale_inv", "F32", (blocks(out_f), blocks(in_f)), "scale", std)]

    def bf16w(name, shape, std, src=None):
        return [T(name, "BF16", shape, "bf16", std, src)]

    def norm(name, n, gain=1.0, jitter=J):
        return [T(name, "BF16", (n,), "norm", jitter, extra=gain)]

    def layer_units(L, mtp):
        p = f"model.layers.{L}."
        at = p + "self_attn."
        units = []
        if mtp:
            if a.mtp_copies:
                units.append(bf16w(p + "embed_tokens.weight", (V, H), a.embed_std,
                                   "model.embed_tokens.weight"))
            units.append(norm(p + "enorm.weight", H))
            units.append(norm(p + "hnorm.weight", H))
            units.append(bf16w(p + "eh_proj.weight", (H, 2 * H), gin(2 * H)))
        units.append(norm(p + "input_layernorm.weight", H))
        units.append(fp8(at + "q_a_proj", qr, H, gin(H)))
        units.append(norm(at + "q_a_layernorm.weight", qr, A))
        units.append(fp8(at + "q_b_proj", nh * (dn + dr), qr, gin(qr)))
        units.append(fp8(at + "kv_a_proj_with_mqa", kr + dr, H, gin(H)))
        units.append(norm(at + "kv_a_layernorm.weight", kr, A))
        units.append(fp8(at + "kv_b_proj", nh * (dn + dv), kr, gin(kr)))
        units.append(fp8(at + "o_proj", H, nh * dv, gout(nh * dv, L)))
        ix = at + "indexer."
        units.append(fp8(ix + "wq_b", ih * idim, qr, gin(qr)))
        units.append(fp8(ix + "wk", idim, H, gin(H)))
        units.append(norm(ix + "k_norm.weight", idim, A))
        units.append([T(ix + "k_norm.bias", "BF16", (idim,), "bias", J, extra=A)])
        units.append(bf16w(ix + "weights_proj.weight", (ih, H), gin(H)))
        units.append(norm(p + "post_attention_layernorm.weight", H))
        m = p + "mlp."
        if L < D and not mtp:
            units.append(fp8(m + "gate_proj", I, H, gin(H)))
            units.append(fp8(m + "up_proj", I, H, gin(H)))
            units.append(fp8(m + "down_proj", H, I, gout(I, L)))
        else:
            units.append(bf16w(m + "gate.weight", (E, H), router_std))
            units.append([T(m + "gate.e_score_correction_bias", "F32", (E,), "ebias", extra=L)])
            SI = MI * S
            units.append(fp8(m + "shared_experts.gate_proj", SI, H, gin(H)))
            units.append(fp8(m + "shared_experts.up_proj", SI, H, gin(H)))
            units.append(fp8(m + "shared_experts.down_proj", H, SI, gout(SI, L)))
            for e in range(E):  # one unit per expert: a shard boundary never splits an expert
                units.append(fp8(f"{m}experts.{e}.gate_proj", MI, H, gin(H))
                             + fp8(f"{m}experts.{e}.up_proj", MI, H, gin(H))
                             + fp8(f"{m}experts.{e}.down_proj", H, MI, gout(MI, L)))
        if mtp:
            units.append(norm(p + "shared_head.norm.weight", H))
            if a.mtp_copies:
                units.append(bf16w(p + "shared_head.head.weight", (V, H), lm_std, "lm_head.weight"))
        return units

    limit = int(a.max_shard_gb * 1e9)

    def pack(units):
        shards, cur, size = [], [], 0
        for u in units:
            n = sum(t.nbytes for t in u)
            if cur and size + n > limit:
                shards.append(cur)
                cur, size = [], 0
            cur.append(u)
            size += n
        if cur:
            shards.append(cur)
        return shards

    shards = [[bf16w("model.embed_tokens.weight", (V, H), a.embed_std)]]
    for L in range(N):
        shards.extend(pack(layer_units(L, False)))
    if a.mtp:
        shards.extend(pack(layer_units(N, True)))
    shards.append([norm("model.norm.weight", H), bf16w("lm_head.weight", (V, H), lm_std)])

    stds = [
        ("model.embed_tokens (BF16)", a.embed_std),
        ("lm_head (BF16)", lm_std),
        ("q_a_proj, kv_a_proj_with_mqa, indexer wk/weights_proj, gate/up_proj (fan_in hidden)", gin(H)),
        ("q_b_proj, indexer wq_b (fan_in q_lora)", gin(qr)),
        ("kv_b_proj (fan_in kv_lora)", gin(kr)),
        ("router mlp.gate.weight (BF16)", router_std),
    ]
    if a.mtp:
        stds.append(("MTP eh_proj (BF16, fan_in 2*hidden)", gin(2 * H)))
    layers = list(range(N)) + ([N] if a.mtp else [])
    for L in layers if a.out_growth != 1.0 else layers[:1]:
        tag = f"layer {L}" if a.out_growth != 1.0 else "every layer"
        stds.append((f"o_proj ({tag}, fan_in heads*v_head)", gout(nh * dv, L)))
        if a.out_growth == 1.0 or (L < D and L < N):
            stds.append((f"dense MLP down_proj ({tag}, fan_in inter)", gout(I, L)))
        if a.out_growth == 1.0 or L >= D:
            stds.append((f"routed/shared expert down_proj ({tag}, fan_in moe_inter)", gout(MI, L)))
    stds.append(("norm weights 1 + N(0, J^2), J", J))
    stds.append(("q_a/kv_a_layernorm, indexer k_norm: gain", A))
    return shards, stds


# ----------------------------------------------------------------------------- writing


def gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB"


def shard_header(tensors) -> bytes:
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h


def order(units):
    """Tensors of a shard: F32, then BF16, then F8 (keeps each dtype aligned), stable."""
    ts = [t for u in units for t in u]
    return sorted(ts, key=lambda t: -DTYPE_SIZE[t.dtype])


def writev_all(fd: int, bufs) -> None:
    total = sum(len(b) for b in bufs)
    n = os.writev(fd, bufs)
    if n == total:
        return
    # partial write (rare on regular files): finish the rest buffer by buffer
    for b in bufs:
        if n >= len(b):
            n -= len(b)
            continue
        b = b[n:]
        n = 0
        while len(b):
            w = os.write(fd, b)
            b = b[w:]


def tensor_bytes(t: T, pools: Pools, a, biases):
    """Yields the tensor's bytes as buffers."""
    if t.kind == "fp8":
        yield from pools.chunks(pools.fp8, t.nbytes, t.src, 1)
    elif t.kind == "bf16":
        yield from pools.chunks(pools.bf16(t.std), t.nbytes, t.src, 2)
    elif t.kind == "scale":
        yield struct.pack("<f", t.std / FP8_UNIT) * (t.nbytes // 4)
    elif t.kind == "norm":
        rng = random.Random(f"{a.seed}/{t.src}")
        yield bf16_bytes(t.extra * (1.0 + rng.gauss(0.0, t.std)) for _ in range(t.shape[0]))
    elif t.kind == "bias":
        rng = random.Random(f"{a.seed}/{t.src}")
        yield bf16_bytes(t.extra * rng.gauss(0.0, t.std) for _ in range(t.shape[0]))
    elif t.kind == "ebias":
        vals = biases.get(t.extra)
        yield f32_bytes(vals if vals is not None else [0.0] * t.shape[0])
    else:
        raise AssertionError(t.kind)


def write_shard(path: str, tensors, pools, a, biases) -> int:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    try:
        hdr = shard_header(tensors)
        writev_all(fd, [hdr])
        written += len(hdr)
        batch = []
        for t in tensors:
            for b in tensor_bytes(t, pools, a, biases):
                batch.append(b)
                written += len(b)
                if len(batch) >= BATCH:
                    writev_all(fd, batch)
                    batch = []
        if batch:
            writev_all(fd, batch)
        if a.fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    return written


# ----------------------------------------------------------------------------- config


def config_json(a, d) -> dict:
    V = d["vocab"]
    eos = [V - (GLM5_VOCAB - e) for e in GLM5_EOS]
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "eos_token_id": eos,
        "ep_size": 1,
        "first_k_dense_replace": a.dense_layers,
        "hidden_act": "silu",
        "head_dim": d["rope"],
        "hidden_size": d["hidden"],
        "index_head_dim": d["index_dim"],
        "index_n_heads": d["index_heads"],
        "index_topk": d["index_topk"],
        "indexer_rope_interleave": True,
        "initializer_range": 0.02,
        "intermediate_size": d["inter"],
        "kv_lora_rank": d["kv_lora"],
        "max_position_embeddings": a.max_position_embeddings,
        "moe_intermediate_size": d["moe_inter"],
        "moe_layer_freq": 1,
        "model_type": "glm_moe_dsa",
        "n_group": 1,
        "n_routed_experts": d["experts"],
        "n_shared_experts": d["shared_experts"],
        "norm_topk_prob": True,
        "num_attention_heads": d["heads"],
        "num_experts_per_tok": d["top_k"],
        "num_hidden_layers": a.layers,
        "num_key_value_heads": d["heads"],
        "num_nextn_predict_layers": 1 if a.mtp else 0,
        "pad_token_id": eos[0],
        "pretraining_tp": 1,
        "q_lora_rank": d["q_lora"],
        "qk_head_dim": d["nope"] + d["rope"],
        "qk_nope_head_dim": d["nope"],
        "qk_rope_head_dim": d["rope"],
        "rms_norm_eps": 1e-05,
        "rope_interleave": True,
        "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "transformers_version": "5.0.2.dev0",
        "use_cache": True,
        "v_head_dim": d["v_head"],
        "vocab_size": V,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }
    return cfg


def free_bytes(path: str) -> int:
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def fail(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def load_biases(a, moe_layers, E):
    if not a.bias_file:
        return {}
    try:
        with open(a.bias_file) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"--bias-file {a.bias_file}: {e}")
    if not isinstance(raw, dict):
        fail(f"{a.bias_file}: expected a JSON object {{\"<layer>\": [{E} floats]}}")
    out = {}
    for k, v in raw.items():
        try:
            L = int(k)
        except ValueError:
            fail(f"{a.bias_file}: key {k!r} is not a layer index")
        if not isinstance(v, list) or len(v) != E or not all(isinstance(x, (int, float)) for x in v):
            fail(f"{a.bias_file}: layer {k}: expected a list of {E} numbers")
        if L not in moe_layers:
            print(f"warning: {a.bias_file}: layer {L} is not a MoE layer of this model, ignored",
                  file=sys.stderr)
            continue
        out[L] = [float(x) for x in v]
    return out


def main() -> int:
    class Fmt(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        def _get_help_string(self, action):
            if action.default is None or isinstance(action.default, bool):
                return action.help
            return super()._get_help_string(action)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Fmt,
                                 usage="%(prog)s OUT_DIR [options] (see below)")
    add = ap.add_argument
    add("out", metavar="OUT_DIR", help="checkpoint directory (created)")
    add("--layers", type=int, default=3, help="decoder layers N")
    add("--dense-layers", type=int, default=1, help="first_k_dense_replace D")
    add("--no-mtp", dest="mtp", action="store_false", help="no MTP layer (num_nextn_predict_layers 0)")
    add("--no-mtp-copies", dest="mtp_copies", action="store_false",
        help="leave out the MTP layer's embed_tokens / shared_head.head copies")
    add("--dims", choices=sorted(DIMS), default="full", help="dimension set")
    for k in DIMS["full"]:
        add("--" + k.replace("_", "-"), dest=k, type=int, default=None, metavar="N",
            help=f"override (full {DIMS['full'][k]}, small {DIMS['small'][k]})")
    add("--max-position-embeddings", type=int, default=202752, metavar="N", help="config value (at least 16384)")
    add("--seed", type=int, default=5, help="same seed + options = same bytes")
    add("--routing", choices=["realistic", "degenerate"], default="realistic",
        help="degenerate: every weight and the embeddings N(0, 0.02^2), as the old OLMoE generator (tests)")
    add("--embed-std", type=float, default=1.0, metavar="S", help="model.embed_tokens std")
    add("--lm-head-std", type=float, default=None, metavar="S", help="lm_head std (None: 1/sqrt(hidden))")
    add("--in-std-gain", type=float, default=1.0, metavar="G", help="input projections: std G/sqrt(fan_in)")
    add("--out-std-gain", type=float, default=0.5, metavar="G", help="o_proj, down_proj: std G/sqrt(fan_in)")
    add("--out-growth", type=float, default=1.0, metavar="R", help="out-projection std of layer L times R**L")
    add("--router-std-gain", type=float, default=1.0, metavar="G", help="mlp.gate.weight std G/sqrt(hidden)")
    add("--norm-jitter", type=float, default=0.1, metavar="J", help="norm weights 1 + N(0, J^2)")
    add("--attn-norm-gain", type=float, default=1.0, metavar="A", help="q_a/kv_a_layernorm, indexer k_norm times A")
    add("--bias-file", default=None, metavar="FILE", help='e_score_correction_bias JSON {"<layer>": [E floats]}')
    add("--max-shard-gb", type=float, default=5.0, metavar="X", help="split a layer over shards of at most X GB")
    add("--fsync", action="store_true", help="fsync each shard before renaming it")
    add("--dry-run", action="store_true", help="print the shard plan and disk check, write nothing")
    add("--verbose", action="store_true", help="with --dry-run: every tensor on its own line")
    a = ap.parse_args()

    d = dict(DIMS[a.dims])
    for k in d:
        v = getattr(a, k)
        if v is not None:
            d[k] = v
    if a.layers < 1 or not 0 <= a.dense_layers <= a.layers:
        ap.error("need --layers >= 1 and 0 <= --dense-layers <= --layers")
    if (any(v <= 0 for v in d.values()) or d["top_k"] > d["experts"] or d["index_dim"] < d["rope"]
            or d["rope"] % 2):
        ap.error(f"bad dimensions {d} (all positive, top_k <= experts, even rope <= index_dim)")
    if d["vocab"] <= GLM5_VOCAB - min(GLM5_EOS):
        ap.error(f"--vocab must exceed {GLM5_VOCAB - min(GLM5_EOS)} "
                 "(the eos ids sit at GLM-5's distance from the end of the vocabulary)")
    if a.max_position_embeddings < 16384:
        ap.error("--max-position-embeddings must be at least 16384")
    if a.max_shard_gb <= 0:
        ap.error("--max-shard-gb must be positive")

    if a.routing == "degenerate":
        a.embed_std = DEGENERATE_STD
    shards, stds = build_plan(a, d)
    moe_layers = set(range(a.dense_layers, a.layers)) | ({a.layers} if a.mtp else set())
    biases = load_biases(a, moe_layers, d["experts"])
    count = len(shards)
    names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    sizes = [len(shard_header(order(s))) + sum(t.nbytes for u in s for t in u) for s in shards]
    weight_total = sum(t.nbytes for s in shards for u in s for t in u)
    index_bytes = sum(len(t.name) + len(names[0]) + 12 for s in shards for u in s for t in u)
    total = sum(sizes) + index_bytes + 16384  # + index, config, generation_config, generator.json

    print(f"GLM-5 shape ({a.dims} dims): " + ", ".join(f"{k} {v}" for k, v in d.items()))
    print(f"layers {a.layers} (dense {a.dense_layers}, MoE {a.layers - a.dense_layers})"
          + ((f" + MTP layer {a.layers}" + ("" if a.mtp_copies else " (no embed/head copies)"))
             if a.mtp else ", no MTP")
          + f", seed {a.seed}")
    print("stds:")
    for what, s in stds:
        print(f"  {s:.6g}  {what}")
    if biases:
        print(f"e_score_correction_bias from {a.bias_file}: layers {sorted(biases)}; others zero")
    print(f"plan: {count} shards, {gb(sum(sizes))} ({sum(sizes) / 2**30:.2f} GiB)")

    if a.dry_run:
        for name, s, size in zip(names, shards, sizes):
            ts = order(s)
            print(f"{name}: {gb(size)}, {len(ts)} tensors")
            folded = {}
            for t in ts:
                m = re.search(r"\.experts\.(\d+)\.", t.name)
                shown = t.name if not m or a.verbose else re.sub(r"\.experts\.\d+\.", ".experts.{E}.", t.name)
                key = (shown, t.dtype, t.shape)
                ent = folded.setdefault(key, [0, 0, []])
                ent[0] += 1
                ent[1] += t.nbytes
                if m:
                    ent[2].append(int(m.group(1)))
            for (n, dt, shape), (c, nb, es) in folded.items():
                if c > 1:
                    n = n.replace("{E}", f"{{{min(es)}..{max(es)}}}")
                    print(f"    {n:72s} {dt:8s} {str(list(shape)):14s} x{c} {nb:>14,d} B")
                else:
                    print(f"    {n:72s} {dt:8s} {str(list(shape)):14s}    {nb:>14,d} B")
        print(f"total: {gb(sum(sizes))} in {count} shards ({gb(weight_total)} of tensor data)")

    free = free_bytes(a.out)
    need = total + MARGIN
    if free < need:
        print(f"error: {a.out}: its filesystem has {gb(free)} free, this checkpoint needs {gb(total)} "
              f"+ {gb(MARGIN)} margin; nothing written", file=sys.stderr)
        return 2
    print(f"disk: {gb(free)} free, {gb(total)} to write (+ {gb(MARGIN)} margin): ok")
    if a.dry_run:
        return 0

    os.makedirs(a.out, exist_ok=True)
    for f in ("model.safetensors.index.json", "config.json", "generation_config.json", "generator.json"):
        p = os.path.join(a.out, f)
        if os.path.exists(p):
            os.unlink(p)
    stale = [f for f in os.listdir(a.out) if f.endswith(".safetensors") and f not in names]
    if stale:
        print(f"warning: {a.out} holds {len(stale)} other .safetensors files (not in the new index): "
              + ", ".join(sorted(stale)[:4]) + (" ..." if len(stale) > 4 else ""), file=sys.stderr)

    t0 = time.time()
    pools = Pools(a.seed)
    print(f"pools: {len(pools.fp8) >> 20} MiB e4m3 (rms {pools.fp8_rms:.4f} x {FP8_UNIT:g}) "
          f"in {time.time() - t0:.1f} s", flush=True)
    weight_map = {}
    done = 0
    t_write = time.time()
    for name, s, size in zip(names, shards, sizes):
        ts = order(s)
        t1 = time.time()
        n = write_shard(os.path.join(a.out, name), ts, pools, a, biases)
        assert n == size, (name, n, size)
        dt = time.time() - t1
        done += n
        for t in ts:
            weight_map[t.name] = name
        what = sorted({".".join(t.name.split(".")[:3]) if t.name.startswith("model.layers.") else t.name
                       for t in ts})
        print(f"{name}: {gb(n)} in {dt:.1f} s ({n / 1e6 / max(dt, 1e-9):.0f} MB/s) [{', '.join(what)}]; "
              f"{gb(done)} of {gb(sum(sizes))}", flush=True)
    elapsed = time.time() - t_write

    index = {"metadata": {"total_size": weight_total}, "weight_map": dict(sorted(weight_map.items()))}
    cfg = config_json(a, d)
    gen = {"_from_model_config": True, "eos_token_id": cfg["eos_token_id"],
           "pad_token_id": cfg["pad_token_id"], "transformers_version": cfg["transformers_version"]}
    meta = {"generator": "engine/bench/make_glm5_shape.py", "dims": d,
            "options": {k: v for k, v in vars(a).items() if k not in d and k != "out"},
            "stds": {w: s for w, s in stds}, "fp8_unit": FP8_UNIT, "fp8_pool_rms": pools.fp8_rms}
    for fname, obj in (("model.safetensors.index.json", index), ("generator.json", meta),
                       ("generation_config.json", gen), ("config.json", cfg)):
        with open(os.path.join(a.out, fname + ".tmp"), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
        os.replace(os.path.join(a.out, fname + ".tmp"), os.path.join(a.out, fname))
    print(f"wrote {count} shards, {gb(done)}, to {a.out} in {elapsed:.1f} s "
          f"({done / 1e6 / max(elapsed, 1e-9):.0f} MB/s; {time.time() - t0:.1f} s with pools)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
