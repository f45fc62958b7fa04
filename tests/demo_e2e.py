#!/usr/bin/env python3
"""End-to-end check of README command 1 on the real demo model (SmolLM2-135M-Instruct).

checkpoint (tools/demo/make_demo_checkpoint.py) -> coli-convert -> coli run / coli eval, asserted
against tests/fixtures/demo/expected.json, which transformers produced (make_demo_expected.py):

1. the builder is deterministic: every checkpoint file has the recorded sha256;
2. default store (int4 g64 experts, bf16 dense): the chat answer to "What is the capital of
   France?" names Paris and its token ids equal transformers' on the same dequantized weights,
   once with every expert cached and once with an expert budget far below the model's experts
   (then there must be evictions, disk reads and a hit rate below 1, and the same tokens);
3. lossless store (fp8 experts and dense): greedy token ids of the three fixed prompts equal
   transformers' greedy ids;
4. teacher-forced perplexity of the lossless store on the committed text matches transformers'.

Standard library only. Run from the repository root after `cargo build -p coli-convert -p coli-tools`.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = os.path.join(ROOT, "tests", "fixtures", "demo", "expected.json")
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
COLI = os.path.join(TARGET, "debug", "coli")
CONVERT = os.path.join(TARGET, "debug", "coli-convert")

failures = []
passed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passed if cond else failures).append(what)


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(p.stdout)
        print(p.stderr)
        raise SystemExit(f"command failed with exit code {p.returncode}: {' '.join(cmd)}")
    return p


def coli_json(args):
    p = run([COLI] + args + ["--json"])
    sys.stderr.write(p.stderr)
    return json.loads(p.stdout)


def strip_eos(ids, eos):
    ids = list(ids)
    while ids and ids[-1] in eos:
        ids.pop()
    return ids


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    exp = json.load(open(EXPECTED))
    eos = {exp["eos_token_id"]}
    work = tempfile.mkdtemp(prefix="coli-demo-e2e-", dir=os.environ.get("TMPDIR"))
    # The routing-usage history (pinned hot set) goes to the work dir, not the user's state dir.
    os.environ["COLI_STATE_DIR"] = os.path.join(work, "state")
    try:
        ckpt = os.path.join(work, "checkpoint")
        run([sys.executable, os.path.join(ROOT, "tools", "demo", "make_demo_checkpoint.py"), ckpt])
        for name, digest in exp["checkpoint_sha256"].items():
            check(sha256(os.path.join(ckpt, name)) == digest, f"checkpoint file {name} has the recorded sha256")

        int4 = os.path.join(work, "store-int4")
        fp8 = os.path.join(work, "store-fp8")
        run([CONVERT, ckpt, int4])
        run([CONVERT, ckpt, fp8, "--experts", "fp8", "--dense", "fp8"])

        # 2. The README path: chat answer from the default store, full budget and a small one.
        q = exp["int4_g64"]
        want = strip_eos(q["expected_new_ids"], eos)
        # The default numerics are q8a (integer activations, a rule transformers does not run:
        # tests/tests/engine_q8a.rs holds it to an emulation); transformers' own arithmetic is
        # `--numerics exact`, compared token for token here.
        full = coli_json(["run", "--store", int4, "--chat", "--prompt", q["prompt"], "--max-tokens", "24"])
        check(full["stats"]["numerics"]["mode"] == "q8a", f"coli run's default numerics: {full['stats']['numerics']}")
        check(full["prompt_ids"] == q["prompt_ids"], "default store: chat prompt ids equal transformers' rendering + tokenization")
        check("Paris" in full["text"], f"default store answer names Paris: {full['text']!r}")
        exact = coli_json(["run", "--store", int4, "--chat", "--prompt", q["prompt"], "--max-tokens", "24",
                           "--numerics", "exact"])
        check(strip_eos(exact["token_ids"], eos) == want,
              f"default store, --numerics exact: tokens equal transformers' {want}: {exact['token_ids']}")
        small = coli_json(["run", "--store", int4, "--chat", "--prompt", q["prompt"], "--max-tokens", "24", "--ram-budget", "2MiB"])
        st = small["stats"]
        check(small["token_ids"] == full["token_ids"], "2 MiB expert budget gives the same tokens as the full budget")
        check(st["evictions"] > 0 and st["expert_bytes_read"] > 0 and st["hit_rate"] < 1.0,
              f"2 MiB budget: evictions {st['evictions']}, bytes read {st['expert_bytes_read']}, hit rate {st['hit_rate']}")
        # The full-budget run wrote the usage history: the small run pins its hottest experts and
        # prefetches; the peak RSS check below runs with both on (the defaults).
        check(st["pinned_experts"] > 0 and st["pinned_hits"] > 0 and st["prefetch_reads"] > 0,
              f"2 MiB budget: pinned {st['pinned_experts']} experts ({st['pinned_hits']} hits), "
              f"{st['prefetch_reads']} prefetch reads, precision {st['prefetch_precision']:.2f} "
              f"recall {st['prefetch_recall']:.2f}")

        # The store with the GGUF's weight bytes (`--dense int8 --embeddings int8`: int8
        # attention and int8 tied lm_head, the decode benchmark's same-bytes store): perplexity
        # close to transformers' on the default store's weights (measured 0.1% away; int8
        # rounding of the dense part moves it by a few percent at most, a broken lm_head or
        # embedding by orders of magnitude). Its greedy answers may differ from the default
        # store's (the chat prompt answers "Bonjour, ..." instead of naming Paris), so they are
        # not compared.
        same = os.path.join(work, "store-int8-dense")
        run([CONVERT, ckpt, same, "--dense", "int8", "--embeddings", "int8"])
        ppl = exp["perplexity"]
        ev8 = coli_json(["eval", "--store", same, "--text", os.path.join(ROOT, "tests", "fixtures", "demo", ppl["file"]),
                         "--max-tokens", str(ppl["tokens"])])
        check(abs(ev8["ppl"] - ppl["int4_g64"]) / ppl["int4_g64"] < 0.03,
              f"--dense int8 --embeddings int8 perplexity {ev8['ppl']:.4f} within 3% of transformers' "
              f"{ppl['int4_g64']:.4f} on the default store's weights")
        # The default numerics' quality cost on the default store: perplexity within 1% of
        # transformers' on the same (int4-g64) weights (measured +0.67%, engine/bench/results/2026-12-07-q8a-r5-perplexity.txt).
        evq = coli_json(["eval", "--store", int4, "--text", os.path.join(ROOT, "tests", "fixtures", "demo", ppl["file"]),
                         "--max-tokens", str(ppl["tokens"])])
        check(abs(evq["ppl"] - ppl["int4_g64"]) / ppl["int4_g64"] < 0.01,
              f"default numerics (q8a) perplexity {evq['ppl']:.4f} within 1% of transformers' {ppl['int4_g64']:.4f}")
        p = subprocess.run([COLI, "run", "--store", int4, "--prompt-ids", "1", "--prefill-batch", "0"],
                           capture_output=True, text=True)
        check(p.returncode == 2 and "--prefill-batch" in p.stderr, f"--prefill-batch 0 is refused: {p.stderr.strip()!r}")
        for bad in ["2", "-1", "nan"]:
            p = subprocess.run([COLI, "run", "--store", int4, "--prompt-ids", "1", "--prefetch-min-use", bad],
                               capture_output=True, text=True)
            check(p.returncode == 2 and "between 0 and 1" in p.stderr,
                  f"--prefetch-min-use {bad} is refused: {p.stderr.strip()!r}")
        p = subprocess.run([COLI, "run", "--store", int4, "--prompt-ids", "1", "--max-tokens", "1", "--json"],
                           capture_output=True, text=True, env={**os.environ, "COLI_ISA": "bogus"})
        check(p.returncode == 0 and "warning: COLI_ISA=bogus" in p.stderr
              and json.loads(p.stdout)["stats"]["kernels"] in ("scalar", "avx2-fma", "avx512"),
              f"COLI_ISA=bogus: one warning, best instruction set used: {p.stderr.strip()!r}")

        # Memory: peak RSS stays below dense + KV cache + expert budget + 256 MiB (pinned set and
        # lookahead prefetch on).
        context = 512
        cfg = json.load(open(os.path.join(int4, "files", "config.json")))
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_bytes = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4 * context
        dense_bytes = os.path.getsize(os.path.join(int4, "dense.bin"))
        budget = 2 << 20
        probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")
        rss = int(run([sys.executable, "-c", probe, COLI, "run", "--store", int4, "--chat", "--prompt", q["prompt"],
                       "--max-tokens", "24", "--ram-budget", str(budget), "--context", str(context)]).stdout)
        bound = dense_bytes + kv_bytes + budget + (256 << 20)
        check(rss < bound, f"peak RSS {rss / 2**20:.1f} MiB < dense {dense_bytes / 2**20:.1f} + KV {kv_bytes / 2**20:.1f} "
              f"+ budget {budget / 2**20:.1f} + 256 MiB = {bound / 2**20:.1f} MiB")

        # Interactive chat: two turns on stdin; the second turn prefills only its new tokens.
        print(f"$ {COLI} chat --store {int4} --max-tokens 24  (two turns on stdin)", flush=True)
        p = subprocess.run([COLI, "chat", "--store", int4, "--max-tokens", "24"], capture_output=True, text=True,
                           input=q["prompt"] + "\nAnd what is the capital of Germany?\n")
        sys.stderr.write(p.stderr)
        turns = [int(line.split("[", 1)[1].split()[0]) for line in p.stderr.splitlines()
                 if "new prompt tokens" in line]
        check(p.returncode == 0 and "Paris" in p.stdout.splitlines()[0], f"chat turn 1 names Paris: {p.stdout!r}")
        check(len(turns) == 2 and turns[0] == len(q["prompt_ids"]) and turns[1] < turns[0],
              f"chat turn 2 reuses the KV cache: new prompt tokens per turn {turns}")
        check(f"> {q['prompt']}\n" in p.stderr and "> And what is the capital of Germany?\n" in p.stderr,
              "piped chat echoes each question after its prompt (stderr)")

        # A named session survives the process: the second run resumes the first turn's KV cache
        # from disk (prefilling only the new turn) and answers as the two-turn run above did.
        state = os.path.join(work, "state")
        env = dict(os.environ, COLI_STATE_DIR=state)
        outs = []
        for line in (q["prompt"], "And what is the capital of Germany?"):
            r = subprocess.run([COLI, "chat", "--store", int4, "--max-tokens", "24", "--session", "demo"],
                               capture_output=True, text=True, input=line + "\n", env=env)
            sys.stderr.write(r.stderr)
            outs.append(r)
        resumed = [line for line in outs[1].stderr.splitlines() if line.startswith("[resumed ")]
        new = [int(line.split("[", 1)[1].split()[0]) for line in outs[1].stderr.splitlines()
               if "new prompt tokens" in line]
        check(all(r.returncode == 0 for r in outs) and len(resumed) == 1 and new == [turns[1]],
              f"chat --session resumes its KV cache after a restart: {resumed}, new prompt tokens {new} "
              f"(one process: {turns[1]})")
        check(outs[0].stdout + outs[1].stdout == p.stdout,
              f"the resumed session answers as one process does: {[r.stdout for r in outs]!r} vs {p.stdout!r}")
        ls = json.loads(run([COLI, "kv", "ls", "--json"], env=env).stdout)
        check(len(ls["files"]) == 1 and ls["files"][0]["status"] == "ok" and ls["quarantined"] == 0,
              f"coli kv ls lists the session's file: {ls}")
        cleared = run([COLI, "kv", "clear"], env=env)
        check(not json.loads(run([COLI, "kv", "ls", "--json"], env=env).stdout)["files"],
              f"coli kv clear removes it: {cleared.stdout}")

        # 3. Lossless store vs transformers' greedy ids for three prompts (transformers' arithmetic).
        for p in exp["lossless"]["prompts"]:
            n = len(p["expected_new_ids"])
            out = coli_json(["run", "--store", fp8, "--prompt-ids", ",".join(map(str, p["prompt_ids"])),
                             "--max-tokens", str(exp["decoding"]["max_new_tokens"]), "--numerics", "exact"])
            got = strip_eos(out["token_ids"], eos)
            check(got == strip_eos(p["expected_new_ids"], eos),
                  f"lossless greedy ids for {p['prompt']!r}: {got} vs {p['expected_new_ids'][:n]}")

        # 4. Perplexity of the lossless store on the committed public-domain text.
        ppl = exp["perplexity"]
        ev = coli_json(["eval", "--store", fp8, "--text", os.path.join(ROOT, "tests", "fixtures", "demo", ppl["file"]),
                        "--max-tokens", str(ppl["tokens"]), "--numerics", "exact"])
        check(abs(ev["ppl"] - ppl["lossless"]) / ppl["lossless"] < 1e-3,
              f"lossless perplexity {ev['ppl']:.4f} vs transformers {ppl['lossless']:.4f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"demo: {len(passed)} passed, {len(failures)} failed")
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
