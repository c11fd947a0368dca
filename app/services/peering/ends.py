"""This side's ends of its peered tunnels, as both roles and moves find and keep them: the record of
a tunnel carried with a peer, what a record keeps of a post-quantum preshared key, and the
backstop for loads a process may not live to release (:class:`PendingPort`), and a record forgotten."""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Mapping
from typing import Any

from app.domain.errors import NotFound
from app.domain.peering import Peer
from app.domain.ports import UnitOfWorkFactory
from app.domain.tunnels import Gateway, TunnelRecord

__all__ = ["NoPending", "PendingPort", "carried", "ppk_kept", "unrecord"]


class PendingPort(typing.Protocol):
    """Loads that end by themselves unless released (``app.adapters.pending_loads``): the
    backstop for a responder's process killed between its load and the initiator's confirm
    (with ``restore``, a move's: the conn it replaced is loaded back)."""

    def hold(self, *, socket_path: str, conn: str, until: float, restore: Mapping[str, Any] | None = None) -> None: ...

    def release(self, conn: str) -> None: ...


class NoPending:
    """No backstop: a load is held by nothing but this process."""

    def hold(self, *, socket_path: str, conn: str, until: float, restore: Mapping[str, Any] | None = None) -> None:
        pass

    def release(self, conn: str) -> None:
        pass


def carried(units: UnitOfWorkFactory, peer: Peer, tunnel_id: str) -> tuple[TunnelRecord, Gateway]:
    """This side's record of ``tunnel_id``, a tunnel it carries with ``peer``, and its gateway.

    Raises:
        NotFound: no such tunnel here, or not one with ``peer``.
    """
    with units() as reads:
        record = reads.tunnels.get(tunnel_id)
        if record.peer is None or record.peer.site != peer.name:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return record, reads.gateways.get(record.initiator)


def ppk_kept(ppk: tuple[str, bytes] | None) -> dict[str, str]:
    """What a record keeps of a tunnel's post-quantum preshared key: its id (never the key)."""
    return {"ppk_id": ppk[0]} if ppk is not None else {}


def unrecord(units: UnitOfWorkFactory, record: TunnelRecord, detail: str = "") -> None:
    """Forget ``record`` (if it is still kept here), with an event saying why."""
    with units() as uow, contextlib.suppress(NotFound):
        uow.tunnels.delete(record.id)
        uow.events.append("tunnel.deleted", record.id, {"detail": detail} if detail else {},
                          scope="tunnels:read")
        uow.commit()
