#!/usr/bin/env python3
"""Issue 19 speculative-decoding benchmark: prompt lookup (`--speculate ngram`) and `auto` vs
`off` on one store, resident and streaming, in the same run.

    speculative_bench.py [--coli target/release/coli] [--store demo/store] [--rounds 3]
        [--max-tokens 160] [--modes off,ngram,auto] [--draft-tokens 2,3,4,6,8] [--ungated]
        [--auto-draft-tokens K] [--placements resident,streaming]
        [--tasks rewrite,summarise,edit,open] [--threads N] [--stream-budget 8MiB]
        [--out-dir engine/bench/results] [--label NAME] [--no-drop-caches] [--dry-run]
        [-- EXTRA COLI RUN ARGS...]

Every run is a fresh `coli run --store S --chat --prompt TEXT --max-tokens N --json
--speculate MODE [--draft-tokens K] [--threads T] PLACEMENT ARGS`, greedy (temperature 0, the
default), so every mode must give the same token ids.

Tasks (TASKS below): three input-grounded ones, where the answer copies spans of the prompt and
prompt lookup should find drafts (`rewrite` a given ~150-word paragraph in plain words keeping
its facts, `summarise` the same paragraph, `edit` a given 23-line Python function: rename a
variable, add a docstring, return the whole function) and one open question with no source text
(`open`), where drafts should mostly fail and `auto` should pause drafting.

Variants (the runs of a round): each mode of --modes (`off` always); `ngram` once per K of
--draft-tokens when given (a sweep to choose the default K; without it, the binary's default K
and no --draft-tokens option), and with --ungated each of those again with --no-draft-gate
(`ngram-k4-nogate`: drafts on every pass that has one, to see what the gate costs or saves);
`auto` (and `mtp`) get --draft-tokens only with --auto-draft-tokens K; `off` never. Every run
passes --speculate explicitly (whatever the binary's default is).

Placements: `resident` (default budget: every expert fits) and `streaming` (`--ram-budget
8MiB --direct on`: the demo store's 120 expert records of 368 KiB do not fit, so every forward
pass reads most of them from disk with O_DIRECT; `coli plan --ram-budget 8MiB` says 11 pinned +
11 cached of 120). Before every streaming run the page cache is dropped (`sync; echo 3 >
/proc/sys/vm/drop_caches`) when the script runs as root, else it says so (expert reads are
O_DIRECT either way: the page cache only holds dense.bin and the binary, so decode figures do not
depend on it). The routing-usage history is learned once per placement (one unmeasured
`--speculate off` run of another prompt) and a fresh copy of it is given to every run
(`--usage`), so every run pins the same experts and no run's history changes the next.

Order: for each placement, R rounds; in each round, for each task, every variant once, in the
given order on even rounds and reversed on odd rounds (A B C, C B A, ...), so a slow drift of the
machine hits every mode alike. Figures per (placement, task, variant): the median over rounds of
decode tok/s (`stats.decode_tok_s`); the ratio to `off` = median over rounds of (tok/s / the `off`
tok/s of the same task in the same round); acceptance (drafts_accepted / drafts_proposed), tokens
after the first per decode pass (`stats.speculation.tokens_per_forward`), verify passes, gate-paused passes and
expert bytes read per generated token (`stats.expert_bytes_per_generated_token`, else
expert_bytes_read / generated_tokens; prefill's reads included). Targets (issue 19): ngram and
auto >= 1.5x `off` on every input-grounded task; auto >= 0.97x `off` on the open question.

Correctness: per task, the token ids of every run (every mode, K, round and placement) must equal
those of the first `off` run; a mismatch is printed loudly with the first differing position and
makes the exit status 1 (after the tables and the results files are written).

Output: the table on stdout, and per placement `OUT_DIR/<UTC date>-speculative-<placement>.json`
(`<date>-speculative-<label>-<placement>.json` with --label): the configuration, host, git
revision, prompts, every run (command, wall and CPU seconds, load average, coli's whole --json
object), the summary rows and the target checks; rewritten after every run, so an interrupted
benchmark keeps what it measured. Standard library only.
"""

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from olmoe_bench import drop_caches  # noqa: E402  (sync; echo 3 > /proc/sys/vm/drop_caches)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PARAGRAPH = (
    "Honeybees tell their nestmates where to find food with a movement called the waggle dance. "
    "A forager that has found a rich patch of flowers returns to the hive and walks a "
    "figure-of-eight pattern on the vertical surface of the comb. In the straight middle part of "
    "the figure, she shakes her body from side to side. The angle of this waggle run, measured "
    "from straight up, matches the angle between the sun and the food source, and the length of "
    "the run tells the distance: roughly one second of waggling for every kilometre, although the "
    "scale differs between colonies. Other bees follow the dancer closely, sense the vibrations "
    "and smell the nectar she carries. The Austrian scientist Karl von Frisch worked out the "
    "meaning of the dance in the 1940s, and in 1973 he shared the Nobel Prize in Physiology or "
    "Medicine for this work."
)

FUNCTION = '''def summarize_orders(orders, min_total=0.0):
    d = {}
    for order in orders:
        customer = order["customer"]
        amount = 0.0
        for item in order["items"]:
            price = item["price"]
            quantity = item.get("quantity", 1)
            if item.get("discount"):
                price = price * (1 - item["discount"])
            amount += price * quantity
        if customer not in d:
            d[customer] = {"orders": 0, "amount": 0.0}
        d[customer]["orders"] += 1
        d[customer]["amount"] += amount
    result = []
    for customer, info in d.items():
        if info["amount"] < min_total:
            continue
        average = info["amount"] / info["orders"]
        result.append((customer, info["orders"], round(info["amount"], 2), round(average, 2)))
    result.sort(key=lambda row: row[2], reverse=True)
    return result'''

# name: (input-grounded, prompt)
TASKS = {
    "rewrite": (True, "Rewrite the following paragraph in plain, simple words. Keep every fact, "
                      "name and number.\n\n" + PARAGRAPH),
    "summarise": (True, "Summarise the following paragraph in a few sentences, keeping the key "
                        "facts.\n\n" + PARAGRAPH),
    "edit": (True, "Edit this Python function: rename the variable `d` to `totals`, and add a "
                   "docstring that says what the function returns. Reply with the whole edited "
                   "function in one code block.\n\n```python\n" + FUNCTION + "\n```"),
    "open": (False, "Explain in detail why the ocean has tides. Give three reasons and describe "
                    "each one."),
}

# Learns the usage history (unmeasured); not one of the tasks.
LEARN_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

PLACEMENTS = ("resident", "streaming")
MODES = ("off", "ngram", "mtp", "auto")
TARGET_GROUNDED = 1.5   # ngram / auto tok/s vs off, every input-grounded task
TARGET_OPEN = 0.97      # auto tok/s vs off, the open question (at most 3% slower)


def parse_list(s, conv=str):
    return [conv(x.strip()) for x in s.split(",") if x.strip()]


def variants(a):
    """The (mode, K or None, draft gate on) triples of a round, in order."""
    out = []
    for m in a.modes:
        if m == "ngram":
            for k in a.draft_tokens or [None]:
                out.append(("ngram", k, True))
                if a.ungated:
                    out.append(("ngram", k, False))
        elif m in ("auto", "mtp"):
            out.append((m, a.auto_draft_tokens, True))
        else:
            out.append((m, None, True))
    return out


def vname(v):
    mode, k, gate = v
    return mode + ("" if k is None else f"-k{k}") + ("" if gate else "-nogate")


def placement_args(a, placement):
    if placement == "streaming":
        return ["--ram-budget", a.stream_budget, "--direct", "on"]
    return []


def base_cmd(a, placement, prompt, usage):
    cmd = [a.coli, "run", "--store", a.store, "--chat", "--prompt", prompt,
           "--max-tokens", str(a.max_tokens), "--json"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    cmd += placement_args(a, placement)
    if usage:
        cmd += ["--usage", usage]
    return cmd + a.extra


def learn_cmd(a, placement, usage):
    """The unmeasured run that writes the usage history every measured run starts from."""
    return base_cmd(a, placement, LEARN_PROMPT, usage) + ["--speculate", "off"]


def run_cmd(a, placement, task, v, usage):
    mode, k, gate = v
    cmd = base_cmd(a, placement, TASKS[task][1], usage) + ["--speculate", mode]
    if k is not None:
        cmd += ["--draft-tokens", str(k)]
    if not gate:
        cmd.append("--no-draft-gate")
    return cmd


def show(cmd):
    """The command for a terminal, the long prompt shortened."""
    out = []
    for i, c in enumerate(cmd):
        if i > 0 and cmd[i - 1] == "--prompt":
            task = next((t for t, (_, p) in TASKS.items() if p == c), None)
            out.append(f"\"$PROMPT_{task.upper()}\"" if task else shlex.quote(c[:40] + "..."))
        else:
            out.append(shlex.quote(c))
    return " ".join(out)


def die(msg):
    """Setup or run errors exit 2 (1 is kept for token ids that differ)."""
    print(f"speculative_bench: {msg}", file=sys.stderr)
    sys.exit(2)


def check_binary(coli, ungated=False):
    """Exits with a clear message when the binary is missing or has no --speculate."""
    if not (os.path.isfile(coli) and os.access(coli, os.X_OK)):
        die(f"no coli binary at {coli}: build it "
            "(cargo build --release -p coli-tools) or pass --coli PATH")
    p = subprocess.run([coli, "run", "--help"], capture_output=True, text=True)
    missing = [o for o in ("--speculate", "--draft-tokens") + (("--no-draft-gate",) if ungated else ())
               if o not in p.stdout]
    if p.returncode != 0 or missing:
        die(f"{coli} does not support {' and '.join(missing) or 'run --help'} "
            "(speculative decoding, issue 19): build a binary with it "
            "(cargo build --release -p coli-tools) or pass --coli PATH")


def git_rev():
    p = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                       text=True)
    return p.stdout.strip() or None


def execute(cmd, placement, a):
    dropped = None
    if placement == "streaming" and not a.no_drop_caches:
        dropped = drop_caches()
    load = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if p.returncode != 0:
        die(f"failed ({p.returncode}): {show(cmd)}\n{p.stderr[-4000:]}")
    try:
        out = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        die(f"no JSON from {show(cmd)}: {e}\n{p.stdout[-2000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "loadavg": load, "caches_dropped": dropped,
            "stderr": p.stderr[-2000:], "coli": out}


def spec_of(out):
    return (out.get("stats") or {}).get("speculation") or {}


def figures(rec):
    """The per-run figures the table uses (None where the binary does not report one)."""
    s = rec["coli"]["stats"]
    sp = spec_of(rec["coli"])
    gen = s.get("generated_tokens") or len(rec["coli"].get("token_ids", []))
    bpt = s.get("expert_bytes_per_generated_token")
    if bpt is None and s.get("expert_bytes_read") is not None and gen:
        bpt = s["expert_bytes_read"] / gen
    acc = sp.get("acceptance_rate")
    if acc is None and sp.get("drafts_proposed"):
        acc = sp.get("drafts_accepted", 0) / sp["drafts_proposed"]
    tpf = sp.get("tokens_per_forward")
    if tpf is None and sp.get("decode_passes") and gen:
        tpf = (gen - 1) / sp["decode_passes"]   # the first token comes from the prefill
    return {
        "tok_s": s.get("decode_tok_s") if s.get("decode_tok_s") is not None else (
            (gen - 1) / s["decode_s"] if s.get("decode_s") and gen and gen > 1 else None),
        "generated": gen,
        "mode": sp.get("mode"),
        "k": sp.get("draft_tokens"),
        "acceptance": acc,
        "tokens_per_forward": tpf,
        "verify_passes": sp.get("verify_passes"),
        "decode_passes": sp.get("decode_passes"),
        "paused": sp.get("gate_paused_passes"),
        "bytes_per_token": bpt,
        "hit_rate": s.get("hit_rate"),
    }


def sanity(rec, v):
    """Warnings about a run's speculation statistics (not fatal)."""
    w = []
    sp = spec_of(rec["coli"])
    mode, k, _ = v
    if not sp:
        return [] if mode == "off" else [f"{vname(v)}: no stats.speculation in coli's --json output"]
    if mode != "auto" and sp.get("mode") not in (None, mode):
        w.append(f"{vname(v)}: asked for {mode}, stats.speculation.mode = {sp.get('mode')}")
    if k is not None and sp.get("draft_tokens") not in (None, k):
        w.append(f"{vname(v)}: asked for K={k}, stats.speculation.draft_tokens = {sp.get('draft_tokens')}")
    if (sp.get("drafts_accepted") or 0) > (sp.get("drafts_proposed") or 0):
        w.append(f"{vname(v)}: drafts_accepted {sp.get('drafts_accepted')} > drafts_proposed "
                 f"{sp.get('drafts_proposed')}")
    if mode == "off" and (sp.get("drafts_proposed") or 0) > 0:
        w.append(f"off: {sp['drafts_proposed']} drafts proposed")
    gen = rec["coli"]["stats"].get("generated_tokens")
    dp = sp.get("decode_passes")
    if gen and dp and sp.get("tokens_per_forward") is not None:
        want = (gen - 1) / dp
        if abs(sp["tokens_per_forward"] - want) > 0.01 * want + 0.01:
            w.append(f"{vname(v)}: tokens_per_forward {sp['tokens_per_forward']:.3f} != "
                     f"(generated {gen} - 1) / decode passes {dp}")
    return w


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs, tasks, vs):
    """One row per (task, variant) of one placement's runs."""
    rows = []
    off = {(r["task"], r["round"]): r["fig"]["tok_s"] for r in runs if r["variant"] == "off"}
    for task in tasks:
        for v in vs:
            rs = [r for r in runs if r["task"] == task and r["variant"] == vname(v)]
            if not rs:
                continue
            f = [r["fig"] for r in rs]
            ratios = [r["fig"]["tok_s"] / off[(task, r["round"])] for r in rs
                      if off.get((task, r["round"])) and r["fig"]["tok_s"] is not None]
            tok = [x["tok_s"] for x in f if x["tok_s"] is not None]
            modes = sorted({x["mode"] for x in f if x["mode"]})
            ks = sorted({x["k"] for x in f if x["k"] is not None})
            rows.append({
                "task": task, "grounded": TASKS[task][0], "variant": vname(v), "mode": v[0],
                "resolved_mode": "/".join(modes) or None,
                "k": None if v[0] == "off" else v[1] if v[1] is not None else (
                    ks[0] if len(ks) == 1 else ks or None),
                "n": len(rs), "tok_s_median": med(tok), "tok_s_min": min(tok) if tok else None,
                "tok_s_max": max(tok) if tok else None, "ratio_vs_off": med(ratios),
                "ratios": ratios, "acceptance": med(x["acceptance"] for x in f),
                "tokens_per_forward": med(x["tokens_per_forward"] for x in f),
                "verify_passes": med(x["verify_passes"] for x in f),
                "decode_passes": med(x["decode_passes"] for x in f),
                "gate_paused_passes": med(x["paused"] for x in f),
                "expert_bytes_per_token": med(x["bytes_per_token"] for x in f),
                "generated_tokens": med(x["generated"] for x in f),
                "hit_rate": med(x["hit_rate"] for x in f),
            })
    return rows


def fmt(x, spec, dash="-"):
    return dash if x is None else format(x, spec)


def table(placement, rows):
    head = (f"{'task':<10} {'placement':<10} {'mode':<16} {'K':>3} {'tok/s':>7} {'(min-max)':>13} "
            f"{'x off':>6} {'accept':>6} {'tok/fwd':>7} {'verify':>6} {'paused':>6} "
            f"{'KiB/tok':>8} {'gen':>4}")
    lines = [head]
    for r in rows:
        mode = r["variant"]
        if r["mode"] == "auto" and r["resolved_mode"] not in (None, "auto"):
            mode = f"auto({r['resolved_mode']})"
        k = r["k"] if isinstance(r["k"], int) else ("-" if r["k"] is None else ",".join(map(str, r["k"])))
        span = (f"({r['tok_s_min']:.1f}-{r['tok_s_max']:.1f})" if r["tok_s_min"] is not None else "")
        lines.append(
            f"{r['task']:<10} {placement:<10} {mode:<16} {k:>3} {fmt(r['tok_s_median'], '7.2f'):>7} "
            f"{span:>13} {fmt(r['ratio_vs_off'], '6.2f'):>6} {fmt(r['acceptance'], '6.2f'):>6} "
            f"{fmt(r['tokens_per_forward'], '7.2f'):>7} {fmt(r['verify_passes'], '6.0f'):>6} "
            f"{fmt(r['gate_paused_passes'], '6.0f'):>6} "
            f"{fmt(None if r['expert_bytes_per_token'] is None else r['expert_bytes_per_token'] / 1024, '8.0f'):>8} "
            f"{fmt(r['generated_tokens'], '4.0f'):>4}")
    return lines


def targets(placement, rows, vs):
    """PASS/FAIL lines of the issue's targets, and the K sweep (geometric mean over tasks)."""
    lines, checks = [], []
    # Every ngram variant (each K of a sweep) and auto, on the input-grounded tasks; auto on the
    # open question.
    judged = [vname(v) for v in vs if v[0] in ("ngram", "auto")]
    for r in rows:
        if r["variant"] not in judged or r["ratio_vs_off"] is None:
            continue
        if r["grounded"]:
            ok = r["ratio_vs_off"] >= TARGET_GROUNDED
            checks.append({"placement": placement, "task": r["task"], "variant": r["variant"],
                           "ratio": r["ratio_vs_off"], "target": f">= {TARGET_GROUNDED}", "pass": ok})
        elif r["mode"] == "auto":
            ok = r["ratio_vs_off"] >= TARGET_OPEN
            checks.append({"placement": placement, "task": r["task"], "variant": r["variant"],
                           "ratio": r["ratio_vs_off"], "target": f">= {TARGET_OPEN}", "pass": ok})
    for c in checks:
        lines.append(f"# target {placement} {c['task']:<10} {c['variant']:<16} x off {c['ratio']:.2f} "
                     f"{c['target']}: {'PASS' if c['pass'] else 'FAIL'}")
    sweep = [v for v in vs if v[0] == "ngram" and v[1] is not None]
    sweep = sweep if len({v[1] for v in sweep}) > 1 else []
    if len(sweep) > 1:
        lines.append(f"# ngram K sweep ({placement}): geometric mean of x off over the input-grounded "
                     "tasks; open question")
        best = None
        for v in sweep:
            g = [r["ratio_vs_off"] for r in rows if r["variant"] == vname(v) and r["grounded"]
                 and r["ratio_vs_off"]]
            o = [r["ratio_vs_off"] for r in rows if r["variant"] == vname(v) and not r["grounded"]
                 and r["ratio_vs_off"]]
            gm = statistics.geometric_mean(g) if g else None
            lines.append(f"#   {vname(v):<15} grounded {fmt(gm, '.3f')}  open {fmt(med(o), '.3f')}")
            if gm is not None and (best is None or gm > best[1]):
                best = (vname(v), gm)
        if best:
            lines.append(f"#   best on the input-grounded tasks: {best[0]} (x{best[1]:.3f})")
    return lines, checks


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Issue 19 speculative-decoding benchmark: prompt lookup and auto vs off, "
                    "resident and streaming (see the module docstring).",
        epilog="Everything after `--` goes to every `coli run` unchanged (e.g. --no-verify). "
               "Method: engine/bench/README.md, 'Issue 19: speculative decoding'.")
    ap.add_argument("--coli", default=os.path.join(ROOT, "target/release/coli"),
                    help="the coli binary (default target/release/coli)")
    ap.add_argument("--store", default=os.path.join(ROOT, "demo/store"), help="default demo/store")
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of every run (default 3)")
    ap.add_argument("--max-tokens", type=int, default=160, help="--max-tokens of every run (default 160)")
    ap.add_argument("--modes", default="off,ngram,auto",
                    help="comma list of off,ngram,mtp,auto (default off,ngram,auto; off is always run)")
    ap.add_argument("--draft-tokens", default="",
                    help="K values for ngram, e.g. 2,3,4,6,8 (one variant each; default: the binary's K)")
    ap.add_argument("--auto-draft-tokens", type=int, default=None,
                    help="--draft-tokens for auto (and mtp) (default: the binary's)")
    ap.add_argument("--ungated", action="store_true",
                    help="also run every ngram variant with --no-draft-gate (variant name -nogate)")
    ap.add_argument("--placements", default="resident,streaming",
                    help="resident (default budget), streaming (--stream-budget, --direct on)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    ap.add_argument("--threads", type=int, default=None, help="--threads of coli run (default: its own)")
    ap.add_argument("--stream-budget", default="8MiB", help="--ram-budget of the streaming placement")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"),
                    help="where <date>-speculative-<placement>.json go (default engine/bench/results)")
    ap.add_argument("--label", default="", help="inserted in the results file names")
    ap.add_argument("--no-drop-caches", action="store_true",
                    help="do not drop the page cache before streaming runs")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and the run count only")
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()

    a.modes = parse_list(a.modes)
    a.draft_tokens = parse_list(a.draft_tokens, int)
    a.tasks = parse_list(a.tasks)
    a.placements = parse_list(a.placements)
    for m in a.modes:
        if m not in MODES:
            ap.error(f"--modes: unknown mode {m!r} (expected {', '.join(MODES)})")
    if "off" not in a.modes:
        a.modes.insert(0, "off")
    for t in a.tasks:
        if t not in TASKS:
            ap.error(f"--tasks: unknown task {t!r} (expected {', '.join(TASKS)})")
    for p in a.placements:
        if p not in PLACEMENTS:
            ap.error(f"--placements: unknown placement {p!r} (expected {', '.join(PLACEMENTS)})")
    if any(k < 1 for k in a.draft_tokens) or a.rounds < 1 or a.max_tokens < 2:
        ap.error("--draft-tokens values and --rounds must be >= 1, --max-tokens >= 2")
    if a.draft_tokens and "ngram" not in a.modes:
        ap.error("--draft-tokens is for ngram: add it to --modes")
    vs = variants(a)
    n_runs = len(a.placements) * a.rounds * len(a.tasks) * len(vs)
    date = time.strftime("%Y-%m-%d", time.gmtime())
    label = f"-{a.label}" if a.label else ""

    if a.dry_run:
        for t in a.tasks:
            print(f"PROMPT_{t.upper()}={shlex.quote(TASKS[t][1])}")
        for placement in a.placements:
            print(f"# {placement}: learn the usage history (unmeasured), then copy it for every run")
            print(show(learn_cmd(a, placement, "USAGE.json")))
            for rnd in range(a.rounds):
                order = vs if rnd % 2 == 0 else vs[::-1]
                for task in a.tasks:
                    for v in order:
                        print(show(run_cmd(a, placement, task, v, "run-copy-of-USAGE.json")))
            print(f"# -> {os.path.join(a.out_dir, f'{date}-speculative{label}-{placement}.json')}")
        print(f"# {n_runs} measured runs + {len(a.placements)} learning runs "
              f"({len(a.placements)} placements x {a.rounds} rounds x {len(a.tasks)} tasks x "
              f"{len(vs)} variants: {', '.join(vname(v) for v in vs)})")
        if "streaming" in a.placements and not a.no_drop_caches and os.geteuid() != 0:
            print("# not root: the page cache will not be dropped before streaming runs")
        return 0

    check_binary(a.coli, a.ungated)
    if not os.path.isfile(os.path.join(a.store, "MANIFEST")):
        die(f"{a.store} is not a coli store: run 'bash tools/demo/demo.sh' "
            "(README command 1) or pass --store")
    os.makedirs(a.out_dir, exist_ok=True)
    root = os.geteuid() == 0
    print(f"# speculative_bench {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
          f"git {git_rev()} coli {a.coli}")
    print(f"# store {a.store}; {a.rounds} rounds; max tokens {a.max_tokens}; threads "
          f"{a.threads or 'coli default'}; variants {', '.join(vname(v) for v in vs)}; "
          f"{n_runs} runs; extra args {a.extra}")
    if "streaming" in a.placements:
        if a.no_drop_caches:
            print("# streaming: page cache NOT dropped (--no-drop-caches); expert reads are O_DIRECT")
        elif not root:
            print("# streaming: not root, the page cache is NOT dropped before runs "
                  "(expert reads are O_DIRECT (--direct on), so only dense.bin's load is affected)")
        else:
            print("# streaming: page cache dropped before every run")
    print(f"# load average before: {os.getloadavg()}")

    tmp = tempfile.mkdtemp(prefix="coli-specbench-")
    failures = []
    all_lines = []
    all_checks = []
    reference = {}   # task -> (placement, variant, round, token ids)
    try:
        for placement in a.placements:
            path = os.path.join(a.out_dir, f"{date}-speculative{label}-{placement}.json")
            learned = os.path.join(tmp, f"usage-{placement}.json")
            learn = execute(learn_cmd(a, placement, learned), placement, a)
            doc = {
                "benchmark": "speculative", "issue": 19, "placement": placement,
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": os.uname().nodename,
                "cpus": os.cpu_count(), "git": git_rev(), "coli": a.coli, "store": a.store,
                "rounds": a.rounds, "max_tokens": a.max_tokens, "threads": a.threads,
                "placement_args": placement_args(a, placement), "extra_args": a.extra,
                "variants": [vname(v) for v in vs], "root": root,
                "caches_dropped": placement == "streaming" and not a.no_drop_caches and root,
                "tasks": {t: {"grounded": TASKS[t][0], "prompt": TASKS[t][1]} for t in a.tasks},
                "learn": {"prompt": LEARN_PROMPT, "cmd": learn_cmd(a, placement, learned),
                          "stats": learn["coli"].get("stats")},
                "runs": [], "summary": [], "targets": [], "token_mismatches": [],
            }
            runs = []
            for rnd in range(a.rounds):
                order = vs if rnd % 2 == 0 else vs[::-1]
                for task in a.tasks:
                    for v in order:
                        usage = os.path.join(tmp, "usage-run.json")
                        shutil.copyfile(learned, usage)
                        cmd = run_cmd(a, placement, task, v, usage)
                        rec = execute(cmd, placement, a)
                        rec.update({"placement": placement, "task": task, "variant": vname(v),
                                    "mode": v[0], "draft_tokens": v[1], "draft_gate": v[2],
                                    "round": rnd,
                                    "cmd": [c if c != TASKS[task][1] else f"<{task} prompt>" for c in cmd]})
                        rec["fig"] = figures(rec)
                        for w in sanity(rec, v):
                            print(f"# warning: {placement} {task} round {rnd}: {w}")
                        ids = rec["coli"].get("token_ids")
                        ref = reference.setdefault(task, (placement, vname(v), rnd, ids))
                        if ids != ref[3]:
                            i = first_diff(ids, ref[3])
                            msg = (f"TOKEN IDS DIFFER: task {task}: {placement} {vname(v)} round {rnd} "
                                   f"vs {ref[0]} {ref[1]} round {ref[2]}: first difference at token {i} "
                                   f"({ids[i:i + 4]} vs {ref[3][i:i + 4]}; lengths {len(ids)}, {len(ref[3])})")
                            print("#" * 100 + f"\n# {msg}\n" + "#" * 100, flush=True)
                            failures.append(msg)
                            doc["token_mismatches"].append(msg)
                        f = rec["fig"]
                        print(f"# {placement} round {rnd} {task:<10} {vname(v):<16} "
                              f"{fmt(f['tok_s'], '.2f')} tok/s, {f['generated']} tokens, "
                              f"tok/fwd {fmt(f['tokens_per_forward'], '.2f')}, "
                              f"accept {fmt(f['acceptance'], '.2f')}, wall {rec['wall_s']:.1f} s", flush=True)
                        runs.append(rec)
                        doc["runs"].append({k: rec[k] for k in rec if k != "fig"})
                        doc["summary"] = summarize(runs, a.tasks, vs)
                        with open(path + ".tmp", "w") as fh:
                            json.dump(doc, fh, indent=1)
                        os.replace(path + ".tmp", path)
            rows = summarize(runs, a.tasks, vs)
            lines = table(placement, rows)
            tl, checks = targets(placement, rows, vs)
            doc["summary"], doc["targets"] = rows, checks
            doc["loadavg_after"] = os.getloadavg()
            with open(path + ".tmp", "w") as fh:
                json.dump(doc, fh, indent=1)
            os.replace(path + ".tmp", path)
            all_lines += [""] + lines + tl + [f"# raw runs: {path}"]
            all_checks += checks
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"# load average after: {os.getloadavg()}")
    print("\n".join(all_lines))
    print("# tok/s: decode tok/s median over rounds (min-max); x off: median over rounds of tok/s / "
          "off's tok/s in the same round;\n# accept: drafts accepted / proposed; tok/fwd: generated "
          "tokens after the first per decode pass; verify: decode passes carrying drafts;\n# paused: "
          "gate-paused passes; KiB/tok: expert KiB read per generated token (prefill included); "
          "gen: generated tokens")
    if all_checks:
        n_pass = sum(c["pass"] for c in all_checks)
        print(f"# targets: {n_pass}/{len(all_checks)} PASS")
    if failures:
        print("#" * 100)
        print(f"# FAILURE: token ids differ across modes/placements in {len(failures)} run(s); "
              "greedy speculative decoding must not change the output:")
        for m in failures:
            print(f"#   {m}")
        print("#" * 100)
        return 1
    print(f"# token ids identical across every mode, K, round and placement for all "
          f"{len(reference)} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
