#!/usr/bin/env python3
"""Byte-identity guard for the store format: converts every committed tiny fixture
(tests/fixtures/tiny/*, and the GGUF files of tests/fixtures/gguf/) with a fixed set of
coli-convert parameters and lists the sha256 of
every file of every store written.

A change that must not alter stores (a refactor, a faster kernel, a new crate layout) leaves
this list unchanged. The committed list (tests/fixtures/store_sha256.txt) was written by the
converter BEFORE such a change; the test suite (tools/test.sh) checks the current converter
against it.

    python3 tests/store_bytes.py --convert target/debug/coli-convert            # print the list
    python3 tests/store_bytes.py --convert BIN --check tests/fixtures/store_sha256.txt
    python3 tests/store_bytes.py --convert NEW --ref OLD      # compare two converters directly

The store id depends on the converter's version string, the parameters and the source files
(FORMAT.md section 2), never on paths or time, so the list is reproducible. Exit status: 0 when
equal (or when only printing), 1 on any difference (each differing file is named), 2 when a
conversion fails.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tiny")
# GGUF fixtures (format version 4, or 6 with i-quants): converted with no options (their blocks
# are kept).
GGUF_FIXTURES = os.path.join(ROOT, "tests", "fixtures", "gguf")

# Parameter sets: every encoding of the format (f32/bf16 kept tensors, fp8, int8, int4 with
# both group sizes) on every family.
# `--matrix-order row-major`: the bytes of the releases before format version 7 (the sets'
# entries were written by those releases' converter and must not change).
ROW_MAJOR = ["--matrix-order", "row-major"]
PARAMS = {
    "int4-default": ["--experts", "int4-g64", "--dense", "bf16", "--mtp", "int8", *ROW_MAJOR],
    "lossless": ["--experts", "fp8", "--dense", "fp8", "--mtp", "fp8", *ROW_MAJOR],
    "int8": ["--experts", "int8", "--dense", "int8", *ROW_MAJOR],
    "int4-g32-int8-embeddings": [
        "--experts", "int4-g32", "--dense", "int8", "--embeddings", "int8", *ROW_MAJOR,
    ],
    "bf16": ["--experts", "bf16", "--dense", "bf16", "--mtp", "bf16", *ROW_MAJOR],
    # Format version 2: MXFP4 experts kept as published, with their biases (gpt-oss).
    "mxfp4": ["--experts", "mxfp4", "--dense", "bf16", *ROW_MAJOR],
    # Format version 5: MXFP8 experts kept as published (Inkling 2's -MXFP8 releases).
    "mxfp8": ["--experts", "mxfp8", "--dense", "bf16", *ROW_MAJOR],
    # DeepSeek-V4's release: FP4 experts kept as mxfp4, FP8 dense (E8M0 block scales) as fp8.
    "fp4-fp8": ["--experts", "mxfp4", "--dense", "fp8", *ROW_MAJOR],
    # Format version 7, coli-convert's default order: int4 / int8 / mxfp4 matrices of 64-column
    # chunks interleaved, in records and dense.bin.
    "int4-interleaved": ["--experts", "int4-g64", "--dense", "int4-g32", "--embeddings", "int4-g64"],
    "int8-interleaved": ["--experts", "int8", "--dense", "int8"],
    "mxfp4-interleaved": ["--experts", "mxfp4", "--dense", "bf16"],
}

# Fixtures whose experts are FP4 (I8 codes, e8m0 scales) and whose dense weights are FP8.
FP4_EXPERTS = {"deepseek_v4_fp8"}


def applicable(fixture, params):
    """fp8 targets need FP8 sources (the bf16 and gpt-oss fixtures have none); mxfp4 and mxfp8
    targets need MXFP4 / MXFP8 sources (gpt_oss_mxfp4, inkling2_mxfp8; deepseek_v4_fp8's FP4
    experts are MXFP4's bits, its dense weights FP8)."""
    if fixture in FP4_EXPERTS:
        return params[:2] != ["--experts", "fp8"] and "mxfp8" not in params
    if params == PARAMS["fp4-fp8"]:
        return False
    if "fp8" in params and not fixture.endswith("_fp8"):
        return False
    if "mxfp4" in params:
        return fixture.endswith("_mxfp4")
    if "mxfp8" in params:
        return fixture.endswith("_mxfp8")
    return True


def has_mtp_layer(src):
    """Whether the fixture's config declares an MTP layer (`--mtp ENCODING` is refused for a
    model without one since issue 41; such stores are converted without the option)."""
    with open(os.path.join(src, "config.json")) as fh:
        c = json.load(fh)
    t = c.get("text_config", c)
    if t.get("model_type") in ("glm5_next_text", "deepseek_v4"):
        return False  # GLM-5.3-Flash's and DeepSeek-V4's MTP layers are listed as not converted (no oracle)
    return any(x.get(k, 0) for x in (c, t) for k in ("num_nextn_predict_layers", "num_mtp_layers"))


def without_mtp(params):
    out, skip = [], False
    for a in params:
        if skip:
            skip = False
        elif a == "--mtp":
            skip = True
        else:
            out.append(a)
    return out


def jobs():
    """(fixture, label, source, params) of every conversion."""
    for fixture in sorted(os.listdir(FIXTURES)):
        src = os.path.join(FIXTURES, fixture)
        if not os.path.isdir(src):
            continue
        for label, params in PARAMS.items():
            if not applicable(fixture, params):
                continue
            if not has_mtp_layer(src):
                params = without_mtp(params)
            yield fixture, label, src, params
    for f in sorted(os.listdir(GGUF_FIXTURES)):
        if f.endswith(".gguf"):
            yield f[: -len(".gguf")], "gguf", os.path.join(GGUF_FIXTURES, f), []


def store_hashes(convert, out_root):
    """{"fixture/params/relpath": sha256} for every store file."""
    result = {}
    for fixture, label, src, params in jobs():
        out = os.path.join(out_root, fixture, label)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        p = subprocess.run(
            [convert, src, out, "--threads", "2", "--json", *params],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            sys.stderr.write(
                f"store_bytes: {convert} {fixture} {' '.join(params)} failed:\n{p.stderr}"
            )
            sys.exit(2)
        for dirpath, _, files in os.walk(out):
            for f in files:
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, out)
                with open(path, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
                result[f"{fixture}/{label}/{rel}"] = digest
    return result


def read_list(path):
    out = {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line and not line.startswith("#"):
                digest, name = line.split(None, 1)
                out[name] = digest
    return out


def compare(want, got, what):
    bad = 0
    for name in sorted(set(want) | set(got)):
        a, b = want.get(name), got.get(name)
        if a != b:
            bad += 1
            print(f"DIFFERS {name}: {what} {a or 'absent'}, now {b or 'absent'}")
    print(f"store_bytes: {len(got)} files compared, {bad} differ")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--convert", required=True, help="coli-convert binary under test")
    ap.add_argument("--check", help="committed sha256 list to compare with")
    ap.add_argument("--ref", help="another coli-convert binary to compare with")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        got = store_hashes(a.convert, os.path.join(tmp, "new"))
        if a.check:
            sys.exit(compare(read_list(a.check), got, "expected"))
        if a.ref:
            ref = store_hashes(a.ref, os.path.join(tmp, "ref"))
            sys.exit(compare(ref, got, "reference"))
    for name in sorted(got):
        print(f"{got[name]}  {name}")


if __name__ == "__main__":
    main()
