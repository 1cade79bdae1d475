// Helpers shared by the pages: element building (text only, never HTML), JSON fetching, table rows,
// the formats every page writes the same way, and the server's lists (GET /api/v1/meta).
window.detlab = (() => {
  "use strict";

  const API = "/api/v1";

  const $ = (id) => document.getElementById(id);

  class HttpError extends Error {
    constructor(url, status) {
      super(`${url}: HTTP ${status}`);
      this.status = status;
    }
  }

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
    if (!response.ok) throw new HttpError(url, response.status);
    return response.json();
  }

  function setRows(table, rows, emptyText, columns) {
    const tbody = table.tBodies[0];
    if (rows.length === 0) {
      tbody.replaceChildren(el("tr", { className: "empty" }, el("td", { colspan: String(columns), text: emptyText })));
    } else {
      tbody.replaceChildren(...rows);
    }
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // Ops, dtypes and limits as this server has them; fetched once per page, again after a failure.
  let metaRequest = null;
  function meta() {
    metaRequest ??= getJSON(`${API}/meta`).catch((err) => {
      metaRequest = null;
      throw err;
    });
    return metaRequest;
  }

  // ---- formats -------------------------------------------------------------------------------

  function humanBytes(n) {
    for (const [unit, scale] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
      if (n >= scale) {
        const value = n / scale;
        return `${Number.isInteger(value) ? value : Number(value.toPrecision(3))} ${unit}`;
      }
    }
    return `${n} B`;
  }

  const pct = (x, digits = 1) => `${(x * 100).toFixed(digits)}%`;

  function formatTime(iso) {
    if (!iso) return "";
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
  }

  // Config 0 is the baseline A, config 1 is B; beyond two, the index itself.
  function sideLetter(index) {
    return index === 0 ? "A" : index === 1 ? "B" : String(index);
  }

  // A sweep's cells have no baseline, so they go by number rather than A/B.
  function configLabel(kind, index, name) {
    const prefix = kind === "sweep" ? String(index) : sideLetter(index);
    return `${prefix}: ${name ?? "?"}`;
  }

  // World size of each config of a job: its own if it sets one, else the job's.
  function worldSizes(job) {
    return (job.configs || []).map((c) => c?.body?.world_size ?? job.world_size);
  }

  // Config `index`'s name, with "@W<n>" when the job's configs run on different world sizes
  // ("four-ranks @W4"): the same preset on 2 and 4 ranks would otherwise read as one config.
  function jobConfigName(job, index) {
    const name = (job.configs || [])[index]?.name ?? "?";
    const sizes = worldSizes(job);
    return new Set(sizes).size > 1 ? `${name} @W${sizes[index]}` : name;
  }

  // "B: four-ranks @W4": side (or cell number) and name, as the job page writes it everywhere.
  const jobConfigLabel = (job, index) => configLabel(job.kind, index, jobConfigName(job, index));

  function badge(value, fallback) {
    if (!value) return el("span", { className: "muted", text: fallback || "—" });
    return el("span", { className: `badge badge-${value}`, text: value });
  }

  function reproBadge(ok) {
    return el("span", {
      className: `badge ${ok ? "badge-reproducible" : "badge-not-reproducible"}`,
      text: ok ? "reproducible" : "not reproducible",
    });
  }

  // A list row's configs ("default @W2", "four @W4"), labelled as the job page does: @W<n> when they differ.
  function summaryConfigNames(job) {
    const names = job.config_names || [];
    const sizes = job.world_sizes || [];
    const differ = new Set(sizes).size > 1;
    return names.map((name, i) => (differ && sizes[i] !== undefined ? `${name} @W${sizes[i]}` : name));
  }

  // A list row's verdict: every kind has one once compared; an unfinished job's is pending.
  function listVerdict(job) {
    const pending = job.status === "queued" || job.status === "running";
    return badge(job.verdict, pending ? "pending" : "—");
  }

  // Tags as chips; `onPick(tag)` makes each one a button (the jobs list filters on it).
  function tagChips(tags, onPick) {
    return el("span", { className: "tags" }, ...(tags || []).map((tag) => {
      if (!onPick) return el("span", { className: "tag", text: tag });
      const chip = el("button", { type: "button", className: "tag", text: tag, title: `only jobs tagged ${tag}` });
      chip.addEventListener("click", () => onPick(tag));
      return chip;
    }));
  }

  // "h200, nccl-2.28 paper" -> ["h200", "nccl-2.28", "paper"]: commas or spaces separate tags.
  const parseTags = (text) => [...new Set(String(text || "").split(/[\s,]+/).filter(Boolean))];

  // FastAPI sends detail as a string, or as a list of {loc, msg}; "body" in loc is noise to a user.
  function formatDetail(detail) {
    if (typeof detail === "string") return [detail];
    if (Array.isArray(detail)) {
      return detail.map((item) => {
        if (item && typeof item === "object") {
          const loc = (item.loc || []).filter((part) => part !== "body" && part !== "query").join(".");
          return loc ? `${loc}: ${item.msg}` : String(item.msg);
        }
        return String(item);
      });
    }
    if (detail && typeof detail === "object") return [JSON.stringify(detail)];
    return ["The server rejected the request."];
  }

  // A request with a JSON body (POST, PATCH): {ok, status, body, lines}, `lines` saying what was wrong.
  async function sendJSON(method, url, payload) {
    const response = await fetch(url, {
      method,
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: payload === undefined ? undefined : JSON.stringify(payload),
    });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    const lines = response.ok ? [] : body && body.detail !== undefined
      ? formatDetail(body.detail) : [`The server answered HTTP ${response.status}.`];
    return { ok: response.ok, status: response.status, body, lines };
  }

  // ---- the why-report (GET .../why): a checklist in the order to debug a divergence ------------------

  const WHY_MARKS = { pass: "✓", fail: "✗", "not-checked": "?", "not-applicable": "–" };
  const WHY_WORDS = { pass: "pass", fail: "fail", "not-checked": "not checked", "not-applicable": "not applicable" };

  function whyDetails(item) {
    const shownCount = item.details.length;
    const more = item.differences > shownCount ? `, the first ${shownCount} shown` : "";
    const head = el("tr", {}, ...["", "where", ...item.columns].map((text) => el("th", { text })));
    const rows = item.details.map((d) => el("tr", {}, el("td", {}, el("code", { text: d.key ?? "" })),
      el("td", { text: d.where }), el("td", { text: d.a }), el("td", { text: d.b })));
    return el("details", { className: "why-details" },
      el("summary", { text: `${item.differences} ${item.differences === 1 ? "difference" : "differences"}${more}` }),
      el("div", { className: "scroll" }, el("table", { className: "data" }, el("thead", {}, head), el("tbody", {}, ...rows))));
  }

  function whyItem(item) {
    const links = [];
    for (const link of item.evidence) {
      if (links.length) links.push(" · ");
      links.push(el("a", { href: link.href, className: "why-link", text: link.text }));
    }
    // One line per item (its title and what was found, cut to the width); a failing item comes open, the
    // others open on a click: the answer is above the checklist, the checklist says why.
    const fold = el("details", { className: "why-fold" },
      el("summary", { className: "why-head" },
        el("span", { className: "why-mark", "aria-hidden": "true", text: WHY_MARKS[item.status] || "?" }),
        el("strong", { text: item.title }),
        el("span", { className: "why-line muted", text: item.found }),
        el("span", { className: "why-status", text: WHY_WORDS[item.status] || item.status })),
      el("div", { className: "why-found", text: item.found }),
      links.length ? el("div", { className: "why-evidence muted small" }, "evidence: ", ...links) : null,
      item.details.length ? whyDetails(item) : null);
    fold.open = item.status === "fail";
    return el("li", { className: `why-item why-${item.status}`, "data-key": item.key, "data-status": item.status }, fold);
  }

  // The checklist into `container`: a note when the pair did not diverge, then one item per step.
  function renderWhy(container, report) {
    container.replaceChildren(
      report.note ? el("p", { className: "note", text: report.note }) : "",
      el("ol", { className: "why-list" }, ...report.items.map(whyItem)));
  }

  return {
    API, $, HttpError, el, getJSON, sendJSON, formatDetail, setRows, sleep, meta,
    humanBytes, pct, formatTime, configLabel, worldSizes, jobConfigName, jobConfigLabel, badge, reproBadge,
    summaryConfigNames, listVerdict, tagChips, parseTags, renderWhy,
  };
})();

// Auth mode `local`: the signed-in user and a logout button in every page's top bar.
(async () => {
  "use strict";
  const { API, el, getJSON } = window.detlab;
  let me;
  try {
    me = await getJSON(`${API}/auth/me`);
  } catch (_) {
    return;
  }
  if (me.auth_mode !== "local" || !me.name) return;
  const button = el("button", { id: "logout", type: "button", className: "logout" }, "Log out");
  button.addEventListener("click", async () => {
    await fetch(`${API}/auth/logout`, { method: "POST" });
    window.location.assign("/login");
  });
  document.querySelector(".topbar .container")?.append(el("span", { id: "whoami", className: "whoami", text: me.name }), button);
})();
