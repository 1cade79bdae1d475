// Findings page: the team's history of configs vs reproducibility and bandwidth (GET /api/v1/findings).
(() => {
  "use strict";
  const { API, $, el, getJSON, setRows, humanBytes, reproBadge } = window.detlab;
  const COLUMNS = 11;

  function row(g) {
    return el("tr", { title: Object.entries(g.env).map(([k, v]) => `${k}=${v}`).join(" ") || "library defaults" },
      el("td", { text: g.hardware }), el("td", { text: g.library }), el("td", { text: g.config }),
      el("td", { text: g.op }), el("td", { text: g.dtype }),
      el("td", {}, reproBadge(g.reproducible === g.cells)),
      el("td", { className: "num", text: `${g.reproducible}/${g.cells}` }),
      el("td", { className: "num", text: g.min_runs }),
      el("td", { className: "num", text: g.busbw_gbps_at_largest === null ? "—" : g.busbw_gbps_at_largest.toFixed(1) }),
      el("td", { className: "num", text: humanBytes(g.largest_bytes) }),
      el("td", { text: g.sources.join(", ") }));
  }

  function render(groups) {
    const needle = $("filter").value.trim().toLowerCase();
    const shown = groups.filter((g) => !needle ||
      [g.hardware, g.library, g.config, g.op, g.dtype].join(" ").toLowerCase().includes(needle));
    const empty = groups.length ? "Nothing matches the filter." : "No findings yet: run a collective or sweep job.";
    setRows($("findings"), shown.map(row), empty, COLUMNS);
    $("count").textContent = `${shown.length} of ${groups.length} rows`;
  }

  async function load() {
    const groups = (await getJSON(`${API}/findings`)).groups;
    $("filter").addEventListener("input", () => render(groups));
    render(groups);
  }

  load();
})();
