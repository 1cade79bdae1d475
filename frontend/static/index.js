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
  const diagnosisForm = window.detlab.diagnosisForm;
  Object.assign(KINDS, diagnosisForm.KINDS);
  const presets = new Map(); // name -> preset {name, description, config}
  const workloads = new Map(); // name -> workload {name, description, default_steps, global_batch}
  let limits = null; // the server's limits on a job, once /api/v1/meta has answered
  const maxSizes = () => (limits ? limits.max_sizes : Infinity);

  const { API, $, el, getJSON, meta, humanBytes, badge, formatTime, formatDetail, listVerdict, summaryConfigNames,
    tagChips, parseTags } = window.detlab;
  // What a rerun carries that the form does not show (queue, fingerprint interval, an injected bit flip).
  let carried = {};

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

  // A config's own world size, when given, overrides the job's for that config's runs ("preset @W4").
  function configFor(side) {
    const config = configBody(side);
    const label = side.toUpperCase();
    if ($(`world-${side}`).value.trim() !== "") {
      config.world_size = intValue(`world-${side}`, `Config ${label} world size`, limits?.max_world_size);
    }
    return config;
  }

  function configBody(side) {
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
    const diagnosis = diagnosisForm.isDiagnosis(kind);
    $("workload-field").hidden = !train && kind !== "op-audit";
    $("steps-field").hidden = !train;
    $("world-size-field").hidden = diagnosis; // one rank per config
    $("repeats-field").hidden = diagnosis;
    $("collectives-field").hidden = !train;
    $("collective-fields").hidden = train || diagnosis;
    diagnosisForm.sync(kind);
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

  function tagsValue() {
    const tags = parseTags($("tags").value);
    const max = limits ? limits.max_tags : Infinity;
    if (tags.length > max) throw new Error(`At most ${max} tags (got ${tags.length}).`);
    const pattern = limits ? new RegExp(limits.tag_pattern) : /./;
    const bad = tags.filter((t) => !pattern.test(t) || t.length > (limits ? limits.max_tag_length : Infinity));
    if (bad.length) {
      throw new Error(`Tag ${JSON.stringify(bad[0])}: a letter or digit, then letters, digits and . _ : = + -, `
        + `at most ${limits.max_tag_length} characters.`);
    }
    return tags;
  }

  function buildPayload() {
    const form = formPayload();
    // A rerun's carried keys go only to a kind that takes them: a bit flip is a train run's (else a 422).
    const { inject_bitflip: flip, ...shared } = carried;
    return { ...shared, ...(form.kind === "train" && flip ? { inject_bitflip: flip } : {}), ...form, tags: tagsValue() };
  }

  function formPayload() {
    const kind = $("kind").value;
    if (diagnosisForm.isDiagnosis(kind)) return diagnosisForm.payload(kind, $("workload").value, configFor);
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
      record_collectives: $("record-collectives").checked,
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
      const { ok, body, lines } = await window.detlab.sendJSON("POST", `${API}/jobs`, payload);
      if (ok && body && body.id !== undefined) {
        window.location.assign(`/jobs/${encodeURIComponent(body.id)}`);
        return;
      }
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
    const names = summaryConfigNames(job);
    if (names.length > 3) return `${names.length} configs (${names[0]}, ${names[1]}, …)`;
    return names.join(" vs ");
  }

  function jobRow(job) {
    const href = `/jobs/${encodeURIComponent(job.id)}`;
    const names = configNames(job);
    const train = (job.kind || "train") === "train";
    const tags = (job.tags || []).length ? [" ", tagChips(job.tags)] : [];
    return el(
      "tr",
      {},
      el("td", {}, el("a", { href, text: `#${job.id}` })),
      el("td", { text: job.kind || "" }),
      el("td", { text: job.workload || "" }),
      el("td", {}, el("a", { href, text: names || "—" }), ...tags),
      el("td", { className: "num", text: job.world_size ?? "" }),
      el("td", { className: "num", text: train ? job.steps ?? "" : "" }),
      el("td", { className: "num", text: job.repeats ?? "" }),
      el("td", {}, badge(job.status)),
      el("td", {}, listVerdict(job)),
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

  // ---- rerun: the form filled in from a job ---------------------------------------------------

  // JSON with sorted keys: a config equals a preset's whatever order its keys come in.
  function canonical(value) {
    if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
    if (value && typeof value === "object") {
      return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
    }
    return JSON.stringify(value ?? null);
  }

  const withoutWorld = (body) => ({ ...body, world_size: null });

  // A config from a job: its preset when it is one unchanged, else its JSON to edit; its own world size apart.
  function setConfig(side, body) {
    $(`world-${side}`).value = body.world_size ?? "";
    const preset = presets.get(body.name);
    const select = $(`preset-${side}`);
    const area = $(`config-${side}`);
    if (preset && canonical(withoutWorld(preset.config)) === canonical(withoutWorld(body))) {
      select.value = preset.name;
      $(`edit-${side}`).checked = false;
    } else {
      // JSON without a preset key starts from the default preset on the server: say so.
      select.value = preset ? preset.name : presets.has("default") ? "default" : select.value;
      const { world_size: _world, ...rest } = body;
      area.value = JSON.stringify(rest, null, 2);
      area.dataset.preset = select.value;
      $(`edit-${side}`).checked = true;
    }
    syncPanel(side, false);
  }

  function setCollective(params) {
    for (const [box, values] of [["op-checks", params.ops], ["dtype-checks", params.dtypes]]) {
      if (!values) continue;
      for (const input of $(box).querySelectorAll("input[type=checkbox]")) input.checked = values.includes(input.value);
    }
    const fields = { "min-bytes": params.min_bytes, "max-bytes": params.max_bytes, "step-factor": params.step_factor,
      trials: params.trials, warmup: params.warmup };
    for (const [id, value] of Object.entries(fields)) if (value !== undefined) $(id).value = value;
  }

  async function prefill(jobId) {
    let spec;
    try {
      spec = await getJSON(`${API}/jobs/${encodeURIComponent(jobId)}/spec`);
    } catch (err) {
      showError([`Could not load job #${jobId} to run it again: ${err.message}`]);
      return;
    }
    $("kind").value = spec.kind;
    if (spec.workload && workloads.has(spec.workload)) {
      $("workload").value = spec.workload;
      $("workload").dispatchEvent(new Event("change"));
    }
    $("world-size").value = spec.world_size;
    $("repeats").value = spec.repeats;
    if (spec.steps) $("steps").value = spec.steps;
    $("record-collectives").checked = Boolean(spec.record_collectives);
    $("tags").value = (spec.tags || []).join(", ");
    if (spec.collective) setCollective(spec.collective);
    if (spec.diagnosis) diagnosisForm.fill(spec);
    if (spec.sweep) $("knobs").value = JSON.stringify(spec.sweep.knobs);
    spec.configs.slice(0, 2).forEach((body, i) => setConfig(i === 0 ? "a" : "b", body));
    carried = {};
    for (const key of ["queue", "fingerprint_interval", "inject_bitflip"]) {
      if (spec[key] !== undefined && spec[key] !== null) carried[key] = spec[key];
    }
    const notes = [`Filled in from job #${jobId}: change anything, then submit it as a new job.`];
    if (spec.queue && spec.queue !== "default") notes.push(`It goes to queue ${spec.queue}, as the job did.`);
    if (spec.inject_bitflip) notes.push("It injects the same bit flip.");
    if (spec.configs.length > 2) notes.push(`The job had ${spec.configs.length} configs; this form sends the first two.`);
    if (spec.sweep && spec.sweep.over !== "collective") notes.push("The job swept training runs; this form sweeps collectives.");
    const note = $("rerun-note");
    note.textContent = notes.join(" ");
    note.hidden = false;
    syncKind();
    updateSizesHint();
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
    diagnosisForm.init(lists.diagnosis, workloadList);
    for (const p of presetList) presets.set(p.name, p);

    const workloadSelect = $("workload");
    // A team's registered scripts (workers' --scripts) are listed with the built-ins, marked; only the name is sent.
    workloadSelect.replaceChildren(...workloadList.map((w) => el("option", { value: w.name,
      text: w.script ? `${w.name} (script)` : w.name })));
    const onWorkload = () => {
      const w = workloads.get(workloadSelect.value);
      if (!w) return;
      const batch = w.script
        ? ` A registered script${w.world_sizes ? `, world sizes ${w.world_sizes.join(", ")}` : ""}.`
        : w.global_batch ? ` Global batch ${w.global_batch}, split across ranks.` : "";
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

    const params = new URLSearchParams(window.location.search);
    const rerun = params.get("rerun");
    if (rerun && /^\d+$/.test(rerun)) await prefill(rerun);
    else if (params.has("kind")) prefillKind(params.get("kind"), params.get("workload"));
  }

  // ?kind=K&workload=W (the why-report's "run a … of W" links): the form set to that kind and workload.
  function prefillKind(kind, workload) {
    const offered = [...$("kind").options].some((option) => option.value === kind);
    if (offered) {
      $("kind").value = kind;
      syncKind();
    }
    if (workload && workloads.has(workload)) {
      $("workload").value = workload;
      $("workload").dispatchEvent(new Event("change"));
    }
    const note = $("rerun-note");
    note.textContent = offered ? `A ${kind} job of ${workload || "a workload"}: check the rest, then submit.`
      : `This form cannot submit ${kind} jobs here; pick another kind.`;
    note.hidden = false;
  }

  init();
})();
