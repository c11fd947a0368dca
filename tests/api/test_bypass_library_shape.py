"""What the routes that bypass the framework (app/web/bypass.py) rely on in Starlette and
FastAPI, checked against the pinned versions: an upgrade that changes it fails here, naming the
library and its version (QOSS_FAST_PATHS=false sends every request through the full stack
meanwhile).

The registry answers a registered request before ``FastAPI.__call__``: it must find the
application's state where the lifespan put it, hand anything else to the full stack with
``scope["app"]`` set as Starlette sets it, and answer exactly as the middleware stack,
routing and error handlers do (compared case by case in tests/api/test_agent_fast_path.py and
tests/api/test_tunnels_fast_path.py).
"""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from app.api.routes.agent import MESSAGE_PATHS
from app.main import QossApp, _GuardAndAudit, create_app
from app.settings import Settings
from app.web.admission import AdmissionControl
from tests.fixtures.library_pins import assert_pinned

STARLETTE = assert_pinned("starlette", "app/web/bypass.py")
FASTAPI = assert_pinned("fastapi", "app/web/bypass.py")

pytestmark = pytest.mark.anyio


def _shape(ok: bool, what: str) -> None:
    assert ok, (f"Starlette {STARLETTE} / FastAPI {FASTAPI}: {what} changed; app/web/bypass.py relies on it "
                "(QOSS_FAST_PATHS=false avoids it)")


def test_the_application_is_a_starlette_app_whose_call_the_fast_path_precedes() -> None:
    _shape(issubclass(QossApp, FastAPI) and issubclass(FastAPI, Starlette), "FastAPI subclasses Starlette")
    _shape(list(inspect.signature(FastAPI.__call__).parameters) == ["self", "scope", "receive", "send"],
           "FastAPI.__call__(scope, receive, send)")
    _shape(isinstance(create_app(Settings()).state, State), "Starlette's app.state")


def test_the_middleware_the_fast_path_stands_in_for_is_still_the_whole_stack() -> None:
    app = create_app(Settings())
    _shape([m.cls for m in app.user_middleware] == [AdmissionControl, _GuardAndAudit],
           "app.user_middleware (the stack the fast path replaces: admission, guard and audit)")


async def test_the_full_stack_finds_the_app_in_the_scope_and_routes_each_message_path() -> None:
    app = create_app(Settings())
    seen: list[object] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope.get("app"))

    original = app.build_middleware_stack
    app.build_middleware_stack = lambda: inner  # type: ignore[method-assign]
    try:
        await Starlette.__call__(app, {"type": "http", "path": "/", "method": "GET"}, _never, _never)  # type: ignore[arg-type]
    finally:
        app.build_middleware_stack = original  # type: ignore[method-assign]
    _shape(seen == [app], "Starlette.__call__ sets scope['app'] before its middleware stack")
    paths = app.openapi()["paths"]
    _shape(all("post" in paths.get(p, {}) for p in MESSAGE_PATHS), "the message routes the fast path answers for")


async def _never(*_: object) -> None:
    raise AssertionError("not called")
