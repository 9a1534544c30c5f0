// bazaar dashboard: sign-in, live refresh from the catalog's change stream, action buttons,
// the live log tail. Plain script, no dependencies; served from the binary.
"use strict";
(function () {
  var READ_ONLY = "bazaar-read-only";

  function flash(text) {
    var el = document.getElementById("flash");
    if (!el) {
      el = document.createElement("p");
      el.id = "flash";
      el.className = "error";
      document.body.insertBefore(el, document.getElementById("live"));
    }
    el.textContent = text;
  }

  function signIn(token) {
    return fetch("/ui/session", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: token }),
      credentials: "same-origin",
    }).then(function (r) {
      if (r.ok) return true;
      return r.json().then(function (b) { flash(b.error || "sign-in refused"); return false; },
                           function () { flash("sign-in refused"); return false; });
    });
  }

  // A link /ui/...#token=... signs in at once; the fragment never reaches a server log.
  var m = /^#token=(.+)$/.exec(location.hash);
  if (m) {
    var token = decodeURIComponent(m[1]);
    history.replaceState(null, "", location.pathname + location.search);
    sessionStorage.removeItem(READ_ONLY);
    signIn(token).then(function (ok) {
      if (ok) location.replace(location.pathname === "/ui/signin" ? "/ui/" : location.href);
    });
    return;
  }

  var form = document.getElementById("signin-form");
  if (form) {
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      sessionStorage.removeItem(READ_ONLY);
      signIn(document.getElementById("token").value).then(function (ok) {
        if (ok) location.replace(location.pathname === "/ui/signin" ? "/ui/" : location.href);
      });
    });
    return;
  }

  function hideActions() {
    document.querySelectorAll(".actions").forEach(function (el) { el.remove(); });
    var banner = document.getElementById("readonly-banner");
    if (banner) banner.hidden = false;
  }
  function readOnly() { return sessionStorage.getItem(READ_ONLY) === "1"; }
  if (readOnly()) hideActions();

  // Capacity bars: their width comes as data-pct (the page's policy allows no inline style).
  function sizeBars() {
    document.querySelectorAll(".fill[data-pct]").forEach(function (el) {
      el.style.width = Math.min(100, Number(el.dataset.pct) || 0) + "%";
    });
  }
  sizeBars();

  // Swaps the page's <main> for a fresh copy, keeping the log tail as it is.
  var refreshing = null, again = false;
  function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = fetch(location.href, { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var live = document.getElementById("live");
        if (!next || !live) return;
        var log = document.getElementById("log");
        var newLog = next.querySelector("#log");
        if (log && newLog) newLog.replaceWith(log);
        live.replaceChildren.apply(live, Array.prototype.slice.call(next.childNodes));
        sizeBars();
        if (readOnly()) hideActions();
      })
      .catch(function () {})
      .then(function () {
        refreshing = null;
        if (again) { again = false; refresh(); }
      });
  }

  var scope = document.body.dataset.live || "none";
  function concerns(c) {
    if (c.kind === "all" || scope === "all") return true;
    if (scope.indexOf("app:") === 0) return c.kind === "host" || (c.kind === "machine" && c.app === scope.slice(4));
    if (scope.indexOf("machine:") === 0) return c.kind === "machine" && c.id === scope.slice(8);
    return false;
  }
  if (scope !== "none" && window.EventSource) {
    var timer = null;
    var source = new EventSource("/ui/events");
    source.addEventListener("change", function (e) {
      var c;
      try { c = JSON.parse(e.data); } catch (_) { return; }
      if (!concerns(c) || timer) return;
      timer = setTimeout(function () { timer = null; refresh(); }, 100);
    });
    window.addEventListener("pagehide", function () { source.close(); });
  }

  document.addEventListener("click", function (e) {
    var b = e.target.closest("button[data-action]");
    if (!b) return;
    var action = b.dataset.action;
    if (action === "destroy" && !confirm("Destroy machine " + b.dataset.machine + "?")) return;
    b.disabled = true;
    var url = "/ui/apps/" + encodeURIComponent(b.dataset.app) + "/machines/" +
      encodeURIComponent(b.dataset.machine) + "/actions/" + action;
    fetch(url, { method: "POST", headers: { "x-bazaar-ui": "1" }, credentials: "same-origin" })
      .then(function (r) {
        if (r.status === 403) {
          sessionStorage.setItem(READ_ONLY, "1");
          hideActions();
          flash("this token is read-only: actions are hidden");
          return;
        }
        if (!r.ok) {
          return r.json().then(function (body) { flash(action + ": " + (body.error || r.status)); },
                               function () { flash(action + ": HTTP " + r.status); });
        }
        if (action === "destroy" && document.body.dataset.live.indexOf("machine:") === 0) {
          location.assign("/ui/apps/" + encodeURIComponent(b.dataset.app));
          return;
        }
        refresh();
      })
      .catch(function (err) { flash(action + ": " + err); })
      .then(function () { b.disabled = false; });
  });

  // The live log tail: JSON lines ({"ts", "stream", "line"}) streamed by the API.
  var log = document.getElementById("log");
  if (log && log.dataset.log && window.ReadableStream) {
    fetch(log.dataset.log, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok || !r.body) return;
      var reader = r.body.getReader(), decoder = new TextDecoder(), rest = "";
      function pump() {
        return reader.read().then(function (chunk) {
          if (chunk.done) return;
          rest += decoder.decode(chunk.value, { stream: true });
          var lines = rest.split("\n");
          rest = lines.pop();
          var atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          lines.forEach(function (l) {
            if (!l) return;
            var text = l;
            try { var v = JSON.parse(l); text = (v.stream === "stderr" ? "! " : "") + v.line; } catch (_) {}
            log.appendChild(document.createTextNode(text + "\n"));
          });
          while (log.childNodes.length > 1000) log.removeChild(log.firstChild);
          if (atEnd) log.scrollTop = log.scrollHeight;
          return pump();
        });
      }
      return pump();
    }).catch(function () {});
  }
})();
