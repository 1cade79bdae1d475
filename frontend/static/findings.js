// Findings page: the team's history as a config × stack matrix (GET /api/v1/findings/matrix), filtered by
// what was measured and when; a cell's measurements with links to their jobs (GET /api/v1/findings/history).
// All data goes into the page through textContent (never innerHTML).
(() => {
  "use strict";
  const { API, $, el, getJSON, setRows, pct, formatTime, badge } = window.detlab;

  // A measurement's subject: a train workload, a collective op and dtype, or a diagnosis (batch-invariance:
  // an op and dtype, or "model"; op-audit: an aten op of a workload's step, 1 of 1 when its bits held).
  function subject(o) {
    if (o.kind === "train") return o.workload;
    if (o.kind === "op-audit") return `op-audit · ${o.workload} · ${o.op}`;
    if (o.kind === "batch-invariance") return `batch-invariance · ${o.op}${o.dtype ? ` · ${o.dtype}` : ""}`;
    return `${o.op} · ${o.dtype}`;
  }

  function optionLabel(o) {
    return o.kind === "train" ? `train · ${o.workload}` : subject(o);
  }

  function optionValue(o) {
    return JSON.stringify(o.kind === "train" ? { kind: "train", workload: o.workload }
      : o.kind === "op-audit" ? { kind: o.kind, workload: o.workload, op: o.op, dtype: o.dtype }
        : { kind: o.kind, op: o.op, dtype: o.dtype });
  }

  function scopeParams() {
    const params = new URLSearchParams();
    const what = $("what").value;
    if (what) for (const [k, v] of Object.entries(JSON.parse(what))) params.set(k, v);
    if ($("since").value) params.set("since", $("since").value);
    if ($("until").value) params.set("until", $("until").value);
    return params;
  }

  function fillOptions(options, scope) {
    const select = $("what");
    // One kind of measurement per matrix: a train workload (or all of them), or a collective op and dtype.
    const anyTrain = options.some((o) => o.kind === "train") ? [[JSON.stringify({ kind: "train" }), "train · every workload"]] : [];
    const values = [...anyTrain, ...options.map((o) => [optionValue(o), optionLabel(o)])];
    select.replaceChildren(...[...new Map(values)].map(([value, label]) => el("option", { value, text: label })));
    const current = scope.kind === "train" && !scope.workload ? JSON.stringify({ kind: "train" })
      : scope.kind ? optionValue(scope) : "";
    if ([...select.options].some((o) => o.value === current)) select.value = current;
  }

  // ---- the heatmap: one coloured cell per config × stack ----------------------------------------------

  // Reproducibility 0 → red, 1 → green (hue 0 → 120); cost 0 → green, 50 % slower or more → red.
  const hue = (good) => Math.round(120 * Math.min(Math.max(good, 0), 1));
  function cellColour(cell, by) {
    if (by === "cost") {
      return typeof cell.cost === "number" ? `hsl(${hue(1 - cell.cost / 0.5)} 65% 85%)` : "";
    }
    return typeof cell.rate === "number" ? `hsl(${hue(cell.rate)} 65% 85%)` : "";
  }

  // The rate per time slice as a sparkline (oldest left); a slice without a measurement is a gap.
  function sparkline(trend) {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    const w = 64;
    const h = 16;
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.setAttribute("class", "sparkline");
    svg.setAttribute("role", "img");
    const known = trend.filter((r) => r !== null).length;
    svg.setAttribute("aria-label", `rate over the period, ${known} of ${trend.length} slices measured`);
    const step = trend.length > 1 ? w / (trend.length - 1) : 0;
    let path = "";
    trend.forEach((r, i) => {
      if (r === null) return;
      const x = (trend.length > 1 ? i * step : w / 2).toFixed(1);
      const y = (h - 2 - r * (h - 4)).toFixed(1);
      path += `${path && trend[i - 1] !== null ? "L" : "M"}${x},${y} `;
      const dot = document.createElementNS("http://www.w3.org/2000/svg", "circle");
      dot.setAttribute("cx", x);
      dot.setAttribute("cy", y);
      dot.setAttribute("r", "1.6");
      svg.append(dot);
    });
    const line = document.createElementNS("http://www.w3.org/2000/svg", "path");
    line.setAttribute("d", path.trim() || "M0,0");
    svg.prepend(line);
    return svg;
  }

  // What to run to fill a cell: the submit form with the workload chosen (and repeats to set).
  function measureLink(scope, text) {
    const params = new URLSearchParams();
    if (scope.kind === "train" && scope.workload) { params.set("kind", "train"); params.set("workload", scope.workload); }
    else if (scope.kind) params.set("kind", scope.kind);
    return el("a", { className: "measure", href: `/?${params}`, text });
  }

  function hoverText(cell) {
    const parts = [`${cell.config} on ${cell.stack}`,
      cell.rate === null ? (cell.lacks || "reproducibility not measured") : `reproducible ${cell.identical} of ${cell.comparable}`,
      `cost: ${cell.cost_text}${cell.cost_interval ? ` (95% ${cell.cost_interval.map((c) => pct(c, 0)).join(" to ")})` : ""}`,
      `${cell.measurements} measurements, last ${formatTime(cell.last_measured_at)}`];
    return parts.join("\n");
  }

  function cellNode(cell, scope, by, onPick) {
    const rate = cell.rate;
    const cls = rate === null ? "cell-none" : rate === 1 ? "cell-ok" : rate === 0 ? "cell-bad" : "cell-mixed";
    const main = by === "cost"
      ? el("strong", { className: "cell-main", text: cell.cost !== null ? cell.cost_text : "cost not measured" })
      : el("strong", { className: "cell-main", text: rate === null ? "not measured" : `${pct(rate, 0)}` });
    const lines = [main];
    if (rate !== null) lines.push(el("span", { className: "muted small", text: ` ${cell.identical}/${cell.comparable}` }));
    const pair = el("div", { className: "pair-verdict small" });
    if (rate === null) {
      // A single-repeat job has no rate, but its A-vs-B verdict (filled in by `pairVerdicts`).
      pair.dataset.job = cell.latest_job_id ?? "";
      lines.push(pair, el("div", { className: "small muted" }, `${cell.lacks || "not measured"} `));
    } else if (cell.first_divergent_step !== null) {
      lines.push(el("div", { className: "small", text: `parts at step ${cell.first_divergent_step}` }));
    }
    if (by !== "cost" && cell.cost !== null) lines.push(el("div", { className: "small muted", text: cell.cost_text }));
    if (cell.busbw_gbps !== null) lines.push(el("div", { className: "small muted", text: `${cell.busbw_gbps.toFixed(1)} GB/s` }));
    lines.push(el("div", { className: "cell-foot" }, sparkline(cell.trend),
      cell.latest_job_id ? el("a", { href: `/jobs/${cell.latest_job_id}`, className: "small", text: `job #${cell.latest_job_id}` }) : "",
      el("span", { className: "muted small", text: ` ${cell.measurements}×` })));
    const td = el("td", { className: `matrix-cell ${cls}`, tabindex: "0", title: hoverText(cell),
      "data-config": cell.config, "data-stack": cell.stack }, ...lines);
    td.style.background = cellColour(cell, by);
    td.addEventListener("click", (e) => { if (!e.target.closest("a")) onPick(cell); });
    td.addEventListener("keydown", (e) => { if (e.key === "Enter") onPick(cell); });
    return td;
  }

  // Cells without a rate whose latest job compared A with B once: that job's verdict, read from the job.
  async function pairVerdicts() {
    for (const box of document.querySelectorAll("#matrix .pair-verdict[data-job]")) {
      if (!box.dataset.job) continue;
      try {
        const job = await getJSON(`${API}/jobs/${box.dataset.job}`);
        if (job.verdict && (job.configs || []).length > 1) {
          box.replaceChildren("A vs B (one repeat each): ", badge(job.verdict));
        }
      } catch (_) {
        // the cell still says what is not measured
      }
    }
  }

  let last = null; // the matrix shown, redrawn when the colour toggle changes

  function render(m) {
    last = m;
    const by = $("colour-by").value;
    const table = $("matrix");
    table.tHead.rows[0].replaceChildren(el("th", { text: "Config \\ stack" }), ...m.stacks.map((s) => el("th", { text: s })));
    const byKey = new Map(m.cells.map((c) => [`${c.config}\u0000${c.stack}`, c]));
    const rows = m.configs.map((config) => el("tr", {}, el("th", { text: config }),
      ...m.stacks.map((stack) => {
        const cell = byKey.get(`${config}\u0000${stack}`);
        return cell ? cellNode(cell, m.scope, by, showHistory)
          : el("td", { className: "matrix-empty muted small" }, "not run on this stack: ", measureLink(m.scope, "measure it"));
      })));
    setRows(table, rows, "", m.stacks.length + 1);
    if (!rows.length) {
      table.tBodies[0].replaceChildren(el("tr", {}, el("td", { className: "muted", colSpan: String(m.stacks.length + 1) },
        "No findings in this scope. ", measureLink(m.scope, "Run a job with repeats ≥ 2"),
        " or import result files (detlab import-results results/*/*.json).")));
    }
    $("count").textContent = `${m.configs.length} configs × ${m.stacks.length} stacks, ${m.cells.length} cells`;
    renderPrescriptions(m.prescriptions);
    pairVerdicts();
  }

  // "What to set on each stack": the findings' prescriptions (detlab fix), when the server gives them.
  function renderPrescriptions(list) {
    const card = $("prescriptions-card");
    card.hidden = !Array.isArray(list) || list.length === 0;
    if (card.hidden) return;
    const words = { found: "set these", already: "already reproducible", none: "nothing found" };
    setRows($("prescriptions"), list.map((p) => el("tr", {},
      el("td", { text: p.stack }),
      el("td", { text: `${p.workload} · world size ${p.world_size}` }),
      el("td", {}, badge(p.verdict), el("span", { className: "small muted", text: ` ${words[p.verdict] || ""}` })),
      el("td", {}, ...(p.knobs || []).flatMap((k, i) => [i ? " " : "", el("code", { text: k })])),
      el("td", { className: "num", text: Array.isArray(p.reproducible) ? `${p.reproducible[0]}/${p.reproducible[1]}` : "—" }),
      el("td", { text: typeof p.cost === "number" ? `${pct(p.cost, 0)}${p.within_noise ? " (within noise)" : ""}` : "—" }),
      el("td", {}, p.job ? el("a", { href: `/jobs/${p.job}`, text: `job #${p.job}` }) : "—"))), "No prescriptions.", 7);
  }

  async function showHistory(cell) {
    const params = scopeParams();
    params.set("config", cell.config);
    params.set("stack", cell.stack);
    const h = await getJSON(`${API}/findings/history?${params}`);
    $("history-card").hidden = false;
    $("history-title").textContent = `${h.config}: ${h.measurements.length} measurements`;
    $("history-stack").textContent = h.stack;
    const fmt = (x) => (typeof x === "number" ? x.toFixed(1) : "—");
    setRows($("history"), h.measurements.map((r) => el("tr", {},
      el("td", { text: formatTime(r.measured_at) }),
      el("td", {}, r.job_url ? el("a", { href: r.job_url, text: `job ${r.job_id}` }) : el("span", { text: r.source })),
      el("td", { text: subject(r) }),
      el("td", { className: "num", text: `${r.identical}/${r.comparable}` }),
      el("td", { className: "num", text: r.rate === null ? "—" : pct(r.rate, 0) }),
      el("td", { text: r.cost === null ? "—" : r.cost_text }),
      el("td", { className: "num", text: r.first_divergent_step ?? "—" }),
      el("td", { className: "num", text: fmt(r.busbw_gbps) }))), "No measurements.", 8);
    $("history-card").scrollIntoView({ behavior: "smooth" });
  }

  async function load(params) {
    history.replaceState(null, "", `?${params}`);
    const m = await getJSON(`${API}/findings/matrix?${params}`);
    fillOptions(m.options, m.scope);
    render(m);
  }

  function start() {
    const query = new URLSearchParams(location.search);
    const params = new URLSearchParams();
    for (const key of ["kind", "workload", "op", "dtype", "since", "until"]) if (query.get(key)) params.set(key, query.get(key));
    $("since").value = params.get("since") || "";
    $("until").value = params.get("until") || "";
    const failed = (err) => { $("count").textContent = `Could not load the findings: ${err.message}`; };
    load(params).catch(failed);
    $("scope").addEventListener("change", (e) => {
      if (e.target.id === "colour-by") { if (last) render(last); return; }
      load(scopeParams()).catch(failed);
    });
  }

  start();
})();
