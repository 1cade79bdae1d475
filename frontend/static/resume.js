// Job page for a resume check: the straight run against the run stopped, checkpointed and continued; the verdict
// (exact or lost), the first divergent step and the component the resume lost, and whether the restored state
// matched the saved step. All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const { API, $, el, jobConfigLabel: label } = window.detlab;
  const { register, showNoResult, showVerdict, fetchResult } = window.detlab.job;

  function describe(job) {
    const resume = job.params.resume || {};
    return { facts: [label(job, 0), `workload ${job.workload}`],
      extent: [`${job.steps} steps, resumed after step ${resume.stop_at}`,
        ...(resume.lose ? [`restore leaves out: ${resume.lose}`] : [])] };
  }

  const restoreText = (r) => (!r ? "no restored step recorded"
    : r.exact === true ? `step ${r.step}: matched the saved state`
      : r.exact === false ? `step ${r.step}: differs from the saved state (${r.text})` : `step ${r.step}: not checked`);

  function render(res) {
    const cmp = res.comparison || {};
    const first = cmp.first_divergent_component;
    const headline = res.verdict === "exact" ? "The resumed run is the run it would have been"
      : res.verdict === "lost" ? `The resume lost the ${first ? first.component : "state"} (step ${cmp.first_divergent_step})`
        : `Resume check ${res.verdict || "pending"}`;
    showVerdict(res.verdict === "exact" ? "identical" : res.verdict === "lost" ? "diverged" : res.verdict || "running",
      headline, [["Straight run", String(res.straight_run)], ["Resumed run", String(res.resumed_run)]]);
    $("resume").hidden = false;
    $("resume-verdict").textContent = res.verdict || "running";
    $("resume-verdict").className = `badge badge-${res.verdict === "exact" ? "identical" : "diverged"}`;
    $("resume-component").textContent = first ? first.text : "nothing differs";
    $("resume-step").textContent = cmp.first_divergent_step === null || cmp.first_divergent_step === undefined
      ? "—" : String(cmp.first_divergent_step);
    $("resume-restore").textContent = restoreText(cmp.resume);
    $("resume-missing").replaceChildren(...(cmp.missing || []).map((m) => el("li", { text: m })));
  }

  async function load(job) {
    try {
      render(await fetchResult(job, `${API}/jobs/${job.id}/resume`));
    } catch (err) {
      showNoResult(`Could not load the resume check: ${err.message}`);
    }
  }

  register(["resume"], { runsHead: "Steps", describe, load, rerunnable: true });
})();
