#!/usr/bin/env python3
"""`coli web` in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by selenium through the system chromedriver, kept off the network) against a real
`coli serve --web` on the demo store (built or reused as tests/serve/test_serve.py does, with an
API key).

Checks:
- the page and its assets load without the key (Content-Security-Policy 'self' only); the data
  endpoints answer 401 without it; the page asks for the key and shows no data until it is given;
  a wrong key is refused on the page;
- with the key: the live figures, the memory plan and the heat map are drawn;
- a chat message streams its reply (the text grows while the request runs) and the reply equals
  the non-streaming API's answer to the same messages at temperature 0;
- markdown is rendered as nodes; conversations are kept in the browser, listed and reopened
  after a reload; a system prompt is sent first; a forced tool call is shown as a call, its
  result sent back and shown, and the reply continues; a reply's reasoning is folded;
- after the request the figures (tokens, lookups by tier) and the heat map (tokens routed)
  change;
- the browser console has no error of the page's own (the wrong-key phase's 401s aside), and
  the page made no request outside the server;
- a screenshot is written to $COLI_WEB_ARTIFACTS (default $CARGO_TARGET_DIR/web-test);
- when the server stops, the page says it is unreachable and marks its figures stale.

Run from the repository root after `cargo build -p coli-convert -p coli-tools`, with the packages
of tools/demo/requirements.txt (--no-deps), tests/serve/requirements.txt and
tests/web/requirements.txt installed. Without /usr/bin/chromium and /usr/bin/chromedriver it
fails, naming the packages (tools/test.sh skips it then, unless COLI_WEB_REQUIRED=1).
"""

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve"))
from test_serve import KEY, MODEL, TARGET, Server, demo_store  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MAX_TOKENS = 40
PROMPT = "Write a short poem about the sea."
COMPLETION_PROMPT = "The three primary colours are"

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def get(server, path, key=None):
    """(status, headers, body bytes)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(server.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def api_answer(server, messages=None, prompt=None):
    """The non-streaming answer at temperature 0: chat to `messages`, or completion of `prompt`."""
    req = {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS}
    req.update({"messages": messages} if messages is not None else {"prompt": prompt})
    path = "/v1/chat/completions" if messages is not None else "/v1/completions"
    req = urllib.request.Request(server.url + path, data=json.dumps(req).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
        return choice["message"]["content"] if messages is not None else choice["text"]


def wait_for(what, cond, timeout=60.0, every=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"FAIL timed out after {timeout:.0f} s waiting for {what}")


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-default-apps", "--disable-extensions", "--disable-sync",
                 "--no-first-run", "--no-default-browser-check", "--metrics-recording-only",
                 "--disable-domain-reliability", "--disable-client-side-phishing-detection",
                 "--window-size=1400,2000"]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The system chromedriver: selenium must not look for (or download) one.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


def severe(logs):
    return [e for e in logs if e.get("level") == "SEVERE"]


def main():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        msg = (f"{CHROMIUM} or {CHROMEDRIVER} is missing: install Debian's chromium and "
               "chromium-driver (apt-get install chromium chromium-driver), as .ci/run does")
        raise SystemExit("FAIL " + msg)
    os.environ["SE_OFFLINE"] = "true"
    artifacts = os.environ.get("COLI_WEB_ARTIFACTS") or os.path.join(TARGET, "web-test")
    os.makedirs(artifacts, exist_ok=True)
    store = demo_store()
    # A 12 MiB expert budget (the demo's experts are 43 MiB): the heat map shows experts in RAM
    # and on disk.
    server = Server(store, "--web", "--no-kv-disk", "--ram-budget", "12MiB", log_name="web.log")
    driver = None
    try:
        # --- without a browser: what loads without the key and what does not
        for path, ctype in [("/", "text/html"), ("/web/app.js", "text/javascript"),
                            ("/web/style.css", "text/css"), ("/web/favicon.svg", "image/svg+xml")]:
            status, hdrs, _ = get(server, path)
            check(status == 200 and hdrs.get("Content-Type", "").startswith(ctype),
                  f"{path} loads without the key ({status} {hdrs.get('Content-Type')})")
        _, hdrs, _ = get(server, "/")
        csp = hdrs.get("Content-Security-Policy", "")
        check("default-src 'none'" in csp and "connect-src 'self'" in csp,
              f"the page's Content-Security-Policy allows only this server ({csp})")
        status, _, body = get(server, "/web/api/info")
        check(status == 200 and json.loads(body) == {"needs_key": True},
              "/web/api/info says a key is needed")
        for path in ["/web/api/state", "/web/api/experts"]:
            status, _, _ = get(server, path)
            check(status == 401, f"{path} without the key: 401 ({status})")
            status, _, _ = get(server, path, key="wrong")
            check(status == 401, f"{path} with a wrong key: 401 ({status})")
        status, _, body = get(server, "/web/api/state", key=KEY)
        state = json.loads(body)
        check(status == 200 and state["model"] == MODEL and state["plan"]["dense"] > 0,
              "/web/api/state with the key: the model and the memory plan")

        # --- the page in Chromium
        driver = browser()
        by_id = driver.find_element
        from selenium.webdriver.common.by import By

        def el(i):
            return by_id(By.ID, i)

        def attr(i, name):
            return driver.execute_script(f"return document.getElementById('{i}').dataset.{name} || null")

        driver.get(server.url + "/")
        wait_for("the key panel", lambda: el("key-panel").is_displayed(), 20)
        check(True, "the page asks for the key")
        time.sleep(1.5)
        check(el("model").text == "…" and attr("heatmap", "draws") is None,
              "no data is shown before the key is given")
        check(severe(driver.get_log("browser")) == [], "no console error before the key")

        el("key-input").send_keys("wrong-key")
        el("key-form").submit()
        wait_for("the refusal of a wrong key",
                 lambda: "refused" in el("key-error").text and el("key-panel").is_displayed(), 20)
        check(True, "a wrong key is refused on the page")
        wrong = severe(driver.get_log("browser"))
        check(all("401" in e["message"] for e in wrong),
              f"the wrong key's console errors are its 401s only ({wrong})")

        el("key-input").clear()
        el("key-input").send_keys(KEY)
        el("key-form").submit()
        wait_for("the figures", lambda: (attr("heatmap", "draws") or "0") != "0"
                 and el("model").text == MODEL, 30)
        check(not el("key-panel").is_displayed(), "the key is accepted and the panel hidden")
        check(el("plan-bar").find_elements(By.TAG_NAME, "div") != [], "the memory plan is drawn")
        tokens_before = el("fig-tokens").text
        routed_before = int(attr("heatmap", "routedTotal"))
        lookups_before = int(attr("hit-bar", "total") or 0)
        polls_before = int(driver.execute_script("return document.body.dataset.statePolls || 0"))

        # --- chat: the reply streams and equals the API's answer
        el("temperature").clear()
        el("temperature").send_keys("0")
        el("max-tokens").clear()
        el("max-tokens").send_keys(str(MAX_TOKENS))
        el("prompt").send_keys(PROMPT)
        el("send").click()
        partial = set()

        def finished():
            r = driver.execute_script(
                "const m = [...document.querySelectorAll('.msg.assistant')].pop();"
                "return m ? [m.dataset.finish || null, m.dataset.raw] : null")
            if r and r[0] is None and r[1]:
                partial.add(r[1])
            return r if r and r[0] is not None else None

        finish, reply = wait_for("the reply", finished, 180, every=0.02)
        check(finish in ("stop", "length"), f"the reply finished ({finish})")
        check(len(partial) >= 2 and all(reply.startswith(p) for p in partial),
              f"the reply streamed: {len(partial)} partial texts seen, each a prefix of the reply")
        expected = api_answer(server, messages=[{"role": "user", "content": PROMPT}])
        check(reply == expected, f"the page's reply equals the API's answer ({reply!r} vs {expected!r})")
        meta = driver.execute_script(
            "return [...document.querySelectorAll('.msg.assistant')].pop().querySelector('.meta').textContent")
        check("tokens" in meta and "tok/s" in meta, f"the reply's line gives tokens and tok/s ({meta})")

        # --- completion mode: the text as typed, continued as /v1/completions continues it
        from selenium.webdriver.support.select import Select
        Select(el("mode")).select_by_value("completion")
        el("prompt").send_keys(COMPLETION_PROMPT)
        el("send").click()
        wait_for("the second reply", lambda: driver.execute_script(
            "return document.querySelectorAll('.msg.assistant[data-finish]').length") == 2, 180)
        completion = driver.execute_script(
            "return [...document.querySelectorAll('.msg.assistant')].pop().dataset.raw")
        expected = api_answer(server, prompt=COMPLETION_PROMPT)
        check(completion == expected and completion,
              f"completion mode: the reply equals /v1/completions' text ({completion!r} vs {expected!r})")

        # --- the figures and the heat map changed
        wait_for("the figures after the request",
                 lambda: el("fig-tokens").text != tokens_before
                 and int(attr("heatmap", "routedTotal")) > routed_before
                 and int(driver.execute_script("return document.body.dataset.statePolls || 0")) > polls_before + 1,
                 30)
        check(True, f"tokens figure changed ({tokens_before!r} -> {el('fig-tokens').text!r})")
        check(int(attr("heatmap", "routedTotal")) > routed_before,
              f"heat map: tokens routed grew ({routed_before} -> {attr('heatmap', 'routedTotal')})")
        check(int(attr("hit-bar", "total") or 0) > lookups_before, "expert lookups by tier grew")
        tiers = {t: int(attr("heatmap", t) or 0) for t in ["pinned", "cached", "reading", "disk"]}
        check(sum(tiers.values()) == 120 and tiers["disk"] > 0 and tiers["pinned"] + tiers["cached"] > 0,
              f"heat map: the demo's 120 experts, some in RAM and some on disk ({tiers})")
        for fig in ["fig-tok-s", "fig-ttft", "fig-itl", "fig-bytes-token", "fig-batch"]:
            check(el(fig).text not in ("", "–"), f"{fig} shows a value ({el(fig).text})")
        check(len(el("drives").find_elements(By.CSS_SELECTOR, "tbody tr")) == 1,
              "one drive row (no mirrors)")

        Select(el("mode")).select_by_value("chat")

        # --- markdown is rendered (as DOM nodes, never as HTML)
        md = driver.execute_script(
            "const d = document.createElement('div');"
            "coliRenderMarkdown(d, '# Title\\nSay **hi** and `x<b>`\\n```py\\nprint(1)\\n```\\n*end*');"
            "return [d.querySelector('.h').textContent, d.querySelector('strong').textContent,"
            " d.querySelector('code').textContent, d.querySelector('pre code').textContent,"
            " d.querySelector('pre code').dataset.lang, d.querySelector('em').textContent,"
            " d.querySelectorAll('b').length]")
        check(md == ["Title", "hi", "x<b>", "print(1)", "py", "end", 0],
              f"markdown: heading, bold, inline code, a fenced code block, italics; no HTML ({md})")

        # --- the conversation is kept in the browser, listed, and comes back after a reload
        check(len(el("conv-list").find_elements(By.TAG_NAME, "li")) == 1, "the chat is listed as a conversation")
        driver.refresh()
        wait_for("the page after a reload", lambda: el("model").text not in ("", "…"), 30)
        items = el("conv-list").find_elements(By.CSS_SELECTOR, "li .title")
        check(len(items) == 1 and items[0].text == PROMPT[:60], f"after a reload the conversation is listed ({[i.text for i in items]})")
        items[0].click()
        shown = driver.execute_script(
            "return [...document.querySelectorAll('#messages .msg')].map(m => [m.className, m.dataset.raw])")
        check(shown == [["msg user", PROMPT], ["msg assistant", reply]],
              f"the conversation opens with its messages ({shown})"[:300])

        def last_reply(n):
            wait_for(f"reply {n}", lambda: driver.execute_script(
                "return document.querySelectorAll('.msg.assistant[data-finish]').length") == n, 180)
            return driver.execute_script("return [...document.querySelectorAll('.msg.assistant')].pop().dataset.raw")

        # --- a system prompt: a new chat sends it first (the reload emptied max tokens: set it
        # again, or a reply without EOS runs to the context's end and the API's stops at 40)
        el("new-chat").click()
        el("settings").find_element(By.TAG_NAME, "summary").click()
        el("max-tokens").clear()
        el("max-tokens").send_keys(str(MAX_TOKENS))
        system = "You answer in exactly one sentence."
        el("system").send_keys(system)
        el("prompt").send_keys(PROMPT)
        el("send").click()
        got = last_reply(1)
        expected = api_answer(server, messages=[{"role": "system", "content": system},
                                                {"role": "user", "content": PROMPT}])
        check(got == expected, f"with a system prompt, the reply equals the API's ({got!r} vs {expected!r})")

        # --- tools: a forced call is shown as a call; its result goes back; the reply continues
        el("new-chat").click()
        el("system").clear()
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}]
        el("tools").send_keys(json.dumps(tools))
        Select(el("tool-choice")).select_by_value("required")
        el("prompt").send_keys("What is the weather in Paris?")
        el("send").click()
        last_reply(1)
        box = wait_for("the tool call box", lambda: (driver.find_elements(By.CSS_SELECTOR, ".msg.assistant .tool-call")
                                                     or [None])[0], 30)
        name = box.find_element(By.CSS_SELECTOR, ".name").text
        args = json.loads(box.find_element(By.CSS_SELECTOR, ".args").text)
        finish = driver.execute_script("return [...document.querySelectorAll('.msg.assistant')].pop().dataset.finish")
        check(name == "get_weather" and isinstance(args.get("city"), str) and finish == "tool_calls",
              f"a forced tool call is shown as a call: {name} {args} (finish {finish})")
        Select(el("tool-choice")).select_by_value("none")
        box.find_element(By.CSS_SELECTOR, "input.tool-result").send_keys("18 C and sunny")
        box.find_element(By.CSS_SELECTOR, "button").click()
        last_reply(2)
        stored = driver.execute_script(
            "const c = JSON.parse(localStorage.getItem('coli-conversations'))"
            ".find(c => c.messages.some(m => m.tool_calls)); return c.messages.map(m => m.role)")
        results = driver.execute_script("return [...document.querySelectorAll('.msg.tool')].map(m => m.dataset.raw)")
        check(stored == ["user", "assistant", "tool", "assistant"] and results == ["18 C and sunny"],
              f"the tool result is shown and the reply continued after it ({stored}, {results})")
        Select(el("tool-choice")).select_by_value("auto")
        el("tools").clear()

        # --- reasoning is folded (a stored conversation with a reasoning reply)
        driver.execute_script(
            "const l = JSON.parse(localStorage.getItem('coli-conversations'));"
            "l.push({id: 'r1', title: 'reasoning', system: '', updated: 1, messages: ["
            " {role: 'user', content: 'q'}, {role: 'assistant', content: 'a', reasoning: 'because', finish: 'stop'}]});"
            "localStorage.setItem('coli-conversations', JSON.stringify(l));")
        driver.refresh()
        wait_for("the page after a reload", lambda: el("model").text not in ("", "…"), 30)
        titles = [t.text for t in el("conv-list").find_elements(By.CSS_SELECTOR, "li .title")]
        check(len(titles) == 4, f"four conversations listed ({titles})")
        driver.find_element(By.CSS_SELECTOR, "#conv-list li[data-id='r1'] .title").click()
        folded = driver.execute_script(
            "const d = document.querySelector('.msg.assistant details.reasoning');"
            "return [d.open, d.classList.contains('empty'), d.querySelector('summary').textContent,"
            " d.querySelector('.reasoning-text').textContent]")
        check(folded == [False, False, "Reasoning", "because"], f"reasoning is shown folded ({folded})")

        shot = os.path.join(artifacts, "coli-web.png")
        driver.save_screenshot(shot)
        check(os.path.getsize(shot) > 10_000, f"screenshot written: {shot}")

        logs = severe(driver.get_log("browser"))
        check(logs == [], f"no console error after the key ({logs})")
        origin = server.url.rstrip("/")
        urls = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        outside = [u for u in urls if not u.startswith(origin)]
        check(outside == [], f"the page made no request outside the server ({outside})")

        # --- the server goes away: the page says so and greys its figures
        server.stop()
        wait_for("the page to notice the server is gone", lambda: "unreachable" in el("status").text
                 and driver.execute_script("return document.body.classList.contains('stale')"), 30)
        check("from before" in el("window").text,
              f"server gone: the page says so and marks the figures stale ({el('window').text!r})")
    finally:
        if driver is not None:
            driver.quit()
        server.stop()
    if failures:
        shutil.copy(server.log_path, os.path.join(artifacts, "web.log"))
        print(f"{len(failures)} web check(s) failed; server log: {server.log_path}")
        sys.exit(1)
    print("tests/web/test_web.py: all checks passed")


if __name__ == "__main__":
    main()
