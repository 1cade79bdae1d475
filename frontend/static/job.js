// Job page: polls the job until it finishes, then shows where the two runs first diverge.
// All data goes into the page through textContent (never innerHTML), so tensor names, node
// names and error logs cannot inject markup.
"use strict";

(function () {
  const API = "/api/v1";
  const POLL_MS = 1000;
  const POLL_ERROR_MS = 3000;
  const COMPARISON_RETRIES = 10; // a succeeded job's comparison may land a moment after its status
  const ERROR_TAIL_LINES = 15;
  const FINISHED = new Set(["succeeded", "failed"]);

  const $ = (id) => document.getElementById(id);

  class HttpError extends Error {
    constructor(url, status) {
      super(`${url}: HTTP ${status}`);
      this.status = status;
    }
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "className") node.className = value;
      else if (key === "text") node.textContent = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    if (!response.ok) throw new HttpError(url, response.status);
    return response.json();
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function badge(value) {
    return el("span", { className: `badge badge-${value}`, text: value });
  }

  function setRows(table, rows, emptyText, columns) {
    const tbody = table.tBodies[0];
    if (rows.length === 0) {
      tbody.replaceChildren(el("tr", { className: "empty" }, el("td", { colspan: String(columns), text: emptyText })));
    } else {
      tbody.replaceChildren(...rows);
    }
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
    return `${sideLetter(index)}: ${config ? config.name : "?"}`;
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
    $("job-meta").textContent = [
      names,
      `workload ${job.workload}`,
      `world size ${job.world_size}`,
      `${job.steps} steps`,
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
        el("td", { className: "num", text: r.repeats }),
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
    renderMismatches(job, cmp);
    renderThroughput(job.id, cmp);
    renderReproducibility(cmp);
    await drawChart(job.id);
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
    if (FINISHED.has(job.status)) {
      await loadComparison(job);
    } else {
      setTimeout(() => poll(jobId), POLL_MS);
    }
  }

  const match = window.location.pathname.match(/\/jobs\/(\d+)\/?$/);
  if (match) {
    poll(match[1]);
  } else {
    showLoadError("No job id in the address; expected /jobs/<id>.");
  }
})();
