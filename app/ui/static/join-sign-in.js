/* The phone's sign-in with the identity provider (/ui/join/sign-in), bound to this browser tab.
 *
 * The device type is recognised from the browser (and can be changed). On submit, the form gets a
 * fresh random binding (32 bytes, base64url); this tab's sessionStorage keeps it and the device
 * type under the phone sign-in's own keys. When the provider answers at the console's callback
 * page, oidc.js finds them there and posts the answer on to /ui/join/oidc/callback. A page of
 * another origin can neither read nor write this origin's sessionStorage.
 * Served from 'self': the page's CSP allows no inline script.
 */
(function () {
  "use strict";

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

  function recognised() {
    var agent = navigator.userAgent || "";
    if (/Android/i.test(agent)) return "android";
    if (/iPhone|iPad|iPod|Macintosh/i.test(agent)) return "apple";
    if (/Windows/i.test(agent)) return "windows";
    if (/Linux|X11/i.test(agent)) return "networkmanager";
    return null;
  }

  var form = document.getElementById("join-oidc");
  if (!form) return;
  var guess = recognised();
  var choice = guess && document.getElementById("platform-" + guess);
  if (choice) choice.checked = true;
  form.addEventListener("submit", function () {
    var made = binding();
    var platform = form.querySelector("input[name=platform]:checked");
    window.sessionStorage.removeItem("qoss-oidc-binding");
    window.sessionStorage.setItem(JOIN_KEY, made);
    window.sessionStorage.setItem(JOIN_PLATFORM, platform ? platform.value : "");
    form.elements.namedItem("binding").value = made;
  });
}());
