/* qoss console: keep a part of the page current from the service's events.
 *
 * An element with data-events="kind kind ..." (and hx-get / hx-trigger="qoss-event") is
 * refreshed by htmx when one of those events arrives on /ui/events, the console session's
 * Server-Sent Events (GET /v1/events with the session cookie: no token in any script).
 * The browser's EventSource reconnects by itself and resumes after the last event it saw.
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  function follow() {
    var targets = document.querySelectorAll("[data-events]");
    if (!targets.length || !window.EventSource || !window.htmx) {
      return;
    }
    var source = new EventSource("/ui/events");
    var kinds = {};
    Array.prototype.forEach.call(targets, function (element) {
      element.getAttribute("data-events").split(/\s+/).forEach(function (kind) {
        if (kind) {
          (kinds[kind] = kinds[kind] || []).push(element);
        }
      });
    });
    Object.keys(kinds).forEach(function (kind) {
      source.addEventListener(kind, function () {
        kinds[kind].forEach(function (element) {
          window.htmx.trigger(element, "qoss-event");
        });
      });
    });
    document.documentElement.setAttribute("data-live", "on");
    window.addEventListener("pagehide", function () {
      source.close();
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", follow);
  } else {
    follow();
  }
})();
