// deployctl dashboard: draws /api/events' documents. Every value from a host is put in the
// page as text (textContent), never as HTML: log lines and names are not markup.
"use strict";

const $ = (id) => document.getElementById(id);
let latest = null;
let selected = null; // the target shown in the detail view

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

// ---- words and numbers ----------------------------------------------------------------------

function ago(seconds) {
  if (seconds < 5) return "just now";
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${Math.round(seconds)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${String(Math.round(seconds % 60)).padStart(2, "0")}s`;
  const h = Math.floor(seconds / 3600);
  return h < 48 ? `${h}h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}m` : `${Math.floor(h / 24)}d ${h % 24}h`;
}

function num(value, digits = 0, suffix = "") {
  return value === null || value === undefined ? "-" : `${Number(value).toFixed(digits)}${suffix}`;
}

function ms(histogram) {
  const p50 = histogram && histogram.p50;
  return p50 === null || p50 === undefined ? "-" : `${(p50 * 1000).toFixed(1)} ms`;
}

function basename(path) {
  return path ? path.split("/").pop() : "-";
}

// ---- one deployment's facts from the status document -----------------------------------------

function entryOf(doc, row) {
  const host = doc.status.hosts[row.host] || {};
  return row.deployment === null ? host : (host.deployments || {})[row.deployment] || {};
}

// ready, starting, degraded, crashed, stopped; `error` when the host could not be read.
function stateOf(doc, row, entry) {
  if (!row.ok) return "error";
  if (row.multi_node && row.deployment && doc.status.deployments && doc.status.deployments[row.deployment]) {
    return doc.status.deployments[row.deployment].state;
  }
  return entry.state || "none";
}

function badge(state) {
  const words = { none: "no run", error: "unreachable" };
  return el("span", { class: `badge ${state}`, text: words[state] || state });
}

// ---- the table --------------------------------------------------------------------------------

function spark(points) {
  const width = 120, height = 22;
  const box = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}` });
  const values = (points || []).map((p) => p[1]).filter((v) => v !== null);
  if (values.length < 2) return box;
  const top = Math.max(...values, 1);
  const step = width / Math.max(points.length - 1, 1);
  const coords = points
    .map((p, i) => (p[1] === null ? null : `${(i * step).toFixed(1)},${(height - 2 - (p[1] / top) * (height - 4)).toFixed(1)}`))
    .filter((c) => c !== null);
  box.append(svg("polyline", { points: coords.join(" ") }));
  const title = svg("title");
  title.textContent = `peak ${top.toFixed(1)} tok/s`;
  box.append(title);
  return box;
}

function matches(row) {
  const group = $("group").value;
  const text = $("filter").value.trim().toLowerCase();
  if (group && !row.groups.includes(group)) return false;
  return !text || row.target.toLowerCase().includes(text);
}

function drawTable(doc) {
  const body = document.querySelector("#deployments tbody");
  const rows = [];
  let shown = 0;
  for (const row of doc.deployments) {
    if (!matches(row)) continue;
    shown += 1;
    const entry = entryOf(doc, row);
    const state = stateOf(doc, row, entry);
    const m = entry.metrics || {};
    const cells = [
      el("td", { text: row.target }),
      el("td", { text: row.groups.join(", ") || "-" }),
      el("td", { text: row.template || "-" }),
      el("td", { class: "num", text: row.threshold === null || row.threshold === undefined ? "-" : String(row.threshold) }),
      el("td", {}, badge(state)),
      el("td", { class: "num", text: duration(entry.uptime_s) }),
      el("td", { text: basename(entry.log) }),
      el("td", { class: "num", text: entry.gpu_memory_used_mib === null || entry.gpu_memory_used_mib === undefined ? "-" : `${entry.gpu_memory_used_mib} MiB` }),
      el("td", { class: "num", text: num(m.num_running_reqs) }),
      el("td", { class: "num", text: num(m.num_queue_reqs) }),
      el("td", { class: "num", text: num(m.gen_throughput, 1) }),
      el("td", {}, spark(doc.history[row.target])),
      el("td", { class: "num", text: m.token_usage === undefined || m.token_usage === null ? "-" : `${(m.token_usage * 100).toFixed(0)}%` }),
      el("td", { class: "num", text: num(m.spec_accept_length, 2) }),
      el("td", { class: "num", text: ms(m.time_to_first_token_seconds) }),
      el("td", { class: "num", text: ms(m.inter_token_latency_seconds) }),
    ];
    const tr = el("tr", { "data-target": row.target, "data-state": state }, ...cells);
    if (row.target === selected) tr.classList.add("selected");
    tr.addEventListener("click", () => select(row.target));
    rows.push(tr);
    const note = !row.ok ? `${row.error}${row.hint ? ` — ${row.hint}` : ""}` : entry.crash ? `crash: ${entry.crash}` : "";
    if (note) {
      rows.push(el("tr", { class: "note", "data-note-for": row.target }, el("td", { colspan: "16", text: note })));
    }
  }
  body.replaceChildren(...rows);
  $("empty").hidden = shown > 0;
}

function drawSummary(doc) {
  const counts = {};
  for (const row of doc.deployments) {
    const state = stateOf(doc, row, entryOf(doc, row));
    counts[state] = (counts[state] || 0) + 1;
  }
  const parts = Object.entries(counts).map(([state, n]) => el("span", {}, badge(state), ` ${n}`));
  $("summary").replaceChildren(...parts);
  const groups = new Set(doc.deployments.flatMap((r) => r.groups));
  const select = $("group");
  const known = new Set([...select.options].map((o) => o.value));
  for (const g of [...groups].sort()) if (!known.has(g)) select.append(el("option", { value: g, text: g }));
}

// ---- the detail view --------------------------------------------------------------------------

function select(target) {
  selected = selected === target ? null : target;
  if (latest) draw(latest);
}

function fact(label, value) {
  return el("div", {}, el("span", { text: label }), el("span", { text: value }));
}

function crashBox(crash) {
  const where = crash.file ? `${crash.file}:${crash.line}${crash.function ? ` (${crash.function})` : ""}` : "";
  const ranks = crash.ranks && crash.ranks.length ? `ranks ${crash.ranks.join(", ")}` : "";
  return el(
    "div",
    { class: "crash" },
    el("div", { class: "title", text: `${crash.title} — ${crash.exception || crash.signature}` }),
    el("div", { text: crash.message || "" }),
    el("div", { class: "muted", text: [where, ranks, crash.log_line ? `log line ${crash.log_line}` : ""].filter(Boolean).join(" · ") }),
    el("div", { text: `hint: ${crash.hint}` }),
  );
}

function chart(title, series, yLabel, marks) {
  // series: [{name, points: [[x, y]]}]; x is concurrency, drawn on a log2 axis.
  const width = 380, height = 200, left = 44, bottom = 24, right = 10, top = 10;
  const all = series.flatMap((s) => s.points).filter((p) => p[1] !== null && p[0] > 0);
  const figure = el("figure", {}, el("figcaption", { text: title }));
  if (!all.length) return figure;
  const xs = all.map((p) => Math.log2(p[0])), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys) * 1.1 || 1;
  const X = (x) => left + ((Math.log2(x) - x0) / (x1 - x0)) * (width - left - right);
  const Y = (y) => height - bottom - (y / y1) * (height - top - bottom);
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
  box.append(svg("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, stroke: "#bbb" }));
  box.append(svg("line", { x1: left, y1: top, x2: left, y2: height - bottom, stroke: "#bbb" }));
  const ticks = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
  for (const t of ticks) {
    const label = svg("text", { x: X(t), y: height - 8, "text-anchor": "middle" });
    label.textContent = String(t);
    box.append(label);
  }
  const yText = svg("text", { x: 2, y: top + 8 });
  yText.textContent = `${y1.toFixed(0)} ${yLabel}`;
  box.append(yText);
  const colours = ["#2458b3", "#b3261e", "#1f7a3a", "#9a6a00"];
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => p[1] !== null && p[0] > 0).sort((a, b) => a[0] - b[0]);
    box.append(svg("polyline", { points: pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: colours[i % 4], "stroke-width": 2 }));
    const key = svg("text", { x: width - right - 4, y: top + 10 + 12 * i, "text-anchor": "end", fill: colours[i % 4] });
    key.textContent = s.name;
    box.append(key);
  });
  for (const [x, label] of marks) {
    if (x === null || x === undefined || x <= 0) continue;
    box.append(svg("line", { x1: X(x), y1: top, x2: X(x), y2: height - bottom, stroke: "#888", "stroke-dasharray": "4 3" }));
    const text = svg("text", { x: X(x) + 3, y: top + 10 });
    text.textContent = label;
    box.append(text);
  }
  figure.append(box);
  return figure;
}

function curves(doc, target) {
  const figures = [];
  const tune = doc.tunes && doc.tunes[target];
  if (tune) {
    const phases = Object.entries(tune.phases || {});
    const series = (key) => phases.map(([name, p]) => ({ name, points: (p.levels || []).map((l) => [l.concurrency, key(l)]) }));
    const crossover = tune.crossover ? tune.crossover.last_win : null;
    const marks = [[tune.threshold, `T = ${tune.threshold}`], [crossover, "crossover"]];
    figures.push(chart(`tune ${tune.tune}: output tok/s`, series((l) => l.output_tokens_per_s), "tok/s", marks));
    figures.push(chart(`tune ${tune.tune}: ITL p50`, series((l) => l.itl_ms && l.itl_ms.p50), "ms", marks));
  }
  const sweeps = (doc.bench && doc.bench[target]) || [];
  if (sweeps.length) {
    const newest = sweeps[sweeps.length - 1];
    const levels = newest.levels || [];
    figures.push(chart("bench: output tok/s", [{ name: newest.run || "bench", points: levels.map((l) => [l.concurrency, l.output_tokens_per_s]) }], "tok/s", []));
    figures.push(chart("bench: ITL p50", [{ name: newest.run || "bench", points: levels.map((l) => [l.concurrency, l.itl_ms && l.itl_ms.p50]) }], "ms", []));
  }
  return figures;
}

function routerTable(router) {
  if (!router) return [];
  const rows = (router.workers || []).map((w) =>
    el("tr", {}, el("td", { text: w.url }), el("td", { text: w.deployment || ((router.unknown || {})[w.url] ? `${router.unknown[w.url]} (not read)` : "(not ours)") }),
      el("td", {}, badge(w.healthy === false ? "crashed" : w.healthy ? "ready" : "none")),
      el("td", { class: "num", text: w.load === null || w.load === undefined ? "-" : String(w.load) })));
  return [
    el("h3", { text: `router: ${(router.workers || []).length} workers` }),
    el("table", { class: "grid" }, el("thead", {}, el("tr", {}, el("th", { text: "worker URL" }), el("th", { text: "deployment" }), el("th", { text: "health" }), el("th", { class: "num", text: "load" }))), el("tbody", {}, ...rows)),
  ];
}

function canaryOf(doc, target) {
  // The newest canary of the target's router, when the target is that router or one of its replicas.
  return Object.values(doc.canaries || {}).find((c) => c.router === target || c.candidates.includes(target) || c.controls.includes(target));
}

function canaryBox(doc, target) {
  const c = canaryOf(doc, target);
  if (!c) return [];
  const sig = (v) => (v === null || v === undefined ? "-" : Number(v).toPrecision(4));
  const running = c.state === "running";
  // As the terminal says it: ends more than 100 times apart only say that few samples are in.
  const interval = c.low === null || c.high === null ? "" : c.low <= 0 || c.high / c.low > 100 ? " [still wide]" : ` [${c.low.toFixed(3)}, ${c.high.toFixed(3)}]`;
  const estimate = c.estimate === null ? "no estimate yet" : `candidate/control ${c.estimate.toFixed(3)}${interval}`;
  const how = running
    ? `running · ${c.samples} matched samples in ${duration(c.elapsed_s)} · last written ${ago(Math.max(0, doc.updated_at - c.updated_at))}`
    : c.reason;
  const rows = c.buckets.map((b) =>
    el("tr", { class: b.ratio !== null && b.ratio > 1 + c.max_regression ? "worse" : "" },
      el("td", { class: "num", text: String(b.bucket) }), el("td", { class: "num", text: sig(b.control) }),
      el("td", { class: "num", text: sig(b.candidate) }), el("td", { class: "num", text: b.ratio === null ? "-" : b.ratio.toFixed(3) }),
      el("td", { class: "num", text: `${b.control_n}/${b.candidate_n}` })));
  return [
    el("h3", { text: `canary ${c.canary}: ${c.candidates.join(", ")} against ${c.controls.join(", ")} (${c.metric})` }),
    el("div", { class: "canary" },
      el("span", { class: `badge ${running ? "starting" : c.decision === "rolled back" || c.decision === "failed" ? "crashed" : "ready"}`, text: running ? "running" : c.decision || "none" }),
      ` ${how} · ${c.verdict || "undecided"} · ${estimate}`),
    el("table", { class: "grid canary-buckets" },
      el("thead", {}, el("tr", {}, ...["load bucket", "control", "candidate", "ratio (>1 worse)", "samples"].map((h) => el("th", { class: "num", text: h })))),
      el("tbody", {}, ...rows)),
  ];
}

function drawDetail(doc) {
  const row = doc.deployments.find((r) => r.target === selected);
  $("detail").hidden = !row;
  if (!row) return;
  const entry = entryOf(doc, row);
  $("detail-title").textContent = row.target;
  const job = entry.job;
  $("detail-facts").replaceChildren(
    fact("state", stateOf(doc, row, entry)),
    fact("run", entry.run || "-"),
    fact(job ? "job" : "pid", job ? `${job.id} ${job.state}${job.reason ? ` (${job.reason})` : ""}` : String(entry.pid || "-")),
    fact("uptime", duration(entry.uptime_s)),
    fact("template", `${row.template || "-"}${row.threshold ? `, T ${row.threshold}` : ""}`),
    fact("GPUs", entry.gpus === null || entry.gpus === undefined ? "every GPU" : entry.gpus.join(",") || "none"),
    ...(job ? [fact("nodes", job.nodes.join(", ") || "-"), fact("time left", duration(job.time_left_s))] : []),
    fact("metrics", entry.metrics_note || (entry.metrics ? "read" : "-")),
  );
  $("detail-crash").replaceChildren(...(row.crashes || []).map(crashBox));
  $("detail-router").replaceChildren(...routerTable(entry.router));
  $("detail-canary").replaceChildren(...canaryBox(doc, row.target));
  $("detail-curves").replaceChildren(...curves(doc, row.target));
  $("detail-log-name").textContent = entry.log || "";
  const log = $("detail-log");
  const follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.replaceChildren(...(row.tail || []).map((line) => el("div", { class: /Traceback|Error|error:/.test(line) ? "crashline" : "", text: line })));
  if (follow) log.scrollTop = log.scrollHeight;
}

// ---- the patch audit matrix ------------------------------------------------------------------

function drawAudit(doc) {
  const audit = doc.audit;
  if (!audit) return;
  const hosts = Object.entries(audit.hosts);
  const sets = [...new Set(hosts.flatMap(([, h]) => Object.keys(h.patches || {})))].sort();
  const head = el("tr", {}, el("th", { text: "host" }), el("th", { text: "SGLang" }), ...sets.map((s) => el("th", { text: s })));
  const rows = hosts.map(([name, h]) => {
    if (!h.ok) return el("tr", {}, el("td", { text: name }), el("td", { colspan: String(sets.length + 1), class: "muted", text: h.error || "" }));
    const cells = sets.map((s) => {
      const st = (h.patches || {})[s];
      if (!st) return el("td", { class: "muted", text: "-" });
      const expected = (h.expected || []).includes(s);
      const drift = expected && st.state !== "applied";
      const word = st.state === "applied" ? `applied ${st.version || ""}` : st.state;
      return el("td", { class: drift ? "drift" : st.state === "applied" ? "applied" : "", title: st.detail || "", text: drift ? `${word} (expected ${st.expected_version})` : word });
    });
    return el("tr", {}, el("td", { text: name }), el("td", { text: h.sglang_version || "-" }), ...cells);
  });
  $("audit").replaceChildren(el("table", { class: "grid audit" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

// ---- updates ----------------------------------------------------------------------------------

function draw(doc) {
  latest = doc;
  drawSummary(doc);
  drawTable(doc);
  drawDetail(doc);
  drawAudit(doc);
  tick();
}

function tick() {
  if (!latest) return;
  $("updated").textContent = `updated ${ago(Date.now() / 1000 - latest.updated_at)} · refresh ${latest.refresh_s.toFixed(2)} s`;
}

function connect() {
  const source = new EventSource("/api/events");
  source.addEventListener("update", (event) => {
    $("connection").textContent = "live";
    $("connection").className = "badge ready";
    draw(JSON.parse(event.data));
  });
  source.addEventListener("failed", (event) => {
    $("connection").textContent = `failed: ${JSON.parse(event.data).error}`;
    $("connection").className = "badge crashed";
    source.close();
  });
  source.onerror = () => {
    $("connection").textContent = "reconnecting";
    $("connection").className = "badge starting";
  };
}

$("group").addEventListener("change", () => latest && draw(latest));
$("filter").addEventListener("input", () => latest && draw(latest));
setInterval(tick, 1000);
connect();
