/* The one-time link's page (/ui/handoff#t=<secret>&k=<key>): a device's profile, opened here.
 *
 * The link's fragment carries the link's secret and the 32-byte key its client sealed the profile
 * under; a browser never sends a fragment to a server, so Host, which keeps the sealed profile,
 * never has the key. The page fetches the sealed profile once, opens it (AES-256-GCM, its clear
 * line of media type and file name as associated data: app/domain/agent/sealed_profile.py) with
 * WebCrypto, or with the vendored noble-ciphers where the page is not a secure context (plain HTTP
 * to an address other than localhost), checks it, and offers it as a download of its own media
 * type and file name, so that the device's VPN client imports it. A profile changed on its way
 * does not open, and the page says so. Nothing else is sent anywhere.
 */
(() => {
  "use strict";

  const MAGIC = "qoss-handoff/1";
  const NONCE = 12;
  const TAG = 16;
  const LINE = /^qoss-handoff\/1 ([a-z0-9.+/-]{3,60}) ([A-Za-z0-9][A-Za-z0-9._-]{0,79})$/;
  const SECRET = /^[A-Za-z0-9_-]{20,64}$/;
  const KEY = /^[A-Za-z0-9_-]{43}$/;
  //: The profiles a link hands out (app/services/agent/host.py HANDOFF_TYPES) and their endings.
  const TYPES = { "application/vnd.strongswan.profile": ".sswan", "application/x-apple-aspen-config": ".mobileconfig" };
  const AES = window.qossAes;

  const $ = (id) => document.getElementById(id);

  /** A refusal the user is told as it is. */
  class Refused extends Error {}

  function status(text) {
    $("handoff-status").textContent = text;
    $("handoff-status").hidden = !text;
  }

  function fail(text) {
    status("");
    $("handoff-error").textContent = text;
    $("handoff-error").hidden = false;
  }

  function unbase64url(text) {
    const raw = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4));
    return Uint8Array.from(raw, (c) => c.charCodeAt(0));
  }

  function unbase64(text) {
    return Uint8Array.from(atob(text.replace(/\s+/g, "")), (c) => c.charCodeAt(0));
  }

  /** The secret and the key from the link's fragment. */
  function fromLink() {
    const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    const secret = fragment.get("t") || "";
    const key = fragment.get("k") || "";
    if (!SECRET.test(secret) || !KEY.test(key)) {
      throw new Refused("This link is incomplete: open the whole link (scan the QR code again).");
    }
    const raw = unbase64url(key);
    if (raw.length !== 32) throw new Refused("This link is incomplete: open the whole link (scan the QR code again).");
    return { secret, key: raw };
  }

  /** A sealed profile read apart: its clear line (the associated data), nonce and ciphertext. */
  function readSealed(bytes) {
    const end = bytes.subarray(0, 160).indexOf(0x0a);
    const line = end > 0 ? new TextDecoder("ascii").decode(bytes.subarray(0, end)) : "";
    const parts = LINE.exec(line);
    if (!line.startsWith(MAGIC) || !parts || bytes.length < end + 1 + NONCE + TAG + 1) {
      throw new Refused("What the server sent is not a sealed profile: do not use this link; make a new one.");
    }
    const [, mediaType, name] = parts;
    if (!(mediaType in TYPES) || !name.endsWith(TYPES[mediaType])) {
      throw new Refused("What the server sent is not a profile a link hands out: do not use it; make a new link.");
    }
    return { mediaType, name, aad: bytes.subarray(0, end + 1), nonce: bytes.subarray(end + 1, end + 1 + NONCE),
             ciphertext: bytes.subarray(end + 1 + NONCE) };
  }

  const CHANGED = "This profile was changed after your computer sealed it: it does not open with the key in " +
    "the link. Do not use it. Make a new link on your computer, and tell your administrator.";

  async function open(key, sealed) {
    try {
      if (window.crypto && window.crypto.subtle) {
        const aes = await crypto.subtle.importKey("raw", key, { name: "AES-GCM" }, false, ["decrypt"]);
        return new Uint8Array(await crypto.subtle.decrypt(
          { name: "AES-GCM", iv: sealed.nonce, additionalData: sealed.aad, tagLength: 128 }, aes, sealed.ciphertext));
      }
      return AES.gcm(key, sealed.nonce, sealed.aad).decrypt(sealed.ciphertext);
    } catch (e) {
      throw new Refused(CHANGED);
    }
  }

  async function sha256(bytes) {
    if (window.crypto && window.crypto.subtle) return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    return AES.sha256(bytes);
  }

  /** The gateway's CA certificate (DER) in the profile, after checking the profile is one. */
  function caOf(mediaType, profile) {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(profile);
    if (mediaType === "application/vnd.strongswan.profile") {
      const doc = JSON.parse(text);
      if (!doc || typeof doc !== "object" || !doc.remote || typeof doc.remote.addr !== "string") {
        throw new Refused("The profile is not a strongSwan profile.");
      }
      return typeof doc.remote.cert === "string" ? unbase64(doc.remote.cert) : null;
    }
    const plist = new DOMParser().parseFromString(text, "application/xml");
    if (plist.getElementsByTagName("parsererror").length || plist.documentElement.nodeName !== "plist") {
      throw new Refused("The profile is not an Apple configuration profile.");
    }
    for (const dict of plist.getElementsByTagName("dict")) {
      const keys = Array.from(dict.children);
      const value = (name) => {
        const at = keys.findIndex((k) => k.nodeName === "key" && k.textContent === name);
        return at >= 0 && keys[at + 1] ? keys[at + 1] : null;
      };
      const type = value("PayloadType");
      const content = value("PayloadContent");
      if (type && type.textContent === "com.apple.security.root" && content && content.nodeName === "data") {
        return unbase64(content.textContent);
      }
    }
    return null;
  }

  function fact(term, value) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.fact = term;
    return [dt, dd];
  }

  async function run() {
    if (!(window.crypto && window.crypto.subtle) && !(AES && AES.gcm)) {
      throw new Refused("This browser cannot open the profile (no AES-GCM): open the link in another browser.");
    }
    const link = fromLink();
    let answer;
    try {
      answer = await fetch(`/v1/agent/handoffs/${link.secret}`,
        { cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" });
    } catch (e) {
      throw new Refused("The server cannot be reached: check the network and open the link again.");
    }
    // The link is spent (or refused) now: its key leaves the address bar and the history.
    window.history.replaceState(null, "", window.location.pathname);
    if (answer.status === 404) {
      throw new Refused("This link is unknown, used or expired: a link works once, for ten minutes. Make a new " +
        "one on your computer.");
    }
    if (answer.status === 429) throw new Refused("Too many tries from this network: wait a minute, then make a new link.");
    if (!answer.ok) throw new Refused(`The server answered ${answer.status}: make a new link on your computer.`);
    const sealed = readSealed(new Uint8Array(await answer.arrayBuffer()));
    const profile = await open(link.key, sealed);
    let ca;
    try {
      ca = caOf(sealed.mediaType, profile);
    } catch (e) {
      throw e instanceof Refused ? e : new Refused("The profile cannot be read: make a new link on your computer.");
    }
    const facts = [fact("File", sealed.name)];
    if (ca) {
      const digest = Array.from(await sha256(ca), (b) => b.toString(16).padStart(2, "0").toUpperCase()).join(":");
      facts.push(fact("Gateway's CA (SHA-256)", digest));
    }
    $("handoff-facts").replaceChildren(...facts.flat());
    const download = $("handoff-download");
    download.href = URL.createObjectURL(new Blob([profile], { type: sealed.mediaType }));
    download.download = sealed.name;
    download.type = sealed.mediaType;
    download.textContent = `Download ${sealed.name}`;
    status("");
    $("handoff-result").hidden = false;
    $("handoff-title").focus();
  }

  run().catch((e) => fail(e instanceof Refused ? e.message : `The profile cannot be opened: ${e.message}`));
})();
