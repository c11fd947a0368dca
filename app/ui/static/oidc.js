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
 * A phone's sign-in to enrol a device (/ui/join/sign-in, join-sign-in.js) keeps its binding and
 * platform under keys of its own: its answer is posted on to /ui/join/oidc/callback instead.
 * Served from 'self': the page's CSP allows no inline script.
 */
(function () {
  "use strict";

  var KEY = "qoss-oidc-binding";
  var JOIN_KEY = "qoss-join-binding";
  var JOIN_PLATFORM = "qoss-join-platform";

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
      window.sessionStorage.removeItem(JOIN_KEY);
      window.sessionStorage.setItem(KEY, made);
      start.elements.namedItem("binding").value = made;
    });
  }

  var finish = document.getElementById("oidc-finish");
  if (finish) {
    var joining = window.sessionStorage.getItem(JOIN_KEY);
    var kept = joining || window.sessionStorage.getItem(KEY) || "";
    window.sessionStorage.removeItem(KEY);
    window.sessionStorage.removeItem(JOIN_KEY);
    if (joining) {
      var platform = document.createElement("input");
      platform.type = "hidden";
      platform.name = "platform";
      platform.value = window.sessionStorage.getItem(JOIN_PLATFORM) || "";
      window.sessionStorage.removeItem(JOIN_PLATFORM);
      finish.appendChild(platform);
      finish.action = "/ui/join/oidc/callback";
    }
    finish.elements.namedItem("binding").value = kept;
    finish.submit();
  }
}());
