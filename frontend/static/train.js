// Job page for a train comparison: where runs A and B first diverge (step, tensors, ranks), how
// their configs and environments differ, what each costs in throughput, and how repeatable each is.
// All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const { API, $, el, getJSON, setRows, pct, jobConfigName, renderWhy } = window.detlab;
  const { register, showNoResult, showVerdict, jobConfigLabel, fetchResult, plot } = window.detlab.job;

  function describe(job) {
    const names = (job.configs || []).map((c, i) => jobConfigLabel(job, i)).join(" vs ");
    return { facts: [names, `workload ${job.workload}`], extent: [`${job.steps} steps`] };
  }

  function formatValue(value) {
    if (value === null || value === undefined) return el("span", { className: "muted", text: "unset" });
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function renderFacts(cmp) {
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

    // The first collective call whose output differs, and whether its inputs matched (one line, built server-side).
    const calls = cmp.collectives;
    $("collectives").textContent = calls && calls.text ? calls.text : "";
    $("collectives").hidden = !(calls && calls.text);
    $("collectives").classList.toggle("note-warn", Boolean(calls && calls.first));

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
    $("config-a-name").textContent = jobConfigName(job, 0);
    $("config-b-name").textContent = jobConfigName(job, 1);
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
        const side = runConfig.has(m.run_id) ? ` (${jobConfigLabel(job, runConfig.get(m.run_id))})` : "";
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

  function renderThroughput(job, cmp) {
    const rows = cmp.throughput || [];
    const fmt = (x, d = 1) => (typeof x === "number" && Number.isFinite(x) ? x.toFixed(d) : "—");
    setRows(
      $("throughput"),
      rows.map((t) =>
        el(
          "tr",
          {},
          el("td", { text: jobConfigLabel(job, t.config_index) }),
          el("td", { className: "num", text: fmt(t.samples_per_s) }),
          el("td", { className: "num", text: t.spread ? `${fmt(t.spread[0], 0)}–${fmt(t.spread[1], 0)}` : "—" }),
          el("td", { className: "num", text: typeof t.step_time_ms_median === "number" ? `${fmt(t.step_time_ms_median)} ms` : "—" }),
          el("td", { className: "num", text: t.runs ?? "" }),
          // The server words the cost with its 95 % interval ("within noise" when it spans 0).
          el("td", { className: `num ${t.cost > 0 && t.within_noise === false ? "cost" : ""}`, text: t.cost_text })
        )
      ),
      "No throughput measured.",
      6
    );
    drawThroughput(job.id, rows.filter((t) => typeof t.samples_per_s === "number"));
  }

  async function drawThroughput(jobId, rows) {
    const target = $("throughput-chart");
    if (rows.length === 0 || !window.Plotly) {
      target.hidden = true;
      return;
    }
    target.hidden = false;
    try {
      await plot(target, await getJSON(`${API}/jobs/${jobId}/throughput/figure`));
    } catch (err) {
      target.textContent = `The throughput chart could not be loaded: ${err.message}`;
    }
  }

  // k of n over the repeats comparable with the first; incomplete or incomparable ones are named apart.
  function reproText(r) {
    const apart = [r.incomplete ? `${r.incomplete} incomplete` : "", r.incomparable ? `${r.incomparable} incomparable` : ""];
    const extra = apart.filter(Boolean).join(", ");
    return `${r.identical_to_first} of ${r.comparable ?? 0}` + (extra ? ` (${extra})` : "");
  }

  function renderReproducibility(job, cmp) {
    const rows = (cmp.reproducibility || []).map((r) =>
      el(
        "tr",
        {},
        el("td", { text: jobConfigLabel(job, r.config_index) }),
        el("td", { className: "num", text: r.recorded === r.repeats ? r.repeats : `${r.recorded} of ${r.repeats}` }),
        el("td", { className: "num", text: reproText(r) }),
        el("td", { className: `num ${r.rate < 1 ? "cost" : ""}`, text: typeof r.rate === "number" ? pct(r.rate, 0) : "—" })
      )
    );
    setRows($("reproducibility"), rows, "No repeats to compare.", 4);
  }

  // ---- the verdict banner in the header ----------------------------------------------------------

  // What was compared, in the job's own count: a train job of N steps records step 0 (the weights before the
  // first update) and steps 1..N, so N + 1 states for N steps; any other run's steps are its own.
  function comparedText(job, cmp) {
    const n = cmp.steps_compared ?? 0;
    const ownSteps = job.kind === "train" && !(job.params && job.params.script) && n === job.steps + 1;
    return ownSteps ? `${job.steps} ${job.steps === 1 ? "step" : "steps"} and the initial weights`
      : `${n} recorded ${n === 1 ? "step" : "steps"}`;
  }

  function headline(job, cmp) {
    switch (cmp.verdict) {
      case "identical":
        return `Identical: all ${comparedText(job, cmp)} are bit-equal`;
      case "diverged":
        return `Diverged at step ${cmp.first_divergent_step}: ${cmp.steps_differing ?? 0} of the ${cmp.steps_compared ?? 0} compared (${comparedText(job, cmp)}) differ`;
      case "incomplete": {
        const missing = cmp.missing || [];
        return `Incomplete: ${missing.length ? `missing ${missing.join("; ")}` : cmp.reason || "the runs did not record every step"}`;
      }
      default:
        return `Incomparable: ${cmp.reason || "no reason given"}`;
    }
  }

  function reproFact(job, r) {
    if (!r.comparable) {
      const repeats = r.repeats ?? 0;
      return [jobConfigLabel(job, r.config_index), `${repeats} ${repeats === 1 ? "repeat" : "repeats"}, nothing to compare`];
    }
    return [jobConfigLabel(job, r.config_index), `${reproText(r)} repeats identical`];
  }

  // A single config: reproducible when every comparable repeat matched the first.
  function singleVerdict(rows) {
    const measured = rows.filter((r) => r.comparable);
    if (measured.length === 0) return ["incomparable", "Reproducibility not measured: run 2 or more repeats to compare"];
    const ok = measured.every((r) => r.identical_to_first === r.comparable);
    const r = measured[0];
    return ok
      ? ["reproducible", `Reproducible: ${r.identical_to_first} of ${r.comparable} comparable repeats identical to the first`]
      : ["not-reproducible", `Not reproducible: ${r.identical_to_first} of ${r.comparable} comparable repeats identical to the first`];
  }

  function renderBanner(job, cmp, pairwise) {
    const repro = cmp.reproducibility || [];
    const facts = [];
    if (pairwise) {
      facts.push(["First divergent step", cmp.first_divergent_step ?? (cmp.verdict === "identical" ? "none" : "—")]);
    }
    for (const r of repro) {
      const [label, text] = reproFact(job, r);
      facts.push([`Reproducibility ${label}`, text]);
    }
    for (const t of cmp.throughput || []) {
      if (t.config_index > 0 && t.cost_text) facts.push([`Cost ${jobConfigLabel(job, t.config_index)}`, t.cost_text]);
    }
    if (pairwise) {
      showVerdict(cmp.verdict || "incomparable", headline(job, cmp), facts);
    } else {
      const [verdict, line] = singleVerdict(repro);
      showVerdict(verdict, line, facts);
    }
  }

  // A long run's per-step series come thinned (cmp.downsampled); zooming in fetches that step window in
  // full (?from_step=&to_step=), a double click (autorange) the whole run again.
  function zoomInFull(target, jobId) {
    target.on("plotly_relayout", async (e) => {
      const lo = e["xaxis.range[0]"];
      const hi = e["xaxis.range[1]"];
      let url = `${API}/jobs/${jobId}/comparison/figure`;
      if (lo !== undefined && hi !== undefined) {
        url += `?from_step=${Math.max(0, Math.floor(lo))}&to_step=${Math.max(0, Math.ceil(hi))}`;
      } else if (!e["xaxis.autorange"]) {
        return;
      }
      try {
        await plot(target, await getJSON(url));
      } catch (err) {
        target.title = `The step window could not be loaded: ${err.message}`;
      }
    });
  }

  async function drawChart(jobId, cmp) {
    const target = $("chart");
    if (!window.Plotly) {
      target.textContent = "The chart cannot be drawn: /static/plotly.min.js did not load.";
      return;
    }
    try {
      await plot(target, await getJSON(`${API}/jobs/${jobId}/comparison/figure`));
      if (cmp.downsampled && !target.dataset.zoomInFull) {
        target.dataset.zoomInFull = "1";
        zoomInFull(target, jobId);
      }
    } catch (err) {
      target.textContent = `The chart could not be loaded: ${err.message}`;
    }
  }

  // Tensor × step: where the runs' digests differ, the differing ranks on hover (diverged pairs only).
  async function drawDivergenceMap(jobId, cmp) {
    const target = $("divergence-map");
    target.hidden = !cmp.divergence_map || !window.Plotly;
    if (target.hidden) return;
    try {
      await plot(target, await getJSON(`${API}/jobs/${jobId}/comparison/divergence/figure`));
    } catch (err) {
      target.textContent = `The tensor × step map could not be loaded: ${err.message}`;
    }
  }

  // The why-report of the pair the verdict is about (GET /jobs/{id}/why): any job with two runs has one.
  async function loadWhy(job) {
    const block = $("why-block");
    block.hidden = (job.runs || []).length < 2;
    if (block.hidden) return;
    try {
      renderWhy($("why"), await getJSON(`${API}/jobs/${job.id}/why`));
    } catch (err) {
      $("why").replaceChildren(el("p", { className: "muted", text: `The checklist could not be loaded: ${err.message}` }));
    }
  }

  // How far the runs drift apart (‖A−B‖/‖A‖ estimated per sampled step, beside |Δloss|): shown whenever the
  // comparison has an estimate; otherwise its reason, never a chart of zeros.
  async function drawDrift(jobId, cmp) {
    const said = $("drift-verdict");
    const target = $("drift-chart");
    const drift = cmp.drift;
    said.hidden = !drift;
    target.hidden = !(drift && drift.available && window.Plotly);
    if (!drift) return;
    said.textContent = drift.available ? `Drift (‖A−B‖/‖A‖, estimated): ${drift.verdict}` : `No drift estimate: ${drift.reason}`;
    if (target.hidden) return;
    try {
      await plot(target, await getJSON(`${API}/jobs/${jobId}/comparison/drift/figure`));
    } catch (err) {
      target.textContent = `The drift chart could not be loaded: ${err.message}`;
    }
  }

  async function load(job) {
    let cmp;
    try {
      cmp = await fetchResult(job, `${API}/jobs/${job.id}/comparison`);
    } catch (err) {
      showNoResult(err.status !== 404
        ? `Could not load the comparison: ${err.message}`
        : job.status === "failed"
          ? "The job failed before two runs could be compared. See the run errors above."
          : "There is nothing to compare for this job yet.");
      return;
    }
    // One config has no A/B pair: its page is the reproducibility of its repeats (and its throughput).
    const pairwise = (job.configs || []).length > 1 && cmp.run_a !== undefined;
    renderBanner(job, cmp, pairwise);
    if (pairwise) window.detlab.job.offerBisect(job, cmp); // bisect.js: the first divergent module, one click
    window.detlab.job.offerFix(job, cmp); // fix.js: the cheapest config that makes it reproducible
    $("comparison").hidden = false;
    $("comparison-title").textContent = pairwise ? "Comparison" : "Reproducibility";
    $("pairwise").hidden = !pairwise;
    $("pairwise-detail").hidden = !pairwise;
    $("verdict").hidden = !pairwise;
    $("note").hidden = true;
    if (pairwise) renderFacts(cmp);
    await loadWhy(job);
    renderConfigDiff(job, cmp);
    renderEnvironment(cmp);
    renderMismatches(job, cmp);
    renderThroughput(job, cmp);
    renderReproducibility(job, cmp);
    if (pairwise) await drawChart(job.id, cmp);
    if (pairwise) await drawDivergenceMap(job.id, cmp);
    if (pairwise) await drawDrift(job.id, cmp);
    // An evidence link into this page (#environment, ...) names a table shown only now.
    if (window.location.hash) document.getElementById(window.location.hash.slice(1))?.scrollIntoView();
  }

  register(["train"], { runsHead: "Steps", describe, load });
})();
