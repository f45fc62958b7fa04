#!/usr/bin/env python3
"""`coli serve` end to end: the official `openai` client talks to a real server over loopback.

The served store is the demo model (SmolLM2-135M-Instruct, int4 experts), built here like
tests/demo_e2e.py does (tools/demo/make_demo_checkpoint.py, then coli-convert) in
$COLI_SERVE_WORK (default: $CARGO_TARGET_DIR/serve-test) and reused when it already exists.
Expected token counts come from tests/fixtures/demo/expected.json, which transformers produced.

Checks: models list; chat non-streaming and streaming (assembled text equals the non-streaming
text at temperature 0, chunks never hold a broken character); completions from text and from
token ids; usage equal to transformers' token counts; stop strings (streaming and not); seed
reproducibility; 401 for a missing or wrong key; 400 for malformed JSON, wrong types, unsupported
fields and a prompt longer than the context; 404 for a wrong model id and an unknown path; 429
with Retry-After when the queue is full; cancellation of a streaming and of a non-streaming
request when the client disconnects; KV prefix reuse across requests; /health; /metrics parsed as
Prometheus text; a bounded load test (50 requests from 8 clients) with an RSS check (that server
runs --max-batch 1, so that queued requests can be counted). Then continuous batching on a second
server (--max-batch 4): concurrent streams each get the text they get alone at temperature 0 and
share forward passes; a seeded request samples the same text alone and in a batch; n choices
(choice i equals a request seeded seed + i); a closed stream frees its slot for a waiting request;
the batching metrics and one log line per request; SIGTERM with a full batch (the short stream
finishes, the long ones end with finish reason "abort", no new request is admitted, exit code 0).
Last, long prefills on a server with an 8192-token context: a prompt that prefills for more than
30 s through the Anthropic stream gets `ping` events at most 5 s apart, one of more than 10 s
through the OpenAI stream gets keep-alive comments, and /metrics shows the prefill's progress move.

Run from the repository root after `cargo build -p coli-convert -p coli-tools`, with the
packages of tools/demo/requirements.txt (--no-deps) and tests/serve/requirements.txt installed.
"""

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import anthropic
import openai
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
COLI = os.path.join(TARGET, "debug", "coli")
CONVERT = os.path.join(TARGET, "debug", "coli-convert")
EXPECTED = os.path.join(ROOT, "tests", "fixtures", "demo", "expected.json")
KEY = "test-key-123"
MODEL = "demo"
CONTEXT = 1024
MAX_QUEUE = 2
# A prompt the demo model continues by counting, without EOS, for LONG_TOKENS tokens (about 10 s
# under the default numerics on this project's machines; it counts past 230 in 1000 tokens).
LONG_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"
LONG_TOKENS = 900

# The continuous-batching server: sequences per forward pass, and its shutdown grace (s).
BATCH = 4
GRACE = 4
PROMPTS = ["Once upon a time, in a small village by the sea,", "The three most important inventions are",
           "def fibonacci(n):", "Dear diary, today I learned", "The recipe for a good soup starts with"]

failures = []
passed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passed if cond else failures).append(what)


def demo_store():
    work = os.environ.get("COLI_SERVE_WORK") or os.path.join(TARGET, "serve-test")
    store = os.path.join(work, "demo-store")
    manifest = os.path.join(store, "MANIFEST")
    # Reuse a store built by the current coli-convert; rebuild after the converter changed.
    if os.path.isfile(manifest) and os.path.getmtime(manifest) >= os.path.getmtime(CONVERT):
        return store
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="build-", dir=work)
    try:
        ckpt = os.path.join(tmp, "checkpoint")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "demo", "make_demo_checkpoint.py"), ckpt],
                       check=True)
        subprocess.run([CONVERT, ckpt, os.path.join(tmp, "store")], check=True)
        os.replace(os.path.join(tmp, "store"), store)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return store


class Server:
    """A `coli serve` child on a free port (--port 0; the address is read from its log)."""

    def __init__(self, store, *args, max_queue=MAX_QUEUE, log_name="serve.log", context=CONTEXT):
        self.log_path = os.path.join(os.path.dirname(store), log_name)
        self.log = open(self.log_path, "w")
        cmd = [COLI, "serve", "--store", store, "--port", "0", "--context", str(context),
               "--model-id", MODEL, "--api-key", KEY, "--max-queue", str(max_queue), *args]
        print("$ " + " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        self.url = None
        while self.url is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("coli serve did not start:\n" + open(self.log_path).read())
            for line in open(self.log_path):
                if "listening on http://" in line:
                    self.url = line.rsplit("listening on ", 1)[1].strip()
            time.sleep(0.1)
        self.pid = self.proc.pid

    def rss_bytes(self):
        for line in open(f"/proc/{self.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def raw(server, method, path, body=None, key=KEY, scheme="Bearer"):
    """(status, headers, parsed JSON or text) of a request made without the openai client."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"{scheme} {key}"
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, hdrs, text = r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, e.headers, e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def metrics(server):
    _, _, text = raw(server, "GET", "/metrics")
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else "")
            out[key] = s.value
    return out


def settle(server, timeout=10.0):
    """Waits until nothing runs or waits and the counters stop moving (a request's tokens are
    counted when the worker retires it, which may be just after its client has the response,
    or, for a cancelled one, after the cancellation is seen): deltas taken after this count
    only what comes next."""
    def still():
        a = metrics(server)
        time.sleep(0.2)
        b = metrics(server)
        return a == b and b["coli_running_requests"] == 0 and b["coli_queue_depth"] == 0
    return wait_for(still, timeout)


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def is_error(e, status, param=None, code=None):
    body = e.body if isinstance(e, openai.APIStatusError) else None
    ok = getattr(e, "status_code", None) == status and isinstance(body, dict) and "message" in body
    if param is not None:
        ok = ok and body.get("param") == param
    if code is not None:
        ok = ok and body.get("code") == code
    return ok


def expect_error(fn, status, param=None, code=None):
    try:
        fn()
    except openai.APIStatusError as e:
        return is_error(e, status, param, code), e
    return False, None


def kv_restart_checks(store):
    """The prefix cache on disk: a follow-up turn after a restart reuses the first turn's KV cache
    (cached_tokens, fewer prefilled tokens) and answers as a server that prefills it all; a
    second API key never reuses the first key's prefix; `coli kv ls|clear` see the files."""
    kv_dir = tempfile.mkdtemp(prefix="kv-", dir=os.path.dirname(store))
    other = "second-key"
    conv = [{"role": "user", "content": "What is the capital of France?"}]

    def client(server, key=KEY):
        return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)

    first = Server(store, "--max-batch", "2", "--kv-dir", kv_dir, "--api-key", other, log_name="serve-kv1.log")
    try:
        t1 = client(first).chat.completions.create(model=MODEL, messages=conv, max_tokens=16, temperature=0)
    finally:
        first.stop()
    conv2 = conv + [{"role": "assistant", "content": t1.choices[0].message.content},
                    {"role": "user", "content": "And of Germany?"}]
    fresh = Server(store, "--max-batch", "2", "--no-kv-disk", log_name="serve-kv0.log")
    try:
        want = client(fresh).chat.completions.create(model=MODEL, messages=conv2, max_tokens=16, temperature=0)
    finally:
        fresh.stop()
    second = Server(store, "--max-batch", "2", "--kv-dir", kv_dir, "--api-key", other, log_name="serve-kv2.log")
    try:
        before = metrics(second)
        got = client(second).chat.completions.create(model=MODEL, messages=conv2, max_tokens=16, temperature=0)
        wait_for(lambda: metrics(second)["coli_prompt_tokens_total"] - before["coli_prompt_tokens_total"]
                 >= got.usage.prompt_tokens, 10)
        settle(second)
        after = metrics(second)
        cached = got.usage.prompt_tokens_details.cached_tokens
        prefilled = after["coli_prefill_tokens_total"] - before["coli_prefill_tokens_total"]
        check(cached >= t1.usage.prompt_tokens and prefilled == got.usage.prompt_tokens - cached,
              f"after a restart the follow-up turn reuses the first turn's KV from disk: {cached} cached, "
              f"{prefilled} prefilled of {got.usage.prompt_tokens}")
        check(got.choices[0].message.content == want.choices[0].message.content,
              f"resumed from disk it answers as a server that prefills it all: {got.choices[0].message.content!r} "
              f"vs {want.choices[0].message.content!r}")
        check(want.usage.prompt_tokens_details.cached_tokens == 0,
              "the --no-kv-disk server started with nothing cached")
        # Another key: the same conversation is prefilled again (no reuse across keys).
        theirs = client(second, other).chat.completions.create(model=MODEL, messages=conv2, max_tokens=16,
                                                               temperature=0)
        check(theirs.usage.prompt_tokens_details.cached_tokens == 0
              and theirs.choices[0].message.content == want.choices[0].message.content,
              f"another API key never reuses a prefix cached for the first: "
              f"{theirs.usage.prompt_tokens_details.cached_tokens} cached")
    finally:
        second.stop()
    ls = json.loads(subprocess.run([COLI, "kv", "ls", "--kv-dir", kv_dir, "--json"], capture_output=True,
                                   text=True, check=True).stdout)
    scopes = {f["scope"] for f in ls["files"]}
    check(ls["files"] and all(f["status"] == "ok" for f in ls["files"]) and len(scopes) == 2
          and "shared" not in scopes,
          f"coli kv ls: each key's conversation in its own file: {[(f['tokens'], f['scope']) for f in ls['files']]}")
    mode = os.stat(os.path.join(kv_dir, ls["files"][0]["file"])).st_mode & 0o777
    check(mode == 0o600, f"KV cache files are private to the user: mode {mode:o}")
    subprocess.run([COLI, "kv", "clear", "--kv-dir", kv_dir], check=True, capture_output=True)
    ls = json.loads(subprocess.run([COLI, "kv", "ls", "--kv-dir", kv_dir, "--json"], capture_output=True,
                                   text=True, check=True).stdout)
    check(not ls["files"], "coli kv clear removes them")
    shutil.rmtree(kv_dir, ignore_errors=True)


def main():
    # Prefix caches on disk go to a fresh state directory: nothing from an earlier run is reused,
    # and nothing of this run is left behind (each run's KV files take about 400 MB).
    state = tempfile.mkdtemp(prefix="coli-serve-state-")
    os.environ["COLI_STATE_DIR"] = state
    try:
        serve_checks()
    finally:
        shutil.rmtree(state, ignore_errors=True)


def serve_checks():
    exp = json.load(open(EXPECTED))
    q = exp["int4_g64"]
    question = [{"role": "user", "content": q["prompt"]}]
    store = demo_store()
    # One sequence at a time: the queue, 429 and cancellation checks count queued requests.
    # Its answers are compared with transformers' (text and token counts): transformers'
    # arithmetic, `--numerics exact` (the other servers run the default, q8a).
    server = Server(store, "--max-batch", "1", "--shutdown-grace", "1", "--numerics", "exact")
    try:
        # Before run_checks, which ends with the server's SIGTERM.
        anthropic_checks(server, q, question)
        run_checks(server, q, question)
    finally:
        server.stop()
    batched = Server(store, "--max-batch", str(BATCH), "--shutdown-grace", str(GRACE), max_queue=16)
    try:
        # system_fingerprint is the kernels' numerics id (same id, same tokens): q8a here, the
        # default; run_checks saw the exact server's.
        c = openai.OpenAI(base_url=batched.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        fp = c.completions.create(model=MODEL, prompt="Hi", max_tokens=1, temperature=0).system_fingerprint
        check(fp and "+q8a-r" in fp, f"system_fingerprint names the default numerics: {fp!r}")
        batching_checks(batched)
    finally:
        batched.stop()
    # The plain server prefills in chunks of 4 tokens: a lone request's prompt runs all its chunks
    # in one step, layer by layer (Engine::prefill_sequence), which must give the text the
    # drafting server's one-chunk prefill gives.
    plain = Server(store, "--max-batch", "1", "--speculate", "off", "--prefill-batch", "4",
                   log_name="serve-off.log")
    drafting = Server(store, "--max-batch", str(BATCH), "--speculate", "ngram", "--draft-tokens", "4",
                      "--no-draft-gate", log_name="serve-ngram.log")
    try:
        speculation_checks(plain, drafting)
    finally:
        plain.stop()
        drafting.stop()
    kv_restart_checks(store)
    long_prefill_checks(store)
    print(f"serve: {len(passed)} passed, {len(failures)} failed")
    if failures:
        print("server log:\n" + open(server.log_path).read()[-4000:])
        sys.exit(1)



# Prompts the demo model prefills for more than 30 s (Anthropic) and more than 10 s (OpenAI) on
# the CI machine (2 cores, the test profile; about 70 tokens/s at these lengths): repeated
# sentences, different ones so that the second request reuses nothing of the first.
LONG_PREFILL_CONTEXT = 8192
LONG_PREFILLS = [
    ("/v1/messages", "The quick brown fox jumps over the lazy dog. ", 520, 30, "ping"),
    ("/v1/chat/completions", "A journey of a thousand miles begins with a single step. ", 320, 10, ":"),
]


def sse_lines(server, path, body, out):
    """Streams `body` to `path`, appending (seconds since the request, line) for every SSE line."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}",
                                          "x-api-key": KEY, "anthropic-version": "2023-06-01"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        while True:
            line = r.readline()
            if not line:
                return
            out.append((time.time() - t0, line.decode().rstrip("\n")))


def first_token(line):
    """Whether an SSE line carries generated text or the end (Anthropic `content_block_delta`,
    OpenAI a chunk with content or a finish reason; not the role chunk sent before the prefill)."""
    if line.startswith("event: content_block_delta"):
        return True
    if not line.startswith("data: {"):
        return False
    v = json.loads(line[len("data: "):])
    c = (v.get("choices") or [{}])[0]
    return bool((c.get("delta") or {}).get("content")) or c.get("finish_reason") is not None


def long_prefill_checks(store):
    """A prompt that prefills for more than 30 s (issue 48, colibri #573: agents time out on
    long prefills with nothing on the wire): the Anthropic stream sends `ping` events while it
    prefills, the OpenAI stream its keep-alive comments, and /metrics shows the prefill's progress
    (tokens done / to prefill) moving before the first token."""
    server = Server(store, "--max-batch", "1", log_name="serve-long.log", context=LONG_PREFILL_CONTEXT)
    try:
        for path, sentence, repeats, min_s, silent in LONG_PREFILLS:
            body = {"model": MODEL, "max_tokens": 2, "stream": True,
                    "messages": [{"role": "user", "content": sentence * repeats}]}
            lines, seen = [], []
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                fut = ex.submit(sse_lines, server, path, body, lines)
                while not fut.done():
                    m = metrics(server)
                    seen.append((m.get("coli_prefill_done_tokens", 0), m.get("coli_prefill_total_tokens", 0)))
                    time.sleep(1.0)
                fut.result()
            first = next((t for t, l in lines if first_token(l)), None)
            check(first is not None and first > min_s,
                  f"{path}: the prompt prefilled for {first} s (more than {min_s} s)")
            # While it prefilled: a keep-alive at least every ~5 s (Anthropic: `event: ping`;
            # OpenAI: an SSE comment line), so no gap in the stream exceeds 10 s.
            times = [t for t, l in lines if (l.startswith("event: ping") if silent == "ping" else l.startswith(":"))]
            marks = [0.0] + [t for t in times if first and t < first] + [first or 0.0]
            gap = max(b - a for a, b in zip(marks, marks[1:]))
            check(len(times) >= min_s // 5 - 1 and gap < 10,
                  f"{path}: {len(times)} keep-alives during the prefill, longest silence {gap:.1f} s")
            # /metrics: the prefill's progress moved (done < total, then more done) before the reply.
            moving = [(d, t) for d, t in seen if t > 0]
            check(len(moving) >= 3 and moving[0][0] < moving[-1][0] <= moving[-1][1],
                  f"{path}: /metrics prefill progress {moving[:2]} ... {moving[-2:]}")
            after = metrics(server).get("coli_prefill_total_tokens", -1)
            check(after == 0, f"{path}: no prefill pending after the reply ({after})")
    finally:
        server.stop()

def run_checks(server, q, question):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    t_start = time.time()

    # Models, health.
    models = [m.id for m in client.models.list().data]
    check(models == [MODEL], f"/v1/models lists the served model: {models}")
    st, _, body = raw(server, "GET", "/health", key=None)
    check(st == 200 and body == {"status": "ok"}, f"/health without the key: only the status: {st} {body}")
    st, _, body = raw(server, "GET", "/health")
    check(st == 200 and body.get("model") == MODEL, f"/health with the key: {st} {body}")
    # One key for every route (--api-key): each route without the key, and with it.
    for method, path, body, open_route in [
        ("GET", "/v1/models", None, False),
        ("GET", f"/v1/models/{MODEL}", None, False),
        ("POST", "/v1/chat/completions", json.dumps({"model": MODEL, "messages": question, "max_tokens": 1}), False),
        ("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 1}), False),
        ("POST", "/v1/messages", json.dumps({"model": MODEL, "max_tokens": 1,
                                             "messages": [{"role": "user", "content": "Hi"}]}), False),
        ("GET", "/metrics", None, False),
        ("GET", "/health", None, True),
    ]:
        st, _, _ = raw(server, method, path, body=body, key=None)
        check((st == 200) == open_route and (open_route or st == 401),
              f"{method} {path} without the key: {st} ({'open' if open_route else '401 expected'})")
        st, _, _ = raw(server, method, path, body=body)
        check(st == 200, f"{method} {path} with the key: {st}")
    # Every refused request has a line in the server log: method, path, status, reason.
    st, _, _ = raw(server, "GET", "/no/such/route")
    log = open(server.log_path).read()
    check("GET /metrics -> 401:" in log and "GET /no/such/route -> 404:" in log,
          "refused requests are logged with status and reason")

    # Chat, non-streaming, temperature 0: transformers' answer and token counts.
    r = client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    check(text == q["decoded"], f"chat answer equals transformers' decoding: {text!r}")
    check(r.system_fingerprint and "q8a" not in r.system_fingerprint,
          f"system_fingerprint names the numerics (--numerics exact): {r.system_fingerprint!r}")
    check(r.choices[0].finish_reason == "stop", f"chat finish_reason stop at EOS: {r.choices[0].finish_reason}")
    check(r.usage.prompt_tokens == len(q["prompt_ids"]) and r.usage.completion_tokens == len(q["expected_new_ids"])
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          f"chat usage equals transformers' token counts {len(q['prompt_ids'])}+{len(q['expected_new_ids'])}: {r.usage}")

    # Chat, streaming: same text, whole characters, usage chunk last.
    chunks, usage, finish = [], None, None
    for c in client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            if ch.delta.content:
                chunks.append(ch.delta.content)
            finish = ch.finish_reason or finish
    check("".join(chunks) == text and len(chunks) > 3,
          f"streamed chat ({len(chunks)} chunks) assembles to the non-streaming text")
    check(all("\ufffd" not in c for c in chunks), "no streamed chunk holds a broken character")
    check(finish == "stop" and usage is not None and usage.completion_tokens == r.usage.completion_tokens,
          f"streamed finish_reason {finish} and usage {usage}")
    # The same prompt again: everything but the last prompt token comes from the KV cache.
    check(usage is not None and usage.prompt_tokens_details.cached_tokens == len(q["prompt_ids"]) - 1,
          f"repeated prompt reuses the KV cache: cached_tokens {usage and usage.prompt_tokens_details.cached_tokens}")

    # Completions from token ids (the chat prompt's ids) give the chat answer; from text: length.
    c = client.completions.create(model=MODEL, prompt=q["prompt_ids"], max_tokens=24, temperature=0)
    check(c.choices[0].text == text and c.usage.prompt_tokens == len(q["prompt_ids"]),
          f"completion from token ids equals the chat answer: {c.choices[0].text!r}, usage {c.usage}")
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5 and c.choices[0].text,
          f"text completion stops at max_tokens: {c.choices[0].text!r} {c.choices[0].finish_reason} {c.usage}")
    streamed = "".join(x.choices[0].text for x in client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0, stream=True) if x.choices)
    check(streamed == c.choices[0].text, f"streamed completion equals the non-streaming one: {streamed!r}")

    # Stop strings.
    cut = text[:text.index("Paris")]
    r2 = client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0,
                                        stop=["Paris", "zzz"])
    check(r2.choices[0].message.content == cut and r2.choices[0].finish_reason == "stop"
          and r2.usage.completion_tokens < r.usage.completion_tokens,
          f"stop string cuts the answer: {r2.choices[0].message.content!r} ({r2.usage.completion_tokens} tokens)")
    s2 = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        model=MODEL, messages=question, max_tokens=24, temperature=0, stop="Paris", stream=True) if ch.choices)
    check(s2 == cut, f"streamed stop string cuts the answer the same way: {s2!r}")

    # Seeds: same seed, same text; other seeds give other samples.
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                         temperature=1.5, seed=seed).choices[0].text
    a, b = sample(7), sample(7)
    others = [sample(s) for s in (8, 9, 10)]
    check(a == b, f"seed 7 twice gives the same text: {a!r}")
    check(any(o != a for o in others), f"other seeds give other samples: {others!r}")

    # 401.
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    ok, e = expect_error(lambda: bad.chat.completions.create(model=MODEL, messages=question, max_tokens=2), 401,
                         code="invalid_api_key")
    check(ok and isinstance(e, openai.AuthenticationError), f"wrong API key: 401 {e and e.body}")
    st, _, body = raw(server, "POST", "/v1/chat/completions", "{}", key=None)
    check(st == 401 and body["error"]["code"] == "invalid_api_key", f"missing API key: {st} {body}")
    st, _, _ = raw(server, "GET", "/v1/models", key=None)
    check(st == 401, f"/v1/models without the key: {st}")
    st, _, _ = raw(server, "GET", "/v1/models", scheme="bearer")
    check(st == 200, f"the auth scheme is case-insensitive ('bearer KEY'): {st}")

    # 400s.
    st, _, body = raw(server, "POST", "/v1/chat/completions", '{"model": "demo", "messages": [')
    check(st == 400 and body["error"]["type"] == "invalid_request_error", f"malformed JSON: {st} {body}")
    cases = [
        ("wrong type", dict(messages=question, extra_body={"max_tokens": "five"}), "max_tokens", "invalid_type"),
        ("wrong content type", dict(messages=[{"role": "user", "content": 5}]), "messages[0].content", "invalid_type"),
        ("temperature out of range", dict(messages=question, temperature=5), "temperature", None),
        ("a tool_choice naming no tool", dict(messages=question, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {}}}], tool_choice={"type": "function", "function": {"name": "g"}}),
         "tool_choice", None),
        ("a response_format type", dict(messages=question, response_format={"type": "yaml"}), "response_format.type",
         None),
        ("logprobs", dict(messages=question, logprobs=True), "logprobs", "unsupported_parameter"),
        ("n above --max-batch", dict(messages=question, n=2), "n", None),
        ("5 stop strings", dict(messages=question, stop=["a", "b", "c", "d", "e"]), "stop", None),
        ("max_tokens beyond the context", dict(messages=question, max_tokens=CONTEXT), "max_tokens",
         "context_length_exceeded"),
    ]
    for name, kw, param, code in cases:
        ok, e = expect_error(lambda: client.chat.completions.create(model=MODEL, **kw), 400, param, code)
        check(ok, f"400 for {name}: {e and e.body}")
    ok, e = expect_error(lambda: client.completions.create(model=MODEL, prompt=[1] * (CONTEXT + 1), max_tokens=1),
                         400, "prompt", "context_length_exceeded")
    check(ok, f"400 for a prompt longer than the context: {e and e.body}")
    ok, e = expect_error(lambda: client.chat.completions.create(model=MODEL, messages=question, max_tokens=2,
                                                                extra_body={"unknown_field": 1}), 400)
    check(not ok and e is None, "unknown fields are ignored")

    # 404s.
    ok, e = expect_error(lambda: client.chat.completions.create(model="gpt-4o", messages=question, max_tokens=2),
                         404, "model", "model_not_found")
    check(ok and isinstance(e, openai.NotFoundError), f"404 for a wrong model id: {e and e.body}")
    st, _, body = raw(server, "GET", "/v1/nothing")
    check(st == 404 and "error" in body, f"404 in OpenAI's shape for an unknown path: {st}")
    st, _, body = raw(server, "GET", "/v1/chat/completions")
    check(st == 405 and isinstance(body, dict) and body["error"]["code"] == "method_not_allowed",
          f"405 in OpenAI's shape for a wrong method: {st} {body}")
    big = '{"model": "%s", "prompt": "%s"}' % (MODEL, "x" * (3 << 20))
    st, _, body = raw(server, "POST", "/v1/completions", big)
    check(st == 413 and isinstance(body, dict) and body["error"]["code"] == "request_too_large",
          f"413 in OpenAI's shape for a body over the limit: {st} {str(body)[:200]}")

    # 429 and cancellation: one long generation in flight, MAX_QUEUE queued, the next is refused.
    # The counting prompt never reaches EOS: uncancelled, it generates all `room` tokens.
    m0 = metrics(server)
    long_prompt, room = LONG_PROMPT, LONG_TOKENS
    streams = []
    first = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=room, temperature=0, stream=True)
    next(iter(first))  # it is running
    streams.append(first)
    for _ in range(MAX_QUEUE):
        streams.append(client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=room, temperature=0,
                                                 stream=True))
    check(wait_for(lambda: metrics(server)["coli_queue_depth"] == MAX_QUEUE),
          f"{MAX_QUEUE} requests queued behind the running one")
    try:
        client.chat.completions.create(model=MODEL, messages=question, max_tokens=2)
        check(False, "full queue answers 429")
    except openai.RateLimitError as e:
        ra = e.response.headers.get("retry-after")
        check(e.status_code == 429 and ra is not None and int(ra) >= 1 and e.body.get("type") == "rate_limit_error",
              f"full queue answers 429 with Retry-After {ra}: {e.body}")
    t_cancel = time.time()
    for s in streams:
        s.close()
    cancelled = lambda: metrics(server)  # noqa: E731
    check(wait_for(lambda: cancelled()["coli_cancelled_requests_total"]
                   - m0["coli_cancelled_requests_total"] == 1 + MAX_QUEUE
                   and cancelled()["coli_running_requests"] == 0 and cancelled()["coli_queue_depth"] == 0, 10),
          f"closing the streams cancels the running and the queued generations "
          f"({time.time() - t_cancel:.2f} s)")
    m1 = metrics(server)
    gen = m1["coli_completion_tokens_total"] - m0["coli_completion_tokens_total"]
    check(gen < room // 4, f"the cancelled generation stopped early: {gen} of {room} tokens generated")
    # A non-streaming request whose client times out is cancelled too.
    impatient = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=1.0)
    try:
        impatient.completions.create(model=MODEL, prompt=long_prompt, max_tokens=room, temperature=0)
        check(False, "non-streaming request times out on the client")
    except openai.APITimeoutError:
        check(wait_for(lambda: metrics(server)["coli_cancelled_requests_total"]
                       - m1["coli_cancelled_requests_total"] == 1
                       and metrics(server)["coli_running_requests"] == 0, 10),
              "a non-streaming request is cancelled when its client disconnects")
    gen = metrics(server)["coli_completion_tokens_total"] - m1["coli_completion_tokens_total"]
    check(gen < room // 4, f"the disconnected non-streaming generation stopped early: {gen} of {room} tokens")

    # Prefix reuse: the second turn prefills only the tokens after the first turn.
    t1 = client.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0)
    conv = question + [{"role": "assistant", "content": t1.choices[0].message.content},
                       {"role": "user", "content": "And what is the capital of Germany?"}]
    settle(server)
    before = metrics(server)
    t2 = client.chat.completions.create(model=MODEL, messages=conv, max_tokens=24, temperature=0)
    # The worker counts a request's tokens when it retires it, which may be just after the
    # client has the whole response: wait until the second turn is counted.
    wait_for(lambda: metrics(server)["coli_prompt_tokens_total"] - before["coli_prompt_tokens_total"]
             >= t2.usage.prompt_tokens, 10)
    after = metrics(server)
    cached = t2.usage.prompt_tokens_details.cached_tokens
    prefilled = after["coli_prefill_tokens_total"] - before["coli_prefill_tokens_total"]
    check(cached >= t1.usage.prompt_tokens and prefilled == t2.usage.prompt_tokens - cached,
          f"second turn reuses the KV cache: {t2.usage.prompt_tokens} prompt tokens, {cached} cached, "
          f"{prefilled} prefilled")

    # /metrics families.
    _, hdrs, mtext = raw(server, "GET", "/metrics")
    names = {f.name for f in text_string_to_metric_families(mtext)}
    want = {"coli_requests", "coli_prompt_tokens", "coli_completion_tokens", "coli_time_to_first_token_seconds",
            "coli_decode_step_seconds", "coli_expert_read_bytes", "coli_expert_cache_hit_rate", "coli_queue_depth"}
    check(want <= names, f"/metrics has {sorted(want - names) or 'every expected family'}")
    m = metrics(server)
    check(m['coli_requests_total{"endpoint": "chat_completions", "status": "429"}'] >= 1
          and m['coli_requests_total{"endpoint": "chat_completions", "status": "200"}'] >= 5
          and 0 < m["coli_expert_cache_hit_rate"] <= 1 and m["coli_expert_read_bytes_total"] > 0
          and m["coli_time_to_first_token_seconds_count"] > 0,
          "metrics count requests by status, TTFT, expert bytes and hit rate")
    print(f"functional checks took {time.time() - t_start:.1f} s", flush=True)

    load_test(server)

    # SIGTERM with a long generation streaming: the server stops it and exits promptly.
    s = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=LONG_TOKENS, temperature=0,
                                  stream=True)
    next(iter(s))
    t0 = time.time()
    server.proc.send_signal(signal.SIGTERM)
    try:
        rc = server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"SIGTERM during a generation: exit code {rc} after {time.time() - t0:.2f} s")
    s.close()


def anthropic_checks(server, q, question):
    """POST /v1/messages with the official anthropic client: the same answers as the OpenAI
    endpoint (transformers' greedy text), the event sequence, stop sequences, usage, errors."""
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)
    # Anthropic's current API (and this client) dropped the sampling fields; coli still takes
    # temperature, top_p and top_k (older clients send them), here through extra_body.
    T0 = {"extra_body": {"temperature": 0}}
    n_prompt, n_new = len(q["prompt_ids"]), len(q["expected_new_ids"])

    m = client.messages.create(model=MODEL, max_tokens=24, messages=question, **T0)
    text = m.content[0].text if m.content else None
    check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and len(m.content) == 1
          and m.content[0].type == "text", f"messages: one text block: {m}")
    check(text == q["decoded"], f"messages answer equals transformers' decoding: {text!r}")
    check(m.stop_reason == "end_turn" and m.stop_sequence is None, f"messages stop_reason end_turn: {m.stop_reason}")
    u = m.usage
    check(u.input_tokens + u.cache_read_input_tokens == n_prompt and u.output_tokens == n_new
          and u.cache_creation_input_tokens == 0,
          f"messages usage: input {u.input_tokens} + cache read {u.cache_read_input_tokens} = {n_prompt}, "
          f"output {u.output_tokens} = {n_new}")

    # The template's own default system prompt, given explicitly: the same prompt, the same answer.
    m2 = client.messages.create(model=MODEL, max_tokens=24, **T0, messages=question,
                                system="You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    check(m2.content[0].text == text, f"system prompt as the template's default gives the same answer: "
                                      f"{m2.content[0].text!r}")

    # Streaming: the raw event sequence, and the helper's assembled text and final message.
    types, pieces = [], []
    for ev in client.messages.create(model=MODEL, max_tokens=24, messages=question, **T0, stream=True):
        types.append(ev.type)
        if ev.type == "content_block_delta":
            pieces.append(ev.delta.text)
    check(types[:2] == ["message_start", "content_block_start"]
          and types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
          and set(types[2:-3]) == {"content_block_delta"} and len(pieces) > 3,
          f"stream event sequence: {types[:3]} ... {types[-3:]} ({len(types)} events)")
    check("".join(pieces) == text and all("\ufffd" not in p for p in pieces),
          f"streamed text_delta pieces assemble to the answer ({len(pieces)} pieces)")
    with client.messages.stream(model=MODEL, max_tokens=24, messages=question, **T0) as st:
        streamed = "".join(st.text_stream)
        final = st.get_final_message()
    check(streamed == text and final.stop_reason == "end_turn" and final.usage.output_tokens == n_new
          and final.usage.input_tokens + final.usage.cache_read_input_tokens == n_prompt,
          f"messages.stream: text, stop_reason {final.stop_reason}, usage {final.usage}")

    # Stop sequences and max_tokens.
    cut = text[:text.index("Paris")]
    m3 = client.messages.create(model=MODEL, max_tokens=24, messages=question, **T0,
                                stop_sequences=["zzz", "Paris"])
    check(m3.content[0].text == cut and m3.stop_reason == "stop_sequence" and m3.stop_sequence == "Paris",
          f"stop sequence: {m3.content[0].text!r} {m3.stop_reason} {m3.stop_sequence!r}")
    with client.messages.stream(model=MODEL, max_tokens=24, messages=question, **T0,
                                stop_sequences=["Paris"]) as st:
        s3 = "".join(st.text_stream)
        f3 = st.get_final_message()
    check(s3 == cut and f3.stop_reason == "stop_sequence" and f3.stop_sequence == "Paris",
          f"streamed stop sequence: {s3!r} {f3.stop_reason} {f3.stop_sequence!r}")
    # Greedy: at Anthropic's default temperature 1 the sampled story may end (EOS) within 5 tokens.
    m4 = client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Tell a story."}],
                                **T0)
    check(m4.stop_reason == "max_tokens" and m4.usage.output_tokens == 5, f"max_tokens: {m4.stop_reason} {m4.usage}")

    # Errors in Anthropic's shape.
    def err(fn):
        try:
            fn()
        except anthropic.APIStatusError as e:
            return e
        return None
    bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    e = err(lambda: bad.messages.create(model=MODEL, max_tokens=2, messages=question))
    check(isinstance(e, anthropic.AuthenticationError) and e.body.get("type") == "error"
          and e.body["error"]["type"] == "authentication_error", f"wrong key: {e and e.body}")
    e = err(lambda: client.messages.create(model=MODEL, max_tokens=2, messages=question,
                                           tools=[{"name": "t"}]))
    check(isinstance(e, anthropic.BadRequestError) and e.body["error"]["type"] == "invalid_request_error"
          and "tools.0.input_schema" in e.body["error"]["message"], f"a tool without its schema: {e and e.body}")
    e = err(lambda: client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]))
    check(isinstance(e, anthropic.BadRequestError) and "messages[0].content[0].type" in e.body["error"]["message"],
          f"image block refused: {e and e.body}")
    e = err(lambda: client.messages.create(model=MODEL, max_tokens=2, messages=question,
                                           thinking={"type": "enabled", "budget_tokens": 1024}))
    check(isinstance(e, anthropic.BadRequestError) and "thinking" in e.body["error"]["message"],
          f"a thinking budget over max_tokens refused: {e and e.body}")
    e = err(lambda: client.messages.create(model=MODEL, max_tokens=2, messages=question, output_config={
        "format": {"type": "xml"}}))
    check(isinstance(e, anthropic.BadRequestError) and "output_config.format.type" in e.body["error"]["message"],
          f"a structured output format other than json_schema: {e and e.body}")
    e = err(lambda: client.messages.create(model="other", max_tokens=2, messages=question))
    check(isinstance(e, anthropic.NotFoundError) and e.body["error"]["type"] == "not_found_error",
          f"unknown model: {e and e.body}")
    st, _, body = raw(server, "POST", "/v1/messages", '{"model": "demo", "messages": [')
    check(st == 400 and body.get("type") == "error", f"malformed JSON in Anthropic's shape: {st} {body}")
    # A proxy's own Authorization beside the right x-api-key: either header may carry the key.
    req = urllib.request.Request(server.url + "/v1/models", method="GET",
                                 headers={"Authorization": "Bearer proxy-token", "x-api-key": KEY})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            st = r.status
    except urllib.error.HTTPError as e:
        st = e.code
    check(st == 200, f"a wrong bearer beside the right x-api-key is accepted: {st}")


def stream_text(stream, n=1):
    """Texts and finish reasons of a streaming completion's n choices."""
    texts, finish = [""] * n, [None] * n
    for c in stream:
        for ch in c.choices:
            texts[ch.index] += ch.text or ""
            finish[ch.index] = ch.finish_reason or finish[ch.index]
    return texts, finish


def batching_checks(server):
    """Continuous batching (--max-batch BATCH): concurrent streams get the text they get alone,
    seeded sampling and n choices do not depend on the batch, a cancelled stream frees its slot,
    metrics and per-request log lines, and SIGTERM with a full batch."""
    cl = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    t_start = time.time()

    def one(prompt, tokens=32, **kw):
        return stream_text(cl.completions.create(model=MODEL, prompt=prompt, max_tokens=tokens, stream=True,
                                                 **{"temperature": 0, **kw}), kw.get("n", 1))

    alone = [one(p)[0][0] for p in PROMPTS[:BATCH]]
    m0 = metrics(server)
    pool = concurrent.futures.ThreadPoolExecutor(BATCH)
    together = [t[0][0] for t in pool.map(one, PROMPTS[:BATCH])]
    m1 = metrics(server)
    check(together == alone, f"{BATCH} concurrent streams each get the text they get alone at temperature 0"
          + ("" if together == alone else f": {together} vs {alone}"))
    steps = m1["coli_batch_size_count"] - m0["coli_batch_size_count"]
    seqs = m1["coli_batch_size_sum"] - m0["coli_batch_size_sum"]
    check(steps > 0 and seqs / steps > 1.5, f"the concurrent streams shared forward passes: {seqs / max(steps, 1):.2f}"
          f" sequences per pass over {steps:.0f} passes")

    # Seeded sampling: the same text alone or beside others; choice i of n uses seed + i.
    seeded = dict(temperature=0.9, top_p=0.95, seed=1234)
    solo = one(PROMPTS[0], 24, **seeded)[0][0]
    futs = [pool.submit(one, p, 24) for p in PROMPTS[1:BATCH]]
    mixed = one(PROMPTS[0], 24, **seeded)[0][0]
    [f.result() for f in futs]
    check(solo == mixed, f"a seeded request (temperature 0.9) gives the same text alone and in a batch: {solo!r}")
    texts, finish = one(PROMPTS[0], 24, n=3, **seeded)
    singles = [one(PROMPTS[0], 24, **{**seeded, "seed": 1234 + i})[0][0] for i in range(3)]
    check(texts == singles and finish == ["length"] * 3,
          f"n=3 gives 3 choices, choice i equal to a request seeded seed + i: {texts} vs {singles}")
    r = cl.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, n=2, temperature=0)
    check(len(r.choices) == 2 and r.choices[0].text == r.choices[1].text and r.usage.completion_tokens == 16,
          f"n=2 non-streaming at temperature 0: two equal choices, usage counts both: {r.usage}")

    # Prefix reuse with interleaved conversations: each follow-up turn reuses its own
    # conversation's KV although the other conversation ran in between (both share the chat
    # template's first tokens, which must not make one take the other's cache).
    convs = [[{"role": "user", "content": q}] for q in ("What is the capital of France?",
                                                        "Name three colours of the rainbow.")]
    firsts = []
    for conv in convs:
        r = cl.chat.completions.create(model=MODEL, messages=conv, max_tokens=12, temperature=0)
        conv += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "Tell me more."}]
        firsts.append(r.usage.prompt_tokens)
    for conv, first in zip(convs, firsts):
        r = cl.chat.completions.create(model=MODEL, messages=conv, max_tokens=4, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens
        check(cached >= first, f"interleaved conversations: the follow-up turn reuses its own KV "
              f"({cached} cached of {r.usage.prompt_tokens}; its first turn had {first})")

    # A cancelled stream frees its slot: BATCH long streams fill the batch, one more waits; closing
    # one running stream lets the waiting one start while the others still run.
    running = []
    for i in range(BATCH):
        s = cl.completions.create(model=MODEL, prompt=f"{LONG_PROMPT} {i},", max_tokens=LONG_TOKENS,
                                  temperature=0, stream=True)
        next(iter(s))
        running.append(s)
    waiting = cl.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=4, temperature=0, stream=True)
    check(wait_for(lambda: metrics(server)["coli_queue_depth"] == 1 and metrics(server)["coli_running_requests"]
                   == BATCH, 10), f"with {BATCH} streams running the next request waits")
    running.pop().close()
    t0 = time.time()
    text, fin = stream_text(waiting)
    elapsed = time.time() - t0
    # The worker retires the waiting request just after its last chunk: wait for that.
    check(fin == ["length"] and elapsed < 20
          and wait_for(lambda: metrics(server)["coli_running_requests"] == BATCH - 1, 10),
          f"closing a stream frees its slot: the waiting request ran ({elapsed:.2f} s, finish {fin}) beside "
          f"{BATCH - 1} still running")
    for s in running:
        s.close()
    check(wait_for(lambda: metrics(server)["coli_running_requests"] == 0, 10), "closed streams free every slot")

    # Metrics and the per-request log line.
    _, _, mtext = raw(server, "GET", "/metrics")
    names = {f.name for f in text_string_to_metric_families(mtext)}
    want = {"coli_batch_size", "coli_tokens_per_forward", "coli_inter_token_latency_seconds",
            "coli_prefill_step_seconds", "coli_decode_step_seconds", "coli_expert_bytes_per_generated_token",
            "coli_queue_wait_seconds", "coli_time_to_first_token_seconds"}
    check(want <= names, f"/metrics has {sorted(want - names) or 'the batching families'}")
    log = open(server.log_path).read()
    lines = [ln for ln in log.splitlines() if ln.startswith("coli serve: request ")]
    fields = ("status=", "prompt_tokens=", "cached_tokens=", "completion_tokens=", "queue_wait_s=", "ttft_s=",
              "tok_s=", "finish=")
    check(len(lines) >= 2 * BATCH + 8 and all(all(f in ln for f in fields) for ln in lines)
          and any("status=cancelled" in ln for ln in lines),
          f"one log line per request ({len(lines)}), e.g. {lines[0] if lines else None}")

    # SIGTERM with a full batch: running streams may finish within the grace period; the long ones
    # end with finish reason "abort"; nothing new is admitted; exit code 0.
    shorts = [pool.submit(one, PROMPTS[0], 6)]
    longs = [pool.submit(one, f"{LONG_PROMPT} {i},", LONG_TOKENS) for i in range(BATCH - 1)]
    check(wait_for(lambda: metrics(server)["coli_running_requests"] == BATCH, 10), "the batch is full")
    t0 = time.time()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        req = urllib.request.Request(server.url + "/v1/completions", method="POST",
                                     data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        urllib.request.urlopen(req, timeout=2)
        refused = False
    except urllib.error.HTTPError as e:
        refused = e.code == 503
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        refused = True
    check(refused, "after SIGTERM a new request is refused")
    short = shorts[0].result(timeout=30)
    long_fin = [f.result(timeout=30)[1][0] for f in longs]
    try:
        rc = server.proc.wait(timeout=GRACE + 10)
    except subprocess.TimeoutExpired:
        rc = None
    dt = time.time() - t0
    check(short[1] == ["length"] and long_fin == ["abort"] * (BATCH - 1),
          f"SIGTERM: the short stream finished ({short[1]}), the long ones ended with 'abort' ({long_fin})")
    check(rc == 0 and dt < GRACE + 8, f"SIGTERM with a full batch: exit code {rc} after {dt:.2f} s (grace {GRACE} s)")
    print(f"batching checks took {time.time() - t_start:.1f} s", flush=True)


# Input-grounded prompts: the continuation repeats what the prompt holds, so prompt lookup drafts.
GROUNDED = ["Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape.\n"
            "Copy: apple, banana, cherry, date, elderberry, fig, grape.\nCopy: apple, banana,",
            "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a,"]


def speculation_checks(plain, drafting):
    """Speculative decoding (prompt lookup, every proposal verified): the same text as a server
    that does not draft, greedy and seeded, alone and in a batch; the drafts show in /metrics."""
    mk = lambda s: openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120)  # noqa: E731
    cp, cd = mk(plain), mk(drafting)

    def text(cl, prompt, **kw):
        r = cl.completions.create(model=MODEL, prompt=prompt, max_tokens=40, **{"temperature": 0, **kw})
        return r.choices[0].text, r.usage.completion_tokens

    m0 = metrics(drafting)
    for prompt in GROUNDED:
        want = text(cp, prompt)
        got = text(cd, prompt)
        check(got == want, f"drafting gives the text of plain decoding: {got[0]!r} vs {want[0]!r}")
        seeded = dict(temperature=0.8, top_p=0.95, seed=99)
        check(text(cd, prompt, **seeded) == text(cp, prompt, **seeded),
              "a seeded request samples the same text with and without drafts")
    m1 = metrics(drafting)
    proposed = m1["coli_speculative_drafts_proposed_total"] - m0["coli_speculative_drafts_proposed_total"]
    accepted = m1["coli_speculative_drafts_accepted_total"] - m0["coli_speculative_drafts_accepted_total"]
    passes = m1["coli_tokens_per_decode_pass_count"] - m0["coli_tokens_per_decode_pass_count"]
    emitted = m1["coli_tokens_per_decode_pass_sum"] - m0["coli_tokens_per_decode_pass_sum"]
    check(proposed > 0 and 0 < accepted <= proposed,
          f"drafts proposed and accepted on input-grounded prompts: {accepted:.0f} of {proposed:.0f}")
    check(passes > 0 and emitted / passes > 1.2,
          f"decode passes emit more than one token each: {emitted / max(passes, 1):.2f} tokens per pass")
    check(0 < m1["coli_speculative_acceptance_rate"] <= 1, "the acceptance-rate gauge is set")
    # Drafting sequences in one batch: each gets its text alone.
    pool = concurrent.futures.ThreadPoolExecutor(len(GROUNDED) + 1)
    prompts = GROUNDED + PROMPTS[:1]
    together = list(pool.map(lambda p: text(cd, p), prompts))
    alone = [text(cp, p) for p in prompts]
    check(together == alone, "drafting sequences batched together get the text plain decoding gives each")
    m = metrics(plain)
    big = m["coli_tokens_per_forward_count"] - m['coli_tokens_per_forward_bucket{"le": "8.0"}']
    check(big > 0, f"a lone prompt of several 4-token chunks was prefilled in one step, layer by layer "
          f"({big:.0f} passes of more than 8 rows)")


def load_test(server):
    """50 requests from 8 concurrent clients: each answered correctly or with 429 (after which its
    client pauses 0.25 s). The first wave alone fills the engine and the queue, so at least
    MAX_QUEUE + 1 requests are answered."""
    n_req, n_clients = 50, 8
    rss0 = server.rss_bytes()
    m0 = metrics(server)
    cl = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)

    def one(i):
        t0 = time.time()
        try:
            if i % 2:
                s = cl.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Give me a word about the number {i}."}],
                    max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True})
            else:
                s = cl.completions.create(model=MODEL, prompt=f"Request {i}: the sky is", max_tokens=4,
                                          temperature=0, stream=True, stream_options={"include_usage": True})
            ttft, usage, finish, pieces = None, None, None, 0
            for c in s:
                if c.usage is not None:
                    usage = c.usage
                for ch in c.choices:
                    piece = ch.delta.content if i % 2 else ch.text
                    if piece and ttft is None:
                        ttft = time.time() - t0
                    pieces += bool(piece)
                    finish = ch.finish_reason or finish
            good = (usage is not None and 1 <= usage.completion_tokens <= 4 and finish in ("stop", "length")
                    and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens)
            return ("ok" if good else f"bad: {usage} {finish}"), ttft
        except openai.RateLimitError:
            time.sleep(0.25)
            return "429", None
        except Exception as e:  # noqa: BLE001 - any other outcome is a failure to report
            return f"error: {type(e).__name__}: {e}", None

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(n_clients) as ex:
        results = list(ex.map(one, range(n_req)))
    wall = time.time() - t0
    outcomes = [r for r, _ in results]
    ttfts = sorted(t for _, t in results if t is not None)
    n_ok, n_429 = outcomes.count("ok"), outcomes.count("429")
    bad = [o for o in outcomes if o not in ("ok", "429")]
    check(not bad and n_ok + n_429 == n_req and n_ok >= MAX_QUEUE + 1,
          f"load: {n_req} requests from {n_clients} clients in {wall:.1f} s: {n_ok} answered, {n_429} got 429"
          + (f", other: {bad[:3]}" if bad else ""))
    m1 = metrics(server)
    n_ttft = m1["coli_time_to_first_token_seconds_count"] - m0["coli_time_to_first_token_seconds_count"]
    ttft_sum = m1["coli_time_to_first_token_seconds_sum"] - m0["coli_time_to_first_token_seconds_sum"]
    wait_sum = m1["coli_queue_wait_seconds_sum"] - m0["coli_queue_wait_seconds_sum"]
    wait_n = m1["coli_queue_wait_seconds_count"] - m0["coli_queue_wait_seconds_count"]
    if ttfts:
        print(f"load: client TTFT p50 {ttfts[len(ttfts) // 2]:.3f} s, max {ttfts[-1]:.3f} s; server TTFT mean "
              f"{ttft_sum / max(n_ttft, 1):.3f} s of which queue wait {wait_sum / max(wait_n, 1):.3f} s", flush=True)
    check(n_ttft == n_ok, f"server TTFT histogram counted the {n_ok} answered requests: {n_ttft}")
    st, _, body = raw(server, "GET", "/health")
    check(st == 200 and body["queue_depth"] == 0 and body["running"] == 0, f"healthy after the load: {body}")
    time.sleep(0.5)
    rss1 = server.rss_bytes()
    check(abs(rss1 - rss0) < 50 << 20,
          f"RSS after the load {rss1 / 2**20:.1f} MiB within 50 MiB of before {rss0 / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
