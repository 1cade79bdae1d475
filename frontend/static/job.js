// Job page, the part every kind shares: polls the job, shows its header, runs and progress, and hands
// it to the script of its kind (train.js: where two runs part; collective.js: which collectives gave
// the same bits). Those scripts register with `detlab.job.register` before the first poll.
// All data goes into the page through textContent (never innerHTML), so tensor names, node
// names and error logs cannot inject markup.
"use strict";

(function () {
  const POLL_MS = 1000;
  const POLL_ERROR_MS = 3000;
  const RESULT_RETRIES = 10; // a succeeded job's results may land a moment after its status
  const ERROR_TAIL_LINES = 15;
  const MANY_RUNS = 12;
  const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
  const CANCELLABLE = new Set(["queued", "running"]);
  const PLOTLY_CONFIG = { responsive: true, displaylogo: false };

  const { API, $, el, getJSON, sendJSON, parseTags, setRows, sleep, pct, badge, formatTime, worldSizes, jobConfigLabel } =
    window.detlab;
  const kinds = new Map(); // job kind -> its view: {runsHead, describe(job), load(job), running?(job), rerunnable?}
  let runsFolded = false; // fold a long runs list once, then leave it to the user
  let shown = null; // the job as last rendered (the Cancel button acts on it)

  function showLoadError(message) {
    const box = $("load-error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  // In place of a kind's results: why there are none.
  function showNoResult(message) {
    const box = $("no-comparison");
    box.textContent = message;
    box.hidden = false;
  }

  const isFinished = (job) => FINISHED.has(job.status);

  // The verdict in the header, where a reader looks first: a badge, a line that says it, and the
  // facts behind it ([term, value] pairs). Set by the kind's script once its result is in.
  function showVerdict(verdict, headline, facts = []) {
    const box = $("verdict-banner");
    $("banner-verdict").replaceChildren(badge(verdict));
    $("banner-headline").textContent = headline;
    $("banner-facts").replaceChildren(
      ...facts.map(([term, value]) => el("div", {}, el("dt", { text: term }), el("dd", { text: value })))
    );
    box.className = `banner banner-${verdict}`;
    box.hidden = false;
  }

  // "world size 2", or "world sizes 2 vs 4" when the configs run on different ones.
  function worldSizeText(job) {
    const sizes = worldSizes(job);
    return new Set(sizes).size > 1 ? `world sizes ${sizes.join(" vs ")}` : `world size ${job.world_size}`;
  }

  // A 404 for a job that just succeeded means "not recorded yet": ask again a few times.
  async function fetchResult(job, url) {
    for (let attempt = 0; ; attempt++) {
      try {
        return await getJSON(url);
      } catch (err) {
        if (err.status !== 404 || job.status !== "succeeded" || attempt >= RESULT_RETRIES) throw err;
        await sleep(POLL_MS);
      }
    }
  }

  // Plotly.react redraws in place; a layout's uirevision keeps the user's zoom and legend clicks.
  async function plot(target, figure) {
    await window.Plotly.react(target, figure.data || [], figure.layout || {}, PLOTLY_CONFIG);
  }

  function errorTail(text) {
    if (!text) return "";
    return String(text).trimEnd().split("\n").slice(-ERROR_TAIL_LINES).join("\n");
  }

  // ---- job and runs --------------------------------------------------------------------------

  function renderJob(job, view) {
    shown = job;
    document.title = `detlab · job #${job.id}`;
    $("job-title").textContent = `Job #${job.id} · ${job.kind}`;
    $("job-status").replaceChildren(badge(job.status));
    $("cancel-job").hidden = !CANCELLABLE.has(job.status);
    $("rerun-job").href = `/?rerun=${encodeURIComponent(job.id)}`;
    $("rerun-job").hidden = view.rerunnable === false; // the submit form cannot hold this kind (a bisect)
    renderTags(job.tags || []);
    // No live worker on the job's queue: it waits, and the page says so rather than a silent "queued".
    $("queue-note").textContent = job.queue_note ? `Waiting: ${job.queue_note}.` : "";
    $("queue-note").hidden = !job.queue_note;
    $("runs-steps-head").textContent = view.runsHead;
    const { facts, extent = [] } = view.describe(job);
    $("job-meta").textContent = [
      ...facts,
      worldSizeText(job),
      ...extent,
      `${job.repeats} ${job.repeats === 1 ? "repeat" : "repeats"}`,
      job.created_at ? `created ${formatTime(job.created_at)}` : null,
    ].filter(Boolean).join(" · ");

    // A succeeded job is done, whatever its runs were sized for (a recording's steps are its own: sized 0).
    const progress = job.status === "succeeded" ? 1 : Math.min(Math.max(Number(job.progress) || 0, 0), 1);
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
        el("td", { text: jobConfigLabel(job, run.config_index) }),
        el("td", { className: "num", text: run.repeat }),
        el("td", {}, badge(run.status)),
        el("td", { className: "num", text: run.steps_total ? `${run.steps_done ?? 0}/${run.steps_total}` : `${run.steps_done ?? 0}` }),
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

  // ---- tags ----------------------------------------------------------------------------------

  // Each tag links to the jobs that carry it.
  function renderTags(tags) {
    $("job-tags").replaceChildren(...(tags.length ? tags.map((tag) =>
      el("a", { className: "tag", href: `/jobs?tag=${encodeURIComponent(tag)}`, text: tag }))
      : [el("span", { className: "muted small", text: "none" })]));
  }

  function showTagsError(lines) {
    $("tags-error").textContent = lines.join(" ");
    $("tags-error").hidden = lines.length === 0;
  }

  function editTags(on) {
    $("tags-form").hidden = !on;
    $("edit-tags").hidden = on;
    $("job-tags").hidden = on;
    showTagsError([]);
    if (on) {
      $("tags-input").value = (shown?.tags || []).join(", ");
      $("tags-input").focus();
    }
  }

  async function saveTags(event) {
    event.preventDefault();
    if (!shown) return;
    try {
      const { ok, body, lines } = await sendJSON("PATCH", `${API}/jobs/${shown.id}`, { tags: parseTags($("tags-input").value) });
      if (!ok) {
        showTagsError(lines);
        return;
      }
      shown = { ...shown, tags: body.tags };
      renderTags(body.tags);
      editTags(false);
    } catch (err) {
      showTagsError([`Could not save the tags: ${err.message}`]);
    }
  }

  // ---- cancel --------------------------------------------------------------------------------

  async function cancelJob() {
    const job = shown;
    if (!job || !window.confirm(`Cancel job #${job.id}? Its ranks are killed; what they recorded is kept.`)) return;
    const button = $("cancel-job");
    button.disabled = true;
    try {
      const response = await fetch(`${API}/jobs/${job.id}/cancel`, { method: "POST", headers: { Accept: "application/json" } });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        const detail = typeof body.detail === "string" ? body.detail : `HTTP ${response.status}`;
        showLoadError(`Could not cancel the job: ${detail}`);
      }
      // The page's poll shows the cancelled status and the result of what was recorded.
    } catch (err) {
      showLoadError(`Could not cancel the job: ${err.message}`);
    } finally {
      button.disabled = false;
    }
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
    const view = kinds.get(job.kind);
    if (!view) {
      showLoadError(`This page cannot show a job of kind "${job.kind}"; its JSON is at ${API}/jobs/${job.id}.`);
      return;
    }
    showLoadError("");
    renderJob(job, view);
    if (isFinished(job)) {
      await view.load(job);
    } else {
      if (view.running) view.running(job);
      setTimeout(() => poll(jobId), POLL_MS);
    }
  }

  function start() {
    $("cancel-job").addEventListener("click", cancelJob);
    $("edit-tags").addEventListener("click", () => editTags(true));
    $("tags-cancel").addEventListener("click", () => editTags(false));
    $("tags-form").addEventListener("submit", saveTags);
    const match = window.location.pathname.match(/\/jobs\/(\d+)\/?$/);
    if (match) {
      poll(match[1]);
    } else {
      showLoadError("No job id in the address; expected /jobs/<id>.");
    }
  }

  function register(names, view) {
    for (const name of names) kinds.set(name, view);
  }

  window.detlab.job = { register, showLoadError, showNoResult, showVerdict, isFinished, jobConfigLabel, fetchResult, plot };
  // The scripts of each kind come after this one; they have all run by DOMContentLoaded.
  document.addEventListener("DOMContentLoaded", start);
})();
