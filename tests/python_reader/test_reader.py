"""Tests of coli_reader.py (a store reader written from docs/FORMAT.md alone) against the SOURCE
checkpoints: each tiny fixture (tests/fixtures/tiny/) is converted by the coli-convert binary
into temporary stores, read back with coli_reader, and every expert and dense tensor compared
with the safetensors files, parsed here with numpy:

  fp8 / bf16 / f32 : bit-exact (raw e4m3 bytes and block scales; bf16 bits = the source's or
                     round-to-nearest-even of its f32 value)
  int8 / int4      : scales and q exactly as FORMAT.md section 6 quantizes the source
                     (s = max(absmax / qmax, 1e-8), q = clip(rint(w / s))), |w_deq - w| <= s / 2,
                     and the fixture's own `int4_probe` (expected.json) for int4-g64

plus damage detection (record xxh3, MANIFEST crc32, INDEX checksum).

Usage: python tests/python_reader/test_reader.py [PATH_TO_COLI_CONVERT]
(or set COLI_CONVERT; default target/debug/coli-convert). Exits 1 when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import coli_reader as cr  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tiny")


def coli_convert() -> str:
    exe = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("COLI_CONVERT")
    exe = exe or os.path.join(ROOT, "target", "debug", "coli-convert")
    assert os.access(exe, os.X_OK), f"coli-convert not found at {exe}: cargo build -p coli-convert"
    return exe


# ---- the source checkpoint, read with numpy ------------------------------------------------


class Checkpoint:
    """Tensors of a safetensors checkpoint directory: (dtype, shape, raw bytes)."""

    def __init__(self, d: str):
        self.tensors = {}
        for name in sorted(os.listdir(d)):
            if not name.endswith(".safetensors"):
                continue
            with open(os.path.join(d, name), "rb") as f:
                b = f.read()
            n = int.from_bytes(b[:8], "little")
            header = json.loads(b[8 : 8 + n])
            for t, e in header.items():
                if t == "__metadata__":
                    continue
                s, end = e["data_offsets"]
                self.tensors[t] = (e["dtype"], e["shape"], b[8 + n + s : 8 + n + end])

    def raw(self, name: str) -> tuple[str, np.ndarray]:
        dtype, shape, b = self.tensors[name]
        npd = {"F8_E4M3": np.uint8, "BF16": "<u2", "F32": "<f4"}[dtype]
        shape2 = shape if len(shape) == 2 else [1, shape[0]]
        return dtype, np.frombuffer(b, dtype=npd).reshape(shape2)

    def scale(self, name: str) -> np.ndarray:
        """The FP8 block scales of `name` as f32 (BF16 scales widened)."""
        dtype, s = self.raw(name + "_scale_inv")
        return cr.bf16_to_f32(s) if dtype == "BF16" else s.astype(np.float32)

    def value(self, name: str) -> np.ndarray:
        """The source tensor as f32 [rows, cols]: e4m3(q) * scale in f32, or widened."""
        dtype, w = self.raw(name)
        if dtype == "F8_E4M3":
            s = self.scale(name)
            r, c = w.shape
            s_full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:r, :c]
            return cr.E4M3[w] * s_full
        if dtype == "BF16":
            return cr.bf16_to_f32(w)
        return w.astype(np.float32)


def bf16_rne(w: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bits, round to nearest, ties to even (finite inputs)."""
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def expected_quant(w: np.ndarray, group: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """FORMAT.md section 6 quantization of f32 [r, c] per row in groups of `group` columns:
    (scales f32 [r, ngroups], q int [r, c])."""
    r, c = w.shape
    ng = -(-c // group)
    pad = np.zeros((r, ng * group), dtype=np.float32)
    pad[:, :c] = np.abs(w)
    absmax = pad.reshape(r, ng, group).max(axis=2)
    s = np.maximum(absmax / np.float32(qmax), np.float32(1e-8)).astype(np.float32)
    s_full = np.repeat(s, group, axis=1)[:, :c]
    q = np.clip(np.rint(w / s_full), -qmax - 1, qmax)
    return s, q.astype(np.int32)


def check_matrix(what: str, m: cr.Matrix, ck: Checkpoint, name: str) -> int:
    """Compares one store matrix with source tensor `name`; returns values checked."""
    dtype, raw = ck.raw(name)
    assert (m.rows, m.cols) == raw.shape, f"{what}: shape {(m.rows, m.cols)} vs source {raw.shape}"
    w = ck.value(name)
    deq = m.dequantize()
    assert deq.dtype == np.float32 and deq.shape == w.shape
    if m.encoding == cr.FP8:
        assert dtype == "F8_E4M3", f"{what}: fp8 store of a {dtype} source"
        assert np.array_equal(m.raw(), raw), f"{what}: fp8 bytes differ from the source"
        s = ck.scale(name)
        assert np.array_equal(m.scales.reshape(s.shape).view(np.uint32), s.view(np.uint32)), f"{what}: scales"
        assert np.array_equal(deq.view(np.uint32), w.view(np.uint32)), f"{what}: dequantized values"
    elif m.encoding == cr.BF16:
        want = raw if dtype == "BF16" else bf16_rne(w)
        assert np.array_equal(m.raw(), want), f"{what}: bf16 bits differ"
    elif m.encoding == cr.F32:
        assert np.array_equal(m.raw().view(np.uint32), w.view(np.uint32)), f"{what}: f32 values differ"
    elif m.encoding in (cr.INT8, cr.INT4):
        qmax = 127 if m.encoding == cr.INT8 else 7
        group = m.cols if m.encoding == cr.INT8 else m.group_size
        s, q = expected_quant(w, group, qmax)
        got_s = m.scales.reshape(s.shape)
        bad = np.argwhere(got_s.view(np.uint32) != s.view(np.uint32))
        assert bad.size == 0, f"{what}: scale {bad[0].tolist()} is {got_s[tuple(bad[0])]}, expected {s[tuple(bad[0])]}"
        got_q = m.raw().astype(np.int32) if m.encoding == cr.INT8 else m.int4_q().astype(np.int32)
        bad = np.argwhere(got_q != q)
        assert bad.size == 0, f"{what}: q{bad[0].tolist()} is {got_q[tuple(bad[0])]}, expected {q[tuple(bad[0])]}"
        s_full = np.repeat(got_s, group, axis=1)[:, : m.cols]
        err = np.abs(deq - w)
        assert np.all(err <= s_full * 0.5 + 1e-6 * (np.abs(w) + s_full)), f"{what}: beyond half a step"
        if m.encoding == cr.INT4 and m.cols % 2:
            assert np.all(m.raw()[:, -1] >> 4 == 8), f"{what}: odd-column padding nibble is not 8"
    else:
        raise AssertionError(f"{what}: unknown encoding {m.encoding}")
    return m.rows * m.cols


def expert_tensor(family: str, layer: int, expert: int, which: int) -> str:
    if family == "mixtral":
        return f"model.layers.{layer}.block_sparse_moe.experts.{expert}.{('w1', 'w3', 'w2')[which]}.weight"
    return f"model.layers.{layer}.mlp.experts.{expert}.{('gate_proj', 'up_proj', 'down_proj')[which]}.weight"


_TMP = tempfile.mkdtemp(prefix="coli-pyreader-")


def convert(fixture: str, experts: str, dense: str, order: str = "interleaved") -> str:
    """The store of `fixture` (converted once); `order` is `--matrix-order` (coli-convert's
    default: interleaved, format version 7 where a record has a matrix of that order)."""
    out = os.path.join(_TMP, f"{fixture}-{experts}-{dense}-{order}")
    if not os.path.exists(os.path.join(out, "MANIFEST")):
        cmd = [coli_convert(), os.path.join(FIXTURES, fixture), out, "--experts", experts, "--dense", dense,
               "--matrix-order", order]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}"
    return out


def check_store(fixture: str, experts: str, dense: str) -> None:
    path = convert(fixture, experts, dense)
    st = cr.Store(path)
    st.verify_segment_bodies()
    st.verify_files()
    ck = Checkpoint(os.path.join(FIXTURES, fixture))
    m = st.manifest
    assert m["parameters"]["experts"] == experts and m["parameters"]["dense"] == dense, m["parameters"]
    # The source files' identities in MANIFEST `sources` (xxh3 of the 8-byte length + header).
    for src in m["sources"]:
        with open(os.path.join(FIXTURES, fixture, src["name"]), "rb") as f:
            b = f.read()
        n = int.from_bytes(b[:8], "little")
        assert src["size"] == len(b) and src["header_xxh3"] == f"{cr.xxh3(b[: 8 + n]):016x}", src
    family = m["family"]
    n = 0
    for layer, expert in st.experts():
        e = st.read_expert(layer, expert)
        assert (e.layer, e.expert) == (layer, expert)
        for which, mat in enumerate((e.gate, e.up, e.down)):
            name = expert_tensor(family, layer, expert, which)
            n += check_matrix(name, mat, ck, name)
    for name in st.dense_names():
        n += check_matrix(name, st.dense(name), ck, name)
    assert n > 100_000, n
    print(f"  {fixture} --experts {experts} --dense {dense}: {len(st.experts())} experts, "
          f"{len(st.dense_names())} dense tensors, {n} values match the source")


# ---- tests ---------------------------------------------------------------------------------


def test_lossless_fp8_stores_are_bit_exact():
    for fx in ("mixtral_fp8", "olmoe_fp8", "qwen3_moe_fp8"):
        check_store(fx, "fp8", "fp8")


def test_lossless_bf16_store_is_bit_exact():
    check_store("qwen3_moe_bf16", "bf16", "bf16")


def test_int4_g64_default_stores():
    for fx in ("mixtral_fp8", "olmoe_fp8", "deepseek_v3_fp8"):
        check_store(fx, "int4-g64", "bf16")


def test_int4_g32_and_int8_stores():
    check_store("qwen3_moe_fp8", "int4-g32", "int8")
    check_store("olmoe_fp8", "int8", "int8")


def test_int4_probe_from_expected_json():
    """The fixture generator's own int4 values (independent of coli) for layer 0 expert 0 gate
    rows 0-1: q, scales and dequantized values equal exactly."""
    for fx in ("mixtral_fp8", "qwen3_moe_fp8", "olmoe_fp8", "qwen3_moe_bf16"):
        with open(os.path.join(FIXTURES, fx, "expected.json")) as f:
            probe = json.load(f)["int4_probe"]
        st = cr.Store(convert(fx, "int4-g64", "bf16"))
        e = st.read_expert(probe["layer"], probe["expert"])
        g = {"gate": e.gate, "up": e.up, "down": e.down}[probe["matrix"]]
        assert g.cols == probe["cols"] and g.group_size == probe["group_size"] == 64
        rows = probe["rows"]
        q = g.int4_q()[rows]
        assert np.array_equal(q, np.array(probe["int4_q"])), f"{fx}: q differs from int4_probe"
        s = g.scales.reshape(g.rows, -1)[rows]
        assert np.array_equal(s, np.array(probe["int4_scales"], dtype=np.float64).astype(np.float32)), f"{fx}: scales"
        d = g.dequantize()[rows]
        want = np.array(probe["int4_dequantized"], dtype=np.float64).astype(np.float32)
        assert np.array_equal(d, want), f"{fx}: dequantized values differ from int4_probe"


def test_int4_dense_store_version_3():
    """int4 dense tensors (format version 3): every dense int4 tensor's codes and scales follow
    FORMAT.md section 6 from the source values; routers, norms and the rest as in the source."""
    for fx in ("mixtral_fp8", "qwen3_moe_bf16"):
        check_store(fx, "int4-g64", "int4-g32")
        st = cr.Store(convert(fx, "int4-g64", "int4-g32", "row-major"))
        assert st.manifest["format_version"] == 3, st.manifest["format_version"]
        # coli-convert's default order: the same values (check_store above), version 7 where a
        # matrix has 64-column chunks (qwen3-moe's hidden size 64; mixtral's 80 has none).
        st7 = cr.Store(convert(fx, "int4-g64", "int4-g32"))
        flagged = [d["name"] for d in st7.manifest["dense"] if d.get("interleaved")]
        want = 7 if fx == "qwen3_moe_bf16" else 3
        assert st7.manifest["format_version"] == want and bool(flagged) == (want == 7), (fx, flagged)
        encs = {d["name"]: (d["encoding"], d["group_size"]) for d in st.manifest["dense"]}
        assert encs["model.layers.0.self_attn.q_proj.weight"] == (cr.INT4, 32), encs
        assert encs["model.norm.weight"][0] in (cr.BF16, cr.F32), encs


def _file_tensor(fixture: str, name: str) -> np.ndarray:
    """A tensor of a fixture checkpoint as its raw array (BF16 as uint16 bits, U8 as bytes)."""
    d = os.path.join(FIXTURES, fixture)
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shard = json.load(f)["weight_map"][name]
    with open(os.path.join(d, shard), "rb") as f:
        b = f.read()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8 : 8 + n])[name]
    s, e = h["data_offsets"]
    dtypes = {"BF16": "<u2", "U8": np.uint8, "F8_E4M3": np.uint8}
    raw = np.frombuffer(b[8 + n + s : 8 + n + e], dtype=dtypes[h["dtype"]])
    return raw.reshape(h["shape"])


def test_mxfp4_store_version_2():
    """gpt-oss (format version 2): the lossless store's mxfp4 records hold the published
    blocks and e8m0 scales (rows de-interleaved) and the biases; their decode equals the
    fixture generator's own numpy decode (`mxfp4_probe`), and the whole of layer 0 expert 0
    decodes like the checkpoint blocks decoded by this reader's rule."""
    fx = "gpt_oss_mxfp4"
    with open(os.path.join(FIXTURES, fx, "expected.json")) as f:
        exp = json.load(f)
    for order, version in (("row-major", 2), ("interleaved", 7)):
        _check_mxfp4_store(fx, exp, order, version)


def _check_mxfp4_store(fx: str, exp: dict, order: str, version: int) -> None:
    path = convert(fx, "mxfp4", "bf16", order)
    st = cr.Store(path)
    st.verify_segment_bodies()
    assert st.manifest["format_version"] == version, (order, st.manifest["format_version"])
    # Version 7: every record flags its interleaved matrices (gate and up: [96, 64]).
    flagged = st.index["flags"] & np.uint32(cr.RECORD_FLAG_INTERLEAVED) != 0
    assert flagged.all() if order == "interleaved" else not flagged.any(), order
    probe = exp["mxfp4_probe"]
    e = st.read_expert(probe["layer"], probe["expert"])
    assert e.gate.encoding == cr.MXFP4 and e.gate.scales.dtype == np.uint8
    got = e.gate.dequantize()[probe["rows"]]
    want = np.array(probe["values_f32"], dtype=np.float64).astype(np.float32)
    assert np.array_equal(got, want), "mxfp4 decode differs from the fixture's probe"
    blocks = _file_tensor(fx, "model.layers.0.mlp.experts.gate_up_proj_blocks")[0]
    scales = _file_tensor(fx, "model.layers.0.mlp.experts.gate_up_proj_scales")[0]
    rows2 = blocks.reshape(blocks.shape[0], -1)
    assert e.gate.data == rows2[0::2].tobytes() and e.up.data == rows2[1::2].tobytes()
    assert np.array_equal(e.gate.scales.reshape(scales[0::2].shape), scales[0::2])
    bias = cr.bf16_to_f32(_file_tensor(fx, "model.layers.0.mlp.experts.gate_up_proj_bias")[0])
    assert np.array_equal(e.gate.bias, bias[0::2]) and np.array_equal(e.up.bias, bias[1::2])
    dbias = cr.bf16_to_f32(_file_tensor(fx, "model.layers.0.mlp.experts.down_proj_bias")[0])
    assert np.array_equal(e.down.bias, dbias)
    print(f"  {fx} --experts mxfp4 --matrix-order {order}: version {version}, blocks/scales/biases as published, "
          "probe decoded exactly")


def test_mxfp8_store_version_5():
    """Inkling 2's MXFP8 experts (format version 5, encoding 8): the lossless store's records
    hold the published e4m3 codes and e8m0 scales (gate = even rows of `w13_weight`, up = odd
    rows, down = `w2_weight`), and decode as OCP MX defines them: `e4m3 * 2^(e - 127)`, the e4m3
    value computed here from its sign, exponent and mantissa bits."""
    fx = "inkling2_mxfp8"
    path = convert(fx, "mxfp8", "bf16")
    st = cr.Store(path)
    st.verify_segment_bodies()
    assert st.manifest["format_version"] == 5
    codes = _file_tensor(fx, "model.llm.layers.2.mlp.experts.w13_weight")
    scales = _file_tensor(fx, "model.llm.layers.2.mlp.experts.w13_weight_scale")
    dcodes = _file_tensor(fx, "model.llm.layers.2.mlp.experts.w2_weight")
    dscales = _file_tensor(fx, "model.llm.layers.2.mlp.experts.w2_weight_scale")

    def mx(c, s):
        c = c.astype(np.int64)
        sign = np.where(c & 0x80, -1.0, 1.0)
        ex, man = (c >> 3) & 15, c & 7
        v = np.where(ex == 0, 2.0 ** -6 * man / 8, 2.0 ** (ex - 7) * (1 + man / 8)) * sign
        return v * 2.0 ** (np.repeat(s.astype(np.int64), 32, axis=-1)[..., : c.shape[-1]] - 127)

    for e in range(codes.shape[0]):
        r = st.read_expert(2, e)
        assert r.gate.encoding == cr.MXFP8 and r.gate.scales.dtype == np.uint8
        assert r.gate.data == codes[e][0::2].tobytes() and r.up.data == codes[e][1::2].tobytes()
        assert np.array_equal(r.gate.scales.reshape(scales[e][0::2].shape), scales[e][0::2])
        assert r.down.data == dcodes[e].tobytes()
        assert np.array_equal(r.gate.dequantize().astype(np.float64), mx(codes[e][0::2], scales[e][0::2]))
        assert np.array_equal(r.up.dequantize().astype(np.float64), mx(codes[e][1::2], scales[e][1::2]))
        assert np.array_equal(r.down.dequantize().astype(np.float64), mx(dcodes[e], dscales[e]))
    print(f"  {fx} --experts mxfp8: version 5, codes/scales as published, decoded as OCP MX defines them")


def _gguf_store(fixture: str, version: int):
    """A GGUF converted by coli-convert (encoding 7, format `version`): every expert's three
    matrices and every dense tensor hold the GGUF's blocks byte for byte, in the tensor's type
    (an expert's down matrix in another type than its gate and up), and decode as gguf-py
    decodes the GGUF tensor (read here with gguf-py's own GGUFReader)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    src = os.path.join(ROOT, "tests", "fixtures", "gguf", f"{fixture}.gguf")
    out = os.path.join(_TMP, f"gguf-{fixture}")
    subprocess.run([coli_convert(), src, out], check=True, capture_output=True)
    st = cr.Store(out)
    st.verify_segment_bodies()
    st.verify_files()
    assert st.manifest["format_version"] == version
    g = {t.name: t for t in GGUFReader(src).tensors}
    n = 0
    for layer, expert in st.experts():
        e = st.read_expert(layer, expert)
        for m, which in ((e.gate, "gate"), (e.up, "up"), (e.down, "down")):
            t = g[f"blk.{layer}.ffn_{which}_exps.weight"]
            assert m.encoding == cr.GGML and m.group_size == int(t.tensor_type), (layer, expert, which)
            blocks = np.asarray(t.data[expert])
            assert m.data == blocks.tobytes(), (layer, expert, which)
            want = dequantize(blocks, t.tensor_type).reshape(m.rows, m.cols)
            assert np.array_equal(m.dequantize(), want)
            n += 1
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight", "model.layers.1.self_attn.o_proj.weight": "blk.1.attn_output.weight",
             "model.layers.0.mlp.gate.weight": "blk.0.ffn_gate_inp.weight"}
    for name, gname in names.items():
        m = st.dense(name)
        t = g[gname]
        assert m.data == np.asarray(t.data).tobytes(), name
        assert np.array_equal(m.dequantize().reshape(-1), dequantize(np.asarray(t.data), t.tensor_type).reshape(-1)), name
    print(f"  {fixture}.gguf: version {version}, {n} expert matrices and {len(names)} dense tensors as gguf-py reads them")


def test_gguf_store_version_4():
    _gguf_store("qwen3_moe-q2_k", 4)


def test_gguf_iquant_store_version_6():
    """The i-quants (IQ1_S gate, IQ1_M up, MXFP4 down; IQ1_M, IQ2_* and IQ3_XXS dense) as
    FORMAT.md section 6 lists them: version 6."""
    _gguf_store("qwen3_moe-iq1", 6)


def _damaged_copy(src: str, name: str) -> str:
    dst = os.path.join(_TMP, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ 0x10]))


def test_damage_is_detected():
    src = convert("mixtral_fp8", "int4-g64", "bf16")
    # A byte inside layer 1 expert 3's record: its xxh3 (seeded with the key) fails.
    d = _damaged_copy(src, "damaged-record")
    st = cr.Store(d)
    r = st.record(1, 3)
    _flip(os.path.join(d, "segments", f"seg-{int(r['segment']):05d}.bin"), int(r["offset"]) + 10)
    st = cr.Store(d)
    st.read_expert(1, 2)  # a neighbour still reads
    try:
        st.read_expert(1, 3)
        raise AssertionError("damaged record was not detected")
    except cr.ChecksumError as e:
        assert "layer 1 expert 3" in str(e), e
    try:
        st.verify_segment_bodies()
        raise AssertionError("damaged segment body was not detected")
    except cr.ChecksumError:
        pass
    # MANIFEST body: crc32.
    d = _damaged_copy(src, "damaged-manifest")
    _flip(os.path.join(d, "MANIFEST"), 40)
    try:
        cr.Store(d)
        raise AssertionError("damaged MANIFEST was not detected")
    except cr.FormatError as e:
        assert "crc32" in str(e), e
    # An INDEX record: the whole-file xxh3 in MANIFEST, and the record's crc32.
    d = _damaged_copy(src, "damaged-index")
    _flip(os.path.join(d, "INDEX"), 64 + 64 * 2 + 20)
    try:
        cr.Store(d)
        raise AssertionError("damaged INDEX was not detected")
    except cr.ChecksumError:
        pass
    with open(os.path.join(d, "INDEX"), "rb") as f:
        try:
            cr.parse_index(f.read(), cr.parse_manifest(open(os.path.join(d, "MANIFEST"), "rb").read()))
            raise AssertionError("damaged INDEX record crc32 was not detected")
        except cr.FormatError as e:
            assert "record 2" in str(e), e
    # A dense tensor byte: its seeded xxh3.
    d = _damaged_copy(src, "damaged-dense")
    st = cr.Store(d)
    e = next(x for x in st.manifest["dense"] if x["name"] == "model.norm.weight")
    _flip(os.path.join(d, "dense.bin"), e["offset"] + 3)
    try:
        cr.Store(d).dense("model.norm.weight")
        raise AssertionError("damaged dense tensor was not detected")
    except cr.ChecksumError as err:
        assert "model.norm.weight" in str(err), err


def main() -> int:
    tests = [(k, v) for k, v in globals().items() if k.startswith("test_") and callable(v)]
    passed = failed = 0
    try:
        for name, fn in tests:
            print(f"{name} ...", flush=True)
            try:
                fn()
                passed += 1
                print(f"{name}: ok", flush=True)
            except Exception:
                failed += 1
                print(f"{name}: FAILED", flush=True)
                traceback.print_exc()
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
