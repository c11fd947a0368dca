"""Registered gateways and the tunnels between them. Repositories flush, never commit."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Table,
    and_,
    bindparam,
    delete,
    false,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.adapters.db.hot import HotStatement, bare, session_cursor
from app.adapters.db.models import GatewayRow, TunnelRow, utcnow
from app.adapters.db.notices import publish
from app.adapters.db.read_cache import ReadCache
from app.domain.errors import AlreadyExists, Conflict, NotFound
from app.domain.tunnels import TRANSITIONS, Gateway, PeerEnd, TunnelRecord, TunnelState, check_transition

__all__ = ["GATEWAY_CACHE", "GatewayCache", "GatewayRepository", "TunnelRepository"]

#: Where a session factory's ``info`` holds the process's :class:`GatewayCache`.
GATEWAY_CACHE = "qoss.gateway_cache"


class GatewayCache(ReadCache[str, Gateway]):
    """Registered gateways by name (:class:`~app.adapters.db.read_cache.ReadCache`): a tunnel's
    set-up and teardown normally read none."""


def _gateway(row: GatewayRow) -> Gateway:
    return Gateway(
        name=row.name, vici_socket=row.vici_socket, ike_address=row.ike_address, identity=row.identity,
        inside_networks=tuple(row.inside_networks), backend=row.backend, version=row.version,
        algorithms=frozenset(row.algorithms),
    )


class GatewayRepository:
    """Registered strongSwan gateways."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session`` (committed by the caller, never here); its factory's
        :class:`GatewayCache`, if it has one, spares reads."""
        self.session = session
        self._cache: GatewayCache | None = session.info.get(GATEWAY_CACHE)

    def _row(self, name: str) -> GatewayRow:
        row = self.session.scalar(select(GatewayRow).where(GatewayRow.name == name))
        if row is None:
            raise NotFound(f"gateway {name!r} does not exist")
        return row

    def create(self, gateway: Gateway) -> None:
        """Register a gateway.

        Raises:
            AlreadyExists: A gateway of that name exists (nothing is written).
        """
        if self.session.scalar(select(GatewayRow.id).where(GatewayRow.name == gateway.name)) is not None:
            raise AlreadyExists(f"gateway {gateway.name!r} exists already")
        try:
            with self.session.begin_nested():
                self.session.add(GatewayRow(
                    name=gateway.name, vici_socket=gateway.vici_socket, ike_address=gateway.ike_address,
                    identity=gateway.identity, inside_networks=list(gateway.inside_networks),
                    backend=gateway.backend, version=gateway.version, algorithms=sorted(gateway.algorithms),
                ))
                self.session.flush()
        except IntegrityError as exc:
            raise AlreadyExists(f"gateway {gateway.name!r} exists already") from exc
        self._changed(gateway.name)

    def get(self, name: str) -> Gateway:
        """One gateway.

        Raises:
            NotFound: No such gateway.
        """
        cached = self._cache.fresh(name) if self._cache is not None else None
        if cached is not None:
            return cached
        return self._kept(_gateway(self._row(name)))

    def _kept(self, gateway: Gateway) -> Gateway:
        if self._cache is not None:
            self._cache.keep(gateway.name, gateway)
        return gateway

    def _changed(self, name: str) -> None:
        publish(self.session, "gateway", name)
        if self._cache is not None:
            self._cache.forget(name)

    def get_many(self, names: Collection[str]) -> dict[str, Gateway]:
        """The gateways of ``names``, by name, in one statement (none for those cached).

        Raises:
            NotFound: one of them does not exist (the first such in ``names``).
        """
        found: dict[str, Gateway] = {}
        if self._cache is not None:
            found = {n: g for n in set(names) if (g := self._cache.fresh(n)) is not None}
        missing = sorted(set(names) - set(found))
        if missing:
            rows = self.session.scalars(select(GatewayRow).where(GatewayRow.name.in_(missing)))
            found.update({row.name: self._kept(_gateway(row)) for row in rows})
        for name in names:
            if name not in found:
                raise NotFound(f"gateway {name!r} does not exist")
        return found

    def list(self) -> list[Gateway]:
        """Every gateway, by name."""
        return [_gateway(r) for r in self.session.scalars(select(GatewayRow).order_by(GatewayRow.name))]

    def update(self, gateway: Gateway) -> None:
        """Store what was read from a gateway: back end, version, algorithms.

        Raises:
            NotFound: No such gateway.
        """
        row = self._row(gateway.name)
        row.backend, row.version = gateway.backend, gateway.version
        row.algorithms = sorted(gateway.algorithms)
        row.updated_at = utcnow()
        self.session.flush()
        self._changed(gateway.name)

    def delete(self, name: str) -> None:
        """Forget a gateway.

        Raises:
            NotFound: No such gateway.
        """
        self.session.delete(self._row(name))
        self.session.flush()
        self._changed(name)


def _tunnel(row: TunnelRow) -> TunnelRecord:
    return _tunnel_of({name: getattr(row, name) for name in _COLUMNS})


def _tunnel_of(v: Mapping[str, Any]) -> TunnelRecord:
    """A tunnel record of a row's values by column."""
    return TunnelRecord(
        id=v["id"], initiator=v["initiator"], responder=v["responder"], local_ts=tuple(v["local_ts"]),
        remote_ts=tuple(v["remote_ts"]), state=TunnelState(v["state"]), negotiation=v["negotiation"],
        detail=v["detail"], created_at=v["created_at"].isoformat(), updated_at=v["updated_at"].isoformat(),
        peer=PeerEnd(**v["peer"]) if v["peer"] else None, provenance=v["provenance"],
    )


# A tunnel's set-up and teardown each run one of these: compiled once (app.adapters.db.hot).
_TUNNELS = cast(Table, TunnelRow.__table__)
_COLUMNS = tuple(_TUNNELS.c.keys())
_INSERT_TUNNEL = HotStatement(lambda _: insert(_TUNNELS).values({c.name: bindparam(c.name, type_=c.type)
                                                                 for c in _TUNNELS.c}))
_DELETE_TUNNEL = HotStatement(lambda _: delete(_TUNNELS).where(_TUNNELS.c.id == bindparam("id")))
_GET_TUNNEL = HotStatement(lambda _: select(*_TUNNELS.c).where(_TUNNELS.c.id == bindparam("id")))
_GET_STATE = HotStatement(lambda _: select(_TUNNELS.c.state).where(_TUNNELS.c.id == bindparam("id")))


def _set_state_statement(new: TunnelState) -> HotStatement:
    """``UPDATE`` of a tunnel's state to ``new``, only from a state that may move there (the state
    machine's moves written into the statement): the move is checked and made by one statement."""
    before: list[ColumnElement[str]] = [literal_column(f"'{s.value}'") for s, moves in TRANSITIONS.items()
                                        if new in moves and s.value.isalpha()]
    allowed = _TUNNELS.c.state.in_(before) if before else false()
    return HotStatement(lambda _: update(_TUNNELS).where(_TUNNELS.c.id == bindparam("id"), allowed).values(
        state=new.value, detail=bindparam("detail"),
        updated_at=bindparam("updated_at", type_=_TUNNELS.c.updated_at.type)))


_SET_STATE = {state: _set_state_statement(state) for state in TunnelState}


class TunnelRepository:
    """Tunnel records (never the PSK)."""

    def __init__(self, session: Session) -> None:
        """Bind the repository to ``session`` (committed by the caller, never here)."""
        self.session = session

    def _row(self, tunnel_id: str) -> TunnelRow:
        row = self.session.get(TunnelRow, tunnel_id)
        if row is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return row

    def add(self, record: TunnelRecord, *, keep_transaction: bool = True) -> TunnelRecord:
        """Store a new tunnel record and return it with its timestamps.

        ``keep_transaction=False``: no savepoint around the insert (two statements fewer); after
        ``AlreadyExists`` the transaction must be rolled back.

        Raises:
            AlreadyExists: a tunnel with this id exists (nothing is written).
        """
        now = utcnow()
        values: dict[str, Any] = {
            "id": record.id, "initiator": record.initiator, "responder": record.responder,
            "local_ts": list(record.local_ts), "remote_ts": list(record.remote_ts), "state": record.state.value,
            "detail": record.detail, "negotiation": dict(record.negotiation),
            "peer": record.peer.as_dict() if record.peer is not None else None,
            "provenance": dict(record.provenance) if record.provenance is not None else None,
            "created_at": now, "updated_at": now,
        }
        try:  # one INSERT: the ORM's unit of work would only track a row this transaction never reads
            if keep_transaction:
                with self.session.begin_nested():
                    self.session.execute(insert(TunnelRow), [values])
            else:
                with session_cursor(self.session) as cursor:
                    cursor.execute(_INSERT_TUNNEL, values)
        except IntegrityError as exc:
            raise AlreadyExists(f"tunnel {record.id!r} exists already") from exc
        return _tunnel_of(values)

    def get(self, tunnel_id: str) -> TunnelRecord:
        """One tunnel.

        Raises:
            NotFound: No such tunnel.
        """
        if not bare(self.session):  # this session holds rows (maybe changed): the ORM reads through them
            return _tunnel(self._row(tunnel_id))
        with session_cursor(self.session) as cursor:
            found = cursor.first(_GET_TUNNEL, {"id": tunnel_id})
        if found is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        return _tunnel_of(dict(zip(_COLUMNS, found, strict=True)))

    def states(self, tunnel_ids: Collection[str]) -> dict[str, TunnelState]:
        """Only the states of those of ``tunnel_ids`` that exist: one statement, no record built (one
        tunnel's, in a session with nothing unflushed, a hot statement: a set-up asks it on its path)."""
        wanted = sorted(set(tunnel_ids))
        session = self.session
        if len(wanted) == 1 and not (session.new or session.dirty or session.deleted):
            with session_cursor(session) as cursor:
                row = cursor.first(_GET_STATE, {"id": wanted[0]})
            return {wanted[0]: TunnelState(row[0])} if row is not None else {}
        found: dict[str, TunnelState] = {}
        for start in range(0, len(wanted), 500):  # within every database's limit of parameters
            rows = self.session.execute(select(TunnelRow.id, TunnelRow.state)
                                        .where(TunnelRow.id.in_(wanted[start:start + 500])))
            found.update((tunnel_id, TunnelState(state)) for tunnel_id, state in rows)
        return found

    def list(self) -> list[TunnelRecord]:
        """Every tunnel, oldest first."""
        return [_tunnel(r) for r in self.session.scalars(select(TunnelRow).order_by(TunnelRow.created_at,
                                                                                    TunnelRow.id))]

    def joining(self, initiator: str, identity: str, local_identity: str) -> str | None:
        """The id of the oldest tunnel from ``initiator`` whose far end has these identities: one
        statement on the initiator's index, the identities read inside the ``peer`` document."""
        peer = TunnelRow.peer
        return self.session.scalar(
            select(TunnelRow.id).where(TunnelRow.initiator == initiator, peer["identity"].as_string() == identity,
                                       peer["local_identity"].as_string() == local_identity)
            .order_by(TunnelRow.created_at, TunnelRow.id).limit(1))

    def with_peer(self, site: str) -> builtins.list[TunnelRecord]:
        """The tunnels carried with the peer ``site``, oldest first: one statement, the peer's name
        read inside the ``peer`` document (a tunnel without a peer keeps JSON ``null`` there, in
        which the name reads as SQL ``NULL`` and matches nothing)."""
        query = select(TunnelRow).where(TunnelRow.peer["site"].as_string() == site)
        return [_tunnel(r) for r in self.session.scalars(query.order_by(TunnelRow.created_at, TunnelRow.id))]

    def ids_by_peer(self) -> dict[str, builtins.list[str]]:
        """The ids of the tunnels carried with each peer, oldest first: one statement of two
        columns, the peer's name read inside the ``peer`` document."""
        site = TunnelRow.peer["site"].as_string()
        found: dict[str, builtins.list[str]] = {}
        for name, tunnel_id in self.session.execute(
                select(site, TunnelRow.id).where(site.is_not(None)).order_by(TunnelRow.created_at, TunnelRow.id)):
            found.setdefault(name, []).append(tunnel_id)
        return found

    def page(self, *, limit: int, after: tuple[str, str] | None = None,
             state: TunnelState | None = None) -> builtins.list[TunnelRecord]:
        """Up to ``limit`` tunnels in the order of :meth:`list`, after ``after`` = (created_at, id),
        only those in ``state``: one statement on the (created_at, id) index."""
        query = select(TunnelRow)
        if after is not None:
            stamp, last = datetime.fromisoformat(after[0]), after[1]
            query = query.where(or_(TunnelRow.created_at > stamp,
                                    and_(TunnelRow.created_at == stamp, TunnelRow.id > last)))
        if state is not None:
            query = query.where(TunnelRow.state == state.value)
        query = query.order_by(TunnelRow.created_at, TunnelRow.id).limit(limit)
        return [_tunnel(r) for r in self.session.scalars(query)]

    def set_state(self, tunnel_id: str, state: TunnelState, detail: str) -> None:
        """Move a tunnel to ``state`` with a human-readable ``detail``.

        Raises:
            NotFound: No such tunnel.
            Conflict: the tunnel's state machine has no such move.
        """
        if not bare(self.session):  # this session holds rows: the ORM keeps them in step
            row = self._row(tunnel_id)
            row.state = check_transition(TunnelState(row.state), state).value
            row.detail, row.updated_at = detail, utcnow()
            self.session.flush()
            return
        # One statement, the record not read (its documents are the largest part of a row); a
        # refused move reads the state alone, to say why.
        with session_cursor(self.session) as cursor:
            if cursor.execute(_SET_STATE[state], {"id": tunnel_id, "detail": detail, "updated_at": utcnow()}):
                return
            found = cursor.first(_GET_STATE, {"id": tunnel_id})
        if found is None:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
        check_transition(TunnelState(found[0]), state)
        raise Conflict(f"tunnel {tunnel_id!r} changed meanwhile")  # to a state it may move from, just now

    def set_negotiation(self, tunnel_id: str, negotiation: Mapping[str, Any], provenance: Mapping[str, Any] | None,
                        detail: str) -> None:
        """Record the suite a tunnel runs on now (after a move), what it was negotiated under, and ``up``.

        Raises:
            NotFound: No such tunnel.
        """
        row = self._row(tunnel_id)
        row.state = check_transition(TunnelState(row.state), TunnelState.UP).value
        row.negotiation, row.provenance = dict(negotiation), dict(provenance) if provenance is not None else None
        row.detail, row.updated_at = detail, utcnow()
        self.session.flush()

    def set_provenance(self, tunnel_id: str, provenance: Mapping[str, Any], *, unless_changed_since: str) -> bool:
        """Replace a tunnel's provenance (nothing else but ``updated_at``) if its record is still as it
        was read: ``updated_at`` equal to ``unless_changed_since`` (the record's own). One statement,
        so two processes that read the same record cannot both succeed. False: it changed, or is gone."""
        self.session.flush()
        done = cast(CursorResult[Any], self.session.execute(
            update(TunnelRow).where(TunnelRow.id == tunnel_id,
                                    TunnelRow.updated_at == datetime.fromisoformat(unless_changed_since))
            .values(provenance=dict(provenance), updated_at=utcnow()).execution_options(synchronize_session=False)))
        if done.rowcount and self.session.identity_map:
            self.session.expire_all()  # rows this session holds were read before the change
        return bool(done.rowcount)

    def delete(self, tunnel_id: str) -> None:
        """Forget a tunnel: one statement, the record not read first (its documents are the
        largest part of a row).

        Raises:
            NotFound: No such tunnel.
        """
        if not bare(self.session):  # this session holds rows: the ORM's statement keeps them in step
            gone = cast(CursorResult[Any], self.session.execute(delete(TunnelRow).where(TunnelRow.id == tunnel_id)))
            count = gone.rowcount
        else:
            with session_cursor(self.session) as cursor:
                count = cursor.execute(_DELETE_TUNNEL, {"id": tunnel_id})
        if not count:
            raise NotFound(f"tunnel {tunnel_id!r} does not exist")
