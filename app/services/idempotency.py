"""Idempotency keys: a retried POST returns the first answer instead of acting twice.

The key is reserved (status 0, committed at once, unique per token) *before* any
side effect, so a concurrent duplicate is refused with 409 instead of creating a
second tunnel; the answer is stored when the work succeeds; a failure releases the key
so the client can retry. Keys are per token: one client cannot read another's answers.
A claim whose request's process died (killed, its machine gone) is never answered nor
released; once older than a lease (``QOSS_IDEMPOTENCY_LEASE``, longer than any request
runs) a retry takes it over and runs the request again.

A retry is the same request only if every field that decides the outcome is the same,
secrets included (a peer's PSK): the :func:`fingerprint` covers the whole request, each
secret as its HMAC under this database's own random key (:func:`server_key`, made once,
never sent anywhere), so the stored fingerprint is neither the secret nor a plain hash of
it that could be checked against guesses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.errors import Conflict, InvalidInput
from app.domain.policies import Levels
from app.domain.ports import StoredAnswer, UnitOfWork, UnitOfWorkFactory
from app.domain.requests import Secret, TunnelSpec

__all__ = [
    "IdempotencyInProgress",
    "abandon",
    "begin",
    "canonical",
    "complete",
    "fingerprint",
    "server_key",
]

#: The status of a claimed key whose request has not answered yet.
_IN_PROGRESS = 0


class IdempotencyInProgress(Conflict):
    """A request with this key is still being processed."""


def server_key(uow: UnitOfWork) -> bytes:
    """This database's key for fingerprinting secrets: 32 random bytes, made by the first caller."""
    return bytes.fromhex(uow.server_keys.get_or_create("idempotency", lambda: secrets.token_hex(32)))


def _sealed(value: Any, key: bytes) -> Any:
    """``value`` as a JSON document (a value's fields as an object, a tuple as a list), with every
    secret replaced by its HMAC-SHA-256 under ``key``."""
    if isinstance(value, Secret):
        data = value.get_secret_value().encode("utf-8")
        return {"hmac-sha256": hmac.new(key, data, hashlib.sha256).hexdigest()}
    if isinstance(value, Levels):
        return value.stored()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _sealed(getattr(value, f.name), key) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _sealed(v, key) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_sealed(v, key) for v in value]
    return value


def canonical(body: TunnelSpec, *, key: bytes) -> str:
    """The request as the fingerprint reads it: every field (by its name in the request
    document, absent ones as null), each secret as its keyed hash, keys sorted. Fingerprints are
    stored with their keys: this form must not change, or a retry would not match its key
    (``tests/unit/services/test_idempotency_fingerprint.py`` pins it)."""
    document = _sealed(body, key)
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def fingerprint(body: TunnelSpec, *, key: bytes) -> str:
    """What makes two requests with one Idempotency-Key the same request (SHA-256 of :func:`canonical`)."""
    return hashlib.sha256(canonical(body, key=key).encode("utf-8")).hexdigest()


def begin(units: UnitOfWorkFactory, *, token_id: str, key: str, digest: str, lease: float) -> StoredAnswer | None:
    """Reserve ``key`` for this token (committed at once), or return the answer already stored for it.

    ``lease``: seconds after which an unanswered claim is taken to belong to a request whose
    process died, and is claimed for this one (the caller must then find out whether that
    request got as far as its effect: see :func:`app.services.tunnels.request_tunnel`).

    Raises:
        InvalidInput: the key was used with a different request body (422).
        IdempotencyInProgress: the first request with this key is still running (409).
    """
    with units() as uow:
        found = uow.idempotency.find(token_id, key)
        if found is None:
            if uow.idempotency.reserve(token_id, key, digest):
                uow.commit()
                return None
            found = uow.idempotency.find(token_id, key)
            if found is None:  # released meanwhile
                raise IdempotencyInProgress("a request with this Idempotency-Key is in progress")
        if found.request_hash != digest:
            raise InvalidInput("this Idempotency-Key was used with a different request")
        if found.status == _IN_PROGRESS:
            if uow.idempotency.take_over(token_id, key, claimed_before=datetime.now(UTC) - timedelta(seconds=lease)):
                uow.commit()
                return None
            raise IdempotencyInProgress("a request with this Idempotency-Key is in progress")
        return found


def complete(units: UnitOfWorkFactory, *, token_id: str, key: str, status: int, body: dict[str, Any]) -> None:
    """Store the answer for later retries."""
    with units() as uow:
        uow.idempotency.complete(token_id, key, status=status, body=body)
        uow.commit()


def abandon(units: UnitOfWorkFactory, *, token_id: str, key: str) -> None:
    """Release a reservation after a failure, so a retry can run."""
    with units() as uow:
        uow.idempotency.release(token_id, key)
        uow.commit()
