/* The invitation's page (/ui/join#i=<secret>): a user with nothing but a phone joins.
 *
 * 1. The invitation's secret is read from the link's fragment (a browser never sends a fragment).
 * 2. On "Join", the user's Ed25519 and X25519 keys are made here (or, on a phone that joined before,
 *    taken from this browser's storage: phone-keys.js) and kept in this origin's IndexedDB; the
 *    invitation is redeemed with their public halves, signed by the Ed25519 key
 *    (POST /v1/agent/invitations/redeem): Host registers them for the invited user and grants one
 *    device enrolment of the invitation's platform.
 * 3. The device is enrolled exactly as the device page does it (agent-client.js): the request
 *    signed and sealed to Host, Target's answer opened and checked here. The profile is offered as
 *    a download of its own media type (the strongSwan app or Settings imports it), the one-time
 *    passphrase is shown once.
 * Every request goes to this server alone, with a time limit and a message; what the user reads
 * says what happened and what to do, never an internal detail. The steps are functions of their
 * own (window.qossJoin), so that another way in than an invitation can reuse the enrolment.
 */
(() => {
  "use strict";

  const A = window.qossAgent;
  const KEYS = window.qossPhoneKeys;
  const page = document.getElementById("join");
  if (!page || !A || !KEYS) return;

  const $ = (id) => document.getElementById(id);
  const SECRET = /^[A-Za-z0-9_-]{20,64}$/;
  const host = page.dataset.host;
  const hostKem = A.b64d(page.dataset.hostKem, 32);
  const urls = [];
  /** The invitation's secret (until redeemed), the user's keys, and the grant Host answered. */
  const state = { secret: null, keys: null, grant: null };

  // ------------------------------------------------------------------ what the user is told

  /** A refusal the user is told as it is: ``message`` speaks to them. */
  class Told extends Error {}

  function status(text) {
    $("join-status").textContent = text;
    $("join-status").hidden = !text;
  }

  function fail(text) {
    status("");
    $("join-error").textContent = text;
    $("join-error").hidden = !text;
    if (text) $("join-error").focus();
  }

  function label(platform) {
    const input = $(`platform-${platform}`);
    return input ? input.labels[0].firstChild.textContent.trim() : platform;
  }

  /** What a refused redemption means to the user (the answer's status and Host's words). */
  function redeemRefusal(answer) {
    const detail = answer.doc && typeof answer.doc.detail === "string" ? answer.doc.detail : "";
    if (answer.status === 404 && /\bused\b/.test(detail)) {
      return "This invitation has been used already: an invitation works once. If it was not you who used " +
        "it, tell your administrator now. To join, ask them for a new invitation.";
    }
    if (answer.status === 404 && /expired/.test(detail)) {
      return "This invitation has expired: invitations last only minutes. Ask your administrator for a new one.";
    }
    if (answer.status === 404 && /revoked/.test(detail)) {
      return "This invitation was withdrawn by your administrator. Ask them for a new one if you still need " +
        "to join.";
    }
    if (answer.status === 404) {
      return "This invitation is not known here. Open the whole link again (as it was sent to you), or ask " +
        "your administrator for a new invitation.";
    }
    const platform = /^this invitation is for ([a-z]+)/.exec(detail);
    if (answer.status === 409 && platform) {
      return `This invitation is for ${label(platform[1])}. Choose ${label(platform[1])} below and join again, ` +
        "or ask your administrator for an invitation for this kind of device.";
    }
    if (answer.status === 409) {
      return "The invited user already has keys on another device. Ask your administrator for an " +
        "invitation under another name for this device.";
    }
    if (answer.status === 403) {
      return "The server did not accept this device's request. Check that this device's date and time are " +
        "set automatically, then try again.";
    }
    if (answer.status === 429) return "Too many tries from this network. Wait a minute, then try again.";
    if (answer.status === 422) {
      return "This invitation link is damaged. Open the whole link again, or ask your administrator for a new one.";
    }
    return A.serverTrouble(answer.status, answer.reference);
  }

  /** Post a sealed agent message to Host: the answer's message, or a Told the user understands. */
  async function post(path, wire) {
    let answer;
    try {
      answer = await A.postJson(path, { message: wire });
    } catch (e) {
      throw new Told(e.message);
    }
    const detail = answer.doc && typeof answer.doc.detail === "string" ? answer.doc.detail : "";
    if (answer.ok && answer.doc && typeof answer.doc.message === "string") return answer.doc.message;
    if (answer.status === 403) {
      throw new Told("The server refused to enrol this device: the invitation allows one device, which may " +
        "be enrolled already, or this device's clock is off. Ask your administrator for a new invitation.");
    }
    if (answer.status === 409) {
      throw new Told(`No VPN settings meet what the network requires for this device: ${detail} ` +
        "Ask your administrator.");
    }
    if (answer.status === 429) throw new Told("Too many tries from this network. Wait a minute, then try again.");
    if (answer.status >= 500) throw new Told(A.serverTrouble(answer.status, answer.reference));
    throw new Told(`The server refused this device's request (${answer.status}). Ask your administrator.`);
  }

  // ------------------------------------------------------------------ the steps

  /** The platform of this browser, from its user agent: a guess the user may change. */
  function platformFromAgent(agent) {
    if (/Android/i.test(agent)) return "android";
    if (/iPhone|iPad|iPod|Macintosh|Mac OS X/i.test(agent)) return "apple";
    if (/Windows/i.test(agent)) return "windows";
    if (/Linux|X11|CrOS/i.test(agent)) return "networkmanager";
    return null;
  }

  function chosenPlatform() {
    const checked = document.querySelector('input[name="platform"]:checked');
    if (!checked) throw new Told("Choose your kind of device first.");
    return checked.value;
  }

  /** The keys this browser holds for this Host, or new ones (not yet saved). */
  async function keysForHost() {
    let kept = null;
    try {
      kept = await KEYS.loadKeys(host);
    } catch (e) {
      kept = null;
    }
    if (kept) {
      return { sign: kept.sign_private, kem: kept.kem_private, signPublic: kept.sign_public,
               kemPublic: kept.kem_public, user: kept.user_id, kept: true };
    }
    return { ...A.newKeys(), user: "", kept: false };
  }

  /** Redeem the invitation with ``keys``: the grant Host answered ({user_id, platform, objective, minimums}). */
  async function redeem(secret, keys, platform) {
    const payload = A.invitationRedemption({ host, secret, platform, keys, now: Math.floor(Date.now() / 1000) });
    let answer;
    try {
      answer = await A.postJson("/v1/agent/invitations/redeem", payload);
    } catch (e) {
      throw new Told(`${e.message} The invitation was not used.`);
    }
    if (!answer.ok || !answer.doc || typeof answer.doc.user_id !== "string" || !A.ID.test(answer.doc.user_id)) {
      throw new Told(redeemRefusal(answer));
    }
    return answer.doc;
  }

  /** Enrol the device the grant allows with ``keys``: what agent-client.js's enrolDevice returns. */
  async function enrol(keys, grant) {
    const option = $("target").selectedOptions[0];
    if (!option) throw new Told("This server names no network to join. Tell your administrator.");
    const levels = { confidentiality: 0, integrity: 0, key_exchange: 0, ...(grant.minimums || {}) };
    try {
      return await A.enrolDevice({
        keys: { sign: keys.sign, kem: keys.kem, user: grant.user_id }, host, hostKem,
        target: option.value, targetSign: A.b64d(option.dataset.signKey, 32), platform: grant.platform,
        objective: grant.objective, levels, post,
      });
    } catch (e) {
      if (e instanceof Told) throw e;
      throw new Told("The answer to this device's request could not be checked, so it was not used. " +
        "Check that this device's date and time are set automatically, then try again.");
    }
  }

  function showProfile(got) {
    for (const url of urls.splice(0)) URL.revokeObjectURL(url);
    $("join-downloads").replaceChildren(...got.files.map(([name, bytes], i) =>
      A.downloadItem(name, bytes, i === 0 ? got.mediaType : undefined, urls)));
    const how = $(`platform-${got.platform}-what`);
    $("join-how").textContent = `Download it on this device: ${how ? how.textContent.trim() : "open the profile"}.`;
    $("join-passphrase").textContent = got.passphrase;
    got.passphrase = null;
    $("join-ca").textContent = got.caFingerprint;
    const facts = [["Network", got.gatewayIdentity], ["Valid until",
      new Date(got.notAfter * 1000).toISOString().replace(".000Z", "Z")]];
    $("join-facts").replaceChildren(...facts.flatMap(([term, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = term;
      const dd = document.createElement("dd");
      dd.textContent = value;
      return [dt, dd];
    }));
    $("join-form").hidden = true;
    $("join-result").hidden = false;
    $("join-result-title").focus();
  }

  // ------------------------------------------------------------------ the page

  async function join(event) {
    event.preventDefault();
    fail("");
    const button = $("join-button");
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      if (!state.grant) {
        const platform = chosenPlatform();
        status("Making your keys on this device…");
        const keys = state.keys || await keysForHost();
        state.keys = keys;
        status("Registering your keys…");
        const grant = await redeem(state.secret, keys, platform);
        state.grant = grant;
        state.secret = null;
        history.replaceState(null, "", window.location.pathname);  // the secret is spent: out of the address bar
        try {
          await KEYS.saveKeys(host, { user_id: grant.user_id, sign_private: keys.sign, kem_private: keys.kem,
                                      sign_public: keys.signPublic, kem_public: keys.kemPublic });
        } catch (e) {
          $("storage-note").textContent = `${e.message} Your profile still works; to enrol this device again ` +
            "you will need a new invitation.";
        }
      }
      status("Getting your VPN profile…");
      const got = await enrol(state.keys, state.grant);
      status("");
      showProfile(got);
    } catch (e) {
      fail(e instanceof Told ? e.message : "Something went wrong on this page. Reload it and try again.");
      if (state.grant) button.textContent = "Try again";
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  /** Read the invitation from the link (again when only the fragment changes: another link). */
  function start() {
    const fragment = new URLSearchParams(window.location.hash.slice(1));
    const secret = fragment.get("i") || "";
    Object.assign(state, { secret: null, keys: null, grant: null });
    for (const url of urls.splice(0)) URL.revokeObjectURL(url);
    $("join-downloads").replaceChildren();
    $("join-passphrase").textContent = "";
    $("join-passphrase-box").hidden = false;
    $("join-passphrase-gone").hidden = true;
    $("join-result").hidden = true;
    fail("");
    $("join-button").textContent = "Join";
    if (!SECRET.test(secret)) {
      $("join-form").hidden = true;
      fail("This page opens from an invitation link, and this one is incomplete. Open the whole link again " +
        "(as it was sent to you), or ask your administrator for a new invitation.");
      return;
    }
    state.secret = secret;
    const guess = platformFromAgent(navigator.userAgent) || "android";
    const radio = $(`platform-${guess}`);
    if (radio) radio.checked = true;
    $("join-form").hidden = false;
    status(`Ready. This looks like ${label(guess)}: if it is not, choose yours below, then join.`);
  }

  $("join-form").addEventListener("submit", join);
  $("join-hide").addEventListener("click", () => {
    $("join-passphrase").textContent = "";
    $("join-passphrase-box").hidden = true;
    $("join-passphrase-gone").hidden = false;
  });
  window.addEventListener("pagehide", () => {
    for (const url of urls.splice(0)) URL.revokeObjectURL(url);
  });
  window.addEventListener("hashchange", start);
  window.qossJoin = { platformFromAgent, keysForHost, enrol, showProfile };
  start();
})();
