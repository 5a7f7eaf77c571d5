// settled console: the project's own script, and the only one. The pages work without
// it; with it, the queue refreshes itself every 10 s (while the box is ticked and the
// tab is visible) by fetching the same page and swapping in its rows. No inline script,
// no eval: the Content-Security-Policy allows this file only.
(function () {
  "use strict";
  var section = document.getElementById("queue");
  var box = document.getElementById("live");
  var state = document.getElementById("live-state");
  if (!section || !box) { return; }
  var url = section.getAttribute("data-live");
  function refresh() {
    if (!box.checked || document.hidden) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var rows = doc.getElementById("queue-rows");
        var total = doc.querySelector("[data-testid=total]");
        if (rows) { document.getElementById("queue-rows").replaceWith(document.importNode(rows, true)); }
        var here = document.querySelector("[data-testid=total]");
        if (total && here) { here.textContent = total.textContent; }
        state.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function (e) { state.textContent = "not updated: " + e.message; });
  }
  window.setInterval(refresh, 10000);
})();
