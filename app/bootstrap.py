"""What every entry point (the API's app factory, the command line, the lab) builds from the
settings, built one way: the database engine, the charons' factory, the agent's HTTP and the
charon event listener, and a database brought to a usable state (migrated, the shipped tables and
policies loaded once).

The ``fast_paths`` setting (``QOSS_FAST_PATHS``) is read here for the mechanisms it switches,
each of which takes its choice as an argument: the engine's statements on the DBAPI cursor
(:func:`~app.adapters.db.engine.make_engine`), VICI commands pipelined on one socket
(:class:`~app.adapters.vici.gateway.ViciGateway`), charon's events read off the wire
(:func:`~app.adapters.vici.events.updown_listener`), and the agent's HTTP on kept sockets
(:func:`~app.adapters.agent.transport.post_message`). The routes that bypass the framework read
it in their registry (:mod:`app.web.bypass`).

Each function imports what it builds when it is called: the user's client (``qoss agent
connect``) takes its HTTP and its event listener from here without loading a database library."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.domain.ports import NO_METRICS, Metrics
from app.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from app.adapters.db.notices import NoticeListener
    from app.adapters.db.repositories.access import TokenCache
    from app.adapters.db.repositories.network import GatewayCache
    from app.adapters.db.repositories.peers import PeerCache
    from app.adapters.db.repositories.revisioned import TableCache
    from app.adapters.peering import HttpPeerLink
    from app.adapters.vici.events import EventListener, SaEvent
    from app.adapters.vici.gateway import ViciGateway
    from app.domain.charon_port import UpReports, ViciFactory
    from app.domain.ports import UnitOfWorkFactory
    from app.services.peering import Peering

__all__ = ["Prepared", "ReadCaches", "agent_post", "charons", "engine_for", "peer_link", "peering_of",
           "prepare_database", "read_caches", "sa_listener"]


def engine_for(settings: Settings, *, writes: bool = True, **pool: Any) -> Engine:
    """The database engine of ``settings`` (``writes=False``: SQLite's read-only engine)."""
    from app.adapters.db.engine import make_engine

    return make_engine(settings.database_url, writes=writes, fast_paths=settings.fast_paths, **pool)


def charons(settings: Settings, metrics: Metrics = NO_METRICS) -> Callable[[str], ViciGateway]:
    """A charon by its VICI socket path, answering within ``settings.vici_timeout``, its calls
    counted in ``metrics``."""
    from app.adapters.vici.gateway import ViciGateway

    timeout, pipelining = settings.vici_timeout, settings.fast_paths
    return lambda path: ViciGateway(path, timeout, metrics=metrics, pipelining=pipelining)


def agent_post(settings: Settings) -> Callable[..., bytes]:
    """How the agent's roles send a message over HTTP (:func:`~app.adapters.agent.transport.post_message`)."""
    from app.adapters.agent.transport import post_message

    return functools.partial(post_message, fast_paths=settings.fast_paths)


def peer_link(settings: Settings) -> HttpPeerLink:
    """How peering sends its messages to other qoss services (:class:`~app.adapters.peering.HttpPeerLink`:
    plain HTTP on kept sockets with the fast paths, else httpx)."""
    from app.adapters.peering import HttpPeerLink

    return HttpPeerLink(plain=settings.fast_paths)


def peering_of(settings: Settings, *, units: UnitOfWorkFactory, vici: ViciFactory,
               reports: UpReports | None = None) -> Peering | None:
    """This service's side of peered tunnels (:class:`~app.services.peering.Peering`), or None when
    ``settings`` name no peer name (``QOSS_PEER_NAME``). What it loads for a peer ends by itself
    unless confirmed, its process killed or not: the pending loads' janitor is started here."""
    if settings.peer_name is None:
        return None
    from app.adapters.agent.crypto import CRYPTO
    from app.adapters.peering import peering_keys
    from app.adapters.pending_loads import PendingLoads
    from app.services.peering import Peering, PeeringConfig

    pending = PendingLoads(settings.state_dir / "peering" / "pending")
    pending.start()
    return Peering(config=PeeringConfig(name=settings.peer_name, timeout=settings.peer_timeout,
                                        default_table=settings.default_table,
                                        confirm_early=settings.peer_confirm_early),
                   units=units, vici=vici, link=peer_link(settings), keys=peering_keys, crypto=CRYPTO,
                   pending=pending, reports=reports)


def sa_listener(settings: Settings) -> Callable[[str, Callable[[SaEvent], None]], EventListener]:
    """How an event hub listens to a charon's up/down events
    (:func:`~app.adapters.vici.events.updown_listener`)."""
    from app.adapters.vici.events import updown_listener

    return functools.partial(updown_listener, wire=settings.fast_paths)


#: Seconds a cached row is trusted on PostgreSQL while the replicas' change notices are followed
#: (a notice makes it forgotten at once; this bounds a row whose notice was somehow missed).
REPLICA_TTL = 30.0


@dataclass(frozen=True)
class ReadCaches:
    """A process's read caches (API tokens, registered gateways, rating tables), and on PostgreSQL
    what keeps them true across replicas (:class:`~app.adapters.db.notices.NoticeListener`)."""

    tokens: TokenCache
    gateways: GatewayCache
    tables: TableCache
    notices: NoticeListener | None
    peers: PeerCache | None = None

    def session_info(self) -> dict[str, Any]:
        """What every session's ``info`` holds, so its repositories use the caches."""
        from app.adapters.db.repositories.access import TOKEN_CACHE
        from app.adapters.db.repositories.network import GATEWAY_CACHE
        from app.adapters.db.repositories.peers import PEER_CACHE
        from app.adapters.db.repositories.revisioned import TABLE_CACHE

        return {GATEWAY_CACHE: self.gateways, TOKEN_CACHE: self.tokens, TABLE_CACHE: self.tables,
                **({PEER_CACHE: self.peers} if self.peers is not None else {})}

    def close(self) -> None:
        if self.notices is not None:
            self.notices.close()


def read_caches(settings: Settings) -> ReadCaches:
    """The caches of ``settings``: on SQLite (one process per database) each trusts a read for its
    TTL setting (default 1 s); on PostgreSQL for its setting (default :data:`REPLICA_TTL`) while
    the other replicas' change notices are followed, for none while they are not. A TTL set to 0
    turns its cache off."""
    from app.adapters.db.notices import NoticeListener
    from app.adapters.db.repositories.access import TokenCache
    from app.adapters.db.repositories.network import GatewayCache
    from app.adapters.db.repositories.peers import PeerCache
    from app.adapters.db.repositories.revisioned import TableCache

    replicas = settings.database_url.startswith("postgresql")
    chosen = {"token": settings.token_cache_ttl, "gateway": settings.gateway_cache_ttl,
              "table": settings.table_cache_ttl}
    ttls = {kind: ttl if ttl is not None else (REPLICA_TTL if replicas else 1.0) for kind, ttl in chosen.items()}
    tokens, gateways, tables = TokenCache(ttl=ttls["token"]), GatewayCache(ttl=ttls["gateway"]), \
        TableCache(ttl=ttls["table"])
    peers = PeerCache(ttl=ttls["gateway"])  # peers, like gateways: registrations an administrator changes
    ttls["peer"] = ttls["gateway"]
    notices = None
    if replicas and any(ttl > 0 for ttl in ttls.values()):
        notices = NoticeListener(settings.database_url, {"token": tokens, "gateway": gateways, "table": tables,
                                                         "peer": peers}, ttls).start()
    return ReadCaches(tokens, gateways, tables, notices, peers)


@dataclass(frozen=True)
class Prepared:
    tables_added: list[str]
    policies_added: list[str]


def prepare_database(settings: Settings) -> Prepared:
    """Run the migrations; with ``load_shipped``, insert the shipped tables and policies this
    database was never offered (each name once: what an operator deleted stays deleted)."""
    from app.adapters import files
    from app.adapters.db.engine import make_session_factory
    from app.adapters.db.migrate import upgrade
    from app.adapters.db.unit_of_work import SqlUnitOfWork
    from app.services.policies import load_shipped_policies
    from app.services.ratings import load_shipped_tables

    if settings.database_url.startswith("sqlite:///"):
        from pathlib import Path

        path = settings.database_url.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    upgrade(settings.database_url)
    if not settings.load_shipped:
        return Prepared([], [])
    tables = files.load_rating_tables(settings.ratings_dir)
    policies = files.load_policies(settings.policies_dir)
    engine = engine_for(settings)
    try:
        with SqlUnitOfWork(make_session_factory(engine)(), owned=True) as uow:
            added_t = load_shipped_tables(uow=uow, tables=tables)
            added_p = load_shipped_policies(uow=uow, policies=policies)
            uow.commit()
    finally:
        engine.dispose()
    return Prepared(added_t, added_p)
