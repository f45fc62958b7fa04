#!/usr/bin/env python3
"""Write a GLM-5 shaped checkpoint as an IQ2_XS GGUF, the dense part by llama.cpp's converter and
the routed experts as IQ2_XS blocks with random codes (issue 46's "GLM-5 shape at IQ2_XS against
int4-g64" benchmark).

    glm5_gguf_shape.py HF_DIR OUT.gguf --llama-cpp DIR [--seed 46]

HF_DIR is what `make_glm5_shape.py` writes (the published FP8 layout of `glm_moe_dsa`); DIR is
`vendor/llama.cpp` of the llama-cpp-python 0.3.36 sdist. Everything but the routed experts goes
through llama.cpp's own `convert_hf_to_gguf.py` (`conversion/glm.py` `GlmMoeDsaModel`, a `glm-dsa`
file) with `--outtype bf16`: the FP8 weights dequantized by its `dequant_simple`, the names,
the MLA split of kv_b_proj into k_b / v_b and the metadata as llama.cpp writes them for GLM-5;
`set_vocab` replaced by the no-vocab writer (the benchmark model has no tokenizer, as in
tests/fixtures/gguf/make_gguf_fixtures.py).

Why random expert blocks. llama.cpp's IQ2_XS quantizer (`ggml_quantize_chunk`, what
`gguf_iquant.py` calls) takes ~15 s per 6144 x 2048 matrix on one core of this machine: one MoE
layer of GLM-5 (256 experts x 3 matrices) is ~3.2 CPU-hours. The benchmark measures bytes per
token, the cache and the kernels, none of which depend on the codes: an IQ2_XS block is 74
bytes for 256 weights (f16 `d`, 32 x u16 `qs` = 9-bit grid index + 7 sign bits, 8 bytes of
4-bit scales; ggml-common.h `block_iq2_xs`) and every bit pattern with a finite `d` is a valid
block that llama.cpp and gguf-py dequantize. So the stacked `blk.N.ffn_{gate,up,down}_exps.weight`
tensors are written here: `qs` and `scales` uniform random bytes (numpy PCG64, `--seed`), and
`d` one f16 per layer and projection (shared by its 256 experts) chosen so the dequantized
weights' RMS equals the source's (expert 0 of that layer and projection, dequantized from FP8;
the ratio of RMS to `d` measured with gguf-py's IQ2_XS dequantization of 4096 random blocks).
The high 7 bits of each `qs` entry index llama.cpp's `ksigns_iq2xs` table (8 signs, the 8th by
parity), so random bits are random signs. The model is random either way;
its routing (decided by the dense router and attention, which are the checkpoint's) is what the
cache sees. The tensors are added after the converter's own, in its GGUF, so the header,
metadata and alignment are llama.cpp's writer's. `general.file_type` stays the converter's
(MOSTLY_BF16); coli reads each tensor's type. The expert tensors are built in RAM before the
writer writes (~2.8 GB per MoE layer at GLM-5's dimensions). The checkpoint must have no MTP
layer (`make_glm5_shape.py --no-mtp`): its experts would need the same treatment.

Needs torch, numpy, safetensors and gguf-py (the venv of engine/bench/README.md).
"""

import argparse
import json
import os
import re
import sys
import time

import numpy as np

QK = 256
BLOCK_BYTES = 74  # block_iq2_xs: f16 d, u16 qs[32], u8 scales[8]


def expert_rms(hf_dir: str, layer: int, proj: str) -> float:
    """RMS of expert 0's `proj` weight of `layer`, dequantized from FP8 (e4m3 x its 128 x 128
    weight_scale_inv block)."""
    import torch
    from safetensors import safe_open

    with open(os.path.join(hf_dir, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    name = f"model.layers.{layer}.mlp.experts.0.{proj}.weight"
    with safe_open(os.path.join(hf_dir, wm[name]), "pt") as f:
        w = f.get_tensor(name).to(torch.float32)
    sname = name + "_scale_inv"
    if sname in wm:
        with safe_open(os.path.join(hf_dir, wm[sname]), "pt") as f:
            s = f.get_tensor(sname).to(torch.float32)
        s = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
        w = w * s
    return float(w.pow(2).mean().sqrt())


def unit_rms(rng) -> float:
    """RMS of weights dequantized (gguf-py) from random IQ2_XS blocks whose d is 1.0."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    b = random_blocks(rng, 4096, 1.0)
    return float(np.sqrt(np.mean(dequantize(b.reshape(-1), GGMLQuantizationType.IQ2_XS) ** 2)))


def random_blocks(rng, n_blocks: int, d: float) -> np.ndarray:
    """n_blocks IQ2_XS blocks ([n_blocks, 74] u8): random qs and scales, d as little-endian f16."""
    b = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES), dtype=np.uint8)
    b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), dtype=np.uint8)
    return b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist")
    ap.add_argument("--seed", type=int, default=46)
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"{a.out} exists; remove it first")

    sys.path.insert(0, a.llama_cpp)
    sys.path.insert(0, os.path.join(a.llama_cpp, "gguf-py"))
    sys.argv = ["convert_hf_to_gguf.py", a.hf_dir, "--outfile", a.out, "--outtype", "bf16"]
    import convert_hf_to_gguf as c
    from conversion.glm import GlmMoeDsaModel
    from gguf.constants import GGMLQuantizationType

    rng = np.random.default_rng(a.seed)
    per_unit = unit_rms(rng)

    def no_vocab(self):
        self._set_vocab_none()
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    parent_filter = GlmMoeDsaModel.filter_tensors.__func__

    def filter_tensors(cls, item):
        # The routed experts (and their FP8 scales) are written by add_experts below.
        if ".mlp.experts." in item[0]:
            return None
        return parent_filter(cls, item)

    parent_prepare = GlmMoeDsaModel.prepare_tensors

    def add_experts(self):
        parent_prepare(self)
        hp = self.hparams
        hidden, inter, n_exp = hp["hidden_size"], hp["moe_intermediate_size"], hp["n_routed_experts"]
        first_moe = hp.get("first_k_dense_replace", 0)
        for layer in range(first_moe, hp["num_hidden_layers"]):
            for proj, (rows, cols) in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                       ("down_proj", (hidden, inter))):
                t0 = time.time()
                rms = expert_rms(a.hf_dir, layer, proj)
                d = rms / per_unit
                blocks = random_blocks(rng, n_exp * rows * cols // QK, d)
                data = blocks.reshape(n_exp, rows, cols // QK * BLOCK_BYTES)
                name = f"blk.{layer}.ffn_{proj.split('_')[0]}_exps.weight"
                self.gguf_writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType.IQ2_XS)
                print(f"{name}: IQ2_XS [{n_exp}, {rows}, {cols}], {data.nbytes:,} B, source RMS {rms:.6g}, "
                      f"d {float(np.float16(d)):.6g} ({time.time() - t0:.1f} s)", flush=True)

    GlmMoeDsaModel.set_vocab = no_vocab
    GlmMoeDsaModel.filter_tensors = classmethod(filter_tensors)
    GlmMoeDsaModel.prepare_tensors = add_experts
    with open(os.path.join(a.hf_dir, "config.json")) as f:
        cfg_text = f.read()
    if not re.search(r"GlmMoeDsa", cfg_text):
        sys.exit(f"{a.hf_dir}/config.json is not a GlmMoeDsaForCausalLM checkpoint")
    if json.loads(cfg_text).get("num_nextn_predict_layers", 0):
        sys.exit(f"{a.hf_dir} has an MTP layer, whose experts this script does not write: "
                 "make the checkpoint with make_glm5_shape.py --no-mtp")
    c.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
