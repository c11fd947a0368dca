/* qoss console: a sign-in with the identity provider, bound to the browser tab that started it.
 *
 * On the console's sign-in page, the "Sign in with ..." form gets a fresh random binding (32
 * bytes, base64url) as it is sent to /ui/oidc/start; this tab's sessionStorage keeps it. The flow
 * cookie the server then sets is only good together with it.
 *
 * A phone's sign-in to enrol a device (/ui/join/sign-in) does the same under keys of its own, with
 * the device type: recognised from the browser (and changeable), kept beside the binding.
 *
 * The provider sends the browser back to /ui/oidc/callback: that page's form holds the
 * provider's answer; this script adds the binding this tab kept (and forgets it) and posts the
 * form to this console (a phone's sign-in: with its device type, to /ui/join/oidc/callback). A
 * page of another origin can neither read nor write this origin's sessionStorage, so a flow
 * cookie planted in the browser from a sibling origin comes without its binding and signs no one
 * in. Served from 'self': the page's CSP allows no inline script.
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

  /** As ``form`` is sent: a fresh binding in it, kept under ``key`` (the other flow's forgotten). */
  function bindOnSubmit(form, key, other, before) {
    form.addEventListener("submit", function () {
      var made = binding();
      if (before) before();
      window.sessionStorage.removeItem(other);
      window.sessionStorage.setItem(key, made);
      form.elements.namedItem("binding").value = made;
    });
  }

  /** The device type this browser runs on, as the phone's sign-in names it (null: not known). */
  function recognised() {
    var agent = navigator.userAgent || "";
    if (/Android/i.test(agent)) return "android";
    if (/iPhone|iPad|iPod|Macintosh/i.test(agent)) return "apple";
    if (/Windows/i.test(agent)) return "windows";
    if (/Linux|X11/i.test(agent)) return "networkmanager";
    return null;
  }

  var start = document.getElementById("oidc-start");
  if (start) bindOnSubmit(start, KEY, JOIN_KEY);

  var join = document.getElementById("join-oidc");
  if (join) {
    var guess = recognised();
    var choice = guess && document.getElementById("platform-" + guess);
    if (choice) choice.checked = true;
    bindOnSubmit(join, JOIN_KEY, KEY, function () {
      var platform = join.querySelector("input[name=platform]:checked");
      window.sessionStorage.setItem(JOIN_PLATFORM, platform ? platform.value : "");
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
