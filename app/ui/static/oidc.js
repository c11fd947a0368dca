/* qoss console: a sign-in with the identity provider, bound to the browser tab that started it.
 *
 * On the sign-in page, the "Sign in with ..." form gets a fresh random binding (32 bytes,
 * base64url) as it is sent to /ui/oidc/start; this tab's sessionStorage keeps it. The flow
 * cookie the server then sets is only good together with it.
 *
 * The provider sends the browser back to /ui/oidc/callback: that page's form holds the
 * provider's answer; this script adds the binding this tab kept (and forgets it) and posts the
 * form to this console. A page of another origin can neither read nor write this origin's
 * sessionStorage, so a flow cookie planted in the browser from a sibling origin comes without
 * its binding and signs no one in.
 * Served from 'self': the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var KEY = "qoss-oidc-binding";

  function binding() {
    var bytes = new Uint8Array(32);
    window.crypto.getRandomValues(bytes);
    var text = "";
    for (var i = 0; i < bytes.length; i++) {
      text += String.fromCharCode(bytes[i]);
    }
    return window.btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  var start = document.getElementById("oidc-start");
  if (start) {
    start.addEventListener("submit", function () {
      var made = binding();
      window.sessionStorage.setItem(KEY, made);
      start.elements.namedItem("binding").value = made;
    });
  }

  var finish = document.getElementById("oidc-finish");
  if (finish) {
    var kept = window.sessionStorage.getItem(KEY) || "";
    window.sessionStorage.removeItem(KEY);
    finish.elements.namedItem("binding").value = kept;
    finish.submit();
  }
}());
