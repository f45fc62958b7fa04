// coli web page: chat over the OpenAI endpoints, live figures from /web/api/state, the
// heat map from /web/api/experts. Plain JavaScript, no dependencies, nothing fetched from
// elsewhere (docs/WEB.md).
"use strict";

const STATE_POLL_MS = 1000;
const EXPERTS_POLL_MS = 2000;
// Figures are computed over the polls of the last WINDOW_MS.
const WINDOW_MS = 10000;
const HISTORY = 120;
const TIER_COLORS = { pinned: "#a06cff", cached: "#2ecc71", reading: "#f1c40f", disk: "#4a5568" };
// On disk, one colour per drive (0 the primary, then the mirrors).
const DRIVE_COLORS = ["#4a5568", "#2b6cb0", "#c05621", "#2f855a", "#b83280", "#6b46c1"];

const $ = (id) => document.getElementById(id);
const page = {
  key: sessionStorage.getItem("coli-api-key") || "",
  needKey: false,
  model: null,
  samples: [],       // [{t, s}] state polls, oldest first
  shown: {},         // last value of each figure (kept while idle)
  map: null,         // the last expert map
  conversations: [], // the conversations kept in this browser (see "chat" below)
  current: null,     // the id of the one shown
  abort: null,       // AbortController of the reply streaming now
  statePolls: 0,
  expertPolls: 0,
  failures: 0,       // polls failed in a row
  skip: 0,           // state polls still to skip (backing off)
  context: null,     // the server's context, tokens
};

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (page.key) h["Authorization"] = "Bearer " + page.key;
  return h;
}

// ---- formatting ----
function fmtBytes(b) {
  if (b == null || !isFinite(b)) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + u[i];
}
function fmtSecs(s) {
  if (s == null || !isFinite(s)) return "–";
  return s < 1 ? (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms" : s.toFixed(2) + " s";
}
function fmtNum(x, d) { return x == null || !isFinite(x) ? "–" : x.toFixed(d); }
function pct(x) { return (100 * x).toFixed(1) + "%"; }

function setStatus(text, cls) {
  const s = $("status");
  s.textContent = text;
  s.className = "status " + (cls || "");
}

// ---- API key ----
function askKey(refused) {
  page.needKey = true;
  $("key-panel").hidden = false;
  $("key-error").textContent = refused ? "The server refused this key." : "";
  setStatus("API key needed", "bad");
}
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  page.key = $("key-input").value.trim();
  sessionStorage.setItem("coli-api-key", page.key);
  page.needKey = false;
  $("key-panel").hidden = true;
  pollState();
  pollExperts();
});

// ---- polling ----
// A failed poll: the server is gone, or this page has a bug; either way it goes to the console
// (the browser test fails on console errors).
// Polls back off while the server cannot be reached (up to 16 polls skipped), and only the
// first failure of a run goes to the console.
function failed(err) {
  const unreachable = err instanceof TypeError && /fetch/i.test(err.message);
  setStatus(unreachable ? "server unreachable" : "page error", "bad");
  if (page.failures === 0) console.error("coli web:", err);
  page.failures++;
  page.skip = Math.min(16, 2 ** Math.min(4, page.failures));
  document.body.classList.add("stale");
  $("window").textContent = unreachable
    ? "server unreachable: the figures below are from before"
    : "the page failed to read the figures";
}

// A poll that reached the server ends a run of failures.
function reached() {
  if (page.failures > 0) console.info("coli web: the server answers again");
  page.failures = 0;
  page.skip = 0;
  document.body.classList.remove("stale");
}

// Whether this interval's poll is skipped (backing off after failures).
function backingOff() {
  if (page.skip > 0) {
    page.skip--;
    return true;
  }
  return false;
}

async function getJson(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401) {
    askKey(!!page.key);
    return null;
  }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function pollState(fromTimer) {
  if (page.needKey || page.statePending || (fromTimer && backingOff())) return;
  page.statePending = true;
  try {
    const s = await getJson("/web/api/state");
    reached();
    if (!s) return;
    page.context = s.server.context;
    page.statePolls++;
    document.body.dataset.statePolls = String(page.statePolls);
    setStatus("live", "ok");
    page.model = s.model;
    if (!s.server.chat_template && !page.modeSet) {
      // Without a chat template only completions make sense.
      $("mode").value = "completion";
      $("mode").querySelector("option[value=chat]").disabled = true;
      $("mode").title = "this model has no chat template: the page continues the text as typed (/v1/completions)";
    }
    page.modeSet = true;
    $("model").textContent = s.model;
    const sv = s.server;
    $("server-info").textContent =
      `context ${sv.context} tokens · max batch ${sv.max_batch} · ${sv.threads} threads · ` +
      `speculation ${sv.speculation}` + (sv.io_engine ? ` · ${sv.io_engine}` : "");
    page.samples.push({ t: s.at_ms, s });
    if (page.samples.length > HISTORY) page.samples.shift();
    drawFigures();
    drawPlan(s.plan);
    drawSpark();
  } catch (err) {
    failed(err);
  } finally {
    page.statePending = false;
  }
}

async function pollExperts() {
  if (page.needKey || page.expertsPending || page.failures > 0) return;
  page.expertsPending = true;
  try {
    const e = await getJson("/web/api/experts");
    if (!e || !e.map) return;
    page.expertPolls++;
    page.map = e.map;
    drawHeat();
  } catch (err) {
    failed(err);
  } finally {
    page.expertsPending = false;
  }
}

// ---- live figures ----
// The sample WINDOW_MS before the newest (or the oldest there is).
function windowStart() {
  const n = page.samples.length;
  const last = page.samples[n - 1];
  let i = n - 1;
  while (i > 0 && last.t - page.samples[i - 1].t <= WINDOW_MS) i--;
  return page.samples[i === n - 1 ? Math.max(0, n - 2) : i];
}

// One figure: recomputed when its denominator moved in the window, else the last value kept
// (so an idle server shows the figures of its last activity).
function figure(name, num, den, scale) {
  if (den > 0) page.shown[name] = (num / den) * (scale || 1);
  return page.shown[name];
}

function drawFigures() {
  const n = page.samples.length;
  const b = page.samples[n - 1].s;
  const a = n > 1 ? windowStart().s : b;
  const d = (f) => f(b) - f(a);
  const c = (s) => s.counters;
  const h = (s) => s.histograms;
  const gen = d((s) => c(s).completion_tokens);
  const fwd = d((s) => c(s).forward_s);
  const io = d((s) => c(s).io_wait_s);
  const processed = d((s) => c(s).prefill_tokens + c(s).completion_tokens);
  const active = fwd > 0;
  $("window").textContent = active
    ? "over the last " + Math.round((b.at_ms - a.at_ms) / 1000) + " s"
    : page.shown.tok_s == null ? "no activity yet" : "idle: figures of the last activity";

  $("fig-tok-s").textContent = fmtNum(figure("tok_s", gen, fwd), 2);
  $("fig-ttft").textContent = fmtSecs(figure("ttft", d((s) => h(s).ttft_s.sum), d((s) => h(s).ttft_s.count)));
  $("fig-itl").textContent = fmtSecs(figure("itl",
    d((s) => h(s).inter_token_latency_s.sum), d((s) => h(s).inter_token_latency_s.count)));
  $("fig-bytes-token").textContent = fmtBytes(figure("bpt", d((s) => c(s).expert_bytes_read), gen));
  $("fig-batch").textContent = fmtNum(figure("batch",
    d((s) => h(s).batch_size.sum), d((s) => h(s).batch_size.count)), 2);
  $("fig-queue").textContent = `${b.gauges.queue_depth} · ${b.gauges.running}`;
  // A prompt prefilling: tokens done / to do, so a long prefill shows it is moving.
  $("fig-prefill").textContent = b.gauges.prefill_total > 0
    ? `${b.gauges.prefill_done} / ${b.gauges.prefill_total}` : "–";
  $("fig-tokens").textContent =
    `${b.counters.completion_tokens} · ${b.counters.prompt_tokens} (${b.counters.cached_tokens})`;
  $("fig-drafts").textContent = b.counters.drafts_proposed > 0
    ? `${b.counters.drafts_accepted} / ${b.counters.drafts_proposed}` : "–";

  // Lookups by tier over the window (or since start while nothing moved).
  const tiers = ["pinned", "cached", "inflight", "miss"];
  let lk = tiers.map((t) => d((s) => c(s).lookups[t]));
  if (lk.every((x) => x === 0)) lk = tiers.map((t) => b.counters.lookups[t]);
  const total = lk.reduce((x, y) => x + y, 0);
  const tierColor = { pinned: TIER_COLORS.pinned, cached: TIER_COLORS.cached,
    inflight: TIER_COLORS.reading, miss: "#e05252" };
  const tierName = { pinned: "pinned", cached: "cached (LRU)", inflight: "read in flight",
    miss: "miss (read from disk)" };
  drawBar("hit-bar", "hit-legend", tiers.map((t, i) => ({
    label: `${tierName[t]} ${total ? pct(lk[i] / total) : "–"}`, value: lk[i], color: tierColor[t],
  })));
  $("hit-bar").dataset.total = String(total);

  // I/O wait vs compute per processed token.
  if (processed > 0) {
    page.shown.io_tok = io / processed;
    page.shown.compute_tok = Math.max(0, fwd - io) / processed;
  }
  drawBar("io-bar", "io-legend", [
    { label: "waiting for expert reads " + fmtSecs(page.shown.io_tok), value: page.shown.io_tok || 0, color: "#e05252" },
    { label: "compute " + fmtSecs(page.shown.compute_tok), value: page.shown.compute_tok || 0, color: "#4fd1c5" },
  ]);

  // Disk GiB/s per drive: bytes over forward-pass seconds in the window.
  const tbody = $("drives").querySelector("tbody");
  tbody.textContent = "";
  for (const dr of b.drives) {
    const before = (a.drives || []).find((x) => x.drive === dr.drive);
    const db = dr.bytes_read - (before ? before.bytes_read : 0);
    const gibs = figure("drive" + dr.drive, db, fwd, 1 / (1 << 30));
    const tr = document.createElement("tr");
    for (const v of [String(dr.drive) + (dr.in_rotation ? "" : " (out)"), dr.dir,
      fmtNum(gibs, 3), fmtBytes(dr.bytes_read)]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
}

// A legend: a colour swatch and a label per item ({label, color}).
function drawLegend(el, items) {
  el.textContent = "";
  for (const p of items) {
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = p.color;
    item.appendChild(sw);
    item.appendChild(document.createTextNode(p.label));
    el.appendChild(item);
  }
}

// A stacked bar of parts ({label, value, color}) and its legend.
function drawBar(barId, legendId, parts) {
  const bar = $(barId);
  const total = parts.reduce((x, p) => x + p.value, 0);
  bar.textContent = "";
  for (const p of parts) {
    const seg = document.createElement("div");
    seg.style.width = total > 0 ? (100 * p.value / total) + "%" : "0";
    seg.style.background = p.color;
    seg.title = p.label;
    bar.appendChild(seg);
  }
  drawLegend($(legendId), parts);
}

function drawSpark() {
  const cv = $("spark");
  const w = cv.clientWidth || 600;
  cv.width = w;
  const ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, cv.width, cv.height);
  const s = page.samples;
  const rates = [];
  for (let i = 1; i < s.length; i++) {
    const dt = (s[i].t - s[i - 1].t) / 1000;
    rates.push(dt > 0 ? (s[i].s.counters.completion_tokens - s[i - 1].s.counters.completion_tokens) / dt : 0);
  }
  const max = Math.max(1, ...rates);
  ctx.strokeStyle = "#f6a623";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  rates.forEach((r, i) => {
    const x = w - (rates.length - 1 - i) * (w / (HISTORY - 1));
    const y = cv.height - 4 - (r / max) * (cv.height - 14);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
  ctx.fillStyle = "#8a93a6";
  ctx.font = "11px sans-serif";
  ctx.fillText("max " + max.toFixed(1) + " tok/s", 4, 11);
}

// ---- memory plan ----
function drawPlan(plan) {
  if (!plan) return;
  const kvAll = plan.kv_per_sequence * plan.max_batch;
  // The LRU tier can hold at most the experts that are not pinned, whatever its budget.
  const unpinned = Math.max(0, plan.experts_on_disk - plan.pinned);
  const lruBudget = plan.expert_budget == null ? unpinned : Math.max(0, plan.expert_budget - plan.pinned);
  const lruUsed = Math.max(0, plan.expert_cache_used - plan.pinned);
  const parts = [
    { label: "dense " + fmtBytes(plan.dense), value: plan.dense, color: "#4299e1" },
    { label: "pinned experts " + fmtBytes(plan.pinned), value: plan.pinned, color: TIER_COLORS.pinned },
    { label: `expert cache ${fmtBytes(lruUsed)} of ${plan.expert_budget == null ? "unbounded" : fmtBytes(lruBudget)}` +
        (lruBudget > unpinned ? ` (the unpinned experts are ${fmtBytes(unpinned)})` : ""),
      value: Math.min(lruBudget, unpinned), color: TIER_COLORS.cached },
    { label: `KV cache ${plan.max_batch} × ${fmtBytes(plan.kv_per_sequence)} (${plan.sequences_in_use} in use)`,
      value: kvAll, color: "#ed8936" },
    { label: `prefix cache ${fmtBytes(plan.prefix_cache_used)} of ${fmtBytes(plan.prefix_cache_budget)}`,
      value: plan.prefix_cache_budget, color: "#d69e2e" },
  ];
  const planned = parts.reduce((x, p) => x + p.value, 0);
  drawBar("plan-bar", "plan-legend", parts);
  $("plan-note").textContent =
    `Planned ${fmtBytes(planned)}` +
    (plan.memory_limit != null
      ? ` of the ${fmtBytes(plan.memory_limit)} this process could use at start (${pct(planned / plan.memory_limit)}). `
      : ". ") +
    `Experts on disk ${fmtBytes(plan.experts_on_disk)}; the expert cache holds ` +
    `${plan.experts_on_disk > 0 ? pct(plan.expert_cache_used / plan.experts_on_disk) : "–"} of them now.`;
}

// ---- heat map ----
function heatColor(f) {
  // 0 -> dark blue-grey, 1 -> bright yellow, through red-orange.
  const stops = [[27, 33, 48], [120, 40, 90], [230, 80, 50], [250, 200, 60], [255, 250, 200]];
  const x = Math.max(0, Math.min(1, f)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const t = x - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function residencyColor(res, drive) {
  if (res === "disk") return DRIVE_COLORS[drive % DRIVE_COLORS.length];
  return TIER_COLORS[res] || "#000";
}

function heatGeometry(map) {
  const avail = Math.max(300, $("heat-wrap").clientWidth - 40);
  // Wide cells for a few experts per layer, down to 3 px for hundreds.
  const cap = map.experts <= 8 ? 64 : map.experts <= 32 ? 28 : 16;
  const cw = Math.max(3, Math.min(cap, Math.floor(avail / Math.max(1, map.experts))));
  const ch = Math.max(6, Math.min(18, cw));
  return { cw, ch, left: 36, top: 4 };
}

function drawHeat() {
  const map = page.map;
  const cv = $("heatmap");
  const g = heatGeometry(map);
  cv.width = g.left + map.experts * g.cw + 4;
  cv.height = g.top + map.layers.length * g.ch + 4;
  const ctx = cv.getContext("2d");
  ctx.clearRect(0, 0, cv.width, cv.height);
  let max = 0;
  for (const l of map.layers) for (const r of l.routed) max = Math.max(max, r);
  const lmax = Math.log1p(max);
  const counts = { pinned: 0, cached: 0, reading: 0, disk: 0 };
  ctx.font = "10px sans-serif";
  map.layers.forEach((l, row) => {
    const y = g.top + row * g.ch;
    ctx.fillStyle = "#8a93a6";
    if (g.ch >= 9 || row % 5 === 0) ctx.fillText("L" + l.layer, 2, y + g.ch - 2);
    for (let e = 0; e < map.experts; e++) {
      const res = l.residency[e];
      if (res == null) continue;
      counts[res]++;
      const x = g.left + e * g.cw;
      const strip = Math.max(2, Math.round(g.ch * 0.35));
      ctx.fillStyle = heatColor(lmax > 0 ? Math.log1p(l.routed[e]) / lmax : 0);
      ctx.fillRect(x, y, g.cw - 1, g.ch - strip - 1);
      ctx.fillStyle = residencyColor(res, l.drive[e]);
      ctx.fillRect(x, y + g.ch - strip - 1, g.cw - 1, strip);
    }
  });
  cv.dataset.routedTotal = String(map.routed_total);
  for (const [k, v] of Object.entries(counts)) cv.dataset[k] = String(v);
  cv.dataset.draws = String(page.expertPolls);
  $("heat-summary").textContent =
    `${map.layers.length} layers × ${map.experts} experts · ${map.routed_total} routings · ` +
    `pinned ${counts.pinned} · cached ${counts.cached} · reading ${counts.reading} · on disk ${counts.disk}`;
  const drives = new Set();
  for (const l of map.layers) l.residency.forEach((r, e) => { if (r === "disk") drives.add(l.drive[e]); });
  const legend = [
    { label: "routed: none → most (" + max + " tokens)", color: heatColor(1) },
    { label: "pinned", color: TIER_COLORS.pinned },
    { label: "cached", color: TIER_COLORS.cached },
    { label: "being read", color: TIER_COLORS.reading },
  ];
  for (const dr of [...drives].sort((x, y) => x - y)) {
    legend.push({ label: dr === 0 ? "on disk (primary)" : "on disk (mirror " + dr + ")", color: residencyColor("disk", dr) });
  }
  drawLegend($("heat-legend"), legend);
}

$("heatmap").addEventListener("mousemove", (ev) => {
  const map = page.map, tip = $("heat-tip");
  if (!map) return;
  const g = heatGeometry(map);
  const rect = ev.target.getBoundingClientRect();
  const sx = ev.target.width / rect.width, sy = ev.target.height / rect.height;
  const e = Math.floor(((ev.clientX - rect.left) * sx - g.left) / g.cw);
  const row = Math.floor(((ev.clientY - rect.top) * sy - g.top) / g.ch);
  const l = map.layers[row];
  if (!l || e < 0 || e >= map.experts || l.residency[e] == null) { tip.hidden = true; return; }
  const res = l.residency[e];
  const where = res === "disk" ? "on disk, drive " + l.drive[e] : res === "reading" ? "being read" : res;
  tip.textContent = `layer ${l.layer}, expert ${e}: ${l.routed[e]} tokens routed · ${where}`;
  tip.style.left = ev.clientX + 12 + "px";
  tip.style.top = ev.clientY + 12 + "px";
  tip.hidden = false;
});
$("heatmap").addEventListener("mouseleave", () => { $("heat-tip").hidden = true; });

// ---- chat ----
// Conversations are kept in this browser (localStorage `coli-conversations`): each is
// {id, title, system, messages (OpenAI chat messages, assistant tool_calls and tool results
// included; an assistant's reasoning kept in `reasoning` and not sent back), updated}.
const CONV_KEY = "coli-conversations";
const CONV_MAX = 50;

function loadConversations() {
  try {
    const list = JSON.parse(localStorage.getItem(CONV_KEY) || "[]");
    return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch (_) {
    return [];
  }
}

function saveConversations() {
  page.conversations.sort((a, b) => b.updated - a.updated);
  page.conversations.length = Math.min(page.conversations.length, CONV_MAX);
  try {
    localStorage.setItem(CONV_KEY, JSON.stringify(page.conversations));
  } catch (_) { /* storage full or off: the conversation lives on in this tab */ }
  drawConversations();
}

function current() {
  return page.conversations.find((c) => c.id === page.current) || null;
}

/// The conversation being written: the current one, or a new one from its first message.
function conversationFor(text) {
  let c = current();
  if (!c) {
    c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
      title: (text || "conversation").slice(0, 60), system: $("system").value, messages: [],
      updated: Date.now() };
    page.conversations.push(c);
    page.current = c.id;
  }
  return c;
}

function drawConversations() {
  const ul = $("conv-list");
  ul.textContent = "";
  for (const c of page.conversations) {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    if (c.id === page.current) li.className = "current";
    const t = document.createElement("span");
    t.className = "title";
    t.textContent = c.title;
    t.title = c.title;
    t.addEventListener("click", () => openConversation(c.id));
    const del = document.createElement("button");
    del.type = "button";
    del.textContent = "×";
    del.title = "delete this conversation";
    del.addEventListener("click", () => {
      page.conversations = page.conversations.filter((x) => x.id !== c.id);
      if (page.current === c.id) newChat();
      saveConversations();
    });
    li.append(t, del);
    ul.appendChild(li);
  }
}

function newChat() {
  if (page.abort) page.abort.abort();
  page.current = null;
  $("messages").textContent = "";
  drawConversations();
}

function openConversation(id) {
  if (page.abort) page.abort.abort();
  const c = page.conversations.find((x) => x.id === id);
  if (!c) return;
  page.current = id;
  $("system").value = c.system || "";
  $("messages").textContent = "";
  for (const m of c.messages) {
    if (m.role === "user") addMessage("user", m.content);
    else if (m.role === "tool") addToolResult(m);
    else if (m.role === "assistant") {
      const div = addMessage("assistant", "");
      setReply(div, m.content || "", m.reasoning || "");
      for (const tc of m.tool_calls || []) drawToolCall(div, tc, c);
      div.dataset.finish = m.finish || "stop";
    }
  }
  drawConversations();
}

// Markdown, rendered into DOM nodes (never as HTML): fenced code blocks (an unclosed one, while
// a reply streams, runs to the end), headings, `code`, **bold** and *italic*; the rest is text
// (the message keeps its line breaks).
function renderMarkdown(el, text) {
  el.textContent = "";
  const parts = text.split(/^```/m);
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const nl = part.indexOf("\n");
      const lang = nl >= 0 ? part.slice(0, nl).trim() : part.trim();
      let body = nl >= 0 ? part.slice(nl + 1) : "";
      if (body.endsWith("\n")) body = body.slice(0, -1);
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (lang) code.dataset.lang = lang;
      code.textContent = body;
      pre.appendChild(code);
      el.appendChild(pre);
      return;
    }
    // Text: the newline that followed a closing fence is part of the block's frame.
    if (i > 0 && part.startsWith("\n")) part = part.slice(1);
    const lines = part.split("\n");
    lines.forEach((line, j) => {
      const h = /^(#{1,6})\s+(.*)$/.exec(line);
      if (h) {
        const span = document.createElement("span");
        span.className = "h";
        inline(span, h[2]);
        el.appendChild(span);
      } else {
        inline(el, line);
      }
      if (j < lines.length - 1) el.appendChild(document.createTextNode("\n"));
    });
  });
}

function inline(el, text) {
  const re = /(`[^`\n]+`|\*\*[^*\n]+\*\*|\*[^*\s][^*\n]*\*)/g;
  let at = 0, m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > at) el.appendChild(document.createTextNode(text.slice(at, m.index)));
    const t = m[0];
    const node = document.createElement(t.startsWith("`") ? "code" : t.startsWith("**") ? "strong" : "em");
    node.textContent = t.startsWith("**") ? t.slice(2, -2) : t.slice(1, -1);
    el.appendChild(node);
    at = m.index + t.length;
  }
  if (at < text.length) el.appendChild(document.createTextNode(text.slice(at)));
}
window.coliRenderMarkdown = renderMarkdown;

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  if (role === "assistant") {
    // The reasoning, folded (click to read it).
    const r = document.createElement("details");
    r.className = "reasoning empty";
    const s = document.createElement("summary");
    s.textContent = "Reasoning";
    const body = document.createElement("div");
    body.className = "reasoning-text";
    r.append(s, body);
    div.appendChild(r);
  }
  const content = document.createElement("div");
  content.className = "content";
  if (role === "assistant") renderMarkdown(content, text);
  else content.textContent = text;
  div.dataset.raw = text;
  div.appendChild(content);
  const meta = document.createElement("div");
  meta.className = "meta";
  div.appendChild(meta);
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

/// Shows a reply's text (markdown) and reasoning in its message.
function setReply(div, text, reasoning) {
  div.dataset.raw = text;
  renderMarkdown(div.querySelector(".content"), text);
  const r = div.querySelector("details.reasoning");
  r.querySelector(".reasoning-text").textContent = reasoning;
  r.classList.toggle("empty", !reasoning);
}

/// A tool call of an assistant message: its name and arguments, and, until it has one, a form
/// for its result (sent as a `tool` message; the reply continues once every call has one).
function drawToolCall(div, tc, conv) {
  const box = document.createElement("div");
  box.className = "tool-call";
  box.dataset.id = tc.id;
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = tc.function.name;
  const args = document.createElement("div");
  args.className = "args";
  let shown = tc.function.arguments;
  try { shown = JSON.stringify(JSON.parse(shown), null, 1); } catch (_) { /* as sent */ }
  args.textContent = shown;
  const label = document.createElement("span");
  label.className = "tool-label";
  label.textContent = "tool call ";
  box.append(label, name, args);
  const answered = conv && conv.messages.some((m) => m.role === "tool" && m.tool_call_id === tc.id);
  if (conv && !answered) {
    const f = document.createElement("form");
    const input = document.createElement("input");
    input.className = "tool-result";
    input.placeholder = "the tool's result";
    const b = document.createElement("button");
    b.type = "submit";
    b.textContent = "Send result";
    f.append(input, b);
    f.addEventListener("submit", (e) => {
      e.preventDefault();
      if (page.abort) return;
      const result = { role: "tool", tool_call_id: tc.id, content: input.value };
      conv.messages.push(result);
      conv.updated = Date.now();
      f.remove();
      addToolResult(result);
      saveConversations();
      const pending = conv.messages.filter((m) => m.role === "assistant" && m.tool_calls)
        .flatMap((m) => m.tool_calls)
        .filter((c) => !conv.messages.some((m) => m.role === "tool" && m.tool_call_id === c.id));
      if (pending.length === 0) send(null);
    });
    box.appendChild(f);
  }
  div.insertBefore(box, div.querySelector(".meta"));
}

function addToolResult(m) {
  const div = document.createElement("div");
  div.className = "msg tool";
  div.dataset.raw = m.content;
  const label = document.createElement("span");
  label.className = "tool-label";
  label.textContent = "tool result (" + m.tool_call_id + ")\n";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = m.content;
  div.append(label, content);
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function readSse(buffer, onData) {
  let i;
  while ((i = buffer.indexOf("\n\n")) >= 0) {
    const event = buffer.slice(0, i);
    buffer = buffer.slice(i + 2);
    for (const line of event.split("\n")) {
      if (line.startsWith("data:")) onData(line.slice(5).trim());
    }
  }
  return buffer;
}

/// The tools field as sent: null when empty; throws with a message when not a JSON array.
function toolsField() {
  const t = $("tools").value.trim();
  if (!t) return null;
  let v;
  try { v = JSON.parse(t); } catch (e) { throw new Error("Tools: not JSON (" + e.message + ")"); }
  if (!Array.isArray(v)) throw new Error("Tools: expected a JSON array of tools");
  return v;
}

/// Sends `text` as the next user message (chat) or prompt (completion); `text` null continues a
/// chat after tool results.
async function send(text) {
  const temperature = Number($("temperature").value);
  // Empty: the server's default (until the reply or the context ends).
  const asked = Math.floor(Number($("max-tokens").value));
  const maxTokens = asked >= 1 ? asked : null;
  const chat = $("mode").value === "chat" || text == null;
  let tools = null;
  $("tools-error").textContent = "";
  if (chat) {
    try { tools = toolsField(); } catch (e) { $("tools-error").textContent = e.message; return; }
  }
  const conv = chat ? conversationFor(text) : null;
  if (chat) {
    conv.system = $("system").value;
    if (text != null) conv.messages.push({ role: "user", content: text });
    conv.updated = Date.now();
    saveConversations();
  }
  if (text != null) addMessage("user", text);
  const msg = addMessage("assistant", "");
  const meta = msg.querySelector(".meta");
  const t0 = performance.now();
  let first = null, tokens = null, finish = null, reply = "", reasoning = "";
  const calls = [];
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => { frame = 0; setReply(msg, reply, reasoning); });
  };
  page.abort = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  try {
    const common = { model: page.model, stream: true, temperature,
      stream_options: { include_usage: true } };
    if (maxTokens != null) common.max_tokens = maxTokens;
    let body;
    if (chat) {
      const sys = conv.system.trim() ? [{ role: "system", content: conv.system }] : [];
      const messages = sys.concat(conv.messages.map((m) => {
        const o = { role: m.role, content: m.content };
        if (m.tool_calls) o.tool_calls = m.tool_calls;
        if (m.tool_call_id) o.tool_call_id = m.tool_call_id;
        return o;
      }));
      body = Object.assign({ messages }, common);
      if (tools) {
        body.tools = tools;
        // A reply continued after tool results may answer in text: a forced choice applies
        // to the turn the user sent only.
        const choice = $("tool-choice").value;
        body.tool_choice = text == null && choice === "required" ? "auto" : choice;
      }
    } else {
      body = Object.assign({ prompt: text }, common);
    }
    const resp = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
      signal: page.abort.signal,
    });
    if (!resp.ok) {
      let m = "HTTP " + resp.status;
      try { m = (await resp.json()).error.message; } catch (_) { /* not JSON */ }
      if (resp.status === 401) askKey(!!page.key);
      throw new Error(m);
    }
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf = readSse(buf + dec.decode(value, { stream: true }), (data) => {
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new Error(obj.error.message);
        if (obj.usage) tokens = obj.usage.completion_tokens;
        const ch = obj.choices && obj.choices[0];
        if (!ch) return;
        const delta = ch.delta || {};
        const piece = chat ? delta.content : ch.text;
        if (piece) {
          if (first == null) first = performance.now();
          reply += piece;
          msg.dataset.raw = reply;
          redraw();
        }
        if (delta.reasoning_content) {
          if (first == null) first = performance.now();
          reasoning += delta.reasoning_content;
          redraw();
        }
        for (const tc of delta.tool_calls || []) {
          if (first == null) first = performance.now();
          const c = calls[tc.index] || (calls[tc.index] = { id: "", type: "function",
            function: { name: "", arguments: "" } });
          if (tc.id) c.id = tc.id;
          if (tc.function && tc.function.name) c.function.name += tc.function.name;
          if (tc.function && tc.function.arguments) c.function.arguments += tc.function.arguments;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
        $("messages").scrollTop = $("messages").scrollHeight;
      });
    }
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    setReply(msg, reply, reasoning);
    if (chat) {
      const m = { role: "assistant", content: reply, finish: finish || "stop" };
      if (reasoning) m.reasoning = reasoning;
      if (calls.length) m.tool_calls = calls.filter(Boolean);
      conv.messages.push(m);
      conv.updated = Date.now();
      saveConversations();
      for (const tc of m.tool_calls || []) drawToolCall(msg, tc, conv);
    }
    const secs = (performance.now() - t0) / 1000;
    const decode = first != null ? (performance.now() - first) / 1000 : 0;
    meta.textContent = [
      tokens != null ? tokens + " tokens" : null,
      first != null ? "first token after " + fmtSecs((first - t0) / 1000) : null,
      tokens > 1 && decode > 0 ? fmtNum((tokens - 1) / decode, 1) + " tok/s" : null,
      "finish: " + (finish || "?"),
      "total " + fmtSecs(secs),
    ].filter(Boolean).join(" · ");
    msg.dataset.finish = finish || "none";
  } catch (err) {
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    setReply(msg, reply, reasoning);
    if (page.abort) page.abort.abort();
    msg.classList.add("failed");
    const stopped = err.name === "AbortError";
    let why = err.message;
    if (err instanceof TypeError && /fetch/i.test(why)) why = "the server could not be reached";
    else if (err instanceof TypeError) why = "the connection to the server was lost (" + why + ")";
    if (chat && stopped && reply) {
      // A stopped reply stays in the conversation as far as it went.
      conv.messages.push({ role: "assistant", content: reply, finish: "stopped" });
      meta.textContent = "stopped (kept in the conversation as far as it went)";
    } else {
      // The exchange is left out of the conversation sent next.
      if (chat && text != null) conv.messages.pop();
      meta.textContent = (stopped ? "stopped" : "error: " + why) +
        (chat ? " (this exchange is left out of the conversation)" : "");
    }
    if (chat) saveConversations();
    msg.dataset.finish = stopped ? "stopped" : "error";
    $("messages").scrollTop = $("messages").scrollHeight;
  } finally {
    page.abort = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    pollState();
    pollExperts();
  }
}

$("chat-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || page.abort) return;
  if (page.needKey) {
    askKey(false);
    $("key-input").focus();
    return;
  }
  if (!page.model) {
    setStatus("no answer from the server yet", "bad");
    return;
  }
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("chat-form").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (page.abort) page.abort.abort(); });
$("new-chat").addEventListener("click", newChat);
page.conversations = loadConversations();
drawConversations();

async function start() {
  try {
    const r = await fetch("/web/api/info", { cache: "no-store" });
    const info = await r.json();
    if (info.needs_key && !page.key) {
      askKey(false);
    } else {
      pollState();
      pollExperts();
    }
  } catch (err) {
    failed(err);
  }
}

start();
setInterval(() => pollState(true), STATE_POLL_MS);
setInterval(() => { if (!document.hidden) pollExperts(); }, EXPERTS_POLL_MS);
