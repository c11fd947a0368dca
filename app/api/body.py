"""JSON request bodies with every key once.

``json.loads`` keeps the last of two equal keys, so ``{"confidentiality": 8,
"confidentiality": 1}`` would be stored as 1 whatever the client meant. Every route is a
:class:`UniqueKeysRoute`: a JSON body is parsed once, by :func:`loads`, before FastAPI
reads it (FastAPI then takes the parsed document from the request), and a key given twice
is a 422 in the API's one validation error shape, naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from email.message import Message
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["DuplicateKey", "UniqueKeysRoute", "loads"]


class DuplicateKey(ValueError):
    """A JSON object names one key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key[:64]!r}: each key may appear once in an object")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return document


def loads(data: str | bytes) -> Any:
    """``json.loads`` that refuses a key given twice in one object.

    Raises:
        DuplicateKey: an object names a key twice.
        ValueError: not JSON (``json.JSONDecodeError``) or not UTF-8.
    """
    return json.loads(data, object_pairs_hook=_unique)


def _is_json(request: Request) -> bool:
    """Whether FastAPI reads this request's body as JSON (``application/json`` or ``+json``)."""
    content_type = request.headers.get("content-type")
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class _UniqueKeysRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class UniqueKeysRoute(APIRoute):
    """A route whose JSON body is parsed once, refusing a key given twice (422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def unique_keys(request: Request) -> Response:
            request = _UniqueKeysRequest(request.scope, request.receive)
            if _is_json(request):
                try:
                    await request.json()  # parsed here once; FastAPI reads the parsed document
                except DuplicateKey as exc:
                    raise RequestValidationError(
                        [{"type": "duplicate_key", "loc": ("body",), "msg": str(exc), "input": exc.key}]
                    ) from exc
                except HTTPException:
                    raise  # the body cap (413)
                except Exception:  # noqa: S110 - not JSON, or the client went away: FastAPI answers as always
                    pass
            return await handler(request)

        return unique_keys
