#!/usr/bin/env python3
"""Header-only GGUFs of published flagships at llama.cpp's quantization mixes, for
`coli plan --gguf` (docs/WHAT_FITS.md, "GGUF quants"; run by what_fits_gguf.sh).

`coli plan --gguf FILE` reads only the header: the tensors' names, shapes and types. These files
have a real header and no data (sparse files of the full length): nothing is downloaded, and
every choice in them is llama.cpp's own:

1. A checkpoint of the release's layout, without data: config.json (docs/configs/<model>.config.json,
   the release's) and one safetensors file whose header lists every tensor of the release's public
   name listing (tests/fixtures/published/<model>.tensors.txt, `{a..b}` ranges expanded, the
   listed dtypes, FP8 `weight_scale_inv` per 128x128 block) at the shape the config gives it
   (`shape()` below), its data a hole.
2. llama.cpp's converter (`convert_hf_to_gguf.py` of the llama-cpp-python 0.3.36 sdist, the class
   the config's `architectures` picks; `--outtype bf16`, no vocabulary) writes the GGUF header
   from it; its lazy tensors are never evaluated: `GGUFWriter.write_tensors_to_file` is replaced
   by one that sizes the data section as a hole.
3. `llama-quantize --dry-run IN TYPE` (the same sdist's tools/quantize, built from source) chooses
   each tensor's type for the mix TYPE (`llama_tensor_get_type`, without an importance matrix,
   which changes values, not types) and prints it; the quantized file's header is that of step 2
   with those types (gguf-py's writer; `general.file_type` set), its data again a hole.

What these files are not: unsloth's "UD" dynamic quants (their own per-tensor choices) or a
quant made with llama-quantize's `--tensor-type` overrides; bartowski-style quants (plain
llama-quantize with an imatrix) have these mixes.

Usage: gguf_headers.py --llama-cpp DIR --quantize BIN --out DIR MODEL:TYPE[,TYPE...] ...
  (DIR = the sdist's vendor/llama.cpp; BIN = its llama-quantize)
Needs torch, numpy, safetensors (tests/fixtures/requirements.txt) and the sdist's gguf-py.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def expand(line: str) -> list[str]:
    """`model.layers.{0..2}.x` -> the names it stands for (every range expanded)."""
    m = re.search(r"\{(\d+)\.\.(\d+)\}", line)
    if not m:
        return [line]
    out = []
    for i in range(int(m.group(1)), int(m.group(2)) + 1):
        out += expand(line[: m.start()] + str(i) + line[m.end():])
    return out


def shape(name: str, c: dict) -> list[int]:
    """The release's shape of tensor `name` (DeepSeek-V3 / Kimi-K2 / GLM-5 naming) from config `c`."""
    h, v = c["hidden_size"], c["vocab_size"]
    nh = c["num_attention_heads"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ql, kl = c.get("q_lora_rank"), c["kv_lora_rank"]
    moe, shared = c["moe_intermediate_size"], c.get("n_shared_experts") or 0
    base = name.removesuffix(".weight").removesuffix(".bias")
    last = base.split(".")[-1]
    if name in ("lm_head.weight", "model.embed_tokens.weight") or last in ("embed_tokens", "head"):
        return [v, h]
    if last in ("input_layernorm", "post_attention_layernorm", "norm", "enorm", "hnorm"):
        return [h]
    if base.endswith("indexer.k_norm"):
        return [c["index_head_dim"]]
    table = {
        "q_a_proj": [ql, h],
        "q_a_layernorm": [ql],
        "q_b_proj": [nh * (nope + rope), ql],
        "q_proj": [nh * (nope + rope), h],
        "kv_a_proj_with_mqa": [kl + rope, h],
        "kv_a_layernorm": [kl],
        "kv_b_proj": [nh * (nope + vd), kl],
        "o_proj": [h, nh * vd],
        "eh_proj": [h, 2 * h],
        "e_score_correction_bias": [c["n_routed_experts"]],
        "wq_b": [c.get("index_n_heads", 0) * c.get("index_head_dim", 0), ql],
        "wk": [c.get("index_head_dim", 0), h],
        "weights_proj": [c.get("index_n_heads", 0), h],
    }
    if last in table:
        return table[last]
    if last == "gate" and ".mlp." in name:
        return [c["n_routed_experts"], h]
    width = moe if ".experts." in name else moe * shared if ".shared_experts." in name else c["intermediate_size"]
    if last in ("gate_proj", "up_proj"):
        return [width, h]
    if last == "down_proj":
        return [h, width]
    raise SystemExit(f"no shape rule for {name}")


def sparse_checkpoint(model: str, d: Path) -> None:
    """config.json and a data-less model.safetensors of the release's names, dtypes and shapes."""
    cfg_text = (HERE / f"{model}.config.json").read_text()
    c = json.loads(cfg_text)
    c.pop("_comment", None)
    (d / "config.json").write_text(json.dumps(c, indent=2))
    header, at = {}, 0
    listing = ROOT / "tests" / "fixtures" / "published" / f"{model}.tensors.txt"
    seen = set()
    for line in listing.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pattern, dtype = line.split()
        for name in expand(pattern):
            if name in seen or name.endswith("rotary_emb.inv_freq"):
                continue
            seen.add(name)
            if name.endswith("_scale_inv"):
                r, k = shape(name.removesuffix("_scale_inv"), c)
                s = [math.ceil(r / 128), math.ceil(k / 128)]
            else:
                s = shape(name, c)
            n = DTYPE_BYTES[dtype] * math.prod(s)
            header[name] = {"dtype": dtype, "shape": s, "data_offsets": [at, at + n]}
            at += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        f.truncate(8 + len(hb) + at)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": at}, "weight_map": {k: "model.safetensors" for k in header}}))


CONVERT = r"""
import sys
sys.path.insert(0, {vendor!r})
sys.argv = ["convert_hf_to_gguf.py", {hf!r}, "--outfile", {out!r}, "--outtype", "bf16"]
import convert_hf_to_gguf as c
import gguf
from gguf.gguf_writer import GGUFWriter, WriterState

def header_only(self, *, progress=False):
    # The header and tensor infos as written; the data section a hole of its length.
    self.write_ti_data_to_file()
    for fout, tensors in zip(self.fout, self.tensors):
        self.write_padding(fout, fout.tell())
        size = sum(GGUFWriter.ggml_pad(ti.nbytes, self.data_alignment) for ti in tensors.values())
        fout.truncate(fout.tell() + size)
    self.state = WriterState.WEIGHTS

GGUFWriter.write_tensors_to_file = header_only
# No vocabulary (the checkpoint ships none): the class the config picks writes none.
pick = c.get_model_class

def get_model_class(*args, **kwargs):
    cls = pick(*args, **kwargs)
    cls.set_vocab = lambda self: (self._set_vocab_none(), self.gguf_writer.add_vocab_size(self.hparams["vocab_size"]))
    return cls

c.get_model_class = get_model_class
c.main()
"""


def convert(vendor: str, hf: Path, out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    code = CONVERT.format(vendor=vendor, hf=str(hf), out=str(out))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if r.returncode != 0 or not out.exists():
        raise SystemExit(f"convert_hf_to_gguf failed on {hf}:\n{r.stderr[-6000:]}")


LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*\], type =\s*(\S+), size = .*?(?:\((\S+)\))?\s*$")


def dry_run(quantize: str, src: Path, qtype: str) -> dict[str, str]:
    """llama-quantize --dry-run's type for every tensor of `src` at mix `qtype` (ggml type names)."""
    r = subprocess.run([quantize, "--dry-run", str(src), qtype], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama-quantize --dry-run {src} {qtype} failed:\n{r.stderr[-4000:]}")
    types = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = LINE.match(line.strip())
        if m:
            types[m.group(1)] = m.group(3) or m.group(2)
    return types


def quantized_header(vendor: str, src: Path, types: dict[str, str], ftype: int, out: Path) -> None:
    import gguf

    rd = gguf.GGUFReader(str(src))
    if set(types) != {t.name for t in rd.tensors}:
        raise SystemExit(f"{src}: llama-quantize listed {len(types)} tensors, the file has {len(rd.tensors)}")
    arch = str(rd.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(out), arch)
    w.kv_data[0].clear()
    for k, f in rd.fields.items():
        if k.startswith("GGUF."):
            continue
        vt = f.types[0]
        if k == "general.file_type":
            continue
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), vt)
    w.add_file_type(ftype)
    by_name = {t.name.lower(): t for t in gguf.GGMLQuantizationType}
    total = 0
    for t in rd.tensors:
        qt = by_name[types[t.name].lower()]
        ne = [int(x) for x in t.shape]  # innermost first, as ggml
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        nbytes = math.prod(ne[1:]) * (ne[0] // bs) * ts
        # raw_shape is outermost first; its dtype is the ggml type, the bytes are none.
        w.add_tensor_info(t.name, list(reversed(ne)), qt, nbytes, raw_dtype=qt)
        total += nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    size = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, w.data_alignment) for ti in w.tensors[0].values())
    fout.truncate(fout.tell() + size)
    fout.close()


# llama.cpp's llama_ftype values (include/llama.h) of the mixes used here.
FTYPES = {"Q4_K_M": 15, "Q2_K": 10, "IQ2_M": 29, "IQ2_XS": 20, "IQ1_S": 24, "IQ1_M": 31, "Q8_0": 7, "Q3_K_M": 12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--quantize", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("models", nargs="+", help="MODEL:TYPE[,TYPE...]")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(a.llama_cpp) / "gguf-py"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for spec in a.models:
        model, qtypes = spec.split(":")
        ck = out / f"{model}-checkpoint"
        shutil.rmtree(ck, ignore_errors=True)
        ck.mkdir()
        sparse_checkpoint(model, ck)
        bf16 = out / f"{model}-BF16.gguf"
        convert(a.llama_cpp, ck, bf16)
        shutil.rmtree(ck)
        for q in qtypes.split(","):
            types = dry_run(a.quantize, bf16, q)
            dst = out / f"{model}-{q}.gguf"
            quantized_header(a.llama_cpp, bf16, types, FTYPES[q], dst)
            counts = {}
            for t in types.values():
                counts[t] = counts.get(t, 0) + 1
            print(f"{dst.name}: {os.path.getsize(dst) / 2**30:.1f} GiB, tensor types {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
