/* The user's keys on a phone: kept in this browser's IndexedDB for this site, one record per Host.
 *
 * The join page (/ui/join) makes the user's Ed25519 and X25519 keys in the browser and saves them
 * here; another page of the same origin (the user's own devices page) loads them to sign its
 * requests. The private keys never leave the browser: no page sends them, and IndexedDB is this
 * origin's alone. Clearing the browser's data for the site (or a private window's end) forgets
 * them: the phone then enrols again from a new invitation.
 *
 * window.qossPhoneKeys:
 *   saveKeys(hostId, record)  record = {user_id, sign_private, kem_private, sign_public, kem_public}
 *                             (raw Uint8Array, 32 bytes each); replaces what was kept for hostId.
 *   loadKeys(hostId)          -> that record (Uint8Arrays again), or null.
 *   forgetKeys(hostId)        forgets it.
 * Each returns a promise, rejected (with an Error whose message speaks to the user) when this
 * browser keeps nothing for the site (storage switched off, or a private window that refuses it).
 */
(() => {
  "use strict";

  const DATABASE = "qoss-phone-keys";
  const STORE = "keys";
  const FIELDS = ["sign_private", "kem_private", "sign_public", "kem_public"];
  const UNAVAILABLE = "This browser does not keep data for this site (private browsing, or site data " +
    "switched off), so it cannot keep your keys.";

  function opened() {
    return new Promise((resolve, reject) => {
      let request;
      try {
        request = window.indexedDB.open(DATABASE, 1);
      } catch (e) {
        reject(new Error(UNAVAILABLE));
        return;
      }
      request.onupgradeneeded = () => request.result.createObjectStore(STORE);
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(new Error(UNAVAILABLE));
      request.onblocked = () => reject(new Error("Close this site's other tabs and try again."));
    });
  }

  /** Run ``work(store)`` in one transaction; resolves with what its last request gave. */
  async function inStore(mode, work) {
    const db = await opened();
    try {
      return await new Promise((resolve, reject) => {
        const transaction = db.transaction(STORE, mode);
        const request = work(transaction.objectStore(STORE));
        transaction.oncomplete = () => resolve(request.result);
        transaction.onerror = () => reject(new Error(UNAVAILABLE));
        transaction.onabort = () => reject(new Error(UNAVAILABLE));
      });
    } finally {
      db.close();
    }
  }

  function checked(record) {
    if (!record || typeof record.user_id !== "string" || !/^[a-z0-9][a-z0-9._-]{0,62}$/.test(record.user_id)) {
      return null;
    }
    const out = { user_id: record.user_id };
    for (const field of FIELDS) {
      const value = record[field];
      if (!(value instanceof Uint8Array) || value.length !== 32) return null;
      out[field] = new Uint8Array(value);
    }
    return out;
  }

  async function saveKeys(hostId, record) {
    const kept = checked(record);
    if (!kept) throw new Error("These are not a user's keys.");
    await inStore("readwrite", (store) => store.put({ ...kept, saved_at: Date.now() }, String(hostId)));
  }

  async function loadKeys(hostId) {
    return checked(await inStore("readonly", (store) => store.get(String(hostId))));
  }

  async function forgetKeys(hostId) {
    await inStore("readwrite", (store) => store.delete(String(hostId)));
  }

  window.qossPhoneKeys = { saveKeys, loadKeys, forgetKeys };
})();
