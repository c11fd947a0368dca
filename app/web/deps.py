"""Dependencies, declared once as ``Annotated`` aliases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, ParamSpec, TypeVar

import anyio
from fastapi import Depends, Header, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.adapters.db.audit import attach
from app.adapters.db.unit_of_work import SqlUnitOfWork
from app.domain.auth import TokenRecord, Unauthenticated, check_scopes, parse_token, secret_matches
from app.domain.charon_port import ViciFactory
from app.domain.ratelimit import Overloaded
from app.services.auth import authenticate, authenticate_source
from app.settings import Settings
from app.web.provenance import audit_fields
from app.web.runtime import runtime

__all__ = [
    "MAX_DB_INT",
    "ActorDep",
    "Bearer",
    "IfMatchDep",
    "NamePath",
    "Principal",
    "ProberDep",
    "ReadUnitDep",
    "ReaderDep",
    "SettingsDep",
    "TunnelIdPath",
    "UnitDep",
    "UserIdPath",
    "ViciDep",
    "cached_token",
    "fast_token",
    "get_read_unit",
    "get_unit",
    "in_unit",
    "in_worker_thread",
    "reader",
    "require",
    "require_token",
    "write_place",
    "write_slot",
]

#: Methods that change nothing.
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

_P = ParamSpec("_P")
_T = TypeVar("_T")


async def in_worker_thread(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Run a blocking call (database, VICI, a file, a peer over HTTP) in one of the
    ``worker_threads`` that also run the sync routes and dependencies: the one way async code
    here leaves the event loop, so every blocking call is counted against the same limit."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def _outcome(request: Request) -> int:
    """The status this request answers (:class:`app.web.routing.QossRoute` notes it)."""
    state = request.scope.get("state", {})
    status: int = state.get("answer_status") or state.get("route_status") or 200
    return status


@contextlib.asynccontextmanager
async def write_place(request: Request) -> AsyncIterator[None]:
    """One of the ``max_writes_in_flight`` places of the requests that hold (or wait for) a
    write transaction, taken on the event loop before the unit of work takes a worker thread.

    A writer waiting on the database's lock (SQLite's single writer, a PostgreSQL row lock)
    waits in a worker thread, and the writer holding the lock needs a worker thread after its
    route has run (FastAPI validates the answer in one) before its unit of work commits. With
    fewer writers than threads, those waiting can never hold every thread: the holder always
    finds one. A change that finds no place within ``write_wait_timeout`` is 503 ``Overloaded``.
    """
    parts = runtime(request)
    slots = parts.write_slots
    if slots.locked():  # every place taken: wait in line, at most write_wait_timeout
        try:
            async with asyncio.timeout(parts.settings.write_wait_timeout):
                await slots.acquire()
        except TimeoutError:
            raise Overloaded("the service is at its limit of changes in flight: retry shortly") from None
    else:  # a place is free: taken at once, no timer
        await slots.acquire()
    try:
        yield
    finally:
        slots.release()


async def write_slot(request: Request) -> AsyncIterator[None]:
    """:func:`write_place` as a dependency."""
    async with write_place(request):
        yield


@contextlib.contextmanager
def _unit(request: Request) -> Iterator[SqlUnitOfWork]:
    parts = runtime(request)
    session = parts.session_factory()
    if request.method not in _SAFE:
        request.state.audit = attach(session, lambda: audit_fields(request, _outcome(request)))
    try:
        yield SqlUnitOfWork(session, groups=parts.write_groups)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


@contextlib.contextmanager
def _read_unit(request: Request) -> Iterator[SqlUnitOfWork]:
    session = runtime(request).read_session_factory()
    try:
        yield SqlUnitOfWork(session)
    finally:
        session.rollback()
        session.close()


def get_unit(request: Request,
             _slot: Annotated[None, Depends(write_slot, scope="function")]) -> Iterator[SqlUnitOfWork]:
    """A unit of work per request: commit on success, roll back on any error.

    It ends when the route has answered but before the answer is sent (``UnitDep`` is
    function-scoped), so a client never sees a 2xx for a change that did not commit. A
    request that may change something (not GET, HEAD, OPTIONS) has its audit record written
    in the same transaction (:func:`app.adapters.db.audit.attach`).
    """
    with _unit(request) as uow:
        yield uow


def get_read_unit(request: Request) -> Iterator[SqlUnitOfWork]:
    """A read-only unit of work: never commits (SQLite: deferred BEGIN, readers never queue).

    A plain generator, so FastAPI runs it, and closes the session, in a worker thread: the
    event loop never waits on the database.
    """
    with _read_unit(request) as uow:
        yield uow


async def in_unit(request: Request, work: Callable[[SqlUnitOfWork, SqlUnitOfWork], _T]) -> _T:
    """A change's whole blocking part in one worker thread: ``work(uow, reads)`` with the
    request's unit of work (as :func:`get_unit`: committed when ``work`` returns, with the
    request's audit record in the same transaction; rolled back on any error) and a read-only
    one (as :func:`get_read_unit`), after a :func:`write_place` taken on the event loop.

    What a route with ``UnitDep`` and ``ReadUnitDep`` does in four hand-offs to worker threads
    (each dependency's start and end) and one for the route, this does in one.
    """

    def run() -> _T:
        with _unit(request) as uow, _read_unit(request) as reads:
            return work(uow, reads)

    async with write_place(request):
        return await in_worker_thread(run)


async def get_settings(request: Request) -> Settings:
    return runtime(request).settings


async def get_vici(request: Request) -> ViciFactory:
    return runtime(request).vici_factory


async def get_prober(request: Request) -> ViciFactory:
    """Charon connections for reading a gateway that is being registered or checked: the whole
    read bounded by ``gateway_probe_timeout`` (a socket that never answers holds a worker thread
    that long, never a write slot), for the API's routes and the console's forms alike."""
    from app.adapters.vici.probe import prober

    return prober(runtime(request).settings.gateway_probe_timeout)


async def get_actor(request: Request) -> str:
    """Who makes a change (recorded in revisions): the token's name, never a header the client chooses."""
    principal: Principal | None = getattr(request.state, "principal", None)
    return principal.name if principal is not None and principal.name else "anonymous"


#: Declares the bearer scheme in the OpenAPI document (the "Authorize" button of /docs). It
#: never refuses anything itself: the token is read and checked by :func:`require` / :func:`reader`.
_BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                     description="An API token (`qoss token create`), sent as `Authorization: Bearer <token>`.")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
#: The ``Authorization`` header as sent, which the checks read whole (a malformed one is held to
#: the source's failure limit); kept out of the OpenAPI document, where the scheme above stands for it.
_RawAuthorization = Annotated[str | None, Header(include_in_schema=False)]


async def get_if_match(if_match: Annotated[str | None, Header(
        description='The current revision\'s ETag, e.g. "3" (required: 428 without it)')] = None) -> int:
    """The revision a write is based on, from ``If-Match: "<revision>"`` (428 without it)."""
    if if_match is None:
        raise HTTPException(428, "If-Match with the revision's ETag is required for this write")
    value = if_match.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    if not (value.isascii() and value.isdigit()) or len(value) > 10 or int(value) > MAX_DB_INT:
        raise HTTPException(428, "If-Match must be an ETag of this API, e.g. \"3\"")
    return int(value)


#: Revisions and ids are INTEGER columns (int4 on PostgreSQL): a larger number can name
#: nothing, and sent to PostgreSQL it would be an error rather than "no such thing".
MAX_DB_INT = 2**31 - 1


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name and scopes (None fields for anonymous reads)."""

    token_id: str | None
    name: str | None
    scopes: frozenset[str]


_ANONYMOUS = Principal(None, None, frozenset())


def _presented(authorization: str | None) -> str | None:
    if authorization is not None and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return None


def _authenticate(request: Request, authorization: str | None) -> TokenRecord:
    """The token behind ``Authorization``. A request that sends the header is held to its
    source's limit of failed checks (``auth_failure_rate``, ``auth_failure_burst``): past it,
    429 before the token is looked up. A request without one is 401 and counts for nothing.
    Blocking (it may read the database): run in a worker thread."""
    parts = runtime(request)
    failures = parts.auth_failures if authorization is not None else None
    with SqlUnitOfWork(parts.read_session_factory(), owned=True) as uow:
        return authenticate_source(uow=uow, presented=_presented(authorization),
                                   source=request.client.host if request.client else "", failures=failures)


async def _token(request: Request, authorization: str | None) -> TokenRecord:
    """The caller's principal, from the token behind ``Authorization`` (noted on the request).

    A token this process read within ``token_cache_ttl`` is checked on the event loop (its
    secret's hash, expiry, revocation, the source's limit of failures); anything else (no such
    token cached, a wrong secret, a malformed header) takes the full check in a worker thread,
    where failures are counted.
    """
    record = cached_token(request, authorization)
    if record is None:
        record = await in_worker_thread(_authenticate, request, authorization)
    request.state.principal = Principal(record.id, record.name, record.scopes)
    return record


def _parsed(authorization: str | None) -> tuple[str, str, str] | None:
    """The bearer token of ``Authorization``, its id and its secret; None if there is none or it
    is not of the token format."""
    presented = _presented(authorization)
    if presented is None:
        return None
    try:
        token_id, secret = parse_token(presented)
    except Unauthenticated:
        return None
    return presented, token_id, secret


def cached_token(request: Request, authorization: str | None) -> TokenRecord | None:
    """The token behind ``Authorization`` if the process's token cache vouches for it, else None.

    Raises:
        RateLimited: the source failed too often of late (as the full check would say).
    """
    parsed = _parsed(authorization)
    return _cached(request, parsed) if parsed is not None else None


def _cached(request: Request, parsed: tuple[str, str, str]) -> TokenRecord | None:
    """:func:`cached_token` of a token already parsed (:func:`_parsed`)."""
    _, token_id, secret = parsed
    parts = runtime(request)
    record = parts.token_cache.fresh(token_id)
    if record is None or not secret_matches(secret, record.secret_hash) or not record.usable(datetime.now(UTC)):
        return None
    parts.auth_failures.check(request.client.host if request.client else "")
    return record


async def fast_token(request: Request, authorization: str | None) -> TokenRecord | None:
    """The token behind ``Authorization`` for a fast path, or None: the request then takes the
    full stack, which checks the token and counts a failure once.

    A token the cache vouches for is answered at once (:func:`cached_token`). One the cache
    read longer than ``token_cache_ttl`` ago, presented with the secret it was read with, is
    read again in a worker thread (its revocation, expiry and scopes as the database has them
    now), and cached afresh; nothing else is looked up here, so a made-up token costs no read.

    Raises:
        RateLimited: the source failed too often of late (as the full check would say).
    """
    parsed = _parsed(authorization)
    if parsed is None:
        return None
    record = _cached(request, parsed)
    if record is not None:
        return record
    presented, token_id, secret = parsed
    parts = runtime(request)
    known = parts.token_cache.last(token_id)
    if known is None or not secret_matches(secret, known.secret_hash):
        return None
    parts.auth_failures.check(request.client.host if request.client else "")

    def read() -> TokenRecord | None:
        with SqlUnitOfWork(parts.read_session_factory(), owned=True) as uow:
            try:
                return authenticate(uow=uow, presented=presented)
            except Unauthenticated:
                return None

    return await in_worker_thread(read)


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency: a valid token with ``scope`` (or ``admin``); 401 / 403 otherwise."""

    async def dependency(request: Request, _bearer: Bearer, authorization: _RawAuthorization = None,
                         ) -> Principal:
        record = await _token(request, authorization)
        check_scopes(record, scope)
        principal: Principal = request.state.principal
        return principal

    return dependency


async def reader(request: Request, _bearer: Bearer, authorization: _RawAuthorization = None,
                 ) -> Principal:
    """Public reads: open unless ``reads_require_token``; a presented token is still checked."""
    if authorization is None and not runtime(request).settings.reads_require_token:
        return _ANONYMOUS
    await _token(request, authorization)
    principal: Principal = request.state.principal
    return principal


async def require_token(request: Request, _bearer: Bearer, authorization: _RawAuthorization = None,
                        ) -> Principal:
    """A dependency: any valid token (what it may see is its scopes' business); 401 otherwise."""
    await _token(request, authorization)
    principal: Principal = request.state.principal
    return principal


UnitDep = Annotated[SqlUnitOfWork, Depends(get_unit, scope="function")]
ReadUnitDep = Annotated[SqlUnitOfWork, Depends(get_read_unit)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ActorDep = Annotated[str, Depends(get_actor)]
IfMatchDep = Annotated[int, Depends(get_if_match)]
ReaderDep = Annotated[Principal, Depends(reader)]

#: A rating table's, a policy's or a gateway's name in a path.
NamePath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
#: A tunnel's id in a path.
TunnelIdPath = Annotated[str, Path(min_length=1, max_length=40, pattern=r"^[a-z0-9-]+$")]
#: An agent user's id in a path.
UserIdPath = Annotated[str, Path(min_length=1, max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
ViciDep = Annotated[ViciFactory, Depends(get_vici)]
ProberDep = Annotated[ViciFactory, Depends(get_prober)]
