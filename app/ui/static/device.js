/* The device page (/ui/device): a user enrols a phone or laptop through Host with their own keys,
 * in this browser, exactly as `qoss agent device enrol` does.
 *
 * The key files are read here (a file input) and kept in this page's memory only: nothing of them
 * is ever sent. The agent's messages, their cryptography and the talk with Host are
 * agent-client.js's (window.qossAgent); this script is the page.
 */
(() => {
  "use strict";

  const A = window.qossAgent;
  const { V, ID, Rejected, b64d, b64e } = A;

  // ------------------------------------------------------------------ key files

  // PKCS#8 of an RFC 8410 key as `qoss agent keygen` writes it: SEQUENCE { 0, { OID }, OCTET STRING { key } }.
  const PKCS8 = {
    sign: [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20],  // Ed25519
    kem: [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04, 0x20],   // X25519
  };

  /** ["sign" | "kem", 32-byte private key] of a PEM private key file, or null if it is neither. */
  function privateKey(text) {
    const pem = /-----BEGIN PRIVATE KEY-----([A-Za-z0-9+/=\s]+)-----END PRIVATE KEY-----/.exec(text);
    if (!pem) return null;
    let der;
    try {
      der = Uint8Array.from(atob(pem[1].replace(/\s+/g, "")), (c) => c.charCodeAt(0));
    } catch (e) {
      return null;
    }
    for (const [role, prefix] of Object.entries(PKCS8)) {
      if (der.length === 48 && prefix.every((b, i) => der[i] === b)) return [role, der.slice(16)];
    }
    return null;
  }

  // ------------------------------------------------------------------ the page

  const page = document.getElementById("device");
  if (!page) return;
  const $ = (id) => document.getElementById(id);
  const ctx = { host: page.dataset.host, hostKem: b64d(page.dataset.hostKem, 32) };
  /** What is in memory: the private keys (never sent, never stored) and the last enrolment. */
  let keys = null;
  let result = null;
  const urls = [];

  function show(id, on) {
    $(id).hidden = !on;
  }

  function say(message) {
    const box = $("device-error");
    box.textContent = message;
    show("device-error", Boolean(message));
  }

  function forgetResult() {
    for (const url of urls.splice(0)) URL.revokeObjectURL(url);
    result = null;
    $("passphrase").textContent = "";
    $("downloads").replaceChildren();
    $("qr").replaceChildren();
    $("link").textContent = "";
    $("link").removeAttribute("href");
    show("device-result", false);
    show("link-box", false);
    $("passphrase-gone").hidden = true;
  }

  function forgetKeys(keepChoice) {
    if (keys) {
      keys.sign.fill(0);
      keys.kem.fill(0);
    }
    keys = null;
    if (!keepChoice) $("keys").value = "";
    $("keys-status").textContent = "No keys loaded.";
    $("get").disabled = true;
  }

  async function loadKeys() {
    const files = Array.from($("keys").files);
    forgetKeys(true);
    say("");
    const found = {};
    let stem = "";
    let pub = null;
    for (const file of files) {
      if (file.size > 16384) continue;
      const text = await file.text();
      if (file.name.endsWith(".pub.json")) {
        try {
          pub = JSON.parse(text);
        } catch (e) {
          pub = null;
        }
        continue;
      }
      const key = privateKey(text);
      if (key) {
        found[key[0]] = key[1];
        stem = stem || file.name.replace(/\.(ed25519|x25519|pem|key)$/, "");
      }
    }
    if (!found.sign || !found.kem) {
      $("keys").value = "";
      say("Choose both of your private key files: NAME.ed25519 (to sign) and NAME.x25519 (to open the " +
          "answer), as `qoss agent keygen NAME` wrote them.");
      return;
    }
    const publicKeys = { sign: V.ed25519.getPublicKey(found.sign), kem: V.x25519.getPublicKey(found.kem) };
    if (pub && (pub.sign_public_key !== b64e(publicKeys.sign) || pub.kem_public_key !== b64e(publicKeys.kem))) {
      found.sign.fill(0);
      found.kem.fill(0);
      $("keys").value = "";
      say("These private keys do not belong to the public key file chosen with them.");
      return;
    }
    keys = { sign: found.sign, kem: found.kem, user: "" };
    if (!$("user").value && ID.test(pub && pub.id ? pub.id : stem)) $("user").value = pub && pub.id ? pub.id : stem;
    $("keys-status").textContent = `Keys loaded (signing key ${b64e(publicKeys.sign).slice(0, 12)}…); ` +
      "they stay in this page and are never sent.";
    $("get").disabled = false;
  }

  function level(id) {
    const value = $(id).value.trim();
    if (value === "") return 0;
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0 || n > 10) throw new Rejected(`${$(id).labels[0].textContent}: 0 to 10`);
    return n;
  }

  function chosen() {
    const platform = document.querySelector('input[name="platform"]:checked');
    const option = $("target").selectedOptions[0];
    const user = $("user").value.trim();
    if (!ID.test(user)) throw new Rejected("Your user id: 1-63 of a-z, 0-9, '.', '_', '-'.");
    if (!platform) throw new Rejected("Choose your device's platform.");
    return {
      user, platform: platform.value,
      target: option.value, targetSign: b64d(option.dataset.signKey, 32),
      objective: Number($("objective").value),
      levels: { confidentiality: level("confidentiality"), integrity: level("integrity"),
                key_exchange: level("key_exchange") },
    };
  }

  /** POST a sealed message to Host: the answer's ``message``, or an error with what Host said. */
  async function post(path, wire) {
    let answer;
    try {
      answer = await A.postJson(path, { message: wire });
    } catch (e) {
      throw new Error(e.message);
    }
    const doc = answer.doc;
    if (answer.ok && doc && typeof doc.message === "string") return doc.message;
    const detail = doc && typeof doc.detail === "string" ? doc.detail : "";
    if (answer.status === 403) {
      throw new Error("Host refused the request: these keys are not the ones enrolled for this user id, the " +
        "user is unknown or revoked, or the objective is not allowed for them (or this computer's clock is " +
        "off by more than a minute). Check the key files and the user id, or ask Host's administrator.");
    }
    if (answer.status === 429) throw new Error(`Too many requests: ${detail || "try again in a minute"}.`);
    // 409: nothing meets the minimums (detail: an object), or a refusal that says what to do
    // (e.g. a post-quantum minimum, which needs keys from `qoss agent keygen`: enrol from the command line).
    if (answer.status === 409) throw new Error(detail ? `Refused: ${detail}` : "No suite fits the minimums asked.");
    if (answer.status >= 500) throw new Error(A.serverTrouble(answer.status, answer.reference));
    throw new Error(`Host answered ${answer.status}${detail ? ": " + detail : ""}.`);
  }

  function download(name, bytes, type) {
    return A.downloadItem(name, bytes, type, urls);
  }

  function showResult(got) {
    const facts = [["Ticket", got.ticket], ["Gateway", `${got.gateway} (${got.gatewayIdentity})`],
                   ["Gateway's CA (SHA-256)", got.caFingerprint],
                   ["Device identity", got.identity], ["IKE proposal", got.ike], ["ESP proposal", got.esp],
                   ["Valid until", new Date(got.notAfter * 1000).toISOString().replace(".000Z", "Z")]];
    $("facts").replaceChildren(...facts.flatMap(([term, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = term;
      const dd = document.createElement("dd");
      dd.textContent = value;
      dd.dataset.fact = term;
      return [dt, dd];
    }));
    $("downloads").replaceChildren(...got.files.map(([name, bytes], i) => download(name, bytes,
      i === 0 ? got.mediaType : undefined)));
    $("passphrase").textContent = got.passphrase;
    got.passphrase = null;
    $("ca-fingerprint").textContent = got.caFingerprint;
    show("passphrase-box", true);
    show("handoff", got.files.length === 1);  // a profile with files beside it cannot go by a link
    $("make-link").disabled = false;
    show("link-box", false);
    show("device-result", true);
    $("result-title").focus();
  }

  async function getProfile(event) {
    event.preventDefault();
    say("");
    forgetResult();
    if (!keys) {
      say("Load your key files first.");
      return;
    }
    let choice;
    try {
      choice = chosen();
    } catch (e) {
      say(e.message);
      return;
    }
    keys.user = choice.user;
    $("get").disabled = true;
    $("get").setAttribute("aria-busy", "true");
    try {
      const got = await A.enrolDevice({ keys, host: ctx.host, hostKem: ctx.hostKem, ...choice, post });
      result = { choice, profileName: got.files[0][0], profile: got.files[0][1], mediaType: got.mediaType };
      showResult(got);
    } catch (e) {
      say(e instanceof Rejected ? `The answer was not accepted: ${e.message}.` : e.message);
    } finally {
      $("get").disabled = !keys;
      $("get").removeAttribute("aria-busy");
    }
  }

  function drawQr(text) {
    const modules = V.encodeQR(text, "raw", { ecc: "medium" });
    const size = modules.length;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `-4 -4 ${size + 8} ${size + 8}`);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "QR code of the one-time link");
    svg.setAttribute("shape-rendering", "crispEdges");
    const ground = document.createElementNS(ns, "rect");
    for (const [k, v] of [["x", -4], ["y", -4], ["width", size + 8], ["height", size + 8], ["fill", "#fff"]]) {
      ground.setAttribute(k, v);
    }
    let d = "";
    modules.forEach((row, y) => row.forEach((dark, x) => {
      if (dark) d += `M${x} ${y}h1v1h-1z`;
    }));
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d);
    path.setAttribute("fill", "#000");
    svg.append(ground, path);
    $("qr").replaceChildren(svg);
  }

  async function makeLink() {
    say("");
    if (!result || !keys) return;
    $("make-link").disabled = true;
    try {
      const key = V.randomBytes(32);
      const sealed = await A.sealProfile(key, result.mediaType, result.profileName, result.profile);
      const wire = A.handoffWire(keys, ctx, result.profileName, result.mediaType, sealed,
        Math.floor(Date.now() / 1000));
      const path = await post("/v1/agent/handoffs", wire);
      const secret = /^\/v1\/agent\/handoffs\/([A-Za-z0-9_-]{20,64})$/.exec(path);
      if (!secret) throw new Error("Host's answer is not a link.");
      const base = $("link-base").value.trim().replace(/\/+$/, "") || window.location.origin;
      // The key only in the fragment, which a browser never sends: Host keeps what it cannot open.
      const link = `${base}/ui/handoff#t=${secret[1]}&k=${b64e(key)}`;
      $("link").textContent = link;
      $("link").href = link;
      drawQr(link);
      show("link-box", true);
      $("link-title").focus();
    } catch (e) {
      say(e.message);
      $("make-link").disabled = false;
    }
  }

  $("keys").addEventListener("change", () => {
    loadKeys().catch((e) => say(`Cannot read the key files: ${e.message}`));
  });
  $("device-form").addEventListener("submit", getProfile);
  $("passphrase-hide").addEventListener("click", () => {
    $("passphrase").textContent = "";
    show("passphrase-box", false);
    $("passphrase-gone").hidden = false;
  });
  $("make-link").addEventListener("click", makeLink);
  $("forget").addEventListener("click", () => {
    forgetResult();
    forgetKeys();
    $("user").value = "";
    say("");
    $("keys").focus();
  });
  window.addEventListener("pagehide", () => {
    forgetResult();
    forgetKeys();
  });
  forgetKeys();
  $("page-ready").hidden = false;
})();
