// The console's only script: served from /static so the CSP needs no 'unsafe-inline'.
(function () {
  "use strict";

  // Times: the server writes each one as <time datetime="ISO UTC" title="... UTC">; show it in the
  // browser's own time zone, and say in the tooltip how long ago it was.
  var relative = window.Intl && Intl.RelativeTimeFormat ? new Intl.RelativeTimeFormat(undefined, {numeric: "auto"}) : null;
  var STEPS = [["year", 31536000], ["month", 2592000], ["day", 86400], ["hour", 3600], ["minute", 60], ["second", 1]];

  function ago(date) {
    if (!relative) return "";
    var seconds = (date.getTime() - Date.now()) / 1000;
    for (var i = 0; i < STEPS.length; i++) {
      if (Math.abs(seconds) >= STEPS[i][1] || STEPS[i][0] === "second") {
        return relative.format(Math.round(seconds / STEPS[i][1]), STEPS[i][0]);
      }
    }
    return "";
  }

  function localize(root) {
    var times = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var node = times[i];
      var date = new Date(node.getAttribute("datetime"));
      if (isNaN(date.getTime())) continue;
      if (!node.dataset.utc) node.dataset.utc = node.title || node.textContent;
      node.textContent = date.toLocaleString(undefined, {
        year: "numeric", month: "short", day: "numeric",
        hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
      });
      var when = ago(date);
      node.title = node.dataset.utc + (when ? " · " + when : "");
      node.dataset.local = "1";
    }
  }

  // Live refresh: reload the page's content every few seconds, unless someone is typing (or has
  // typed into a form, or a form was filled in again after an error). The flash message stays.
  function refresh() {
    var main = document.getElementById("content");
    var page = document.getElementById("page");
    var every = main ? Number(main.dataset.refresh || 0) * 1000 : 0;
    if (!every || !page) return;
    setInterval(function () {
      var active = document.activeElement;
      if (active && /INPUT|TEXTAREA|SELECT/.test(active.tagName)) return;
      if (document.querySelector("textarea:not(:placeholder-shown), input[type=text]:not(:placeholder-shown)")) return;
      fetch(location.href, {credentials: "same-origin"}).then(function (r) { return r.text(); }).then(function (html) {
        var next = new DOMParser().parseFromString(html, "text/html").getElementById("page");
        if (next) {
          page.innerHTML = next.innerHTML;
          localize(page);
        }
      }).catch(function () {});
    }, every);
  }

  function start() {
    localize(document);
    refresh();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
