"""A reader of the coli block store written from docs/FORMAT.md alone.

It shares no code with the Rust implementation: it exists to show that the format document is
complete (a second implementation can read a store from it) and to cross-check the writer.
Dependencies: the Python standard library, numpy, and the ``xxhash`` package (XXH3-64).

    store = Store("/path/to/model.coli")          # checks MANIFEST, INDEX, segment headers
    store.manifest["family"]                      # MANIFEST JSON body (a dict)
    expert = store.read_expert(layer=0, expert=3) # one positional read, xxh3 verified
    w = expert.gate.dequantize()                  # numpy float32 [I, H]
    norm = store.dense("model.norm.weight").dequantize()

Errors are ``FormatError`` (structure, naming the file and field) and ``ChecksumError``
(naming what failed, the file and the offset).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import xxhash

FORMAT_VERSION = 7  # newest version read (section 12); versions 1 to 6 too
MANIFEST_MAGIC = b"COLIMAN\0"
INDEX_MAGIC = b"COLIIDX\0"
SEGMENT_MAGIC = b"COLISEG\0"

# Encoding ids (FORMAT.md section 6).
F32, BF16, FP8, INT8, INT4, MXFP4, GGML, MXFP8 = 1, 2, 3, 4, 5, 6, 7, 8
ENCODING_NAMES = {F32: "f32", BF16: "bf16", FP8: "fp8", INT8: "int8", INT4: "int4", MXFP4: "mxfp4", GGML: "ggml",
                  MXFP8: "mxfp8"}
# Encoding 7 (version 4; the i-quants and MXFP4 version 6): ggml type id -> (weights per block,
# bytes per block), section 6's table.
GGML_TYPES = {1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
              11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18), 23: (256, 136),
              16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 21: (256, 110), 22: (256, 82),
              29: (256, 56), 39: (32, 17)}
# INDEX flags bits 8..24 (version 4, encoding 7): the up and down matrices' ggml type ids.
RECORD_FLAG_GGML_TYPES = 0x00FFFF00
MXFP4_BLOCK = 32
# e2m1 magnitudes by code & 7; bit 3 is the sign (section 6, OCP MX v1.0 5.3.3).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
RECORD_FLAG_BIASES = 1
# INDEX flag bit 1 (version 7): the record's int4 / int8 / mxfp4 matrices with cols % 64 == 0 and
# at least 16 rows are stored in the interleaved row order (section 5).
RECORD_FLAG_INTERLEAVED = 2
INTERLEAVE_ROWS = 16
INTERLEAVE_COLS = 64
FP8_BLOCK = 128
SECTION_ALIGN = 64

# INDEX record (section 3), 64 bytes, little-endian.
INDEX_DTYPE = np.dtype(
    [
        ("layer", "<u4"),
        ("expert", "<u4"),
        ("segment", "<u4"),
        ("encoding", "<u2"),
        ("group_size", "<u2"),
        ("offset", "<u8"),
        ("length", "<u8"),
        ("payload_len", "<u8"),
        ("hidden", "<u4"),
        ("intermediate", "<u4"),
        ("checksum", "<u8"),
        ("flags", "<u4"),
        ("crc", "<u4"),
    ]
)
assert INDEX_DTYPE.itemsize == 64


class FormatError(Exception):
    """The store is damaged or not a store; the message names the file and field."""


class ChecksumError(Exception):
    """A record, tensor or file failed its checksum."""


def crc32(b: bytes) -> int:
    """IEEE CRC-32 (zlib polynomial)."""
    return zlib.crc32(b) & 0xFFFFFFFF


def xxh3(b: bytes, seed: int = 0) -> int:
    """XXH3-64 with a 64-bit seed."""
    return xxhash.xxh3_64_intdigest(b, seed=seed)


def _align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _e4m3_table() -> np.ndarray:
    """f32 value of every float8 e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2^-6); 0x7F/0xFF are NaN; no infinities."""
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            v = float("nan")
        elif e == 0:
            v = sign * (m / 8.0) * 2.0**-6
        else:
            v = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = v
    return t


E4M3 = _e4m3_table()


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def weight_bytes(enc: int, rows: int, cols: int, group: int = 0) -> int:
    """Bytes of the weight section of a [rows, cols] matrix (section 6); `group` is the group
    size field (a ggml matrix's type id)."""
    if enc == GGML:
        if group not in GGML_TYPES:
            raise FormatError(f"unknown ggml type {group}")
        b, t = GGML_TYPES[group]
        if cols % b:
            raise FormatError(f"ggml type {group}: {cols} columns are not whole blocks of {b}")
        return rows * cols // b * t
    if enc == F32:
        return rows * cols * 4
    if enc == BF16:
        return rows * cols * 2
    if enc in (FP8, INT8, MXFP8):
        return rows * cols
    if enc in (INT4, MXFP4):
        return rows * ((cols + 1) // 2)
    raise FormatError(f"unknown encoding id {enc}")


def scale_bytes_per(enc: int) -> int:
    """Bytes of one scale: f32, or one e8m0 byte for mxfp4 and mxfp8 (section 6)."""
    return 1 if enc in (MXFP4, MXFP8) else 4


def scale_count(enc: int, group: int, rows: int, cols: int) -> int:
    """Number of scales of a [rows, cols] matrix (section 6): f32 values, e8m0 bytes for mxfp4."""
    if enc in (F32, BF16, GGML):
        return 0
    if enc == FP8:
        return -(-rows // FP8_BLOCK) * -(-cols // FP8_BLOCK)
    if enc == INT8:
        return rows
    if enc == INT4:
        if group < 2 or group % 2:
            raise FormatError(f"int4 group size {group} is invalid")
        return rows * -(-cols // group)
    if enc in (MXFP4, MXFP8):
        if group != MXFP4_BLOCK:
            raise FormatError(f"{ENCODING_NAMES[enc]} group size {group} is not 32")
        return rows * -(-cols // MXFP4_BLOCK)
    raise FormatError(f"unknown encoding id {enc}")


@dataclass
class Matrix:
    """One encoded matrix: `data` is the weight section, `scales` the f32 scales."""

    encoding: int
    group_size: int
    rows: int
    cols: int
    data: bytes
    scales: np.ndarray  # float32 (uint8 e8m0 for mxfp4), possibly empty
    bias: np.ndarray | None = None  # float32 [rows] when the record has biases (version 2)

    def raw(self) -> np.ndarray:
        """The weight section as an array: f32 [r, c], u16 [r, c] (bf16), u8 [r, c] (fp8),
        i8 [r, c] (int8), u8 [r, ceil(c/2)] (int4)."""
        r, c = self.rows, self.cols
        if self.encoding == F32:
            return np.frombuffer(self.data, dtype="<f4").reshape(r, c)
        if self.encoding == BF16:
            return np.frombuffer(self.data, dtype="<u2").reshape(r, c)
        if self.encoding in (FP8, MXFP8):
            return np.frombuffer(self.data, dtype=np.uint8).reshape(r, c)
        if self.encoding == INT8:
            return np.frombuffer(self.data, dtype=np.int8).reshape(r, c)
        return np.frombuffer(self.data, dtype=np.uint8).reshape(r, (c + 1) // 2)

    def int4_q(self) -> np.ndarray:
        """int4 only: q in -8..7 as int8 [rows, cols] (low nibble = even column, q = n - 8)."""
        b = self.raw()
        q = np.empty((self.rows, b.shape[1] * 2), dtype=np.int8)
        q[:, 0::2] = (b & 0x0F).astype(np.int8) - 8
        q[:, 1::2] = (b >> 4).astype(np.int8) - 8
        return q[:, : self.cols]

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols] per FORMAT.md section 6 (all arithmetic in f32)."""
        r, c = self.rows, self.cols
        if self.encoding == F32:
            return self.raw().astype(np.float32)
        if self.encoding == BF16:
            return bf16_to_f32(self.raw())
        if self.encoding == FP8:
            bc = -(-c // FP8_BLOCK)
            s = self.scales.reshape(-1, bc)
            s_full = np.repeat(np.repeat(s, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:r, :c]
            return E4M3[self.raw()] * s_full
        if self.encoding == INT8:
            return self.raw().astype(np.float32) * self.scales[:, None]
        if self.encoding == GGML:
            # gguf-py's numpy dequantization (gguf 0.19, tests/python_reader/requirements.txt).
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize

            rows = np.frombuffer(self.data, dtype=np.uint8).reshape(r, -1)
            return dequantize(rows, GGMLQuantizationType(self.group_size)).astype(np.float32).reshape(r, c)
        if self.encoding == MXFP8:
            e = self.scales.reshape(r, -(-c // MXFP4_BLOCK)).astype(np.int32)
            if np.any(e == 255):
                raise FormatError("mxfp8 scale 255 (NaN) in a store")
            s = np.ldexp(np.float32(1.0), e - 127).astype(np.float32)
            s_full = np.repeat(s, MXFP4_BLOCK, axis=1)[:, :c]
            with np.errstate(over="ignore"):
                return (E4M3[self.raw()] * s_full).astype(np.float32)
        if self.encoding == MXFP4:
            b = self.raw()
            codes = np.empty((r, b.shape[1] * 2), dtype=np.uint8)
            codes[:, 0::2] = b & 0x0F
            codes[:, 1::2] = b >> 4
            codes = codes[:, :c]
            v = E2M1[codes & 7]
            v = np.where(codes & 8, -v, v).astype(np.float32)
            e = self.scales.reshape(r, -(-c // MXFP4_BLOCK)).astype(np.int32)
            if np.any(e == 255):
                raise FormatError("mxfp4 scale 255 (NaN) in a store")
            # 2^(e - 127) exactly in float32 (np.ldexp keeps subnormals: e = 0 gives 2^-127).
            s = np.ldexp(np.float32(1.0), e - 127).astype(np.float32)
            s_full = np.repeat(s, MXFP4_BLOCK, axis=1)[:, :c]
            with np.errstate(over="ignore"):
                return (v * s_full).astype(np.float32)
        g = self.group_size
        s = self.scales.reshape(r, -(-c // g))
        s_full = np.repeat(s, g, axis=1)[:, :c]
        return self.int4_q().astype(np.float32) * s_full


@dataclass
class Expert:
    """One expert record: gate [I, H], up [I, H], down [H, I]."""

    layer: int
    expert: int
    hidden: int
    intermediate: int
    record: bytes
    gate: Matrix
    up: Matrix
    down: Matrix


def can_interleave(enc: int, rows: int, cols: int) -> bool:
    """Section 5: the matrices a version-7 record with flag bit 1 stores interleaved."""
    return enc in (INT4, INT8, MXFP4) and cols > 0 and cols % INTERLEAVE_COLS == 0 and rows >= INTERLEAVE_ROWS


def _ungroup(a: np.ndarray, rows: int) -> np.ndarray:
    """Section 5's order back to row-major for one section viewed as [rows, n] items (4-byte
    words, f32 scales or e8m0 bytes): each whole group of 16 rows is stored item-major
    ([n, 16]); the rows after the last whole group are row-major already."""
    out = a.copy()
    whole = rows // INTERLEAVE_ROWS * INTERLEAVE_ROWS
    n = a.shape[1]
    g = a[:whole].reshape(rows // INTERLEAVE_ROWS, n, INTERLEAVE_ROWS)
    out[:whole] = g.transpose(0, 2, 1).reshape(whole, n)
    return out


def row_major(enc: int, rows: int, cols: int, data: bytes, scales: np.ndarray) -> tuple[bytes, np.ndarray]:
    """An interleaved matrix's weight section and scales in the row-major order (section 5)."""
    words = np.frombuffer(data, dtype="<u4").reshape(rows, -1)
    data = _ungroup(words, rows).tobytes()
    per_row = scales.size // rows
    scales = _ungroup(scales.reshape(rows, per_row), rows).reshape(-1)
    return data, scales


def parse_manifest(b: bytes) -> dict:
    """MANIFEST (section 2): 24-byte header (magic, version, crc32 of body, body length)."""
    if len(b) < 24:
        raise FormatError(f"MANIFEST: {len(b)} bytes, shorter than the 24-byte header")
    if b[:8] != MANIFEST_MAGIC:
        raise FormatError(f"MANIFEST: magic {b[:8]!r}, expected {MANIFEST_MAGIC!r}")
    version, crc, length = struct.unpack_from("<IIQ", b, 8)
    if version > FORMAT_VERSION:
        raise FormatError(f"MANIFEST: format version {version} is newer than {FORMAT_VERSION}")
    body = b[24:]
    if length != len(body):
        raise FormatError(f"MANIFEST: body length {length}, file holds {len(body)}")
    if crc32(body) != crc:
        raise FormatError(f"MANIFEST: body crc32 {crc32(body):08x}, header says {crc:08x}")
    m = json.loads(body.decode("utf-8"))
    if m["format_version"] != version:
        raise FormatError("MANIFEST: body format_version differs from the header")
    for d in m["dense"]:
        if d["encoding"] == 5 and version < 3:  # int4 dense tensors: version 3 (sections 7, 12)
            raise FormatError(f"MANIFEST: dense tensor {d['name']} is int4, which version {version} does not allow")
    return m


def parse_index(b: bytes, manifest: dict) -> np.ndarray:
    """INDEX (section 3): 64-byte header, then sorted 64-byte records, each crc32-checked."""
    if len(b) < 64 or b[:8] != INDEX_MAGIC:
        raise FormatError("INDEX: bad magic or shorter than its header")
    version, rec_size, count = struct.unpack_from("<IIQ", b, 8)
    (hcrc,) = struct.unpack_from("<I", b, 60)
    if version > FORMAT_VERSION:
        raise FormatError(f"INDEX: format version {version} is newer than {FORMAT_VERSION}")
    if crc32(b[:60]) != hcrc:
        raise FormatError("INDEX: header crc32 mismatch")
    if version != manifest["format_version"] or rec_size != 64:
        raise FormatError(f"INDEX: version {version} / record size {rec_size}")
    if b[24:60] != bytes(36):
        raise FormatError("INDEX: header bytes 24..60 are not zero")
    if len(b) != 64 + 64 * count:
        raise FormatError(f"INDEX: {count} records need {64 + 64 * count} bytes, file has {len(b)}")
    recs = np.frombuffer(b, dtype=INDEX_DTYPE, offset=64, count=count)
    for i in range(count):
        raw = b[64 + 64 * i : 64 + 64 * i + 60]
        if crc32(raw) != int(recs["crc"][i]):
            raise FormatError(f"INDEX: record {i} crc32 mismatch")
    keys = recs["layer"].astype(np.uint64) << np.uint64(32) | recs["expert"].astype(np.uint64)
    if count > 1 and not np.all(keys[1:] > keys[:-1]):
        raise FormatError("INDEX: records not sorted by (layer, expert) or duplicated")
    if np.any(recs["flags"] & ~np.uint32(RECORD_FLAG_BIASES | RECORD_FLAG_INTERLEAVED | RECORD_FLAG_GGML_TYPES)):
        raise FormatError("INDEX: unknown record flags")
    if version < 7 and np.any(recs["flags"] & np.uint32(RECORD_FLAG_INTERLEAVED)):
        raise FormatError("INDEX: the interleaved flag in a store older than version 7")
    if np.any((recs["flags"] & np.uint32(RECORD_FLAG_GGML_TYPES)) & (recs["encoding"] != GGML)):
        raise FormatError("INDEX: ggml type bits on a record of another encoding")
    if version < 4 and np.any(recs["encoding"] == GGML):
        raise FormatError("INDEX: ggml records in a store older than version 4")
    if version < 5 and np.any(recs["encoding"] == MXFP8):
        raise FormatError("INDEX: mxfp8 records in a store older than version 5")
    if version < 2 and (np.any(recs["flags"]) or np.any(recs["encoding"] == MXFP4)):
        raise FormatError("INDEX: a version 1 store with record flags or mxfp4 records")
    align = manifest["alignment"]
    if np.any(recs["offset"] % align) or np.any(recs["length"] % align):
        raise FormatError(f"INDEX: offsets/lengths not multiples of {align}")
    return recs


def compute_store_id(manifest: dict) -> str:
    """XXH3-128 (seed 0) of the canonical JSON of {converter, parameters, sources}, as 32
    lowercase hex digits, most significant first (section 2)."""
    v = {k: manifest[k] for k in ("converter", "parameters", "sources")}
    canon = json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return f"{xxhash.xxh3_128_intdigest(canon):032x}"


def record_layout(enc: int, group, hidden: int, inter: int, biases: bool = False) -> tuple[list, int]:
    """Sections of an expert record (section 5): for gate [I, H], up [I, H], down [H, I]:
    (rows, cols, weight offset, weight bytes, scale offset, scale count, bias offset); and the
    payload length. Each section starts at a multiple of 64 bytes; scale sections are absent for
    f32/bf16/ggml; a bias section (f32 [rows]) follows each matrix when `biases` (version 2).
    `group` is the group size field, or a list of three (a ggml record's per-matrix types)."""
    groups = list(group) if isinstance(group, (list, tuple)) else [group] * 3
    off, out, end = 0, [], 0
    for (rows, cols), group in zip(((inter, hidden), (inter, hidden), (hidden, inter)), groups):
        wb = weight_bytes(enc, rows, cols, group)
        w_off = off
        end = w_off + wb
        off = _align_up(end, SECTION_ALIGN)
        sc = scale_count(enc, group, rows, cols)
        s_off = 0
        if sc:
            s_off = off
            end = s_off + scale_bytes_per(enc) * sc
            off = _align_up(end, SECTION_ALIGN)
        b_off = None
        if biases:
            b_off = off
            end = b_off + 4 * rows
            off = _align_up(end, SECTION_ALIGN)
        out.append((rows, cols, w_off, wb, s_off, sc, b_off))
    return out, end


class Store:
    """An open store directory. `verify` checks record and tensor xxh3 on every read."""

    def __init__(self, path: str, verify: bool = True):
        self.path = path
        self.verify = verify
        with open(os.path.join(path, "MANIFEST"), "rb") as f:
            self.manifest = parse_manifest(f.read())
        m = self.manifest
        with open(os.path.join(path, "INDEX"), "rb") as f:
            ib = f.read()
        if len(ib) != m["index_file"]["length"] or f"{xxh3(ib):016x}" != m["index_file"]["xxh3"]:
            raise ChecksumError("INDEX (whole file): length or xxh3 differs from MANIFEST index_file")
        self.index = parse_index(ib, m)
        self._pos = {
            (int(r["layer"]), int(r["expert"])): i for i, r in enumerate(self.index)
        }
        # Completeness: every (layer, e < num_experts) of expert_layers.
        for el in m["expert_layers"]:
            for e in range(el["num_experts"]):
                if (el["layer"], e) not in self._pos:
                    raise FormatError(f"incomplete store: layer {el['layer']} expert {e} missing")
        if len(self._pos) != sum(el["num_experts"] for el in m["expert_layers"]):
            raise FormatError("INDEX holds experts not listed in MANIFEST expert_layers")
        self.store_id = bytes.fromhex(m["store_id"])
        if len(self.store_id) != 16 or self.store_id.hex() != m["store_id"]:
            raise FormatError(f"MANIFEST: store_id {m['store_id']!r} is not 32 lowercase hex digits")
        if compute_store_id(m) != m["store_id"]:
            raise FormatError("MANIFEST: store_id is not the XXH3-128 of converter, parameters, sources")
        self._segments = []
        for sid in range(m["segment_count"]):
            p = os.path.join(path, "segments", f"seg-{sid:05d}.bin")
            self._segments.append(p)
            self._check_segment_header(p, sid)

    def _check_segment_header(self, p: str, sid: int) -> None:
        """Segment header (section 4): the first `alignment` bytes, fields in bytes 0..64."""
        align = self.manifest["alignment"]
        with open(p, "rb") as f:
            h = f.read(align)
        size = os.path.getsize(p)
        if len(h) != align or h[:8] != SEGMENT_MAGIC:
            raise FormatError(f"{p}: bad segment magic or short header")
        if crc32(h[:60]) != struct.unpack_from("<I", h, 60)[0]:
            raise FormatError(f"{p}: segment header crc32 mismatch")
        version, seg = struct.unpack_from("<II", h, 8)
        (file_len,) = struct.unpack_from("<Q", h, 32)
        if version != self.manifest["format_version"] or seg != sid or h[16:32] != self.store_id or file_len != size:
            raise FormatError(f"{p}: segment header fields (version/id/store id/length) disagree")
        if h[48:60] != bytes(12) or h[64:] != bytes(align - 64):
            raise FormatError(f"{p}: segment header reserved bytes are not zero")

    def verify_segment_bodies(self) -> None:
        """Checks each segment's xxh3 (seed = segment id) of all bytes after its header."""
        align = self.manifest["alignment"]
        for sid, p in enumerate(self._segments):
            with open(p, "rb") as f:
                h = f.read(align)
                body = f.read()
            (want,) = struct.unpack_from("<Q", h, 40)
            if xxh3(body, sid) != want:
                raise ChecksumError(f"{p}: xxh3 of the record bytes differs from its header")

    def experts(self) -> list[tuple[int, int]]:
        """Every (layer, expert) in INDEX order."""
        return list(self._pos)

    def record(self, layer: int, expert: int) -> np.void:
        """The INDEX record of one expert (KeyError when absent)."""
        return self.index[self._pos[(layer, expert)]]

    def read_expert(self, layer: int, expert: int) -> Expert:
        """Reads one expert record at its offset/length and verifies its xxh3, seeded with
        (layer << 32) | expert."""
        r = self.record(layer, expert)
        seg = self._segments[int(r["segment"])]
        off, length = int(r["offset"]), int(r["length"])
        with open(seg, "rb") as f:
            f.seek(off)
            rec = f.read(length)
        if len(rec) != length:
            raise FormatError(f"{seg}: record of layer {layer} expert {expert} truncated")
        if self.verify:
            seed = (layer << 32) | expert
            found = xxh3(rec, seed)
            if found != int(r["checksum"]):
                raise ChecksumError(
                    f"layer {layer} expert {expert} ({seg} at offset {off}): "
                    f"expected {int(r['checksum']):016x}, found {found:016x}"
                )
        enc, group = int(r["encoding"]), int(r["group_size"])
        hidden, inter = int(r["hidden"]), int(r["intermediate"])
        biases = bool(int(r["flags"]) & RECORD_FLAG_BIASES)
        groups = [group] * 3
        if enc == GGML:
            flags = int(r["flags"])
            groups = [group, (flags >> 8) & 0xFF, (flags >> 16) & 0xFF]
        sections, payload = record_layout(enc, groups, hidden, inter, biases)
        if payload != int(r["payload_len"]) or _align_up(payload, self.manifest["alignment"]) != length:
            raise FormatError(f"layer {layer} expert {expert}: payload/length disagree with the layout")
        interleaved = bool(int(r["flags"]) & RECORD_FLAG_INTERLEAVED)
        mats = []
        for (rows, cols, w_off, wb, s_off, sc, b_off), g in zip(sections, groups):
            sdt = np.uint8 if enc in (MXFP4, MXFP8) else "<f4"
            scales = np.frombuffer(rec, dtype=sdt, count=sc, offset=s_off) if sc else np.zeros(0, np.float32)
            bias = None if b_off is None else np.frombuffer(rec, dtype="<f4", count=rows, offset=b_off)
            data = rec[w_off : w_off + wb]
            if interleaved and can_interleave(enc, rows, cols):
                data, scales = row_major(enc, rows, cols, data, scales)
            mats.append(Matrix(enc, g, rows, cols, data, scales, bias))
        return Expert(layer, expert, hidden, inter, rec, *mats)

    def dense_names(self) -> list[str]:
        return [d["name"] for d in self.manifest["dense"]]

    def dense(self, name: str) -> Matrix:
        """A dense tensor (section 7) as a matrix ([n] vectors as [1, n]); its xxh3 (weight then
        scale section, seed = xxh3 of the name) is verified."""
        e = next((d for d in self.manifest["dense"] if d["name"] == name), None)
        if e is None:
            raise KeyError(f"no dense tensor {name}")
        shape = e["shape"]
        rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
        enc, group = e["encoding"], e["group_size"]
        if e["length"] != weight_bytes(enc, rows, cols, group):
            raise FormatError(f"dense tensor {name}: length {e['length']} does not match its shape")
        if e["scales_length"] != 4 * scale_count(enc, group, rows, cols):
            raise FormatError(f"dense tensor {name}: scales_length does not match its shape")
        with open(os.path.join(self.path, "dense.bin"), "rb") as f:
            f.seek(e["offset"])
            data = f.read(e["length"])
            sb = b""
            if e["scales_length"]:
                f.seek(e["scales_offset"])
                sb = f.read(e["scales_length"])
        if self.verify:
            h = xxhash.xxh3_64(seed=xxh3(name.encode("utf-8"), 0))
            h.update(data)
            h.update(sb)
            if f"{h.intdigest():016x}" != e["xxh3"]:
                raise ChecksumError(f"dense tensor {name} (dense.bin at offset {e['offset']})")
        scales = np.frombuffer(sb, dtype="<f4") if sb else np.zeros(0, np.float32)
        if e.get("interleaved", False):
            # Version 7 (section 7): an interleavable matrix stored in section 5's order.
            if self.manifest["format_version"] < 7 or not can_interleave(enc, rows, cols):
                raise FormatError(f"dense tensor {name}: interleaved, which it cannot be here")
            data, scales = row_major(enc, rows, cols, data, scales)
        return Matrix(enc, group, rows, cols, data, scales)

    def verify_files(self) -> None:
        """dense.bin (whole file) and the copied files against their MANIFEST xxh3."""
        with open(os.path.join(self.path, "dense.bin"), "rb") as f:
            d = f.read()
        df = self.manifest["dense_file"]
        if len(d) != df["length"] or f"{xxh3(d):016x}" != df["xxh3"]:
            raise ChecksumError("dense.bin (whole file)")
        for fe in self.manifest["files"]:
            with open(os.path.join(self.path, "files", fe["name"]), "rb") as f:
                b = f.read()
            if len(b) != fe["size"] or f"{xxh3(b):016x}" != fe["xxh3"]:
                raise ChecksumError(f"files/{fe['name']}")
