/* The agent's client in a browser (qoss-agent/v1), shared by Host's pages for users: the device page
 * (/ui/device: the user's own key files) and the phone's join page (/ui/join: keys made on the phone).
 *
 * A request is the agent's connect message: its canonical body signed with the user's Ed25519 key
 * (over the signature context and the kind), then body and signature sealed to Host's X25519 key
 * with HPKE (RFC 9180 base mode, DHKEM-X25519 / HKDF-SHA256 / ChaCha20-Poly1305, the context label
 * and the canonical header as `info`). Target's answer is sealed to the user's X25519 key: it is
 * opened here, its signature checked with Target's key, and it must answer this very request, for
 * this user, via this Host, and be fresh. The primitives are the vendored noble libraries
 * (qoss-vendor.min.js); HPKE is composed from them below, as RFC 9180 §4-5 and §7.1 write it (its
 * test vector and Python's `cryptography` are checked against it in
 * tests/ui/browser/test_device_page.py). Everything is exported as `window.qossAgent`; nothing here
 * touches a page.
 */
(() => {
  "use strict";

  const V = window.qossVendor;
  const TEXT = new TextEncoder();
  const ENVELOPE_INFO = TEXT.encode("qoss-agent/v1 envelope\0");
  const SIGNATURE_CONTEXT = TEXT.encode("qoss-agent/v1 signature\0");
  const VERSION = 1;
  const WINDOW_BACK = 60;
  const WINDOW_SKEW = 30;
  const HANDOFF_TTL = 600;
  const ID = /^[a-z0-9][a-z0-9._-]{0,62}$/;

  // ------------------------------------------------------------------ bytes and canonical JSON

  function concat(...parts) {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  function equal(a, b) {
    if (a.length !== b.length) return false;
    let diff = 0;
    for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
    return diff === 0;
  }

  function base64(bytes) {
    let text = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    }
    return btoa(text);
  }

  function unbase64(text) {
    const raw = atob(text);
    const out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  /** Unpadded base64url, as the agent's messages spell bytes. */
  function b64e(bytes) {
    return base64(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  /** Decode unpadded base64url, refusing any other spelling of the same bytes (as the server does). */
  function b64d(text, size) {
    if (typeof text !== "string" || !/^[A-Za-z0-9_-]*$/.test(text)) throw new Rejected("bad base64");
    const padded = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
    let bytes;
    try {
      bytes = unbase64(padded);
    } catch (e) {
      throw new Rejected("bad base64");
    }
    if (b64e(bytes) !== text) throw new Rejected("non-canonical base64");
    if (size !== undefined && bytes.length !== size) throw new Rejected(`a ${size}-byte field has ${bytes.length}`);
    return bytes;
  }

  /** The one encoding of a message, as Python's json.dumps(sort_keys=True, separators=(",", ":"),
   * ensure_ascii=True) writes it: integers only, everything outside printable ASCII escaped. */
  function canonical(value) {
    if (value === null) return "null";
    if (value === true) return "true";
    if (value === false) return "false";
    if (typeof value === "number") {
      if (!Number.isSafeInteger(value)) throw new Rejected("only integers in a message");
      return String(value);
    }
    if (typeof value === "string") {
      return JSON.stringify(value).replace(/[\u007f-\uffff]/g,
        (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
    }
    if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
    if (typeof value === "object") {
      return "{" + Object.keys(value).sort().map((k) => canonical(k) + ":" + canonical(value[k])).join(",") + "}";
    }
    throw new Rejected(`${typeof value} is not allowed in a message`);
  }

  function canonicalBytes(value) {
    return TEXT.encode(canonical(value));
  }

  /** Parse a canonical JSON object, refusing any other encoding of it. */
  function decodeCanonical(bytes) {
    let text;
    try {
      text = new TextDecoder("ascii", { fatal: true }).decode(bytes);
      if (!/^[\x20-\x7e]*$/.test(text)) throw new Error("not ASCII");
    } catch (e) {
      throw new Rejected("not canonical JSON");
    }
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new Rejected("not canonical JSON");
    }
    if (value === null || typeof value !== "object" || Array.isArray(value) || canonical(value) !== text) {
      throw new Rejected("not canonical JSON");
    }
    return value;
  }

  class Rejected extends Error {}

  // ------------------------------------------------------------------ HPKE (RFC 9180), base mode

  const HPKE_V1 = TEXT.encode("HPKE-v1");
  const KEM_SUITE = concat(TEXT.encode("KEM"), new Uint8Array([0x00, 0x20]));  // DHKEM(X25519, HKDF-SHA256)
  const HPKE_SUITE = concat(TEXT.encode("HPKE"), new Uint8Array([0x00, 0x20, 0x00, 0x01, 0x00, 0x03]));
  const EMPTY = new Uint8Array(0);

  function labeledExtract(suite, salt, label, ikm) {
    return V.hkdfExtract(V.sha256, concat(HPKE_V1, suite, TEXT.encode(label), ikm), salt);
  }

  function labeledExpand(suite, prk, label, info, length) {
    const info2 = concat(new Uint8Array([length >> 8, length & 0xff]), HPKE_V1, suite, TEXT.encode(label), info);
    return V.hkdfExpand(V.sha256, prk, info2, length);
  }

  function dh(secret, publicKey) {
    const shared = V.x25519.getSharedSecret(secret, publicKey);  // throws on a low-order point
    if (shared.every((b) => b === 0)) throw new Rejected("X25519 gave zero");
    return shared;
  }

  function kemShared(dhValue, encapsulated, recipient) {
    const prk = labeledExtract(KEM_SUITE, EMPTY, "eae_prk", dhValue);
    return labeledExpand(KEM_SUITE, prk, "shared_secret", concat(encapsulated, recipient), 32);
  }

  function keySchedule(shared, info) {
    const context = concat(new Uint8Array([0]), labeledExtract(HPKE_SUITE, EMPTY, "psk_id_hash", EMPTY),
      labeledExtract(HPKE_SUITE, EMPTY, "info_hash", info));
    const secret = labeledExtract(HPKE_SUITE, shared, "secret", EMPTY);
    return { key: labeledExpand(HPKE_SUITE, secret, "key", context, 32),
             nonce: labeledExpand(HPKE_SUITE, secret, "base_nonce", context, 12) };
  }

  /** Seal ``plaintext`` to X25519 ``recipient``: enc || ciphertext (the first message of a base-mode
   * context, as Python's ``cryptography`` writes it). ``ephemeral`` is for test vectors only. */
  function hpkeSeal(recipient, info, aad, plaintext, ephemeral) {
    const secret = ephemeral || V.x25519.utils.randomSecretKey();
    const encapsulated = V.x25519.getPublicKey(secret);
    const { key, nonce } = keySchedule(kemShared(dh(secret, recipient), encapsulated, recipient), info);
    return concat(encapsulated, V.chacha20poly1305(key, nonce, aad).encrypt(plaintext));
  }

  /** Open what :func:`hpkeSeal` (or the server) sealed to the X25519 key ``secret``. */
  function hpkeOpen(secret, info, aad, sealed) {
    if (sealed.length < 32 + 16) throw new Rejected("cannot open the seal");
    const encapsulated = sealed.subarray(0, 32);
    const recipient = V.x25519.getPublicKey(secret);
    try {
      const { key, nonce } = keySchedule(kemShared(dh(secret, encapsulated), encapsulated, recipient), info);
      return V.chacha20poly1305(key, nonce, aad).decrypt(sealed.subarray(32));
    } catch (e) {
      throw new Rejected("cannot open the seal");
    }
  }

  // ------------------------------------------------------------------ the agent's messages

  function header(kind, to) {
    return { kind, to, v: VERSION };
  }

  function signedBytes(kind, body) {
    return concat(SIGNATURE_CONTEXT, TEXT.encode(kind), new Uint8Array([0]), body);
  }

  /** Sign ``body`` as ``kind`` with ``keys`` and seal body+signature to ``recipientKem``: the wire text. */
  function seal(kind, to, body, keys, recipientKem) {
    const tag = V.ed25519.sign(signedBytes(kind, body), keys.sign);
    const plaintext = canonicalBytes({ body: b64e(body), tag: b64e(tag) });
    const info = concat(ENVELOPE_INFO, canonicalBytes(header(kind, to)));
    const sealed = hpkeSeal(recipientKem, info, EMPTY, plaintext);
    return canonical({ ...header(kind, to), sealed: b64e(sealed) });
  }

  /** Open a wire message of ``kind`` sealed to ``keys``: [signed body, tag], not yet verified. */
  function openSealed(wireText, kind, keys) {
    const wire = decodeCanonical(TEXT.encode(wireText));
    const fields = Object.keys(wire).sort().join(",");
    if (fields !== "kind,sealed,to,v" || wire.v !== VERSION) throw new Rejected("malformed answer");
    if (wire.kind !== kind || wire.to !== keys.user) throw new Rejected("the answer is not for you");
    const info = concat(ENVELOPE_INFO, canonicalBytes(header(kind, keys.user)));
    const plain = decodeCanonical(hpkeOpen(keys.kem, info, EMPTY, b64d(wire.sealed)));
    if (Object.keys(plain).sort().join(",") !== "body,tag") throw new Rejected("malformed answer");
    return [b64d(plain.body), b64d(plain.tag, 64)];
  }

  /** The user's request of ``kind`` to ``target`` through ``host`` (what ``AgentClient.request`` signs):
   * {requestId, body}; ``info`` adds to or replaces the request's defaults. */
  function agentRequest({ kind, user, host, target, objective, info, now }) {
    const requestId = V.randomBytes(16);
    const body = canonicalBytes({
      request_id: b64e(requestId), user_id: user, objective_id: objective,
      request_info: { target, min_levels: {}, supports: [], ah: false, transport: false, lifetime: 600, ...info },
      kind, sender: user, recipient: host, via: host, target, ts: now,
    });
    return { requestId, body };
  }

  /** The user's connect request for a device (what ``AgentClient.request`` signs for ``enrol_device``). */
  function deviceRequest({ user, host, target, objective, levels, platform, now }) {
    return agentRequest({ kind: "connect", user, host, target, objective, info: { min_levels: levels, platform },
                          now });
  }

  /** Open Target's answer of ``kind`` to ``request`` (``AgentClient.accept``) with ``ctx`` {host, target,
   * targetSign}: signed by Target, from it to this user via Host, answering this very request. The
   * answer's body, parsed; whether it is fresh is for the caller to ask (:func:`fresh`). */
  function openAnswer(wireText, kind, request, keys, ctx) {
    const [body, tag] = openSealed(wireText, kind, keys);
    if (!V.ed25519.verify(tag, signedBytes(kind, body), ctx.targetSign, { zip215: false })) {
      throw new Rejected("the answer is not signed by the target");
    }
    const answer = decodeCanonical(body);
    if (answer.kind !== kind || answer.sender !== ctx.target || answer.recipient !== keys.user ||
        answer.via !== ctx.host) {
      throw new Rejected("the answer is for another party");
    }
    if (!equal(b64d(answer.request_id, 16), request.requestId)) throw new Rejected("the answer is to another request");
    return answer;
  }

  /** Whether a message's time ``ts`` is within the agent's window around this device's clock. */
  function fresh(ts) {
    const now = Math.floor(Date.now() / 1000);
    return Number.isSafeInteger(ts) && ts >= now - WINDOW_BACK && ts <= now + WINDOW_SKEW;
  }

  /** Check Target's answer to ``request`` (``AgentClient.accept``): the response body, parsed. */
  function acceptDevice(wireText, request, keys, ctx) {
    const response = openAnswer(wireText, "response", request, keys, ctx);
    if (!fresh(response.ts)) throw new Rejected("the answer is not fresh (is this computer's clock right?)");
    const device = response.device;
    const tunnel = response.tunneling_info;
    if (!device || !tunnel || device.platform !== ctx.platform || response.session_key !== null) {
      throw new Rejected("the answer carries no profile for this platform");
    }
    const name = /^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$/;
    const files = Object.keys(device.files || {});
    if (!name.test(device.profile_name) || files.some((f) => !name.test(f)) ||
        !/^[A-Za-z0-9-]{12,64}$/.test(device.passphrase)) {
      throw new Rejected("malformed profile");
    }
    return {
      platform: device.platform, mediaType: device.media_type, passphrase: device.passphrase,
      files: [[device.profile_name, b64d(device.profile)], ...files.map((f) => [f, b64d(device.files[f])])],
      notAfter: device.not_after, ticket: tunnel.ticket, gateway: tunnel.target_address,
      caFingerprint: fingerprint(b64d(device.ca_cert)),
      gatewayIdentity: tunnel.target_identity, identity: tunnel.client_identity,
      ike: tunnel.ike_proposal, esp: tunnel.esp_proposal,
    };
  }

  /** The SHA-256 of a certificate (DER) as certificate viewers show it (``app.services.agent.client_devices.ca_fingerprint``). */
  function fingerprint(der) {
    return Array.from(V.sha256(der), (b) => b.toString(16).padStart(2, "0").toUpperCase()).join(":");
  }

  /** A profile sealed for a one-time link (app/domain/agent/sealed_profile.py): AES-256-GCM under
   * ``key``, which travels only in the link's fragment; its clear line is the associated data.
   * WebCrypto, or the vendored noble-ciphers where this page is not a secure context. */
  async function sealProfile(key, mediaType, name, profile) {
    const line = TEXT.encode(`qoss-handoff/1 ${mediaType} ${name}\n`);
    const nonce = V.randomBytes(12);
    let sealed;
    if (window.crypto && window.crypto.subtle) {
      const aes = await crypto.subtle.importKey("raw", key, { name: "AES-GCM" }, false, ["encrypt"]);
      sealed = new Uint8Array(await crypto.subtle.encrypt(
        { name: "AES-GCM", iv: nonce, additionalData: line, tagLength: 128 }, aes, profile));
    } else {
      sealed = window.qossAes.gcm(key, nonce, line).encrypt(profile);
    }
    return concat(line, nonce, sealed);
  }

  /** The user's handoff of a sealed profile to Host, for one download from a link (``AgentClient.handoff``). */
  function handoffWire(keys, ctx, profileName, mediaType, profile, now) {
    const body = canonicalBytes({
      kind: "handoff", sender: keys.user, recipient: ctx.host, nonce: b64e(V.randomBytes(16)), ts: now,
      profile_name: profileName, media_type: mediaType, profile: b64e(profile), ttl: HANDOFF_TTL,
    });
    return seal("handoff", ctx.host, body, keys, ctx.hostKem);
  }

  // ------------------------------------------------------------------ talking to Host

  /** How long a request to Host may take before the page says so (a phone on a slow network). */
  const TIMEOUT_MS = 30000;

  /** Host could not be reached, or did not answer in time: ``message`` says so to the user. */
  class Unreachable extends Error {}

  /** POST ``payload`` as JSON to Host's ``path`` with a timeout: {status, ok, doc, reference}
   * (``doc``: the answer's JSON or null; ``reference``: its request id, to quote). */
  async function postJson(path, payload, timeoutMs) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), timeoutMs || TIMEOUT_MS);
    let answer;
    try {
      answer = await fetch(path, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload),
        credentials: "omit", cache: "no-store", redirect: "error", signal: abort.signal,
      });
    } catch (e) {
      throw new Unreachable(abort.signal.aborted
        ? "The server took too long to answer. Check this device's connection and try again."
        : "The server could not be reached. Check this device's connection and try again.");
    } finally {
      clearTimeout(timer);
    }
    let doc = null;
    try {
      doc = await answer.json();
    } catch (e) {
      doc = null;
    }
    const reference = (answer.headers.get("X-Request-ID") || "").replace(/[^A-Za-z0-9._-]/g, "").slice(0, 64);
    return { status: answer.status, ok: answer.ok, doc, reference };
  }

  /** What the user is told when Host or the gateway behind it failed (a 5xx): what happened and what to
   * do, never the answer's detail (it names Host's own machinery, a socket path or strongSwan's
   * words, for the operator: their log has it), with the request's reference to quote. */
  function serverTrouble(status, reference) {
    const quote = reference ? ` and quote the reference ${reference}` : "";
    const what = status === 503
      ? "Host cannot set up your connection right now: the VPN gateway behind it is not answering."
      : "Host could not set up your connection: the VPN gateway behind it refused or failed.";
    return `${what} Nothing was set up and your keys stayed on this device. Try again in a few minutes; ` +
      `if it keeps failing, tell Host's administrator${quote}.`;
  }

  /** A list item with a download link for ``bytes`` (its object URL is pushed onto ``urls``, for the
   * page to revoke). */
  function downloadItem(name, bytes, type, urls) {
    const url = URL.createObjectURL(new Blob([bytes], { type: type || "application/octet-stream" }));
    urls.push(url);
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = url;
    link.download = name;
    link.type = type || "application/octet-stream";
    link.className = "button";
    link.textContent = `Download ${name}`;
    item.append(link);
    return item;
  }

  // ------------------------------------------------------------------ keys made here, invitations

  /** A new user key pair: {sign, kem} private (32 bytes each) and {signPublic, kemPublic}. */
  function newKeys() {
    const sign = V.ed25519.utils.randomSecretKey();
    const kem = V.x25519.utils.randomSecretKey();
    return { sign, kem, signPublic: V.ed25519.getPublicKey(sign), kemPublic: V.x25519.getPublicKey(kem) };
  }

  /** The redemption of an invitation (``HostInvitations.redeem``): its canonical body, signed with the
   * new Ed25519 key as "invitation" (proof that the phone holds the key it registers). */
  function invitationRedemption({ host, secret, platform, keys, now }) {
    const body = canonical({
      host, invitation: secret, platform, ts: now,
      sign_public_key: b64e(keys.signPublic), kem_public_key: b64e(keys.kemPublic),
    });
    const signature = V.ed25519.sign(signedBytes("invitation", TEXT.encode(body)), keys.sign);
    return { body, signature: b64e(signature) };
  }

  /** Enrol a device through Host: build and seal the request, post it with ``post`` (path, wire ->
   * the answer's message), check Target's answer; what :func:`acceptDevice` returns. */
  async function enrolDevice({ keys, host, hostKem, target, targetSign, platform, objective, levels, post }) {
    const request = deviceRequest({ user: keys.user, host, target, objective, levels, platform,
                                    now: Math.floor(Date.now() / 1000) });
    const wire = seal("connect", host, request.body, keys, hostKem);
    const answer = await post("/v1/agent/requests", wire);
    return acceptDevice(answer, request, keys, { host, target, targetSign, platform });
  }

  window.qossAgent = {
    ID, Rejected, Unreachable, V, agentRequest, b64d, b64e, canonical, downloadItem, enrolDevice, fingerprint, fresh,
    handoffWire, hpkeOpen, hpkeSeal, invitationRedemption, newKeys, openAnswer, postJson, seal, sealProfile,
    serverTrouble, signedBytes,
  };
})();
