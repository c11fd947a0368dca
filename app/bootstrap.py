"""What every entry point (the API's app factory, the command line, the lab) builds from the
settings, built one way: the database engine, the charons' factory, and a database brought to a
usable state (migrated, the shipped tables and policies loaded once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from app.adapters import files
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.migrate import upgrade
from app.adapters.db.notices import NoticeListener
from app.adapters.db.repositories.access import TOKEN_CACHE, TokenCache
from app.adapters.db.repositories.network import GATEWAY_CACHE, GatewayCache
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.adapters.vici.gateway import ViciGateway
from app.domain.ports import NO_METRICS, Metrics
from app.services.policies import load_shipped_policies
from app.services.ratings import TableCache, load_shipped_tables
from app.settings import Settings

__all__ = ["Prepared", "ReadCaches", "charons", "engine_for", "prepare_database", "read_caches"]


def engine_for(settings: Settings, *, writes: bool = True, **pool: Any) -> Engine:
    """The database engine of ``settings`` (``writes=False``: SQLite's read-only engine)."""
    return make_engine(settings.database_url, writes=writes, fast_paths=settings.fast_paths, **pool)


def charons(settings: Settings, metrics: Metrics = NO_METRICS) -> Callable[[str], ViciGateway]:
    """A charon by its VICI socket path, answering within ``settings.vici_timeout``, its calls
    counted in ``metrics``."""
    timeout, pipelining = settings.vici_timeout, settings.fast_paths
    return lambda path: ViciGateway(path, timeout, metrics=metrics, pipelining=pipelining)


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

    def session_info(self) -> dict[str, Any]:
        """What every session's ``info`` holds, so its repositories use the caches."""
        return {GATEWAY_CACHE: self.gateways, TOKEN_CACHE: self.tokens}

    def close(self) -> None:
        if self.notices is not None:
            self.notices.close()


def read_caches(settings: Settings) -> ReadCaches:
    """The caches of ``settings``: on SQLite (one process per database) each trusts a read for its
    TTL setting (default 1 s); on PostgreSQL for its setting (default :data:`REPLICA_TTL`) while
    the other replicas' change notices are followed, for none while they are not. A TTL set to 0
    turns its cache off."""
    replicas = settings.database_url.startswith("postgresql")
    chosen = {"token": settings.token_cache_ttl, "gateway": settings.gateway_cache_ttl,
              "table": settings.table_cache_ttl}
    ttls = {kind: ttl if ttl is not None else (REPLICA_TTL if replicas else 1.0) for kind, ttl in chosen.items()}
    tokens, gateways, tables = TokenCache(ttl=ttls["token"]), GatewayCache(ttl=ttls["gateway"]), \
        TableCache(ttl=ttls["table"])
    notices = None
    if replicas and any(ttl > 0 for ttl in ttls.values()):
        notices = NoticeListener(settings.database_url, {"token": tokens, "gateway": gateways, "table": tables},
                                 ttls).start()
    return ReadCaches(tokens, gateways, tables, notices)


@dataclass(frozen=True)
class Prepared:
    tables_added: list[str]
    policies_added: list[str]


def prepare_database(settings: Settings) -> Prepared:
    """Run the migrations; with ``load_shipped``, insert the shipped tables and policies this
    database was never offered (each name once: what an operator deleted stays deleted)."""
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
