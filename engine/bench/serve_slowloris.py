#!/usr/bin/env python3
"""Slowloris benchmark of `coli serve` (issue 42): a normal client's latency with and without
1,000 slow connections held against the default limits (--max-connections 512,
--header-timeout 10).

The attacker runs in its own process: it keeps ATTACK connections open, each sending one byte
of a request head every DRIBBLE seconds (--dribble, default 10 as in the issue), and reopens
any the server closes (503, evicted to
make room, or the header timeout). The normal client sends REQUESTS requests one after the
other, each on a fresh connection (a chat completion of 8 tokens on the demo store, temperature
0), in three phases: alone, under the attack, alone again; it prints p50/p99 of each phase and
the ratio of the attacked p99 to the mean of the two quiet ones (target: <= 1.2). The two phases
alone bracket the attacked one, so drift of this shared machine shows as their difference.

Usage (repository root, after `cargo build -p coli-tools` and tests/serve/test_serve.py, which
builds the demo store):
  .venv-demo/bin/python engine/bench/serve_slowloris.py [--attack 1000] [--requests 200] [--dribble 10]
"""

import argparse
import json
import multiprocessing
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "serve"))
import test_serve as ts  # noqa: E402

DRIBBLE = 1.0
FAILURES = {}


def attacker(host, port, n, ready, stop, stats, dribble):
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nUser-Agent: slowloris\r\nAccept: */*\r\n\r\n"
    socks = {}
    opened = closed = 0

    def open_one(i):
        nonlocal opened
        try:
            s = socket.create_connection((host, port), timeout=2)
            s.setblocking(False)
            s.send(head[:1])
            socks[i] = [s, 1]
            opened += 1
        except OSError:
            socks.pop(i, None)

    for i in range(n):
        open_one(i)
    ready.set()
    while not stop.is_set():
        t = time.time()
        for i in range(n):
            e = socks.get(i)
            if e is None:
                open_one(i)
                continue
            s, sent = e
            try:
                d = s.recv(4096)
                if d == b"" or d.startswith(b"HTTP/1.1 503"):
                    raise OSError("closed")
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                closed += 1
                open_one(i)
                continue
            try:
                if sent < len(head) - 4:
                    s.send(head[sent:sent + 1])
                    e[1] += 1
            except OSError:
                pass
        stop.wait(max(0.0, dribble - (time.time() - t)))
    stats.put({"opened": opened, "closed_by_server": closed, "open_at_end": len(socks)})
    for e in socks.values():
        e[0].close()


def one_request(host, port, body):
    t = time.time()
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                  + body)
        data = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    ok = data.startswith(b"HTTP/1.1 200")
    if not ok:
        FAILURES[data[:12].decode("latin-1") or "closed"] = FAILURES.get(data[:12].decode("latin-1") or "closed", 0) + 1
    return time.time() - t, ok


def metrics(server):
    """The server's metrics (retried: under the attack, a request may be refused 503)."""
    for _ in range(20):
        try:
            return ts.metrics(server)
        except TypeError:
            time.sleep(0.2)
    return {}


def phase(host, port, body, n):
    lat, bad = [], 0
    for _ in range(n):
        dt, ok = one_request(host, port, body)
        lat.append(dt)
        bad += not ok
    lat.sort()
    return {"p50": lat[len(lat) // 2], "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))], "max": lat[-1],
            "failed": bad}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attack", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--dribble", type=float, default=10.0,
                    help="seconds between two bytes of each slow head (the issue's attack: 10)")
    a = ap.parse_args()
    global DRIBBLE
    DRIBBLE = a.dribble
    store = ts.demo_store()
    server = ts.Server(store, "--max-batch", "1", "--speculate", "off", log_name="serve-slowloris.log")
    host, port = server.url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    body = json.dumps({"model": ts.MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": 8, "temperature": 0}).encode()
    try:
        phase(host, port, body, 10)  # warm-up
        quiet1 = phase(host, port, body, a.requests)
        ready, stop = multiprocessing.Event(), multiprocessing.Event()
        stats = multiprocessing.Queue()
        p = multiprocessing.Process(target=attacker, args=(host, port, a.attack, ready, stop, stats, DRIBBLE))
        p.start()
        ready.wait(60)
        time.sleep(2.0)
        m0 = metrics(server)
        attacked = phase(host, port, body, a.requests)
        m1 = metrics(server)
        stop.set()
        st = stats.get(timeout=60)
        p.join(30)
        time.sleep(1)
        quiet2 = phase(host, port, body, a.requests)
    finally:
        server.stop()
    ref = (quiet1["p99"] + quiet2["p99"]) / 2
    ratio = attacked["p99"] / ref
    print(f"# {a.attack} slow connections, one byte every {DRIBBLE:g} s, reopened when closed; {a.requests} requests per phase")
    for name, r in (("alone", quiet1), (f"under {a.attack} slow connections", attacked), ("alone again", quiet2)):
        print(f"{name:34s} p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  max {r['max'] * 1000:7.1f} ms"
              f"  failed {r['failed']}/{a.requests}")
    print(f"failed requests by answer: {FAILURES}")
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("coli_http_connections_refused_total",
                                                 "coli_http_connections_evicted_total",
                                                 "coli_http_header_timeouts_total")}
    print(f"attacker: {st}; during the attacked phase: {d}; open connections "
          f"{m1.get('coli_http_connections_open', 0):.0f}")
    print(f"attacked p99 / quiet p99 (mean of both) = {ratio:.2f} (target <= 1.2): {'PASS' if ratio <= 1.2 else 'FAIL'}")


if __name__ == "__main__":
    main()
