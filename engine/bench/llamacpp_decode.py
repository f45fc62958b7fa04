#!/usr/bin/env python3
"""llama.cpp side of the decode benchmark (engine/bench/decode_vs_llamacpp.sh).

Loads a GGUF with llama-cpp-python (PyPI; it builds llama.cpp from source), prefills the given
prompt token ids in one batch, then greedily decodes: the first token comes from the prefill's
logits, each further token is one single-token `llama_decode` call (a "decode step"), exactly as
coli's `Engine::generate` counts them. Prints one JSON line:

  prompt_tokens, generated_tokens, decode_steps, token_ids,
  prefill_s / decode_s (wall clock around the calls, seconds; decode includes the greedy argmax
  over the vocabulary, as coli's decode_s includes its sampler),
  prefill_tok_s = prompt_tokens / prefill_s, decode_tok_s = decode_steps / decode_s,
  llama_perf: llama.cpp's own counters (t_p_eval_ms, n_p_eval, t_eval_ms, n_eval) and the
  decode tok/s they give (n_eval / t_eval_ms * 1000, excludes sampling).

Not part of CI: llama-cpp-python is installed only in a separate venv outside the repo.

Usage: llamacpp_decode.py --gguf PATH --prompt-ids 1,2,3 --max-tokens 64 --threads T
       [--n-ctx 512] [--stop-on-eos]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--stop-on-eos", action="store_true",
                    help="stop at the GGUF's EOS token (default: always generate --max-tokens)")
    args = ap.parse_args()

    try:
        prompt = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"error: --prompt-ids must be comma-separated integers, got {args.prompt_ids!r}")
    if not prompt:
        sys.exit("error: --prompt-ids is empty")
    if len(prompt) + args.max_tokens > args.n_ctx:
        sys.exit(f"error: prompt ({len(prompt)}) + max tokens ({args.max_tokens}) exceed n_ctx {args.n_ctx}")

    t_load = time.perf_counter()
    llm = Llama(
        model_path=args.gguf,
        n_ctx=args.n_ctx,
        n_batch=args.n_ctx,
        n_ubatch=args.n_ctx,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        use_mmap=True,
        use_mlock=False,
        verbose=False,
    )
    load_s = time.perf_counter() - t_load
    ctx = llm._ctx.ctx
    n_vocab = llm.n_vocab()
    eos = llm.token_eos()

    def decode(ids: list[int]) -> np.ndarray:
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        batch = llama_cpp.llama_batch_get_one(arr, len(ids))
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"error: llama_decode returned {rc}")
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    llama_cpp.llama_perf_context_reset(ctx)
    t0 = time.perf_counter()
    logits = decode(prompt)
    prefill_s = time.perf_counter() - t0

    tokens: list[int] = []
    steps = 0
    t1 = time.perf_counter()
    while len(tokens) < args.max_tokens:
        tok = int(np.argmax(logits))
        tokens.append(tok)
        if args.stop_on_eos and tok == eos:
            break
        if len(tokens) == args.max_tokens:
            break
        logits = decode([tok])
        steps += 1
    decode_s = time.perf_counter() - t1

    perf = llama_cpp.llama_perf_context(ctx)
    out = {
        "engine": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "gguf": args.gguf,
        "threads": args.threads,
        "prompt_ids": prompt,
        "token_ids": tokens,
        "stats": {
            "load_s": load_s,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "prompt_tokens": len(prompt),
            "generated_tokens": len(tokens),
            "decode_steps": steps,
            "prefill_tok_s": len(prompt) / prefill_s if prefill_s > 0 else 0.0,
            "decode_tok_s": steps / decode_s if decode_s > 0 else 0.0,
        },
        "llama_perf": {
            "t_p_eval_ms": perf.t_p_eval_ms,
            "n_p_eval": perf.n_p_eval,
            "t_eval_ms": perf.t_eval_ms,
            "n_eval": perf.n_eval,
            "prefill_tok_s": perf.n_p_eval / perf.t_p_eval_ms * 1000 if perf.t_p_eval_ms > 0 else 0.0,
            "decode_tok_s": perf.n_eval / perf.t_eval_ms * 1000 if perf.t_eval_ms > 0 else 0.0,
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
