// delayq dashboard: plain JavaScript, no build step (issue 14).
// Reads poll /api/ and update the page in place (no full reloads, focus kept);
// actions POST JSON with the admin token from sessionStorage as a Bearer header.
"use strict";

const TOKEN_KEY = "delayq-admin-token";
const params = new URLSearchParams(location.search);
const INTERVAL_MS = Math.max(200, Number(params.get("interval")) || 2000);
const STATES = ["scheduled", "ready", "leased", "dead", "completed"];
const history = new Map(); // "ns/queue" -> {t, enq, ack, lag: []}
let session = { auth: false, admin: true };
let view = null; // the current page's state: {kind, ...}
let timer = null;

// -- helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v === true) e.setAttribute(k, "");
    else if (v !== false && v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

const num = (v) => Number(v || 0);
const secs = (d) => (d ? parseFloat(String(d)) : 0); // "1.500s" -> 1.5
const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "-");
const qpath = (ns, q) => `${encodeURIComponent(ns)}/${encodeURIComponent(q)}`;

function say(text, error = false) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.classList.toggle("error", error);
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

async function api(path, body) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const init = { headers };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(`/api/${path}`, init);
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = new Error(data.message || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

async function act(label, path, body = {}) {
  say(`${label}…`);
  try {
    const out = await api(path, body);
    say(`${label}: done`);
    await refresh();
    return out;
  } catch (e) {
    say(`${label} refused: ${e.message}`, true);
    return null;
  }
}

// A purge goes in bounded steps (PurgeQueue): call until nothing is left, with progress.
async function purgeAll(label, path, body) {
  let total = 0;
  for (;;) {
    const out = await act(label, path, body);
    if (!out) return;
    total += num(out.purged);
    say(`${label}: ${total} purged, ${num(out.remaining)} left`);
    if (!num(out.remaining) || !num(out.purged)) return;
  }
}

function actionButton(text, onclick, attrs = {}) {
  const b = el("button", { type: "button", text, onclick, ...attrs });
  b.dataset.action = "1";
  b.disabled = !session.admin;
  if (!session.admin) b.title = "needs an admin token";
  return b;
}

function syncActions() {
  for (const b of document.querySelectorAll("button[data-action]")) {
    b.disabled = !session.admin;
    b.title = session.admin ? "" : "needs an admin token";
  }
  const mode = document.getElementById("mode");
  mode.textContent = session.admin ? (session.auth ? "admin" : "auth off: actions open") : "read-only";
  mode.classList.toggle("admin", session.admin);
}

async function loadSession() {
  try {
    session = await api("session");
  } catch (e) {
    session = { auth: true, admin: false };
    say(`token refused: ${e.message}`, true);
  }
  syncActions();
}

function sparkline(values, label) {
  const w = 80, h = 20, max = Math.max(0.001, ...values);
  const pts = values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * w},${h - (v / max) * h}`);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const line = document.createElementNS(svg.namespaceURI, "polyline");
  line.setAttribute("points", pts.join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "currentColor");
  svg.append(line);
  return svg;
}

// -- overview --------------------------------------------------------------------------

function renderOverview(main) {
  const table = el("table", { id: "queues" },
    el("caption", { text: "Queues (live)" }),
    el("thead", {}, el("tr", {}, ...["Queue", "State", "Scheduled", "Ready", "Leased", "Dead",
      "Completed", "Enqueued/s", "Acked/s", "Lateness p99", "Actions"].map(
      (h) => el("th", { scope: "col", text: h })))),
    el("tbody"));
  main.replaceChildren(el("h2", { text: "Queues" }), table);
  view = { kind: "overview" };
}

function sample(key, stats, p99) {
  const now = performance.now() / 1000;
  const prev = history.get(key);
  const cur = { t: now, enq: num(stats.enqueued_total), ack: num(stats.acked_total), lag: [] };
  let enqRate = 0, ackRate = 0;
  if (prev) {
    const dt = Math.max(0.001, now - prev.t);
    enqRate = Math.max(0, (cur.enq - prev.enq) / dt);
    ackRate = Math.max(0, (cur.ack - prev.ack) / dt);
    cur.lag = prev.lag;
  }
  // Delivery lateness p99 of this server's last minute (null: no deliveries).
  cur.lag = [...cur.lag, p99 == null ? 0 : Number(p99)].slice(-30);
  history.set(key, cur);
  return { enqRate, ackRate, lag: cur.lag };
}

function updateOverview(data) {
  const tbody = document.querySelector("#queues tbody");
  if (!tbody) return;
  const seen = new Set();
  for (const q of data.queues || []) {
    const key = `${q.namespace}/${q.queue}`;
    seen.add(key);
    let row = tbody.querySelector(`tr[data-key="${CSS.escape(key)}"]`);
    if (!row) {
      const link = el("a", { href: `#/q/${qpath(q.namespace, q.queue)}`, text: key });
      const toggle = actionButton("Pause", () =>
        act(`${toggle.textContent} ${key}`, `queues/${qpath(q.namespace, q.queue)}/${toggle.dataset.op}`));
      toggle.setAttribute("aria-label", `Pause ${key}`);
      row = el("tr", { "data-key": key },
        el("td", {}, link), el("td", { class: "state" }),
        ...STATES.map((s) => el("td", { class: s })),
        el("td", { class: "enq" }), el("td", { class: "ack" }), el("td", { class: "lag" }),
        el("td", { class: "l" }, toggle));
      tbody.append(row);
    }
    const s = q.stats || {};
    for (const st of STATES) row.querySelector(`.${st}`).textContent = num(s[st]);
    const badge = el("span", { class: q.paused ? "badge paused" : "badge", text: q.paused ? "paused" : "active" });
    row.querySelector(".state").replaceChildren(badge);
    const r = sample(key, s, q.lateness_p99_ms);
    row.querySelector(".enq").textContent = r.enqRate.toFixed(1);
    row.querySelector(".ack").textContent = r.ackRate.toFixed(1);
    const lagNow = r.lag[r.lag.length - 1] || 0;
    const lagText = q.lateness_p99_ms == null ? "–" : `${lagNow.toFixed(1)} ms`;
    row.querySelector(".lag").replaceChildren(
      sparkline(r.lag, `delivery lateness p99 (this server, last minute), last ${r.lag.length} samples, now ${lagText}`),
      ` ${lagText}`);
    const button = row.querySelector("button[data-action]");
    const op = q.paused ? "resume" : "pause";
    if (button.dataset.op !== op) {
      button.dataset.op = op;
      button.textContent = q.paused ? "Resume" : "Pause";
      button.setAttribute("aria-label", `${button.textContent} ${key}`);
    }
  }
  for (const row of [...tbody.rows]) if (!seen.has(row.dataset.key)) row.remove();
}

// -- one queue -------------------------------------------------------------------------

function renderQueue(main, ns, queue, state) {
  const key = `${ns}/${queue}`;
  const base = `queues/${qpath(ns, queue)}`;
  const toggle = actionButton("Pause", () => act(`${toggle.textContent} ${key}`, `${base}/${toggle.dataset.op}`));
  toggle.id = "toggle";
  const purge = actionButton("Purge…", () => {
    if (confirm(`Purge every job of ${key}?`)) purgeAll(`Purge ${key}`, `${base}/purge`, { limit: 10000 });
  }, { class: "danger" });
  const tabs = el("div", { class: "tabs", role: "tablist", "aria-label": "Job state" },
    ...STATES.map((s) => el("button", {
      type: "button", role: "tab", id: `tab-${s}`, "aria-selected": String(s === state),
      "aria-controls": "jobs", text: s[0].toUpperCase() + s.slice(1),
      onclick: () => { location.hash = `#/q/${qpath(ns, queue)}/${s}`; },
    })));
  main.replaceChildren(
    el("h2", {}, `${key} `, el("span", { id: "qstate", class: "badge" })),
    el("div", { class: "row" }, toggle, purge,
      el("a", { href: `#/dead/${qpath(ns, queue)}`, text: "Dead letters" })),
    el("div", { class: "cards", id: "counts" }),
    el("h3", { id: "hist-h", text: "Backlog by due time" }),
    el("div", { id: "hist", role: "img", "aria-labelledby": "hist-h" }),
    tabs,
    el("table", { id: "jobs", role: "tabpanel", "aria-labelledby": `tab-${state}` },
      el("thead", {}, el("tr", {}, ...["Job", "State", "Due", "Attempts", "Payload", ""].map(
        (h) => el("th", { scope: "col", class: "l", text: h })))),
      el("tbody")),
    el("div", { class: "row" },
      el("button", { type: "button", id: "prev", text: "Previous page", onclick: () => page(-1) }),
      el("button", { type: "button", id: "next", text: "Next page", onclick: () => page(1) })),
    el("section", { id: "detail", class: "detail", "aria-live": "polite", hidden: true }));
  view = { kind: "queue", ns, queue, state, tokens: [""], pageIndex: 0, jobsKey: "", detail: null };
}

function page(delta) {
  const v = view;
  if (delta > 0 && v.next) { v.tokens[v.pageIndex + 1] = v.next; v.pageIndex += 1; }
  if (delta < 0 && v.pageIndex > 0) v.pageIndex -= 1;
  v.jobsKey = "";
  refresh();
}

function updateCounts(q) {
  const s = q.stats || {};
  const cards = document.getElementById("counts");
  cards.replaceChildren(...STATES.map((st) => el("div", { class: "card", "data-state": st },
    el("div", { class: "n", text: String(num(s[st])) }), el("div", { class: "k", text: st }))));
  const badge = document.getElementById("qstate");
  badge.textContent = q.paused ? "paused" : "active";
  badge.className = q.paused ? "badge paused" : "badge";
  const toggle = document.getElementById("toggle");
  const op = q.paused ? "resume" : "pause";
  if (toggle.dataset.op !== op) { toggle.dataset.op = op; toggle.textContent = q.paused ? "Resume" : "Pause"; }
}

function updateHistogram(h) {
  const box = document.getElementById("hist");
  const bins = h.bins || [];
  if (!bins.length) { box.replaceChildren(el("p", { text: "No scheduled jobs." })); return; }
  const max = Math.max(1, ...bins), w = 30, gap = 4, H = 80;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "hist");
  svg.setAttribute("width", bins.length * (w + gap));
  svg.setAttribute("height", H);
  const table = el("table", { class: "sr-only" }, el("caption", { text: "Jobs due per interval" }));
  bins.forEach((n, i) => {
    const r = document.createElementNS(svg.namespaceURI, "rect");
    const bh = (n / max) * (H - 2);
    r.setAttribute("x", i * (w + gap)); r.setAttribute("y", H - bh);
    r.setAttribute("width", w); r.setAttribute("height", bh);
    const from = new Date(h.start_ms + i * h.bin_ms).toLocaleTimeString();
    const t = document.createElementNS(svg.namespaceURI, "title");
    t.textContent = `${n} due from ${from}`;
    r.append(t); svg.append(r);
    table.append(el("tr", {}, el("td", { text: from }), el("td", { text: String(n) })));
  });
  const each = Math.round(h.bin_ms / 1000);
  box.replaceChildren(svg, el("p", { text: `${each} s per bar from now; ${h.later} due later.` }), table);
}

function payloadText(b64) {
  if (!b64) return "";
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  try { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch { return `base64: ${b64}`; }
}

function updateJobs(data) {
  const key = JSON.stringify(data);
  const v = view;
  v.next = data.next_page_token || "";
  document.getElementById("next").disabled = !v.next;
  document.getElementById("prev").disabled = v.pageIndex === 0;
  if (key === v.jobsKey) return; // unchanged: keep the rows (and focus)
  v.jobsKey = key;
  const tbody = document.querySelector("#jobs tbody");
  const rows = (data.jobs || []).map((j) => el("tr", { "data-id": j.id },
    el("td", { class: "l" }, el("code", { text: j.id })),
    el("td", { class: "l", text: j.state.replace("JOB_STATE_", "").toLowerCase() }),
    el("td", { class: "l", text: fmtTime(j.due_time) }),
    el("td", { class: "l", text: `${j.attempts}/${j.max_attempts}` }),
    el("td", { class: "l", text: payloadText(j.payload).slice(0, 60) }),
    el("td", { class: "l" }, el("button", {
      type: "button", text: "Details", "aria-label": `Details of job ${j.id}`,
      onclick: () => showJob(j.id),
    }))));
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "6", class: "l", text: "No jobs." }))]));
}

async function showJob(id) {
  const v = view;
  v.detail = id;
  const j = await api(`queues/${qpath(v.ns, v.queue)}/jobs/${encodeURIComponent(id)}`).catch((e) => {
    say(`job ${id}: ${e.message}`, true);
    return null;
  });
  const box = document.getElementById("detail");
  if (!j || !box) return;
  const delay = el("input", { id: "delay", type: "number", min: "0", value: "60" });
  const force = el("input", { id: "force", type: "checkbox" });
  const resched = actionButton("Reschedule", () => act(`Reschedule ${id}`,
    `queues/${qpath(v.ns, v.queue)}/jobs/${encodeURIComponent(id)}/reschedule`,
    { delay: `${Number(delay.value) || 0}s`, force: force.checked }).then(() => showJob(id)));
  box.hidden = false;
  box.replaceChildren(
    el("h3", { id: "detail-h", text: `Job ${j.id}` }),
    el("p", { text: `State ${j.state.replace("JOB_STATE_", "").toLowerCase()}, attempt ${j.attempts} of ${j.max_attempts}, payload ${j.payload_size} bytes` }),
    el("h4", { text: "Payload (preview)" }), el("pre", { id: "payload", text: payloadText(j.payload) }),
    el("h4", { text: "Headers" }), el("pre", { text: JSON.stringify(j.headers || {}, null, 2) }),
    el("h4", { text: "Timeline" }),
    el("ol", { id: "timeline" }, ...(j.timeline || []).map((t) =>
      el("li", { text: `${t.event}: ${new Date(t.time_ms).toLocaleString()}` }))),
    j.last_error ? el("p", { text: `Last error: ${j.last_error}` }) : "",
    el("div", { class: "row" },
      el("label", { for: "delay", text: "Due in (seconds)" }), delay,
      el("label", { for: "force", text: "Take back a lease" }), force, resched));
}

// -- dead letters ----------------------------------------------------------------------

function renderDead(main, ns, queue) {
  const key = `${ns}/${queue}`;
  const base = `queues/${qpath(ns, queue)}`;
  const target = el("input", { id: "target", placeholder: queue });
  const rate = el("input", { id: "rate", type: "number", min: "0", value: "0" });
  const all = actionButton("Redrive all", () => act(`Redrive dead letters of ${key}`, `${base}/redrive`,
    { target_queue: target.value.trim(), rate: Number(rate.value) || 0, limit: 10000 }));
  all.id = "redrive-all";
  const purge = actionButton("Purge all…", () => {
    if (confirm(`Delete every dead job of ${key}?`)) purgeAll(`Purge dead letters of ${key}`, `${base}/purge`, { state: "JOB_STATE_DEAD", limit: 10000 });
  }, { class: "danger", id: "purge-dead" });
  main.replaceChildren(
    el("h2", {}, "Dead letters of ", el("a", { href: `#/q/${qpath(ns, queue)}`, text: key })),
    el("p", { id: "dead-count" }),
    el("div", { class: "row" },
      el("label", { for: "target", text: "Target queue (empty: the same)" }), target,
      el("label", { for: "rate", text: "Rate (jobs/s, 0: no limit)" }), rate, all, purge),
    el("table", { id: "dead" },
      el("caption", { text: "Oldest deaths first" }),
      el("thead", {}, el("tr", {}, ...["Job", "Died", "Attempts", "Last error", "Payload", ""].map(
        (h) => el("th", { scope: "col", class: "l", text: h })))),
      el("tbody")));
  view = { kind: "dead", ns, queue, key: "" };
}

function updateDead(q, data) {
  document.getElementById("dead-count").textContent = `${num(q.stats.dead)} dead jobs`;
  const key = JSON.stringify(data);
  if (key === view.key) return;
  view.key = key;
  const base = `queues/${qpath(view.ns, view.queue)}`;
  const rows = (data.jobs || []).map((j) => el("tr", { "data-id": j.id },
    el("td", { class: "l" }, el("code", { text: j.id })),
    el("td", { class: "l", text: fmtTime(j.finish_time) }),
    el("td", { class: "l", text: String(j.attempts) }),
    el("td", { class: "l", text: j.last_error || "" }),
    el("td", { class: "l", text: payloadText(j.payload).slice(0, 60) }),
    el("td", { class: "l" }, actionButton("Redrive", () => act(`Redrive ${j.id}`, `${base}/redrive`, { job_ids: [j.id] }),
      { "aria-label": `Redrive job ${j.id}` }))));
  document.querySelector("#dead tbody").replaceChildren(
    ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "6", class: "l", text: "No dead jobs." }))]));
}

// -- routing and polling ---------------------------------------------------------------

function route() {
  const main = document.getElementById("main");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "q" && parts.length >= 3) {
    renderQueue(main, parts[1], parts[2], STATES.includes(parts[3]) ? parts[3] : "scheduled");
  } else if (parts[0] === "dead" && parts.length >= 3) {
    renderDead(main, parts[1], parts[2]);
  } else {
    renderOverview(main);
  }
  refresh();
}

async function refresh() {
  const v = view;
  try {
    if (v.kind === "overview") {
      updateOverview(await api("queues"));
    } else if (v.kind === "queue") {
      const base = `queues/${qpath(v.ns, v.queue)}`;
      const q = await api(base);
      if (view !== v) return;
      updateCounts(q);
      updateHistogram(q.histogram || {});
      const tok = encodeURIComponent(v.tokens[v.pageIndex] || "");
      updateJobs(await api(`${base}/jobs?state=${v.state}&page_size=20&page_token=${tok}`));
    } else if (v.kind === "dead") {
      const base = `queues/${qpath(v.ns, v.queue)}`;
      const q = await api(base);
      if (view !== v) return;
      updateDead(q, await api(`${base}/jobs?state=dead&page_size=50`));
    }
    document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    say(`refresh failed: ${e.message}`, true);
  }
}

document.getElementById("token-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  await loadSession();
  if (session.admin) say("token accepted: actions enabled");
});
document.getElementById("token-clear").addEventListener("click", async () => {
  sessionStorage.removeItem(TOKEN_KEY);
  await loadSession();
  say("token forgotten: read-only");
});
window.addEventListener("hashchange", route);

(async () => {
  await loadSession();
  route();
  timer = setInterval(refresh, INTERVAL_MS);
})();
