#!/usr/bin/env python3
"""`coli serve` under abuse (issue 42): the connection cap, header/body timeouts and body limits,
against a real server on the demo store over loopback, every check bounded in time.

- Slowloris: 200 connections dribbling a request head (one byte every 0.5 s) against
  --max-connections 64 --header-timeout 3: a normal client still gets its reply within 2 s (it
  takes the slot of the connection that has waited longest for its head); every slow connection
  is answered 503 or closed (to make room, or by the header timeout, within it + 1 s).
- Every slot busy with a request whose body is still coming: a new connection is answered 503
  with Retry-After: 1 after the overflow wait; the slow bodies end 408.
- Connections answered and closed by the server whose clients neither read nor close hold no
  slot (the server's lingering close is outside the cap): a new client is served at once.
- 3,000 connection attempts, in rounds of 100 at once, each sending a whole request: each is
  answered (200) or refused (503 with Retry-After); a normal client is served after each round;
  the server's open descriptors return to their baseline.
- Bodies: a huge Content-Length is answered 413 at once (nothing sent), a truncated chunked
  body 400, a body sent at 1 byte/s 408 within --body-timeout (+1 s), a body over
  --max-body-bytes 413; on /v1/messages in Anthropic's error shape.
- A request head hyper cannot parse is answered 400 and logged; a 5,000-byte unknown path is
  clipped in the log line.
- Timeouts never cut a response: a streamed generation and a whole one longer than the header
  timeout finish (finish reason "length"); an idle keep-alive connection is closed after the
  header timeout.
- --send-timeout: a client that stops reading its stream is closed after it (the server's
  socket buffer made small with --send-buffer-bytes so that it fills quickly); a stream that
  waits on the model for longer, read normally, finishes.
- --max-connections beyond the open-file limit is refused at start, naming the flag.

Run from the repository root after `cargo build -p coli-tools` and tests/serve/test_serve.py
(which builds the demo store), with tests/serve/requirements.txt installed.
"""

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_serve as ts  # noqa: E402  (its main() runs only as a script)

CAP = 64
HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 2.0
MAX_BODY = 65536

failures = []
passed = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    (passed if cond else failures).append(what)


def addr(server):
    host, port = server.url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def request_bytes(method, path, body=None, extra=""):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n{extra}"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + (body.encode() if body is not None else b"")


def read_response(s, timeout):
    """(status, headers dict, body bytes) of one HTTP/1.1 response, or None on EOF/reset."""
    s.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            d = s.recv(65536)
            if not d:
                return None
            data += d
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(hdrs.get("content-length", "0"))
        while len(rest) < n:
            d = s.recv(65536)
            if not d:
                break
            rest += d
        return status, hdrs, rest
    except (ConnectionResetError, BrokenPipeError):
        return None


def normal_request(server, timeout=5.0):
    """Seconds a fresh connection takes to get GET /v1/models answered 200 (None if not)."""
    t = time.time()
    try:
        with socket.create_connection(addr(server), timeout=timeout) as s:
            s.sendall(request_bytes("GET", "/v1/models"))
            r = read_response(s, timeout)
    except OSError:
        return None
    return time.time() - t if r and r[0] == 200 else None


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def slowloris(server):
    head = request_bytes("GET", "/v1/models")
    m0 = ts.metrics(server)
    socks = []
    for _ in range(200):
        s = socket.create_connection(addr(server), timeout=5)
        s.sendall(head[:1])
        socks.append([s, 1, time.time(), None])  # socket, bytes sent, opened, outcome
    stop = threading.Event()

    def dribble():
        while not stop.is_set():
            for e in socks:
                if e[3] is None and e[1] < len(head) - 4:
                    try:
                        e[0].sendall(head[e[1]:e[1] + 1])
                        e[1] += 1
                    except OSError:
                        pass
            time.sleep(0.5)

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    time.sleep(1.0)
    latencies = [normal_request(server) for _ in range(5)]
    check(all(x is not None and x < 2.0 for x in latencies),
          f"slowloris: 200 slow connections against --max-connections {CAP}: a normal client served in "
          + ", ".join("none" if x is None else f"{x:.3f} s" for x in latencies))
    # Every slow connection ends: 503 at once, closed to make room, or closed by the header timeout.
    deadline = time.time() + HEADER_TIMEOUT + 3
    for e in socks:
        s = e[0]
        while e[3] is None and time.time() < deadline:
            try:
                s.settimeout(max(0.01, deadline - time.time()))
                d = s.recv(4096)
                e[3] = ("503" if d.startswith(b"HTTP/1.1 503") else ("eof" if not d else d[:12].decode("latin-1")),
                        time.time() - e[2])
            except socket.timeout:
                break
            except OSError:
                e[3] = ("reset", time.time() - e[2])
    stop.set()
    t.join()
    outcomes = {}
    for e in socks:
        k = e[3][0] if e[3] else "open"
        outcomes[k] = outcomes.get(k, 0) + 1
    late = [e[3][1] for e in socks if e[3] and e[3][0] in ("eof", "reset") and e[3][1] > HEADER_TIMEOUT + 1.0]
    m1 = ts.metrics(server)
    refused, evicted = (m1.get(k, 0) - m0.get(k, 0) for k in ("coli_http_connections_refused_total",
                                                                "coli_http_connections_evicted_total"))
    check(set(outcomes) <= {"503", "eof", "reset"} and outcomes.get("503", 0) == refused
          and refused + evicted >= 200 - CAP and not late,
          f"slowloris: every slow connection answered 503 ({refused} refused by the server) or closed (to make room: "
          f"{evicted}, or by --header-timeout {HEADER_TIMEOUT} s, + 1 s): {outcomes}"
          + (f", {len(late)} closed late (max {max(late):.1f} s)" if late else ""))
    for e in socks:
        e[0].close()


def busy_cap(server):
    """Every slot busy with a request (its head read, its body still coming): a new connection
    gets 503 with Retry-After: 1 after the overflow wait (0.5 s); those requests end 408."""
    slow = []
    for _ in range(CAP):
        s = socket.create_connection(addr(server), timeout=5)
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode())
        slow.append(s)
    time.sleep(0.3)
    t = time.time()
    with socket.create_connection(addr(server), timeout=5) as s:
        s.sendall(request_bytes("GET", "/v1/models"))
        r = read_response(s, 5)
    dt = time.time() - t
    body = json.loads(r[2]) if r else {}
    check(r is not None and r[0] == 503 and r[1].get("retry-after") == "1" and 0.4 < dt < 1.5
          and body.get("error", {}).get("code") == "too_many_connections",
          f"all {CAP} slots busy with requests: a new connection answered {r[0] if r else None} "
          f"(Retry-After {r[1].get('retry-after') if r else None}) after {dt:.2f} s: {body}")
    ends = [read_response(s, BODY_TIMEOUT + 3) for s in slow]
    check(all(e is not None and e[0] == 408 for e in ends),
          f"the {CAP} slow bodies answered 408: {sorted(set(e[0] if e else None for e in ends), key=str)}")
    for s in slow:
        s.close()
    check(ts.wait_for(lambda: normal_request(server) is not None, timeout=5), "then a normal client is served")


def closed_but_unread(server):
    """Connections answered with `Connection: close` whose clients neither read nor close
    (the server lingers on them) hold no slot: a new client is served at once."""
    held = []
    for _ in range(CAP):
        s = socket.create_connection(addr(server), timeout=5)
        s.sendall(request_bytes("GET", "/v1/models", extra="Connection: close\r\n"))
        held.append(s)
    time.sleep(0.5)
    lat = [normal_request(server) for _ in range(3)]
    check(all(x is not None and x < 0.5 for x in lat),
          f"{CAP} answered connections left unread and open: a new client served in "
          + ", ".join("none" if x is None else f"{x:.3f} s" for x in lat))
    for s in held:
        s.close()


def flood(server):
    pid = server.pid
    time.sleep(0.5)
    base = open_fds(pid)
    results = {"200": 0, "503": 0, "other": 0}
    retry_after_ok = True
    lock = threading.Lock()

    def one(_):
        nonlocal retry_after_ok
        try:
            with socket.create_connection(addr(server), timeout=10) as s:
                s.sendall(request_bytes("GET", "/v1/models", extra="Connection: close\r\n"))
                r = read_response(s, 10)
        except OSError:
            r = None
        with lock:
            if r and r[0] == 200:
                results["200"] += 1
            elif r and r[0] == 503:
                results["503"] += 1
                retry_after_ok &= r[1].get("retry-after") == "1"
            else:
                results["other"] += 1

    served_between = []
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(100) as ex:
        for _ in range(30):
            list(ex.map(one, range(100)))
            served_between.append(normal_request(server) is not None)
    wall = time.time() - t0
    check(results["other"] == 0 and results["200"] + results["503"] == 3000 and retry_after_ok,
          f"flood: 3000 connection attempts in 30 rounds of 100 ({wall:.1f} s): {results['200']} answered 200, "
          f"{results['503']} refused 503 with Retry-After: 1, {results['other']} neither")
    check(all(served_between), f"flood: a normal client served after each round ({sum(served_between)}/30)")
    ok = ts.wait_for(lambda: open_fds(pid) <= base + 2, timeout=HEADER_TIMEOUT + 3)
    check(ok, f"flood: open descriptors back to the baseline {base}: {open_fds(pid)}")


def bodies(server):
    # A huge Content-Length, nothing sent: 413 at once.
    for path in ("/v1/chat/completions", "/v1/messages"):
        with socket.create_connection(addr(server), timeout=5) as s:
            t = time.time()
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1000000000000000\r\n\r\n".encode())
            r = read_response(s, 5)
            dt = time.time() - t
        body = json.loads(r[2]) if r else {}
        shape = (body.get("type") == "error" and body["error"]["type"] == "request_too_large") \
            if path == "/v1/messages" else body.get("error", {}).get("code") == "request_too_large"
        check(r is not None and r[0] == 413 and dt < 1.0 and shape and r[1].get("connection") == "close",
              f"{path}: Content-Length 1e15 with no body: {r[0] if r else None} in {dt:.3f} s, {body}")
    # A body over --max-body-bytes without a Content-Length (chunked): 413 once it passes the limit.
    with socket.create_connection(addr(server), timeout=5) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n"
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"x" * 16384
        try:
            for _ in range(MAX_BODY // len(chunk) + 2):
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:
            pass
        r = read_response(s, 5)
    check(r is not None and r[0] == 413, f"chunked body over --max-body-bytes {MAX_BODY}: {r[0] if r else None}")
    # A truncated chunked body (the client closes its side mid-chunk): 400.
    with socket.create_connection(addr(server), timeout=5) as s:
        t = time.time()
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ts.KEY}\r\n"
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"mod".encode())
        s.shutdown(socket.SHUT_WR)
        r = read_response(s, 5)
        dt = time.time() - t
    check(r is not None and r[0] == 400 and dt < 2.0,
          f"truncated chunked body: {r[0] if r else None} in {dt:.3f} s: {r[2][:160] if r else b''}")
    # A body at 1 byte/s: 408 once it falls behind --body-min-rate after --body-timeout.
    body = json.dumps({"model": ts.MODEL, "messages": [{"role": "user", "content": "hi"}]})
    with socket.create_connection(addr(server), timeout=5) as s:
        t = time.time()
        s.sendall(request_bytes("POST", "/v1/chat/completions", body)[:-len(body)])
        r = None
        for ch in body:
            try:
                s.sendall(ch.encode())
            except OSError:
                break
            s.settimeout(1.0)
            try:
                if s.recv(1, socket.MSG_PEEK):
                    break
            except socket.timeout:
                pass
            except OSError:
                break
            if time.time() - t > BODY_TIMEOUT + 5:
                break
        r = read_response(s, 2)
        dt = time.time() - t
    check(r is not None and r[0] == 408 and dt < BODY_TIMEOUT + 1.5 and r[1].get("connection") == "close",
          f"body at 1 byte/s: {r[0] if r else None} after {dt:.1f} s (--body-timeout {BODY_TIMEOUT})")


def malformed(server):
    """A request head hyper cannot parse is answered 400 and logged; a long unknown path is
    clipped in the log line."""
    with socket.create_connection(addr(server), timeout=5) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost x\r\nBad Header Line\r\n\r\n")
        r = read_response(s, 5)
    check(r is not None and r[0] == 400, f"a malformed request head: {r[0] if r else None}")
    long_path = "/v1/" + "x" * 5000
    st, _, _ = ts.raw(server, "GET", long_path)
    check(st == 404, f"an unknown path of 5004 bytes: {st}")
    time.sleep(0.2)
    log = open(server.log_path).read()
    line = [ln for ln in log.splitlines() if "-> 404" in ln and "/v1/xxx" in ln]
    check("malformed request(s) refused by the HTTP layer -> 400" in log and line and len(line[-1]) < 1000,
          f"the log names the malformed head and clips the long path: {len(line[-1]) if line else None} characters")


def long_responses(server):
    """A generation longer than the header timeout is not cut, streamed or whole."""
    t = time.time()
    st, _, body = ts.raw(server, "POST", "/v1/completions", json.dumps(
        {"model": ts.MODEL, "prompt": ts.LONG_PROMPT, "max_tokens": 600, "temperature": 0}))
    dt = time.time() - t
    fin = body["choices"][0]["finish_reason"] if st == 200 else body
    check(st == 200 and fin == "length" and dt > HEADER_TIMEOUT,
          f"a whole generation of {dt:.1f} s (> --header-timeout {HEADER_TIMEOUT} s) finished: {fin}")
    with socket.create_connection(addr(server), timeout=30) as s:
        t = time.time()
        s.sendall(request_bytes("POST", "/v1/completions", json.dumps(
            {"model": ts.MODEL, "prompt": ts.LONG_PROMPT, "max_tokens": 600, "temperature": 0, "stream": True})))
        s.settimeout(30)
        data = b""
        while b"data: [DONE]" not in data:
            d = s.recv(65536)
            if not d:
                break
            data += d
        dt = time.time() - t
        fins = [json.loads(line[6:])["choices"][0].get("finish_reason") for line in data.decode().split("\n")
                if line.startswith("data: {")]
        check(b"data: [DONE]" in data and "length" in fins and dt > HEADER_TIMEOUT,
              f"a streamed generation of {dt:.1f} s (> --header-timeout) finished: {[f for f in fins if f]}")
        # The connection is kept alive after it, and closed once idle for the header timeout.
        t = time.time()
        s.settimeout(HEADER_TIMEOUT + 3)
        try:
            d = s.recv(1)
        except OSError:
            d = b""
        dt = time.time() - t
        check(d == b"" and HEADER_TIMEOUT - 0.5 < dt < HEADER_TIMEOUT + 1.5,
              f"an idle keep-alive connection closed after {dt:.1f} s (--header-timeout {HEADER_TIMEOUT})")


def send_timeout(store):
    """--send-timeout: a client that stops reading its stream is closed after the timeout
    (its socket's buffers full: the server's set small with --send-buffer-bytes so that it
    fills within a short generation), while a stream that waits on the model longer than the
    timeout, read normally, finishes."""
    server = ts.Server(store, "--max-batch", "2", "--speculate", "off", "--send-timeout", "2",
                       "--send-buffer-bytes", "4096", log_name="serve-send-timeout.log")
    try:
        body = json.dumps({"model": ts.MODEL, "prompt": ts.LONG_PROMPT, "max_tokens": 600,
                           "temperature": 0, "stream": True})
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        stalled.connect(addr(server))
        t = time.time()
        stalled.sendall(request_bytes("POST", "/v1/completions", body))
        # Meanwhile a reading client's stream, which waits on the model for longer than the
        # timeout, finishes.
        with socket.create_connection(addr(server), timeout=60) as s:
            s.sendall(request_bytes("POST", "/v1/completions", body))
            data = b""
            while b"data: [DONE]" not in data:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        check(b"data: [DONE]" in data and time.time() - t > 2,
              f"a stream read normally for {time.time() - t:.1f} s (> --send-timeout 2) finished")
        ok = ts.wait_for(lambda: ts.metrics(server).get("coli_http_send_timeouts_total", 0) >= 1, timeout=30)
        dt = time.time() - t
        stalled.close()
        log = open(server.log_path).read()
        check(ok and "(--send-timeout)" in log,
              f"a client that stopped reading its stream was closed by --send-timeout 2 ({dt:.1f} s after its request)")
        check(normal_request(server) is not None, "the server keeps serving")
    finally:
        server.stop()


def too_many_for_the_fd_limit(store):
    hard = subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
    # The hard limit itself leaves no room for the other descriptors; "unlimited" is capped by
    # the kernel's nr_open, far below u32::MAX.
    n = int(hard) if hard.isdigit() and int(hard) < 2**32 else 2**32 - 1
    r = subprocess.run([ts.COLI, "serve", "--store", store, "--port", "0", "--max-connections", str(n)],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--max-connections" in r.stderr and "ulimit" in r.stderr,
          f"--max-connections {n} over the open-file limit refused at start: {r.stderr.strip()[:200]}")


def main():
    store = ts.demo_store()
    server = ts.Server(store, "--max-batch", "2", "--max-connections", str(CAP),
                       "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
                       "--max-body-bytes", str(MAX_BODY), "--speculate", "off", log_name="serve-limits.log")
    try:
        bodies(server)
        malformed(server)
        long_responses(server)
        slowloris(server)
        busy_cap(server)
        closed_but_unread(server)
        flood(server)
        log = open(server.log_path).read()
        check("-> 408:" in log and "-> 413:" in log and "--max-connections 64 reached" in log,
              "the server log names the 408 and 413 refusals and the connection cap")
        m = ts.metrics(server)
        check(m.get("coli_http_connections_refused_total", 0) > 0
              and m.get("coli_http_connections_evicted_total", 0) > 0
              and m.get("coli_http_header_timeouts_total", 0) > 0,
              "metrics count refused, evicted and timed-out connections: "
              + ", ".join(f"{k}={v}" for k, v in m.items() if k.startswith("coli_http_")))
    finally:
        server.stop()
    send_timeout(store)
    too_many_for_the_fd_limit(store)
    print(f"serve limits: {len(passed)} passed, {len(failures)} failed")
    if failures:
        print("server log (tail):\n" + open(server.log_path).read()[-3000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
