/* qoss console: keep the parts of a page that show changing data current from the service's events.
 *
 * The events come from /ui/events, the console session's Server-Sent Events (GET /v1/events with
 * the session cookie: no token in any script). The browser's EventSource reconnects by itself and
 * resumes after the last event it saw. An element follows the events named in its
 * data-events="kind kind ..."; with data-subject="name" only those about that table or policy.
 * Elements are looked up when an event arrives, so one that htmx swapped in since follows too.
 *
 * - With hx-get and hx-trigger="qoss-event" (the tunnel list), htmx reads it again.
 * - Otherwise it is merged in place, 300 ms after the last such event: the page (or its
 *   data-source) is read again, and each child with an id is compared with its new version.
 *   A child whose text changed is replaced and marked: class "changed" and a short note for
 *   screen readers ("changed elsewhere"); the page's polite status region says which. A child the
 *   user is working in (an edit form open, a field, a request in flight: see busy) is left exactly
 *   as it is, typing and focus included. New children are added (marked too), gone ones removed.
 *   The ids in data-also (the revision in a heading) are given their new text.
 * A read answered 401 (the session ended) changes nothing: it is told as "qoss:session-ended"
 * (session.js shows the notice), and the events are followed again once "qoss:session-renewed".
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var DELAY = 300;
  var NOTE = "live-note";
  var BUSY = ".editing, .preview, .conflict";
  var FIELDS = "input:not([type=hidden]), textarea, select, .htmx-request";
  var timers = [];

  function words(node) {
    var copy = node.cloneNode(true);
    Array.prototype.forEach.call(copy.querySelectorAll("." + NOTE), function (note) {
      note.remove();
    });
    return copy.textContent.replace(/\s+/g, " ").trim();
  }

  /* A child as it would be rendered, without the marks this script or an edit's answer put on it (its
     classes, and the autofocus that moved the focus to its Edit once saved). */
  function shape(node) {
    var copy = node.cloneNode(true);
    copy.removeAttribute("class");
    Array.prototype.forEach.call(copy.querySelectorAll("[autofocus]"), function (control) {
      control.removeAttribute("autofocus");
    });
    Array.prototype.forEach.call(copy.querySelectorAll("." + NOTE), function (note) {
      note.remove();
    });
    return copy.outerHTML;
  }

  /* Whether the user is working in a child: an edit form, its preview or conflict, a field, a request. */
  function busy(node) {
    return node.matches(BUSY) || node.querySelector(FIELDS) !== null || node.matches(".htmx-request");
  }

  function status(message) {
    var region = document.getElementById("live-status");
    if (!region) {
      region = document.createElement("div");
      region.id = "live-status";
      region.className = "sr";
      region.setAttribute("role", "status");
      region.setAttribute("aria-live", "polite");
      (document.querySelector("main") || document.body).appendChild(region);
    }
    region.textContent = message;
  }

  function mark(node) {
    node.classList.add("changed");
    var note = document.createElement("span");
    note.className = "sr " + NOTE;
    note.textContent = " (changed elsewhere)";
    (node.firstElementChild || node).appendChild(note);
  }

  /* Focus the control at the same place in `fresh` as the focused one was in `old`. */
  function keepFocus(old, fresh) {
    var focused = document.activeElement;
    if (!focused || !old.contains(focused)) {
      return function () {};
    }
    var controls = Array.prototype.slice.call(old.querySelectorAll("a, button"));
    var at = controls.indexOf(focused);
    return function () {
      var again = fresh.querySelectorAll("a, button")[at];
      if (again) {
        again.focus();
      }
    };
  }

  function label(node) {
    var head = node.querySelector("th, h2");
    return words(head || node).slice(0, 60);
  }

  function merge(container, fresh) {
    var old = {};
    var changed = [];
    Array.prototype.forEach.call(container.children, function (child) {
      if (child.id) {
        old[child.id] = child;
      }
    });
    var previous = null;
    Array.prototype.slice.call(fresh.children).forEach(function (row) {
      if (!row.id) {
        return;
      }
      var here = old[row.id];
      var placed = row;
      delete old[row.id];
      if (here && (busy(here) || shape(here) === shape(row))) {
        placed = here;
      } else if (here) {
        var refocus = keepFocus(here, row);
        container.replaceChild(row, here);
        if (words(here) !== words(row)) {
          mark(row);
          changed.push(label(row));
        }
        refocus();
      } else {
        mark(row);
        changed.push(label(row));
      }
      var anchor = previous ? previous.nextElementSibling : container.firstElementChild;
      if (placed !== anchor) {
        container.insertBefore(placed, anchor);
      }
      if (placed === row && window.htmx) {
        window.htmx.process(row);
      }
      previous = placed;
    });
    Object.keys(old).forEach(function (id) {
      if (!busy(old[id])) {
        old[id].remove();
      }
    });
    return changed;
  }

  function refresh(container) {
    var source = container.getAttribute("data-source") || window.location.pathname + window.location.search;
    fetch(source, {headers: {"HX-Request": "true"}, credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (answer.status === 401) {  // signed out: session.js shows the notice, the page stays as it is
          return answer.text().then(function (notice) {
            document.dispatchEvent(new CustomEvent("qoss:session-ended", {detail: {html: notice}}));
            return null;
          });
        }
        return answer.ok ? answer.text() : null;
      })
      .then(function (html) {
        if (html === null || !document.body.contains(container)) {
          return;
        }
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.getElementById(container.id);
        if (!fresh) {
          return;
        }
        var changed = merge(container, fresh);
        (container.getAttribute("data-also") || "").split(/\s+/).forEach(function (id) {
          var now = id && document.getElementById(id);
          var then = id && page.getElementById(id);
          if (now && then && now.textContent !== then.textContent) {
            now.textContent = then.textContent;
          }
        });
        if (changed.length) {
          status("Changed elsewhere: " + changed.join(", ") + ".");
        }
      })
      .catch(function () {
        return null;  // the next event tries again
      });
  }

  function later(container) {
    for (var i = 0; i < timers.length; i++) {
      if (timers[i][0] === container) {
        window.clearTimeout(timers[i][1]);
        timers.splice(i, 1);
        break;
      }
    }
    var timer = window.setTimeout(function () {
      timers = timers.filter(function (t) {
        return t[0] !== container;
      });
      refresh(container);
    }, DELAY);
    timers.push([container, timer]);
  }

  function follows(element, kind, subject) {
    var kinds = element.getAttribute("data-events").split(/\s+/);
    var only = element.getAttribute("data-subject");
    return kinds.indexOf(kind) >= 0 && (!only || only === subject);
  }

  function follow() {
    var first = document.querySelectorAll("[data-events]");
    if (!first.length || !window.EventSource) {
      return;
    }
    var kinds = {};
    Array.prototype.forEach.call(first, function (element) {
      element.getAttribute("data-events").split(/\s+/).forEach(function (kind) {
        if (kind) {
          kinds[kind] = true;
        }
      });
    });
    var source = null;
    function connect() {
      source = new EventSource("/ui/events");
      listen(source, kinds);
    }
    connect();
    document.documentElement.setAttribute("data-live", "on");
    // a stream refused once the session ended stays closed: open it again once signed in again (session.js)
    document.addEventListener("qoss:session-renewed", function () {
      if (source.readyState === EventSource.CLOSED) {
        connect();
      }
    });
    window.addEventListener("pagehide", function () {
      source.close();
    });
  }

  function listen(source, kinds) {
    Object.keys(kinds).forEach(function (kind) {
      source.addEventListener(kind, function (event) {
        var subject = null;
        try {
          subject = JSON.parse(event.data).subject;
        } catch (ignored) {
          subject = null;
        }
        Array.prototype.forEach.call(document.querySelectorAll("[data-events]"), function (element) {
          if (!follows(element, kind, subject)) {
            return;
          }
          if (element.hasAttribute("hx-get")) {
            if (window.htmx) {
              window.htmx.trigger(element, "qoss-event");
            }
          } else if (element.id) {
            later(element);
          }
        });
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", follow);
  } else {
    follow();
  }
})();
