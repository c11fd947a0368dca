/* qoss console: a "Copy" button for a read-only text (data-copy="ID of the field").
 *
 * Without scripts the button stays hidden and the text is selectable as it is. With them, the
 * button shows; pressing it copies the field's text to the clipboard (or, where the browser
 * refuses, selects it for Ctrl+C) and says which in the status next to it
 * (data-copied-for="ID"), read out politely.
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  function say(id, text) {
    var status = document.querySelector('[data-copied-for="' + id + '"]');
    if (status) {
      status.textContent = text;
    }
  }

  function selectAll(field) {
    field.focus();
    field.select();
  }

  function copy(id) {
    var field = document.getElementById(id);
    if (!field) {
      return;
    }
    var text = field.value !== undefined ? field.value : field.textContent;
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () {
        say(id, "Copied.");
      }, function () {
        selectAll(field);
        say(id, "Selected: press Ctrl+C (⌘C) to copy.");
      });
      return;
    }
    selectAll(field);
    say(id, "Selected: press Ctrl+C (⌘C) to copy.");
  }

  function wire() {
    Array.prototype.forEach.call(document.querySelectorAll("button[data-copy]"), function (button) {
      button.hidden = false;
      button.addEventListener("click", function () {
        copy(button.getAttribute("data-copy"));
      });
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", wire);
  } else {
    wire();
  }
}());
