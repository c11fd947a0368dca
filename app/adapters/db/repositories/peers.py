"""Peers (other qoss services) and the nonces of their messages.

A peer is read on every message it sends and every tunnel asked of it: its registration is kept
in the process's :class:`PeerCache` (the session factory's, as the gateways' and tokens' are),
forgotten by this repository's own writes at once and by another replica's within the cache's
TTL (at once on PostgreSQL, by its change notice).
"""

from __future__ import annotations

import builtins
import time
from datetime import UTC, datetime

from sqlalchemy import delete, event, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.hot import session_insert_new
from app.adapters.db.models import PeerNonceRow, PeerRow, PeerTeardownRow, utcnow
from app.adapters.db.notices import publish
from app.adapters.db.read_cache import ReadCache
from app.domain.agent import MLKEM_PUBLIC_BYTES, b64d, b64e
from app.domain.errors import AlreadyExists, NotFound
from app.domain.peering import Peer, PeerState, UnheardTeardown
from app.domain.policies import Levels

__all__ = ["PEER_CACHE", "PRUNE_EVERY", "PeerCache", "PeerRepository"]

#: Where a session factory's ``info`` holds the process's :class:`PeerCache`.
PEER_CACHE = "qoss.peer_cache"

#: Seconds between two prunings of the nonces past their time, per process.
PRUNE_EVERY = 5.0
_next_prune = 0.0


def _peer(row: PeerRow) -> Peer:
    return Peer(name=row.name, url=row.url, sign_key=b64d(row.sign_key, size=32), kem_key=b64d(row.kem_key, size=32),
                gateways=tuple(row.gateways), networks=tuple(row.networks),
                min_levels=Levels.from_dict(row.min_levels), state=PeerState(row.state),
                created_at=row.created_at.isoformat(), updated_at=row.updated_at.isoformat(),
                mlkem_key=b64d(row.mlkem_key, size=MLKEM_PUBLIC_BYTES) if row.mlkem_key is not None else None)


_CHANGED = "qoss.peers_changed"


def _forget_changed(session: Session) -> None:
    cache: PeerCache | None = session.info.get(PEER_CACHE)
    for name in session.info.pop(_CHANGED, ()):
        if cache is not None:
            cache.forget(name)


class PeerCache(ReadCache[str, Peer]):
    """Registered peers by name (:class:`~app.adapters.db.read_cache.ReadCache`): a peer's message
    and a tunnel asked of a peer normally read none."""


class PeerRepository:
    """Registered peers; flushes, never commits."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session``; its factory's :class:`PeerCache`, if it has one, spares reads."""
        self.session = session
        self._cache: PeerCache | None = session.info.get(PEER_CACHE)

    def _changed(self, name: str) -> None:
        """This session wrote ``name``: forgotten now and again when it commits (a read another
        session made between the change and its commit may have kept the peer before)."""
        publish(self.session, "peer", name)
        if self._cache is None:
            return
        self._cache.forget(name)
        changed: set[str] | None = self.session.info.get(_CHANGED)
        if changed is None:
            changed = self.session.info[_CHANGED] = set()
            event.listen(self.session, "after_commit", _forget_changed, once=True)
        changed.add(name)

    def _row(self, name: str) -> PeerRow:
        row = self.session.get(PeerRow, name)
        if row is None:
            raise NotFound(f"peer {name!r} does not exist")
        return row

    def create(self, peer: Peer) -> Peer:
        """Register ``peer``.

        Raises:
            AlreadyExists: a peer of that name exists (nothing is written).
        """
        if self.session.get(PeerRow, peer.name) is not None:
            raise AlreadyExists(f"peer {peer.name!r} exists already")
        now = utcnow()
        row = PeerRow(name=peer.name, url=peer.url, sign_key=b64e(peer.sign_key), kem_key=b64e(peer.kem_key),
                      mlkem_key=b64e(peer.mlkem_key) if peer.mlkem_key is not None else None,
                      gateways=list(peer.gateways), networks=list(peer.networks),
                      min_levels=peer.min_levels.as_dict(), state=peer.state.value, created_at=now, updated_at=now)
        try:
            with self.session.begin_nested():
                self.session.add(row)
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"peer {peer.name!r} exists already") from exc
        self._changed(peer.name)
        return _peer(row)

    def get(self, name: str) -> Peer:
        """One peer.

        Raises:
            NotFound: none of that name.
        """
        cached = self._cache.fresh(name) if self._cache is not None else None
        if cached is not None:
            return cached
        peer = _peer(self._row(name))
        if self._cache is not None:
            self._cache.keep(name, peer)
        return peer

    def list(self) -> list[Peer]:
        return [_peer(r) for r in self.session.scalars(select(PeerRow).order_by(PeerRow.name))]

    def set_state(self, name: str, state: PeerState) -> Peer:
        """``name``'s state changed.

        Raises:
            NotFound: none of that name.
        """
        row = self._row(name)
        row.state, row.updated_at = state.value, utcnow()
        self.session.flush()
        self._changed(name)
        return _peer(row)

    def first_sight(self, peer: str, nonce: str, *, keep_until: datetime) -> bool:
        """Whether ``peer``'s ``nonce`` is seen here for the first time (it is then kept until
        ``keep_until``); False: a replay. Nonces past their time are dropped on the way, at most
        once every :data:`PRUNE_EVERY` seconds per process (a message that old is refused as not
        fresh before its nonce is looked at)."""
        global _next_prune
        if time.monotonic() >= _next_prune:
            _next_prune = time.monotonic() + PRUNE_EVERY
            self.session.execute(delete(PeerNonceRow).where(PeerNonceRow.expires_at < datetime.now(UTC)))
        # One statement, no savepoint: a nonce seen before inserts nothing (the key decides, across replicas).
        return session_insert_new(self.session, PeerNonceRow, {"peer": peer, "nonce": nonce, "expires_at": keep_until})

    def keep_unheard(self, teardown: UnheardTeardown) -> None:
        """Keep (or replace) a teardown ``teardown.peer`` did not hear; another replica keeping
        the same one at the same moment makes this a replacement of it."""
        def row() -> PeerTeardownRow:
            return PeerTeardownRow(peer=teardown.peer, tunnel_id=teardown.tunnel_id, reason=teardown.reason,
                                   first_at=teardown.first_at, attempts=teardown.attempts, next_at=teardown.next_at)
        try:
            with self.session.begin_nested():
                self.session.merge(row())
                self.session.flush()
        except IntegrityError:  # inserted by another replica since merge looked: now there to replace
            self.session.merge(row())
            self.session.flush()

    def unheard_due(self, now: datetime, limit: int) -> builtins.list[UnheardTeardown]:
        """Up to ``limit`` kept teardowns due by ``now``, the longest due first (on the ``next_at`` index)."""
        rows = self.session.scalars(select(PeerTeardownRow).where(PeerTeardownRow.next_at <= now)
                                    .order_by(PeerTeardownRow.next_at).limit(limit))
        return [UnheardTeardown(peer=r.peer, tunnel_id=r.tunnel_id, reason=r.reason, first_at=r.first_at,
                                attempts=r.attempts, next_at=r.next_at) for r in rows]

    def unheard_counts(self) -> dict[str, int]:
        """How many kept teardowns each peer has not heard yet: one grouped count."""
        rows = self.session.execute(select(PeerTeardownRow.peer, func.count()).group_by(PeerTeardownRow.peer))
        return {peer: int(count) for peer, count in rows}

    def heard(self, peer: str, tunnel_id: str) -> None:
        """Forget the teardown of ``tunnel_id`` kept for ``peer`` (none kept: nothing changes)."""
        self.session.execute(delete(PeerTeardownRow).where(PeerTeardownRow.peer == peer,
                                                           PeerTeardownRow.tunnel_id == tunnel_id))
