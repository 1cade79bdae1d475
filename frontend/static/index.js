// Submit form for a two-config comparison, and the recent jobs table.
// All data goes into the page through textContent (never innerHTML), so names from the API
// and error messages cannot inject markup.
"use strict";

(function () {
  const API = "/api/v1";
  const JOBS_REFRESH_MS = 5000;
  const presets = new Map(); // name -> preset {name, description, config}
  const workloads = new Map(); // name -> workload {name, description, default_steps, global_batch}

  const $ = (id) => document.getElementById(id);

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
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response.json();
  }

  // FastAPI sends detail as a string, or as a list of {loc, msg}; "body" in loc is noise to a user.
  function formatDetail(detail) {
    if (typeof detail === "string") return [detail];
    if (Array.isArray(detail)) {
      return detail.map((item) => {
        if (item && typeof item === "object") {
          const loc = (item.loc || []).filter((part) => part !== "body").join(".");
          return loc ? `${loc}: ${item.msg}` : String(item.msg);
        }
        return String(item);
      });
    }
    if (detail && typeof detail === "object") return [JSON.stringify(detail)];
    return ["The server rejected the request."];
  }

  function showError(lines) {
    const box = $("error");
    box.replaceChildren();
    if (!lines || lines.length === 0) {
      box.hidden = true;
      return;
    }
    if (lines.length === 1) {
      box.textContent = lines[0];
    } else {
      box.append(el("ul", {}, ...lines.map((line) => el("li", { text: line }))));
    }
    box.hidden = false;
  }

  // ---- config panels -------------------------------------------------------------------------

  function fillPresetSelect(select, chosen) {
    select.replaceChildren(
      ...[...presets.values()].map((p) => el("option", { value: p.name, text: p.name }))
    );
    if (presets.has(chosen)) select.value = chosen;
  }

  function syncPanel(side, presetChanged) {
    const preset = presets.get($(`preset-${side}`).value);
    $(`preset-${side}-description`).textContent = preset ? preset.description || "" : "";
    const editing = $(`edit-${side}`).checked;
    const area = $(`config-${side}`);
    area.hidden = !editing;
    // Choosing another preset starts the JSON over from it; toggling edit off and on keeps the edits.
    if (editing && preset && (presetChanged || area.dataset.preset !== preset.name)) {
      area.value = JSON.stringify(preset.config, null, 2);
      area.dataset.preset = preset.name;
    }
  }

  function configFor(side) {
    const label = side.toUpperCase();
    if (!$(`edit-${side}`).checked) return { preset: $(`preset-${side}`).value };
    let parsed;
    try {
      parsed = JSON.parse($(`config-${side}`).value);
    } catch (err) {
      throw new Error(`Config ${label}: the JSON does not parse (${err.message}). Fix it or untick "edit as JSON".`);
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
      throw new Error(`Config ${label}: expected a JSON object like the preset's, with name, env, torch, seed, threads.`);
    }
    return parsed;
  }

  function intValue(id, label) {
    const raw = $(id).value.trim();
    const value = Number(raw);
    if (raw === "" || !Number.isInteger(value) || value < 1) {
      throw new Error(`${label} must be a whole number of at least 1 (got "${raw}").`);
    }
    return value;
  }

  function buildPayload() {
    return {
      kind: "train",
      workload: $("workload").value,
      configs: [configFor("a"), configFor("b")],
      world_size: intValue("world-size", "World size"),
      steps: intValue("steps", "Steps"),
      repeats: intValue("repeats", "Repeats"),
    };
  }

  async function submit(event) {
    event.preventDefault();
    let payload;
    try {
      payload = buildPayload();
    } catch (err) {
      showError([err.message]);
      return;
    }
    showError([]);
    const button = $("submit");
    button.disabled = true;
    $("submit-status").textContent = "Submitting…";
    try {
      const response = await fetch(`${API}/jobs`, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify(payload),
      });
      let body = null;
      try {
        body = await response.json();
      } catch (_) {
        body = null;
      }
      if (response.status === 201 || (response.ok && body && body.id !== undefined)) {
        window.location.assign(`/jobs/${encodeURIComponent(body.id)}`);
        return;
      }
      const lines = body && body.detail !== undefined
        ? formatDetail(body.detail)
        : [`The server answered HTTP ${response.status}.`];
      showError(lines);
    } catch (err) {
      showError([`Could not reach the server: ${err.message}`]);
    } finally {
      button.disabled = false;
      $("submit-status").textContent = "";
    }
  }

  // ---- recent jobs -----------------------------------------------------------------------------

  function badge(value, fallback) {
    if (!value) return el("span", { className: "muted", text: fallback || "—" });
    return el("span", { className: `badge badge-${value}`, text: value });
  }

  function formatTime(iso) {
    if (!iso) return "";
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
  }

  function jobRow(job) {
    const href = `/jobs/${encodeURIComponent(job.id)}`;
    const names = (job.config_names || []).join(" vs ");
    return el(
      "tr",
      {},
      el("td", {}, el("a", { href, text: `#${job.id}` })),
      el("td", { text: job.kind || "" }),
      el("td", { text: job.workload || "" }),
      el("td", {}, el("a", { href, text: names || "—" })),
      el("td", { className: "num", text: job.world_size ?? "" }),
      el("td", { className: "num", text: job.steps ?? "" }),
      el("td", { className: "num", text: job.repeats ?? "" }),
      el("td", {}, badge(job.status)),
      el("td", {}, badge(job.verdict, job.status === "failed" ? "—" : "pending")),
      el("td", { className: "muted", text: formatTime(job.created_at) })
    );
  }

  async function loadJobs() {
    const tbody = $("jobs-table").tBodies[0];
    try {
      const page = await getJSON(`${API}/jobs?limit=20`);
      const items = page.items || [];
      if (items.length === 0) {
        tbody.replaceChildren(el("tr", { className: "empty" }, el("td", { colspan: "10", text: "No jobs yet." })));
      } else {
        tbody.replaceChildren(...items.map(jobRow));
      }
      $("jobs-total").textContent = page.total > items.length ? `Showing ${items.length} of ${page.total} jobs.` : "";
    } catch (err) {
      tbody.replaceChildren(
        el("tr", { className: "empty" }, el("td", { colspan: "10", text: `Could not load jobs: ${err.message}` }))
      );
    }
  }

  // ---- start -----------------------------------------------------------------------------------

  async function init() {
    $("job-form").addEventListener("submit", submit);
    loadJobs();
    setInterval(loadJobs, JOBS_REFRESH_MS);

    let workloadList, presetList;
    try {
      [workloadList, presetList] = await Promise.all([getJSON(`${API}/workloads`), getJSON(`${API}/presets`)]);
    } catch (err) {
      showError([`Could not load workloads and presets: ${err.message}`]);
      $("submit").disabled = true;
      return;
    }
    for (const w of workloadList) workloads.set(w.name, w);
    for (const p of presetList) presets.set(p.name, p);

    const workloadSelect = $("workload");
    workloadSelect.replaceChildren(...workloadList.map((w) => el("option", { value: w.name, text: w.name })));
    const onWorkload = () => {
      const w = workloads.get(workloadSelect.value);
      if (!w) return;
      const batch = w.global_batch ? ` Global batch ${w.global_batch}, split across ranks.` : "";
      $("workload-description").textContent = `${w.description || ""}${batch}`;
      if (w.default_steps) $("steps").value = w.default_steps;
    };
    workloadSelect.addEventListener("change", onWorkload);
    onWorkload();

    // A deterministic B against the fast default is the comparison most people come for.
    fillPresetSelect($("preset-a"), "default");
    fillPresetSelect($("preset-b"), presets.has("full-deterministic") ? "full-deterministic" : presetList[1]?.name);
    for (const side of ["a", "b"]) {
      $(`preset-${side}`).addEventListener("change", () => syncPanel(side, true));
      $(`edit-${side}`).addEventListener("change", () => syncPanel(side, false));
      syncPanel(side, false);
    }
  }

  init();
})();
