"""The registry of routes that bypass the framework, and the one switch that turns it on."""

from __future__ import annotations

import ast
import re
from types import SimpleNamespace
from typing import Any

from app.api.agent_fast import MESSAGE_ROUTES
from app.api.tunnels_fast import TUNNEL_ROUTES
from app.settings import Settings
from app.web.bypass import Answer, Bypass, BypassRoutes, Call
from tests import REPO_ROOT

#: Where ``settings.fast_paths`` is read: the composition root for the mechanisms it switches
#: (each takes its choice as an argument) and the registry.
_READERS = {"app/bootstrap.py", "app/web/bypass.py"}


def _reads_fast_paths(source: str) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "fast_paths" for node in ast.walk(ast.parse(source)))


def test_the_switch_is_read_only_by_the_composition_root_and_the_registry() -> None:
    readers = {str(path.relative_to(REPO_ROOT)) for path in sorted((REPO_ROOT / "app").rglob("*.py"))
               if _reads_fast_paths(path.read_text())}
    assert readers == _READERS


def test_the_scan_sees_a_read() -> None:
    assert _reads_fast_paths("def f(s):\n    return s.fast_paths\n")
    assert not _reads_fast_paths("def f(*, fast_paths=True):\n    return fast_paths\n")


async def _ok(_: Call) -> Answer:
    return Answer(204)


def _parts(*, fast_paths: bool) -> Any:
    return SimpleNamespace(settings=Settings(fast_paths=fast_paths))


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path}


def test_a_request_is_taken_by_the_route_of_its_method_and_whole_path() -> None:
    one = Bypass("DELETE", re.compile(r"/v1/things/([a-z]+)"), _ok)
    routes = BypassRoutes([Bypass("POST", re.compile(r"/v1/things"), _ok), one])
    on = _parts(fast_paths=True)
    assert routes.route_for(on, _scope("DELETE", "/v1/things/abc")) is one
    assert routes.route_for(on, _scope("GET", "/v1/things/abc")) is None
    assert routes.route_for(on, _scope("DELETE", "/v1/things/abc/more")) is None
    assert routes.route_for(on, _scope("DELETE", "/v1/things/ABC")) is None
    assert routes.route_for(on, {"type": "websocket", "path": "/v1/things"}) is None


def test_with_the_switch_off_every_request_takes_the_full_stack() -> None:
    routes = BypassRoutes((*MESSAGE_ROUTES, *TUNNEL_ROUTES))
    off = _parts(fast_paths=False)
    for method, path in [("POST", "/v1/tunnels"), ("DELETE", "/v1/tunnels/abc"), ("POST", "/v1/agent/requests")]:
        assert routes.route_for(off, _scope(method, path)) is None
        assert routes.route_for(_parts(fast_paths=True), _scope(method, path)) is not None


def test_a_routes_refusal_rule_holds_whichever_way_it_is_answered() -> None:
    """The agent's messages carry no token: their refusals are counted by their own rule, on the
    full stack too (the switch off)."""
    routes = BypassRoutes((*MESSAGE_ROUTES, *TUNNEL_ROUTES))
    rule = routes.refusal_rule(_scope("POST", "/v1/agent/target/requests"))
    assert rule is not None
    assert (rule.in_bulk(403), rule.in_bulk(409), rule.in_bulk(503)) == (True, False, False)
    assert routes.refusal_rule(_scope("POST", "/v1/tunnels")) is None
    assert routes.refusal_rule(_scope("GET", "/v1/agent/target/requests")) is None
