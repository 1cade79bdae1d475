// The submit form's knobs of the two diagnosis kinds (batch-invariance, op-audit), used by index.js.
// Lists and limits come from the server (GET /api/v1/meta `diagnosis`); the server checks them again.
"use strict";

window.detlab.diagnosisForm = (() => {
  const { $, el } = window.detlab;
  const TICKED = new Set(["mm", "matmul", "log_softmax", "layer_norm", "rms_norm", "sum", "float32", "bfloat16"]);
  const KINDS = {
    "batch-invariance": {
      button: "Submit batch-invariance test",
      description: "Run each op on the first b samples of one input and on the first sample alone, per config: is row 0 "
        + "bitwise equal to the batch-1 result, how many ULP apart, and the first batch size that breaks. "
        + "One rank per config.",
    },
    "op-audit": {
      button: "Submit op audit",
      description: "Run one training step of the workload under each config's flags, list every aten op it runs, and "
        + "re-run each on identical inputs: which give different bits, which PyTorch itself flags, and which "
        + "stay nondeterministic although the config claims determinism. One rank per config.",
    },
  };
  let lists = null;

  const isDiagnosis = (kind) => kind in KINDS;

  function fillChecks(box, prefix, values) {
    box.replaceChildren(...values.map((value) => {
      const input = el("input", { id: `${prefix}-${value}`, type: "checkbox", value });
      input.checked = TICKED.has(value);
      return el("label", {}, input, ` ${value}`);
    }));
  }

  function checked(box) {
    return [...box.querySelectorAll("input[type=checkbox]:checked")].map((input) => input.value);
  }

  function init(diagnosisLists, workloadList) {
    lists = diagnosisLists;
    fillChecks($("bi-op-checks"), "bi-op", lists.ops);
    fillChecks($("bi-dtype-checks"), "bi-dtype", lists.dtypes);
    $("features").min = String(lists.min_features);
    $("features").max = String(lists.max_features);
    $("features").step = String(lists.features_multiple);
    $("reruns").max = String(lists.max_reruns);
    $("batch-sizes").value = lists.default_batch_sizes.join(", ");
    // A registered script's model is checked by the script's detlab.batch_invariance call (docs/sdk.md).
    $("bi-workload").replaceChildren(el("option", { value: "", text: "(ops only)" }),
      ...workloadList.map((w) => el("option", { value: w.name, text: w.script ? `${w.name} (script)` : w.name })));
    $("batch-sizes").addEventListener("input", updateHint);
    $("features").addEventListener("input", updateHint);
    updateHint();
  }

  function parseSizes() {
    const parts = $("batch-sizes").value.split(/[\s,]+/).filter(Boolean);
    const sizes = parts.map(Number);
    const max = lists ? lists.max_batch : Infinity;
    const bad = parts.filter((p, i) => !Number.isInteger(sizes[i]) || sizes[i] < 1 || sizes[i] > max);
    if (parts.length === 0) throw new Error("Batch sizes: give at least one, e.g. 1, 2, 4, 8.");
    if (bad.length) throw new Error(`Batch sizes: ${JSON.stringify(bad[0])} is not a whole number from 1 to ${max}.`);
    const unique = [...new Set(sizes)].sort((a, b) => a - b);
    if (lists && unique.length > lists.max_batch_sizes) {
      throw new Error(`Batch sizes: at most ${lists.max_batch_sizes} (got ${unique.length}).`);
    }
    return unique;
  }

  function features() {
    const raw = $("features").value.trim();
    const value = Number(raw);
    const { min_features: lo, max_features: hi, features_multiple: step } = lists;
    if (!Number.isInteger(value) || value < lo || value > hi || value % step) {
      throw new Error(`Features must be a multiple of ${step} from ${lo} to ${hi} (got "${raw}").`);
    }
    return value;
  }

  function updateHint() {
    const hint = $("batch-sizes-hint");
    try {
      const sizes = parseSizes();
      const elements = Math.max(...sizes) * features();
      const over = lists && elements > lists.max_elements;
      hint.textContent = over
        ? `Largest batch × features is ${elements.toLocaleString()}; at most ${lists.max_elements.toLocaleString()}.`
        : `${sizes.length} batch ${sizes.length === 1 ? "size" : "sizes"}: ${sizes.join(", ")}`;
      hint.classList.toggle("warn", Boolean(over));
    } catch (err) {
      hint.textContent = err.message;
      hint.classList.add("warn");
    }
  }

  function intAtLeast(id, label, min) {
    const raw = $(id).value.trim();
    const value = Number(raw);
    if (raw === "" || !Number.isInteger(value) || value < min) {
      throw new Error(`${label} must be a whole number of at least ${min} (got "${raw}").`);
    }
    return value;
  }

  // The request body of a diagnosis job; `configFor(side)` gives a config panel's config.
  function payload(kind, workload, configFor) {
    const threads = $("diag-threads").value.trim();
    const withThreads = (config) => (threads === "" ? config
      : { ...config, threads: intAtLeast("diag-threads", "Threads", 1) });
    const configs = [withThreads(configFor("a")), withThreads(configFor("b"))];
    if (kind === "op-audit") {
      return { kind, workload, configs, world_size: 1, repeats: 1, diagnosis: {
        reruns: intAtLeast("reruns", "Re-runs", 2), calls_per_op: intAtLeast("calls-per-op", "Calls kept per op", 1) } };
    }
    const ops = checked($("bi-op-checks"));
    const dtypes = checked($("bi-dtype-checks"));
    if (ops.length === 0) throw new Error("Tick at least one operation.");
    if (dtypes.length === 0) throw new Error("Tick at least one dtype.");
    const diagnosis = { ops, dtypes, batch_sizes: parseSizes(), features: features() };
    if ($("bi-workload").value) diagnosis.workload = $("bi-workload").value;
    return { kind, configs, world_size: 1, repeats: 1, diagnosis };
  }

  // Show the panel of `kind` (or hide it for the other kinds).
  function sync(kind) {
    const on = isDiagnosis(kind);
    $("diagnosis-fields").hidden = !on;
    if (!on) return;
    $("diagnosis-legend").textContent = kind === "op-audit" ? "Op audit" : "Batch invariance";
    $("invariance-fields").hidden = kind !== "batch-invariance";
    $("audit-fields").hidden = kind !== "op-audit";
    $("diagnosis-hint").textContent = kind === "op-audit"
      ? "The step runs under each config's own flags, as its training would."
      : "Each config's TF32 and deterministic flags apply; the device and the flags in effect are recorded.";
  }

  // A rerun: the form filled in from a job's spec.
  function fill(spec) {
    const d = spec.diagnosis || {};
    for (const [box, values] of [["bi-op-checks", d.ops], ["bi-dtype-checks", d.dtypes]]) {
      if (!values) continue;
      for (const input of $(box).querySelectorAll("input[type=checkbox]")) input.checked = values.includes(input.value);
    }
    if (d.batch_sizes) $("batch-sizes").value = d.batch_sizes.join(", ");
    if (d.features) $("features").value = d.features;
    $("bi-workload").value = d.workload || "";
    if (d.reruns) $("reruns").value = d.reruns;
    if (d.calls_per_op) $("calls-per-op").value = d.calls_per_op;
    updateHint();
  }

  return { KINDS, isDiagnosis, init, payload, sync, fill };
})();
