"""The live event log: what a token may see of it, from a point on; and who may follow it.

A stream is followed by a token (``GET /v1/events``) or by a console session and its token
(``/ui/events``). Its follower is checked again at every look at the log (:func:`stream_scopes`),
so revoking the token, its expiry or signing the session out ends the stream; and a process
follows at most so many streams, of one token at most so many (:class:`StreamSlots`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.auth import Unauthenticated
from app.domain.errors import QossError
from app.domain.ports import UnitOfWork
from app.domain.ratelimit import Overloaded, RateLimited

__all__ = [
    "FollowerGone",
    "StreamFollower",
    "StreamSlots",
    "TooManyStreams",
    "events_after",
    "kinds_after",
    "last_event_id",
    "prune_events",
    "stream_scopes",
    "visible_scopes",
]


def visible_scopes(scopes: Collection[str]) -> frozenset[str] | None:
    """The event scopes a token with ``scopes`` sees (None: all of them, for ``admin``)."""
    return None if "admin" in scopes else frozenset(scopes)


def events_after(uow: UnitOfWork, last_id: int, scopes: Collection[str] | None, limit: int = 500
                 ) -> list[dict[str, Any]]:
    """Events newer than ``last_id``, oldest first, that ``scopes`` may see."""
    return uow.events.after(last_id, scopes=scopes, limit=limit)


def kinds_after(uow: UnitOfWork, last_id: int, kinds: Collection[str], limit: int = 1000
                ) -> tuple[list[dict[str, Any]], int]:
    """The events of ``kinds`` newer than ``last_id``, oldest first (at most ``limit``), and the
    id to look after next time: the log's newest when this looked, unless the page was full.
    Events of other kinds are passed over in the database, not read."""
    newest = uow.events.last_id()
    page = uow.events.after(last_id, scopes=None, kinds=kinds, limit=limit)
    # Read after the newest id: an event that came in between is left for the next look.
    kept = [e for e in page if int(e["id"]) <= newest]
    if len(kept) == limit:
        return kept, int(kept[-1]["id"])
    return kept, max(newest, last_id)


def last_event_id(uow: UnitOfWork) -> int:
    return uow.events.last_id()


def prune_events(uow: UnitOfWork, keep_days: float) -> int:
    """Forget events older than ``keep_days`` days; how many."""
    return uow.events.prune(datetime.now(UTC) - timedelta(days=keep_days))


@dataclass(frozen=True)
class StreamFollower:
    """Who follows a stream: a token, or a console session (the hash of its id) of a token or of
    the identity provider's user (``token_id`` then the session's holder, ``oidc:<subject>``)."""

    token_id: str
    session_hash: str | None = None


class FollowerGone(Unauthenticated):
    """The follower of a stream may no longer read it: the token was revoked or has expired,
    or the console session has ended. ``reason`` says which (it names no secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


def stream_scopes(uow: UnitOfWork, follower: StreamFollower, now: datetime | None = None) -> frozenset[str] | None:
    """The event scopes ``follower`` may see now, from its token as stored (None: all, for ``admin``).

    Raises:
        FollowerGone: the console session has ended or expired, or the token was revoked or has expired.
    """
    at = now or datetime.now(UTC)
    if follower.session_hash is not None:
        session = uow.sessions.find(follower.session_hash)
        if session is None or session.holder != follower.token_id:
            raise FollowerGone("the console session has ended")
        if not session.live(at):
            raise FollowerGone("the console session has expired")
        if session.token_id is None:  # the identity provider's user: the scopes their mapping gave
            return visible_scopes(session.scopes or frozenset())
    token = uow.tokens.find(follower.token_id)
    if token is None or token.revoked_at is not None:
        raise FollowerGone("the token was revoked")
    if not token.usable(at):
        raise FollowerGone("the token has expired")
    return visible_scopes(token.scopes)


class TooManyStreams(RateLimited):
    """This token follows as many event streams as one token may (429): one must end first."""

    def __init__(self, cap: int, retry_after: int = 5) -> None:
        QossError.__init__(self, f"this token follows {cap} event streams already, the most one token may "
                                 f"(max_event_streams_per_token = {cap}): close one, then retry")
        self.retry_after = retry_after


class StreamSlots:
    """The event streams one process follows, in all and of each token.

    Used on the event loop only (no lock): a check and the taking of a place have no ``await``
    between them. A place is given back by the function :meth:`take` returns (once, however
    often it is called).
    """

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def held(self, token_id: str) -> int:
        """The streams ``token_id`` follows now."""
        return self._held.get(token_id, 0)

    def check(self, token_id: str, *, total: int, per_token: int) -> None:
        """Whether a stream of ``token_id`` would find a place.

        Raises:
            TooManyStreams: the token follows ``per_token`` streams already (429).
            Overloaded: the process follows ``total`` streams already (503).
        """
        if self.held(token_id) >= per_token:
            raise TooManyStreams(per_token)
        if self._total >= total:
            raise Overloaded("the service follows as many event streams as it may: retry shortly")

    def take(self, token_id: str, *, total: int, per_token: int) -> Callable[[], None]:
        """A place for a stream of ``token_id``; the function that gives it back.

        Raises:
            TooManyStreams: the token follows ``per_token`` streams already (429).
            Overloaded: the process follows ``total`` streams already (503).
        """
        self.check(token_id, total=total, per_token=per_token)
        self._held[token_id] = self.held(token_id) + 1
        self._total += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self._total -= 1
            left = self._held[token_id] - 1
            if left:
                self._held[token_id] = left
            else:
                del self._held[token_id]

        return give_back
