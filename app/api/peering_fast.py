"""A peer's messages, registered to bypass the framework on their happy path.

A peered tunnel's set-up crosses this route twice (the offer, the confirm), each time waited for
by the other side's request; the middleware stack and routing cost each about as much as the
agent's message routes save. A POST to ``/v1/peering/messages`` with a ``Content-Length`` within
the route's limit, sent as JSON (as peers send it), is answered by the registry
(:mod:`app.web.bypass`) through the same :func:`~app.api.routes.peers.answer_message` the route
uses; anything else (no length, another content type, an empty body) goes to the full stack,
which answers it as before. A message is anonymous at the HTTP level (it authenticates itself),
so the route takes no token; a refusal anyone can send in bulk, and a peer's flood past its rate, are
counted by one rule (:func:`~app.api.routes.peers.refusal_kind`), whichever path answered.
"""

from __future__ import annotations

import re

from app.api.routes.agent import refused_in_bulk
from app.api.routes.peers import MAX_MESSAGE, answer_message, refusal_kind
from app.web.audit_trail import RefusalRule
from app.web.bypass import Answer, Bypass, Call

__all__ = ["PEER_ROUTES"]


def _message(body: bytes) -> bytes | None:
    """The message as sent, None for an empty body (the full stack refuses it)."""
    return body or None


async def _answer(call: Call) -> Answer:
    return Answer(200, await answer_message(call.request, call.body))


#: The peers' message route.
PEER_ROUTES = (
    Bypass("POST", re.compile(r"/v1/peering/messages"), _answer, parse=_message, limit=lambda _: MAX_MESSAGE,
           refusals=RefusalRule(in_bulk=refused_in_bulk, kind=refusal_kind)),
)
