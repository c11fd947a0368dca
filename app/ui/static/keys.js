/* qoss console: an edit form for the keyboard.
 *
 * - When an edit form opens in place (a row with class "editing", swapped in by htmx, or a
 *   page that opens with one), the focus moves to its first field.
 * - Escape in it, or in its preview, cancels the edit (its Cancel control), and the focus goes back
 *   to the control that opened it (the row's Edit button) once the row is back.
 * - Where an answer moves the focus on (a preview's Save, a saved row's Edit, a conflict's first
 *   way out), the server marks that control autofocus and htmx focuses it once swapped in.
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var EDITING = ".editing";
  var FIELDS = "input:not([type=hidden]):not([disabled]), select:not([disabled]), textarea:not([disabled])";
  var opener = null;     // the hx-get of the control that asked for the last swap
  var openedBy = {};     // row id -> the hx-get of the control that opened its edit form
  var returnTo = null;   // [row id, hx-get] of the control to focus once the row is back

  function focusFirstField(container) {
    var field = container.querySelector(FIELDS);
    if (field) {
      field.focus();
    }
  }

  function cancelControl(row) {
    var controls = row.querySelectorAll("a, button");
    for (var i = 0; i < controls.length; i++) {
      if (controls[i].textContent.trim() === "Cancel") {
        return controls[i];
      }
    }
    return null;
  }

  function byHxGet(container, value) {
    var controls = container.querySelectorAll("[hx-get]");
    for (var i = 0; i < controls.length; i++) {
      if (controls[i].getAttribute("hx-get") === value) {
        return controls[i];
      }
    }
    return null;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    opener = elt && elt.getAttribute ? elt.getAttribute("hx-get") : null;
  });

  document.addEventListener("htmx:load", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.matches) {
      return;
    }
    // the swapped part is the edit form's row, or holds it (a whole table body)
    var editing = elt.matches(EDITING) ? elt : elt.querySelector(EDITING);
    if (editing) {
      if (editing.id && opener) {
        openedBy[editing.id] = opener;
      }
      // only a form just opened takes the focus, never one the user is typing in already
      if (opener && !editing.contains(document.activeElement)) {
        focusFirstField(editing);
      }
      opener = null;
      return;
    }
    var row = returnTo && document.getElementById(returnTo[0]);
    if (row && !row.matches(EDITING)) {
      var control = byHxGet(row, returnTo[1]);
      returnTo = null;
      if (control) {
        control.focus();
      }
    }
  });

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || event.defaultPrevented || !event.target.closest) {
      return;
    }
    var row = event.target.closest(EDITING + ", .preview");
    var cancel = row && cancelControl(row);
    if (!cancel) {
      return;
    }
    event.preventDefault();
    if (row.id && openedBy[row.id]) {
      returnTo = [row.id, openedBy[row.id]];
      delete openedBy[row.id];
    }
    cancel.click();
  });

  function start() {
    var open = document.querySelector(EDITING);
    if (open) {
      focusFirstField(open);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
