#!/usr/bin/env python3
"""Quantize a BF16/F32 GGUF with llama.cpp's own quantizer, one type per tensor role (issue 46
benchmark: the i-quants, whose llama.cpp mixes need an importance matrix).

    gguf_iquant.py SRC.gguf OUT.gguf --experts IQ2_XS [--attn Q4_K] [--embd Q4_K] [--output Q6_K]
        [--procs 2]

Every 2-D or 3-D weight is quantized by `ggml_quantize_chunk` (the function `llama_model_quantize`
calls for each tensor; from the libggml-base llama-cpp-python 0.3.36 ships), one expert matrix or
one tensor per call, `--procs` processes in parallel: the stacked experts
(`blk.N.ffn_{gate,up,down}_exps`) to --experts, attention (`attn_q/k/v/output`) to --attn,
`token_embd` to --embd, `output` to --output. Norms and routers (`ffn_gate_inp`) stay F32, as
llama.cpp keeps them. The importance matrix is all ones (the benchmark model has no calibration
text; llama-quantize requires some matrix for IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M, and an
all-ones one weights every column alike, i.e. the plain least-squares fit). The metadata is
copied (general.file_type dropped, general.quantization_version 2), the tensor order kept, and
the result written by gguf-py's writer. Both engines then run the same file.

Speed here (one core): IQ2_XS 2.5 s, IQ2_XXS 1.25 s, Q4_K 0.23 s per 1024 x 2048 matrix, so the
16-layer OLMoE shape (3072 expert matrices) takes about 2.2 CPU-hours at IQ2_XS; the benchmark
uses fewer layers (make_olmoe_shape.py --layers).

Needs numpy, gguf 0.19.0 and llama-cpp-python 0.3.36 (the venv of engine/bench/README.md).
"""

import argparse
import ctypes
import glob
import multiprocessing as mp
import os
import sys
import time

import numpy as np

ROLES = {"ffn_gate_exps": "experts", "ffn_up_exps": "experts", "ffn_down_exps": "experts",
         "attn_q": "attn", "attn_k": "attn", "attn_v": "attn", "attn_output": "attn",
         "token_embd": "embd", "output": "output"}

_lib = None


def lib():
    global _lib
    if _lib is None:
        import llama_cpp

        path = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))[0]
        _lib = ctypes.CDLL(path)
        _lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        _lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return _lib


def quantize_matrix(job):
    """(src path, tensor name, matrix index, ggml type id) -> quantized bytes of that matrix."""
    src, name, e, qtype = job
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    r = GGUFReader(src)
    t = next(x for x in r.tensors if x.name == name)
    data = np.asarray(t.data)
    m = data[e] if data.ndim == 3 else data
    m = np.ascontiguousarray(dequantize(m, t.tensor_type).astype(np.float32).reshape(m.shape[0], -1))
    rows, cols = m.shape
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    out = np.zeros((rows, cols // bs * ts), dtype=np.uint8)
    ones = np.ones(cols, dtype=np.float32)
    n = lib().ggml_quantize_chunk(qtype, m.ctypes.data, out.ctypes.data, 0, rows, cols, ones.ctypes.data)
    assert n == out.nbytes, (name, e, n, out.nbytes)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--experts", required=True)
    ap.add_argument("--attn", default="Q4_K")
    ap.add_argument("--embd", default="Q4_K")
    ap.add_argument("--output", default="Q6_K")
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    import gguf
    from gguf import GGUFReader, GGUFWriter

    types = {"experts": a.experts, "attn": a.attn, "embd": a.embd, "output": a.output}
    r = GGUFReader(a.src)
    plan = []
    for t in r.tensors:
        stem = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        role = ROLES.get(stem)
        if role is None or len(t.shape) == 1:
            plan.append((t, None))
        else:
            plan.append((t, gguf.GGMLQuantizationType[types[role].upper()]))
    jobs = []
    for t, q in plan:
        if q is not None:
            count = int(t.shape[2]) if len(t.shape) == 3 else 1  # gguf-py shapes are ne order
            jobs += [(a.src, t.name, e, int(q)) for e in range(count)]
    print(f"{len(jobs)} matrices on {a.procs} processes", flush=True)
    t0 = time.time()
    with mp.Pool(a.procs) as pool:
        done = pool.map(quantize_matrix, jobs, chunksize=1)
    print(f"quantized in {time.time() - t0:.0f} s", flush=True)
    by_name = {}
    for (_, name, e, _), b in zip(jobs, done):
        by_name.setdefault(name, []).append(b)

    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(a.out, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type",
                                              "general.quantization_version"):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    w.add_quantization_version(2)
    for t, q in plan:
        if q is None:
            from gguf.quants import dequantize

            w.add_tensor(t.name, dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32))
            continue
        mats = by_name[t.name]
        arr = np.stack(mats) if len(t.shape) == 3 else mats[0]
        w.add_tensor(t.name, arr, raw_dtype=q)
        print(f"{t.name}: {q.name} {arr.nbytes} bytes", flush=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
