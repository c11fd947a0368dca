"""The running service's parts: made once when the service starts (the lifespan of
:func:`app.main.create_app`), closed when it stops, and read by the routes, the console's pages
and the fast paths as ``app.state.runtime`` (:func:`runtime`).

What the application object itself holds besides is made with it and lives as long:
``app.state.door`` (the admission limit) and ``app.state.draining`` (set when the server is
asked to stop)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import HTTPConnection

from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.db.audit import Auditor
from app.adapters.db.leader import Leadership
from app.adapters.db.ratelimit import SharedRateLimiter
from app.adapters.db.repositories.access import TokenCache
from app.adapters.db.write_groups import WriteGroups
from app.adapters.memory import QuietRelease
from app.adapters.metrics import PrometheusMetrics, ScrapeReader
from app.adapters.vici.sa_events import SaEventHub
from app.domain.charon_port import ViciFactory
from app.domain.ports import UnitOfWorkFactory
from app.domain.ratelimit import FailureLimit, RateLimiter
from app.services.agent.host import HostAgent
from app.services.agent.target import TargetAgent
from app.services.console_oidc import OidcSignIn
from app.services.events import StreamSlots
from app.services.peering import Peering
from app.services.rekey import Rekeyer
from app.services.tunnel_monitor import TunnelMonitor
from app.settings import Settings
from app.web.admission import HealthProbe
from app.web.observe import RequestTimer
from app.web.provenance import TrustedProxies

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["Limiter", "Runtime", "runtime", "runtime_of"]

#: A rate limit: in this process, or shared by the replicas of one PostgreSQL database.
Limiter = RateLimiter | SharedRateLimiter


@dataclass(eq=False)
class Runtime:
    """Everything a request may use, made once per process.

    Attributes:
        engine, read_engine: the database (on SQLite a read-only engine beside the writer; on
            PostgreSQL the same engine).
        units, read_units: units of work over ``session_factory`` and ``read_session_factory``.
        write_slots: the changes in flight (:func:`app.web.deps.write_place`).
        write_groups: where a tunnel set-up's record commits with those waiting beside it (SQLite,
            ``write_groups``), or None.
        vici_factory: a charon by its socket path; ``sa_events``: their up/down events.
        idempotency_key: the server's key for idempotency fingerprints.
        benchmarks: the micro-benchmark jobs (``app.measure.services.jobs.BenchmarkJobs``: the
            measuring stands beside this layer, so the runtime carries them without their type
            and their route checks it).
        agent_store, agent_reads: the agent's store, for writes and for reads beside an open write.
        tunnel_monitor, rekeyer: the leader's workers while this process leads, None otherwise
            (:class:`app.web.leader_duties.LeaderDuties`).
    """

    settings: Settings
    engine: Engine
    read_engine: Engine
    session_factory: sessionmaker[Session]
    read_session_factory: sessionmaker[Session]
    units: UnitOfWorkFactory
    read_units: UnitOfWorkFactory
    token_cache: TokenCache
    write_slots: asyncio.Semaphore
    metrics: PrometheusMetrics
    request_timer: RequestTimer
    scrape_reader: ScrapeReader
    health: HealthProbe
    oidc: OidcSignIn | None
    vici_factory: ViciFactory
    sa_events: SaEventHub
    auditor: Auditor
    trusted_proxies: TrustedProxies
    idempotency_key: bytes
    tunnel_limiter: Limiter
    negotiation_limiter: Limiter
    negotiation_total_limiter: Limiter
    agent_limiter: Limiter
    agent_user_limiter: Limiter
    peer_limiter: Limiter
    auth_failures: FailureLimit
    benchmarks: object
    agent_store: SqlAgentStore
    agent_reads: SqlAgentStore
    agent_host: HostAgent | None = None
    agent_target: TargetAgent | None = None
    write_groups: WriteGroups | None = None
    memory_release: QuietRelease | None = None
    leadership: Leadership | None = None
    tunnel_monitor: TunnelMonitor | None = None
    rekeyer: Rekeyer | None = None
    peering: Peering | None = None
    event_streams: StreamSlots = field(default_factory=StreamSlots)


def runtime(connection: HTTPConnection) -> Runtime:
    """The running service's parts, for a request (only while the service runs)."""
    parts: Runtime = connection.app.state.runtime
    return parts


def runtime_of(app: Starlette) -> Runtime | None:
    """The running service's parts, None before the service has started (or after it stopped)."""
    parts: Runtime | None = getattr(app.state, "runtime", None)
    return parts
