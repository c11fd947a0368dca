/* qoss console: filter a grid's rows as the admin types.
 *
 * A filter box (an element with data-filter-for="<tbody id>", hidden in the page: without this
 * script the whole grid shows) holds a search field and a polite status region. Typing hides the
 * rows none of whose cells named in data-filter-columns ("0 1 8": a rating's algorithm, kind and
 * reason) contains what is typed, ignoring case; the region says "12 of 80 shown". A row with
 * fewer cells (a message across the row) or one the admin is working in (an edit
 * form open, its preview or conflict) is never hidden. Escape in the field empties it.
 *
 * The filter holds when rows change under it: live.js replacing or adding rows changed elsewhere,
 * htmx swapping a row (edit, cancel, preview) or the whole body (a save). A MutationObserver on
 * the table sees each and the filter is applied again (it changes classes only, never the
 * rows, so it does not wake itself).
 * Served from 'self' like htmx: the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var HIDDEN = "filtered-out";
  var BUSY = ".editing, .preview, .conflict";

  function words(text) {
    return (text || "").replace(/\s+/g, " ").trim().toLowerCase();
  }

  /* A cell's text as seen: without the notes for screen readers (live.js's "changed elsewhere"). */
  function seen(cell) {
    var copy = cell.cloneNode(true);
    Array.prototype.forEach.call(copy.querySelectorAll(".sr"), function (note) {
      note.remove();
    });
    return words(copy.textContent);
  }

  function setUp(box) {
    var field = box.querySelector("input");
    var count = box.querySelector("[role=status]");
    var bodyId = box.getAttribute("data-filter-for");
    var columns = (box.getAttribute("data-filter-columns") || "0").split(/\s+/).map(Number);
    var first = document.getElementById(bodyId);
    var table = first && first.closest("table");
    if (!field || !count || !table) {
      return;
    }
    var said = null;

    function apply() {
      var body = document.getElementById(bodyId);
      if (!body) {
        return;
      }
      var wanted = words(field.value);
      var rows = Array.prototype.filter.call(body.children, function (row) {
        return row.matches("tr[id]");
      });
      var shown = 0;
      rows.forEach(function (row) {
        var keep = !wanted || row.matches(BUSY) || row.cells.length <= Math.max.apply(null, columns) ||
          columns.some(function (at) {
            return seen(row.cells[at]).indexOf(wanted) >= 0;
          });
        row.classList.toggle(HIDDEN, !keep);
        if (keep) {
          shown += 1;
        }
      });
      var message = shown + " of " + rows.length + " shown";
      if (message !== said) {  // the region speaks only when the count changes
        said = message;
        count.textContent = message;
      }
    }

    field.addEventListener("input", apply);
    field.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && field.value) {
        event.preventDefault();
        field.value = "";
        apply();
      }
    });
    new MutationObserver(apply).observe(table, {childList: true, subtree: true});
    box.hidden = false;
    apply();
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-filter-for]"), setUp);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
