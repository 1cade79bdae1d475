// The login page: posts the name and password as JSON, then returns to the page that sent the user here.
(() => {
  "use strict";

  const $ = (id) => document.getElementById(id);

  // Only a path on this server: `next=//evil.example`, `https://…`, or `/<tab>/evil.example` (the URL parser
  // drops tabs and newlines and reads a backslash as a slash) would send the user elsewhere. So the browser's
  // own parser resolves it, and anything that does not land on this origin goes to "/".
  function nextPath() {
    const next = new URLSearchParams(window.location.search).get("next") || "/";
    if (!next.startsWith("/")) return "/";
    let url;
    try {
      url = new URL(next, window.location.origin);
    } catch (_) {
      return "/";
    }
    if (url.origin !== window.location.origin || url.pathname.startsWith("//")) return "/";
    return url.pathname + url.search + url.hash;
  }

  function showError(text) {
    $("error").textContent = text;
    $("error").hidden = !text;
  }

  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    showError("");
    $("submit").disabled = true;
    try {
      const response = await fetch("/api/v1/auth/login", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ name: $("name").value, password: $("password").value }),
      });
      if (response.ok) {
        window.location.assign(nextPath());
        return;
      }
      let detail = `The server answered HTTP ${response.status}.`;
      try {
        const body = await response.json();
        if (typeof body.detail === "string") detail = body.detail;
      } catch (_) {
        // not JSON: keep the status line
      }
      showError(detail);
    } catch (err) {
      showError(`Cannot reach the server: ${err.message}`);
    } finally {
      $("submit").disabled = false;
    }
  });
})();
