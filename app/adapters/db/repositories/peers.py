"""Peers (other qoss services) and the nonces of their messages."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.models import PeerNonceRow, PeerRow, utcnow
from app.domain.agent import MLKEM_PUBLIC_BYTES, b64d, b64e
from app.domain.errors import AlreadyExists, NotFound
from app.domain.peering import Peer, PeerState
from app.domain.policies import Levels

__all__ = ["PRUNE_EVERY", "PeerRepository"]

#: Seconds between two prunings of the nonces past their time, per process.
PRUNE_EVERY = 5.0
_next_prune = 0.0


def _peer(row: PeerRow) -> Peer:
    return Peer(name=row.name, url=row.url, sign_key=b64d(row.sign_key, size=32), kem_key=b64d(row.kem_key, size=32),
                gateways=tuple(row.gateways), networks=tuple(row.networks),
                min_levels=Levels.from_dict(row.min_levels), state=PeerState(row.state),
                created_at=row.created_at.isoformat(), updated_at=row.updated_at.isoformat(),
                mlkem_key=b64d(row.mlkem_key, size=MLKEM_PUBLIC_BYTES) if row.mlkem_key is not None else None)


class PeerRepository:
    """Registered peers; flushes, never commits."""

    def __init__(self, session: Session) -> None:
        self.session = session

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
        return _peer(row)

    def get(self, name: str) -> Peer:
        """One peer.

        Raises:
            NotFound: none of that name.
        """
        return _peer(self._row(name))

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
        try:
            with self.session.begin_nested():
                self.session.execute(insert(PeerNonceRow).values(peer=peer, nonce=nonce, expires_at=keep_until))
        except IntegrityError:
            return False
        return True
