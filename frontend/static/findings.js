// Findings page: the team's history of configs vs reproducibility and bandwidth (GET /api/v1/findings).
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function size(bytes) {
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
    return `${bytes} ${units[i]}`;
  }

  function render(groups) {
    const needle = $("filter").value.trim().toLowerCase();
    const body = $("findings").querySelector("tbody");
    body.replaceChildren();
    const shown = groups.filter((g) => !needle ||
      [g.hardware, g.library, g.config, g.op, g.dtype].join(" ").toLowerCase().includes(needle));
    for (const g of shown) {
      const tr = document.createElement("tr");
      const all = g.reproducible === g.cells;
      const badge = document.createElement("span");
      badge.className = `badge badge-${all ? "identical" : "diverged"}`;
      badge.textContent = all ? "reproducible" : "not reproducible";
      const verdictTd = document.createElement("td");
      verdictTd.append(badge);
      tr.append(cell(g.hardware), cell(g.library), cell(g.config), cell(g.op), cell(g.dtype), verdictTd,
        cell(`${g.reproducible}/${g.cells}`, "num"), cell(String(g.min_runs), "num"),
        cell(g.busbw_gbps_at_largest === null ? "—" : g.busbw_gbps_at_largest.toFixed(1), "num"),
        cell(size(g.largest_bytes), "num"), cell(g.sources.join(", ")));
      tr.title = Object.entries(g.env).map(([k, v]) => `${k}=${v}`).join(" ") || "library defaults";
      body.append(tr);
    }
    if (!shown.length) {
      const tr = document.createElement("tr");
      const td = cell(groups.length ? "Nothing matches the filter." : "No findings yet: run a collective or sweep job.");
      td.colSpan = 11;
      tr.append(td);
      body.append(tr);
    }
    $("count").textContent = `${shown.length} of ${groups.length} rows`;
  }

  async function load() {
    const resp = await fetch("/api/v1/findings");
    const groups = resp.ok ? (await resp.json()).groups : [];
    $("filter").addEventListener("input", () => render(groups));
    render(groups);
  }

  load();
})();
