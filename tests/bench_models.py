#!/usr/bin/env python3
"""The benchmark-model generators and their routing gate, at small dimensions (issue 17).

For each generator (engine/bench/make_olmoe_shape.py; engine/bench/make_glm5_shape.py when
present) at `--dims small`:
1. the same seed writes the same bytes (sha256 of every file), another seed other bytes;
2. the model converts with `coli-convert`, and `engine/bench/routing_stats.py` (1024 varied
   tokens through `coli run`, cross-checked against a numpy forward pass) accepts it;
3. a degenerate model (`--routing degenerate`: the scales of the old OLMoE generator) is
   refused with exit status 1 and the failing layers named.

Usage: bench_models.py [--bin DIR]   (DIR holds coli and coli-convert; default target/debug)
Needs numpy and xxhash (tests/python_reader/requirements.txt).
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "engine", "bench")


def digest(d: str) -> dict:
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p.returncode, p.stdout, p.stderr


def check_generator(script: str, extra: list, bindir: str, tmp: str) -> list[str]:
    errs = []
    name = os.path.basename(script)
    gen = [sys.executable, script]

    def make(out, *args):
        rc, _, err = run(gen + [out, "--dims", "small"] + extra + list(args))
        if rc != 0:
            raise SystemExit(f"{name} {' '.join(args)} failed:\n{err}")
        return out

    a = make(os.path.join(tmp, "a"), "--seed", "5")
    b = make(os.path.join(tmp, "b"), "--seed", "5")
    c = make(os.path.join(tmp, "c"), "--seed", "6")
    da, db, dc = digest(a), digest(b), digest(c)
    if da != db:
        errs.append(f"{name}: the same seed wrote different bytes: "
                    f"{[k for k in da if da[k] != db.get(k)]}")
    if not any(da[k] != dc.get(k) for k in da if k.endswith(".safetensors")):
        errs.append(f"{name}: seeds 5 and 6 wrote the same weights")

    def gate(ckpt):
        store = ckpt + "-store"
        rc, _, err = run([os.path.join(bindir, "coli-convert"), ckpt, store, "--experts", "int4-g64",
                          "--dense", "bf16"])
        if rc != 0:
            raise SystemExit(f"coli-convert {ckpt} failed:\n{err}")
        return run([sys.executable, os.path.join(BENCH, "routing_stats.py"), store, "--coli",
                    os.path.join(bindir, "coli")])

    rc, out, err = gate(a)
    print(out, end="")
    if rc != 0:
        errs.append(f"{name}: routing_stats refused the realistic model (exit {rc}):\n{err}")
    d = make(os.path.join(tmp, "d"), "--seed", "5", "--routing", "degenerate")
    rc, out, err = gate(d)
    print(out, end="")
    if rc != 1 or "refused" not in err or "layer " not in err:
        errs.append(f"{name}: routing_stats did not refuse the degenerate model (exit {rc}):\n{out}{err}")
    else:
        print(f"{name}: degenerate model refused as expected:\n{err}", end="")
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                                                  "debug"))
    a = ap.parse_args()
    gens = [(os.path.join(BENCH, "make_olmoe_shape.py"), ["--layers", "4"])]
    glm = os.path.join(BENCH, "make_glm5_shape.py")
    if os.path.exists(glm):
        gens.append((glm, []))
    errs = []
    for script, extra in gens:
        with tempfile.TemporaryDirectory() as tmp:
            errs += check_generator(script, extra, a.bin, tmp)
    for e in errs:
        print(f"FAIL {e}", file=sys.stderr)
    print("bench models: " + ("FAILED" if errs else f"{len(gens)} generators OK"))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
