// sglpy web console: playground, dashboard, request traces. No framework, no build step, no inline script.
// Everything the server or a user wrote is rendered with textContent (never as markup): prompts and outputs
// are untrusted. The API key lives in sessionStorage (or localStorage when "remember" is ticked) and is sent
// as a Bearer header only.
"use strict";

const KEY_NAME = "sglpy-api-key";
const ORIGIN_NAMES = { cached: "cached", prefilled: "prefilled", sampled: "sampled", jump_forward: "jump-forward" };
const EXAMPLES = {
  json_schema: JSON.stringify({
    type: "object",
    properties: { name: { type: "string", maxLength: 24 }, age: { type: "integer", minimum: 0, maximum: 120 },
      city: { type: "string", maxLength: 24 } },
    required: ["name", "age", "city"],
  }, null, 2),
  regex: "(yes|no), because [a-z ]{1,40}\\.",
  ebnf: 'root ::= "The answer is " ("yes" | "no") "."',
  choices: "red\ngreen\nblue",
  "": "",
};

const $ = (id) => document.getElementById(id);
let controller = null; // the running playground request's AbortController
let lastRecord = null; // the playground's last trace record
let dashTimer = null;

// ------------------------------------------------------------------ API key and requests
function getKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

function setKey(key, remember) {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  if (key) (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

function askKey(message) {
  $("key-panel").hidden = false;
  $("key-status").textContent = message || "";
  $("key-input").focus();
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, body, signal) {
  const headers = {};
  const key = getKey();
  if (key) headers.Authorization = "Bearer " + key;
  const opts = { method: body === undefined ? "GET" : "POST", headers, signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  if (resp.status === 401) {
    askKey(key ? "The server refused this key." : "");
    throw new ApiError(401, "the server needs its API key");
  }
  if (!resp.ok) {
    let message = resp.status + " " + resp.statusText;
    try { message = (await resp.json()).error.message; } catch (e) { /* not a JSON error body */ }
    throw new ApiError(resp.status, message);
  }
  return resp;
}

// ------------------------------------------------------------------ rendering helpers
function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function tokenSpan(tok) {
  const span = el("span", tok.text, "tok o-" + tok.origin);
  let title = ORIGIN_NAMES[tok.origin] || tok.origin;
  if (tok.id !== undefined && tok.id !== null) title += " · id " + tok.id;
  if (tok.logprob !== undefined && tok.logprob !== null) title += " · logprob " + Number(tok.logprob).toFixed(3);
  span.title = title;
  span.dataset.origin = tok.origin;
  return span;
}

function renderTokens(container, tokens) {
  container.replaceChildren(...tokens.map(tokenSpan));
}

function ms(seconds) { return (seconds * 1000).toFixed(1); }

// ------------------------------------------------------------------ tabs
function showTab(name) {
  for (const id of ["playground", "dashboard", "traces"]) {
    $(id).hidden = id !== name;
    $("tab-" + id).classList.toggle("active", id === name);
  }
  if (dashTimer) { clearInterval(dashTimer); dashTimer = null; }
  if (name === "dashboard") { refreshDashboard(); dashTimer = setInterval(refreshDashboard, 1000); }
  if (name === "traces") refreshTraces();
}

// ------------------------------------------------------------------ playground
function constraintValue() {
  const kind = $("constraint-kind").value;
  const raw = $("constraint").value;
  if (kind === "choices") return raw.split("\n").map((s) => s.trim()).filter((s) => s);
  return raw;
}

let checkTimer = null;
let checkSeq = 0;
function scheduleCheck() {
  clearTimeout(checkTimer);
  checkTimer = setTimeout(checkConstraint, 350);
}

async function checkConstraint() {
  const kind = $("constraint-kind").value;
  const status = $("constraint-status");
  const seq = ++checkSeq;
  status.className = "muted";
  if (!kind) { status.textContent = "no constraint"; return; }
  status.textContent = "compiling…";
  try {
    const out = await (await api("/console/api/compile", { kind, value: constraintValue() })).json();
    if (seq !== checkSeq) return; // an older check answered late
    if (out.ok) {
      status.className = "ok";
      status.textContent = "compiles (" + ms(out.seconds) + " ms)";
    } else {
      status.className = "error";
      status.textContent = out.error;
    }
  } catch (e) {
    if (seq === checkSeq) { status.className = "error"; status.textContent = e.message; }
  }
}

function samplingParams() {
  const sp = {
    max_new_tokens: Number($("max-new-tokens").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    top_k: Number($("top-k").value),
  };
  if ($("seed").value !== "") sp.seed = Number($("seed").value);
  if ($("stop").value) sp.stop = [$("stop").value];
  const kind = $("constraint-kind").value;
  if (kind) sp[kind] = constraintValue();
  return sp;
}

function outputTokens(chunk) {
  const trace = (chunk.meta_info || {}).trace || {};
  const pieces = trace.output_pieces || [];
  const origins = trace.output_origins || "";
  const logprobs = (chunk.meta_info || {}).output_token_logprobs;
  return pieces.map((text, i) => ({
    text, id: (chunk.output_ids || [])[i], origin: origins[i] === "j" ? "jump_forward" : "sampled",
    logprob: logprobs && logprobs[i] ? logprobs[i][0] : undefined,
  }));
}

function describeMeta(meta) {
  const parts = [];
  if (meta.prompt_tokens !== undefined) parts.push(meta.prompt_tokens + " prompt tokens (" + Math.min(meta.cached_tokens, meta.prompt_tokens) + " cached)");
  if (meta.completion_tokens !== undefined) parts.push(meta.completion_tokens + " output tokens (" + (meta.jump_forward_tokens || 0) + " jump-forward)");
  if (meta.ttft !== undefined && meta.ttft !== null) parts.push("first token " + ms(meta.ttft) + " ms");
  if (meta.finish_reason) parts.push("finish: " + meta.finish_reason.type + (meta.finish_reason.matched !== undefined && meta.finish_reason.matched !== null ? " (" + meta.finish_reason.matched + ")" : ""));
  return parts.join(" · ");
}

async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function generate() {
  const out = $("output");
  out.replaceChildren();
  $("gen-error").textContent = "";
  $("gen-status").textContent = "waiting…";
  $("open-trace").disabled = true;
  $("generate").disabled = true;
  $("stop-button").disabled = false;
  controller = new AbortController();
  const body = {
    prompt: $("prompt").value, chat: $("mode-chat").checked, sampling_params: samplingParams(),
    return_logprob: $("logprobs").checked,
  };
  if (body.chat && $("system").value) body.system = $("system").value;
  out.dataset.state = "streaming";
  try {
    const resp = await api("/console/api/generate", body, controller.signal);
    for await (const ev of sseEvents(resp)) {
      if (ev.error) { $("gen-error").textContent = ev.error.message; continue; }
      if (ev.record) {
        lastRecord = ev.record;
        renderTokens(out, ev.record.output);
        $("open-trace").disabled = false;
        continue;
      }
      renderTokens(out, outputTokens(ev));
      $("gen-status").textContent = describeMeta(ev.meta_info || {});
    }
  } catch (e) {
    if (e.name !== "AbortError") $("gen-error").textContent = e.message;
  } finally {
    out.dataset.state = "done";
    $("generate").disabled = false;
    $("stop-button").disabled = true;
    controller = null;
  }
}

// ------------------------------------------------------------------ dashboard
function card(label, value, id) {
  const c = el("div", null, "card");
  c.append(el("div", label, "label"));
  const v = el("div", value, "value");
  v.id = "card-" + id;
  c.append(v);
  return c;
}

function plot(canvas, series, colors, maxValue) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  ctx.strokeStyle = "#ccc";
  ctx.strokeRect(0.5, 0.5, w - 1, h - 1);
  const top = Math.max(maxValue || 0, ...series.flat().map((p) => p[1]), 1e-9);
  ctx.fillStyle = "#666";
  ctx.font = "10px sans-serif";
  ctx.fillText(top.toFixed(top < 10 ? 2 : 0), 4, 12);
  ctx.fillText("-5 min", 4, h - 4);
  ctx.fillText("now", w - 24, h - 4);
  series.forEach((points, i) => {
    ctx.strokeStyle = colors[i];
    ctx.beginPath();
    points.forEach(([age, y], j) => {
      const x = w - (age / 300) * w;
      const yy = h - 2 - (y / top) * (h - 16);
      if (j === 0) ctx.moveTo(x, yy); else ctx.lineTo(x, yy);
    });
    ctx.stroke();
  });
}

async function refreshDashboard() {
  let s;
  try {
    s = await (await api("/console/api/stats")).json();
  } catch (e) {
    $("dash-status").textContent = e.message;
    return;
  }
  const kv = s.kv, g = s.grammar || {};
  const pct = (x) => (kv.total ? (100 * x / kv.total).toFixed(1) + "%" : "-");
  const last = s.history.length ? s.history[s.history.length - 1] : { tokens_per_s: 0 };
  $("cards").replaceChildren(
    card("engine", s.ready ? "ready" : (s.restarting || "down"), "engine"),
    card("running", s.running, "running"),
    card("queued", s.queued, "queued"),
    card("in flight (server)", s.inflight, "inflight"),
    card("tokens/s", last.tokens_per_s.toFixed(1), "tps"),
    card("generated tokens", s.generation_tokens, "generated"),
    card("KV pool used", kv.used + " / " + kv.total + " (" + pct(kv.used) + ")", "kv"),
    card("radix cache", kv.cached + " tokens (" + pct(kv.cached) + ")", "cache"),
    card("cache hit rate", (100 * s.cache_hit_rate).toFixed(1) + "%", "hit"),
    card("compile queue", g.pending || 0, "compile-queue"),
    card("compile cache", (g.cached || 0) + " grammars", "compile-cache"),
    card("compiles / cache hits", (g.compiles || 0) + " / " + (g.cache_hits || 0), "compiles"),
    card("compile errors / time", (g.errors || 0) + " / " + ((g.compile_s || 0).toFixed(2)) + " s", "compile-err"),
    card("jump-forward tokens", g.jumped_tokens || 0, "jumped"),
    card("engine restarts", s.engine_restarts, "restarts"),
    card("requests finished", s.num_requests, "requests"),
  );
  const h = s.history;
  plot($("plot-tps"), [h.map((p) => [p.age_s, p.tokens_per_s])], ["#1565c0"]);
  plot($("plot-reqs"), [h.map((p) => [p.age_s, p.running]), h.map((p) => [p.age_s, p.queued])], ["#2e7d32", "#c62828"]);
  plot($("plot-kv"), [h.map((p) => [p.age_s, p.kv_total ? p.kv_used / p.kv_total : 0]),
    h.map((p) => [p.age_s, p.kv_total ? p.kv_cached / p.kv_total : 0])], ["#6a1b9a", "#ef6c00"], 1);
  $("dash-status").textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString() +
    (s.trace_enabled ? " · tracing on" : " · tracing off (--enable-trace)");
  if (s.model) $("model").textContent = s.model;
}

// ------------------------------------------------------------------ traces
async function refreshTraces() {
  let data;
  try {
    data = await (await api("/trace?limit=100")).json();
  } catch (e) {
    $("traces-status").textContent = e.message;
    return;
  }
  $("traces-status").textContent = data.enabled
    ? data.traces.length + " of the newest " + data.capacity + " requests"
    : "tracing is off: start the server with --enable-trace (the playground's own requests still show their trace)";
  const rows = data.traces.map((t) => {
    const tr = el("tr");
    const link = el("button", t.rid.slice(0, 12), "link");
    link.type = "button";
    link.dataset.rid = t.rid;
    link.addEventListener("click", () => openTrace(t.rid));
    const cells = [new Date(t.received * 1000).toLocaleTimeString(), link, t.route, t.outcome, t.prompt_preview,
      t.prompt_tokens + " → " + t.completion_tokens, t.cached_tokens, t.jump_forward_tokens, ms(t.e2e_s) + " ms"];
    for (const c of cells) {
      const td = el("td");
      if (c instanceof Node) td.append(c); else td.textContent = String(c);
      tr.append(td);
    }
    return tr;
  });
  $("trace-table").tBodies[0].replaceChildren(...rows);
}

async function openTrace(rid) {
  try {
    showRecord(await (await api("/trace/" + encodeURIComponent(rid))).json());
  } catch (e) {
    $("traces-status").textContent = e.message;
  }
}

const PHASE_COLORS = { "compile wait": "#8e24aa", tokenize: "#9e9e9e", queued: "#bdbdbd", prefill: "#1e88e5",
  "jump-forward extend": "#fb8c00", "first token": "#43a047", decode: "#43a047", finish: "#000" };

function showRecord(r) {
  $("trace-view").hidden = false;
  $("trace-title").textContent = "Request " + r.rid;
  const reason = r.finish_reason ? r.finish_reason.type : "-";
  $("trace-summary").textContent = [r.route, r.outcome, "finish " + reason, r.prompt_tokens + " prompt tokens (" +
    r.cached_tokens + " cached)", r.completion_tokens + " output tokens (" + r.jump_forward_tokens + " jump-forward)",
    "constraint " + (r.constraint || "none"), "grammar " + ms(r.grammar_s) + " ms", "e2e " + ms(r.e2e_s) + " ms",
    r.truncated ? "token lists truncated" : ""].filter((x) => x).join(" · ");
  const total = Math.max(r.e2e_s, 1e-6);
  const bars = r.timeline.filter((p) => p.end > p.start).map((p) => {
    const b = el("div", null, "bar");
    b.style.left = (100 * p.start / total) + "%";
    b.style.width = Math.max(100 * (p.end - p.start) / total, 0.2) + "%";
    b.style.background = PHASE_COLORS[p.phase] || "#999";
    b.title = p.phase + " " + ms(p.end - p.start) + " ms" + (p.tokens ? " · " + p.tokens + " tokens" : "");
    return b;
  });
  $("trace-timeline").replaceChildren(...bars);
  const rows = r.timeline.map((p) => {
    const tr = el("tr");
    const detail = [];
    if (p.tokens !== undefined) detail.push(p.tokens + (p.tokens === 1 ? " token" : " tokens"));
    if (p.prefix !== undefined) detail.push("from position " + p.prefix);
    if (p.reason) detail.push(JSON.stringify(p.reason));
    for (const c of [p.phase, ms(p.start), ms(p.end - p.start), detail.join(", ")]) tr.append(el("td", c));
    return tr;
  });
  $("trace-phases").tBodies[0].replaceChildren(...rows);
  renderTokens($("trace-prompt"), r.prompt);
  renderTokens($("trace-output"), r.output);
  $("trace-view").scrollIntoView({ block: "start" });
}

// ------------------------------------------------------------------ wiring
function init() {
  document.querySelectorAll("button.tab").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  $("key-button").addEventListener("click", () => askKey(""));
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    setKey($("key-input").value, $("key-remember").checked);
    $("key-input").value = "";
    $("key-panel").hidden = true;
    scheduleCheck();
  });
  $("key-forget").addEventListener("click", () => { setKey("", false); $("key-status").textContent = "forgotten"; });
  for (const r of document.querySelectorAll("input[name=mode]")) {
    r.addEventListener("change", () => { $("system-label").hidden = !$("mode-chat").checked; });
  }
  $("constraint-kind").addEventListener("change", () => {
    $("constraint").value = EXAMPLES[$("constraint-kind").value];
    scheduleCheck();
  });
  $("constraint").addEventListener("input", scheduleCheck);
  $("generate").addEventListener("click", generate);
  $("stop-button").addEventListener("click", () => { if (controller) controller.abort(); });
  $("open-trace").addEventListener("click", () => { if (lastRecord) { showTab("traces"); showRecord(lastRecord); } });
  $("traces-refresh").addEventListener("click", refreshTraces);
  $("constraint").value = EXAMPLES[$("constraint-kind").value];
  showTab("playground");
  scheduleCheck();
  showModel();
}

async function showModel() {
  try {
    const s = await (await api("/console/api/stats")).json();
    if (s.model) $("model").textContent = s.model;
  } catch (e) { /* no key yet: the key form is shown */ }
}

document.addEventListener("DOMContentLoaded", init);
