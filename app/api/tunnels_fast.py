"""Tunnel set-up and teardown without the framework on their happy path.

A tunnel's set-up is one request whose own work (negotiation, charon, one transaction) is a
few milliseconds; FastAPI's dependency solving, routing and middleware stack cost as much
again on the event loop. A ``POST /v1/tunnels`` or ``DELETE /v1/tunnels/{id}`` whose token
this process has checked (within ``token_cache_ttl``, or read again: :func:`app.web.deps.fast_token`)
and holds ``tunnels:write`` (or ``admin``), and (a POST) whose body is a valid tunnel request
within the size limit, is answered here by
the route's own work (:func:`app.api.routes.tunnels.set_up`, ``take_down``), with the same
statuses, error documents, ``x-request-id``, ``Idempotent-Replayed`` and audit record as the
full stack gives. Anything else (no or an unchecked token, a ``Content-Type`` FastAPI does not
read as JSON, a body the model refuses, an ``Idempotency-Key`` of the wrong form, no
Content-Length) goes to the full stack, its body replayed, so refusals and validation errors
have one implementation.

On only with ``fast_paths`` (``QOSS_FAST_PATHS``); ``tests/api/test_tunnels_fast_path.py`` sends
each case through both and compares what a client and the audit log see.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from app.api.routes.tunnels import set_up, take_down
from app.domain.errors import QossError
from app.settings import Settings
from app.web.body import is_json_media_type, loads, replay
from app.web.deps import Principal, fast_token
from app.web.errors import error_body, qoss_error_parts
from app.web.provenance import client_request_id, new_request_id
from app.web.runtime import Runtime
from app.web.schemas import TunnelIn

__all__ = ["is_tunnel_request", "serve_tunnel"]

log = logging.getLogger("qoss.api")

_CREATE = "/v1/tunnels"
_ONE = re.compile(r"^/v1/tunnels/([a-z0-9-]{1,40})$")
_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")  # the route's Idempotency-Key header

#: What the full stack's audit middleware does with an answered request's status: make sure a
#: 2xx change is recorded before it is answered (True: recorded), and queue any other record.
Recorder = Callable[[Request, int], Awaitable[bool]]
Auditor = Callable[[Request, int], None]


def is_tunnel_request(scope: Scope) -> bool:
    """Whether the fast path may take this request (a tunnel's create or delete)."""
    if scope["type"] != "http":
        return False
    method, path = scope["method"], scope["path"]
    return (method == "POST" and path == _CREATE) or (method == "DELETE" and _ONE.match(path) is not None)


def _render(content: Any) -> bytes:
    """As Starlette's ``JSONResponse`` renders (the full stack's answers)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


async def _body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        incoming = await receive()
        if incoming["type"] != "http.request":  # the client went away
            return None
        chunks.append(incoming.get("body", b""))
        if not incoming.get("more_body", False):
            return b"".join(chunks)


def _tunnel_in(body: bytes) -> TunnelIn | None:
    """The tunnel request of a body, or None for anything the full stack should answer."""
    try:
        doc = loads(body)
        return TunnelIn.model_validate(doc) if type(doc) is dict else None
    except (ValueError, ValidationError):
        return None


async def serve_tunnel(state: Runtime, scope: Scope, receive: Receive, send: Send,
                       full: Callable[[Scope, Receive, Send], Awaitable[None]], *,
                       recorded: Recorder, audit: Auditor) -> None:
    """Answer one tunnel create or delete (see the module's docstring); ``full`` is the full stack."""
    request = Request(scope, receive)
    headers = request.headers
    try:
        token = await fast_token(request, headers.get("authorization"))
    except QossError:  # the source is barred for its failures: the full stack says so
        token = None
    key = headers.get("idempotency-key")
    if token is None or not ("tunnels:write" in token.scopes or "admin" in token.scopes) \
            or (key is not None and _KEY.match(key) is None):
        await full(scope, receive, send)
        return
    settings: Settings = state.settings
    body: TunnelIn | None = None
    if scope["method"] == "POST":
        length = headers.get("content-length", "")
        if not length.isdigit() or int(length) > settings.max_body_bytes \
                or not is_json_media_type(headers.get("content-type")):
            await full(scope, receive, send)
            return
        raw = await _body(receive)
        if raw is None:
            return
        body = _tunnel_in(raw) if len(raw) <= settings.max_body_bytes else None
        if body is None:
            await full(scope, replay(raw, receive), send)
            return
    request.state.request_id = rid = new_request_id()
    request.state.client_request_id = client_request_id(headers.get("x-request-id"))
    request.state.principal = principal = Principal(token.id, token.name, token.scopes)
    request.state.route_status = 201 if body is not None else 204
    extra: dict[str, str] = {}
    content = b""
    try:
        if body is not None:
            answer = await set_up(request, principal, body, key)
            status, content = (answer.status if answer.replayed else 201), _render(answer.body)
            if answer.replayed:
                extra["Idempotent-Replayed"] = "true"
        else:
            match = _ONE.match(scope["path"])
            assert match is not None
            await take_down(request, match[1])
            status = 204
    except QossError as exc:
        status, doc, extra, _ = qoss_error_parts(exc)
        request.state.error_name = type(exc).__name__
        content = _render(doc)
    except OperationalError as exc:
        log.error("database unavailable: %s", type(exc.orig).__name__ if exc.orig else "OperationalError")
        status, request.state.error_name = 503, "DatabaseUnavailable"
        content = _render(error_body("DatabaseUnavailable", "the database is unavailable"))
    except Exception as exc:
        log.exception("unexpected error", exc_info=exc)
        status, request.state.error_name = 500, "InternalError"
        content = _render(error_body("InternalError", "internal error"))
    request.state.answer_status = status
    done = await recorded(request, status)
    start: list[tuple[bytes, bytes]] = []
    if status != 204:
        start += [(b"content-length", str(len(content)).encode("ascii")), (b"content-type", b"application/json")]
    start += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
    start.append((b"x-request-id", rid.encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": content})
    if not done:
        audit(request, status)

