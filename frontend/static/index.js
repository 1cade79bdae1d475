// Submit form for a train comparison, a collective test or a knob sweep, and the recent jobs table.
// All data goes into the page through textContent (never innerHTML), so names from the API
// and error messages cannot inject markup.
"use strict";

(function () {
  const JOBS_REFRESH_MS = 5000;
  // Ticked when the page opens; the lists themselves come from the server (GET /api/v1/meta).
  const TICKED = new Set(["all_reduce_sum", "float32", "bfloat16"]);
  const KINDS = {
    train: {
      button: "Submit comparison",
      description: "Train a workload under configs A and B and find the first step, tensor and rank where they part.",
    },
    collective: {
      button: "Submit collective test",
      description: "Run each collective on identical seeded inputs, many trials per message size, under each config: "
        + "distinct outputs, rank agreement, bus bandwidth, error against a float64 reference.",
    },
    sweep: {
      button: "Submit sweep",
      description: "The collective test once per cell of the knob product over the base config: "
        + "which settings are reproducible, and at what bandwidth.",
    },
  };
  const presets = new Map(); // name -> preset {name, description, config}
  const workloads = new Map(); // name -> workload {name, description, default_steps, global_batch}
  let limits = null; // the server's limits on a job, once /api/v1/meta has answered
  const maxSizes = () => (limits ? limits.max_sizes : Infinity);

  const { API, $, el, getJSON, meta, humanBytes, badge, formatTime } = window.detlab;

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

  function intValue(id, label, max) {
    const raw = $(id).value.trim();
    const value = Number(raw);
    if (raw === "" || !Number.isInteger(value) || value < 1) {
      throw new Error(`${label} must be a whole number of at least 1 (got "${raw}").`);
    }
    if (max !== undefined && value > max) {
      throw new Error(`${label} must be at most ${max} on this server (got ${value}).`);
    }
    return value;
  }

  // ---- collective and sweep parameters --------------------------------------------------------

  // all_reduce_sum reads better as "all_reduce (sum)": the reduction is a detail of the one collective.
  const opLabel = (op) => op.replace(/^all_reduce_(\w+)$/, "all_reduce ($1)");

  function fillChecks(box, prefix, values, label) {
    box.replaceChildren(...values.map((value) => {
      const input = el("input", { id: `${prefix}-${value}`, type: "checkbox", value });
      input.checked = TICKED.has(value);
      return el("label", {}, input, ` ${label(value)}`);
    }));
  }

  function checked(box) {
    return [...box.querySelectorAll("input[type=checkbox]:checked")].map((input) => input.value);
  }

  // Same series as the backend: min, min × factor, … while <= max.
  function messageSizes(min, max, factor) {
    const sizes = [];
    if (!(factor >= 2)) return sizes; // the server refuses a factor below 2; never loop forever
    for (let size = min; size <= max && sizes.length <= maxSizes(); size *= factor) sizes.push(size);
    return sizes;
  }

  function collectiveParams() {
    const ops = checked($("op-checks"));
    const dtypes = checked($("dtype-checks"));
    if (ops.length === 0) throw new Error("Tick at least one operation.");
    if (dtypes.length === 0) throw new Error("Tick at least one dtype.");
    const minBytes = intValue("min-bytes", "Min bytes");
    const maxBytes = intValue("max-bytes", "Max bytes");
    const stepFactor = intValue("step-factor", "Step factor");
    if (minBytes < 64) throw new Error(`Min bytes must be at least 64 (got ${minBytes}).`);
    if (minBytes > maxBytes) {
      throw new Error(`Min bytes (${humanBytes(minBytes)}) is above max bytes (${humanBytes(maxBytes)}); swap them.`);
    }
    if (stepFactor < 2) throw new Error("Step factor must be at least 2.");
    const count = messageSizes(minBytes, maxBytes, stepFactor).length;
    if (count > maxSizes()) {
      throw new Error(`That is more than ${maxSizes()} message sizes; raise the step factor or narrow min/max bytes.`);
    }
    const warmupRaw = $("warmup").value.trim();
    const warmup = Number(warmupRaw);
    if (warmupRaw === "" || !Number.isInteger(warmup) || warmup < 0) {
      throw new Error(`Warm-up must be a whole number of at least 0 (got "${warmupRaw}").`);
    }
    return {
      ops, dtypes, min_bytes: minBytes, max_bytes: maxBytes, step_factor: stepFactor,
      trials: intValue("trials", "Trials"), warmup,
    };
  }

  // Knob values are environment strings; a bare number is taken as its string, null as the library default.
  function parseKnobs() {
    let parsed;
    try {
      parsed = JSON.parse($("knobs").value);
    } catch (err) {
      throw new Error(`Sweep knobs: the JSON does not parse (${err.message}).`);
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed) || Object.keys(parsed).length === 0) {
      throw new Error('Sweep knobs: expected an object of knob → list of values, e.g. {"NCCL_ALGO": [null, "Ring", "Tree"]}.');
    }
    const knobs = {};
    for (const [name, values] of Object.entries(parsed)) {
      if (!Array.isArray(values) || values.length === 0) {
        throw new Error(`Sweep knobs: ${name} needs a non-empty list of values (null = the library default).`);
      }
      knobs[name] = values.map((value) => {
        if (value === null || typeof value === "string") return value;
        if (typeof value === "number" && Number.isFinite(value)) return String(value);
        throw new Error(`Sweep knobs: ${name} has ${JSON.stringify(value)}; use strings like "1" or null.`);
      });
    }
    return knobs;
  }

  function updateSizesHint() {
    for (const id of ["min-bytes", "max-bytes"]) {
      const n = Number($(id).value);
      $(`${id}-hint`).textContent = Number.isInteger(n) && n > 0 ? `= ${humanBytes(n)}` : "";
    }
    const [min, max, factor] = ["min-bytes", "max-bytes", "step-factor"].map((id) => Number($(id).value));
    const hint = $("sizes-hint");
    if (!(Number.isInteger(min) && Number.isInteger(max) && Number.isInteger(factor) && min >= 1 && factor >= 2)) {
      hint.textContent = "";
      return;
    }
    const sizes = messageSizes(min, max, factor);
    if (sizes.length === 0) hint.textContent = "No message sizes: min bytes is above max bytes.";
    else if (sizes.length > maxSizes()) hint.textContent = `More than ${maxSizes()} message sizes; at most ${maxSizes()}.`;
    else hint.textContent = `${sizes.length} message ${sizes.length === 1 ? "size" : "sizes"}: ${sizes.map(humanBytes).join(", ")}`;
    hint.classList.toggle("warn", sizes.length === 0 || sizes.length > maxSizes());
  }

  function updateCellCount() {
    const box = $("cell-count");
    let knobs;
    try {
      knobs = parseKnobs();
    } catch (err) {
      box.textContent = err.message;
      box.classList.add("warn");
      return;
    }
    const cells = Object.values(knobs).reduce((product, values) => product * values.length, 1);
    const repeats = Number($("repeats").value);
    const runs = Number.isInteger(repeats) && repeats > 0 ? ` × ${repeats} ${repeats === 1 ? "repeat" : "repeats"} = ${cells * repeats} runs` : "";
    const max = limits ? limits.max_sweep_cells : Infinity;
    const over = cells > max ? ` (at most ${max})` : "";
    box.textContent = `${cells} ${cells === 1 ? "cell" : "cells"} (${Object.keys(knobs).join(" × ")})${runs}${over}`;
    box.classList.toggle("warn", cells > max);
  }

  function syncKind() {
    const kind = $("kind").value;
    const train = kind === "train";
    $("workload-field").hidden = !train;
    $("steps-field").hidden = !train;
    $("collective-fields").hidden = train;
    $("sweep-fields").hidden = kind !== "sweep";
    $("panel-b").hidden = kind === "sweep";
    $("config-a-title").replaceChildren(
      kind === "sweep" ? "Base config " : "Config A ",
      kind === "sweep" ? el("small", { text: "(every cell starts from it)" }) : el("small", { text: "(baseline)" })
    );
    $("submit").textContent = KINDS[kind].button;
    $("kind-description").textContent = KINDS[kind].description;
    updateSizesHint();
    updateCellCount();
  }

  function buildPayload() {
    const kind = $("kind").value;
    const common = {
      world_size: intValue("world-size", "World size", limits?.max_world_size),
      repeats: intValue("repeats", "Repeats", limits?.max_repeats),
    };
    if (kind === "collective") {
      return { kind, configs: [configFor("a"), configFor("b")], ...common, collective: collectiveParams() };
    }
    if (kind === "sweep") {
      const knobs = parseKnobs();
      return { kind, configs: [configFor("a")], ...common, sweep: { over: "collective", knobs }, collective: collectiveParams() };
    }
    return {
      kind: "train",
      workload: $("workload").value,
      configs: [configFor("a"), configFor("b")],
      world_size: common.world_size,
      steps: intValue("steps", "Steps", limits?.max_steps),
      repeats: common.repeats,
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

  function configNames(job) {
    const names = job.config_names || [];
    if (names.length > 3) return `${names.length} configs (${names[0]}, ${names[1]}, …)`;
    return names.join(" vs ");
  }

  function jobRow(job) {
    const href = `/jobs/${encodeURIComponent(job.id)}`;
    const names = configNames(job);
    const train = (job.kind || "train") === "train";
    return el(
      "tr",
      {},
      el("td", {}, el("a", { href, text: `#${job.id}` })),
      el("td", { text: job.kind || "" }),
      el("td", { text: job.workload || "" }),
      el("td", {}, el("a", { href, text: names || "—" })),
      el("td", { className: "num", text: job.world_size ?? "" }),
      el("td", { className: "num", text: train ? job.steps ?? "" : "" }),
      el("td", { className: "num", text: job.repeats ?? "" }),
      el("td", {}, badge(job.status)),
      el("td", {}, badge(job.verdict, ["failed", "cancelled"].includes(job.status) || !train ? "—" : "pending")),
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
    $("kind").addEventListener("change", syncKind);
    for (const id of ["min-bytes", "max-bytes", "step-factor"]) $(id).addEventListener("input", updateSizesHint);
    for (const id of ["knobs", "repeats"]) $(id).addEventListener("input", updateCellCount);
    syncKind();
    loadJobs();
    setInterval(loadJobs, JOBS_REFRESH_MS);

    let workloadList, presetList, lists;
    try {
      [workloadList, presetList, lists] = await Promise.all([
        getJSON(`${API}/workloads`), getJSON(`${API}/presets`), meta(),
      ]);
    } catch (err) {
      showError([`Could not load workloads, presets and collective ops: ${err.message}`]);
      $("submit").disabled = true;
      return;
    }
    fillChecks($("op-checks"), "op", lists.ops, opLabel);
    fillChecks($("dtype-checks"), "dtype", lists.dtypes, String);
    limits = lists.limits;
    $("world-size").max = String(limits.max_world_size);
    $("steps").max = String(limits.max_steps);
    $("repeats").max = String(limits.max_repeats);
    updateCellCount();
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
