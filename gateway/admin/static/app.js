// The polygate admin page: polls /api/overview once a second and draws it.
// Names come from clients (topics, groups, member ids), so they only ever go
// into the page as text (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;
const WINDOW_S = 300; // the chart's width in seconds
const history = []; // [{t, produced, fetched}] records per second, oldest first
let previous = null; // the last answer, for rates

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

const num = (n) => (n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"));
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
const rate = (r) => (r === null ? "-" : r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString("en-US"));
const tag = (protocol) => el("span", { class: `tag ${protocol}` }, protocol);
const sum = (items, key) => items.reduce((s, x) => s + (x[key] || 0), 0);

function fill(tbody, rows, emptyText, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: columns }, emptyText))]));
}

function drawListeners(view) {
  const rows = view.listeners.map((l) => el("tr", { "data-protocol": l.protocol },
    el("td", {}, tag(l.protocol)), el("td", {}, l.address),
    el("td", { class: "n", "data-field": "open" }, num(l.connections_open)),
    el("td", { class: "n" }, num(l.connections_total)), el("td", { class: "n" }, num(l.requests)),
    el("td", { class: "n" }, bytes(l.bytes_in)), el("td", { class: "n" }, bytes(l.bytes_out)),
    el("td", { class: "n" }, num(l.records_produced)), el("td", { class: "n" }, num(l.records_fetched)),
    el("td", { class: "n" }, num(l.auth_failures))));
  fill(document.querySelector("#listeners tbody"), rows, "no listeners", 10);
}

function drawTopics(view, dt) {
  const before = new Map((previous ? previous.topics : []).map((t) => [t.topic, t.end_offsets]));
  const rows = view.topics.map((t) => {
    const r = dt && before.has(t.topic) ? Math.max(t.end_offsets - before.get(t.topic), 0) / dt : null;
    const parts = t.partitions.map((p) =>
      `${p.partition}: ${p.log_start_offset} … ${p.high_watermark}` +
      (p.log_end_offset !== p.high_watermark ? ` (${p.log_end_offset})` : "")).join(" · ");
    return el("tr", { "data-topic": t.topic },
      el("td", {}, t.topic), el("td", { class: "n" }, num(t.partitions.length)),
      el("td", { class: "n", "data-field": "records" }, num(t.records)),
      el("td", { class: "n" }, bytes(t.size)), el("td", { class: "n", "data-field": "rate" }, rate(r)),
      el("td", { class: "parts" }, parts));
  });
  fill(document.querySelector("#topics tbody"), rows, "no topics yet", 6);
  document.getElementById("topic-count").textContent = `${view.topics.length}`;
}

function drawGroups(view) {
  const box = document.getElementById("groups");
  const error = document.getElementById("groups-error");
  error.hidden = !view.groups_error;
  error.textContent = view.groups_error ? `groups not read: ${view.groups_error}` : "";
  document.getElementById("group-count").textContent = `${view.groups.length}`;
  if (!view.groups.length) {
    box.replaceChildren(el("p", { class: "empty" }, "no groups yet"));
    return;
  }
  box.replaceChildren(...view.groups.map((g) => {
    const members = g.members.map((m) => el("tr", { "data-member": m.member_id },
      el("td", {}, m.member_id), el("td", { "data-field": "protocol" }, tag(m.protocol)),
      el("td", {}, m.client_id || "-"), el("td", {}, m.client_host || "-"),
      el("td", {}, Object.entries(m.assignment).map(([t, ps]) => `${t}: ${ps.join(",")}`).join("  ") || "-")));
    const partitions = g.partitions.map((p) => el("tr", { "data-partition": `${p.topic}/${p.partition}` },
      el("td", {}, p.topic), el("td", { class: "n" }, num(p.partition)), el("td", {}, p.member || "-"),
      el("td", { class: "n" }, num(p.committed)), el("td", { class: "n" }, num(p.high_watermark)),
      el("td", { class: `n${p.lag > 1000 ? " lag-high" : ""}`, "data-field": "lag" }, num(p.lag))));
    const memberTable = el("table", { class: "members" },
      el("thead", {}, el("tr", {}, ...["member", "protocol", "client id", "client host", "assignment"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...(members.length ? members : [el("tr", {}, el("td", { class: "empty", colspan: 5 }, "no members"))])));
    const partitionTable = el("table", { class: "lag" },
      el("thead", {}, el("tr", {}, el("th", {}, "topic"), el("th", { class: "n" }, "partition"), el("th", {}, "member"),
        el("th", { class: "n" }, "committed"), el("th", { class: "n" }, "high watermark"), el("th", { class: "n" }, "lag"))),
      el("tbody", {}, ...partitions));
    return el("div", { class: "group", "data-group": g.group },
      el("h3", {}, g.group, el("small", {},
        `${g.state} · generation ${g.generation} · ${g.assignor || g.protocol_type || "no assignor"} · lag ${num(g.lag)}`)),
      memberTable, partitions.length ? partitionTable : el("p", { class: "empty" }, "no partitions assigned or committed"));
  }));
}

function drawChart() {
  const canvas = document.getElementById("chart");
  const scale = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 960, height = canvas.clientHeight || 220;
  canvas.width = width * scale;
  canvas.height = height * scale;
  const ctx = canvas.getContext("2d");
  ctx.scale(scale, scale);
  ctx.clearRect(0, 0, width, height);
  canvas.dataset.points = String(history.length);
  const pad = { left: 56, right: 8, top: 10, bottom: 20 };
  const w = width - pad.left - pad.right, h = height - pad.top - pad.bottom;
  const top = Math.max(10, ...history.map((p) => Math.max(p.produced, p.fetched))) * 1.1;
  const now = history.length ? history[history.length - 1].t : 0;
  const x = (t) => pad.left + w - ((now - t) / WINDOW_S) * w;
  const y = (v) => pad.top + h - (v / top) * h;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#667085";
  ctx.strokeStyle = "#e4e7ec";
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    ctx.beginPath(); ctx.moveTo(pad.left, y(v)); ctx.lineTo(pad.left + w, y(v)); ctx.stroke();
    ctx.fillText(rate(v), 4, y(v) + 4);
  }
  ctx.fillText(`-${WINDOW_S / 60} min`, pad.left, height - 4);
  ctx.fillText("now", pad.left + w - 22, height - 4);
  const style = getComputedStyle(document.documentElement);
  for (const [key, color] of [["produced", "--produced"], ["fetched", "--fetched"]]) {
    ctx.strokeStyle = style.getPropertyValue(color).trim();
    ctx.lineWidth = 2;
    ctx.beginPath();
    history.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p[key])) : ctx.moveTo(x(p.t), y(p[key]))));
    ctx.stroke();
    const last = history[history.length - 1];
    if (last) { // the newest point, visible from the first second on
      ctx.fillStyle = ctx.strokeStyle;
      ctx.beginPath(); ctx.arc(x(last.t), y(last[key]), 3, 0, 2 * Math.PI); ctx.fill();
    }
  }
}

function draw(view) {
  const dt = previous ? view.time - previous.time : 0;
  if (dt > 0) {
    const produced = (sum(view.listeners, "records_produced") - sum(previous.listeners, "records_produced")) / dt;
    const fetched = (sum(view.listeners, "records_fetched") - sum(previous.listeners, "records_fetched")) / dt;
    history.push({ t: view.time, produced: Math.max(produced, 0), fetched: Math.max(fetched, 0) });
    while (history.length && view.time - history[0].t > WINDOW_S) history.shift();
    document.getElementById("rate-produced").textContent = rate(Math.max(produced, 0));
    document.getElementById("rate-fetched").textContent = rate(Math.max(fetched, 0));
  }
  document.getElementById("identity").textContent = `${view.version} · storage ${view.storage}`;
  drawListeners(view);
  drawTopics(view, dt);
  drawGroups(view);
  drawChart();
  previous = view;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("api/overview", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const view = await response.json();
    draw(view);
    status.dataset.state = view.available ? "ok" : "error";
    status.textContent = view.available ? `updated ${new Date(view.time * 1000).toLocaleTimeString()}` : "storage unavailable";
    status.dataset.updates = String(Number(status.dataset.updates || 0) + 1);
  } catch (e) {
    status.dataset.state = "error";
    status.textContent = `gateway not answering (${e.message})`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
