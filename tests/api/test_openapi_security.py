"""The API's document declares authentication once, as the bearer security scheme: no operation
lists an ``Authorization`` header of its own (Swagger UI would show an empty field for it beside
the working Authorize button), and every protected operation carries the scheme."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.anyio

_METHODS = ("get", "put", "post", "delete", "patch")


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()
            if method in _METHODS]


async def test_no_operation_has_an_authorization_parameter(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    listed = [f"{method.upper()} {path}" for path, method, op in _operations(doc)
              for p in op.get("parameters", []) if p["name"].lower() == "authorization"]
    assert listed == []


async def test_protected_operations_carry_the_bearer_scheme(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    operations = {(method, path): op for path, method, op in _operations(doc)}
    protected = [("post", "/v1/policies"), ("put", "/v1/policies/{name}"), ("get", "/v1/tokens"),
                 ("patch", "/v1/rating-tables/{name}/ratings/{algorithm}"), ("get", "/metrics"),
                 ("get", "/v1/rating-tables")]
    for key in protected:
        assert {"bearer": []} in operations[key].get("security", []), key
    secured = [op for op in operations.values() if op.get("security")]
    assert len(secured) >= 40
