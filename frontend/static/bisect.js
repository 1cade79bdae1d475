// Job page for a bisect: a diverged train pair replayed up to its first divergent step, that step probed module
// by module. Shows the first difference, the first divergent module (introduced or carried) and the model's
// module tree with each module's status. Also puts the "Find the first divergent module" button on a diverged
// train job's page. All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const { API, $, el, sendJSON, jobConfigLabel: label } = window.detlab;
  const { register, showNoResult, showVerdict, fetchResult } = window.detlab.job;
  const OPEN_ALL_BELOW = 200; // a larger tree opens only along the path to the first difference
  const STATUS_CLASS = { "equal": "mod-equal", "differs": "mod-differs", "first difference": "mod-first", "not called": "mod-idle" };

  function describe(job) {
    const src = job.params.bisect || {};
    const names = (job.configs || []).map((c, i) => label(job, i)).join(" vs ");
    return { facts: [names, `workload ${job.workload}`, `replays job #${src.job}`], extent: [`probes step ${src.step}`] };
  }

  // ---- the module tree --------------------------------------------------------------------------

  function moduleLine(row) {
    const parts = [
      el("code", { className: "mod-name", text: row.shown }),
      el("span", { className: "muted small", text: ` ${row.type}` }),
      el("span", { className: `mod-status ${STATUS_CLASS[row.status] || ""}`, text: row.status }),
    ];
    if (row.verdict) parts.push(el("span", { className: "muted small", text: row.verdict }));
    if (row.state_differs) parts.push(el("span", { className: "mod-status mod-state", text: "parameters differed at start" }));
    if (row.differing.length) parts.push(el("span", { className: "muted small", text: row.differing.join(", ") }));
    return parts;
  }

  // Rows come parents first (named_modules order) with their depth: nest each under the last shallower one.
  function renderTree(rows, firstModule) {
    const root = el("div", { className: "module-tree" });
    const onPath = new Set();
    if (firstModule !== null && firstModule !== undefined) {
      const parts = firstModule.split(".");
      onPath.add("");
      for (let i = 1; i <= parts.length; i++) onPath.add(parts.slice(0, i).join("."));
    }
    const openAll = rows.length < OPEN_ALL_BELOW;
    const stack = [{ depth: -1, box: root }];
    rows.forEach((row, i) => {
      while (stack[stack.length - 1].depth >= row.depth) stack.pop();
      const parent = stack[stack.length - 1].box;
      const hasChildren = i + 1 < rows.length && rows[i + 1].depth > row.depth;
      const cls = `mod-row ${STATUS_CLASS[row.status] || ""}`;
      if (hasChildren) {
        const box = el("details", { className: "mod-node" }, el("summary", { className: cls }, ...moduleLine(row)));
        box.open = openAll || onPath.has(row.module);
        box.dataset.module = row.module;
        parent.append(box);
        stack.push({ depth: row.depth, box });
      } else {
        const leaf = el("div", { className: cls }, ...moduleLine(row));
        leaf.dataset.module = row.module;
        parent.append(leaf);
      }
    });
    $("module-tree").replaceChildren(root);
  }

  // ---- the diagnosis ----------------------------------------------------------------------------

  function fact(term, value) {
    return el("div", {}, el("dt", { text: term }), el("dd", { text: value }));
  }

  function renderDiagnosis(job, res) {
    const d = res.diagnosis;
    const src = res.source || {};
    const facts = [fact("Replays", `job #${src.job}, runs #${(src.runs || []).join(" and #")}`),
      fact("Step probed", `${res.step} (first divergent step ${src.first_divergent_step})`)];
    const m = d && d.first_module;
    if (d && d.first) facts.push(fact("First difference", `${d.first.entry} on rank ${d.first.ranks.join(", ")}`));
    if (m) {
      facts.push(fact("First divergent module", `${m.shown} (${m.type || "?"}), ${m.phase} call #${m.call}`));
      facts.push(fact("Its inputs", m.inputs_matched ? "matched: it introduced the difference"
        : `differed (${m.differing_inputs.join(", ")}): it carried the difference`));
      facts.push(fact("Ranks", m.ranks.join(", ")));
    }
    if (d) facts.push(fact("Entries differing", `${d.entries_differing} of ${d.entries}`));
    $("bisect-facts").replaceChildren(...facts);
    $("bisect-summary").textContent = d ? d.summary : res.reason || "";
    $("bisect-tree-block").hidden = !d;
    if (d) renderTree(d.tree, m ? m.module : null);
  }

  async function load(job) {
    let res;
    try {
      res = await fetchResult(job, `${API}/jobs/${job.id}/bisect`);
    } catch (err) {
      showNoResult(err.status !== 404 ? `Could not load the bisect: ${err.message}`
        : job.status === "failed" ? "The replay failed before its probe step was recorded. See the run errors above."
          : "Nothing recorded for this bisect yet.");
      return;
    }
    const m = res.diagnosis && res.diagnosis.first_module;
    const headline = res.verdict !== "diverged" ? `${res.verdict}: ${res.reason || ""}`
      : m ? `First divergent module: ${m.shown} (${m.phase}) — ${m.inputs_matched ? "introduced" : "carried"}`
        : `First difference: ${res.diagnosis.first.entry}`;
    showVerdict(res.verdict, headline, [["Step probed", res.step]]);
    $("bisect").hidden = false;
    $("bisect-verdict").textContent = res.verdict;
    $("bisect-verdict").className = `badge badge-${res.verdict}`;
    renderDiagnosis(job, res);
  }

  // Rerun on the page opens the submit form, which makes train jobs; POST /jobs/{id}/rerun bisects again.
  register(["bisect"], { runsHead: "Steps", describe, load, rerunnable: false });

  // ---- the button on a diverged train job's page --------------------------------------------------

  async function submitBisect(event) {
    const button = event.currentTarget;
    const jobId = button.dataset.job;
    button.disabled = true;
    $("bisect-status").textContent = "Submitting…";
    try {
      const { ok, body, lines } = await sendJSON("POST", `${API}/jobs/${jobId}/bisect`, {});
      if (!ok) {
        $("bisect-status").textContent = lines.join(" ");
        button.disabled = false;
        return;
      }
      $("bisect-status").replaceChildren("Submitted: ", el("a", { id: "bisect-link", href: `/jobs/${body.id}`, text: `bisect job #${body.id}` }));
    } catch (err) {
      $("bisect-status").textContent = `Could not submit the bisect: ${err.message}`;
      button.disabled = false;
    }
  }

  // train.js shows the comparison; once it says the pair diverged, offer the bisect (a train job's: not a recording's).
  window.detlab.job.offerBisect = function (job, cmp) {
    const button = $("bisect-job");
    button.hidden = !(job.kind === "train" && cmp.verdict === "diverged");
    button.dataset.job = job.id;
  };
  document.addEventListener("DOMContentLoaded", () => $("bisect-job").addEventListener("click", submitBisect));
})();
