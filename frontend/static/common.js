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

  return {
    API, $, HttpError, el, getJSON, setRows, sleep, meta,
    humanBytes, pct, formatTime, configLabel, worldSizes, jobConfigName, jobConfigLabel, badge, reproBadge,
  };
})();
