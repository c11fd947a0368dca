"""Routes answered without the framework on their happy path: one registry, many routes.

A route registers here (:class:`Bypass`: a method, a path pattern, a handler, and what it
needs: a token with one of some scopes, a JSON body its parser accepts); the registry does
the rest once, as the full stack would: the token (:func:`app.web.deps.fast_token`), the
``Idempotency-Key`` rule, the body (its cap, its read, the ``Content-Type`` rule of
:func:`app.web.body.is_json_media_type`), the request id, the error mapping (the one status
table, :func:`app.web.errors.qoss_error_parts`), the JSON rendering and the audit record
(:mod:`app.web.audit_trail`, with the auditor of the running service). Anything a route's
happy path does not take (no or an unchecked token, no Content-Length, a body over the cap, a
``Content-Type`` FastAPI does not read as JSON, a body the parser refuses) goes to the full
stack, its body replayed, so refusals and validation errors have one implementation.

The ``fast_paths`` setting (``QOSS_FAST_PATHS``) turns the registry on; off, every request
takes the full stack. The twin tests (``tests/api/test_agent_fast_path.py``,
``tests/api/test_tunnels_fast_path.py``, ``tests/api/test_peering_fast_path.py``) send each case
through both and compare what a client and the audit log see.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from app.domain.agent import AgentRejected
from app.domain.errors import QossError
from app.web.audit_trail import RefusalRule, audit, changes, record_change
from app.web.body import is_json_media_type, replay
from app.web.deps import Principal, fast_token
from app.web.errors import error_body, qoss_error_parts
from app.web.provenance import audit_fields, client_request_id, new_request_id
from app.web.runtime import Runtime

__all__ = ["Answer", "Bypass", "BypassRoutes", "Call", "render"]

log = logging.getLogger("qoss.api")

_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # the routes' Idempotency-Key header

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def render(content: Any) -> bytes:
    """JSON as Starlette's ``JSONResponse`` renders it (the full stack's answers)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Answer:
    """What a handler answers: a status, the rendered body (none for a 204), extra headers."""

    status: int
    content: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class Call:
    """One request a bypass route answers, as its handler sees it.

    Attributes:
        request: the request (its ``state`` holds the request id and, with a token, the principal).
        runtime: the running service's parts.
        match: the path's match of the route's pattern.
        body: what the route's parser made of the body (None for a route without one).
        principal: the token's principal, None for a route that takes none.
        recorded: whether the handler wrote the answer's audit record itself (:meth:`write_record`).
    """

    request: Request
    runtime: Runtime
    match: re.Match[str]
    body: Any
    principal: Principal | None
    recorded: bool = False

    def note(self, detail: str) -> None:
        """The audit detail of the answer (a refusal's reason, what an answer did)."""
        self.request.state.audit_detail = detail

    def write_record(self, status: int, detail: str) -> None:
        """Write the answer's audit record now, in the calling (worker) thread, before it is sent."""
        self.note(detail)
        self.runtime.auditor.write(audit_fields(self.request, status))
        self.recorded = True


@dataclass(frozen=True)
class Bypass:
    """A route the registry answers.

    Attributes:
        method, path: the request's method and a pattern its whole path matches.
        handler: the route's own work; raises a :class:`QossError` as the full stack's route would.
        scopes: a token with one of these scopes (or ``admin``) is needed; None: the route takes
            no token (its message authenticates itself).
        parse: the body's document (a JSON body), or None to leave the request to the full stack;
            None here: the route reads no body.
        limit: the body cap for a route with a body.
        idempotency_key: whether the route reads an ``Idempotency-Key`` (one of the wrong form:
            the full stack refuses it).
        refusals: how its refusals are counted, for a route without a token.
    """

    method: str
    path: re.Pattern[str]
    handler: Callable[[Call], Awaitable[Answer]]
    scopes: frozenset[str] | None = None
    parse: Callable[[bytes], Any] | None = None
    limit: Callable[[Runtime], int] | None = None
    idempotency_key: bool = False
    refusals: RefusalRule | None = None

    def takes(self, scope: Scope) -> re.Match[str] | None:
        if scope["method"] != self.method:
            return None
        return self.path.fullmatch(scope["path"])


class BypassRoutes:
    """The registry: which requests skip the framework, and how they are answered."""

    def __init__(self, routes: Iterable[Bypass]) -> None:
        self._routes = tuple(routes)

    def route_for(self, parts: Runtime, scope: Scope) -> Bypass | None:
        """The route that takes this request, None when the full stack does (or the fast paths are off)."""
        if not parts.settings.fast_paths or scope["type"] != "http":
            return None
        return self._match(scope)

    def refusal_rule(self, scope: Scope) -> RefusalRule | None:
        """The refusal rule of a registered route this request is for, answered either way."""
        route = self._match(scope) if scope["type"] == "http" else None
        return route.refusals if route is not None else None

    def _match(self, scope: Scope) -> Bypass | None:
        for route in self._routes:
            if route.takes(scope) is not None:
                return route
        return None

    async def serve(self, parts: Runtime, route: Bypass, scope: Scope, receive: Receive, send: Send,
                    full: ASGIApp) -> None:
        """Answer one request ``route`` takes (see the module's docstring); ``full`` is the full stack."""
        request = Request(scope, receive)
        headers = request.headers
        principal = None
        if route.scopes is not None:
            try:
                token = await fast_token(request, headers.get("authorization"))
            except QossError:  # the source is barred for its failures: the full stack says so
                token = None
            if token is None or not any(name in token.scopes for name in (*route.scopes, "admin")):
                await full(scope, receive, send)
                return
            principal = Principal(token.id, token.name, token.scopes)
        key = headers.get("idempotency-key")
        if route.idempotency_key and key is not None and _KEY.match(key) is None:
            await full(scope, receive, send)
            return
        body = None
        if route.parse is not None:
            limit = route.limit(parts) if route.limit is not None else parts.settings.max_body_bytes
            length = headers.get("content-length", "")
            if not length.isdigit() or int(length) > limit or not is_json_media_type(headers.get("content-type")):
                await full(scope, receive, send)
                return
            raw = await _read(receive)
            if raw is None:  # the client went away
                return
            body = route.parse(raw) if len(raw) <= limit else None
            if body is None:
                await full(scope, replay(raw, receive), send)
                return
        match = route.takes(scope)
        assert match is not None
        request.state.request_id = rid = new_request_id()
        request.state.client_request_id = client_request_id(headers.get("x-request-id"))
        if principal is not None:
            request.state.principal = principal
        call = Call(request, parts, match, body, principal)
        answer = await _answer(route, call)
        request.state.answer_status = status = answer.status
        written = (call.recorded and 200 <= status < 300) or await record_change(request, status)
        start: list[tuple[bytes, bytes]] = []
        if status != 204:
            start += [(b"content-length", str(len(answer.content)).encode("ascii")),
                      (b"content-type", b"application/json")]
        start += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()]
        start.append((b"x-request-id", rid.encode("ascii")))
        await send({"type": "http.response.start", "status": status, "headers": start})
        await send({"type": "http.response.body", "body": answer.content})
        if not written and changes(request, status):
            audit(request, status)


async def _answer(route: Bypass, call: Call) -> Answer:
    """The handler's answer, or its error as the full stack's handlers answer it."""
    state = call.request.state
    try:
        return await route.handler(call)
    except QossError as exc:
        status, doc, extra, detail = qoss_error_parts(exc)
        state.error_name = type(exc).__name__
        if isinstance(exc, AgentRejected):
            state.audit_detail = detail
        return Answer(status, render(doc), extra)
    except PoolTimeout:
        state.error_name = "DatabaseUnavailable"
        log.warning("no database connection free within the pool timeout")
        return Answer(503, render(error_body("DatabaseUnavailable", "the service is busy: no database connection was "
                                             "free")), {"Retry-After": "1"})
    except OperationalError as exc:
        log.error("database unavailable: %s", type(exc.orig).__name__ if exc.orig else "OperationalError")
        state.error_name = "DatabaseUnavailable"
        return Answer(503, render(error_body("DatabaseUnavailable", "the database is unavailable")),
                      {"Retry-After": "1"})
    except Exception as exc:
        log.exception("unexpected error", exc_info=exc)
        state.error_name = "InternalError"
        return Answer(500, render(error_body("InternalError", "internal error")))


async def _read(receive: Receive) -> bytes | None:
    """The whole body, or None when the client went away first."""
    chunks: list[bytes] = []
    while True:
        incoming = await receive()
        if incoming["type"] != "http.request":
            return None
        chunks.append(incoming.get("body", b""))
        if not incoming.get("more_body", False):
            return b"".join(chunks)
