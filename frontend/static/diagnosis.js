// Job page for a batch-invariance test or an op audit: per config, where sample 0's result depends on its batch
// (heatmap op × batch size, first breaks, the model's first module) or which ops of a step gave different bits
// (the audit table, and the ops that stayed nondeterministic although the config claims determinism).
// All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const PARTIAL_REFRESH_MS = 5000;
  const { API, $, el, getJSON, setRows } = window.detlab;
  const { register, showLoadError, showNoResult, showVerdict, isFinished, jobConfigLabel, fetchResult, plot } =
    window.detlab.job;
  let lastPartial = 0;
  let shownResult = null; // the JSON text last rendered, so an unchanged refresh leaves the chart alone
  let current = null; // the result shown, for the table's filter

  const yesNo = (flag) => (flag === null || flag === undefined
    ? el("span", { className: "muted", text: "not checked" })
    : el("span", { className: flag ? "no" : "yes", text: flag ? "yes" : "no" }));

  function describe(job) {
    const d = (job.params || {}).diagnosis || {};
    const configs = (job.configs || []).map((c, i) => jobConfigLabel(job, i)).join(" vs ");
    if (job.kind === "op-audit") {
      return { facts: [configs, `one step of ${job.workload}`, `${d.reruns} re-runs of ${d.calls_per_op} calls per op`] };
    }
    return {
      facts: [configs, (d.ops || []).join(", "), (d.dtypes || []).join(", "),
        `batch sizes ${(d.batch_sizes || []).join(", ")}`, `${d.features} features`,
        d.workload ? `and ${d.workload}'s forward` : null],
    };
  }

  function banner(job, result) {
    const configs = result.configs || [];
    if (job.kind === "op-audit") {
      const nondet = new Set(configs.flatMap((c) => c.ops.filter((o) => o.nondeterministic).map((o) => o.op)));
      const ineffective = configs.flatMap((c) => c.ineffective || []);
      const verdict = job.verdict || (nondet.size ? "nondeterministic" : "deterministic");
      showVerdict(verdict, nondet.size ? `${nondet.size} op${nondet.size > 1 ? "s" : ""} gave different bits or `
        + "are flagged by PyTorch" : "no op checked gave different bits",
      [["ops", String(new Set(configs.flatMap((c) => c.ops.map((o) => o.op))).size)],
        ["flags that do nothing", ineffective.length ? [...new Set(ineffective)].join(", ") : "none"]]);
      return;
    }
    const rows = configs.flatMap((c) => c.results || []);
    const broken = configs.flatMap((c) => (c.summary || []).filter((s) => s.first_break !== null));
    const verdict = job.verdict || (broken.length ? "not-invariant" : "invariant");
    showVerdict(verdict, broken.length ? `${broken.length} op · dtype pair${broken.length > 1 ? "s" : ""} break batch `
      + "invariance" : "row 0 equals the batch-1 result at every batch size measured",
    [["cells", String(rows.length)], ["device", configs[0]?.device || "unknown"],
      ["TF32", configs.map((c) => (c.tf32 ? "on" : "off")).join(" / ")]]);
  }

  function renderInvariance(result) {
    const rows = [];
    const model = [];
    for (const c of result.configs) {
      for (const s of c.summary || []) {
        const cells = c.results.filter((r) => r.op === s.op && r.dtype === s.dtype);
        const ulp = Math.max(0, ...cells.map((r) => r.max_ulp));
        rows.push(el("tr", {}, el("td", { text: c.label }), el("td", { text: s.op }), el("td", { text: s.dtype }),
          el("td", { className: "num", text: s.first_break === null ? "none" : String(s.first_break) }),
          el("td", { className: "num", text: ulp.toLocaleString() })));
      }
      if (c.model) {
        const m = c.model;
        model.push(el("li", { text: m.invariant
          ? `${c.label}: ${m.workload}'s forward gives sample 0 the same bits at batch sizes ${m.batch_sizes.join(", ")}.`
          : `${c.label}: ${m.workload}'s forward first breaks at batch ${m.first_break}, in module ${m.first_module}.` }));
      }
    }
    setRows($("first-breaks"), rows, "No results.", 5);
    $("model-invariance").replaceChildren(...model);
  }

  function renderAudit(result) {
    const only = $("audit-only-nondet").checked;
    const rows = result.configs.flatMap((c) => c.ops.filter((o) => !only || o.nondeterministic).map((o) =>
      el("tr", { className: o.nondeterministic ? "row-bad" : "" }, el("td", { text: c.label }),
        el("td", {}, el("code", { text: o.op })), el("td", { className: "num", text: String(o.count) }),
        el("td", {}, yesNo(o.nondeterministic)), el("td", { className: "small", text: o.evidence }))));
    setRows($("audit-ops"), rows, only ? "No op was found nondeterministic." : "No ops recorded.", 5);
    $("ineffective").replaceChildren(...result.configs.filter((c) => (c.ineffective || []).length).map((c) =>
      el("li", { text: `${c.label} claims determinism, yet ${c.ineffective.join(", ")} gave different bits on `
        + "re-run: the flag does nothing for them here." })));
  }

  function flagsText(c) {
    const f = c.torch_flags;
    if (c.tf32 !== undefined) return `TF32 ${c.tf32 === null ? "unknown" : c.tf32 ? "on" : "off"}`;
    if (!f) return "unknown";
    return `deterministic algorithms ${f.deterministic_algorithms ? "on" : "off"}, TF32 ${f.allow_tf32 ? "on" : "off"}, `
      + `${f.num_threads} threads`;
  }

  async function render(job, result) {
    $("diagnosis").hidden = false;
    $("no-comparison").hidden = true;
    $("diagnosis-partial").hidden = isFinished(job);
    if (isFinished(job)) banner(job, result);
    const text = JSON.stringify(result);
    if (text === shownResult) return;
    shownResult = text;
    current = result;
    const audit = job.kind === "op-audit";
    $("diagnosis-title").textContent = audit ? `Op audit of ${result.workload}` : "Batch invariance";
    $("invariance-block").hidden = audit;
    $("audit-block").hidden = !audit;
    setRows($("diagnosis-env"), result.configs.map((c) => el("tr", {}, el("td", { text: c.label }),
      el("td", { text: c.device || "unknown" }), el("td", { text: flagsText(c) }))), "Nothing recorded.", 3);
    if (audit) {
      renderAudit(result);
    } else {
      renderInvariance(result);
      await plot($("invariance-heatmap"), await getJSON(`${API}/jobs/${job.id}/diagnosis/figure`));
    }
  }

  async function running(job) {
    if (Date.now() - lastPartial < PARTIAL_REFRESH_MS) return;
    lastPartial = Date.now();
    try {
      await render(job, await getJSON(`${API}/jobs/${job.id}/diagnosis`));
    } catch (err) {
      if (err.status !== 404) showLoadError(`Could not load the partial results: ${err.message}`);
    }
  }

  async function load(job) {
    let result;
    try {
      result = await fetchResult(job, `${API}/jobs/${job.id}/diagnosis`);
    } catch (err) {
      $("diagnosis").hidden = true;
      showNoResult(err.status !== 404 ? `Could not load the results: ${err.message}`
        : job.status === "failed" ? "The job failed before any result was recorded. See the run errors above."
          : "No results recorded for this job.");
      return;
    }
    await render(job, result);
  }

  $("audit-only-nondet").addEventListener("change", () => current && renderAudit(current));
  register(["batch-invariance", "op-audit"], { runsHead: "Results", describe, load, running });
})();
