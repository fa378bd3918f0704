// fleetkeeper dashboard: refreshes the page's fragments in place. Served as a file (the
// Content-Security-Policy allows no inline script); the pages work without it, as of their load.
"use strict";
(function () {
  const body = document.body;
  const seconds = Math.max(1, Number(body.dataset.refreshSeconds || "5"));
  const stamp = document.getElementById("refreshed");
  const pause = document.getElementById("pause");
  let paused = false;

  function say(words) {
    if (stamp) stamp.textContent = words;
  }

  if (pause) {
    pause.hidden = false;
    pause.addEventListener("click", function () {
      paused = !paused;
      pause.textContent = paused ? "resume refresh" : "pause refresh";
      pause.setAttribute("aria-pressed", String(paused));
    });
  }

  async function refresh(element) {
    const url = element.dataset.fragment;
    if (!url) return;
    // Someone choosing from a list inside it: replacing it would take the list away.
    const focused = document.activeElement;
    if (focused && element.contains(focused) && focused.tagName === "SELECT") return;
    try {
      const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (answer.status === 401) {
        say("logged out: open a new login link");
        return;
      }
      if (!answer.ok) {
        say("refresh failed (HTTP " + answer.status + ")");
        return;
      }
      const text = await answer.text();
      const atBottom = element.scrollTop + element.clientHeight >= element.scrollHeight - 4;
      // The server escaped every value it put in this HTML (fleetkeeper.dashboard.render).
      element.innerHTML = text;
      if (element.tagName === "PRE" && atBottom) element.scrollTop = element.scrollHeight;
      say("refreshed " + new Date().toLocaleTimeString());
    } catch (error) {
      say("refresh failed: " + error);
    }
  }

  function tick() {
    if (paused || document.hidden) return;
    document.querySelectorAll("[data-fragment]").forEach(refresh);
  }

  const filter = document.getElementById("filter");
  const services = document.getElementById("services");
  if (filter && services) {
    let timer = 0;
    filter.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        const url = new URL(services.dataset.fragment, location.origin);
        if (filter.value) url.searchParams.set("q", filter.value);
        else url.searchParams.delete("q");
        services.dataset.fragment = url.pathname + url.search;
        const shown = new URL(location.href);
        shown.search = url.search;
        history.replaceState(null, "", shown);
        refresh(services);
      }, 200);
    });
  }

  const pick = document.getElementById("log-replica");
  const log = document.getElementById("log");
  if (pick && log) {
    pick.addEventListener("change", function () {
      log.dataset.fragment = pick.dataset.fragmentBase + "?replica=" + encodeURIComponent(pick.value);
      refresh(log);
    });
  }
  if (log) refresh(log);
  setInterval(tick, seconds * 1000);
})();
