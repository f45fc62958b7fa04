#!/usr/bin/env python3
"""Convert an OLMoE Hugging Face checkpoint (BF16 safetensors) to llama.cpp GGUFs (issue #6 benchmark).

Writes OUT_PREFIX-bf16.gguf the way llama.cpp's own convert_hf_to_gguf.py (OlmoeModel, --outtype
bf16) would, but streaming: tensor infos first, then the data tensor by tensor, so memory stays at
one layer's stacked expert tensor (64 x 1024 x 2048 BF16 = 256 MiB) at most. Then quantizes it with
llama.cpp's own quantizer through llama-cpp-python's C API (llama_model_quantize with
llama_model_quantize_default_params(), i.e. what `llama-quantize IN OUT Q4_0` does) into
OUT_PREFIX-q4_0.gguf / OUT_PREFIX-q8_0.gguf, deletes the BF16 GGUF unless --keep-bf16, and lists
every tensor's type and size (also written to OUT_PREFIX-TYPE.tensors.txt).

What matches the converter (llama.cpp vendored in llama-cpp-python 0.3.36, conversion/olmo.py and
conversion/base.py TextModel.set_gguf_parameters):
  * architecture "olmoe"; tensor names from gguf's own tensor map for MODEL_ARCH.OLMOE; the 64
    experts of each layer stacked (torch.stack(dim=0)) into blk.N.ffn_{gate,up,down}_exps.weight;
  * types for --outtype bf16: 1-D tensors (all norms, incl. the full-width q/k norms) and
    ffn_gate_inp (the router) in F32, everything else BF16 (bit-identical to the checkpoint);
  * keys: block_count, context_length (max_position_embeddings), embedding_length,
    feed_forward_length (intermediate_size = per-expert width), attention.head_count(_kv),
    rope.freq_base, attention.layer_norm_rms_eps (OlmoeModel overwrites it with 1e-5),
    expert_count, expert_used_count, general.file_type = MOSTLY_BF16, general.quantization_version,
    general.type/name/size_label.
Differences (the checkpoint has no tokenizer; the benchmark feeds token ids):
  * tokenizer.ggml.model = "none" with no token list (the converter's _set_vocab_none), plus
    olmoe.vocab_size = vocab_size: llama.cpp's no-vocab path reads that key to size the vocabulary
    ("adding N dummy tokens"); without it n_vocab = 0 and token_embd fails its shape check.
  * tensor order: embedding, layer by layer, output_norm, output (order does not matter to llama.cpp).

Usage:
  olmoe_gguf.py HF_DIR OUT_PREFIX [--types q4_0,q8_0] [--threads 2] [--keep-bf16]
  olmoe_gguf.py --list GGUF [GGUF ...]          # only the tensor listing
  olmoe_gguf.py --selftest HF_DIR [OUT_PREFIX]  # llama.cpp (BF16 GGUF) vs a numpy forward

--selftest runs a small independent numpy forward of the checkpoint (embedding, RMSNorm, q/k/v,
full-width q/k RMSNorm, NeoX RoPE, causal attention, router softmax top-k without
renormalisation, SwiGLU experts, final norm, lm_head) on a few prompts and compares the last
position's logits and greedy continuations with llama.cpp on OUT_PREFIX-bf16.gguf (converted into a
temporary directory when absent). OUT_PREFIX-q8_0/q4_0.gguf, when present, are compared too
(informational). Meant to run by hand on a 1- or 2-layer checkpoint.

Needs numpy, gguf and llama-cpp-python (a separate venv; never part of CI).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import time
from collections import OrderedDict

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("error: the gguf package is needed (pip install gguf)")

ARCH = "olmoe"
QTYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def die(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# safetensors reading (no torch): header parse + raw byte reads


class Checkpoint:
    """Random access to the BF16 tensors of a sharded (or single-file) safetensors checkpoint."""

    def __init__(self, hf_dir: str):
        self.dir = hf_dir
        cfg_path = os.path.join(hf_dir, "config.json")
        if not os.path.isfile(cfg_path):
            die(f"{cfg_path} not found")
        with open(cfg_path) as f:
            self.config = json.load(f)
        index = os.path.join(hf_dir, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.isfile(os.path.join(hf_dir, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            die(f"no model.safetensors(.index.json) in {hf_dir}")
        self.tensors: dict[str, tuple[str, int, tuple[int, ...], str]] = {}
        for fn in files:
            path = os.path.join(hf_dir, fn)
            with open(path, "rb") as f:
                (hlen,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(hlen))
            base = 8 + hlen
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                shape = tuple(info["shape"])
                n = int(np.prod(shape)) if shape else 1
                if info["dtype"] not in ("BF16", "F32", "F16"):
                    die(f"{name}: unsupported dtype {info['dtype']}")
                if end - start != n * {"BF16": 2, "F16": 2, "F32": 4}[info["dtype"]]:
                    die(f"{name}: size mismatch in {fn}")
                self.tensors[name] = (path, base + start, shape, info["dtype"])
        self._fh: dict[str, object] = {}

    def _file(self, path):
        f = self._fh.get(path)
        if f is None:
            f = self._fh[path] = open(path, "rb", buffering=0)
        return f

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][2]

    def raw_into(self, name: str, out: np.ndarray) -> None:
        """Read tensor `name`'s raw bytes into the contiguous array `out` (same byte size)."""
        path, off, shape, dtype = self.tensors[name]
        mv = memoryview(out.reshape(-1).view(np.uint8))
        if dtype != "BF16":
            die(f"{name}: expected BF16, got {dtype}")
        if mv.nbytes != int(np.prod(shape)) * 2:
            die(f"{name}: buffer size mismatch")
        f = self._file(path)
        f.seek(off)
        got = 0
        while got < mv.nbytes:
            n = f.readinto(mv[got:])
            if not n:
                die(f"{name}: short read from {path}")
            got += n

    def bf16(self, name: str) -> np.ndarray:
        out = np.empty(self.shape(name), dtype=np.uint16)
        self.raw_into(name, out)
        return out

    def f32(self, name: str) -> np.ndarray:
        return bf16_to_f32(self.bf16(name))

    def rows(self, name: str, ids: list[int]) -> np.ndarray:
        """f32 rows `ids` of a 2-D BF16 tensor (the embedding), without reading the rest."""
        path, off, shape, _ = self.tensors[name]
        m = np.memmap(path, dtype=np.uint16, mode="r", offset=off, shape=shape)
        return bf16_to_f32(np.array(m[ids]))

    def close(self):
        for f in self._fh.values():
            f.close()
        self._fh.clear()


def bf16_to_f32(u16: np.ndarray) -> np.ndarray:
    return (u16.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# BF16 GGUF writing


def hparam(cfg: dict, keys: list[str], default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def plan_tensors(ck: Checkpoint):
    """[(gguf_name, numpy shape, GGML type, source)] in write order; source is
    ('one', hf_name) or ('stack', [hf_names]) (experts, stacked on a new first axis)."""
    cfg = ck.config
    n_layer = cfg["num_hidden_layers"]
    n_expert = hparam(cfg, ["num_local_experts", "num_experts"])
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.OLMOE, n_layer)
    BF16, F32 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32

    def gname(hf: str) -> str:
        n = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if n is None:
            die(f"cannot map tensor {hf!r} (gguf {gguf.__version__})")
        return n

    def qtype(new_name: str, ndim: int):
        # conversion/base.py prepare_tensors, ftype MOSTLY_BF16
        if ndim <= 1 or new_name.endswith("_norm.weight"):
            return F32
        if re.fullmatch(r"blk\.\d+\.ffn_gate_inp\.weight", new_name):
            return F32
        return BF16

    plan = []
    used = set()

    def one(hf: str):
        if hf not in ck.tensors:
            die(f"tensor {hf} missing from the checkpoint")
        used.add(hf)
        shape = ck.shape(hf)
        name = gname(hf)
        plan.append((name, shape, qtype(name, len(shape)), ("one", hf)))

    one("model.embed_tokens.weight")
    for L in range(n_layer):
        p = f"model.layers.{L}."
        for t in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                  "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                  "post_attention_layernorm", "mlp.gate"]:
            one(p + t + ".weight")
        # conversion/olmo.py OlmoeModel.modify_tensors: down_proj, gate_proj, up_proj order
        for w in ["down_proj", "gate_proj", "up_proj"]:
            srcs = [p + f"mlp.experts.{e}.{w}.weight" for e in range(n_expert)]
            for s in srcs:
                if s not in ck.tensors:
                    die(f"tensor {s} missing from the checkpoint")
                if ck.shape(s) != ck.shape(srcs[0]):
                    die(f"{s}: shape {ck.shape(s)} differs from expert 0")
                used.add(s)
            name = gname(p + f"mlp.experts.{w}.weight")
            shape = (n_expert,) + ck.shape(srcs[0])
            plan.append((name, shape, qtype(name, 3), ("stack", srcs)))
    one("model.norm.weight")
    if "lm_head.weight" in ck.tensors:
        one("lm_head.weight")
    elif not cfg.get("tie_word_embeddings", False):
        die("lm_head.weight missing and tie_word_embeddings is false")
    extra = sorted(set(ck.tensors) - used - {"lm_head.weight"})
    extra = [n for n in extra if not n.endswith(".rotary_emb.inv_freq")]
    if extra:
        die(f"unconverted checkpoint tensors: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    return plan


def write_bf16_gguf(ck: Checkpoint, out_path: str, name: str) -> dict:
    cfg = ck.config
    if cfg.get("model_type") != "olmoe":
        die(f"model_type is {cfg.get('model_type')!r}, expected 'olmoe'")
    plan = plan_tensors(ck)
    tmp = out_path + ".tmp"
    w = gguf.GGUFWriter(tmp, ARCH)

    for gname_, shape, qt, _src in plan:
        esize = 4 if qt == gguf.GGMLQuantizationType.F32 else 2
        nbytes = int(np.prod(shape)) * esize
        w.add_tensor_info(gname_, shape, np.dtype(np.float32 if esize == 4 else np.uint16), nbytes,
                          raw_dtype=qt)

    # --- metadata, as ModelBase.prepare_metadata + TextModel/OlmoeModel.set_gguf_parameters
    n_expert = hparam(cfg, ["num_local_experts", "num_experts"])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    total, shared, expert, expert_count = w.get_total_parameter_count()
    if total > 0:
        w.add_size_label(gguf.size_label(total, shared, expert, expert_count))
    w.add_block_count(cfg["num_hidden_layers"])
    n_ctx = hparam(cfg, ["max_position_embeddings", "n_ctx", "n_positions"])
    if n_ctx is not None:
        w.add_context_length(n_ctx)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(hparam(cfg, ["num_key_value_heads"], cfg["num_attention_heads"]))
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) not in (None, "default"):
        die(f"rope scaling {rope} not supported by this converter")
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is not None:
        w.add_rope_freq_base(theta)
    # TextModel writes rms_norm_eps, then OlmoeModel overwrites it with 1e-5 (kept as llama.cpp does)
    if cfg.get("rms_norm_eps", 1e-5) != 1e-5:
        print(f"warning: rms_norm_eps {cfg['rms_norm_eps']} in config; llama.cpp's OlmoeModel "
              "converter writes 1e-5 regardless, and so does this one", file=sys.stderr)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if cfg.get("norm_topk_prob"):
        print("warning: norm_topk_prob is true; llama.cpp's olmoe graph never renormalises "
              "(the converter ignores it too)", file=sys.stderr)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # vocabulary: none (token ids only); vocab_size sizes llama.cpp's dummy vocabulary
    w.add_tokenizer_model("none")
    w.add_vocab_size(cfg["vocab_size"])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    stats = {"tensors": len(plan), "bytes": 0}
    for gname_, shape, qt, (kind, src) in plan:
        if kind == "stack":
            buf = np.empty(shape, dtype=np.uint16)
            for e, s in enumerate(src):
                ck.raw_into(s, buf[e])
        else:
            buf = ck.bf16(src)
        if qt == gguf.GGMLQuantizationType.F32:
            buf = bf16_to_f32(buf)
        w.write_tensor_data(buf)
        stats["bytes"] += buf.nbytes
        del buf
    w.close()
    os.replace(tmp, out_path)
    return stats


# ---------------------------------------------------------------------------------------------
# llama.cpp quantizer


_LOG_CB = None


def llama_quiet(llama_cpp) -> None:
    """Route llama.cpp's log to nowhere (the callback must stay referenced)."""
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


def import_llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        die("llama_cpp (llama-cpp-python) is not importable; use the benchmark venv")
    return llama_cpp


def quantize(src: str, dst: str, qtype: str, threads: int) -> None:
    llama_cpp = import_llama_cpp()
    llama_quiet(llama_cpp)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama_cpp, QTYPES[qtype])
    tmp = dst + ".tmp"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        die(f"llama_model_quantize({src} -> {qtype}) returned {rc}")
    os.replace(tmp, dst)


# ---------------------------------------------------------------------------------------------
# tensor listing


def tensor_listing(path: str) -> list[str]:
    r = gguf.GGUFReader(path)
    groups: "OrderedDict[tuple[str, str, int], int]" = OrderedDict()
    total = 0
    for t in r.tensors:
        key = (re.sub(r"^blk\.\d+\.", "blk.*.", t.name), t.tensor_type.name, int(t.n_bytes))
        groups[key] = groups.get(key, 0) + 1
        total += int(t.n_bytes)
    ft = r.fields.get("general.file_type")
    ftype = ""
    if ft is not None:
        v = int(ft.parts[ft.data[0]][0])
        try:
            ftype = gguf.LlamaFileType(v).name
        except ValueError:
            ftype = str(v)
    lines = [f"{path}: {len(r.tensors)} tensors, {total / 1e6:.1f} MB ({total / 2**30:.3f} GiB), "
             f"file_type {ftype}, file {os.path.getsize(path) / 1e6:.1f} MB"]
    by_type: dict[str, int] = {}
    for (name, ty, nb), count in groups.items():
        lines.append(f"  {name}: {ty}, {count} x {fmt_bytes(nb)}")
        by_type[ty] = by_type.get(ty, 0) + nb * count
    lines.append("  bytes by type: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in by_type.items()))
    return lines


def fmt_bytes(n: int) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    if n >= 1e3:
        return f"{n / 1e3:.1f} kB"
    return f"{n} B"


def write_listing(path: str, listing_path: str) -> None:
    lines = tensor_listing(path)
    print("\n".join(lines), flush=True)
    tmp = listing_path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, listing_path)


# ---------------------------------------------------------------------------------------------
# self-test: numpy reference forward vs llama.cpp


class GgufWeights:
    """The same interface as Checkpoint (config, tensors, f32, rows) over a GGUF's weights,
    dequantized with gguf's own numpy dequantizers: numpy then runs the quantized model exactly,
    so a comparison with llama.cpp on that GGUF isolates llama.cpp's kernels (and its activation
    quantization) from the weight quantization error."""

    def __init__(self, path: str, config: dict):
        self.config = config
        self.reader = gguf.GGUFReader(path)
        self.by_name = {t.name: t for t in self.reader.tensors}
        self.tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.OLMOE, config["num_hidden_layers"])
        self.tensors = {"lm_head.weight": None} if "output.weight" in self.by_name else {}

    def _lookup(self, hf: str):
        m = re.fullmatch(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+)\.weight", hf)
        if m:
            name = self.tmap.get_name(f"{m.group(1)}.{m.group(3)}.weight", try_suffixes=(".weight",))
            return self.by_name[name], int(m.group(2))
        return self.by_name[self.tmap.get_name(hf, try_suffixes=(".weight",))], None

    def f32(self, hf: str) -> np.ndarray:
        t, e = self._lookup(hf)
        data = t.data if e is None else t.data[e]
        return gguf.quants.dequantize(np.asarray(data), t.tensor_type).astype(np.float32, copy=False)

    def rows(self, hf: str, ids: list[int]) -> np.ndarray:
        t, _ = self._lookup(hf)
        return gguf.quants.dequantize(np.asarray(t.data[ids]), t.tensor_type).astype(np.float32, copy=False)


class NumpyOlmoe:
    """Independent float32 forward of the HF OLMoE checkpoint (full recompute per call)."""

    def __init__(self, ck):
        self.ck = ck
        c = ck.config
        self.H = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads") or self.nh
        self.hd = c.get("head_dim") or self.H // self.nh
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.theta = c.get("rope_theta", 10000.0)
        self.topk = c["num_experts_per_tok"]
        self.norm_topk = bool(c.get("norm_topk_prob", False))
        self.L = c["num_hidden_layers"]
        self.lm_head = ck.f32("lm_head.weight" if "lm_head.weight" in ck.tensors
                              else "model.embed_tokens.weight")
        self.final_norm = ck.f32("model.norm.weight")

    def rms(self, x, w):
        x = x.astype(np.float32)
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x [T, heads, hd]; NeoX / rotate_half
        half = self.hd // 2
        inv = 1.0 / (self.theta ** (np.arange(0, half, dtype=np.float64) * 2 / self.hd))
        ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def forward(self, ids: list[int]) -> np.ndarray:
        """logits [T, vocab] for all positions."""
        ck = self.ck
        T = len(ids)
        x = ck.rows("model.embed_tokens.weight", ids)
        pos = np.arange(T)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for L in range(self.L):
            p = f"model.layers.{L}."
            h = self.rms(x, ck.f32(p + "input_layernorm.weight"))
            q = h @ ck.f32(p + "self_attn.q_proj.weight").T
            k = h @ ck.f32(p + "self_attn.k_proj.weight").T
            v = h @ ck.f32(p + "self_attn.v_proj.weight").T
            q = self.rms(q, ck.f32(p + "self_attn.q_norm.weight"))
            k = self.rms(k, ck.f32(p + "self_attn.k_norm.weight"))
            q = self.rope(q.reshape(T, self.nh, self.hd), pos)
            k = self.rope(k.reshape(T, self.nkv, self.hd), pos)
            v = v.reshape(T, self.nkv, self.hd)
            rep = self.nh // self.nkv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.hd) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", att, v).reshape(T, self.nh * self.hd)
            x = x + o @ ck.f32(p + "self_attn.o_proj.weight").T
            h = self.rms(x, ck.f32(p + "post_attention_layernorm.weight"))
            logits = h @ ck.f32(p + "mlp.gate.weight").T
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            top = np.argsort(-probs, axis=-1, kind="stable")[:, : self.topk]
            wts = np.take_along_axis(probs, top, axis=-1)
            if self.norm_topk:
                wts = wts / wts.sum(-1, keepdims=True)
            moe = np.zeros_like(x)
            for e in np.unique(top):
                rows, slot = np.nonzero(top == e)
                pe = p + f"mlp.experts.{e}."
                he = h[rows]
                g = he @ ck.f32(pe + "gate_proj.weight").T
                u = he @ ck.f32(pe + "up_proj.weight").T
                a = g / (1.0 + np.exp(-g)) * u
                moe[rows] += (a @ ck.f32(pe + "down_proj.weight").T) * wts[rows, slot][:, None]
            x = x + moe
        x = self.rms(x, self.final_norm)
        return x @ self.lm_head.T


class LlamaLogits:
    """llama.cpp on a GGUF via the low-level API: logits of every position of a prompt."""

    def __init__(self, path: str, threads: int, n_ctx: int = 256):
        self.llama_cpp = lc = import_llama_cpp()
        llama_quiet(lc)
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        # no AMX / CPU_REPACK: llama.cpp's AMX mul_mat crashes on multi-token batches on some CPUs
        mp.use_extra_bufts = False
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            die(f"llama_model_load_from_file({path}) failed")
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_threads = threads
        cp.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            die("llama_init_from_model failed")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def logits_all(self, ids: list[int]) -> np.ndarray:
        lc = self.llama_cpp
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        batch = lc.llama_batch_init(len(ids), 0, 1)
        try:
            for i, t in enumerate(ids):
                batch.token[i] = t
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            batch.n_tokens = len(ids)
            rc = lc.llama_decode(self.ctx, batch)
            if rc != 0:
                die(f"llama_decode returned {rc}")
            out = np.empty((len(ids), self.n_vocab), dtype=np.float32)
            for i in range(len(ids)):
                ptr = lc.llama_get_logits_ith(self.ctx, i)
                out[i] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                               shape=(self.n_vocab,))
            return out
        finally:
            lc.llama_batch_free(batch)

    def close(self):
        self.llama_cpp.llama_free(self.ctx)
        self.llama_cpp.llama_model_free(self.model)


def compare(label: str, ref: NumpyOlmoe, ll: LlamaLogits, prompts, ref_logits=None):
    """Top-1 agreement of llama.cpp vs numpy on every position of `prompts`, plus an 8-token greedy
    continuation of prompts[1]. A disagreement counts as a failure only where numpy's top-1 margin
    is at least twice the largest logit difference (otherwise it is a near tie)."""
    agree = total = bad = 0
    worst = worst_rms = 0.0
    margins = []
    for k, p in enumerate(prompts):
        rl = ref_logits[k] if ref_logits is not None else ref.forward(p)
        gl = ll.logits_all(p)
        for i in range(len(p)):
            r, g = rl[i], gl[i]
            rs = np.sort(r)
            margin = float(rs[-1] - rs[-2])
            same = int(np.argmax(r)) == int(np.argmax(g))
            diff = float(np.max(np.abs(r - g)))
            worst = max(worst, diff / float(np.std(r)))
            worst_rms = max(worst_rms, float(np.sqrt(np.mean((r - g) ** 2)) / np.std(r)))
            margins.append(margin / float(np.std(r)))
            total += 1
            agree += same
            if not same:
                big = margin >= 2 * diff
                bad += big
                print(f"    {label}: prompt[{len(p)}] pos {i}: numpy top1 {int(np.argmax(r))} llama.cpp "
                      f"{int(np.argmax(g))}, margin {margin:.4f}, max|diff| {diff:.4f}"
                      f"{'  MISMATCH' if big else '  (near tie)'}")
    seq_r = list(prompts[1])
    seq_g = list(prompts[1])
    for _ in range(8):
        seq_r.append(int(np.argmax(ref.forward(seq_r)[-1])))
        seq_g.append(int(np.argmax(ll.logits_all(seq_g)[-1])))
    n0 = len(prompts[1])
    print(f"  {label}: top-1 {agree}/{total} positions agree ({bad} real mismatches), worst max|diff| "
          f"{worst:.3f} x logit std, worst rms diff {worst_rms:.4f} x std (median top-1 margin "
          f"{float(np.median(margins)):.3f} x std); greedy "
          f"numpy {seq_r[n0:]} llama.cpp {seq_g[n0:]} {'same' if seq_r == seq_g else 'DIFFER'}", flush=True)
    return bad == 0


def selftest(hf_dir: str, out_prefix: str | None, threads: int) -> int:
    ck = Checkpoint(hf_dir)
    vocab = ck.config["vocab_size"]
    tmpdir = None
    bf16 = f"{out_prefix}-bf16.gguf" if out_prefix else None
    if not bf16 or not os.path.exists(bf16):
        tmpdir = tempfile.mkdtemp(prefix="olmoe-selftest-",
                                  dir=os.path.dirname(os.path.abspath(out_prefix)) if out_prefix else None)
        bf16 = os.path.join(tmpdir, "model-bf16.gguf")
        t = time.perf_counter()
        write_bf16_gguf(ck, bf16, os.path.basename(os.path.normpath(hf_dir)))
        print(f"selftest: wrote {bf16} in {time.perf_counter() - t:.1f}s", flush=True)
    quants = [p for p in ([f"{out_prefix}-q8_0.gguf", f"{out_prefix}-q4_0.gguf"] if out_prefix else [])
              if os.path.exists(p)]
    try:
        ref = NumpyOlmoe(ck)
        rng = np.random.default_rng(6)
        prompts = [[int(x) for x in rng.integers(0, vocab, size=n)] for n in (1, 3, 7, 12)]
        prompts.append([vocab - 25])
        t = time.perf_counter()
        ref_logits = [ref.forward(p) for p in prompts]
        print(f"selftest: numpy forward of {len(prompts)} prompts ({sum(map(len, prompts))} positions) "
              f"in {time.perf_counter() - t:.1f}s", flush=True)
        ll = LlamaLogits(bf16, threads)
        ok = compare("BF16 GGUF vs numpy(checkpoint)", ref, ll, prompts, ref_logits)
        ll.close()
        for path in quants:
            name = os.path.basename(path)
            ll = LlamaLogits(path, threads)
            # informational: the weight quantization error itself
            compare(f"{name} vs numpy(checkpoint) [quantization error, informational]", ref, ll,
                    prompts, ref_logits)
            # kernels: numpy on the dequantized weights of the same GGUF
            ok &= compare(f"{name} vs numpy(dequantized {name})", NumpyOlmoe(GgufWeights(path, ck.config)),
                          ll, prompts)
            ll.close()
        print("selftest: " + ("PASS" if ok else "FAIL") + " (llama.cpp vs numpy on the same weights: top-1 "
              "agrees wherever the margin exceeds twice the logit difference)")
        return 0 if ok else 1
    finally:
        ck.close()
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("paths", nargs="*", help="HF_DIR OUT_PREFIX (or GGUFs with --list)")
    ap.add_argument("--types", default="q4_0,q8_0", help="comma list of q4_0,q8_0 (empty: bf16 only)")
    ap.add_argument("--threads", type=int, default=2, help="quantizer threads")
    ap.add_argument("--keep-bf16", action="store_true", help="keep OUT_PREFIX-bf16.gguf")
    ap.add_argument("--list", action="store_true", help="only list the tensors of the given GGUFs")
    ap.add_argument("--selftest", action="store_true",
                    help="HF_DIR [OUT_PREFIX]: compare llama.cpp on the BF16 GGUF with numpy")
    args = ap.parse_args()

    if args.list:
        if not args.paths:
            die("--list needs GGUF paths")
        for p in args.paths:
            print("\n".join(tensor_listing(p)))
        return 0
    if args.selftest:
        if len(args.paths) not in (1, 2):
            die("--selftest HF_DIR [OUT_PREFIX]")
        return selftest(args.paths[0], args.paths[1] if len(args.paths) == 2 else None, args.threads)
    if len(args.paths) != 2:
        die("usage: olmoe_gguf.py HF_DIR OUT_PREFIX [--types q4_0,q8_0] [--threads 2] [--keep-bf16]")
    hf_dir, prefix = args.paths
    types = [t.strip().lower() for t in args.types.split(",") if t.strip()]
    for t in types:
        if t not in QTYPES:
            die(f"unknown type {t!r} (supported: {', '.join(QTYPES)})")
    if types:
        import_llama_cpp()  # fail before the long conversion
    out_dir = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(out_dir):
        die(f"output directory {out_dir} does not exist")

    ck = Checkpoint(hf_dir)
    bf16 = f"{prefix}-bf16.gguf"
    t0 = time.perf_counter()
    stats = write_bf16_gguf(ck, bf16, os.path.basename(os.path.normpath(hf_dir)))
    ck.close()
    t_bf16 = time.perf_counter() - t0
    print(f"wrote {bf16}: {stats['tensors']} tensors, {stats['bytes'] / 2**30:.3f} GiB of data in "
          f"{t_bf16:.1f}s", flush=True)
    timings = {"bf16_s": round(t_bf16, 2)}
    outputs = []
    if args.keep_bf16 or not types:
        outputs.append(("bf16", bf16))
    for t in types:
        dst = f"{prefix}-{t}.gguf"
        t1 = time.perf_counter()
        quantize(bf16, dst, t, args.threads)
        dt = time.perf_counter() - t1
        timings[f"{t}_s"] = round(dt, 2)
        print(f"wrote {dst} in {dt:.1f}s ({args.threads} threads)", flush=True)
        outputs.append((t, dst))
    if types and not args.keep_bf16:
        os.remove(bf16)
    for t, path in outputs:
        write_listing(path, f"{prefix}-{t}.tensors.txt")
    print("timings: " + json.dumps(timings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
