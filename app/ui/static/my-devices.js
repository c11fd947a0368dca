/* The user's own devices page (/ui/my-devices): the devices this user enrolled, with their state,
 * and revoking one, with the keys this browser holds for the user (phone-keys.js's loadKeys).
 *
 * For each target Host names, the page signs the agent's "devices" request with the user's Ed25519
 * key and seals it to Host's X25519 key (the same canonical body, signature and HPKE seal as every
 * agent request: agent-client.js's), posts it to /v1/agent/requests, opens the target's answer
 * with the user's X25519 key and checks the target's signature, that it answers this request, for
 * this user, via this Host, and is fresh. Revoking a device is the agent's disconnect of its ticket,
 * sent the same way once the user confirms. Every request has a time limit and a message; nothing is
 * sent to any other host; the private keys never leave this browser.
 */
(() => {
  "use strict";

  const V = window.qossVendor;
  const A = window.qossAgent;
  const TIMEOUT_MS = 15000;

  const page = document.getElementById("my-devices");
  if (!page || !V || !A) return;
  const $ = (id) => document.getElementById(id);
  const host = page.dataset.host;
  const hostKem = A.b64d(page.dataset.hostKem, 32);
  const targets = Array.from(document.querySelectorAll("#targets [data-target]"),
    (li) => ({ name: li.dataset.target, sign: A.b64d(li.dataset.signKey, 32) }));
  const labels = Object.fromEntries(Array.from(document.querySelectorAll("#platforms [data-platform]"),
    (li) => [li.dataset.platform, li.textContent.trim()]));

  /** What the user is told: a sentence for them, never an internal detail. */
  class Told extends Error {}

  // ------------------------------------------------------------------ messages

  /** A request of ``kind`` from the user to ``target`` through Host: [the request, its wire text]. */
  function request(keys, kind, target, info, objective) {
    const made = A.agentRequest({ kind, user: keys.user, host, target, objective, info,
                                  now: Math.floor(Date.now() / 1000) });
    return [made, A.seal(kind, host, made.body, keys, hostKem)];
  }

  /** The target's answer of ``kind`` to ``made``, opened and checked: its body. */
  function accept(wireText, kind, made, keys, target) {
    const answer = A.openAnswer(wireText, kind, made, keys, { host, target: target.name, targetSign: target.sign });
    if (!A.fresh(answer.ts)) {
      throw new Told("The answer's time does not match this phone's clock. Set this phone's date and time " +
                     "to be set automatically, then try again.");
    }
    return answer;
  }

  /** POST a sealed request to Host, within TIMEOUT_MS: the answer's wire text. */
  async function post(wire) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
    let answer;
    try {
      answer = await fetch("/v1/agent/requests", {
        method: "POST", headers: { "Content-Type": "application/json" }, credentials: "omit",
        cache: "no-store", body: JSON.stringify({ message: wire }), signal: abort.signal,
      });
    } catch (e) {
      throw new Told(abort.signal.aborted
        ? `${host} did not answer within ${TIMEOUT_MS / 1000} seconds. Check this phone's connection and try again.`
        : `${host} cannot be reached. Check this phone's connection (Wi-Fi or mobile data) and try again.`);
    } finally {
      clearTimeout(timer);
    }
    if (answer.status === 403) {
      throw new Told(`${host} did not accept this request. Check that this phone's date and time are set ` +
                     "automatically; if they are, your keys may have been revoked: ask your administrator for a " +
                     "new invitation.");
    }
    if (answer.status === 429) throw new Told("Too many requests from here: wait a minute, then try again.");
    if (!answer.ok) {
      throw new Told(`${host} could not ask the network's gateway just now. Try again in a few minutes; if it ` +
                     "keeps failing, tell your administrator.");
    }
    try {
      return (await answer.json()).message;
    } catch (e) {
      throw new Told(`${host}'s answer was cut short. Check this phone's connection and try again.`);
    }
  }

  async function ask(keys, kind, target, info, objective, answerKind) {
    const [made, wire] = request(keys, kind, target.name, info, objective);
    const text = await post(wire);
    try {
      return accept(text, answerKind, made, keys, target);
    } catch (e) {
      if (e instanceof Told) throw e;
      throw new Told(`The answer did not come from ${target.name} for this phone, so it was not used. Try ` +
                     "again; if this keeps happening, tell your administrator.");
    }
  }

  // ------------------------------------------------------------------ the keys

  /** The user's keys this browser holds for this Host: {user, sign, kem} (private, 32 bytes each), or null. */
  async function keysHere() {
    const store = window.qossPhoneKeys;
    if (!store || typeof store.loadKeys !== "function") return null;
    const found = await store.loadKeys(host);
    if (!found) return null;
    const raw = (v) => (typeof v === "string" ? A.b64d(v, 32) : new Uint8Array(v));
    return { user: found.user_id, sign: raw(found.sign_private), kem: raw(found.kem_private) };
  }

  // ------------------------------------------------------------------ the page

  const STATES = {
    active: "Active: it can connect.",
    stale: "Stale: its profile no longer meets the network's requirements. Enrol it again.",
    revoked: "Revoked: it cannot connect any more.",
    expired: "Expired: its certificate's time is up. Enrol it again.",
    ended: "Ended: it cannot connect any more. Enrol it again.",
  };
  let keys = null;
  let pending = null;  // the device whose revoke awaits confirmation
  let opener = null;

  function status(text) {
    $("devices-status").textContent = text;
    $("devices-status").hidden = !text;
  }

  function say(text) {
    $("devices-error").textContent = text;
    $("devices-error").hidden = !text;
  }

  function when(ts) {
    return new Date(ts * 1000).toLocaleString();
  }

  function row(device) {
    const li = document.createElement("li");
    li.className = "device-item";
    li.id = `device-${device.ticket}`;
    li.dataset.state = device.state;
    const title = document.createElement("h3");
    title.textContent = labels[device.platform] || device.platform;
    const state = document.createElement("p");
    state.className = `state state-${device.state}`;
    state.textContent = STATES[device.state] || device.state;
    const facts = document.createElement("p");
    facts.className = "muted";
    facts.textContent = `Enrolled ${when(device.created)} at ${device.target}` +
      (device.ended ? `; ended ${when(device.ended)}` : `; certificate valid until ${when(device.expires)}`) +
      ` · device ${device.ticket.slice(0, 8)}`;
    li.append(title, state, facts);
    if (device.reason && device.state !== "active") {
      const why = document.createElement("p");
      why.className = "muted";
      why.textContent = `Why: ${device.reason}`;
      li.append(why);
    }
    if (device.state === "active") {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "danger revoke";
      button.textContent = "Revoke";
      button.setAttribute("aria-label", `Revoke ${title.textContent} (device ${device.ticket.slice(0, 8)})`);
      button.addEventListener("click", () => confirmRevoke(device, button, title.textContent));
      li.append(button);
    }
    return li;
  }

  async function list() {
    say("");
    status("Asking the network for your devices…");
    $("refresh").disabled = true;
    const devices = [];
    const failed = [];
    for (const target of targets) {
      try {
        const answer = await ask(keys, "devices", target, {}, 3, "device-list");
        for (const d of answer.devices || []) devices.push({ ...d, target: target.name });
      } catch (e) {
        failed.push(e instanceof Told ? e.message : "Something went wrong on this page. Reload it and try again.");
      }
    }
    $("refresh").disabled = false;
    devices.sort((a, b) => b.created - a.created);
    $("device-list").replaceChildren(...devices.map(row));
    if (!devices.length && !failed.length) {
      const none = document.createElement("li");
      none.id = "device-none";
      none.textContent = "You have no devices enrolled.";
      $("device-list").append(none);
    }
    $("devices").hidden = false;
    status(failed.length ? "" : `${devices.filter((d) => d.state === "active").length} of your devices can connect.`);
    if (failed.length) say(failed[0]);
  }

  function confirmRevoke(device, button, label) {
    pending = device;
    opener = button;
    $("confirm-what").textContent = `${label} (device ${device.ticket.slice(0, 8)}) loses its VPN connection now ` +
      "and can never connect again with its profile. To use it again, you will need a new invitation.";
    $("confirm").hidden = false;
    $("confirm-revoke").focus();
  }

  function closeConfirm() {
    $("confirm").hidden = true;
    pending = null;
    if (opener && document.contains(opener)) opener.focus();
    opener = null;
  }

  async function revoke() {
    const device = pending;
    if (!device) return;
    const target = targets.find((t) => t.name === device.target);
    $("confirm-revoke").disabled = true;
    status("Revoking the device…");
    try {
      await ask(keys, "disconnect", target, { ticket: device.ticket }, device.objective_id, "closed");
      $("confirm").hidden = true;
      pending = null;
      opener = null;
      await list();
      status("The device is revoked: its connection has ended and it cannot connect again.");
      $("devices-title").focus();
    } catch (e) {
      status("");
      say(e instanceof Told ? e.message : "Something went wrong on this page. Reload it and try again.");
    } finally {
      $("confirm-revoke").disabled = false;
    }
  }

  $("refresh").addEventListener("click", () => list());
  $("confirm-revoke").addEventListener("click", () => revoke());
  $("confirm-keep").addEventListener("click", () => closeConfirm());
  $("confirm").addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeConfirm();
  });

  (async () => {
    try {
      keys = await keysHere();
    } catch (e) {
      keys = null;
    }
    if (!keys) {
      status("");
      $("no-keys").hidden = false;
      $("no-keys-title").focus();
      return;
    }
    await list();
  })();
})();
