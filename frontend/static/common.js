// Helpers shared by the pages: element building (text only, never HTML), JSON fetching, table rows.
window.detlab = (() => {
  "use strict";

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

  return { $, HttpError, el, getJSON, setRows };
})();
