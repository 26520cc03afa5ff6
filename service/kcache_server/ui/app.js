// kcache dashboard: plain JS, no dependencies, read-only. Every value from the server reaches the
// page through textContent or SVG attributes, never as HTML.
"use strict";

(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const TEXT_SUFFIXES = [".source", ".ttir", ".ttgir", ".llir", ".ptx", ".amdgcn", ".json"];
  const COLORS = ["#2f6fde", "#e07b24", "#1f8a4c", "#9b4dca", "#c8372d", "#178f99", "#b38600", "#6b7280"];
  const state = { ns: null, topBy: "size", selectedRun: null };

  // ---- small DOM helpers ------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const $ = (id) => document.getElementById(id);
  const fmtBytes = (n) => {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
    return n + " B";
  };
  const fmtRate = (r) => (r === null || r === undefined ? "n/a" : r.toFixed(1) + "%");
  const fmtTime = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 16) : "");
  const lookups = (c) => (c.hits || 0) + (c.misses || 0) + (c.errors || 0);

  function status(text, bad) {
    const s = $("status");
    s.textContent = text || "";
    s.className = bad ? "bad" : "";
  }

  // ---- the API ------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function token() { return sessionStorage.getItem("kcache-token") || ""; }

  async function api(path, kind) {
    const headers = {};
    if (token()) headers.Authorization = "Bearer " + token();
    const response = await fetch(new URL(path, document.baseURI), { headers });
    if (!response.ok) {
      let message = response.status + " " + response.statusText;
      try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
      if (response.status === 401 || response.status === 403) {
        status("This server needs a token with read access: " + message, true);
      }
      throw new ApiError(response.status, message);
    }
    if (kind === "text") return response.text();
    if (kind === "blob") return response.blob();
    return response.json();
  }

  const nsPath = (rest) => "v1/" + encodeURIComponent(state.ns) + "/" + rest;

  // ---- namespaces ---------------------------------------------------------------------------

  async function loadNamespaces() {
    const select = $("ns");
    let names = [];
    try {
      names = (await api("v1/namespaces")).items;
    } catch (e) {
      if (e.status === 401 || e.status === 403) return false;
      throw e;
    }
    const wanted = new URLSearchParams(location.hash.slice(1)).get("ns") || state.ns;
    if (!names.length) names = ["default"];
    if (wanted && !names.includes(wanted)) names.unshift(wanted);
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    state.ns = wanted && names.includes(wanted) ? wanted : names.includes("default") ? "default" : names[0];
    select.value = state.ns;
    return true;
  }

  // ---- hit rate chart -----------------------------------------------------------------------

  function drawChart(runs) {
    const box = $("chart");
    const legend = $("legend");
    legend.replaceChildren();
    const points = runs.filter((r) => r.hit_rate !== null && r.hit_rate !== undefined)
      .map((r) => ({ ...r, t: r.ended_at || r.started_at }))
      .sort((a, b) => a.t - b.t);
    if (!points.length) {
      box.replaceChildren(el("div", { class: "empty" }, "No runs with lookups yet. A job's processes report their statistics at exit under KCACHE_RUN_ID, or under the id of their CI job, SLURM job, torchrun job or Kubernetes pod; a process with neither still shows in the top kernels by hits, below."));
      return;
    }
    const W = 900, H = 260, L = 44, R = 16, T = 12, B = 30;
    const tMin = Math.min(...points.map((p) => p.t));
    let tMax = Math.max(...points.map((p) => p.t));
    if (tMax - tMin < 1) tMax = tMin + 1;
    const pad = (tMax - tMin) * 0.04;
    const x = (t) => L + ((t - tMin + pad) / (tMax - tMin + 2 * pad)) * (W - L - R);
    const y = (rate) => T + (1 - rate / 100) * (H - T - B);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "hit rate over time", id: "hitrate-svg" });
    for (const g of [0, 25, 50, 75, 100]) {
      root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(g), y2: y(g) }));
      root.append(svg("text", { class: "axis", x: L - 6, y: y(g) + 4, "text-anchor": "end" }, g + "%"));
    }
    // Time labels as fine as the span needs (runs minutes apart repeated one "MM-DD HH:MM"
    // label six times); a tick whose label equals the previous one is left out.
    const span = tMax - tMin;
    const label = (t) => {
      const iso = new Date(t * 1000).toISOString();
      if (span < 300) return iso.slice(11, 19); // HH:MM:SS
      if (span < 86400) return iso.slice(11, 16); // HH:MM
      return iso.slice(5, 16).replace("T", " "); // MM-DD HH:MM
    };
    const ticks = Math.min(6, points.length);
    let previous = null;
    for (let i = 0; i < ticks; i++) {
      const t = ticks === 1 ? points[0].t : tMin + ((tMax - tMin) * i) / (ticks - 1);
      const text = label(t);
      if (text === previous) continue;
      previous = text;
      root.append(svg("text", { class: "axis tick", x: x(t), y: H - 8, "text-anchor": "middle" }, text));
    }
    const series = new Map();
    for (const p of points) {
      const name = p.workload || (p.workloads && p.workloads.length ? p.workloads.join("+") : "(no workload)");
      if (!series.has(name)) series.set(name, []);
      series.get(name).push(p);
    }
    let i = 0;
    for (const [name, pts] of series) {
      const color = COLORS[i++ % COLORS.length];
      if (pts.length > 1) {
        root.append(svg("polyline", { class: "series", stroke: color, points: pts.map((p) => `${x(p.t)},${y(p.hit_rate)}`).join(" ") }));
      }
      for (const p of pts) {
        const n = lookups(p);
        // Errors drawn apart from misses: a red bar as tall as the error share of lookups.
        if (p.errors && n) {
          const h = (p.errors / n) * (H - T - B);
          root.append(svg("rect", { class: "error-bar", x: x(p.t) - 3, y: H - B - h, width: 6, height: h }));
        }
        const dot = svg("circle", { class: "point", cx: x(p.t), cy: y(p.hit_rate), r: 5, fill: color, "data-run": p.run_id });
        dot.append(svg("title", {}, `${p.run_id} (${name}): ${fmtRate(p.hit_rate)} — ${p.hits} hits, ${p.misses} misses, ${p.errors} errors, ${p.processes} processes`));
        dot.addEventListener("click", () => showRun(p.run_id));
        root.append(dot);
      }
      legend.append(el("span", {}, el("span", { class: "swatch", "data-color": color }), name));
    }
    if (points.some((p) => p.errors)) {
      legend.append(el("span", {}, el("span", { class: "swatch", "data-color": "#c8372d" }), "errors (bar: share of lookups that failed; not misses)"));
    }
    legend.append(el("span", {}, "one point per run (click for details) · times in UTC"));
    for (const sw of legend.querySelectorAll(".swatch")) sw.style.background = sw.dataset.color;
    box.replaceChildren(root);
  }

  // ---- runs ---------------------------------------------------------------------------------

  async function loadRuns() {
    const workload = $("workload").value;
    const q = "runs?limit=200" + (workload ? "&workload=" + encodeURIComponent(workload) : "");
    const runs = (await api(nsPath(q))).items;
    if (!workload) {
      const names = [...new Set(runs.flatMap((r) => r.workloads || []))].sort();
      $("workload").replaceChildren(el("option", { value: "" }, "all workloads"), ...names.map((n) => el("option", { value: n }, n)));
    }
    drawChart(runs);
    const body = $("runs-table").tBodies[0];
    body.replaceChildren();
    if (!runs.length) {
      body.append(el("tr", {}, el("td", { colspan: 12, class: "empty" }, "No runs reported in this namespace yet: a job's processes report at exit under KCACHE_RUN_ID, or under their CI, SLURM, torchrun or Kubernetes job's id.")));
      return;
    }
    for (const r of runs.slice(0, 25)) {
      const tr = el("tr", { class: "clickable" + (r.run_id === state.selectedRun ? " selected" : ""), "data-run": r.run_id, onclick: () => showRun(r.run_id) },
        el("td", { class: "mono" }, r.run_id),
        el("td", { class: "mono muted source" }, runSource(r)),
        el("td", {}, r.workload || (r.workloads || []).join(", ")),
        el("td", { class: "env" }, (r.environments || []).map(envLabel).join("; ")),
        el("td", {}, fmtTime(r.ended_at)),
        el("td", { class: "num" }, r.processes),
        el("td", { class: "num" }, r.hits),
        el("td", { class: "num" }, r.misses),
        el("td", { class: "num" + (r.errors ? " bad" : "") }, r.errors),
        el("td", { class: "num" }, fmtRate(r.hit_rate)),
        el("td", { class: "num" }, fmtBytes(r.bytes_down)),
        el("td", { class: "num" }, r.saved_s.toFixed(1) + " s"));
      body.append(tr);
    }
  }

  // Where the run id came from: KCACHE_RUN_ID, or the launcher variable the clients derived it
  // from (GITHUB_RUN_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, ...); older clients do not say.
  function runSource(r) {
    return r.run_source || "–";
  }

  // torch/triton of the processes that reported (a fleet mid-upgrade shows one per version)
  function envLabel(e) {
    return `torch ${e.torch || "?"}, triton ${e.triton || "?"}`;
  }

  async function showRun(runId) {
    state.selectedRun = runId;
    for (const tr of $("runs-table").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.run === runId);
    const run = await api(nsPath("runs/" + encodeURIComponent(runId)));
    const rows = Object.entries(run.layers).map(([name, c]) => el("tr", {},
      el("td", {}, name), el("td", { class: "num" }, c.hits), el("td", { class: "num" }, c.misses),
      el("td", { class: "num" + (c.errors ? " bad" : "") }, c.errors),
      el("td", { class: "num" }, fmtRate(lookups(c) ? (100 * c.hits) / lookups(c) : null)),
      el("td", { class: "num" }, c.puts), el("td", { class: "num" }, fmtBytes(c.bytes_down)),
      el("td", { class: "num" }, fmtBytes(c.bytes_up)), el("td", { class: "num" }, c.saved_s.toFixed(1) + " s"),
      el("td", {}, Object.entries(c.served_by || {}).map(([k, v]) => `${k} ×${v}`).join(", ")),
      el("td", {}, Object.entries(c.miss_reasons).map(([k, v]) => `${k} ×${v}`).join(", ")),
      el("td", { class: c.errors ? "bad" : "" }, Object.entries(c.error_kinds).map(([k, v]) => `${k} ×${v}`).join(", "))));
    $("run-detail").replaceChildren(
      el("h3", {}, `Run ${run.run_id}${run.run_source ? ` (from ${run.run_source})` : ""}: ${fmtRate(run.hit_rate)} hit rate over ${run.processes} process${run.processes === 1 ? "" : "es"}`),
      el("table", { id: "run-layers" },
        el("thead", {}, el("tr", {}, ...["layer", "hits", "misses", "errors", "hit rate", "puts", "down", "up", "saved", "served by", "miss reasons", "error kinds"].map((h, i) => el("th", { class: i > 0 && i < 9 ? "num" : "" }, h)))),
        el("tbody", {}, ...rows)),
      el("table", { id: "run-environments" },
        el("thead", {}, el("tr", {}, ...["environment", "processes", "hits", "misses", "errors", "hit rate"].map((h, i) => el("th", { class: i > 0 ? "num" : "" }, h)))),
        el("tbody", {}, ...(run.environments || []).map((e) => el("tr", {},
          el("td", {}, envLabel(e)), el("td", { class: "num" }, e.processes), el("td", { class: "num" }, e.hits),
          el("td", { class: "num" }, e.misses), el("td", { class: "num" + (e.errors ? " bad" : "") }, e.errors),
          el("td", { class: "num" }, fmtRate(e.hit_rate))))))
      , ...runInsights(run));
  }

  // Where the run's start-up time went (torch's phase timers, grouped), what was installed but
  // not used or refused (post-install checks), and the misses `kcache explain --run` explains.
  function runInsights(run) {
    const out = [];
    const groups = Object.entries(run.phase_groups || {});
    if (groups.length) {
      out.push(el("h4", {}, "Start-up phases (seconds; each group's outermost timer: Dynamo contains AOTAutograd, which contains Inductor, ...)"),
        el("table", { id: "run-phases" },
          el("thead", {}, el("tr", {}, el("th", {}, "phase"), el("th", { class: "num" }, "seconds"))),
          el("tbody", {}, ...groups.map(([name, s]) => el("tr", {}, el("td", {}, name), el("td", { class: "num" }, s.toFixed(2)))))));
    }
    const checks = Object.entries(run.verification || {}).flatMap(([kind, reasons]) =>
      Object.entries(reasons).map(([reason, n]) => [kind.replaceAll("_", " "), reason, n]));
    if (checks.length) {
      out.push(el("h4", {}, "Post-install checks"),
        el("table", { id: "run-verification" },
          el("thead", {}, el("tr", {}, el("th", {}, "finding"), el("th", {}, "reason"), el("th", { class: "num" }, "count"))),
          el("tbody", {}, ...checks.map(([kind, reason, n]) => el("tr", {}, el("td", {}, kind), el("td", {}, reason), el("td", { class: "num" }, n))))));
    }
    if ((run.missed || []).length) {
      out.push(el("p", { id: "run-missed" }, `${run.missed.length} miss(es) recorded: kcache explain --run ${run.run_id} says why`));
    }
    return out;
  }

  // ---- unsound keys (kcache.layers.key_canary) -----------------------------------------------------------

  async function loadUnsound() {
    const body = $("unsound-table").tBodies[0];
    const list = await api(nsPath("unsound?limit=50"));
    body.replaceChildren();
    if (!list.items.length) {
      body.append(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "No key found unsound in this namespace.")));
      return;
    }
    for (const r of list.items) {
      const files = [...new Set(r.output_diff.filter((l) => l.startsWith("--- ")).map((l) => l.slice(4).replace(/^served\//, "")))];
      const suspects = r.suspects.length
        ? r.suspects.slice(0, 4).map((c) => c.name + ": " + (c.stored ?? "(absent)") + " → " + (c.wanted ?? "(absent)")).join("; ") + (r.suspects.length > 4 ? " (+" + (r.suspects.length - 4) + ")" : "")
        : (r.producer ? "none recorded" : "unknown: the producer recorded no parts");
      const when = r.reported_at ? r.reported_at.replace("T", " ").slice(0, 16) : "";
      body.append(el("tr", { class: "unsound-row" },
        el("td", {}, r.layer),
        el("td", { class: "mono", title: r.key }, r.key.length > 40 ? r.key.slice(0, 40) + "…" : r.key),
        el("td", {}, when),
        el("td", {}, files.join(", ") || r.compared),
        el("td", {}, suspects)));
    }
  }

  // ---- storage and top kernels --------------------------------------------------------------

  async function loadUsage() {
    const usage = await api(nsPath("stats/usage"));
    const kinds = Object.entries(usage.kinds);
    if (!kinds.length) {
      $("usage").replaceChildren(el("div", { class: "empty" }, "Nothing stored in this namespace."));
      return;
    }
    const max = Math.max(...kinds.map(([, u]) => u.bytes), 1);
    const rows = kinds.map(([kind, u]) => {
      const bar = el("div", { class: "bar" });
      bar.style.width = Math.max(0.5, (100 * u.bytes) / max) + "%";
      return el("tr", {}, el("td", {}, kind), el("td", { class: "num" }, u.entries), el("td", { class: "num" }, fmtBytes(u.bytes)), el("td", { class: "bar-cell" }, bar));
    });
    rows.push(el("tr", {}, el("th", {}, "total"), el("th", { class: "num" }, usage.total.entries), el("th", { class: "num" }, fmtBytes(usage.total.bytes)), el("th", {})));
    $("usage").replaceChildren(el("table", { id: "usage-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "kind"), el("th", { class: "num" }, "entries"), el("th", { class: "num" }, "bytes"), el("th", {}))),
      el("tbody", {}, ...rows)));
  }

  // Budget (soft/hard limit) against what kernels and entries use, pins, the last GC.
  const fmtAge = (s) => (s >= 86400 ? (s / 86400).toFixed(1) + " d" : s >= 3600 ? (s / 3600).toFixed(1) + " h" : s >= 60 ? Math.round(s / 60) + " min" : Math.round(s) + " s");

  async function loadRetention() {
    const gc = await api(nsPath("gc"));
    const p = gc.policy;
    const parts = [];
    const limit = p.hard_limit_bytes || p.soft_limit_bytes;
    const head = el("div", { id: "budget-line" }, "Kernels and entries: " + fmtBytes(gc.usage.bytes) + " (" + gc.usage.entries + ")");
    if (limit) {
      head.append(" of " + [p.soft_limit_bytes ? fmtBytes(p.soft_limit_bytes) + " soft" : "", p.hard_limit_bytes ? fmtBytes(p.hard_limit_bytes) + " hard" : ""].filter(Boolean).join(" / "));
      const bar = el("div", { class: "bar" + (gc.usage.bytes > (p.soft_limit_bytes || limit) ? " over" : "") });
      bar.style.width = Math.min(100, (100 * gc.usage.bytes) / limit) + "%";
      parts.push(head, el("div", { class: "budget-bar" }, bar));
    } else {
      head.append(" · no budget");
      parts.push(head);
    }
    const rules = ["min age " + fmtAge(p.min_age_s)];
    if (p.ttl_s) rules.push("TTL " + fmtAge(p.ttl_s));
    if (p.env_idle_s) rules.push("environments idle " + fmtAge(p.env_idle_s) + " purged");
    if (gc.pins.length) rules.push("pinned: " + gc.pins.join(", "));
    parts.push(el("div", { class: "muted" }, rules.join(" · ")));
    const last = gc.last_run;
    if (last) {
      const evicted = Object.entries(last.evicted).map(([why, a]) => a.entries + " " + why + " (" + fmtBytes(a.bytes) + ")");
      const oldest = last.oldest_used ? " · oldest item used " + fmtAge(Date.now() / 1000 - last.oldest_used) + " ago" : "";
      parts.push(el("div", { id: "last-gc", class: "muted" }, "Last GC " + fmtTime(last.started_at) + " UTC (" + last.trigger + ", " + last.seconds.toFixed(2) + " s): evicted " + (evicted.join(", ") || "nothing") + oldest));
    } else {
      parts.push(el("div", { id: "last-gc", class: "muted" }, "No GC has run in this namespace yet."));
    }
    $("budget").replaceChildren(...parts);
  }

  async function loadTop() {
    $("top-size-btn").classList.toggle("active", state.topBy === "size");
    $("top-hits-btn").classList.toggle("active", state.topBy === "hits");
    const top = await api(nsPath("stats/top?limit=15&by=" + state.topBy));
    const body = $("top-table").tBodies[0];
    body.replaceChildren();
    if (!top.items.length) {
      body.append(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "No kernels stored in this namespace.")));
      return;
    }
    for (const k of top.items) {
      body.append(el("tr", {},
        el("td", {}, el("a", { class: "mono", title: k.key, onclick: () => openKernel(k.key) }, k.kernel_name + " · " + k.key.slice(0, 12) + "…")),
        el("td", {}, k.target),
        el("td", { class: "num" }, fmtBytes(k.total_size)),
        el("td", { class: "num" }, fmtBytes(k.pack_size)),
        el("td", { class: "num" }, k.hits)));
    }
  }

  // ---- kernel browser -----------------------------------------------------------------------

  function hexToKey(hex) {
    // Triton's dir name: base32 (RFC 4648, no padding) of the 32-byte sha256.
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let bits = "";
    for (let i = 0; i < hex.length; i += 2) bits += parseInt(hex.slice(i, i + 2), 16).toString(2).padStart(8, "0");
    let out = "";
    for (let i = 0; i < bits.length; i += 5) out += alphabet[parseInt(bits.slice(i, i + 5).padEnd(5, "0"), 2)];
    return out;
  }

  async function search(raw) {
    let q = raw.trim();
    if (/^[0-9a-fA-F]{64}$/.test(q)) q = hexToKey(q.toLowerCase());
    q = q.toUpperCase();
    const results = $("results");
    if (q && !/^[A-Z2-7]*$/.test(q)) {
      results.replaceChildren(el("li", { class: "bad" }, "A kernel key is 52 characters of A-Z and 2-7 (or a 64-char hex hash)."));
      return;
    }
    if (q.length === 52) {
      results.replaceChildren();
      await openKernel(q);
      return;
    }
    const page = await api(nsPath("kernels?limit=50&prefix=" + encodeURIComponent(q)));
    results.replaceChildren(...page.items.map((k) => el("li", {},
      el("a", { class: "mono result", "data-key": k.key, onclick: () => openKernel(k.key) }, k.key),
      el("span", { class: "muted" }, `  ${k.kernel_name} · ${k.target.device_type}:${k.target.arch} · ${fmtBytes(k.total_size)}`))));
    if (!page.items.length) results.append(el("li", { class: "empty" }, "No kernel key starts with " + (q || "that") + "."));
  }

  async function openKernel(key) {
    const box = $("kernel");
    let m;
    try {
      m = await api(nsPath("kernels/" + key + "/manifest"));
    } catch (e) {
      box.replaceChildren(el("div", { class: "bad" }, e.status === 404 ? "No kernel " + key + " in this namespace." : e.message));
      return;
    }
    const viewer = el("pre", { id: "file-view", hidden: "" });
    const title = el("h3", { id: "file-title" });
    const actions = el("div", { class: "actions" });
    for (const f of m.files) {
      if (TEXT_SUFFIXES.some((s) => f.name.endsWith(s))) {
        actions.append(el("button", { type: "button", class: "view-file", "data-file": f.name, onclick: () => viewFile(key, f.name, viewer, title) }, f.name));
      }
    }
    actions.append(el("button", { type: "button", id: "download", onclick: () => download(key) }, "Download pack"));
    const producer = Object.entries(m.producer || {}).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(", ");
    const dl = el("dl", { class: "manifest" });
    for (const [k, v] of [["key", m.key], ["kernel", m.kernel_name], ["target", `${m.target.device_type} arch ${m.target.arch}, warp ${m.target.warp_size}`],
      ["triton", m.triton_version], ["size", `${fmtBytes(m.total_size)} unpacked, ${fmtBytes(m.pack_size)} packed`],
      ["created", fmtTime(Date.parse(m.created_at) / 1000)], ["producer", producer || "unknown"]]) {
      dl.append(el("dt", {}, k), el("dd", { class: k === "key" ? "mono" : "" }, v));
    }
    const files = el("table", { id: "files-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "file"), el("th", { class: "num" }, "size"), el("th", {}, "sha256"))),
      el("tbody", {}, ...m.files.map((f) => el("tr", {}, el("td", { class: "mono" }, f.name), el("td", { class: "num" }, fmtBytes(f.size)), el("td", { class: "mono muted" }, f.sha256.slice(0, 16) + "…")))));
    box.replaceChildren(el("h3", {}, m.kernel_name), dl, files, el("h3", {}, "View a file"), actions, title, viewer);
  }

  async function viewFile(key, name, viewer, title) {
    viewer.hidden = false;
    title.textContent = name;
    for (const b of document.querySelectorAll("button.view-file")) b.classList.toggle("active", b.dataset.file === name);
    viewer.textContent = "loading " + name + "…";
    try {
      viewer.textContent = await api(nsPath("kernels/" + key + "/files/" + encodeURIComponent(name)), "text");
      viewer.dataset.file = name;
    } catch (e) {
      viewer.textContent = "could not load " + name + ": " + e.message;
    }
  }

  async function download(key) {
    const blob = await api(nsPath("kernels/" + key), "blob");
    const url = URL.createObjectURL(blob);
    const a = el("a", { href: url, download: key + ".kpack" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // ---- cache entries: who signed them, with what provenance ------------------------------

  async function openEntry(layer, key) {
    const box = $("entry");
    let info;
    try {
      info = await api(nsPath("entries/" + encodeURIComponent(layer) + "/" + encodeURIComponent(key) + "/info"));
    } catch (e) {
      box.replaceChildren(el("div", { class: "bad" }, e.status === 404 ? `No ${layer} entry ${key} in this namespace.` : e.message));
      return;
    }
    const producer = Object.entries(info.producer || {}).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(", ");
    const rows = [["layer", info.layer], ["key", info.key], ["size", fmtBytes(info.size)], ["sha256", info.sha256],
      ["stored", fmtTime(Date.parse(info.created_at) / 1000)], ["producer", producer || "unknown"]];
    const sig = info.signature;
    let verdict;
    if (!sig) {
      rows.push(["signed by", "nobody: unsigned (consumers that verify refuse it)"]);
    } else {
      const p = sig.provenance;
      const env = Object.entries(p.environment || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ");
      rows.push(["signed by", `${sig.alg} key ${sig.key_id}`], ["host", p.host], ["run", p.run_id || "–"],
        ["signed at", fmtTime(Date.parse(p.created_at) / 1000)], ["environment", env || "unknown"], ["kcache", p.kcache_version]);
      verdict = sig.verified
        ? el("span", { class: "good" }, "checked by the service: signed by a key registered for this namespace")
        : el("span", { class: "muted" }, "not checked by the service (no keys registered for this namespace, or HMAC); consumers check it themselves");
    }
    const dl = el("dl", { class: "manifest", id: "entry-info" });
    for (const [k, v] of rows) dl.append(el("dt", {}, k), el("dd", { class: k === "key" || k === "sha256" ? "mono" : "" }, v));
    if (verdict) dl.append(el("dt", {}, "signature"), el("dd", { id: "entry-verdict" }, verdict));
    box.replaceChildren(dl);
  }

  // ---- wiring -------------------------------------------------------------------------------

  async function refresh() {
    status("loading…");
    try {
      if (!(await loadNamespaces())) return;
      location.hash = "ns=" + encodeURIComponent(state.ns);
      await Promise.all([loadRuns(), loadUsage(), loadRetention(), loadTop(), loadUnsound()]);
      status("");
      document.body.dataset.loaded = "1";
    } catch (e) {
      if (!(e instanceof ApiError && (e.status === 401 || e.status === 403))) status("Error: " + e.message, true);
    }
  }

  $("auth").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("kcache-token", $("token").value.trim());
    $("token").value = "";
    refresh();
  });
  $("forget").addEventListener("click", () => { sessionStorage.removeItem("kcache-token"); refresh(); });
  $("refresh").addEventListener("click", refresh);
  $("ns").addEventListener("change", () => {
    state.ns = $("ns").value;
    location.hash = "ns=" + encodeURIComponent(state.ns);
    $("workload").value = "";
    $("kernel").replaceChildren();
    $("entry").replaceChildren();
    $("results").replaceChildren();
    $("run-detail").replaceChildren();
    refresh();
  });
  $("workload").addEventListener("change", () => loadRuns().catch((e) => status("Error: " + e.message, true)));
  $("top-size-btn").addEventListener("click", () => { state.topBy = "size"; loadTop(); });
  $("top-hits-btn").addEventListener("click", () => { state.topBy = "hits"; loadTop(); });
  $("search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    search($("q").value).catch((e) => status("Error: " + e.message, true));
  });
  $("entry-search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("entry-key").value.trim();
    if (key) openEntry($("entry-layer").value, key).catch((e) => status("Error: " + e.message, true));
  });
  refresh();
})();
