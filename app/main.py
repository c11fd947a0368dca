"""The FastAPI application: resources live in the lifespan, never at import."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sized
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import __version__
from app.adapters.agent.crypto import CRYPTO, load_keys
from app.adapters.agent.devices import LocalDeviceKit
from app.adapters.audit_seal import AuditSeal
from app.adapters.db.agent_store import SqlAgentStore
from app.adapters.db.audit import Auditor, install
from app.adapters.db.engine import make_session_factory
from app.adapters.db.leader import Leadership
from app.adapters.db.ratelimit import SharedRateLimiter, shared_buckets_engine
from app.adapters.db.unit_of_work import sql_units_of_work
from app.adapters.db.write_groups import WriteGroups
from app.adapters.memory import QuietRelease
from app.adapters.metrics import PrometheusMetrics, ScrapeReader
from app.adapters.vici.sa_events import SaEventHub
from app.adapters.vici.slots import CONTROL_SLOTS
from app.api.agent_fast import MESSAGE_ROUTES
from app.api.docs import install as install_api_docs
from app.api.peering_fast import PEER_ROUTES
from app.api.routes import (
    admin,
    agent,
    algorithms,
    benchmarks,
    events,
    gateways,
    health,
    metrics,
    negotiations,
    peers,
    policies,
    ratings,
    tunnels,
)
from app.api.tunnels_fast import TUNNEL_ROUTES
from app.bootstrap import agent_post, charons, engine_for, peering_of, read_caches, sa_listener
from app.domain.charon_port import ViciFactory
from app.domain.ports import UnitOfWorkFactory
from app.domain.ratelimit import FailureLimit, RateLimiter
from app.measure.adapters.micro import machine_id, run_micro
from app.measure.services.jobs import BenchmarkJobs
from app.services import idempotency
from app.services.agent.config import load_server_config
from app.services.agent.host import HostAgent
from app.services.agent.target import TargetAgent
from app.services.agent.target_edits import SessionFollower
from app.services.events import prune_events
from app.services.peering import Peering
from app.settings import Settings
from app.ui import install as install_console
from app.ui.pages.oidc import configured as console_oidc_sign_in
from app.web.admission import AdmissionControl, Door, HealthProbe, uncounted
from app.web.audit_trail import audit, changes, record_change
from app.web.bypass import BypassRoutes
from app.web.deps import in_worker_thread
from app.web.errors import error_body, install_error_handlers
from app.web.leader_duties import LeaderDuties
from app.web.observe import RequestTimer, RouteLabels
from app.web.provenance import TrustedProxies, client_request_id, new_request_id
from app.web.runtime import Limiter, Runtime, runtime_of

__all__ = ["create_app"]

log = logging.getLogger("qoss.api")


class QossApp(FastAPI):
    """The application: the routes registered to bypass the framework (``app.state.bypass``,
    :mod:`app.web.bypass`) are answered around the middleware stack, through the same admission
    door; everything else goes through the stack."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        parts = runtime_of(self)  # None before the lifespan has run
        if parts is None or scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if parts.memory_release is not None and not uncounted(scope["path"]):
            parts.memory_release.touch()
        await parts.request_timer(functools.partial(self._serve, parts), scope, receive, send)

    async def _serve(self, parts: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
        parts.trusted_proxies.rewrite(scope)  # behind a trusted proxy, the client is the one it forwards for
        bypass: BypassRoutes = self.state.bypass
        route = bypass.route_for(parts, scope)
        if route is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        full = super().__call__

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            await bypass.serve(parts, route, scope, receive, send, full)
        await self.state.door.through(scope, receive, send, answer)


def _agent_roles(settings: Settings, *, store: SqlAgentStore, units: UnitOfWorkFactory,
                 vici: ViciFactory) -> tuple[HostAgent | None, TargetAgent | None]:
    """The agent roles the config enables (none without ``agent_config``)."""
    if settings.agent_config is None:
        return None, None
    config = load_server_config(settings.agent_config)
    keys = load_keys(config.key_dir, config.id)
    target = None
    if config.target is not None:
        target = TargetAgent(config=config, keys=keys, crypto=CRYPTO, store=store, units=units,
                             vici=vici, default_table=settings.default_table,
                             devices=LocalDeviceKit(config.key_dir, owner=config.target_identity,
                                                     gateway_addresses=[config.target.ike_address]))
    host = None
    if config.host is not None:
        host = HostAgent(config=config, keys=keys, crypto=CRYPTO, store=store, local_target=target,
                         post=agent_post(settings))
    log.info("agent roles: host=%s target=%s (id %s)", host is not None, target is not None, config.id)
    return host, target


def _prune_events(units: UnitOfWorkFactory, keep_days: float) -> None:
    with units() as uow:
        gone = prune_events(uow, keep_days)
        uow.commit()
    if gone:
        log.info("events older than %g days forgotten: %d", keep_days, gone)


def _idempotency_key(units: UnitOfWorkFactory) -> bytes:
    with units() as uow:
        key = idempotency.server_key(uow)
        uow.commit()
        return key


async def _sweep(target: TargetAgent, follower: SessionFollower | None, stop: asyncio.Event) -> None:
    """Target's sweeper: expired sessions out, stale nonces forgotten, orphaned conns unloaded;
    with ``follower``, the sessions that an edit of this database's rating tables or policies
    left below their minimums closed (:mod:`app.services.agent.target_edits`).

    Stopped by ``stop``, never cancelled mid-sweep: a sweep runs in a thread that holds a
    database connection, which must be back in the pool before the engine is disposed.
    """
    duties: list[tuple[Callable[[], Sized], str, str]] = [
        (target.sweep, "agent sessions expired: %d", "agent sweep failed")]
    if follower is not None:
        duties.append((follower.follow, "agent sessions closed after an edit: %d",
                       "agent sessions: following the edits failed"))
    while not stop.is_set():
        for duty, done, failed in duties:
            try:
                handled = await in_worker_thread(duty)
                if handled:
                    log.info(done, len(handled))
            except Exception:
                log.exception(failed)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=target.role.sweep_interval)


#: Seconds between Host's looks for revocations a target has not confirmed that are due again.
_RESEND_INTERVAL = 2.0


async def _resend_revocations(host: HostAgent, stop: asyncio.Event) -> None:
    """Host's revocations a target has not confirmed, sent again as each falls due
    (:meth:`HostAgent.retry_revocations`). Stopped by ``stop``, never cancelled mid-send."""
    while not stop.is_set():
        try:
            confirmed = await in_worker_thread(host.retry_revocations)
            if confirmed:
                log.info("agent revocations confirmed now: %s", ", ".join(confirmed))
        except Exception:
            log.exception("agent revocations: sending them again failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=_RESEND_INTERVAL)


class _GuardAndAudit:
    """Body-size cap (413), our request id, and an audit record per change or refusal.

    The cap holds however a body is sent: a Content-Length over it is refused before
    anything is read, and the body is counted as it arrives (chunked, or a Content-Length
    that lies), reading past the cap raises 413 and nothing more is read.

    Records: a change made in the request's unit of work was recorded in its transaction
    (:func:`app.web.deps.get_unit`); any other 2xx answer to a change is recorded before
    the answer is sent (:meth:`Auditor.write`); refusals and computations are queued.

    Plain ASGI rather than ``BaseHTTPMiddleware``: no extra task and memory streams per
    request. What the handlers put on ``request.state`` (the principal, an error name) lives
    in the scope, so it is read here after the response.
    """

    def __init__(self, app: ASGIApp, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        request_id = new_request_id()
        request.state.request_id = request_id
        request.state.client_request_id = client_request_id(request.headers.get("x-request-id"))
        status = 500
        recorded = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, recorded
            if message["type"] == "http.response.start":
                status = message["status"]
                recorded = await record_change(request, status)
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode("ascii"))]
                message = {**message, "headers": headers}
            await send(message)

        limit: int = (self.settings or scope["app"].state.runtime.settings).max_body_bytes
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request bodies are limited to {limit} bytes")
            return message

        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            request.state.error_name = "PayloadTooLarge"
            response = JSONResponse(
                error_body("PayloadTooLarge", f"request bodies are limited to {limit} bytes"), status_code=413
            )
            await response(scope, receive, send_with_id)
        else:
            try:
                await self.app(scope, limited, send_with_id)
            except Exception:
                # A bug (the 500 is answered outside this middleware): still one record.
                request.state.error_name = "InternalError"
                audit(request, 500)
                raise
        if not recorded and changes(request, status):
            audit(request, status)


async def _sweep_peered(peering: Peering, stop: asyncio.Event) -> None:
    """Every second: unload the peers' tunnel ends this side loaded as responder and never saw confirmed."""
    while not stop.is_set():
        try:
            await in_worker_thread(peering.sweep)
        except Exception:  # a database or charon hiccup: the next sweep tries again
            log.exception("sweeping unconfirmed peered tunnels failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def _tell_peers_again(peering: Peering, stop: asyncio.Event) -> None:
    """Every two seconds: the teardowns a peer did not hear and that are due, told again
    (:meth:`Peering.tell_again`), apart from the sweep (a silent peer never holds it up)."""
    while not stop.is_set():
        try:
            await in_worker_thread(peering.tell_again)
        except Exception:  # a database hiccup: the next round tries again
            log.exception("telling peers their teardowns again failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


def create_app(settings: Settings | None = None, vici_factory: ViciFactory | None = None) -> FastAPI:
    """Build the application. The database must already be migrated (``qoss db upgrade``).

    Args:
        settings: defaults to the environment's.
        vici_factory: socket path -> VICI gateway; the seam for tests (production: a real socket).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        resolved = settings or Settings()
        pool: dict[str, Any] = {"pool_size": resolved.db_pool_size, "max_overflow": resolved.db_pool_overflow,
                "pool_timeout": resolved.db_pool_timeout}
        engine = engine_for(resolved, **pool)
        read_engine = (
            engine_for(resolved, writes=False, **pool)
            if resolved.database_url.startswith("sqlite") else engine
        )
        # Blocking work runs in this many threads; the admission limit and the pool are sized
        # against it, so a burst waits in front of the door (503), not inside on a lock:
        # - at most max_in_flight requests are inside; those beyond worker_threads wait for a
        #   thread on the loop, holding nothing;
        # - a thread holds at most one pooled connection at a time, so each engine's pool
        #   (db_pool_size + db_pool_overflow, 60 by default) covers every worker thread plus
        #   the audit writer and the monitor: the pool timeout is a stalled database, not load;
        # - fewer writers than threads (write_slot): writers queued on the database's lock
        #   never hold every thread while the one holding it needs one to answer and commit.
        anyio.to_thread.current_default_thread_limiter().total_tokens = resolved.worker_threads
        metrics_port = PrometheusMetrics()
        caches = read_caches(resolved)
        session_factory = make_session_factory(engine, info=caches.session_info())
        read_session_factory = make_session_factory(read_engine, info=caches.session_info())
        units, read_units = sql_units_of_work(session_factory), sql_units_of_work(read_session_factory)
        await in_worker_thread(_prune_events, units, resolved.events_keep_days)
        CONTROL_SLOTS.configure(resolved.charon_control_calls)
        install(session_factory)  # a request's unit of work writes its audit record
        # Rate limits: on PostgreSQL counted across every replica (app.adapters.db.ratelimit).
        buckets_engine = (shared_buckets_engine(resolved.database_url)
                          if resolved.database_url.startswith("postgresql") else None)

        def limiter(name: str, rate: float, burst: int) -> Limiter:
            if buckets_engine is None:
                return RateLimiter(rate, burst)
            return SharedRateLimiter(buckets_engine, name, rate, burst)
        vici = vici_factory or charons(resolved, metrics_port)
        agent_store = SqlAgentStore(session_factory)
        host, target = _agent_roles(resolved, store=agent_store, units=units, vici=vici)
        parts = app.state.runtime = Runtime(
            settings=resolved, engine=engine, read_engine=read_engine, session_factory=session_factory,
            read_session_factory=read_session_factory, units=units, read_units=read_units,
            token_cache=caches.tokens,
            write_slots=asyncio.Semaphore(resolved.writes_in_flight),
            # SQLite's one writer: the set-ups waiting for it commit together (PostgreSQL: never)
            write_groups=WriteGroups() if resolved.write_groups and engine.dialect.name == "sqlite" else None,
            metrics=metrics_port, request_timer=RequestTimer(metrics_port, labels),
            scrape_reader=ScrapeReader(resolved.database_url), health=HealthProbe(resolved.database_url),
            oidc=console_oidc_sign_in(resolved),  # the console's sign-in with the identity provider, or None
            vici_factory=vici,
            # Charon's up/down events, one connection per charon: set-ups read their SAs from them
            # (unless sa_reports is off) and the tunnel monitor is told by them.
            sa_events=SaEventHub(metrics=metrics_port, listen=sa_listener(resolved),
                                 detached=resolved.detached_initiate),
            auditor=await in_worker_thread(  # checks the audit key against the chain: refuses a wrong one
                Auditor, session_factory, refusal_window=resolved.audit_refusal_window,
                seal=AuditSeal.from_settings(resolved)),
            trusted_proxies=TrustedProxies(resolved.trusted_proxies, resolved.forwarded_header),
            idempotency_key=await in_worker_thread(_idempotency_key, units),
            tunnel_limiter=limiter("tunnels", resolved.tunnel_rate, resolved.tunnel_burst),
            negotiation_limiter=limiter("negotiations", resolved.negotiation_rate, resolved.negotiation_burst),
            negotiation_total_limiter=limiter("negotiations-total", resolved.negotiation_total_rate,
                                              resolved.negotiation_total_burst),
            agent_limiter=limiter("agent", resolved.agent_rate, resolved.agent_burst),
            agent_user_limiter=limiter("agent-user", resolved.agent_user_rate, resolved.agent_user_burst),
            peer_limiter=limiter("peer", resolved.peer_rate, resolved.peer_burst),
            auth_failures=FailureLimit(limiter("auth-failures", resolved.auth_failure_rate,
                                               resolved.auth_failure_burst)),
            benchmarks=BenchmarkJobs(
                runner=lambda keywords, budget, progress: run_micro(keywords, budget_per_algorithm=budget,
                                                                    progress=progress),
                session_factory=session_factory, machine=machine_id()),
            agent_store=agent_store,
            # The sessions an edit's dry run assesses are read beside the edit's open write transaction.
            agent_reads=SqlAgentStore(read_session_factory),
            agent_host=host, agent_target=target,
            # After a burst, once quiet: the idle worker threads end, the pools close their
            # connections and glibc returns its free memory (app.adapters.memory).
            memory_release=QuietRelease(
                after=resolved.memory_release_after, trim="trim" in resolved.memory_release,
                engines=dict.fromkeys([engine, read_engine]) if "pool" in resolved.memory_release else ())
            if resolved.memory_release else None,
        )
        # Tunnels negotiated with other qoss services (app.services.peering), if this service has a peer name.
        parts.peering = peering_of(resolved, units=units, vici=vici,
                                   reports=parts.sa_events if resolved.sa_reports else None)
        if parts.peering is not None:
            await in_worker_thread(parts.peering.keys)  # made (or read) once, before the first message
        duties = LeaderDuties(parts)
        leadership = parts.leadership = Leadership(resolved.database_url, on_elected=duties.elected,
                                                   on_deposed=duties.deposed, interval=resolved.leader_interval)
        await in_worker_thread(leadership.start)  # the first replica leads at once
        stop_sweeping = asyncio.Event()
        # Target's own process follows the edits of its database (whichever replica leads).
        follower = target.follower(concurrency=resolved.rekey_concurrency) if target and resolved.rekey else None
        sweeper = asyncio.create_task(_sweep(target, follower, stop_sweeping)) if target else None
        resender = asyncio.create_task(_resend_revocations(host, stop_sweeping)) if host else None
        unconfirmed = (asyncio.create_task(_sweep_peered(parts.peering, stop_sweeping))
                       if parts.peering is not None else None)
        teller = (asyncio.create_task(_tell_peers_again(parts.peering, stop_sweeping))
                  if parts.peering is not None else None)
        release = parts.memory_release
        stop_releasing = asyncio.Event()
        releaser = asyncio.create_task(release.run(stop_releasing)) if release is not None else None
        # What start-up made lives as long as the process: out of the collector's way, so a
        # full collection (tens of ms over every module's objects) never lands on a request.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            stop_sweeping.set()
            if sweeper is not None:
                await sweeper  # the sweep under way ends first
            if resender is not None:
                await resender
            if unconfirmed is not None:
                await unconfirmed
            if teller is not None:
                await teller
            if releaser is not None:
                stop_releasing.set()
                await releaser  # a release under way ends before the engines are disposed
            await in_worker_thread(leadership.stop)
            await in_worker_thread(parts.sa_events.close)
            parts.auditor.close()
            caches.close()
            parts.health.close()
            parts.scrape_reader.close()
            engine.dispose()
            read_engine.dispose()
            if buckets_engine is not None:
                buckets_engine.dispose()

    app = QossApp(
        title="qoss",
        version=__version__,
        description="Quality-of-Security-Service policy negotiation for IPsec (ESAF): the cheapest "
        "strongSwan suite that meets every peer's minimum security levels.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc from the packaged copies of their files (app.api.docs)
        redoc_url=None,
    )
    install_error_handlers(app)
    #: Set when the server is asked to stop: event streams end at once (their clients resume
    #: elsewhere with Last-Event-ID) instead of holding the shutdown open.
    app.state.draining = False

    app.add_middleware(_GuardAndAudit, settings=settings)
    # The routes answered around the middleware stack on their happy path (app.web.bypass).
    app.state.bypass = BypassRoutes((*MESSAGE_ROUTES, *TUNNEL_ROUTES, *PEER_ROUTES))
    # Outermost: a request over the in-flight limit is answered before anything else runs. The
    # routes that bypass the stack go through the same door.
    app.state.door = Door(settings)
    app.add_middleware(AdmissionControl, settings=settings, door=app.state.door)

    app.include_router(health.router)
    app.include_router(metrics.router)
    # The agent's message routes first: routing tries each route in order, and they are the
    # ones a connect waits for (their paths overlap no other router's).
    routers = (agent, algorithms, ratings, policies, negotiations, gateways, tunnels, peers, admin, benchmarks,
               events)
    for module in routers:
        app.include_router(module.router, prefix="/v1")
    labels = RouteLabels((route, prefix + route.path_format) for prefix, router in
                         [("", health.router), ("", metrics.router), *(("/v1", m.router) for m in routers)]
                         for route in router.routes if isinstance(route, APIRoute))
    _declare_if_match(app, [("/v1", m.router) for m in routers])
    install_console(app)  # the admin console at /ui (app/ui)
    install_api_docs(app)  # /docs and /redoc, served from here alone
    return app


def _declare_if_match(app: FastAPI, routers: list[tuple[str, APIRouter]]) -> None:
    """Make the OpenAPI document say what the dependencies enforce.

    - ``If-Match`` is required where a route refuses without it. The header stays optional to
      FastAPI itself so that its absence is the API's 428 with a message, not a 422.
    - Public reads (``reader``) take a token but do not need one (unless ``reads_require_token``):
      their security requirement lists "none" beside the bearer scheme.
    """
    from fastapi.dependencies.models import Dependant
    from fastapi.routing import APIRoute

    from app.web.deps import get_if_match, reader

    def uses(dependant: Dependant, call: object) -> bool:
        return any(d.call is call or uses(d, call) for d in dependant.dependencies)

    def operations(call: object) -> set[tuple[str, str]]:
        return {(prefix + r.path_format, m.lower()) for prefix, router in routers for r in router.routes
                if isinstance(r, APIRoute) and uses(r.dependant, call) for m in r.methods or ()}

    guarded, public = operations(get_if_match), operations(reader)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        parts = runtime_of(app)  # made by the lifespan
        optional_token = parts is None or not parts.settings.reads_require_token
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                if (path, method) in guarded:
                    for param in op.get("parameters", []):
                        if param.get("in") == "header" and param.get("name", "").lower() == "if-match":
                            param["required"] = True
                if (path, method) in public and optional_token:
                    op["security"] = [{}, *op.get("security", [])]
                responses = op.setdefault("responses", {})
                if op.get("security") and "429" not in responses:  # the failed-token-check limit holds a token
                    responses["429"] = {"description": "Too many failed token checks from this address, or too "
                                        "many requests: try again after Retry-After", "content": {
                                            "application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
