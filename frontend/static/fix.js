// Job page for a fix search: the trials (knobs × reproducibility × cost), the prescription as JSON, as `export`
// lines and as the torch calls, each kept knob with the trial that shows it is needed. Also puts the "Find the
// cheapest reproducible config" button on a diverged train job's page. All data goes into the page through
// textContent (never innerHTML).
"use strict";

(function () {
  const { API, $, el, getJSON, sendJSON, setRows, jobConfigLabel: label } = window.detlab;
  const { register, showNoResult, showVerdict, fetchResult, plot } = window.detlab.job;
  const TORCH_CALLS = {
    deterministic_algorithms: (v) => `torch.use_deterministic_algorithms(${v ? "True" : "False"})`,
    cudnn_deterministic: (v) => `torch.backends.cudnn.deterministic = ${v ? "True" : "False"}`,
    cudnn_benchmark: (v) => `torch.backends.cudnn.benchmark = ${v ? "True" : "False"}`,
    allow_tf32: (v) => `torch.backends.cuda.matmul.allow_tf32 = ${v ? "True" : "False"}\n` +
      `torch.backends.cudnn.allow_tf32 = ${v ? "True" : "False"}`,
  };

  function describe(job) {
    const fix = job.params.fix || {};
    return { facts: [`base ${label(job, 0)}`, `workload ${job.workload}`],
      extent: [`${job.steps} steps`, `at most ${fix.max_trials} trials`] };
  }

  const pct = (x) => (x === null || x === undefined ? "—" : `${x >= 0 ? "+" : ""}${(x * 100).toFixed(1)}%`);
  // A cost against the base as it reads everywhere: "12.0% slower", "75.3% faster".
  const costText = (x) => (x === null || x === undefined ? "not measured"
    : `${Math.abs(x * 100).toFixed(1)}% ${x < 0 ? "faster" : "slower"}`);
  // [k, n]: k of the n repeats bit-identical to the first (the first counts as itself), as the CLI says it.
  const repro = (r) => (r ? `${r[0]} of ${r[1]} identical to the first` : "running");

  function trialRow(t, keptAt) {
    const tr = el("tr", {},
      el("td", { className: "num", text: String(t.index) }),
      el("td", { text: t.role === "drop" ? `drop ${t.dropped}` : t.role }),
      el("td", { text: t.knobs.length ? t.knobs.join(", ") : "(base)" }),
      el("td", { className: "num", text: t.failed ? `failed: ${t.failed}` : repro(t.reproducible) }),
      el("td", { className: "num", text: t.first_divergent_step === null ? "—" : String(t.first_divergent_step) }),
      el("td", { className: "num", text: t.index === 0 ? "baseline" : costText(t.cost) }),
      el("td", { className: "num", text: t.cost_interval ? `${pct(t.cost_interval[0])} to ${pct(t.cost_interval[1])}` : "—" }));
    if (t.index === keptAt) tr.className = "fix-prescribed";
    tr.dataset.trial = String(t.index);
    return tr;
  }

  function exportLines(config) {
    const env = Object.entries(config.env || {}).map(([k, v]) => `export ${k}=${v}`);
    if (config.threads) env.push(`export OMP_NUM_THREADS=${config.threads}`);
    return env.join("\n") || "# no environment variables";
  }

  function torchCalls(config) {
    const calls = Object.entries(config.torch || {}).map(([k, v]) => (TORCH_CALLS[k] ? TORCH_CALLS[k](v) : `# ${k} = ${v}`));
    if (config.threads) calls.push(`torch.set_num_threads(${config.threads})`);
    return calls.join("\n");
  }

  function renderPrescription(res) {
    const p = res.prescription;
    $("fix-prescription").hidden = !p;
    if (!p) return;
    $("fix-json").textContent = JSON.stringify(p.config, null, 2);
    $("fix-export").textContent = exportLines(p.config);
    $("fix-torch").textContent = torchCalls(p.config);
    const items = Object.entries(res.necessary || {}).map(([knob, ev]) => el("li", { className: "fix-evidence" },
      el("code", { text: knob }),
      ev.trial === null || ev.trial === undefined ? el("span", { text: ` — not checked (${ev.unchecked || "budget"})` })
        : el("span", {}, " — without it, ",
          el("a", { href: `#trial-${ev.trial}`, text: `trial ${ev.trial}` }),
          ` was ${ev.failed ? `failed (${ev.failed})` : `${repro(ev.reproducible)} (first divergent step ${ev.first_divergent_step})`}`)));
    for (const [knob, ev] of Object.entries(res.unnecessary || {})) {
      items.push(el("li", { className: "muted" }, el("code", { text: knob }), ` — not needed: trial ${ev.trial} was reproducible without it`));
    }
    $("fix-necessary").replaceChildren(...items);
  }

  // Cost against reproducibility, one point per finished trial (the base at cost 0): the frontier to choose from.
  function renderChart(res) {
    const done = res.trials.filter((t) => t.reproducible && t.reproducible[1]);
    $("fix-chart").hidden = done.length === 0;
    if (!done.length) return;
    const name = (t) => (t.knobs.length ? t.knobs.join(" + ") : "base");
    plot($("fix-chart"), {
      data: [{ type: "scatter", mode: "markers+text", textposition: "top center", cliponaxis: false,
        x: done.map((t) => (t.index === 0 ? 0 : (t.cost ?? 0) * 100)),
        y: done.map((t) => t.reproducible[0] / t.reproducible[1]),
        text: done.map((t) => `#${t.index} ${name(t)}`),
        marker: { size: 11, color: done.map((t) => (t.reproducible[0] === t.reproducible[1] ? "#15803d" : "#b91c1c")) },
        hovertemplate: "%{text}<br>cost %{x:.1f}%<br>identical %{y:.0%}<extra></extra>" }],
      layout: { height: 320, margin: { t: 30, r: 120, b: 50, l: 60 }, uirevision: "fix",
        xaxis: { title: { text: "cost against the base (%)" }, zeroline: true },
        yaxis: { title: { text: "repeats identical to the first" }, range: [-0.1, 1.15], tickformat: ".0%" } },
    });
  }

  async function load(job) {
    let res;
    try {
      res = await fetchResult(job, `${API}/jobs/${job.id}/fix`);
    } catch (err) {
      showNoResult(`Could not load the search: ${err.message}`);
      return;
    }
    render(job, res);
  }

  function render(job, res) {
    const p = res.prescription;
    const headline = res.verdict === "found" ? `Reproducible with ${p.knobs.join(", ")} — ${costText(p.cost)} than the base${p.within_noise ? " (within noise)" : ""}`
      : res.verdict === "already" ? "The base config is already reproducible"
        : res.verdict === "none" ? `No reproducible config found; closest: ${(res.closest && res.closest.knobs.join(", ")) || "the base"}`
          : res.verdict === "incomplete" ? `The search stopped at trial ${res.failed.index} (${res.failed.knobs.join(", ") || "the base"}): ${res.failed.failed}`
            : "Searching…";
    const banner = { none: "not-reproducible", incomplete: "incomplete" }[res.verdict] || "reproducible";
    if (res.verdict) showVerdict(banner, headline,
      [["Stack", res.stack || "not known yet"], ["Trials", `${res.trials.length} of at most ${res.max_trials}`]]);
    $("fix").hidden = false;
    $("fix-verdict").textContent = res.verdict || "running";
    $("fix-verdict").className = `badge badge-${res.verdict || "running"}`;
    $("fix-order").textContent = res.order.length ? `Tried in this order (cheapest first): ${res.order.join(" → ")}` : "";
    const keptAt = p ? p.trial : null;
    setRows($("fix-trials"), res.trials.map((t) => { const row = trialRow(t, keptAt); row.id = `trial-${t.index}`; return row; }),
      "No trial yet.", 7);
    // A knob not tried (n.knob), or a trial not run (n.knobs: its set), as the CLI's NotTried.describe says it.
    const notTried = (n) => [n.knob, n.knobs ? `trial ${n.knobs.join(", ") || "the base"}` : null].filter(Boolean).join(" — ");
    setRows($("fix-not-tried"), (res.not_tried || []).map((n) => el("tr", {}, el("td", {}, el("code", { text: notTried(n) })),
      el("td", { text: n.reason }))),
      res.stack ? "Every knob that applies was tried." : "Which knobs apply is known once the base has run on a worker.", 2);
    renderPrescription(res);
    renderChart(res);
  }

  async function running(job) {
    try {
      render(job, await getJSON(`${API}/jobs/${job.id}/fix`));
    } catch (_err) {
      // nothing recorded yet: the next poll asks again
    }
  }

  register(["fix"], { runsHead: "Steps", describe, load, running, rerunnable: false });

  // ---- the button on a diverged train job's page --------------------------------------------------

  async function submitFix(event) {
    const button = event.currentTarget;
    button.disabled = true;
    $("fix-status").textContent = "Submitting…";
    try {
      const spec = await getJSON(`${API}/jobs/${button.dataset.job}/spec`);
      const body = { kind: "fix", workload: spec.workload, configs: spec.configs.slice(0, 1), world_size: spec.world_size,
        steps: spec.steps, repeats: Math.max(2, spec.repeats || 2), queue: spec.queue };
      const { ok, body: made, lines } = await sendJSON("POST", `${API}/jobs`, body);
      if (!ok) {
        $("fix-status").textContent = lines.join(" ");
        button.disabled = false;
        return;
      }
      $("fix-status").replaceChildren("Submitted: ", el("a", { id: "fix-link", href: `/jobs/${made.id}`, text: `fix job #${made.id}` }));
    } catch (err) {
      $("fix-status").textContent = `Could not submit the search: ${err.message}`;
      button.disabled = false;
    }
  }

  // train.js shows the comparison; once its runs part (the pair, or a config's repeats), offer the search.
  window.detlab.job.offerFix = function (job, cmp) {
    const parted = cmp.verdict === "diverged" ||
      (cmp.reproducibility || []).some((r) => r.comparable && r.identical_to_first !== r.comparable);
    const button = $("fix-job");
    button.hidden = !(job.kind === "train" && parted);
    button.dataset.job = job.id;
  };
  document.addEventListener("DOMContentLoaded", () => $("fix-job").addEventListener("click", submitFix));
})();
