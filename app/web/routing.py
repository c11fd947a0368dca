"""The route class of every API route.

Around each handler: the JSON body is parsed once with every key once
(:mod:`app.web.body`), and the status the route answers is noted on the request, for the
audit record its unit of work writes when it commits (:func:`app.web.deps.get_unit`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from app.web.body import UniqueKeysRequest, parse_json_body

__all__ = ["QossRoute"]


class QossRoute(APIRoute):
    """An ``APIRoute`` with unique-key JSON bodies and its answer's status on ``request.state``
    (``route_status`` before the handler runs, ``answer_status`` once it has answered)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        declared = self.status_code or 200

        async def qoss_route(request: Request) -> Response:
            request = UniqueKeysRequest(request.scope, request.receive)
            request.state.route_status = declared
            await parse_json_body(request)
            response = await handler(request)
            request.state.answer_status = response.status_code
            return response

        return qoss_route
