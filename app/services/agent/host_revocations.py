"""Host's revocations of users, until each Target confirms them.

Revoking a user at Host is recorded, in the same transaction, as one *pending* revocation per
Target (:class:`~app.domain.agent.ports.PendingRevocationStore`: durable, in Host's database).
Each is sent at once; a Target that answers with its count confirms it and the pending row is
forgotten. One that does not (down, unreachable, refusing) is sent again by :meth:`Revocations.retry`
(run by the server's sweeper every few seconds): after :data:`RETRY_FIRST` seconds, then twice as
long each time, never more than :data:`RETRY_MAX` apart, until it is confirmed. Target records a
revocation once however often it is sent, so a repeat is harmless.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from app.domain.agent import Kind, Revocation
from app.domain.agent.ports import AgentKeys, AgentStore, PeerKeys, PendingRevocation, Post
from app.domain.errors import QossError
from app.domain.retry import doubling_delay

__all__ = ["RETRY_FIRST", "RETRY_MAX", "RevocationTarget", "Revocations", "retry_delay"]

log = logging.getLogger("qoss.agent.host")

#: Seconds before an unconfirmed revocation is sent again the first time; it doubles each time.
RETRY_FIRST = 5.0
#: The longest wait between two attempts, in seconds.
RETRY_MAX = 300.0


def retry_delay(attempts: int) -> float:
    """Seconds until the next attempt after ``attempts`` failed ones (at least one)."""
    return doubling_delay(attempts, first=RETRY_FIRST, most=RETRY_MAX)


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True, slots=True)
class RevocationTarget:
    """A Target a revocation goes to: its id, url (``local``: this process) and public keys."""

    name: str
    url: str
    keys: PeerKeys


class Revocations:
    """Sends Host's revocations to its Targets and keeps those not confirmed yet.

    Args:
        keys: Host's own keys (a revocation is signed by Host and sealed to its Target).
        targets: the Targets Host trusts, by id.
        store: Host's state (the pending revocations).
        post: sends a message to a remote Target; ``local``: the Target role of this process
            (its ``revoke`` taking the wire bytes), for a target whose url is ``local``.
    """

    def __init__(self, *, keys: AgentKeys, targets: Mapping[str, RevocationTarget], store: AgentStore, post: Post,
                 local: Callable[[bytes], bytes] | None = None, clock: Callable[[], float] = time.time) -> None:
        self._keys = keys
        self._targets = targets
        self._store = store
        self._post = post
        self._local = local
        self._clock = clock

    def revoked(self, user_id: str, sign_public_key: bytes) -> dict[str, str]:
        """Tell every Target that ``user_id`` (whose key is ``sign_public_key``) is revoked: the
        pending revocations were recorded with the user's revocation; each is sent now. What each
        Target answered (``confirmed: ...``, or ``not confirmed: ...`` and when it is sent again)."""
        return {name: self._send(target, user_id, sign_public_key, attempt=1)
                for name, target in self._targets.items()}

    def pending(self, user_id: str) -> list[PendingRevocation]:
        """``user_id``'s revocations not confirmed yet, by target."""
        with self._store.unit() as uow:
            return uow.pending_revocations.of_user(user_id)

    def retry(self, *, limit: int = 100) -> list[str]:
        """Send again the revocations whose next attempt is due (at most ``limit``); each is first
        put off to its next attempt, so another process sharing Host's database leaves it be
        meanwhile (two that read it at the same moment both send it: Target records it once).
        Those of a target no longer configured are given up. Once a target fails, the rest of its
        due revocations wait for their next attempt (a target that does not answer costs one
        timeout a round, not one per user). Returns ``user@target`` of those confirmed now."""
        now = self._clock()
        with self._store.unit() as uow:
            due = uow.pending_revocations.due(_at(now), limit)
            for p in due:
                if p.target_id in self._targets:
                    uow.pending_revocations.postpone(p.target_id, p.user_id, attempts=p.attempts + 1,
                                                     next_attempt_at=_at(now + retry_delay(p.attempts + 1)),
                                                     error=p.last_error)
                else:
                    log.warning("revocation of %s for target %s given up: the target is no longer configured",
                                p.user_id, p.target_id)
                    uow.pending_revocations.forget(p.target_id, p.user_id)
            uow.commit()
        confirmed, failed = [], set()
        for p in due:
            target = self._targets.get(p.target_id)
            if target is None or target.name in failed:
                continue  # a target that just failed is not waited for again this round: its turn comes
            if self._send(target, p.user_id, p.sign_public_key, attempt=p.attempts + 1).startswith("confirmed"):
                confirmed.append(f"{p.user_id}@{p.target_id}")
            else:
                failed.add(target.name)
        return confirmed

    def _send(self, target: RevocationTarget, user_id: str, sign_public_key: bytes, *, attempt: int) -> str:
        """Attempt number ``attempt``: a fresh revocation (new nonce and timestamp) sent to
        ``target``; confirmed, its pending row is forgotten, else the failure is kept with the
        next attempt's time."""
        revocation = Revocation(host=self._keys.name, target=target.name, nonce=secrets.token_bytes(16),
                                timestamp=int(self._clock()), user_id=user_id, sign_public_key=sign_public_key)
        wire = self._keys.seal(kind=Kind.REVOKE, to=target.name, body=revocation.body(), recipient=target.keys.kem,
                               recipient_mlkem=target.keys.mlkem)
        try:
            if target.url == "local" and self._local is not None:
                answer = self._local(wire)
            else:
                answer = self._post(f"{target.url}/v1/agent/target/revocations", wire)
            closed = int(answer.decode() or 0)
        except (QossError, ValueError, OSError) as exc:
            reason = exc.message if isinstance(exc, QossError) else "malformed answer or no answer"
            delay = retry_delay(attempt)
            with self._store.unit() as uow:
                uow.pending_revocations.postpone(target.name, user_id, attempts=attempt,
                                                 next_attempt_at=_at(self._clock() + delay), error=reason)
                uow.commit()
            log.warning("revocation of %s not confirmed by target %s (attempt %d): %s; sent again in %g s",
                        user_id, target.name, attempt, reason, delay)
            return f"not confirmed: {reason}; sent again in {delay:g} s"[:200]
        with self._store.unit() as uow:
            uow.pending_revocations.confirm(target.name, user_id, sign_public_key)
            uow.commit()
        if attempt > 1:
            log.info("revocation of %s confirmed by target %s at attempt %d", user_id, target.name, attempt)
        return f"confirmed: {closed} tunnels closed"
