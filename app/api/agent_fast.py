"""The agent's message routes without the framework on their happy path.

A connect crosses two of these routes (client -> Host -> Target) and waits for both; the
middleware stack, routing and body model cost each about 70 us warm, several times that
in a connect. A POST to one of :data:`~app.api.routes.agent.MESSAGE_PATHS` whose body is
exactly ``{"message": "<text>"}`` within the size limit is answered here, by the same
:func:`~app.api.routes.agent.handle_message` the routes use, with the same statuses, error
documents, ``x-request-id`` and audit record as the full stack gives (an answered message is a
change: its record is written before the answer is sent; a refusal anyone can send in bulk
is counted with those of its kind from its source, :func:`~app.api.routes.agent.refused_in_bulk`).
Anything else (no Content-Length, too large, a ``Content-Type`` FastAPI does not read as JSON,
not that JSON object) goes to the full stack with its body replayed, so validation errors,
413 and the like have one implementation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import OperationalError
from starlette.types import Receive, Scope, Send

from app.api.routes.agent import MESSAGE_PATHS, answer_body, handle_message, refusal_kind, refused_in_bulk
from app.domain.agent import MAX_WIRE_BYTES
from app.domain.errors import QossError
from app.services.agent.target import Outcome
from app.web.body import is_json_media_type, loads, replay
from app.web.errors import error_body, qoss_error_parts
from app.web.provenance import client_request_id, new_request_id
from app.web.runtime import Runtime

__all__ = ["is_message_request", "serve_message"]

log = logging.getLogger("qoss.api")

#: A body longer than this is left to the full stack (its 413 and its validation).
_MAX_BODY = 2 * MAX_WIRE_BYTES + 64


def _message_of(body: bytes) -> str | None:
    """The message of a body that is exactly ``{"message": <text within the limit>}``, else None
    (a key given twice too: the full stack refuses it)."""
    try:
        doc = loads(body)
    except ValueError:
        return None
    if type(doc) is not dict or len(doc) != 1:
        return None
    message = doc.get("message")
    if type(message) is not str or not 1 <= len(message) <= MAX_WIRE_BYTES:
        return None
    return message


async def serve_message(
    state: Runtime, scope: Scope, receive: Receive, send: Send, full: Callable[[Scope, Receive, Send], Awaitable[None]]
) -> None:
    """Answer one POST to a message path (see the module's docstring); ``full`` is the full stack."""
    headers = dict(scope["headers"])
    length = headers.get(b"content-length", b"")
    if not length.isdigit() or int(length) > _MAX_BODY or not is_json_media_type(_content_type(scope)):
        await full(scope, receive, send)
        return
    chunks: list[bytes] = []
    while True:
        incoming = await receive()
        if incoming["type"] != "http.request":  # the client went away
            return
        chunks.append(incoming.get("body", b""))
        if not incoming.get("more_body", False):
            break
    body = b"".join(chunks)
    message = _message_of(body) if len(body) <= _MAX_BODY else None
    if message is None:
        await full(scope, replay(body, receive), send)
        return
    rid = new_request_id()
    client = scope.get("client")
    source = client[0] if client else "unknown"
    noted: list[str] = []
    extra: dict[str, str] = {}
    detail = ""
    auditor = state.auditor

    def record(status: int, detail: str) -> dict[str, Any]:
        """The audit record; its detail is the refusal ``note``d by the handler, if any."""
        detail = noted[-1] if noted else detail
        return {
            "request_id": rid,
            "client_request_id": client_request_id(headers.get(b"x-request-id", b"").decode("latin-1")),
            "token_id": None, "token_name": None, "scopes": [], "source": (client[0] if client else "")[:64],
            "action": "POST", "object": scope["path"][:300], "outcome": status, "detail": str(detail)[:200],
        }

    def answered(outcome: Outcome) -> None:  # a change: its record is written before it is answered
        auditor.write(record(200, outcome.audit))

    try:
        outcome = await handle_message(state, scope["path"], message.encode("utf-8"), source, noted.append,
                                       answered)
        status, content = 200, answer_body(outcome)
    except QossError as exc:
        status, doc, extra, detail = qoss_error_parts(exc)
        content = json.dumps(doc).encode("utf-8")
    except OperationalError as exc:
        log.error("database unavailable: %s", type(exc.orig).__name__ if exc.orig else "OperationalError")
        status, detail = 503, "DatabaseUnavailable"
        content = json.dumps(error_body("DatabaseUnavailable", "the database is unavailable")).encode("utf-8")
    except Exception as exc:
        log.exception("unexpected error", exc_info=exc)
        status, detail = 500, "InternalError"
        content = json.dumps(error_body("InternalError", "internal error")).encode("utf-8")
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-length", str(len(content)).encode("ascii")), (b"content-type", b"application/json"),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()),
        (b"x-request-id", rid.encode("ascii")),
    ]})
    await send({"type": "http.response.body", "body": content})
    if status == 200:
        return
    if refused_in_bulk(status):
        fields = record(status, detail)
        auditor.refused(fields, route=refusal_kind(state.request_timer.labels.label(scope), fields["detail"]))
    else:
        auditor.record(**record(status, detail))


def _content_type(scope: Scope) -> str | None:
    """The request's first ``Content-Type`` (as Starlette reads it for the full stack)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return str(value.decode("latin-1"))
    return None


def is_message_request(scope: Scope) -> bool:
    """Whether the fast path takes this request (a POST to a message path)."""
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in MESSAGE_PATHS
