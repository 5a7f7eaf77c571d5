// settled console: the project's own script, and the only one. The pages work without
// it; with it, every time the server wrote in UTC also shows the viewer's own local time
// (the browser's zone: the server never guesses it), with a toggle kept in this browser,
// and the queue refreshes itself every 10 s (while the box is ticked and the tab is
// visible) by fetching the same page and swapping in its rows. No inline script, no
// eval: the Content-Security-Policy allows this file only.
(function () {
  "use strict";
  var KEY = "settled-local-times";
  var toggle = document.getElementById("times");
  function shown() {
    try { return window.localStorage.getItem(KEY) !== "off"; } catch (e) { return true; }
  }
  function local(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) { return ""; }
    return new Intl.DateTimeFormat(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit",
      minute: "2-digit", second: "2-digit", timeZoneName: "short"
    }).format(d);
  }
  function times(root) {
    var on = shown();
    root.querySelectorAll("time[datetime]").forEach(function (t) {
      var at = local(t.getAttribute("datetime"));
      if (!at) { return; }
      if (!t.hasAttribute("data-utc")) { t.setAttribute("data-utc", t.getAttribute("title") || ""); }
      t.setAttribute("title", t.getAttribute("data-utc") + (on ? " · your time: " + at : ""));
      if (!t.classList.contains("abs")) { return; }
      var next = t.nextElementSibling;
      if (!next || !next.classList.contains("local")) {
        next = document.createElement("span");
        next.className = "local";
        t.after(next);
      }
      next.textContent = " · your time " + at;
      next.hidden = !on;
    });
    if (toggle) {
      toggle.hidden = false;
      toggle.setAttribute("aria-pressed", on ? "true" : "false");
      toggle.textContent = on ? "Local times: shown" : "Local times: hidden";
    }
  }
  if (toggle) {
    toggle.addEventListener("click", function () {
      try { window.localStorage.setItem(KEY, shown() ? "off" : "on"); } catch (e) { /* private mode */ }
      times(document);
    });
  }
  times(document);
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
        if (rows) {
          // the rows a person ticked stay ticked across a refresh
          var ticked = {};
          document.querySelectorAll("#queue-rows input[name=pick]:checked").forEach(function (b) {
            ticked[b.value] = true;
          });
          var fresh = document.importNode(rows, true);
          fresh.querySelectorAll("input[name=pick]").forEach(function (b) {
            b.checked = ticked[b.value] === true;
          });
          document.getElementById("queue-rows").replaceWith(fresh);
          times(fresh);
        }
        var here = document.querySelector("[data-testid=total]");
        if (total && here) { here.textContent = total.textContent; }
        state.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function (e) { state.textContent = "not updated: " + e.message; });
  }
  window.setInterval(refresh, 10000);
})();
