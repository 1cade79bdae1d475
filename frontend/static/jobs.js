// Jobs list: search, filters, sortable columns and pages, all done by the server (GET /api/v1/jobs); the
// page's address holds the same query, so a filtered list can be shared and reloaded.
// All data goes into the page through textContent (never innerHTML).
"use strict";

(function () {
  const REFRESH_MS = 10000;
  const TYPING_MS = 250;
  const SORTS_ASCENDING = new Set(["workload", "kind", "status", "verdict"]); // first click on these: A → Z
  const DEFAULT = { sort: "created", order: "desc", limit: "20", offset: "0" };
  const VERDICT_NONE = "none";
  // Filter inputs and the query parameter each sets (from/to are dates here, times in the API).
  const FIELDS = { q: "q", kind: "f-kind", status: "f-status", verdict: "f-verdict", workload: "f-workload",
    config: "f-config", tag: "f-tag", submitter: "f-submitter", from: "f-from", to: "f-to" };

  const { API, $, el, getJSON, formatDetail, formatTime, badge, listVerdict, summaryConfigNames, tagChips, meta } =
    window.detlab;

  let state = readAddress();
  let request = 0; // the latest request: an older answer that arrives late is dropped
  let shownTotal = 0;

  function readAddress() {
    const params = new URLSearchParams(window.location.search);
    const out = { ...DEFAULT };
    for (const key of [...Object.keys(FIELDS), ...Object.keys(DEFAULT)]) {
      if (params.get(key)) out[key] = params.get(key);
    }
    return out;
  }

  function writeAddress() {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(state)) {
      if (value && value !== DEFAULT[key]) params.set(key, value);
    }
    const query = params.toString();
    window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
  }

  // A date picked here is a local day; the API takes times (UTC when no offset is given).
  function dayStart(date, plusDays = 0) {
    const day = new Date(`${date}T00:00:00`);
    if (Number.isNaN(day.getTime())) return null;
    day.setDate(day.getDate() + plusDays);
    return day.toISOString();
  }

  function apiQuery() {
    const params = new URLSearchParams();
    for (const key of ["q", "kind", "status", "verdict", "workload", "config", "tag", "submitter"]) {
      const value = (state[key] || "").trim();
      if (value) params.set(key, value);
    }
    if (state.from && dayStart(state.from)) params.set("created_after", dayStart(state.from));
    if (state.to && dayStart(state.to, 1)) params.set("created_before", dayStart(state.to, 1)); // the whole day
    for (const key of ["sort", "order", "limit", "offset"]) params.set(key, state[key]);
    return params.toString();
  }

  function showError(lines) {
    const box = $("list-error");
    box.textContent = lines.join(" ");
    box.hidden = lines.length === 0;
  }

  // ---- the table -------------------------------------------------------------------------------

  function filterOn(key, value) {
    state = { ...state, [key]: value, offset: "0" };
    $(FIELDS[key]).value = value;
    load();
  }

  function jobRow(job) {
    const href = `/jobs/${encodeURIComponent(job.id)}`;
    const names = summaryConfigNames(job);
    const configs = names.length > 3 ? `${names.length} configs (${names[0]}, ${names[1]}, …)` : names.join(" vs ");
    return el(
      "tr",
      {},
      el("td", {}, el("a", { href, text: `#${job.id}` })),
      el("td", { text: job.kind }),
      // A recording is known by the name its script gave it (detlab.Recorder(name=...)), its workload is "sdk".
      el("td", {}, job.name ? el("a", { href, className: "run-name", text: job.name }) : job.workload,
        job.name ? el("span", { className: "muted small", text: ` ${job.workload}` }) : ""),
      el("td", {}, el("a", { href, text: configs || "—" })),
      el("td", {}, tagChips(job.tags, (tag) => filterOn("tag", tag))),
      el("td", {}, badge(job.status)),
      el("td", {}, listVerdict(job)),
      el("td", { className: job.submitter ? "" : "muted", text: job.submitter || "—" }),
      el("td", { className: "muted", text: formatTime(job.created_at) })
    );
  }

  function renderSortHeads() {
    for (const th of document.querySelectorAll("#jobs-list th[data-sort]")) {
      if (th.dataset.sort === state.sort) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  function renderPage(page) {
    const items = page.items || [];
    const tbody = $("jobs-list").tBodies[0];
    const filtered = Object.keys(FIELDS).some((key) => state[key]);
    if (items.length === 0) {
      const text = page.total > 0 ? "No jobs on this page." : filtered ? "No job matches these filters." : "No jobs yet.";
      tbody.replaceChildren(el("tr", { className: "empty" }, el("td", { colspan: "9", text })));
    } else {
      tbody.replaceChildren(...items.map(jobRow));
    }
    shownTotal = page.total;
    const offset = Number(state.offset);
    $("page-info").textContent = items.length
      ? `${offset + 1}–${offset + items.length} of ${page.total} ${page.total === 1 ? "job" : "jobs"}`
      : `${page.total} ${page.total === 1 ? "job" : "jobs"}`;
    $("prev-page").disabled = offset === 0;
    $("next-page").disabled = offset + items.length >= page.total;
    renderSortHeads();
  }

  async function load() {
    writeAddress();
    const mine = ++request;
    let response, body;
    try {
      response = await fetch(`${API}/jobs?${apiQuery()}`, { headers: { Accept: "application/json" } });
      body = await response.json().catch(() => null);
    } catch (err) {
      if (mine === request) showError([`Could not load jobs: ${err.message}`]);
      return;
    }
    if (mine !== request) return;
    if (!response.ok) {
      // A 422 says which filter the server refused (a tag with a space, a search too long).
      showError(body && body.detail !== undefined ? formatDetail(body.detail) : [`Could not load jobs: HTTP ${response.status}`]);
      return;
    }
    showError([]);
    renderPage(body);
  }

  // ---- controls --------------------------------------------------------------------------------

  // The server's choices, and the address's one if the server no longer offers it.
  function fillSelect(id, values, label = (v) => v) {
    const chosen = state[Object.keys(FIELDS).find((key) => FIELDS[key] === id)];
    const all = chosen && !values.includes(chosen) ? [...values, chosen] : values;
    $(id).append(...all.map((value) => el("option", { value, text: label(value) })));
  }

  // A select applies at once; a text field once typing pauses (or on Enter / leaving it).
  function onFilter(key, delay) {
    const input = $(FIELDS[key]);
    let typing = null;
    const apply = () => {
      clearTimeout(typing);
      if ((state[key] || "") === input.value) return;
      state = { ...state, [key]: input.value, offset: "0" };
      load();
    };
    if (delay) {
      input.addEventListener("input", () => {
        clearTimeout(typing);
        typing = setTimeout(apply, delay);
      });
    }
    input.addEventListener("change", apply);
  }

  function sortBy(column) {
    const order = state.sort === column ? (state.order === "asc" ? "desc" : "asc")
      : SORTS_ASCENDING.has(column) ? "asc" : "desc";
    state = { ...state, sort: column, order, offset: "0" };
    load();
  }

  function turnPage(step) {
    const limit = Number(state.limit);
    const offset = Math.max(0, Math.min(Number(state.offset) + step * limit, Math.max(0, shownTotal - 1)));
    state = { ...state, offset: String(offset) };
    load();
  }

  async function init() {
    for (const [key, id] of Object.entries(FIELDS)) {
      onFilter(key, ["q", "config", "tag", "submitter"].includes(key) ? TYPING_MS : 0);
      $(id).value = state[key] || "";
    }
    $("filters").addEventListener("submit", (event) => event.preventDefault());
    $("clear-filters").addEventListener("click", () => {
      for (const [key, id] of Object.entries(FIELDS)) {
        $(id).value = "";
        state[key] = undefined;
      }
      state.offset = "0";
      load();
    });
    for (const th of document.querySelectorAll("#jobs-list th[data-sort]")) {
      th.querySelector("button").addEventListener("click", () => sortBy(th.dataset.sort));
    }
    $("prev-page").addEventListener("click", () => turnPage(-1));
    $("next-page").addEventListener("click", () => turnPage(1));
    $("page-size").value = state.limit;
    $("page-size").addEventListener("change", () => {
      state = { ...state, limit: $("page-size").value, offset: "0" };
      load();
    });
    load();
    setInterval(() => {
      if (document.visibilityState === "visible") load();
    }, REFRESH_MS);

    // The choices come from the server: its kinds, statuses and verdicts, its workers' workloads, presets.
    try {
      const [lists, workloads, presets] = await Promise.all([
        meta(), getJSON(`${API}/workloads`), getJSON(`${API}/presets`),
      ]);
      fillSelect("f-kind", lists.job_kinds);
      fillSelect("f-status", lists.job_statuses);
      fillSelect("f-verdict", [...lists.verdicts, VERDICT_NONE], (v) => (v === VERDICT_NONE ? "no verdict (yet)" : v));
      fillSelect("f-workload", [...workloads.map((w) => w.name), "collective"]);
      $("preset-names").replaceChildren(...presets.map((p) => el("option", { value: p.name })));
    } catch (err) {
      showError([`Could not load the filter choices: ${err.message}`]);
    }
    for (const key of ["kind", "status", "verdict", "workload"]) $(FIELDS[key]).value = state[key] || "";
  }

  init();
})();
