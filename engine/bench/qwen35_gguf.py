#!/usr/bin/env python3
"""Convert a Qwen3.5/3.6-MoE Hugging Face checkpoint (the published BF16 layout: config
`qwen3_5_moe` with `text_config`, tensors `model.language_model.*`, fused experts) to llama.cpp
GGUFs of architecture `qwen35moe` (issue 44 benchmark: the same weights in coli and llama.cpp).

Writes OUT_PREFIX-bf16.gguf as llama.cpp's converter would (conversion/qwen.py at the llama.cpp
that llama-cpp-python 0.3.36 vendors: Qwen3_5MoeTextModel = _LinearAttentionVReorderBase over
Qwen3NextModel over Qwen2MoeModel, with _Qwen35MRopeMixin; MTP left out as its `no_mtp` does),
streaming tensor by tensor, then quantizes it with llama.cpp's own quantizer
(llama_model_quantize, what `llama-quantize IN OUT Q4_0` does: olmoe_gguf.quantize) and lists
every tensor's type.

Tensor rules (cited from that converter):
  * names through gguf's own tensor map for MODEL_ARCH.QWEN35MOE after dropping the
    `language_model.` of the wrapper; `model.visual.*` and `mtp.*` skipped;
  * Qwen3NextModel.modify_tensors: `A_log` -> ssm_a = -exp(A_log); `dt_bias` -> ssm_dt.bias;
    `conv1d.weight` squeezed to [C, K]; every `*norm.weight` but `linear_attn.norm.weight` + 1
    (llama.cpp multiplies by the stored weight; transformers by 1 + w);
  * _LinearAttentionVReorderBase (Hk != Hv): value heads reordered from grouped-by-key-head
    (HF: key head g serves value heads g r .. g r + r - 1) to tiled order (position j r + g ->
    j Hk + g) in the V rows of in_proj_qkv, the rows of in_proj_z, in_proj_b, in_proj_a, the
    V channels of conv1d, A_log / dt_bias, and the columns of out_proj: llama.cpp's graph
    broadcasts key heads over value heads tiled (ggml_repeat);
  * experts: `mlp.experts.gate_up_proj` [E, 2I, H] split into ffn_gate_exps = [:, :I] and
    ffn_up_exps = [:, I:] (GGML ne {H, I, E}), `down_proj` [E, H, I] as ffn_down_exps
    (ne {I, H, E}); per-expert names (the FP8 releases' layout) stacked the same way;
  * types for --outtype bf16 (conversion/base.py prepare_tensors): 1-D tensors, `*_norm.weight`,
    ffn_gate_inp, ffn_gate_inp_shexp, ssm_conv1d and names not ending in `.weight` in F32,
    everything else BF16 (the checkpoint's bits, reordered);
  * keys: TextModel (context_length, embedding_length, block_count, head counts, rope base, rms
    eps, expert_used_count, key/value_length = head_dim), Qwen2MoeModel (expert_count,
    expert_feed_forward_length, expert_shared_feed_forward_length), Qwen3NextModel
    (ssm.conv_kernel, ssm.state_size = dk, ssm.group_count = Hk, ssm.time_step_rank = Hv,
    ssm.inner_size = Hv dv, full_attention_interval, rope.dimension_count = head_dim x
    partial_rotary_factor), _Qwen35MRopeMixin (rope.dimension_sections: mrope_section + [0]).
The checkpoint has no tokenizer: tokenizer.ggml.model "none" and qwen35moe.vocab_size (as
olmoe_gguf.py), token ids only.

Usage:
  qwen35_gguf.py HF_DIR OUT_PREFIX [--types q4_0,q8_0] [--threads 2] [--keep-bf16]
  qwen35_gguf.py --selftest MODEL_DIR   # qwen3_5_moe_shape.py --dims tiny --oracle MODEL_DIR
--selftest converts MODEL_DIR to a BF16 GGUF in a temporary directory and runs llama.cpp on it:
the last-position logits of oracle.json's prompts (8, 64 and 150 ids; llama.cpp runs each in
one batch, its chunked Gated DeltaNet form) must match transformers' (float32, from the same
BF16 weights) within 1e-3 from an all-F32 GGUF of the same values, and with the same argmax
from the BF16 GGUF (whose activations llama.cpp rounds to bf16; the difference is printed). That is the check that
llama.cpp runs this architecture on the weights this script writes, before any speed is
compared. (The committed fixture tiny/qwen3_5_moe_bf16 cannot serve: its dk 16 != dv 24, and
llama.cpp's graph holds the state as dv x dv, so it needs dk == dv, as every release has.)

Needs numpy, gguf and llama-cpp-python (the benchmark venv; never part of CI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import olmoe_gguf as og  # noqa: E402  (quantize, listing, LlamaLogits, die)

import gguf  # noqa: E402

ARCH = "qwen35moe"
BF16, F32 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32
die = og.die


class Checkpoint:
    """Raw tensors of a (sharded) safetensors checkpoint: BF16 as uint16, F32 as float32."""

    def __init__(self, d: str):
        self.dir = d
        with open(os.path.join(d, "config.json")) as f:
            self.config = json.load(f)
        idx = os.path.join(d, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.isfile(idx) \
            else ["model.safetensors"]
        self.tensors = {}
        for fn in files:
            p = os.path.join(d, fn)
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                h = json.loads(f.read(n))
            for name, info in h.items():
                if name != "__metadata__":
                    self.tensors[name] = (p, 8 + n + info["data_offsets"][0], tuple(info["shape"]),
                                          info["dtype"])

    def raw(self, name: str) -> np.ndarray:
        p, off, shape, dt = self.tensors[name]
        np_dt = {"BF16": np.uint16, "F32": np.float32}.get(dt)
        if np_dt is None:
            die(f"{name}: dtype {dt} (BF16 or F32 expected)")
        return np.fromfile(p, dtype=np_dt, count=int(np.prod(shape)) if shape else 1,
                           offset=off).reshape(shape)

    def f32(self, name: str) -> np.ndarray:
        a = self.raw(name)
        return og.bf16_to_f32(a) if a.dtype == np.uint16 else a


def text_config(cfg: dict) -> dict:
    t = cfg.get("text_config", cfg)
    if t.get("model_type") != "qwen3_5_moe_text":
        die(f"model_type {t.get('model_type')!r}: a qwen3_5_moe checkpoint is expected")
    return t


def reorder_v(a: np.ndarray, axis: int, hk: int, r: int, d: int) -> np.ndarray:
    """Grouped (key head g, then its r value heads) to tiled (value slot j, then key head g)
    along `axis`, `d` values per head (_LinearAttentionVReorderBase._reorder_v_heads)."""
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape((hk, r, d) + rest).swapaxes(0, 1).reshape((hk * r * d,) + rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def plan(ck: Checkpoint, all_f32: bool = False):
    """[(gguf name, numpy shape, type, producer)] in write order; producer() gives the array
    (uint16 BF16 bits for BF16 tensors, float32 for F32 ones)."""
    t = text_config(ck.config)
    n_layer = t["num_hidden_layers"]
    hk, hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv = t["linear_key_head_dim"], t["linear_value_head_dim"]
    r = hv // hk
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE, n_layer)
    names = {n.replace("model.language_model.", "model.", 1): n for n in ck.tensors
             if not n.startswith(("model.visual.", "mtp."))}
    out, used = [], set()

    def gname(hf: str) -> str:
        n = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if n is None:
            die(f"cannot map tensor {hf!r} (gguf {gguf.__version__})")
        return n

    def qtype(g: str, ndim: int):
        if all_f32:
            return F32
        if ndim <= 1 or g.endswith("_norm.weight") or not g.endswith(".weight"):
            return F32
        if re.fullmatch(r"blk\.\d+\.(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d)\.weight", g):
            return F32
        return BF16

    def add(g: str, shape, fn):
        ty = qtype(g, len(shape))
        out.append((g, tuple(shape), ty, fn))

    def as_type(a: np.ndarray, ty) -> np.ndarray:
        if ty == F32:
            return og.bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
        if a.dtype != np.uint16:
            die("a BF16 output from an F32 source (not in this layout)")
        return a

    def one(canon: str, g: str | None = None, transform=None, f32: bool = False):
        src = names.get(canon)
        if src is None:
            die(f"{canon}: missing from the checkpoint")
        used.add(src)
        g = g or gname(canon)
        shape = ck.tensors[src][2]

        def fn(src=src, g=g):
            a = ck.f32(src) if f32 else ck.raw(src)
            if transform is not None:
                a = transform(a)
            return as_type(a, qtype(g, a.ndim))
        # the shape after the transform
        probe = np.zeros(shape, dtype=np.float32)
        if transform is not None:
            probe = transform(probe)
        add(g, probe.shape, fn)

    norm_plus_one = (lambda a: og.bf16_to_f32(a) + 1.0 if a.dtype == np.uint16 else a + 1.0)
    one("model.embed_tokens.weight")
    for L in range(n_layer):
        p = f"model.layers.{L}."
        one(p + "input_layernorm.weight", transform=norm_plus_one)
        one(p + "post_attention_layernorm.weight", transform=norm_plus_one)
        if p + "linear_attn.in_proj_qkv.weight" in names:
            a = p + "linear_attn."

            def qkv(w):
                q, k, v = w[:hk * dk], w[hk * dk:2 * hk * dk], w[2 * hk * dk:]
                return np.concatenate([q, k, reorder_v(v, 0, hk, r, dv)])

            one(a + "in_proj_qkv.weight", gname(p + "linear_attn.in_proj_qkv.weight"), qkv)
            one(a + "in_proj_z.weight", gname(p + "linear_attn.in_proj_z.weight"), lambda w: reorder_v(w, 0, hk, r, dv))
            one(a + "in_proj_b.weight", gname(p + "linear_attn.in_proj_b.weight"), lambda w: reorder_v(w, 0, hk, r, 1))
            one(a + "in_proj_a.weight", gname(p + "linear_attn.in_proj_a.weight"), lambda w: reorder_v(w, 0, hk, r, 1))

            def conv(w):
                w = w.reshape(w.shape[0], w.shape[-1])
                return np.concatenate([w[:2 * hk * dk], reorder_v(w[2 * hk * dk:], 0, hk, r, dv)])

            one(a + "conv1d.weight", gname(p + "linear_attn.conv1d.weight"), conv)
            one(a + "A_log", gname(p + "linear_attn.A_log"),
                lambda x: -np.exp(reorder_v(x.astype(np.float32), 0, hk, r, 1)), f32=True)
            one(a + "dt_bias", gname(p + "linear_attn.dt_proj.bias"),
                lambda x: reorder_v(x.astype(np.float32), 0, hk, r, 1), f32=True)
            one(a + "norm.weight", gname(p + "linear_attn.norm.weight"))
            one(a + "out_proj.weight", gname(p + "linear_attn.out_proj.weight"), lambda w: reorder_v(w, 1, hk, r, dv))
        else:
            a = p + "self_attn."
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                one(a + n + ".weight")
            one(a + "q_norm.weight", transform=norm_plus_one)
            one(a + "k_norm.weight", transform=norm_plus_one)
        m = p + "mlp."
        one(m + "gate.weight")
        for n in ("gate_proj", "up_proj", "down_proj"):
            one(m + f"shared_expert.{n}.weight")
        one(m + "shared_expert_gate.weight")
        fused = names.get(m + "experts.gate_up_proj")
        if fused is not None:
            down = names[m + "experts.down_proj"]
            used.update([fused, down])
            e, two_i, h = ck.tensors[fused][2]
            i = two_i // 2
            add(gname(m + "experts.gate_proj.weight"), (e, i, h), lambda s=fused, i=i: ck.raw(s)[:, :i].copy())
            add(gname(m + "experts.up_proj.weight"), (e, i, h), lambda s=fused, i=i: ck.raw(s)[:, i:].copy())
            add(gname(m + "experts.down_proj.weight"), ck.tensors[down][2], lambda s=down: ck.raw(s))
        else:
            ne = t.get("num_experts", 256)
            for n in ("gate_proj", "up_proj", "down_proj"):
                srcs = [names[m + f"experts.{x}.{n}.weight"] for x in range(ne)]
                used.update(srcs)
                shape = (ne,) + ck.tensors[srcs[0]][2]
                add(gname(m + f"experts.{n}.weight"), shape, lambda srcs=srcs: np.stack([ck.raw(s) for s in srcs]))
    one("model.norm.weight", transform=norm_plus_one)
    if "lm_head.weight" in names:
        one("lm_head.weight")
    left = sorted(set(names.values()) - used)
    if left:
        die(f"unconverted tensors: {left[:5]}")
    return out


def write_bf16_gguf(ck: Checkpoint, path: str, name: str, all_f32: bool = False) -> dict:
    """The BF16 GGUF (`all_f32`: every tensor F32 instead, for the self-test)."""
    t = text_config(ck.config)
    pl = plan(ck, all_f32)
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, ARCH)
    for g, shape, ty, _ in pl:
        es = 4 if ty == F32 else 2
        w.add_tensor_info(g, shape, np.dtype(np.float32 if es == 4 else np.uint16),
                          int(np.prod(shape)) * es, raw_dtype=ty)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_block_count(t["num_hidden_layers"])
    w.add_context_length(t.get("max_position_embeddings", 262144))
    w.add_embedding_length(t["hidden_size"])
    w.add_head_count(t["num_attention_heads"])
    w.add_head_count_kv(t["num_key_value_heads"])
    rope = t.get("rope_parameters") or {}
    w.add_rope_freq_base(rope.get("rope_theta", t.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(t.get("rms_norm_eps", 1e-6))
    w.add_expert_used_count(t["num_experts_per_tok"])
    w.add_key_length(t["head_dim"])
    w.add_value_length(t["head_dim"])
    w.add_expert_count(t["num_experts"])
    w.add_expert_feed_forward_length(t["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(t["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(t["linear_conv_kernel_dim"])
    w.add_ssm_state_size(t["linear_key_head_dim"])
    w.add_ssm_group_count(t["linear_num_key_heads"])
    w.add_ssm_time_step_rank(t["linear_num_value_heads"])
    w.add_ssm_inner_size(t["linear_value_head_dim"] * t["linear_num_value_heads"])
    w.add_full_attention_interval(t.get("full_attention_interval", 4))
    prf = rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    w.add_rope_dimension_count(int(t["head_dim"] * prf))
    w.add_rope_dimension_sections(list(rope.get("mrope_section", [11, 11, 10])) + [0])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if all_f32 else gguf.LlamaFileType.MOSTLY_BF16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("none")
    w.add_vocab_size(t["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    nbytes = 0
    for g, shape, ty, fn in pl:
        a = fn()
        if ty == F32 and a.dtype == np.uint16:
            a = og.bf16_to_f32(a)
        if tuple(a.shape) != tuple(shape):
            die(f"{g}: produced {a.shape}, planned {shape}")
        w.write_tensor_data(np.ascontiguousarray(a))
        nbytes += a.nbytes
    w.close()
    os.replace(tmp, path)
    return {"tensors": len(pl), "bytes": nbytes}


def selftest(model_dir: str, threads: int) -> int:
    """llama.cpp on GGUFs of MODEL_DIR against transformers' logits in its oracle.json
    (`qwen3_5_moe_shape.py --dims tiny --oracle`): an all-F32 GGUF (the same values; llama.cpp
    then multiplies in f32) within 1e-3, and the BF16 GGUF (llama.cpp rounds activations to
    bf16 for BF16 weights) with the same argmax, its difference reported."""
    cases = json.load(open(os.path.join(model_dir, "oracle.json")))["cases"]
    ck = Checkpoint(model_dir)
    fails = 0
    with tempfile.TemporaryDirectory() as td:
        for kind, tol in (("f32", 1e-3), ("bf16", None)):
            path = os.path.join(td, f"selftest-{kind}.gguf")
            st = write_bf16_gguf(ck, path, "qwen35moe-selftest", all_f32=kind == "f32")
            ll = og.LlamaLogits(path, threads, n_ctx=512)
            for c in cases:
                got = ll.logits_all(list(c["prompt_ids"]))[-1]
                want = np.asarray(c["last_logits"], np.float32)
                d = float(np.abs(got - want).max())
                same = int(np.argmax(got)) == int(np.argmax(want))
                ok = same and (tol is None or d < tol)
                fails += not ok
                print(f"[{kind} GGUF, {st['tensors']} tensors] {len(c['prompt_ids'])} prompt ids: llama.cpp last "
                      f"logits vs transformers max |diff| {d:.3g} (largest logit {float(np.abs(want).max()):.3g}), "
                      f"argmax {'equal' if same else 'DIFFERS'}" + ("" if ok else "  FAIL"), flush=True)
    return 1 if fails else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out_prefix", nargs="?")
    ap.add_argument("--types", default="q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep-bf16", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return selftest(a.hf_dir, a.threads)
    if not a.out_prefix:
        die("OUT_PREFIX is needed")
    ck = Checkpoint(a.hf_dir)
    bf = a.out_prefix + "-bf16.gguf"
    if not os.path.exists(bf):
        print(f"writing {bf}: {write_bf16_gguf(ck, bf, os.path.basename(a.out_prefix))}", flush=True)
    for q in [x for x in a.types.split(",") if x]:
        dst = f"{a.out_prefix}-{q}.gguf"
        og.quantize(bf, dst, q, a.threads)
        og.write_listing(dst, f"{a.out_prefix}-{q}.tensors.txt")
    if not a.keep_bf16:
        os.remove(bf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
