"""Every HTTP request counted and timed, labelled with its route's template.

The label is the template a route was declared with (``/v1/tunnels/{tunnel_id}``), never
the path a client sent: a path names ids and typos without end, a template is one of the
app's few dozen. A request answered before routing (503 Overloaded, 413, the agent's fast
path) is labelled by the template its path matches; one that no route takes is
``unmatched``. Methods outside HTTP's usual ones are ``other``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from re import Pattern

from starlette.routing import BaseRoute, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.domain.ports import Metrics

__all__ = ["UNMATCHED", "RequestTimer", "RouteLabels"]

#: The route label of a request no route takes.
UNMATCHED = "unmatched"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RouteLabels:
    """Route templates, as the app declares them (prefix included), for the ``route`` label.

    Args:
        routes: ``(route, full template)`` for every route, e.g. ``(route, "/v1/tunnels/{tunnel_id}")``.
    """

    def __init__(self, routes: Iterable[tuple[BaseRoute, str]]) -> None:
        pairs = list(routes)
        self._by_route = {id(route): template for route, template in pairs}
        self._static = {template: template for _, template in pairs if "{" not in template}
        self._patterns: list[tuple[Pattern[str], str]] = [
            (compile_path(template)[0], template) for _, template in pairs if "{" in template]

    def label(self, scope: Scope) -> str:
        """The template of the route that took (or would take) this request, else :data:`UNMATCHED`."""
        route = scope.get("route")
        if route is not None and id(route) in self._by_route:
            return self._by_route[id(route)]
        path: str = scope["path"]
        if path in self._static:
            return path
        for pattern, template in self._patterns:
            if pattern.match(path):
                return template
        return UNMATCHED


class RequestTimer:
    """Counts and times one application's HTTP requests (see the module's docstring)."""

    def __init__(self, metrics: Metrics, labels: RouteLabels) -> None:
        self.metrics = metrics
        self.labels = labels

    async def __call__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Run ``app`` on the request, then count it."""
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            method = scope["method"] if scope["method"] in _METHODS else "other"
            route = self.labels.label(scope)
            self.metrics.count("qoss_http_requests_total", route=route, method=method, status=str(status))
            self.metrics.observe("qoss_http_request_seconds", time.perf_counter() - start, route=route,
                                 method=method)
