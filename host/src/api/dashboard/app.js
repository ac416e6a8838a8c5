// Weir's dashboard: a page over the JSON API (/v1), polled once a second.
// Everything shown comes from the API and is put into the page as text, never as markup
// (job names, failure causes and component names are written by tenants).
"use strict";

const POLL_MS = 1000;
const state = { token: null, job: null, samples: new Map(), timer: null, detail: null };

const $ = (sel) => document.querySelector(sel);
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}
function svg(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}
function fmtRate(r) {
  if (r == null || !isFinite(r)) return "–";
  return r >= 1e6 ? (r / 1e6).toFixed(2) + "M" : r >= 1e3 ? (r / 1e3).toFixed(1) + "k" : r.toFixed(r < 10 ? 1 : 0);
}
// Puts `rows` (each with a `data-key`) into `tbody`, keeping the rows and cells that did not
// change: a poll never replaces what the user is about to click.
function reconcile(tbody, rows) {
  const old = new Map([...tbody.children].map((r) => [r.dataset.key, r]));
  const kept = rows.map((r) => {
    const o = old.get(r.dataset.key);
    if (!o || o.cells.length !== r.cells.length) return r;
    for (const a of r.getAttributeNames()) if (o.getAttribute(a) !== r.getAttribute(a)) o.setAttribute(a, r.getAttribute(a));
    [...r.cells].forEach((c, i) => { if (o.cells[i].textContent !== c.textContent || o.cells[i].className !== c.className) o.cells[i].replaceWith(c); });
    return o;
  });
  kept.forEach((r, i) => { if (tbody.children[i] !== r) tbody.insertBefore(r, tbody.children[i] || null); });
  while (tbody.children.length > kept.length) tbody.lastElementChild.remove();
}
const fmtPct = (f) => (f == null || !isFinite(f) ? "–" : Math.round(Math.min(1, Math.max(0, f)) * 100) + "%");
const fmtMs = (ms) => (ms == null ? "–" : ms >= 1000 ? (ms / 1000).toFixed(2) + " s" : ms.toFixed(ms < 10 ? 1 : 0) + " ms");
function fmtBytes(b) {
  if (b == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}

async function api(method, path, body) {
  const r = await fetch(path, { method, headers: { Authorization: "Bearer " + state.token }, body });
  const text = await r.text();
  let v = null;
  try { v = text ? JSON.parse(text) : null; } catch (_) { v = { error: text }; }
  if (r.status === 401) { forget("The token was refused (401): enter your tenant's token."); throw new Error("401"); }
  if (!r.ok) throw new Error((v && v.error) || "HTTP " + r.status);
  return v;
}

// --- token -----------------------------------------------------------------------------------
function takeTokenFromUrl() {
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (!m) return;
  sessionStorage.setItem("weir-token", decodeURIComponent(m[1]));
  const rest = location.hash.replace(/(?:^#|&)token=[^&]*/, "").replace(/^&/, "");
  history.replaceState(null, "", location.pathname + (rest ? "#" + rest.replace(/^#?/, "") : "#/"));
}
function forget(message) {
  sessionStorage.removeItem("weir-token");
  state.token = null;
  clearTimeout(state.timer);
  $("#main").hidden = true; $("#logout").hidden = true; $("#login").hidden = false;
  $("#conn").textContent = message || "";
}
function start() {
  takeTokenFromUrl();
  state.token = sessionStorage.getItem("weir-token");
  if (!state.token) { forget("Enter a token."); return; }
  $("#login").hidden = true; $("#main").hidden = false; $("#logout").hidden = false;
  route();
}

// --- routing: #/ (jobs) and #/jobs/<id> --------------------------------------------------------
function route() {
  const m = /^#\/jobs\/([^/]+)$/.exec(location.hash);
  const job = m ? decodeURIComponent(m[1]) : null;
  if (job !== state.job) { state.job = job; state.samples.clear(); state.detail = null; $("#ckpt-detail").replaceChildren(); }
  $("#job-panel").hidden = !job;
  tick();
}

async function tick() {
  clearTimeout(state.timer);
  try {
    const jobs = await api("GET", "/v1/jobs");
    renderJobs(jobs);
    if (state.job) await renderJob(state.job);
    $("#conn").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.message === "401") return;
    $("#conn").textContent = "error: " + e.message;
  }
  state.timer = setTimeout(tick, POLL_MS);
}

// Rates come from the difference between two polls of the counters.
function rates(key, now, counters) {
  const prev = state.samples.get(key);
  state.samples.set(key, { t: now, c: counters });
  if (!prev || now <= prev.t) return null;
  const dt = (now - prev.t) / 1000;
  const out = {};
  for (const k of Object.keys(counters)) out[k] = Math.max(0, counters[k] - prev.c[k]) / dt;
  return out;
}

// --- jobs list --------------------------------------------------------------------------------
function renderJobs(jobs) {
  jobs.sort((a, b) => String(a.id).localeCompare(String(b.id), undefined, { numeric: true }));
  const now = performance.now();
  const rows = jobs.map((j) => {
    const sourcesOut = j.nodes.filter((n) => n.kind === "source").reduce((s, n) => s + n.records_out, 0);
    const r = rates("job:" + j.id, now, { out: sourcesOut });
    const tr = el("tr", { "data-key": j.id, "data-job": j.id, "data-state": j.state, class: j.id === state.job ? "selected" : "" },
      el("td", {}, j.id), el("td", {}, j.name), el("td", {}, el("span", { class: "state " + j.state }, j.state)),
      el("td", { class: "num" }, j.attempts), el("td", { class: "num" }, j.checkpoints),
      el("td", { class: "num" }, r ? fmtRate(r.out) : "–"), el("td", { class: "cause-cell" }, j.cause || ""));
    tr.addEventListener("click", () => { location.hash = "#/jobs/" + encodeURIComponent(j.id); });
    return tr;
  });
  reconcile($("#jobs tbody"), rows);
  $("#no-jobs").hidden = jobs.length > 0;
}

// --- one job ----------------------------------------------------------------------------------
async function renderJob(id) {
  const [st, history] = await Promise.all([
    api("GET", "/v1/jobs/" + encodeURIComponent(id)),
    api("GET", "/v1/jobs/" + encodeURIComponent(id) + "/checkpoints"),
  ]);
  $("#job-id").textContent = id;
  $("#job-name").textContent = st.name;
  const s = $("#job-state");
  s.textContent = st.state; s.className = "state " + st.state;
  const cause = $("#job-cause");
  cause.hidden = !st.cause;
  cause.textContent = st.cause ? (st.state === "RESTARTING" ? "Restarting after: " : "Root cause: ") + st.cause : "";
  const cf = $("#job-ckpt-failure");
  cf.hidden = !st.last_checkpoint_failure;
  cf.textContent = st.last_checkpoint_failure ? `${st.checkpoints_failed} failed checkpoint(s); newest: ${st.last_checkpoint_failure}` : "";
  const terminal = ["FINISHED", "STOPPED", "CANCELLED", "FAILED"].includes(st.state);
  for (const b of ["#btn-savepoint", "#btn-stop", "#btn-cancel", "#btn-upgrade"]) $(b).disabled = terminal;

  const now = performance.now();
  const live = st.nodes.map((n) => {
    const r = rates("node:" + id + ":" + n.uid, now, {
      in: n.records_in, out: n.records_out, bp: n.backpressured_ms || 0, busy: n.busy_ms || 0, idle: n.idle_ms || 0,
    });
    const p = Math.max(1, n.parallelism);
    return { n, r, bp: r ? r.bp / 1000 / p : null, busy: r ? r.busy / 1000 / p : null, idle: r ? r.idle / 1000 / p : null };
  });
  renderGraph(live);
  renderOperators(live);
  renderUpgradeChoices(st.nodes);
  renderCheckpoints(st, history || []);
  renderUpgrades(st.upgrades || []);
}

function renderOperators(live) {
  reconcile($("#operators tbody"), live.map(({ n, r, bp, busy, idle }) => el("tr", { "data-key": n.uid, "data-uid": n.uid },
    el("td", {}, n.uid), el("td", { class: "num" }, n.parallelism), el("td", {}, n.component || n.kind || ""),
    el("td", { class: "num" }, r ? fmtRate(r.in) : "–"), el("td", { class: "num" }, r ? fmtRate(r.out) : "–"),
    el("td", { class: "num" }, fmtPct(bp)), el("td", { class: "num" }, n.kind === "operator" ? fmtPct(busy) : "–"),
    el("td", { class: "num" }, n.kind === "source" ? "–" : fmtPct(idle)),
    el("td", {}, n.watermark == null ? "–" : String(n.watermark)),
    el("td", { class: "num" }, n.records_in), el("td", { class: "num" }, n.records_out),
    el("td", { class: "num" }, n.dead_letters || 0),
    el("td", { class: "num" }, n.kind === "operator" ? fmtBytes(n.guest_memory_bytes || 0) : "–"))));
}

function renderUpgradeChoices(nodes) {
  const ops = nodes.filter((n) => n.component).map((n) => n.uid);
  for (const sel of [$("#upgrade-op"), $("#query-op")]) {
    if (sel.options.length === ops.length && [...sel.options].every((o, i) => o.value === ops[i])) continue;
    sel.replaceChildren(...ops.map((u) => el("option", { value: u }, u)));
  }
}

// Layers by longest path from the sources over regular (non-feedback) inputs.
function layout(nodes) {
  const byUid = new Map(nodes.map((x) => [x.n.uid, x]));
  const depth = new Map();
  const visit = (uid, seen) => {
    if (depth.has(uid)) return depth.get(uid);
    if (seen.has(uid)) return 0;
    seen.add(uid);
    const x = byUid.get(uid);
    const ins = (x ? x.n.inputs || [] : []).filter((i) => !i.feedback && byUid.has(i.from));
    const d = ins.length ? 1 + Math.max(...ins.map((i) => visit(i.from, seen))) : 0;
    depth.set(uid, d);
    return d;
  };
  nodes.forEach((x) => visit(x.n.uid, new Set()));
  const layers = [];
  nodes.forEach((x) => { const d = depth.get(x.n.uid); (layers[d] = layers[d] || []).push(x); });
  return layers;
}

function bpColor(f) {
  if (f == null) return "#eef2f7";
  const t = Math.min(1, Math.max(0, f));
  const mix = (a, b) => Math.round(a + (b - a) * t);
  return `rgb(${mix(222, 240)},${mix(247, 82)},${mix(236, 82)})`;
}

function renderGraph(live) {
  const W = 170, H = 64, GX = 70, GY = 24;
  const layers = layout(live);
  const pos = new Map();
  layers.forEach((layer, d) => (layer || []).forEach((x, i) => pos.set(x.n.uid, { x: 20 + d * (W + GX), y: 20 + i * (H + GY) })));
  const rowsMax = Math.max(1, ...layers.map((l) => (l || []).length));
  const g = $("#graph");
  g.setAttribute("width", 40 + layers.length * (W + GX) - GX);
  g.setAttribute("height", 40 + rowsMax * (H + GY) - GY);
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#6b7280" }));
  defs.append(marker);
  const parts = [defs];
  for (const { n } of live) {
    for (const i of n.inputs || []) {
      const a = pos.get(i.from), b = pos.get(n.uid);
      if (!a || !b) continue;
      const d = i.feedback
        ? `M${a.x + W / 2},${a.y + H} C${a.x + W / 2},${a.y + H + 40} ${b.x + W / 2},${b.y + H + 40} ${b.x + W / 2},${b.y + H}`
        : `M${a.x + W},${a.y + H / 2} C${a.x + W + GX / 2},${a.y + H / 2} ${b.x - GX / 2},${b.y + H / 2} ${b.x},${b.y + H / 2}`;
      parts.push(svg("path", { class: "edge" + (i.feedback ? " feedback" : ""), d, "data-from": i.from, "data-to": n.uid }));
    }
  }
  for (const { n, r, bp, busy } of live) {
    const p = pos.get(n.uid);
    const node = svg("g", {
      class: "node", transform: `translate(${p.x},${p.y})`, "data-uid": n.uid,
      "data-rate-in": r ? r.in.toFixed(1) : "", "data-rate-out": r ? r.out.toFixed(1) : "",
      "data-backpressure": bp == null ? "" : bp.toFixed(3),
    });
    node.append(svg("rect", { width: W, height: H, fill: bpColor(bp) }));
    node.append(svg("text", { x: 8, y: 17, class: "uid" }, `${n.uid} ×${n.parallelism}`));
    node.append(svg("text", { x: 8, y: 35, class: "rate" }, `in ${r ? fmtRate(r.in) : "–"}/s · out ${r ? fmtRate(r.out) : "–"}/s`));
    node.append(svg("text", { x: 8, y: 53, class: "bp" }, `backpressure ${fmtPct(bp)}` + (n.kind === "operator" ? ` · busy ${fmtPct(busy)}` : "")));
    node.append(svg("title", {}, `${n.uid} (${n.kind || "node"})${n.component ? "\n" + n.component : ""}`));
    parts.push(node);
  }
  g.replaceChildren(...parts);
}

function renderCheckpoints(st, history) {
  const rows = history.map((c) => ({ ...c, status: "COMPLETED" }));
  for (const f of st.checkpoint_failures || []) rows.push({ id: f.id, status: "FAILED", trigger_unix_ms: f.unix_ms, reason: f.reason });
  rows.sort((a, b) => b.id - a.id || (a.status === "FAILED" ? -1 : 1));
  const done = history.length;
  $("#ckpt-summary").textContent = `${st.checkpoints} completed, ${st.checkpoints_failed || 0} failed` +
    (done ? `; newest ${history[history.length - 1].id}: ${fmtMs(history[history.length - 1].duration_ms)}, ${fmtBytes(history[history.length - 1].bytes)}` : "");
  reconcile($("#checkpoints tbody"), rows.slice(0, 20).map((c) => {
    const failed = c.status === "FAILED";
    const detail = failed ? el("td", { class: "reason" }, c.reason)
      : el("td", {}, el("button", { type: "button", class: "detail", onclick: () => showDetail(c.id) }, "subtasks"));
    return el("tr", { "data-key": c.status + c.id, class: "ckpt", "data-id": c.id, "data-status": c.status },
      el("td", { class: "num" }, c.id), el("td", {}, c.status),
      el("td", {}, c.trigger_unix_ms ? new Date(c.trigger_unix_ms).toLocaleTimeString() : "–"),
      el("td", { class: "num" }, failed ? "–" : fmtMs(c.duration_ms)), el("td", { class: "num" }, failed ? "–" : fmtMs(c.sync_ms_max)),
      el("td", { class: "num" }, failed ? "–" : fmtMs(c.async_ms_max)), el("td", { class: "num" }, failed ? "–" : fmtMs(c.alignment_ms_max)),
      el("td", { class: "num" }, failed ? "–" : fmtBytes(c.bytes)), detail);
  }));
}

async function showDetail(cid) {
  const box = $("#ckpt-detail");
  try {
    const m = await api("GET", `/v1/jobs/${encodeURIComponent(state.job)}/checkpoints/${cid}`);
    const rows = [];
    for (const op of m.operators) for (const s of op.subtasks) {
      rows.push(el("tr", {}, el("td", {}, op.uid), el("td", { class: "num" }, s.index), el("td", {}, `${s.key_groups[0]}–${s.key_groups[1]}`),
        el("td", { class: "num" }, fmtBytes(s.bytes)), el("td", {}, s.chain && s.chain.length ? `delta on ${s.chain.length} file(s)` : "full"),
        el("td", { class: "num" }, fmtMs(s.timing && s.timing.align_ms)), el("td", { class: "num" }, fmtMs(s.timing && s.timing.sync_ms)),
        el("td", { class: "num" }, fmtMs(s.timing && s.timing.async_ms))));
    }
    box.replaceChildren(el("h4", {}, `Checkpoint ${cid}: per subtask`), el("table", { id: "ckpt-subtasks", "data-id": cid },
      el("thead", {}, el("tr", {}, ...["Operator", "Subtask", "Key groups", "Size", "Kind", "Alignment", "Sync", "Async"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows)));
  } catch (e) {
    if (e.message !== "401") box.replaceChildren(el("p", { class: "error" }, `checkpoint ${cid}: ${e.message}`));
  }
}

function renderUpgrades(ups) {
  $("#upgrades tbody").replaceChildren(...ups.map((u) => el("tr", {},
    el("td", { class: "num" }, u.checkpoint_id), el("td", {}, u.operator), el("td", {}, u.from), el("td", {}, u.to),
    el("td", {}, u.migrated_from == null ? "–" : u.migrated_from), el("td", { class: "num" }, fmtMs(u.pause_ms_max)),
    el("td", { class: "num" }, fmtBytes(u.state_bytes)))));
}

// --- actions ----------------------------------------------------------------------------------
async function act(label, f) {
  const out = $("#action-result");
  out.className = ""; out.textContent = label + "…";
  try {
    out.textContent = await f();
    out.className = "ok";
  } catch (e) {
    out.className = "error"; out.textContent = label + " failed: " + e.message;
  }
  tick();
}
const jobPath = () => "/v1/jobs/" + encodeURIComponent(state.job);
function wire() {
  $("#login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("weir-token", $("#token").value);
    $("#token").value = "";
    start();
  });
  $("#logout").addEventListener("click", () => forget("Token forgotten."));
  $("#btn-savepoint").addEventListener("click", () => act("Savepoint", async () => {
    const sp = await api("POST", jobPath() + "/savepoints");
    return `Savepoint written: ${sp.path} (checkpoint ${sp.checkpoint_id}, ${fmtBytes(sp.bytes)})`;
  }));
  $("#btn-stop").addEventListener("click", () => {
    if (!confirm("Stop the job with a savepoint?")) return;
    act("Stop", async () => { const sp = await api("POST", jobPath() + "/stop"); return `Stopped; savepoint ${sp.path}`; });
  });
  $("#btn-cancel").addEventListener("click", () => {
    if (!confirm("Cancel the job? Nothing more is committed.")) return;
    act("Cancel", async () => { await api("POST", jobPath() + "/cancel"); return "Cancelled."; });
  });
  $("#btn-upgrade").addEventListener("click", () => act("Upgrade", async () => {
    const file = $("#upgrade-file").files[0];
    const uid = $("#upgrade-op").value;
    if (!file || !uid) throw new Error("choose an operator and a component file");
    const bytes = await file.arrayBuffer();
    const u = await api("POST", `${jobPath()}/operators/${encodeURIComponent(uid)}/upgrade?name=${encodeURIComponent(file.name)}`, bytes);
    return `Upgraded ${u.operator}: ${u.from} → ${u.to} at checkpoint ${u.checkpoint_id}`;
  }));
  $("#query-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = $("#query-result");
    const uid = $("#query-op").value, key = $("#query-key").value, st = $("#query-state").value;
    let path = `${jobPath()}/operators/${encodeURIComponent(uid)}/state?key=${encodeURIComponent(key)}`;
    if (st) path += `&state=${encodeURIComponent(st)}`;
    out.className = "";
    try {
      out.textContent = JSON.stringify(await api("GET", path), null, 2);
      out.className = "ok";
    } catch (err) {
      out.className = "error"; out.textContent = err.message;
    }
  });
  window.addEventListener("hashchange", () => { takeTokenFromUrl(); if (state.token) route(); else start(); });
}
wire();
start();
