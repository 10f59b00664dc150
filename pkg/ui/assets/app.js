// Tendril UI: plain JavaScript, no dependencies, no build step. Every text
// from flows (pod names, labels, policy names) enters the page through
// textContent or attribute setters, never as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);
// ?namespace=NS opens the page on that namespace (links, tests).
const state = { ns: new URLSearchParams(location.search).get("namespace") || "", window: "", tab: "map", map: null, stream: null, flowsGen: 0, rows: [], workload: "" };
const MAX_ROWS = 500;

function el(tag, attrs, ...children) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

async function getJSON(url, opts) {
  const resp = await fetch(url, opts);
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function params(extra) {
  const p = new URLSearchParams();
  if (state.window) p.set("since", state.window);
  for (const [k, v] of Object.entries(extra || {})) if (v) p.set(k, v);
  return p;
}

// ---- status and namespaces ----

async function refreshStatus() {
  try {
    const st = await getJSON("/api/status");
    const s = $("#status");
    s.textContent = (st.connected ? "relay " : "relay unreachable ") + st.relay + " · " + st.flows + " flows held (" + st.seen + " seen)" + (st.error ? " · " + st.error : "");
    s.classList.toggle("down", !st.connected);
    $("#rules-source").textContent = st.rulesSource;
    $("#history-box").hidden = !st.history;
    const nss = await getJSON("/api/namespaces");
    const sel = $("#namespace");
    const have = Array.from(sel.options).map((o) => o.value);
    const want = [""].concat(nss);
    if (have.join("\n") !== want.join("\n")) {
      sel.replaceChildren(...want.map((n) => el("option", { value: n }, n || "all namespaces")));
      if (!state.ns && nss.length) state.ns = nss.includes("demo") ? "demo" : nss[0];
      if (!want.includes(state.ns)) sel.append(el("option", { value: state.ns }, state.ns));
      sel.value = state.ns;
    }
  } catch (e) {
    $("#status").textContent = "UI server unreachable: " + e.message;
    $("#status").classList.add("down");
  }
}

// ---- service map ----

function edgeClass(verdict) {
  return { FORWARDED: "forwarded", DROPPED: "dropped", AUDIT: "audit", SERVICE: "service" }[verdict] || "forwarded";
}

function edgeLabel(e) {
  if (e.verdict === "SERVICE") return "backend of the Service";
  let s = e.protocol + (e.port ? "/" + e.port : "") + " " + e.verdict.toLowerCase() + " " + e.rate.toFixed(e.rate < 10 ? 2 : 0) + "/s";
  if (e.verdict === "DROPPED") s += " by " + (e.policies && e.policies.length ? e.policies.join(", ") : (e.dropReasons || []).join(", "));
  else if (e.verdict === "AUDIT") s += " by " + (e.policies || []).join(", ");
  else if (e.policies && e.policies.length) s += " (" + e.policies.join(", ") + ")";
  return s;
}

// layout places nodes in columns by their depth from the traffic's
// sources, so arrows mostly run left to right.
function layout(nodes, edges, width, height) {
  const depth = Object.fromEntries(nodes.map((n) => [n.id, 0]));
  for (let i = 0; i < nodes.length; i++) {
    let changed = false;
    for (const e of edges) {
      if (e.source !== e.target && depth[e.target] < depth[e.source] + 1 && depth[e.source] + 1 < nodes.length) {
        depth[e.target] = depth[e.source] + 1;
        changed = true;
      }
    }
    if (!changed) break;
  }
  const cols = {};
  for (const n of nodes) (cols[depth[n.id]] = cols[depth[n.id]] || []).push(n);
  const keys = Object.keys(cols).map(Number).sort((a, b) => a - b);
  const pos = {};
  keys.forEach((k, ci) => {
    const col = cols[k];
    col.forEach((n, ri) => {
      pos[n.id] = { x: (width * (ci + 0.5)) / keys.length, y: (height * (ri + 0.5)) / col.length };
    });
  });
  return pos;
}

function drawMap(m) {
  const svg = $("#map");
  const box = svg.getBoundingClientRect();
  const width = Math.max(box.width, 600), height = Math.max(box.height, 400);
  svg.setAttribute("viewBox", "0 0 " + width + " " + height);
  $("#map-empty").hidden = m.nodes.length > 0;
  const pos = layout(m.nodes, m.edges, width, height);
  const defs = el("svg:defs");
  for (const [cls, color] of [["forwarded", "#2e7d32"], ["dropped", "#d32f2f"], ["audit", "#ef6c00"], ["service", "#6a1b9a"]]) {
    defs.append(el("svg:marker", { id: "arrow-" + cls, viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" },
      el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: color })));
  }
  const edgeLayer = el("svg:g", { class: "edges" });
  const nodeLayer = el("svg:g", { class: "nodes" });
  // Edges between the same two nodes fan out so none hides another.
  const pairIndex = {};
  for (const e of m.edges) {
    const a = pos[e.source], b = pos[e.target];
    if (!a || !b) continue;
    const pair = [e.source, e.target].sort().join("|");
    const i = (pairIndex[pair] = (pairIndex[pair] || 0) + 1) - 1;
    const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
    const bend = (i % 2 ? -1 : 1) * (20 + 28 * Math.floor(i / 2)) * (e.source < e.target ? 1 : -1);
    const cx = (a.x + b.x) / 2 - (dy / len) * bend, cy = (a.y + b.y) / 2 + (dx / len) * bend;
    // Stop short of the target's box.
    const ex = b.x - (dx / len) * 60, ey = b.y - (dy / len) * 22;
    const cls = edgeClass(e.verdict);
    const g = el("svg:g", { class: "edge " + cls, "data-source": e.source, "data-target": e.target, "data-verdict": e.verdict, "data-policies": (e.policies || []).join(",") });
    g.append(el("svg:path", { d: "M " + a.x + " " + a.y + " Q " + cx + " " + cy + " " + ex + " " + ey, "marker-end": "url(#arrow-" + cls + ")" }));
    g.append(el("svg:text", { x: (a.x + 2 * cx + ex) / 4, y: (a.y + 2 * cy + ey) / 4 - 4, "text-anchor": "middle" }, edgeLabel(e)));
    g.append(el("svg:title", {}, e.source + " → " + e.target + ": " + e.flows + " flows" + (e.service ? " via Service " + e.service : "")));
    edgeLayer.append(g);
  }
  for (const n of m.nodes) {
    const p = pos[n.id];
    const g = el("svg:g", { class: "node " + n.kind, "data-id": n.id, transform: "translate(" + p.x + "," + p.y + ")" },
      el("svg:rect", { x: -60, y: -20, width: 120, height: 40 }),
      el("svg:text", { y: -4 }, n.label),
      el("svg:text", { y: 11, class: "kind" }, n.kind === "workload" ? n.namespace : n.kind));
    if (n.kind === "workload") g.addEventListener("click", () => openPolicy(n.id));
    nodeLayer.append(g);
  }
  svg.replaceChildren(defs, edgeLayer, nodeLayer);
}

async function refreshMap() {
  try {
    const m = await getJSON("/api/map?" + params({ namespace: state.ns }));
    state.map = m;
    if (state.tab === "map") drawMap(m);
    fillWorkloads(m);
  } catch (e) {
    $("#map-empty").hidden = false;
    $("#map-empty").textContent = "Map: " + e.message;
  }
}

// ---- flow table ----

function flowQuery() {
  const f = new FormData($("#filters"));
  const q = { namespace: state.ns };
  for (const k of ["pod", "label", "verdict", "protocol", "port", "policy", "since", "until"]) q[k] = (f.get(k) || "").trim();
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v) p.set(k, v);
  const history = f.get("history") === "on";
  return { params: p, follow: f.get("follow") === "on" && !q.until && !history, history };
}

function rowOf(r) {
  const peer = (p, pod, ip, port) => (pod || p.id) + (ip && p.kind !== "workload" ? " " + ip : "") + (port ? ":" + port : "");
  return el("tr", { class: "flow", "data-verdict": r.verdict },
    el("td", {}, new Date(r.time).toLocaleTimeString()),
    el("td", {}, r.node || ""),
    el("td", {}, peer(r.source, r.sourcePod, r.sourceIP, r.sourcePort)),
    el("td", {}, peer(r.destination, r.destinationPod, r.destinationIP, r.port) + (r.service ? " (" + r.service + ")" : "")),
    el("td", {}, r.protocol),
    el("td", { class: "verdict-" + r.verdict }, r.verdict + (r.reply ? " (reply)" : "")),
    el("td", {}, r.type),
    el("td", {}, (r.policies || []).join(", ")),
    el("td", {}, r.dropReason || ""));
}

function renderRows(note) {
  const body = $("#flows tbody");
  body.replaceChildren(...state.rows.slice().reverse().map(rowOf));
  $("#flows-info").textContent = note;
}

async function loadFlows() {
  if (state.stream) { state.stream.close(); state.stream = null; }
  // A later query supersedes this one: its answer, if it comes last, must
  // neither replace the table nor open a second stream.
  const gen = ++state.flowsGen;
  const { params: p, follow, history } = flowQuery();
  p.set("limit", String(MAX_ROWS));
  try {
    const list = await getJSON((history ? "/api/history?" : "/api/flows?") + p);
    if (gen !== state.flowsGen) return;
    state.rows = list.flows;
    let skipped = 0;
    const where = history ? " in the export files (" + list.files.length + " read" + (list.unreadable ? ", " + list.unreadable + " unreadable lines skipped" : "") + ")" : " held";
    $("#flows-info").dataset.listed = String(list.matched);
    $("#flows-info").dataset.followed = "0";
    renderRows(list.matched + " matching flows" + where + (list.matched > list.flows.length ? ", the last " + list.flows.length + " shown" : "") + (follow ? "; following" : ""));
    if (!follow) return;
    p.delete("limit");
    // The stream starts where the list ended (its cursor): flows that
    // arrived in between come first, none twice. On a reconnection
    // EventSource sends the last message's id, which the server resumes
    // from instead.
    p.set("after", list.cursor);
    state.stream = new EventSource("/api/stream?" + p);
    state.stream.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      skipped += msg.skipped;
      // What the stream accounted for (shown or skipped), for the page's
      // benchmark to tell whether it keeps up.
      const info = $("#flows-info").dataset;
      info.followed = String(Number(info.followed || 0) + msg.flows.length + msg.skipped);
      state.rows = state.rows.concat(msg.flows).slice(-MAX_ROWS);
      renderRows("following: " + state.rows.length + " latest flows shown" + (skipped ? ", " + skipped + " too many to show skipped" : ""));
    };
  } catch (e) {
    if (gen !== state.flowsGen) return;
    $("#flows-info").textContent = "";
    $("#flows-info").append(el("span", { class: "error" }, e.message));
  }
}

// ---- policy view ----

function fillWorkloads(m) {
  const sel = $("#workload");
  const ids = m.nodes.filter((n) => n.kind === "workload").map((n) => n.id);
  const have = Array.from(sel.options).map((o) => o.value);
  if (have.join("\n") === ids.join("\n")) return;
  sel.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  if (state.workload && ids.includes(state.workload)) sel.value = state.workload;
}

async function loadPolicy() {
  const view = $("#policy-view");
  const w = $("#workload").value;
  state.workload = w;
  if (!w) { view.replaceChildren(el("p", { class: "empty" }, "No workload with flows in this namespace.")); return; }
  try {
    const v = await getJSON("/api/policy?workload=" + encodeURIComponent(w));
    const labels = Object.entries(v.labels || {}).map(([k, x]) => k + "=" + x).join(", ");
    const table = el("table", { id: "policy-verdicts" }, el("thead", {}, el("tr", {}, el("th", {}, "Policy"), el("th", {}, "Forwarded"), el("th", {}, "Dropped"), el("th", {}, "Audit (would deny)"))));
    const tb = el("tbody");
    for (const p of v.policies) {
      tb.append(el("tr", {}, el("td", {}, p.name), el("td", {}, p.verdicts.FORWARDED || 0), el("td", { class: "verdict-DROPPED" }, p.verdicts.DROPPED || 0), el("td", { class: "verdict-AUDIT" }, p.verdicts.AUDIT || 0)));
    }
    if (!v.policies.length) tb.append(el("tr", {}, el("td", { colspan: 4 }, "No policy named by its flows: none selects it, or none decided yet.")));
    table.append(tb);
    view.replaceChildren(
      el("h2", {}, w),
      el("p", { class: "info" }, "Labels: " + (labels || "none") + " · " + v.flows + " flows held"),
      el("h3", {}, "Policies acting on its flows"), table,
      el("h3", {}, "Suggested policy (from its observed, forwarded connections)"),
      el("pre", { id: "suggested" }, v.suggested));
    if (!$("#whatif-input").value.trim()) $("#whatif-input").value = v.suggested;
  } catch (e) {
    view.replaceChildren(el("p", { class: "error" }, e.message));
  }
}

function openPolicy(id) {
  state.workload = id;
  if (state.map) fillWorkloads(state.map);
  $("#workload").value = id;
  $("#whatif-input").value = "";
  showTab("policy");
}

async function runWhatIf() {
  const out = $("#whatif-result");
  try {
    const a = await getJSON("/api/whatif", { method: "POST", headers: { "Content-Type": "application/yaml" }, body: $("#whatif-input").value });
    const rows = a.changes.map((c) => el("tr", {}, el("td", {}, c.source), el("td", {}, c.destination), el("td", {}, (c.ports || []).join(", ")), el("td", {}, c.connections), el("td", {}, c.now), el("td", { class: c.withCandidates === "denied" ? "verdict-DROPPED" : "verdict-FORWARDED" }, c.withCandidates)));
    out.replaceChildren(
      el("p", { id: "whatif-summary" }, a.changes.length + " of " + a.connections + " observed connections (" + a.flows + " flows) change verdict (rules in force: " + a.rulesSource + ")."),
      el("table", { id: "whatif-changes" }, el("thead", {}, el("tr", {}, el("th", {}, "Source"), el("th", {}, "Destination"), el("th", {}, "Ports"), el("th", {}, "Connections"), el("th", {}, "Now"), el("th", {}, "With the policy"))), el("tbody", {}, ...rows)));
  } catch (e) {
    out.replaceChildren(el("p", { class: "error", id: "whatif-summary" }, e.message));
  }
}

// ---- tabs and wiring ----

function showTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.tab === tab);
  for (const s of document.querySelectorAll(".tab")) s.classList.toggle("active", s.id === "tab-" + tab);
  if (tab === "map" && state.map) drawMap(state.map);
  if (tab === "flows") loadFlows();
  if (tab !== "flows") {
    state.flowsGen++; // a list still on its way opens no stream
    if (state.stream) { state.stream.close(); state.stream = null; }
  }
  if (tab === "policy") refreshMap().then(loadPolicy);
}

for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => showTab(b.dataset.tab));
$("#namespace").addEventListener("change", (e) => { state.ns = e.target.value; state.workload = ""; refreshMap(); if (state.tab === "flows") loadFlows(); });
$("#window").addEventListener("change", (e) => { state.window = e.target.value; refreshMap(); });
$("#filters").addEventListener("submit", (e) => { e.preventDefault(); loadFlows(); });
$("#workload").addEventListener("change", () => { $("#whatif-input").value = ""; loadPolicy(); });
$("#whatif-run").addEventListener("click", runWhatIf);
window.addEventListener("resize", () => state.map && state.tab === "map" && drawMap(state.map));

(async function start() {
  await refreshStatus();
  await refreshMap();
  setInterval(refreshStatus, 5000);
  setInterval(refreshMap, 2000);
})();
