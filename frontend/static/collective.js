// Job page for a collective test or a knob sweep: which collectives gave the same bits under which
// config, at what bandwidth; the cells, the figures, requested-vs-effective flags and the libraries'
// logs. While the job runs, the results recorded so far are refreshed every few seconds.
// All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const PARTIAL_REFRESH_MS = 5000; // often enough to watch, cheap to serve
  const FIGURES = ["heatmap", "bandwidth", "frontier", "equality"];

  const { API, $, el, getJSON, setRows, meta, humanBytes, pct, configLabel, reproBadge } = window.detlab;
  const { register, showLoadError, showNoResult, isFinished, jobConfigLabel, fetchResult, plot } = window.detlab.job;

  let lastPartial = 0;
  let shownResult = null; // the JSON text last rendered, so an unchanged refresh leaves charts and pickers alone
  let exportUrl = null;

  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  const fixed = (x, digits) => (isNum(x) ? x.toFixed(digits) : "—");
  // gloo on a CPU moves well under 1 GB/s; two significant digits keep small bandwidths readable.
  const gbps = (x) => (!isNum(x) ? "—" : x === 0 || Math.abs(x) >= 1 ? x.toFixed(2) : x.toPrecision(2));
  const yesNo = (flag) => el("span", { className: flag ? "yes" : "no", text: flag ? "yes" : "no" });

  function sci(x) {
    if (!isNum(x)) return "—";
    return x === 0 ? "0" : x.toExponential(2);
  }

  function orderOf(list, value) {
    const i = list.indexOf(value);
    return i < 0 ? list.length : i;
  }

  function describe(job) {
    const params = (job.params || {}).collective || {};
    const sizes = params.sizes || [];
    const range = sizes.length
      ? `${sizes.length} sizes ${humanBytes(sizes[0])}–${humanBytes(sizes[sizes.length - 1])}`
      : null;
    const sweep = (job.params || {}).sweep;
    const configs = job.kind === "sweep"
      ? `${(job.configs || []).length} cells over ${Object.keys((sweep || {}).knobs || {}).join(" × ") || "knobs"}`
      : (job.configs || []).map((c, i) => jobConfigLabel(job, i)).join(" vs ");
    return {
      facts: [
        configs,
        (params.ops || []).join(", ") || null,
        (params.dtypes || []).join(", ") || null,
        range,
        params.trials ? `${params.trials} trials` : null,
      ],
    };
  }

  // Names from the result first (a sweep's cells are named there), the job's configs otherwise.
  function resultNames(job, result) {
    const byIndex = new Map((result.configs || []).map((c) => [c.index, c.name]));
    return (index) => configLabel(job.kind, index, byIndex.get(index) ?? (job.configs || [])[index]?.name);
  }

  function renderSummary(job, result, label) {
    const cells = result.cells || [];
    const good = cells.filter((c) => c.reproducible).length;
    const verdict = $("collective-verdict");
    verdict.textContent = cells.length ? `${good}/${cells.length} reproducible` : "no cells yet";
    verdict.className = `badge ${cells.length && good === cells.length ? "badge-reproducible" : cells.length ? "badge-not-reproducible" : ""}`;

    const inconsistent = cells.filter((c) => c.rank_consistent === false).length;
    const configs = (result.configs || []).map((c) => c.index);
    const clean = configs.filter((i) => {
      const mine = cells.filter((c) => c.config_index === i);
      return mine.length > 0 && mine.every((c) => c.reproducible);
    });
    const summary = $("collective-summary");
    summary.replaceChildren(
      el("strong", { text: `${good} of ${cells.length} cells reproducible` }),
      ` across ${configs.length} ${configs.length === 1 ? "config" : "configs"} at world size ${result.world_size ?? job.world_size}`,
      inconsistent ? el("span", { className: "bad", text: ` · ranks disagree in ${inconsistent} ${inconsistent === 1 ? "cell" : "cells"}` })
        : " · ranks agree in every cell",
      el("br"),
      clean.length
        ? `Reproducible in every cell: ${clean.map(label).join(", ")}.`
        : el("span", { className: "bad", text: "No config is reproducible in every cell." })
    );
  }

  function cellRow(cell, label) {
    const spread = Array.isArray(cell.busbw_spread) && cell.busbw_spread.length === 2
      ? el("span", { className: "spread", text: `${gbps(cell.busbw_spread[0])}–${gbps(cell.busbw_spread[1])}` })
      : null;
    return el(
      "tr",
      { className: cell.reproducible ? "" : "row-bad" },
      el("td", { text: label(cell.config_index) }),
      el("td", {}, el("code", { text: cell.op })),
      el("td", { text: cell.dtype }),
      el("td", { className: "num", text: humanBytes(cell.bytes) }),
      el("td", { className: `num ${cell.distinct_in_process > 1 ? "cost" : ""}`, text: cell.distinct_in_process ?? "—" }),
      el("td", { className: `num ${cell.distinct_across_runs > 1 ? "cost" : ""}`, text: cell.distinct_across_runs ?? "—" }),
      el("td", {}, yesNo(cell.rank_consistent)),
      el("td", { className: "num" }, gbps(cell.busbw_gbps), spread),
      el("td", { className: "num", text: fixed(cell.time_us, 1) }),
      el("td", { className: "num", text: sci(cell.err_max_abs) }),
      el("td", { className: "num", text: fixed(cell.err_max_ulp, 1) }),
      el("td", { className: "num", text: isNum(cell.frac_diff) ? pct(cell.frac_diff, 2) : "—" }),
      el("td", {}, reproBadge(cell.reproducible))
    );
  }

  // Cells in the order the submit form lists ops and dtypes (the server's); unknown ones after, by name.
  function renderCells(result, label, order) {
    const all = [...(result.cells || [])].sort((x, y) =>
      x.config_index - y.config_index
      || orderOf(order.ops, x.op) - orderOf(order.ops, y.op) || String(x.op).localeCompare(String(y.op))
      || orderOf(order.dtypes, x.dtype) - orderOf(order.dtypes, y.dtype) || x.bytes - y.bytes);
    const onlyBad = $("cells-only-bad").checked;
    const shown = onlyBad ? all.filter((c) => !c.reproducible) : all;
    $("cells-count").textContent = `${shown.length} of ${all.length} cells shown`;
    setRows($("cells"), shown.map((c) => cellRow(c, label)),
      onlyBad ? "Every cell is reproducible." : "No cells recorded yet.", 13);
  }

  function plain(value) {
    if (value === null || value === undefined) return el("span", { className: "muted", text: "unset" });
    return el("code", { text: typeof value === "string" ? value : JSON.stringify(value) });
  }

  function renderEffective(result, label) {
    const rows = (result.effective || []).map((e) =>
      el(
        "tr",
        { className: "flag-row" },
        el("td", { text: label(e.config_index) }),
        el("td", { className: "num", text: `#${e.run_id}` }),
        el("td", {}, el("span", { className: "badge badge-flag", text: e.kind || "flag" })),
        el("td", {}, el("code", { text: e.key ?? "" })),
        el("td", {}, plain(e.requested)),
        el("td", {}, plain(e.effective)),
        el("td", { className: "small", text: e.detail || "" })
      )
    );
    const empty = result.note ? `none (${result.note})` : "none";
    setRows($("effective"), rows, empty, 7);
  }

  // ---- communication logs --------------------------------------------------------------------

  function choicesCell(choices) {
    if (!choices || choices.length === 0) return el("span", { className: "muted", text: "—" });
    const channels = (c) => {
      if (Array.isArray(c.channels)) return `, channels ${c.channels.join("..")}`;
      return c.channels !== undefined && c.channels !== null ? `, channels ${c.channels}` : "";
    };
    const items = choices.map((c) =>
      el("li", {
        text: `${c.op ?? "?"} ${isNum(c.bytes) ? humanBytes(c.bytes) : c.bytes ?? ""} → `
          + `${[c.algo, c.proto].filter(Boolean).join("/")}${channels(c)}${c.count > 1 ? ` (×${c.count})` : ""}`,
      })
    );
    return el("details", { className: "choices" }, el("summary", { text: `${choices.length} ${choices.length === 1 ? "choice" : "choices"}` }),
      el("ul", {}, ...items));
  }

  function renderLogs(result, label) {
    const note = $("logs-note");
    note.textContent = result.note || "";
    note.hidden = !result.note;
    const logs = [...(result.logs || [])].sort((x, y) => x.run_id - y.run_id || x.rank - y.rank);
    const rows = logs.map((log) =>
      el(
        "tr",
        {},
        el("td", { className: "num", text: `#${log.run_id}` }),
        el("td", { text: label(log.config_index) }),
        el("td", { className: "num" },
          el("a", { href: `${API}/runs/${log.run_id}/commlog/${log.rank}`, title: "the raw log" }, log.rank ?? "")),
        el("td", { text: log.library || "—" }),
        el("td", { text: log.version || "—" }),
        el("td", { className: "num", text: log.nchannels ?? "—" }),
        el("td", { text: (log.transports || []).join(", ") || "—" }),
        el("td", {}, choicesCell(log.choices))
      )
    );
    setRows($("logs"), rows, "No communication logs recorded.", 8);
    fillLogDiffPicker(logs, label);
  }

  // Two selects of the runs that have logs, kept on the user's choice when the results refresh.
  function fillLogDiffPicker(logs, label) {
    const runs = new Map();
    for (const log of logs) if (!runs.has(log.run_id)) runs.set(log.run_id, log.config_index);
    const ids = [...runs.keys()];
    for (const [id, fallback] of [["log-diff-a", ids[0]], ["log-diff-b", pickOther(ids, runs)]]) {
      const select = $(id);
      const keep = select.value;
      select.replaceChildren(...ids.map((run) => el("option", { value: String(run), text: `#${run} · ${label(runs.get(run))}` })));
      select.value = ids.map(String).includes(keep) ? keep : String(fallback ?? "");
    }
    // Nothing to pick from without the logs of two runs.
    $("log-diff-block").hidden = ids.length < 2;
  }

  // The second run defaults to one of another config: that is the diff people come for.
  function pickOther(ids, runs) {
    if (ids.length < 2) return ids[0];
    return ids.find((id) => runs.get(id) !== runs.get(ids[0])) ?? ids[1];
  }

  async function compareLogs() {
    const a = $("log-diff-a").value;
    const b = $("log-diff-b").value;
    const status = $("log-diff-status");
    const table = $("log-diff");
    if (!a || !b) return;
    if (a === b) {
      status.textContent = "Pick two different runs.";
      return;
    }
    status.textContent = "Comparing…";
    try {
      const result = await getJSON(`${API}/runs/${encodeURIComponent(a)}/logdiff/${encodeURIComponent(b)}`);
      $("log-diff-a-head").textContent = `Run #${result.a ?? a}`;
      $("log-diff-b-head").textContent = `Run #${result.b ?? b}`;
      const rows = (result.diff || []).map((d) =>
        el("tr", { className: "flag-row" }, el("td", {}, el("code", { text: d.key })), el("td", {}, plain(d.a)), el("td", {}, plain(d.b)))
      );
      setRows(table, rows, "The parsed log facts of the two runs are the same.", 3);
      table.hidden = false;
      status.textContent = `${rows.length} ${rows.length === 1 ? "fact differs" : "facts differ"}.`;
    } catch (err) {
      status.textContent = err.status === 404
        ? "One of the two runs has no parsed log."
        : `Could not compare the logs: ${err.message}`;
    }
  }

  // ---- export and figures --------------------------------------------------------------------

  function renderExport(job, result) {
    const link = $("download-export");
    if (exportUrl) URL.revokeObjectURL(exportUrl);
    exportUrl = null;
    if (!result.export) {
      link.hidden = true;
      return;
    }
    exportUrl = URL.createObjectURL(new Blob([JSON.stringify(result.export, null, 2)], { type: "application/json" }));
    link.href = exportUrl;
    link.setAttribute("download", `detlab-job-${job.id}-collective.json`);
    link.hidden = false;
  }

  async function drawFigures(jobId) {
    if (!window.Plotly) {
      $("heatmap").textContent = "The charts cannot be drawn: /static/plotly.min.js did not load.";
      return;
    }
    let figures;
    try {
      figures = await getJSON(`${API}/jobs/${jobId}/collective/figures`);
    } catch (err) {
      $("heatmap").textContent = `The charts could not be loaded: ${err.message}`;
      return;
    }
    for (const name of FIGURES) {
      const figure = figures[name];
      const target = $(name);
      target.hidden = !figure;
      // uirevision keeps zoom and legend clicks when partial results are redrawn.
      if (figure) await plot(target, { ...figure, layout: { ...(figure.layout || {}), uirevision: name } });
    }
  }

  // ---- loading -------------------------------------------------------------------------------

  // Without the server's lists the cells still sort, by name.
  const sortOrder = () => meta().catch(() => ({ ops: [], dtypes: [] }));

  async function render(job, result) {
    const text = JSON.stringify(result);
    $("collective").hidden = false;
    $("no-comparison").hidden = true;
    $("collective-partial").hidden = isFinished(job);
    if (text === shownResult) return;
    shownResult = text;
    const label = resultNames(job, result);
    const order = await sortOrder();
    renderSummary(job, result, label);
    renderCells(result, label, order);
    renderEffective(result, label);
    renderLogs(result, label);
    renderExport(job, result);
    $("cells-only-bad").onchange = () => renderCells(result, label, order);
    await drawFigures(job.id);
  }

  // While a job runs, show what has been recorded so far; a 404 only means nothing yet.
  async function running(job) {
    if (Date.now() - lastPartial < PARTIAL_REFRESH_MS) return;
    lastPartial = Date.now();
    try {
      await render(job, await getJSON(`${API}/jobs/${job.id}/collective`));
    } catch (err) {
      if (err.status !== 404) showLoadError(`Could not load the partial results: ${err.message}`);
    }
  }

  async function load(job) {
    let result;
    try {
      result = await fetchResult(job, `${API}/jobs/${job.id}/collective`);
    } catch (err) {
      $("collective").hidden = true;
      showNoResult(err.status !== 404
        ? `Could not load the collective results: ${err.message}`
        : job.status === "failed"
          ? "The job failed before any collective was recorded. See the run errors above."
          : "No collective results recorded for this job.");
      return;
    }
    await render(job, result);
  }

  $("log-diff-go").addEventListener("click", compareLogs);
  register(["collective", "sweep"], { runsHead: "Cells", describe, load, running });
})();
