// Findings page: the team's history as a config × stack matrix (GET /api/v1/findings/matrix), filtered by
// what was measured and when; a cell's measurements with links to their jobs (GET /api/v1/findings/history).
// All data goes into the page through textContent (never innerHTML).
(() => {
  "use strict";
  const { API, $, el, getJSON, setRows, pct, formatTime } = window.detlab;

  const TREND = "▁▂▃▄▅▆▇█";

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

  function trendText(trend) {
    return trend.map((r) => (r === null ? "·" : TREND[Math.min(TREND.length - 1, Math.floor(r * TREND.length))])).join("");
  }

  function cellNode(cell, onPick) {
    const rate = cell.rate;
    const cls = rate === null ? "cell-none" : rate === 1 ? "cell-ok" : rate === 0 ? "cell-bad" : "cell-mixed";
    const lines = [
      el("strong", { text: `${cell.identical}/${cell.comparable}` }),
      rate === null ? ` ${cell.lacks || "not measured"}` : ` ${pct(rate, 0)}`,
      el("br"),
      el("span", { className: "muted", text: cell.cost !== null ? cell.cost_text : cell.busbw_gbps !== null
        ? `${cell.busbw_gbps.toFixed(1)} GB/s` : "" }),
    ];
    if (cell.first_divergent_step !== null) lines.push(el("br"), el("span", { text: `parts at step ${cell.first_divergent_step}` }));
    lines.push(el("br"), el("span", { className: "trend", title: "rate over the period, oldest first", text: trendText(cell.trend) }));
    lines.push(" ", el("span", { className: "muted", text: `${cell.measurements} ×` }));
    const td = el("td", { className: `matrix-cell ${cls}`, tabindex: "0", title: `last measured ${formatTime(cell.last_measured_at)}` }, ...lines);
    td.addEventListener("click", () => onPick(cell));
    td.addEventListener("keydown", (e) => { if (e.key === "Enter") onPick(cell); });
    return td;
  }

  function render(m) {
    const table = $("matrix");
    table.tHead.rows[0].replaceChildren(el("th", { text: "Config \\ stack" }), ...m.stacks.map((s) => el("th", { text: s })));
    const byKey = new Map(m.cells.map((c) => [`${c.config}\u0000${c.stack}`, c]));
    const rows = m.configs.map((config) => el("tr", {}, el("th", { text: config }),
      ...m.stacks.map((stack) => {
        const cell = byKey.get(`${config}\u0000${stack}`);
        return cell ? cellNode(cell, showHistory) : el("td", { className: "muted", text: "—" });
      })));
    setRows(table, rows, "No findings in this scope: run a job, or import result files.", m.stacks.length + 1);
    $("count").textContent = `${m.configs.length} configs × ${m.stacks.length} stacks, ${m.cells.length} cells`;
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
    $("scope").addEventListener("change", () => load(scopeParams()).catch(failed));
  }

  start();
})();
