"""One answer for one request whichever path serves it: the ``Content-Type`` a body is sent with.

FastAPI reads a body as JSON only when it is sent as ``application/json`` or
``application/<anything>+json`` (any case, any parameters); with no ``Content-Type`` or any
other, a JSON body model refuses it (422). Both fast paths (a tunnel's create, the agent's
messages) must do the same: each content type is sent through the application and straight
into the full stack, and status, body and headers must agree; the fast path answers only what
the full stack reads as JSON.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.adapters.agent.crypto import KeyPair
from app.main import create_app
from app.settings import Settings
from tests.api.test_agent_roles import sealed_request
from tests.api.test_idempotency import PSK_A
from tests.api.test_tunnels_fast_path import Clients, _audit, _entries, _seen, _to
from tests.api.test_tunnels_fast_path import clients as clients  # the tunnels' twins fixture
from tests.fixtures.agent_roles import agent_server_config

pytestmark = pytest.mark.anyio

#: Content-Type (None: none sent) -> whether FastAPI reads the body as JSON.
CONTENT_TYPES: list[tuple[str | None, bool]] = [
    (None, False),
    ("text/plain", False),
    ("text/plain; charset=utf-8", False),
    ("text/json", False),
    ("application/x-www-form-urlencoded", False),
    ("multipart/form-data; boundary=x", False),
    ("application/jsonx", False),
    ("application/json-seq", False),
    ("application", False),
    ("", False),
    ("application/json", True),
    ("application/json; charset=utf-8", True),
    ("Application/JSON", True),
    ("application/json;charset=UTF-8", True),
    ("application/merge-patch+json", True),
    ("application/problem+json; charset=utf-8", True),
]

_IDS = [repr(c) for c, _ in CONTENT_TYPES]


def _headers(content_type: str | None, label: str) -> dict[str, str]:
    return {"X-Request-ID": label, **({} if content_type is None else {"Content-Type": content_type})}


@pytest.mark.parametrize(("content_type", "is_json"), CONTENT_TYPES, ids=_IDS)
async def test_a_tunnel_request_gets_one_answer_for_its_content_type(
        clients: Clients, content_type: str | None, is_json: bool) -> None:
    fast, full, _, entered = clients
    body = _to(PSK_A, f"ct{CONTENT_TYPES.index((content_type, is_json))}")
    answers = []
    for i, (c, side) in enumerate(((fast, "fast"), (full, "full"))):
        entered.clear()
        r = await c.post("/v1/tunnels", content=json.dumps(body(i)).encode(),
                         headers=_headers(content_type, f"{side}-ct"))
        if i == 0:  # the fast path answers only what the full stack reads as JSON
            assert entered == ([] if is_json else ["POST /v1/tunnels"]), r.text
        answers.append(r)
    a, b = answers
    assert _seen(a) == _seen(b)
    assert a.status_code == (201 if is_json else 422), a.text
    assert await _audit(fast, "fast-ct") == await _audit(fast, "full-ct")


Agent = tuple[httpx.AsyncClient, httpx.AsyncClient, KeyPair, list[str]]


@pytest.fixture
async def agent(settings: Settings, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                ) -> AsyncIterator[Agent]:
    entered = _entries(monkeypatch)
    config, server_keys = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config}))

    async def full_stack(scope: Scope, receive: Receive, send: Send) -> None:
        await FastAPI.__call__(app, scope, receive, send)

    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test",
    ) as fast, httpx.AsyncClient(
        transport=httpx.ASGITransport(app=full_stack), base_url="http://qoss.test",
    ) as full:
        yield fast, full, server_keys, entered


@pytest.mark.parametrize(("content_type", "is_json"), CONTENT_TYPES, ids=_IDS)
@pytest.mark.parametrize("path", ["/v1/agent/requests", "/v1/agent/target/requests"])
async def test_an_agent_message_gets_one_answer_for_its_content_type(
        agent: Agent, path: str, content_type: str | None, is_json: bool) -> None:
    fast, full, server, entered = agent
    stranger = KeyPair.generate("mallory")
    answers: list[httpx.Response] = []
    for i, c in enumerate((fast, full)):
        entered.clear()
        message: dict[str, Any] = sealed_request(stranger, server)
        r = await c.post(path, content=json.dumps(message).encode(), headers=_headers(content_type, f"ct-{i}"))
        if i == 0:
            assert entered == ([] if is_json else [f"POST {path}"]), r.text
        answers.append(r)
    a, b = answers
    assert (a.status_code, a.json(), a.headers["content-type"]) == (b.status_code, b.json(), b.headers["content-type"])
    assert a.status_code == (403 if is_json else 422), a.text
