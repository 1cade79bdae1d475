// The compare page: find runs (GET /api/v1/runs), pick A and B, show GET /api/v1/compare?a=&b=.
(() => {
  "use strict";
  const { API, $, el, getJSON, setRows, formatTime, badge, tagChips, renderWhy } = window.detlab;

  const params = new URLSearchParams(window.location.search);
  const picked = { a: Number(params.get("a")) || null, b: Number(params.get("b")) || null };

  function showPicked() {
    const said = ["a", "b"].map((side) => `${side.toUpperCase()}: ${picked[side] ? `run ${picked[side]}` : "—"}`);
    $("picked").textContent = said.join(", ");
    $("go").disabled = !(picked.a && picked.b && picked.a !== picked.b);
  }

  function pickButton(run, side) {
    const button = el("button", { type: "button", className: "pick", "data-side": side, "data-run": String(run.id),
      text: `as ${side.toUpperCase()}` });
    button.addEventListener("click", () => {
      picked[side] = run.id;
      showPicked();
    });
    return button;
  }

  async function search() {
    const query = new URLSearchParams({ limit: "50" });
    if ($("q").value.trim()) query.set("q", $("q").value.trim());
    if ($("tag").value.trim()) query.set("tag", $("tag").value.trim());
    try {
      const found = await getJSON(`${API}/runs?${query}`);
      $("count").textContent = `${found.total} run(s)${found.total > found.items.length ? `, newest ${found.items.length} shown` : ""}`;
      setRows($("runs"), found.items.map((run) => el("tr", { "data-run": String(run.id) },
        el("td", { className: "num", text: String(run.id) }),
        el("td", {}, el("a", { href: `/jobs/${run.job_id}`, text: run.name })),
        el("td", { text: run.workload }), el("td", { text: run.config }), el("td", { text: run.kind }),
        el("td", {}, tagChips(run.tags)), el("td", { className: "num", text: String(run.world_size) }),
        el("td", {}, badge(run.status)), el("td", { text: formatTime(run.created_at) }),
        el("td", {}, pickButton(run, "a"), " ", pickButton(run, "b")))), "no run matches", 10);
    } catch (err) {
      $("count").textContent = `could not list runs: ${err.message}`;
    }
  }

  function fact(label, value) {
    return [el("dt", { text: label }), el("dd", { text: value })];
  }

  function showBanner(result) {
    const banner = $("banner");
    banner.className = `banner banner-${result.verdict}`;
    const facts = [];
    if (result.first_divergent_step !== null && result.first_divergent_step !== undefined) {
      facts.push(...fact("first divergent step", String(result.first_divergent_step)));
      const names = result.first_divergent_tensors;
      facts.push(...fact("tensors", names.slice(0, 5).join(", ") + (names.length > 5 ? ` and ${names.length - 5} more` : "")));
      facts.push(...fact("ranks", result.ranks.join(", ") || "—"));
    }
    facts.push(...fact("steps compared", String(result.steps_compared)));
    facts.push(...fact("steps differing", String(result.steps_differing)));
    banner.replaceChildren(
      el("div", { className: "banner-head" }, badge(result.verdict), el("span", { text: result.reason || "" })),
      el("dl", { className: "banner-facts" }, ...facts),
      ...(result.collectives && result.collectives.text
        ? [el("p", { id: "collectives", className: "note", text: result.collectives.text })] : []),
      ...result.missing.map((m) => el("p", { className: "muted", text: `missing: ${m}` })));
  }

  async function showDrift(result) {
    const drift = result.drift;
    const target = $("drift-chart");
    $("drift-verdict").textContent = !drift ? "no drift estimate"
      : drift.available ? `‖A−B‖/‖A‖, estimated: ${drift.verdict}` : `No drift estimate: ${drift.reason}`;
    target.hidden = !(drift && drift.available && window.Plotly);
    if (target.hidden) return;
    try {
      const figure = await getJSON(`${API}/compare/drift/figure?a=${picked.a}&b=${picked.b}`);
      await window.Plotly.react(target, figure.data || [], figure.layout || {}, { displaylogo: false, responsive: true });
    } catch (err) {
      target.textContent = `The drift chart could not be loaded: ${err.message}`;
    }
  }

  async function compare() {
    if (!(picked.a && picked.b)) return;
    const card = $("result-card");
    card.hidden = false;
    $("result-title").textContent = `Run ${picked.a} (A) vs run ${picked.b} (B)`;
    try {
      const result = await getJSON(`${API}/compare?a=${picked.a}&b=${picked.b}`);
      showBanner(result);
      setRows($("pair"), result.runs.map((run, i) => el("tr", {},
        el("th", { text: i === 0 ? "A" : "B" }), el("td", { className: "num", text: String(run.id) }),
        el("td", {}, el("a", { href: `/jobs/${run.job_id}`, text: `#${run.job_id}` })), el("td", { text: run.name }),
        el("td", { text: run.workload }), el("td", { text: run.config }),
        el("td", { className: "num", text: String(run.world_size) }), el("td", {}, badge(run.status)))), "", 8);
      setRows($("environment"), result.environment.map((f) => el("tr", { className: f.differs ? "differs" : "" },
        el("td", { text: f.key }), el("td", { text: f.a ?? "—" }), el("td", { text: f.b ?? "—" }))),
      "no environment recorded", 3);
      setRows($("config-diff"), result.config_diff.map((d) => el("tr", {},
        el("td", { text: d.key }), el("td", { text: JSON.stringify(d.a) }), el("td", { text: JSON.stringify(d.b) }))),
      "the same config", 3);
      await showDrift(result);
    } catch (err) {
      $("banner").className = "banner";
      $("banner").replaceChildren(el("p", { text: `could not compare: ${err.message}` }));
      return;
    }
    $("why-block").hidden = false;
    try {
      renderWhy($("why"), await getJSON(`${API}/compare/why?a=${picked.a}&b=${picked.b}`));
    } catch (err) {
      $("why").replaceChildren(el("p", { className: "muted", text: `The checklist could not be loaded: ${err.message}` }));
    }
  }

  $("go").addEventListener("click", () => {
    window.history.replaceState(null, "", `/compare?a=${picked.a}&b=${picked.b}`);
    compare();
  });
  let timer = null;
  for (const id of ["q", "tag"]) {
    $(id).addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(search, 250);
    });
  }
  $("search").addEventListener("submit", (event) => event.preventDefault());
  showPicked();
  search();
  compare();
})();
