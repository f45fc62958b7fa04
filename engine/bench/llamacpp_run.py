#!/usr/bin/env python3
"""llama.cpp side of the OLMoE equal-memory benchmark (issue #6): one run, one JSON line.

Drives llama.cpp through llama-cpp-python's LOW-LEVEL C API (llama_model_load_from_file,
llama_init_from_model, llama_batch_get_one + llama_decode, llama_get_logits_ith; greedy argmax
with numpy) on token ids; the GGUFs (engine/bench/olmoe_gguf.py) have no vocabulary.

Workloads:
  decode  prefill --prompt-ids in ONE llama_decode, then greedy-decode: the first token comes from
          the prefill's logits, each further token is one single-token llama_decode (a "decode
          step"); --max-tokens N tokens in all, N - 1 decode steps (as coli's Engine::generate and
          engine/bench/llamacpp_decode.py count them).
  stream  teacher forcing: feed the given ids (--ids-file FILE, a JSON list of ints, or
          --prompt-ids) ONE PER llama_decode call, all of them (or the first --max-tokens), taking
          the argmax after each (reported in "tokens", not fed back).

Memory knobs:
  --mmap on|off    llama_model_params.load_mode MMAP / NONE. With mmap llama.cpp maps the whole file
                   with MAP_POPULATE (llama-mmap.cpp), so right after load RSS holds every page of the
                   GGUF as file-backed (clean, evictable) memory and load_s includes reading it; with
                   --mmap off the weights are read into anonymous memory.
  --repack on      llama.cpp's default, use_extra_bufts = True: the CPU backend copies the weights it
                   has special kernels for into anonymous memory at load. On x86 that is AMX (CPUs
                   with AMX_INT8: the 2-D Q4_0/Q8_0/Q6_K/... weights) and CPU_REPACK (Q4_0, Q4_K,
                   IQ4_NL, MXFP4 2-D and expert tensors; not Q8_0). Seen on the dev VM (llama-cpp-python
                   0.3.36, a Xeon with AMX): the AMX mul_mat segfaults on any multi-token batch, i.e. the
                   decode workload's prefill; single-token forwards work.
  --repack off     use_extra_bufts = False: nothing is repacked; with mmap every weight is used in
                   place from the mapping.
  --repack cpu     use_extra_bufts = False plus tensor_buft_overrides sending each weight CPU_REPACK
                   can take (read from the GGUF) to CPU_REPACK: what "on" does on an x86 CPU without
                   AMX. For the Q8_0 GGUF this repacks nothing (= off).
The process's memory (/proc/self/status) is sampled after load, after the first forward and at the
end. Note that llama.cpp's OpenMP threads spin-wait: with --threads = all cores, any other busy
process on the machine cuts tok/s by an order of magnitude (seen here: 75 -> 5 tok/s).

JSON fields: engine, model, gguf_type (general.file_type), model_desc, workload, threads, ctx,
mmap, repack, repacked_tensors (--repack cpu), n_prompt (prompt ids prefilled; stream: ids fed),
tokens (generated / argmax ids), load_s (llama_model_load_from_file), ctx_init_s
(llama_init_from_model), ttft_s (start of the first llama_decode until its logits are available),
prefill_s (decode: the prefill llama_decode incl. logits; stream: 0), decode_s (wall clock of the
decode loop incl. argmax; stream: all feeds incl. argmax), decode_steps, decode_tok_s (decode_steps
/ decode_s; stream: ids fed / decode_s), llama_perf (llama_perf_context counters and the tok/s they
give), memory (VmRSS / VmHWM / RssAnon / RssFile from /proc/self/status after load, after the first
forward and at the end; rss_anon_max_bytes = max of those samples), rss_peak_bytes (VmHWM at the
end).
Note: with --mmap on, RSS counts the model's file pages once touched (page cache, evictable);
RssAnon is the memory that cannot be dropped.

Not part of CI: llama-cpp-python lives in a separate venv outside the repo.

Usage: llamacpp_run.py --model GGUF --workload decode|stream (--prompt-ids 1,2,3 | --ids-file F)
       [--max-tokens N] --threads T [--ctx 512] [--mmap on|off] [--repack on|off|cpu] [--log]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time

FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 15: "Q4_K_M", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16", 38: "MXFP4_MOE"}


class RunError(Exception):
    pass


def proc_status() -> dict:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def parse_ids(text: str, what: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RunError(f"{what} must be comma-separated integers, got {text!r}")
    return ids


# CPU_REPACK layouts llama.cpp has for x86 (ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type):
# type -> (CPU feature needed, rows multiple)
X86_REPACK = {"Q4_0": ("AVX2", 8), "Q4_K": ("AVX2", 8), "IQ4_NL": ("AVX2", 8), "MXFP4": ("AVX2", 8),
              "Q2_K": ("AVX512", 8)}


class BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_repack_overrides(llama_cpp, model_path: str):
    """tensor_buft_overrides sending every matmul weight llama.cpp can repack on this x86 CPU to the
    CPU_REPACK buffer type (used with use_extra_bufts = False, so AMX is never chosen). Returns
    (NULL-terminated override array or None, [tensor names])."""
    try:
        import gguf
    except ImportError:
        raise RunError("--repack cpu needs the gguf package (to read the tensor types)")
    info = llama_cpp.llama_print_system_info().decode()
    feats = {kv.split("=")[0].strip() for kv in info.split("|") if kv.strip().endswith("= 1")}
    reader = gguf.GGUFReader(model_path)
    names = []
    layers = set()
    for t in reader.tensors:
        m = re.match(r"^blk\.(\d+)\.", t.name)
        if m:
            layers.add(m.group(1))
        rule = X86_REPACK.get(t.tensor_type.name)
        if rule is None or rule[0] not in feats:
            continue
        if not t.name.endswith(".weight") or "token_embd" in t.name or len(t.shape) not in (2, 3):
            continue
        if int(t.shape[1]) % rule[1] != 0:
            continue
        names.append(t.name)
    del reader
    if not names:
        return None, []
    # the CPU device's extra buffer types, through ggml's public registry API
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        ggml = ctypes.CDLL(os.path.join(libdir, "libggml.so"))
        base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    except OSError as e:
        raise RunError(f"--repack cpu: cannot load ggml libraries from {libdir}: {e}")
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    dev = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not dev:
        raise RunError("--repack cpu: no CPU backend device")
    fn = base.ggml_backend_reg_get_proc_address(base.ggml_backend_dev_backend_reg(dev),
                                                b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        raise RunError("--repack cpu: the CPU backend has no ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(dev)
    repack = None
    i = 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            repack = bufts[i]
        i += 1
    if repack is None:
        raise RunError("--repack cpu: this llama.cpp build has no CPU_REPACK buffer type")
    # one pattern per tensor kind (blk.N. collapsed when every layer qualifies), else exact names
    kinds: dict[str, list[str]] = {}
    for n in names:
        m = re.match(r"^blk\.\d+\.(.*)$", n)
        kinds.setdefault(m.group(1) if m else n, []).append(n)
    n_layer = len(layers)
    patterns = []
    for kind, members in kinds.items():
        if kind not in names and len(members) == n_layer:
            patterns.append(r"^blk\.\d+\." + re.escape(kind) + "$")
        else:
            patterns.extend("^" + re.escape(n) + "$" for n in members)
    arr = (BuftOverride * (len(patterns) + 1))()
    keep = [p.encode() for p in patterns]
    for i, p in enumerate(keep):
        arr[i].pattern = p
        arr[i].buft = repack
    arr[len(patterns)].pattern = None
    arr[len(patterns)].buft = None
    arr._keep = keep  # the pattern strings must outlive model loading
    return arr, names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF path")
    ap.add_argument("--workload", required=True, choices=["decode", "stream"])
    ap.add_argument("--prompt-ids", help="comma-separated token ids")
    ap.add_argument("--ids-file", help="stream: JSON list of token ids to feed")
    ap.add_argument("--max-tokens", type=int,
                    help="decode: tokens to generate (required); stream: feed only the first N ids")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--ctx", type=int, default=512, help="context size (n_ctx)")
    ap.add_argument("--mmap", choices=["on", "off"], default="on")
    ap.add_argument("--repack", choices=["on", "off", "cpu"], default="on",
                    help="on: llama.cpp's default (use_extra_bufts: AMX where the CPU has it, then "
                         "CPU_REPACK); off: use_extra_bufts = False (no repacking, weights stay "
                         "mmapped); cpu: CPU_REPACK only, no AMX (what 'on' does on an x86 CPU "
                         "without AMX)")
    ap.add_argument("--log", action="store_true", help="keep llama.cpp's log on stderr")
    args = ap.parse_args()

    # ---- inputs
    if args.workload == "decode":
        if args.ids_file:
            raise RunError("--ids-file is for --workload stream")
        if not args.prompt_ids:
            raise RunError("--workload decode needs --prompt-ids")
        prompt = parse_ids(args.prompt_ids, "--prompt-ids")
        if not prompt:
            raise RunError("--prompt-ids is empty")
        if args.max_tokens is None or args.max_tokens < 1:
            raise RunError("--workload decode needs --max-tokens >= 1")
        n_needed = len(prompt) + args.max_tokens - 1
    else:
        if bool(args.ids_file) == bool(args.prompt_ids):
            raise RunError("--workload stream needs exactly one of --ids-file, --prompt-ids")
        if args.ids_file:
            try:
                with open(args.ids_file) as f:
                    prompt = json.load(f)
            except (OSError, ValueError) as e:
                raise RunError(f"cannot read --ids-file {args.ids_file}: {e}")
            if not isinstance(prompt, list) or not all(isinstance(x, int) for x in prompt):
                raise RunError(f"--ids-file {args.ids_file} must hold a JSON list of ints")
        else:
            prompt = parse_ids(args.prompt_ids, "--prompt-ids")
        if args.max_tokens is not None:
            if args.max_tokens > len(prompt):
                raise RunError(f"--max-tokens {args.max_tokens} exceeds the {len(prompt)} ids given")
            prompt = prompt[: args.max_tokens]
        if not prompt:
            raise RunError("no ids to feed")
        n_needed = len(prompt)
    if n_needed > args.ctx:
        raise RunError(f"{n_needed} positions needed, --ctx is {args.ctx}")
    if args.threads < 1:
        raise RunError("--threads must be >= 1")
    if not os.path.isfile(args.model):
        raise RunError(f"model {args.model} not found")

    try:
        import numpy as np
        import llama_cpp
    except ImportError as e:
        raise RunError(f"{e}; run this with the llama-cpp-python venv")

    # ---- quiet log (the callback object must outlive every llama.cpp call)
    if args.log:
        log_cb = llama_cpp.llama_log_callback(
            lambda level, text, user: sys.stderr.write(text.decode(errors="replace")))
    else:
        log_cb = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(log_cb, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()

    mp = llama_cpp.llama_model_default_params()
    fields = {f[0] for f in llama_cpp.llama_model_params._fields_}
    if "use_extra_bufts" not in fields:
        raise RunError(f"llama-cpp-python {llama_cpp.__version__}: llama_model_params has no "
                       "use_extra_bufts field; --repack cannot be controlled")
    mp.use_extra_bufts = args.repack == "on"
    system_info = llama_cpp.llama_print_system_info().decode().strip()
    amx = "AMX_INT8 = 1" in system_info
    if args.repack == "on" and amx and args.workload == "decode" and len(prompt) > 1:
        print("llamacpp_run.py: warning: this CPU has AMX and --repack on puts the 2-D Q4_0/Q8_0/Q6_K "
              "weights in llama.cpp's AMX buffer; its AMX mul_mat segfaulted on multi-token batches "
              "(the prefill) with llama-cpp-python 0.3.36. Use --repack cpu for CPU_REPACK only.",
              file=sys.stderr, flush=True)
    repacked: list[str] = []
    if args.repack == "cpu":
        overrides, repacked = cpu_repack_overrides(llama_cpp, args.model)
        if overrides is not None:
            mp.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
    mp.n_gpu_layers = 0
    if "load_mode" in fields:  # llama.cpp >= the load_mode enum
        mp.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if args.mmap == "on" else llama_cpp.LLAMA_LOAD_MODE_NONE
    elif "use_mmap" in fields:
        mp.use_mmap = args.mmap == "on"
        mp.use_mlock = False
    else:
        raise RunError("llama_model_params has neither load_mode nor use_mmap")

    mem = {"start": proc_status()}
    t0 = time.perf_counter()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mp)
    load_s = time.perf_counter() - t0
    if not model:
        raise RunError(f"llama_model_load_from_file({args.model}) failed")

    cp = llama_cpp.llama_context_default_params()
    n_batch = len(prompt) if args.workload == "decode" else 1
    cp.n_ctx = args.ctx
    cp.n_batch = n_batch
    cp.n_ubatch = n_batch
    cp.n_seq_max = 1
    cp.n_threads = args.threads
    cp.n_threads_batch = args.threads
    cp.no_perf = False
    t0 = time.perf_counter()
    ctx = llama_cpp.llama_init_from_model(model, cp)
    ctx_init_s = time.perf_counter() - t0
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise RunError("llama_init_from_model failed")
    mem["loaded"] = proc_status()

    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    if n_vocab <= 0:
        raise RunError(f"model has n_vocab {n_vocab}")
    bad = [t for t in prompt if not 0 <= t < n_vocab]
    if bad:
        raise RunError(f"token ids out of range [0, {n_vocab}): {bad[:5]}")

    buf = ctypes.create_string_buffer(256)
    gguf_type = None
    if llama_cpp.llama_model_meta_val_str(model, b"general.file_type", buf, len(buf)) > 0:
        v = int(buf.value.decode())
        gguf_type = FILE_TYPES.get(v, str(v))
    llama_cpp.llama_model_desc(model, buf, len(buf))
    model_desc = buf.value.decode(errors="replace")

    def forward(ids: list[int]):
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        batch = llama_cpp.llama_batch_get_one(arr, len(ids))
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RunError(f"llama_decode returned {rc} (n_tokens {len(ids)})")
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        if not ptr:
            raise RunError("llama_get_logits_ith returned NULL")
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    llama_cpp.llama_perf_context_reset(ctx)
    tokens: list[int] = []
    steps = 0
    if args.workload == "decode":
        t0 = time.perf_counter()
        logits = forward(prompt)
        prefill_s = time.perf_counter() - t0
        ttft_s = prefill_s
        mem["first_forward"] = proc_status()
        t1 = time.perf_counter()
        while True:
            tok = int(np.argmax(logits))
            tokens.append(tok)
            if len(tokens) == args.max_tokens:
                break
            logits = forward([tok])
            steps += 1
        decode_s = time.perf_counter() - t1
        decode_tok_s = steps / decode_s if steps and decode_s > 0 else 0.0
        n_prompt = len(prompt)
    else:
        prefill_s = 0.0
        ttft_s = None
        t1 = time.perf_counter()
        for i, tok in enumerate(prompt):
            logits = forward([tok])
            if i == 0:
                ttft_s = time.perf_counter() - t1
                mem["first_forward"] = proc_status()
            tokens.append(int(np.argmax(logits)))
        decode_s = time.perf_counter() - t1
        steps = len(prompt)
        decode_tok_s = steps / decode_s if decode_s > 0 else 0.0
        n_prompt = len(prompt)
    mem["end"] = proc_status()

    perf = llama_cpp.llama_perf_context(ctx)
    perf_d = {name: getattr(perf, name) for name, _ in perf._fields_}
    perf_d["prefill_tok_s"] = perf.n_p_eval / perf.t_p_eval_ms * 1000 if perf.t_p_eval_ms > 0 else 0.0
    perf_d["decode_tok_s"] = perf.n_eval / perf.t_eval_ms * 1000 if perf.t_eval_ms > 0 else 0.0
    n_ctx_real = llama_cpp.llama_n_ctx(ctx)
    model_size = llama_cpp.llama_model_size(model)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)

    end = mem["end"]
    out = {
        "engine": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": system_info,
        "model": args.model,
        "gguf_type": gguf_type,
        "model_desc": model_desc,
        "model_size_bytes": model_size,
        "workload": args.workload,
        "threads": args.threads,
        "ctx": args.ctx,
        "n_ctx": n_ctx_real,
        "n_batch": n_batch,
        "mmap": args.mmap,
        "repack": args.repack,
        "repacked_tensors": repacked if args.repack == "cpu" else None,
        "n_prompt": n_prompt,
        "prompt_ids": prompt if len(prompt) <= 64 else prompt[:64] + ["..."],
        "tokens": tokens,
        "load_s": load_s,
        "ctx_init_s": ctx_init_s,
        "ttft_s": ttft_s,
        "prefill_s": prefill_s,
        "prefill_tok_s": (n_prompt / prefill_s) if args.workload == "decode" and prefill_s > 0 else None,
        "decode_s": decode_s,
        "decode_steps": steps,
        "decode_tok_s": decode_tok_s,
        "llama_perf": perf_d,
        "rss_peak_bytes": end.get("VmHWM"),
        "rss_end_bytes": end.get("VmRSS"),
        "rss_anon_max_bytes": max((m.get("RssAnon", 0) for m in mem.values()), default=None),
        "memory": mem,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable()  # a crash inside llama.cpp prints where it happened, not just rc 139
    try:
        sys.exit(main())
    except RunError as e:
        print(f"llamacpp_run.py: error: {e}", file=sys.stderr)
        sys.exit(1)
