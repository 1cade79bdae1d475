// Job page for a recording (a user's own loop, recorded by detlab.Recorder and streamed or uploaded): its name,
// ranks, steps recorded, loss curve and environment, and a link to compare it with any other run. The run is
// read through the pair report compared with itself (GET /compare?a=R&b=R): one way to read a run's steps.
// All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const { API, $, el, getJSON, setRows } = window.detlab;
  const { register, showNoResult, plot } = window.detlab.job;

  function describe(job) {
    const name = job.params?.name;
    return { facts: [name ? `“${name}”` : "unnamed recording", "recorded by detlab.Recorder"] };
  }

  function renderFacts(job, run, pair) {
    const facts = [
      ["Name", job.params?.name || "—"],
      ["Status", job.status],
      ["Ranks", String(run.world_size ?? job.world_size)],
      ["Steps recorded", pair ? String(pair.steps_compared ?? 0) : "—"],
      ["Tensors per step", pair && pair.tensors !== undefined ? String(pair.tensors) : "—"],
      ["Tags", (job.tags || []).join(", ") || "none"],
    ];
    $("recording-facts").replaceChildren(
      ...facts.map(([term, value]) => el("div", {}, el("dt", { text: term }), el("dd", { text: value }))));
  }

  function renderEnvironment(pair) {
    // Compared with itself, both sides are the same run: one column.
    const rows = (pair.environment || []).map((f) => el("tr", {}, el("td", { text: f.key }), el("td", { text: f.a ?? "—" })));
    setRows($("recording-env"), rows, "No environment recorded.", 2);
  }

  async function load(job) {
    const run = (job.runs || [])[0];
    $("recording").hidden = false;
    if (!run) {
      showNoResult("This recording has no run yet.");
      return;
    }
    $("recording-compare").href = `/compare?a=${encodeURIComponent(run.id)}`;
    let pair = null;
    try {
      pair = await getJSON(`${API}/compare?a=${run.id}&b=${run.id}`);
    } catch (err) {
      $("recording-note").textContent = `The recorded steps could not be loaded: ${err.message}`;
      $("recording-note").hidden = false;
    }
    renderFacts(job, { world_size: pair?.runs?.[0]?.world_size }, pair);
    if (!pair) return;
    renderEnvironment(pair);
    const target = $("recording-loss");
    if (!window.Plotly) {
      target.textContent = "The chart cannot be drawn: /static/plotly.min.js did not load.";
      return;
    }
    const hasLoss = ((pair.loss || {}).a || []).length > 0;
    target.hidden = !hasLoss;
    $("recording-no-loss").hidden = hasLoss;
    if (!hasLoss) return;
    try {
      await plot(target, await getJSON(`${API}/compare/loss/figure?a=${run.id}&b=${run.id}`));
    } catch (err) {
      target.textContent = `The loss chart could not be loaded: ${err.message}`;
    }
  }

  // While it streams, the page shows what has arrived so far, every few polls (a self-comparison reads every step).
  const RUNNING_EVERY_MS = 10000;
  let loadedAt = 0;
  function running(job) {
    if (Date.now() - loadedAt < RUNNING_EVERY_MS) return;
    loadedAt = Date.now();
    load(job);
  }

  register(["recording"], { runsHead: "Last step", describe, load, running, rerunnable: false });
})();
