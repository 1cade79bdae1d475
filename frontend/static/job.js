// Job page: polls the job until it finishes, then shows where the two runs first diverge (train), or
// which collectives gave the same bits under which config, at what bandwidth (collective, sweep).
// All data goes into the page through textContent (never innerHTML), so tensor names, node
// names and error logs cannot inject markup.
"use strict";

(function () {
  const API = "/api/v1";
  const POLL_MS = 1000;
  const POLL_ERROR_MS = 3000;
  const COMPARISON_RETRIES = 10; // a succeeded job's comparison may land a moment after its status
  const ERROR_TAIL_LINES = 15;
  const MANY_RUNS = 12;
  const FINISHED = new Set(["succeeded", "failed"]);
  const PARTIAL_REFRESH_MS = 5000; // collective results while a job runs: often enough to watch, cheap to serve
  const COLLECTIVE_KINDS = new Set(["collective", "sweep"]);
  const OP_ORDER = ["all_reduce_sum", "all_reduce_avg", "all_gather", "reduce_scatter", "broadcast"];
  const DTYPE_ORDER = ["float32", "bfloat16", "float16"];
  const FIGURES = ["heatmap", "bandwidth", "frontier", "equality"];
  const PLOTLY_CONFIG = { responsive: true, displaylogo: false };

  const { $, el, getJSON, setRows } = window.detlab;
  let runsFolded = false; // fold a long runs list once, then leave it to the user

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function badge(value) {
    return el("span", { className: `badge badge-${value}`, text: value });
  }

  function showLoadError(message) {
    const box = $("load-error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  const pct = (x, digits = 1) => `${(x * 100).toFixed(digits)}%`;

  function sideLetter(index) {
    return index === 0 ? "A" : index === 1 ? "B" : String(index);
  }

  function configLabel(job, index) {
    const config = (job.configs || [])[index];
    // A sweep's cells have no baseline, so they go by number rather than A/B.
    const prefix = job.kind === "sweep" ? String(index) : sideLetter(index);
    return `${prefix}: ${config ? config.name : "?"}`;
  }

  function humanBytes(n) {
    for (const [unit, scale] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (n >= scale) {
        const value = n / scale;
        return `${Number.isInteger(value) ? value : Number(value.toPrecision(3))} ${unit}`;
      }
    }
    return `${n} B`;
  }

  function collectiveMeta(job) {
    const params = (job.params || {}).collective || {};
    const sizes = params.sizes || [];
    const range = sizes.length
      ? `${sizes.length} sizes ${humanBytes(sizes[0])}–${humanBytes(sizes[sizes.length - 1])}`
      : null;
    const sweep = (job.params || {}).sweep;
    const configs = job.kind === "sweep"
      ? `${(job.configs || []).length} cells over ${Object.keys((sweep || {}).knobs || {}).join(" × ") || "knobs"}`
      : (job.configs || []).map((c, i) => configLabel(job, i)).join(" vs ");
    return [
      configs,
      (params.ops || []).join(", ") || null,
      (params.dtypes || []).join(", ") || null,
      range,
      params.trials ? `${params.trials} trials` : null,
    ];
  }

  function errorTail(text) {
    if (!text) return "";
    return String(text).trimEnd().split("\n").slice(-ERROR_TAIL_LINES).join("\n");
  }

  // ---- job and runs --------------------------------------------------------------------------

  function renderJob(job) {
    document.title = `detlab · job #${job.id}`;
    $("job-title").textContent = `Job #${job.id} · ${job.kind}`;
    $("job-status").replaceChildren(badge(job.status));
    const names = (job.configs || []).map((c, i) => configLabel(job, i)).join(" vs ");
    const created = job.created_at ? new Date(job.created_at) : null;
    const collective = COLLECTIVE_KINDS.has(job.kind);
    $("runs-steps-head").textContent = collective ? "Cells" : "Steps";
    $("job-meta").textContent = [
      ...(collective ? collectiveMeta(job) : [names, `workload ${job.workload}`]),
      `world size ${job.world_size}`,
      collective ? null : `${job.steps} steps`,
      `${job.repeats} ${job.repeats === 1 ? "repeat" : "repeats"}`,
      created && !Number.isNaN(created.getTime()) ? `created ${created.toLocaleString()}` : null,
    ].filter(Boolean).join(" · ");

    const progress = Math.min(Math.max(Number(job.progress) || 0, 0), 1);
    const bar = $("progress");
    bar.value = progress;
    bar.setAttribute("aria-valuenow", String(progress));
    const runs = job.runs || [];
    const done = runs.filter((r) => FINISHED.has(r.status)).length;
    $("progress-text").textContent = `${pct(progress, 0)} · ${done} of ${runs.length} runs finished`;

    const rows = runs.map((run) =>
      el(
        "tr",
        { className: `run-${run.status}` },
        el("td", { className: "num", text: `#${run.id}` }),
        el("td", { text: configLabel(job, run.config_index) }),
        el("td", { className: "num", text: run.repeat }),
        el("td", {}, badge(run.status)),
        el("td", { className: "num", text: `${run.steps_done ?? 0}/${run.steps_total ?? "?"}` }),
        el("td", { className: "num", text: run.attempt ?? "" }),
        el("td", { text: run.node || "—" }),
        el("td", {}, run.error ? el("pre", { className: "error-tail", text: errorTail(run.error) }) : "")
      )
    );
    setRows($("runs"), rows, "No runs yet.", 8);
    // A sweep has a run per cell and repeat; folded, the results stay in view.
    if (!runsFolded && runs.length > MANY_RUNS) $("runs-details").open = false;
    runsFolded = true;
    // The last lines of a traceback say what went wrong; show them first.
    for (const pre of $("runs").querySelectorAll("pre.error-tail")) pre.scrollTop = pre.scrollHeight;
  }

  // ---- comparison ----------------------------------------------------------------------------

  function formatValue(value) {
    if (value === null || value === undefined) return el("span", { className: "muted", text: "unset" });
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function renderFacts(job, cmp) {
    const verdict = $("verdict");
    verdict.textContent = cmp.verdict;
    verdict.className = `badge badge-${cmp.verdict}`;

    const notes = cmp.reason ? [cmp.reason] : [];
    $("note").textContent = notes.join(" ");
    $("note").hidden = notes.length === 0;
    $("note").classList.toggle("note-warn", cmp.verdict === "incomparable");

    $("first-step").textContent = cmp.first_divergent_step ?? (cmp.verdict === "identical" ? "none" : "—");
    $("steps-differing").textContent = `${cmp.steps_differing ?? 0} of ${cmp.steps_compared ?? 0}`;
    $("runs-compared").textContent = `#${cmp.run_a} (A) vs #${cmp.run_b} (B)`;
    $("mode").textContent = cmp.mode || "—";

    const tensors = cmp.first_divergent_tensors || [];
    $("divergence-block").hidden = tensors.length === 0;
    const ranks = cmp.ranks || [];
    $("divergent-ranks").textContent = cmp.mode === "rank-consensus"
      ? `At step ${cmp.first_divergent_step}; rank-consensus comparison, so no per-rank breakdown.`
      : `At step ${cmp.first_divergent_step}, on ${ranks.length === 1 ? "rank" : "ranks"} ${ranks.join(", ") || "—"}.`;
    setRows(
      $("divergent-tensors"),
      tensors.map((name, i) => el("tr", {}, el("td", { className: "num idx", text: i + 1 }), el("td", {}, el("code", { text: name })))),
      "No tensors differ.",
      2
    );
  }

  function renderConfigDiff(job, cmp) {
    $("config-a-name").textContent = (job.configs || [])[0]?.name || "";
    $("config-b-name").textContent = (job.configs || [])[1]?.name || "";
    const rows = (cmp.config_diff || []).map((d) =>
      el("tr", {}, el("td", {}, el("code", { text: d.key })), el("td", {}, formatValue(d.a)), el("td", {}, formatValue(d.b)))
    );
    setRows($("config-diff"), rows, "The two configs are identical.", 3);
  }

  // Lowest rank of each compared run; a differing fact (device, driver, torch, NCCL) is marked.
  function renderEnvironment(cmp) {
    const rows = (cmp.environment || []).map((f) =>
      el("tr", { className: f.differs ? "differs" : "" },
        el("td", { text: f.key }), el("td", { text: f.a ?? "—" }), el("td", { text: f.b ?? "—" })));
    setRows($("environment"), rows, "No environment recorded.", 3);
  }

  function renderMismatches(job, cmp) {
    const mismatches = cmp.effective_mismatches || [];
    $("mismatches-block").hidden = mismatches.length === 0;
    const runConfig = new Map((job.runs || []).map((r) => [r.id, r.config_index]));
    $("mismatches").replaceChildren(
      ...mismatches.map((m) => {
        const side = runConfig.has(m.run_id) ? ` (${configLabel(job, runConfig.get(m.run_id))})` : "";
        return el(
          "li",
          {},
          el("code", { text: m.key }),
          ` requested ${JSON.stringify(m.requested)}, effective ${JSON.stringify(m.effective)}`,
          el("span", { className: "muted", text: ` · run #${m.run_id}${side}, rank ${m.rank}` })
        );
      })
    );
  }

  // Table cell: the cost itself as a percentage (negative = faster than the baseline).
  function costText(cost) {
    if (cost === null || cost === undefined) return "baseline";
    return pct(cost);
  }

  function renderThroughput(jobId, cmp) {
    const rows = cmp.throughput || [];
    const fmt = (x, d = 1) => (typeof x === "number" && Number.isFinite(x) ? x.toFixed(d) : "—");
    setRows(
      $("throughput"),
      rows.map((t) =>
        el(
          "tr",
          {},
          el("td", { text: `${sideLetter(t.config_index)}: ${t.name}` }),
          el("td", { className: "num", text: fmt(t.samples_per_s) }),
          el("td", { className: "num", text: t.spread ? `${fmt(t.spread[0], 0)}–${fmt(t.spread[1], 0)}` : "—" }),
          el("td", { className: "num", text: `${fmt(t.step_time_ms_median)} ms` }),
          el("td", { className: "num", text: t.runs ?? "" }),
          el("td", { className: `num ${t.cost > 0 ? "cost" : ""}`, text: costText(t.cost) })
        )
      ),
      "No throughput measured.",
      6
    );
    drawThroughput(jobId, rows.filter((t) => typeof t.samples_per_s === "number"));
  }

  async function drawThroughput(jobId, rows) {
    const target = $("throughput-chart");
    if (rows.length === 0 || !window.Plotly) {
      target.hidden = true;
      return;
    }
    target.hidden = false;
    try {
      const figure = await getJSON(`${API}/jobs/${jobId}/throughput/figure`);
      await window.Plotly.newPlot(target, figure.data || [], figure.layout || {}, { responsive: true, displaylogo: false });
    } catch (err) {
      target.textContent = `The throughput chart could not be loaded: ${err.message}`;
    }
  }

  function renderReproducibility(cmp) {
    const rows = (cmp.reproducibility || []).map((r) =>
      el(
        "tr",
        {},
        el("td", { text: `${sideLetter(r.config_index)}: ${r.name}` }),
        el("td", { className: "num", text: r.recorded === r.repeats ? r.repeats : `${r.recorded} of ${r.repeats}` }),
        el("td", { className: "num", text: r.identical_to_first }),
        el("td", { className: `num ${r.rate < 1 ? "cost" : ""}`, text: typeof r.rate === "number" ? pct(r.rate, 0) : "—" })
      )
    );
    setRows($("reproducibility"), rows, "No repeats to compare.", 4);
  }

  async function drawChart(jobId) {
    const target = $("chart");
    if (!window.Plotly) {
      target.textContent = "The chart cannot be drawn: /static/plotly.min.js did not load.";
      return;
    }
    try {
      const figure = await getJSON(`${API}/jobs/${jobId}/comparison/figure`);
      await window.Plotly.newPlot(target, figure.data || [], figure.layout || {}, { responsive: true, displaylogo: false });
    } catch (err) {
      target.textContent = `The chart could not be loaded: ${err.message}`;
    }
  }

  async function loadComparison(job) {
    let cmp = null;
    for (let attempt = 0; attempt <= COMPARISON_RETRIES; attempt++) {
      try {
        cmp = await getJSON(`${API}/jobs/${job.id}/comparison`);
        break;
      } catch (err) {
        const retry = err.status === 404 && job.status === "succeeded" && attempt < COMPARISON_RETRIES;
        if (!retry) {
          const box = $("no-comparison");
          box.textContent = err.status === 404
            ? (job.status === "failed"
              ? "The job failed before two runs could be compared. See the run errors above."
              : "There is nothing to compare for this job yet.")
            : `Could not load the comparison: ${err.message}`;
          box.hidden = false;
          return;
        }
        await sleep(POLL_MS);
      }
    }
    $("comparison").hidden = false;
    renderFacts(job, cmp);
    renderConfigDiff(job, cmp);
    renderEnvironment(cmp);
    renderMismatches(job, cmp);
    renderThroughput(job.id, cmp);
    renderReproducibility(cmp);
    await drawChart(job.id);
  }

  // ---- collective and sweep ------------------------------------------------------------------

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

  function resultNames(job, result) {
    const byIndex = new Map((result.configs || []).map((c) => [c.index, c.name]));
    return (index) => {
      const prefix = job.kind === "sweep" ? String(index) : sideLetter(index);
      return `${prefix}: ${byIndex.get(index) ?? (job.configs || [])[index]?.name ?? "?"}`;
    };
  }

  function reproBadge(ok) {
    return el("span", {
      className: `badge ${ok ? "badge-reproducible" : "badge-not-reproducible"}`,
      text: ok ? "reproducible" : "not reproducible",
    });
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

  function renderCells(result, label) {
    const all = [...(result.cells || [])].sort((x, y) =>
      x.config_index - y.config_index
      || orderOf(OP_ORDER, x.op) - orderOf(OP_ORDER, y.op) || String(x.op).localeCompare(String(y.op))
      || orderOf(DTYPE_ORDER, x.dtype) - orderOf(DTYPE_ORDER, y.dtype) || x.bytes - y.bytes);
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

  async function drawCollectiveFigures(jobId) {
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
      if (!figure) {
        target.hidden = true;
        continue;
      }
      target.hidden = false;
      // uirevision keeps zoom and legend clicks when partial results are redrawn.
      const layout = { ...(figure.layout || {}), uirevision: name };
      await window.Plotly.react(target, figure.data || [], layout, PLOTLY_CONFIG);
    }
  }

  async function renderCollective(job, result) {
    const text = JSON.stringify(result);
    $("collective").hidden = false;
    $("no-comparison").hidden = true;
    $("collective-partial").hidden = FINISHED.has(job.status);
    if (text === shownResult) return;
    shownResult = text;
    const label = resultNames(job, result);
    renderSummary(job, result, label);
    renderCells(result, label);
    renderEffective(result, label);
    renderLogs(result, label);
    renderExport(job, result);
    $("cells-only-bad").onchange = () => renderCells(result, label);
    await drawCollectiveFigures(job.id);
  }

  // While a job runs, show what has been recorded so far; a 404 only means nothing yet.
  async function refreshPartial(job) {
    try {
      await renderCollective(job, await getJSON(`${API}/jobs/${job.id}/collective`));
    } catch (err) {
      if (err.status !== 404) showLoadError(`Could not load the partial results: ${err.message}`);
    }
  }

  async function loadCollective(job) {
    let result = null;
    for (let attempt = 0; attempt <= COMPARISON_RETRIES; attempt++) {
      try {
        result = await getJSON(`${API}/jobs/${job.id}/collective`);
        break;
      } catch (err) {
        const retry = err.status === 404 && job.status === "succeeded" && attempt < COMPARISON_RETRIES;
        if (!retry) {
          $("collective").hidden = true;
          const box = $("no-comparison");
          box.textContent = err.status === 404
            ? (job.status === "failed"
              ? "The job failed before any collective was recorded. See the run errors above."
              : "No collective results recorded for this job.")
            : `Could not load the collective results: ${err.message}`;
          box.hidden = false;
          return;
        }
        await sleep(POLL_MS);
      }
    }
    await renderCollective(job, result);
  }

  // ---- polling -------------------------------------------------------------------------------

  async function poll(jobId) {
    let job;
    try {
      job = await getJSON(`${API}/jobs/${jobId}`);
    } catch (err) {
      if (err.status === 404) {
        showLoadError(`Job #${jobId} does not exist.`);
        return;
      }
      showLoadError(`Could not load the job, retrying: ${err.message}`);
      setTimeout(() => poll(jobId), POLL_ERROR_MS);
      return;
    }
    showLoadError("");
    renderJob(job);
    const collective = COLLECTIVE_KINDS.has(job.kind);
    if (FINISHED.has(job.status)) {
      await (collective ? loadCollective(job) : loadComparison(job));
    } else {
      if (collective && Date.now() - lastPartial >= PARTIAL_REFRESH_MS) {
        lastPartial = Date.now();
        refreshPartial(job);
      }
      setTimeout(() => poll(jobId), POLL_MS);
    }
  }

  $("log-diff-go").addEventListener("click", compareLogs);

  const match = window.location.pathname.match(/\/jobs\/(\d+)\/?$/);
  if (match) {
    poll(match[1]);
  } else {
    showLoadError("No job id in the address; expected /jobs/<id>.");
  }
})();
