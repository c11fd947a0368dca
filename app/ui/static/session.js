/* qoss console: a session that ends while the admin is working loses nothing.
 *
 * When the console session was revoked or expired, htmx's request (or live.js's read) gets 401
 * and nothing on the page is swapped (HX-Reswap: none; base.html's htmx config swaps no 401).
 * The answer is a notice (role=alert, id "session-ended"): this script puts it at the top of
 * the page, where it stays in sight. It links to the sign-in page in a new tab; the open edit
 * form keeps what was typed.
 *
 * Once the notice is up, the next htmx request waits (htmx:confirm) until the session's CSRF
 * token is read again from /ui/session: signed in again (the same browser, so the new session's
 * cookie), the page's forms and htmx's X-CSRF-Token header get the new session's token, the
 * notice goes, the request is sent and "qoss:session-renewed" is told (live.js follows the events
 * again); still signed out, the notice is shown again and nothing is sent.
 * live.js tells its 401 answers as "qoss:session-ended" (detail.html: the notice).
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var NOTICE = "session-ended";
  var ended = false;

  /* Show the notice in `html` (the 401 answer); false if the answer holds none. */
  function show(html) {
    var holder = document.createElement("template");
    holder.innerHTML = html || "";
    var notice = holder.content.querySelector("#" + NOTICE);
    if (!notice) {
      return false;
    }
    ended = true;
    var shown = document.getElementById(NOTICE);
    if (shown) {
      shown.replaceWith(notice);  // a new alert: read out again
    } else {
      var main = document.querySelector("main") || document.body;
      main.insertBefore(notice, main.firstChild);
    }
    return true;
  }

  /* The new session's CSRF token in the page: every form's field and htmx's header. */
  function adopt(token) {
    Array.prototype.forEach.call(document.querySelectorAll("input[name=csrf]"), function (field) {
      field.value = token;
    });
    var body = document.body;
    var headers = {};
    try {
      headers = JSON.parse(body.getAttribute("hx-headers") || "{}");
    } catch (ignored) {
      headers = {};
    }
    headers["X-CSRF-Token"] = token;
    body.setAttribute("hx-headers", JSON.stringify(headers));
  }

  /* Read the session again: true once signed in again (the page has its token), false if not. */
  function renew() {
    return fetch("/ui/session", {headers: {"HX-Request": "true", "Accept": "application/json"},
                                 credentials: "same-origin", cache: "no-store"})
      .then(function (answer) {
        if (answer.status === 401) {
          return answer.text().then(function (html) {
            return !show(html);
          });
        }
        if (!answer.ok) {
          return true;  // not a signed-out answer: let the request say what is wrong
        }
        return answer.json().then(function (session) {
          adopt(session.csrf);
          ended = false;
          var notice = document.getElementById(NOTICE);
          if (notice) {
            notice.remove();
          }
          document.dispatchEvent(new CustomEvent("qoss:session-renewed"));
          return true;
        });
      })
      .catch(function () {
        return true;  // the network: the request itself will tell
      });
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail && event.detail.xhr;
    if (xhr && xhr.status === 401) {
      event.detail.shouldSwap = false;
      show(xhr.responseText);
    }
  });

  document.addEventListener("htmx:confirm", function (event) {
    if (!ended) {
      return;
    }
    event.preventDefault();
    var issue = event.detail.issueRequest;
    renew().then(function (go) {
      if (go) {
        issue(true);
      }
    });
  });

  document.addEventListener("qoss:session-ended", function (event) {
    show(event.detail && event.detail.html);
  });
})();
