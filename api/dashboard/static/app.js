/* tunebox dashboard: a client of the public REST API, signed in with a token kept in sessionStorage. */
"use strict";

const TOKEN_KEY = "tunebox.token";
const REFRESH_MS = 5000;
/* STATUSES, TERMINAL and ACTIVE come from /dashboard/states.js, written from the server's own states */
const COLORS = {
  train: "#2563eb", eval: "#d97706", lr: "#7c3aed", tps: "#0d9488", measured: "#2563eb",
  peak: "#dc2626", capacity: "#111827",
};
// the plan's per-GPU memory terms, each at its own peak (so they may add up to more than the total)
const GPU_TERMS = [
  ["weights_bytes", "weights", "#1d4ed8"], ["gradients_bytes", "gradients", "#0891b2"],
  ["optimizer_states_bytes", "optimizer states", "#7c3aed"], ["activations_bytes", "activations", "#16a34a"],
  ["logits_bytes", "logits/loss", "#65a30d"], ["zero_buffers_bytes", "ZeRO buffers", "#ca8a04"],
  ["gathered_parameters_bytes", "gathered parameters", "#ea580c"],
  ["optimizer_step_transient_bytes", "optimizer step transient", "#db2777"],
  ["cuda_context_bytes", "CUDA context", "#475569"], ["allocator_slack_bytes", "allocator slack", "#94a3b8"],
];

const state = { me: null, cleanup: [], charts: {}, gen: 0 };
window.tunebox = state;  // the charts, for people poking at the page (and its browser tests)

// ------------------------------------------------------------------ small helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") el.style.cssText = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const GiB = 2 ** 30;
function bytes(n) {
  if (n === null || n === undefined) return "–";
  if (Math.abs(n) >= GiB) return (n / GiB).toFixed(2) + " GiB";
  if (Math.abs(n) >= 2 ** 20) return (n / 2 ** 20).toFixed(1) + " MiB";
  return n + " B";
}
function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  const hrs = Math.floor(s / 3600);
  return hrs < 48 ? hrs + " h " + Math.floor((s % 3600) / 60) + " min" : Math.floor(hrs / 24) + " d " + (hrs % 24) + " h";
}
function num(x, digits = 1) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }
function since(iso) { return iso ? (Date.now() - Date.parse(iso)) / 1000 : null; }
function when(iso) { return iso ? new Date(iso).toLocaleString() : "–"; }
function statusBadge(s) { return h("span", { class: "status " + s, dataset: { status: s } }, s); }
function jobLink(id, text) { return h("a", { href: "#/jobs/" + id }, text || id); }
function kv(rows) {
  return h("dl", { class: "kv" }, rows.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
function table(head, rows, attrs) {
  return h("div", { class: "table-wrap" }, h("table", attrs || {},
    h("thead", {}, h("tr", {}, head.map(([t, cls]) => h("th", { class: cls || null }, t)))),
    h("tbody", {}, rows)));
}
function progressBar(step, total) {
  if (!total) return step ? "step " + step : "–";
  const pct = Math.min(100, (100 * (step || 0)) / total);
  return h("div", { title: (step || 0) + " / " + total },
    h("div", { class: "bar" }, h("span", { style: "width:" + pct.toFixed(1) + "%" })),
    h("small", { class: "muted" }, (step || 0) + " / " + total));
}

function showError(err) {
  const box = document.getElementById("error");
  if (!err) { box.hidden = true; box.textContent = ""; return; }
  box.hidden = false;
  box.textContent = err.message || String(err);
}

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, problem) {
    const fields = (problem.errors || []).map((e) => (e.field ? e.field + ": " : "") + e.message);
    super([problem.title || "error " + status, problem.detail, ...fields].filter(Boolean).join("\n"));
    this.status = status;
    this.problem = problem;
  }
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path, opts = {}) {
  const headers = { Authorization: "Bearer " + token(), Accept: "application/json", ...(opts.headers || {}) };
  let body = opts.body;
  if (body !== undefined && typeof body !== "string") {
    body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const res = await fetch(path, { method: opts.method || "GET", headers, body, signal: opts.signal });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = { detail: text }; }
  if (res.status === 401) { signOut(); throw new ApiError(401, data || {}); }
  if (!res.ok) throw new ApiError(res.status, data || {});
  return data;
}

/** An archive the API streams (it needs the token, so no plain link): fetched, then saved. */
async function downloadArchive(button, path) {
  button.disabled = true;
  const label = button.textContent;
  button.textContent = "preparing…";
  try {
    const res = await fetch(path, { headers: { Authorization: "Bearer " + token() } });
    if (!res.ok) {
      const text = await res.text();
      let data = {};
      try { data = JSON.parse(text); } catch (_) { data = { detail: text }; }
      throw new ApiError(res.status, data);
    }
    const name = /filename="([^"]+)"/.exec(res.headers.get("Content-Disposition") || "");
    const url = URL.createObjectURL(await res.blob());
    const a = h("a", { href: url, download: name ? name[1] : "checkpoint.tar.gz", hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    button.dataset.downloaded = name ? name[1] : "yes";
  } catch (err) {
    showError(err);
  } finally {
    button.disabled = false;
    button.textContent = label;
  }
}

async function allPages(path, max = 1000) {
  const items = [];
  let after = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(path + sep + "limit=200" + (after ? "&after=" + after : ""));
    items.push(...page.items);
    after = page.next_after;
  } while (after && items.length < max);
  return items;
}

/** Server-sent events over fetch (EventSource cannot send the token); calls onEvent(kind, data, id). */
async function streamEvents(path, onEvent, signal) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + token(), Accept: "text/event-stream" },
    signal });
  if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => ({})));
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let kind = "message", id = null;
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        else if (line.startsWith("id:")) id = line.slice(3).trim();
      }
      if (data.length) onEvent(kind, JSON.parse(data.join("\n")), id);
    }
  }
}

// ------------------------------------------------------------------ charts

function axisBytes(_u, vals) { return vals.map((v) => (v / GiB).toFixed(v % GiB ? 2 : 0) + " G"); }

/** A uPlot line chart in `box`; series: [{label, color, values, dash}]; registered as state.charts[key]. */
function lineChart(box, key, title, xs, series, yFormat) {
  const holder = h("div", { class: "chart card", dataset: { chart: key } }, h("h3", {}, title));
  box.append(holder);
  if (!xs.length) { holder.append(h("div", { class: "empty" }, "no points yet")); return null; }
  const width = Math.max(260, holder.clientWidth - 26);
  const opts = {
    width, height: 220, legend: { show: true }, cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false } },
    axes: [{ label: "step" }, yFormat ? { values: yFormat, size: 60 } : { size: 60 }],
    series: [{ label: "step" }, ...series.map((s) => ({ label: s.label, stroke: s.color, width: s.width || 2,
      dash: s.dash, spanGaps: true, points: { show: s.points !== false && xs.length < 60 } }))],
  };
  const u = new uPlot(opts, [xs, ...series.map((s) => s.values)], holder);
  state.charts[key] = u;
  return u;
}

function dropCharts() {
  for (const key of Object.keys(state.charts)) { state.charts[key].destroy(); delete state.charts[key]; }
}

window.addEventListener("resize", () => {
  for (const u of Object.values(state.charts)) {
    u.setSize({ width: Math.max(260, u.root.parentNode.clientWidth - 26), height: 220 });
  }
});

/** Per-GPU plan terms as one stacked bar, with the planned total and the capacity marked. */
function stackedTerms(perGpu) {
  const terms = GPU_TERMS.map(([k, label, color]) => ({ k, label, color, v: perGpu[k] || 0 })).filter((t) => t.v > 0);
  const sum = terms.reduce((a, t) => a + t.v, 0);
  const scale = Math.max(sum, perGpu.total_bytes || 0, perGpu.capacity_bytes || 0) || 1;
  const pct = (v) => ((100 * v) / scale).toFixed(3) + "%";
  const bar = h("div", { class: "stack", dataset: { scaleBytes: scale } },
    terms.map((t) => h("div", { class: "seg", title: t.label + ": " + bytes(t.v),
      style: "width:" + pct(t.v) + ";background:" + t.color, dataset: { term: t.k, bytes: t.v } })),
    h("div", { class: "mark", title: "planned peak " + bytes(perGpu.total_bytes),
      style: "left:" + pct(perGpu.total_bytes) + ";background:" + COLORS.peak, dataset: { mark: "total" } }),
    perGpu.capacity_bytes ? h("div", { class: "mark", title: "capacity " + bytes(perGpu.capacity_bytes),
      style: "left:calc(" + pct(perGpu.capacity_bytes) + " - 2px);background:" + COLORS.capacity,
      dataset: { mark: "capacity" } }) : null);
  const legend = h("div", { class: "legend" },
    terms.map((t) => h("span", {}, h("i", { style: "background:" + t.color }), t.label + " " + bytes(t.v))),
    h("span", {}, h("i", { style: "background:" + COLORS.peak }), "planned peak " + bytes(perGpu.total_bytes)),
    h("span", {}, h("i", { style: "background:" + COLORS.capacity }), "capacity " + bytes(perGpu.capacity_bytes)));
  return h("div", { class: "card", dataset: { plot: "plan-terms" } },
    h("h3", {}, "Planned GPU memory by term (per GPU, each term at its own peak)"), bar, legend);
}

// ------------------------------------------------------------------ pages

// each page has a generation: work a page left running (a poll, a fetch) ends with it
function page(name, title) {
  state.gen += 1;
  document.body.dataset.page = name;
  delete document.body.dataset.loaded;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  document.title = title + " · tunebox";
  const main = document.getElementById("main");
  main.replaceChildren();
  return main;
}
function loaded(gen) { if (gen === state.gen) document.body.dataset.loaded = String(Date.now()); }
function every(gen, ms, fn) {
  if (gen !== state.gen) return;
  const t = setInterval(() => fn().catch(showError), ms);
  state.cleanup.push(() => clearInterval(t));
}

function signInPage() {
  const main = page("signin", "Sign in");
  const gen = state.gen;
  const input = h("input", { type: "password", name: "token", placeholder: "tb_…", autocomplete: "off", required: true });
  main.append(h("div", { class: "signin card" }, h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste your tunebox token (", h("code", {}, "tunebox token create NAME"),
      "). It stays in this browser tab only."),
    h("form", { onsubmit: async (e) => {
      e.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      try {
        state.me = await api("/v1/me");
        showError(null);
        if (location.hash === "#/") route(); else location.hash = "#/";
      }
      catch (err) { showError(err.status === 401 ? new Error("unknown or revoked token") : err); }
    } }, input, h("button", { class: "primary", type: "submit" }, "Sign in"))));
  loaded(gen);
}

async function boxPage() {
  const main = page("box", "Box");
  const gen = state.gen;
  main.append(h("h1", {}, "Box"));
  const gpusBox = h("div", { class: "grid", id: "gpus" });
  const runBox = h("div", { id: "running" });
  const queueBox = h("div", { id: "queue" });
  main.append(h("h2", {}, "GPUs"), gpusBox, h("h2", {}, "Running"), runBox, h("h2", {}, "Queue (in run order)"), queueBox);
  const draw = async () => {
    const [gpus, queue, active] = await Promise.all([api("/v1/gpus"),
      api("/v1/queue?limit=1000"), allPages("/v1/jobs?" + ACTIVE.map((s) => "status=" + s).join("&"))]);
    const queued = queue.items;  // in the order the workers start them
    gpusBox.replaceChildren(...(gpus.items.length ? gpus.items.map(gpuCard)
      : [h("p", { class: "muted" }, "No GPUs reported yet: no worker has started on this box.")]));
    runBox.replaceChildren(active.length ? jobTable(active, false) : h("p", { class: "muted" }, "Nothing running."));
    queueBox.replaceChildren(queued.length ? table(
      [["#", "num"], ["job"], ["name"], ["owner"], ["priority", "num"], ["GPUs", "num"], ["planned peak", "num"], ["waiting", "num"]],
      queued.map((j, i) => h("tr", { dataset: { job: j.id } }, h("td", { class: "num" }, i + 1), h("td", {}, jobLink(j.id)),
        h("td", {}, j.name), h("td", {}, j.owner), h("td", { class: "num" }, j.priority), h("td", { class: "num" }, j.num_gpus),
        h("td", { class: "num" }, bytes(j.planned_peak_gpu_bytes)), h("td", { class: "num" }, duration(since(j.created_at))))),
      { id: "queue-table" }) : h("p", { class: "muted" }, "The queue is empty."),
    ...(queue.more ? [h("p", { class: "muted" }, "…and " + queue.more + " more.")] : []));
    loaded(gen);
  };
  await draw();
  every(gen, REFRESH_MS, draw);
}

const GPU_KNOWN = new Set(["host", "index", "uuid", "name", "memory_total_bytes", "memory_free_bytes",
  "memory_unleased_bytes", "healthy", "health_reason", "updated_at", "leases"]);

function gpuCard(g) {
  const leased = g.leases.reduce((a, l) => a + l.memory_bytes, 0);
  const pct = g.memory_total_bytes ? Math.min(100, (100 * leased) / g.memory_total_bytes) : 0;
  // figures the inventory gains (the box's probe, calibration) are shown as they come
  const extra = Object.entries(g).filter(([k, v]) => !GPU_KNOWN.has(k) && v !== null && typeof v !== "object")
    .map(([k, v]) => [k.replaceAll("_", " "), k.endsWith("_bytes") ? bytes(v) : String(v)]);
  return h("div", { class: "card gpu", dataset: { gpu: g.host + ":" + g.index } },
    h("div", { class: "head" }, h("strong", {}, "GPU " + g.index + " · " + g.name),
      h("span", { class: "status " + (g.healthy ? "succeeded" : "failed") }, g.healthy ? "healthy" : "unhealthy")),
    h("div", { class: "muted" }, g.host),
    h("div", { class: "bar", style: "margin:8px 0", title: "leased " + pct.toFixed(0) + "%" },
      h("span", { style: "width:" + pct.toFixed(1) + "%" })),
    kv([["total", bytes(g.memory_total_bytes)], ["leased", bytes(leased)], ["unleased", bytes(g.memory_unleased_bytes)],
      ["free (driver)", bytes(g.memory_free_bytes)], g.health_reason && ["health", g.health_reason],
      ...extra, ["reported", when(g.updated_at)]]),
    g.leases.length ? h("div", { style: "margin-top:8px" }, h("div", { class: "muted" }, "held by"),
      g.leases.map((l) => h("div", {}, jobLink(l.job_id), " · " + bytes(l.memory_bytes) + (l.exclusive ? " · exclusive" : ""))))
      : h("div", { class: "muted", style: "margin-top:8px" }, "free"));
}

function jobTable(items, withStatus = true) {
  return table([["job"], ["name"], ["owner"], ["model", "hide-narrow"], withStatus && ["status"], ["progress"], ["loss", "num"],
    ["tokens/s", "num"], ["ETA", "num"], ["GPUs", "num hide-narrow"], ["created", "hide-narrow"]].filter(Boolean),
  items.map((j) => {
    const p = j.progress || {};
    return h("tr", { dataset: { job: j.id } }, h("td", {}, jobLink(j.id)), h("td", {}, j.name), h("td", {}, j.owner),
      h("td", { class: "hide-narrow", dataset: { model: j.model || "" } }, j.model || "–"),
      withStatus && h("td", {}, statusBadge(j.status)), h("td", {}, progressBar(p.step, p.total_steps)),
      h("td", { class: "num" }, num(p.loss, 4)), h("td", { class: "num" }, num(p.tokens_per_second, 0)),
      h("td", { class: "num" }, TERMINAL.has(j.status) ? "–" : duration(p.eta_seconds)),
      h("td", { class: "num hide-narrow" }, j.num_gpus), h("td", { class: "hide-narrow" }, when(j.created_at)));
  }), { class: "jobs" });
}

async function jobsPage(params) {
  const main = page("jobs", "Jobs");
  const gen = state.gen;
  const owner = h("input", { name: "owner", value: params.get("owner") || "", placeholder: "anyone, me, or a name" });
  const model = h("input", { name: "model", value: params.get("model") || "", placeholder: "any" });
  const status = h("select", { name: "status" }, h("option", { value: "" }, "any"),
    h("option", { value: "active" }, "active"),
    STATUSES.map((s) => h("option", { value: s, selected: params.get("status") === s }, s)));
  if (params.get("status") === "active") status.value = "active";
  const apply = (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    if (owner.value.trim()) q.set("owner", owner.value.trim());
    if (model.value.trim()) q.set("model", model.value.trim());
    if (status.value) q.set("status", status.value);
    location.hash = "#/jobs" + (q.toString() ? "?" + q : "");
  };
  const list = h("div", { id: "jobs" });
  const more = h("button", { type: "button", hidden: true }, "Older jobs");
  main.append(h("h1", {}, "Jobs"), h("form", { class: "filters", onsubmit: apply },
    h("label", {}, "owner", owner), h("label", {}, "model", model), h("label", {}, "status", status),
    h("button", { type: "submit" }, "Filter")),
  list, more);
  const q = new URLSearchParams();
  if (params.get("owner")) q.set("owner", params.get("owner"));
  if (params.get("model")) q.set("model", params.get("model"));
  const st = params.get("status");
  for (const s of st === "active" ? ACTIVE : st ? [st] : []) q.append("status", s);
  let pages = 1;
  const draw = async () => {
    const items = [];
    let after = null;
    for (let i = 0; i < pages; i++) {
      const page = await api("/v1/jobs?" + q + "&limit=50" + (after ? "&after=" + after : ""));
      items.push(...page.items);
      after = page.next_after;
      if (!after) break;
    }
    list.replaceChildren(items.length ? jobTable(items) : h("p", { class: "muted" }, "No jobs match."));
    more.hidden = !after;
    loaded(gen);
  };
  more.addEventListener("click", () => { pages += 1; draw().catch(showError); });
  await draw();
  every(gen, REFRESH_MS, draw);
}

// one job: header, timeline, progress, curves against the plan, terms, checkpoints, live events
async function jobPage(id) {
  const main = page("job", id);
  const gen = state.gen;
  const ctl = new AbortController();
  state.cleanup.push(() => ctl.abort());
  let job = await api("/v1/jobs/" + id);
  const head = h("div", { class: "head" });
  const timeline = h("ol", { class: "timeline", id: "timeline" });
  const progressBox = h("div", { class: "card", id: "progress" });
  const charts = h("div", { class: "charts", id: "charts" });
  const termsBox = h("div", { id: "terms" });
  const ckptBox = h("div", { id: "checkpoints" });
  const events = h("div", { class: "events card", id: "events" });
  main.append(head, h("h2", {}, "Status"), timeline, h("h2", {}, "Progress"), progressBox, h("h2", {}, "Curves"), charts,
    h("h2", {}, "Plan"), termsBox, h("h2", {}, "Checkpoints"), ckptBox, h("h2", {}, "Events (live)"), events);

  const drawHead = () => head.replaceChildren(h("h1", {}, job.name), statusBadge(job.status),
    h("span", { class: "muted" }, job.id + " · " + job.owner), h("div", { class: "actions" }, actionButtons(job, reload)));
  const drawProgress = (p) => progressBox.replaceChildren(kv([
    ["step", (p.step ?? "–") + (p.total_steps ? " / " + p.total_steps : "")], ["epoch", num(p.epoch, 2)],
    ["loss", num(p.loss, 4)], ["learning rate", p.learning_rate ?? "–"], ["tokens/s", num(p.tokens_per_second, 0)],
    ["ETA", TERMINAL.has(job.status) ? "–" : duration(p.eta_seconds)],
    ["GPU peak (measured / planned)", bytes(p.measured_peak_gpu_bytes) + " / " + bytes(plannedPeak(job))],
    ["host RSS (measured / planned)", bytes(p.measured_host_rss_bytes) + " / " + bytes(plannedHost(job))],
    job.failure && ["failure", [job.failure.kind, job.failure.reason, job.failure.message].filter(Boolean).join(" · ")],
    ["updated", when(p.updated_at)]]));
  let train = [], evals = [];
  const drawCharts = () => {
    if (gen !== state.gen) return;
    dropCharts();
    charts.replaceChildren();
    drawCurves(charts, job, train, evals);
  };
  const loadMetrics = async () => {
    [train, evals] = await Promise.all(["train", "eval"].map((k) =>
      api("/v1/jobs/" + id + "/metrics?kind=" + k + "&limit=10000").then((s) => s.points)));
  };
  async function reload() {
    job = await api("/v1/jobs/" + id);
    drawHead(); drawProgress(job.progress);
  }
  const drawTimeline = (items) => {
    for (const ev of items.filter((e) => e.kind === "status" || e.kind === "created")) {
      timeline.append(h("li", { dataset: { to: ev.data && ev.data.to ? ev.data.to : "queued" } },
        statusBadge(ev.data && ev.data.to ? ev.data.to : "queued"), " ", h("small", { class: "muted" }, when(ev.created_at))));
    }
  };
  const addEvent = (ev) => {
    events.append(h("div", { dataset: { event: ev.id, kind: ev.kind } },
      new Date(ev.created_at).toLocaleTimeString() + "  " + ev.kind + "  " + ev.message));
    events.scrollTop = events.scrollHeight;
  };
  drawHead();
  drawProgress(job.progress);
  await loadMetrics();
  drawCharts();
  termsBox.append(job.plan && job.plan.per_gpu ? stackedTerms(job.plan.per_gpu) : h("p", { class: "muted" }, "no plan"));
  const drawCheckpoints = async () => {
    const list = await api("/v1/jobs/" + id + "/checkpoints");
    ckptBox.replaceChildren(list.items.length ? table([["step", "num"], ["path"], ["size", "num"], ["final"], ["eval"], [""]],
      list.items.map((c) => h("tr", { dataset: { checkpoint: c.id } }, h("td", { class: "num" }, c.step), h("td", { class: "wrap" }, c.path),
        h("td", { class: "num" }, bytes(c.size_bytes)), h("td", {}, c.is_final ? "yes" : ""), h("td", {}, c.eval_status || ""),
        h("td", {}, h("button", { type: "button", class: "link", dataset: { download: c.step },
          onclick: (e) => downloadArchive(e.target, "/v1/jobs/" + id + "/checkpoints/" + c.step + "/archive") },
        "download")))))
      : h("p", { class: "muted" }, "No checkpoints yet."));
  };
  await drawCheckpoints();
  loaded(gen);

  // the stream replays the history from the start, then follows it live; progress snapshots come between
  let lastStep = train.length ? train[train.length - 1].step : -1;
  let pending = null;
  const onEvent = (kind, data) => {
    if (kind === "progress") {
      drawProgress(data);
      if (data.step !== null && data.step > lastStep && !pending) {
        pending = api("/v1/jobs/" + id + "/metrics?kind=train&after_step=" + lastStep).then((s) => {
          if (s.points.length) {
            train = train.concat(s.points);
            lastStep = train[train.length - 1].step;
            drawCharts();
          }
          loaded(gen);
        }).catch(showError).finally(() => { pending = null; });
      }
    } else if (kind === "end") {
      reload().then(loadMetrics).then(drawCharts).then(drawCheckpoints).then(() => loaded(gen)).catch(showError);
    } else {
      addEvent(data);
      drawTimeline([data]);
      if (kind === "status") reload().then(() => loaded(gen)).catch(showError);
      if (kind === "checkpoint") drawCheckpoints().catch(showError);
    }
  };
  streamEvents("/v1/jobs/" + id + "/events", onEvent, ctl.signal).catch((err) => {
    if (err.name !== "AbortError") showError(err);
  });
}

function plannedPeak(job) { return (job.plan && job.plan.per_gpu && job.plan.per_gpu.total_bytes) || job.planned_peak_gpu_bytes; }
function plannedHost(job) { return (job.plan && job.plan.host && job.plan.host.total_bytes) || job.planned_host_bytes; }

function actionButtons(job, reload) {
  const mine = state.me && (state.me.is_admin || state.me.name === job.owner);
  if (!mine) return [];
  const act = (verb, label, cls) => h("button", { type: "button", class: cls, dataset: { action: verb }, onclick: async (e) => {
    e.target.disabled = true;
    try { await api("/v1/jobs/" + job.id + "/" + verb, { method: "POST" }); await reload(); showError(null); }
    catch (err) { showError(err); e.target.disabled = false; }
  } }, label);
  return [job.status === "running" && act("pause", "Pause"), job.status === "paused" && act("resume", "Resume"),
    !TERMINAL.has(job.status) && job.status !== "cancelling" && act("cancel", "Cancel", "danger")].filter(Boolean);
}

function drawCurves(box, job, train, evals) {
  const tx = train.map((p) => p.step);
  const evalAt = new Map(evals.map((p) => [p.step, p.loss]));
  const lossX = [...new Set([...tx, ...evals.map((p) => p.step)])].sort((a, b) => a - b);
  const trainAt = new Map(train.map((p) => [p.step, p.loss]));
  lineChart(box, "loss", "Loss", lossX, [
    { label: "train", color: COLORS.train, values: lossX.map((s) => trainAt.has(s) ? trainAt.get(s) : null) },
    { label: "eval", color: COLORS.eval, values: lossX.map((s) => evalAt.has(s) ? evalAt.get(s) : null), points: true },
  ]);
  lineChart(box, "lr", "Learning rate", tx, [{ label: "learning rate", color: COLORS.lr, values: train.map((p) => p.learning_rate) }],
    (_u, vals) => vals.map((v) => v.toExponential(1)));
  lineChart(box, "tps", "Tokens/s", tx, [{ label: "tokens/s", color: COLORS.tps, values: train.map((p) => p.tokens_per_second) }]);
  const peak = plannedPeak(job), cap = job.plan && job.plan.per_gpu ? job.plan.per_gpu.capacity_bytes : null;
  lineChart(box, "gpu", "GPU memory (per GPU)", tx, [
    { label: "measured", color: COLORS.measured, values: train.map((p) => p.gpu_memory_bytes) },
    { label: "planned peak", color: COLORS.peak, values: tx.map(() => peak), dash: [8, 4], points: false },
    cap && { label: "capacity", color: COLORS.capacity, values: tx.map(() => cap), width: 1, points: false },
  ].filter(Boolean), axisBytes);
  const host = plannedHost(job), hostCap = job.plan && job.plan.host ? job.plan.host.capacity_bytes : null;
  lineChart(box, "host", "Host RSS (all training processes)", tx, [
    { label: "measured", color: COLORS.measured, values: train.map((p) => p.host_rss_bytes) },
    { label: "planned", color: COLORS.peak, values: tx.map(() => host), dash: [8, 4], points: false },
    hostCap && { label: "host RAM", color: COLORS.capacity, values: tx.map(() => hostCap), width: 1, points: false },
  ].filter(Boolean), axisBytes);
}

// ------------------------------------------------------------------ plan form

let catalogueNames = null;

async function planPage() {
  const main = page("plan", "Plan");
  const gen = state.gen;
  if (catalogueNames === null) catalogueNames = (await api("/v1/catalogue/models")).items;
  const f = (name, attrs) => h("input", { name, ...attrs });
  const source = h("select", { name: "model_source" }, h("option", { value: "name" }, "catalogue"),
    h("option", { value: "path" }, "path"));
  const model = f("model", { list: "catalogue", placeholder: "Qwen/Qwen2.5-7B or a folder", size: 28 });
  const method = h("select", { name: "method" }, ["lora", "qlora", "full"].map((m) => h("option", { value: m }, m)));
  const seq = f("seq_len", { type: "number", min: 1, value: 1024, style: "width:7em" });
  const dataset = f("dataset", { placeholder: "optional: a dataset path or ds_…", size: 24 });
  const gpuCount = f("gpu_count", { type: "number", min: 1, placeholder: "this box", style: "width:7em" });
  const gpuMem = f("gpu_memory_gib", { type: "number", min: 1, step: "any", placeholder: "this box", style: "width:7em" });
  const hostMem = f("host_memory_gib", { type: "number", min: 1, step: "any", placeholder: "this box", style: "width:7em" });
  const pasted = h("textarea", { name: "spec", placeholder: "…or paste a whole job spec, YAML as `tunebox submit` reads it or JSON (used instead of the fields above)" });
  const out = h("div", { id: "plan-result" });
  let lastSpec = null;
  const specOf = () => {
    if (pasted.value.trim()) {
      let spec;  // YAML 1.2 reads JSON too
      try { spec = jsyaml.load(pasted.value); } catch (e) { throw new Error("the pasted spec is not valid YAML: " + e.message); }
      if (spec === null || typeof spec !== "object" || Array.isArray(spec)) throw new Error("the pasted spec is not a mapping of fields");
      return spec;
    }
    if (!model.value.trim()) throw new Error("model: give a catalogue name or a path");
    const spec = { name: "dashboard-plan", model: { [source.value]: model.value.trim() }, method: method.value,
      training: { seq_len: Number(seq.value) } };
    const ds = dataset.value.trim();
    if (ds) spec.dataset = ds.startsWith("ds_") ? { id: ds } : { path: ds };
    if (gpuCount.value || gpuMem.value || hostMem.value) {
      spec.hardware = {};
      if (gpuCount.value) spec.hardware.gpu_count = Number(gpuCount.value);
      if (gpuMem.value) spec.hardware.gpu_memory_bytes = Math.round(Number(gpuMem.value) * GiB);
      if (hostMem.value) spec.hardware.host_memory_bytes = Math.round(Number(hostMem.value) * GiB);
    }
    return spec;
  };
  const submit = h("button", { type: "button", class: "primary", id: "submit-job", disabled: true, onclick: async () => {
    try {
      const job = await api("/v1/jobs", { method: "POST", body: lastSpec,
        headers: { "Idempotency-Key": crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random() } });
      showError(null);
      location.hash = "#/jobs/" + job.id;
    } catch (err) { showError(err); }
  } }, "Submit as a job");
  const form = h("form", { onsubmit: async (e) => {
    e.preventDefault();
    try {
      lastSpec = specOf();
      const plan = await api("/v1/plans", { method: "POST", body: lastSpec });
      showError(null);
      out.replaceChildren(planView(plan));
      submit.disabled = !plan.fits;
    } catch (err) { showError(err); out.replaceChildren(); submit.disabled = true; }
    loaded(gen);
  } },
  h("div", { class: "form-grid" }, h("label", {}, "model from", source), h("label", {}, "model", model),
    h("label", {}, "method", method), h("label", {}, "seq_len", seq), h("label", {}, "dataset", dataset),
    h("label", {}, "GPUs", gpuCount), h("label", {}, "GiB per GPU", gpuMem), h("label", {}, "host GiB", hostMem)),
  pasted, h("div", { class: "head", style: "margin-top:8px" }, h("button", { type: "submit", class: "primary" }, "Plan"), submit));
  main.append(h("h1", {}, "Plan a job"), h("datalist", { id: "catalogue" }, catalogueNames.map((m) => h("option", { value: m.name }))),
    h("div", { class: "card" }, form), out);
  loaded(gen);
}

function planView(plan) {
  const r = plan.resolved;
  const alts = plan.alternatives || [];
  const notes = (title, list) => list.length ? [h("h2", {}, title), h("ul", { class: "notes" },
    list.map((n) => h("li", { dataset: { code: n.code } }, n.message)))] : [];
  return h("div", {},
    h("h2", {}, "Result"),
    h("div", { class: "card" }, h("div", { class: "head" },
      h("span", { class: "fits " + (plan.fits ? "yes" : "no"), id: "fits" }, plan.fits ? "fits" : "does not fit"),
      h("span", { class: "muted" }, "margin " + bytes(plan.margin_bytes))),
    kv([["per GPU", bytes(plan.per_gpu.total_bytes) + " of " + bytes(plan.per_gpu.capacity_bytes)],
      ["host RAM", bytes(plan.host.total_bytes) + " of " + bytes(plan.host.capacity_bytes)],
      plan.nvme && plan.nvme.total_bytes ? ["NVMe", bytes(plan.nvme.total_bytes) + " of " + bytes(plan.nvme.capacity_bytes)] : null,
      ["step", num(plan.estimated_step_seconds, 3) + " s"], ["tokens/s", num(plan.estimated_tokens_per_second, 0)],
      ["duration", duration(plan.estimated_duration_seconds)],
      ["configuration", `${r.method} · ${r.num_gpus} GPU · ZeRO-${r.zero_stage} · offload opt ${r.offload_optimizer} / param ${r.offload_param}`
        + ` · micro-batch ${r.micro_batch_size} × accum ${r.gradient_accumulation_steps} · seq ${r.seq_len}`
        + ` · ${r.precision}${r.gradient_checkpointing ? " · checkpointing" : ""} · ${r.optimizer}`
        + (r.loss_chunk_tokens ? ` · loss in chunks of ${r.loss_chunk_tokens}` : "")]])),
    h("h2", {}, "Memory"), stackedTerms(plan.per_gpu),
    h("h2", {}, "Alternatives (ranked)"),
    alts.length ? table([["#", "num"], ["change"], ["fits"], ["per GPU", "num"], ["host", "num"], ["tokens/s", "num"], ["why"]],
      alts.map((a, i) => h("tr", { dataset: { fits: String(a.fits) } }, h("td", { class: "num" }, i + 1),
        h("td", { class: "wrap" }, Object.entries(a.changes).map(([k, v]) => k + " = " + JSON.stringify(v)).join(", ")),
        h("td", {}, a.fits ? "yes" : "no"), h("td", { class: "num" }, bytes(a.per_gpu_total_bytes)),
        h("td", { class: "num" }, bytes(a.host_total_bytes)), h("td", { class: "num" }, num(a.estimated_tokens_per_second, 0)),
        h("td", { class: "wrap" }, a.reason))), { id: "alternatives" })
      : h("p", { class: "muted" }, "none"),
    ...notes("Warnings", plan.warnings || []), ...notes("Advice", plan.advice || []));
}

// ------------------------------------------------------------------ routing

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.me = null;
}

async function route() {
  while (state.cleanup.length) state.cleanup.pop()();
  dropCharts();
  const signedIn = Boolean(token());
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("sign-out").hidden = !signedIn;
  if (!signedIn) { document.getElementById("who").textContent = ""; return signInPage(); }
  try {
    if (!state.me) state.me = await api("/v1/me");
    document.getElementById("who").textContent = state.me.name + (state.me.is_admin ? " (admin)" : "");
    const [path, query] = (location.hash.slice(1) || "/").split("?");
    const params = new URLSearchParams(query || "");
    const m = path.match(/^\/jobs\/(job_[0-9a-z]+)$/);
    if (m) await jobPage(m[1]);
    else if (path === "/jobs") await jobsPage(params);
    else if (path === "/plan") await planPage();
    else await boxPage();
  } catch (err) {
    if (!token()) return route();
    showError(err);
    loaded(state.gen);
  }
}

document.getElementById("sign-out").addEventListener("click", () => { signOut(); location.hash = "#/"; route(); });
window.addEventListener("hashchange", () => { showError(null); route(); });
route();
