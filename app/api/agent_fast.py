"""The agent's message routes, registered to bypass the framework on their happy path.

A connect crosses two of these routes (client -> Host -> Target) and waits for both; the
middleware stack, routing and body model cost each about 70 us warm, several times that
in a connect. A POST to one of :data:`~app.api.routes.agent.MESSAGE_PATHS` whose body is
exactly ``{"message": "<text>"}`` within the size limit is answered by the registry
(:mod:`app.web.bypass`) through the same :func:`~app.api.routes.agent.handle_message` the routes
use: an answered message is a change, its record written before the answer is sent; a refusal
anyone can send in bulk is counted with those of its kind from its source
(:func:`~app.api.routes.agent.refused_in_bulk`), on this path as on the full stack.
"""

from __future__ import annotations

import re

from app.api.routes.agent import MESSAGE_PATHS, answer_body, handle_message, refusal_kind, refused_in_bulk
from app.domain.agent import MAX_WIRE_BYTES
from app.web.audit_trail import RefusalRule
from app.web.body import loads
from app.web.bypass import Answer, Bypass, Call

__all__ = ["MESSAGE_ROUTES"]

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


async def _answer(call: Call) -> Answer:
    """One message, answered as :func:`app.api.routes.agent._message` answers it."""
    request = call.request
    source = request.client.host if request.client else "unknown"
    outcome = await handle_message(call.runtime, request.scope["path"], call.body.encode("utf-8"), source, call.note,
                                   lambda outcome: call.write_record(200, outcome.audit))
    return Answer(200, answer_body(outcome))


#: The message routes, one per path.
MESSAGE_ROUTES = tuple(
    Bypass("POST", re.compile(re.escape(path)), _answer, parse=_message_of, limit=lambda _: _MAX_BODY,
           refusals=RefusalRule(in_bulk=refused_in_bulk, kind=refusal_kind))
    for path in MESSAGE_PATHS)
