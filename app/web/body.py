"""JSON request bodies with every key once.

``json.loads`` keeps the last of two equal keys, so ``{"confidentiality": 8,
"confidentiality": 1}`` would be stored as 1 whatever the client meant. Every route
(:class:`app.web.routing.QossRoute`) parses a JSON body once, by :func:`parse_json_body`,
before FastAPI reads it (FastAPI then takes the parsed document from the request), and a
key given twice is a 422 in the API's one validation error shape, naming the key.
"""

from __future__ import annotations

import json
from email.message import Message
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.types import Message as AsgiMessage
from starlette.types import Receive

__all__ = ["DuplicateKey", "UniqueKeysRequest", "is_json_media_type", "loads", "parse_json_body", "replay"]


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


def is_json_media_type(content_type: str | None) -> bool:
    """Whether FastAPI reads a body sent with this ``Content-Type`` as JSON: ``application/json``
    or ``application/<anything>+json``, any case, any parameters. None or empty: no (FastAPI
    then validates the raw bytes, and a JSON body model refuses them with a 422). The fast
    paths ask this too, so that a body is JSON to both or to neither."""
    if not content_type:
        return False
    if content_type == "application/json":
        return True
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _is_json(request: Request) -> bool:
    """Whether FastAPI reads this request's body as JSON (:func:`is_json_media_type`)."""
    return is_json_media_type(request.headers.get("content-type"))


class UniqueKeysRequest(Request):
    """A request whose ``json()`` is :func:`loads` (parsed once, then cached): FastAPI reads a
    body through the public ``Request.json()``, and a route swaps its request for this one as
    FastAPI's "custom Request class" recipe does (:class:`app.web.routing.QossRoute`)."""

    _document: Any

    async def json(self) -> Any:
        try:
            return self._document
        except AttributeError:
            self._document = loads(await self.body())
            return self._document


async def parse_json_body(request: UniqueKeysRequest) -> None:
    """Parse a JSON body now, so that FastAPI reads the parsed document.

    Raises:
        RequestValidationError: a key given twice (422, naming it).
        HTTPException: the body is over the size cap (413).
    """
    if not _is_json(request):
        return
    try:
        await request.json()
    except DuplicateKey as exc:
        raise RequestValidationError(
            [{"type": "duplicate_key", "loc": ("body",), "msg": str(exc), "input": exc.key}]
        ) from exc
    except HTTPException:
        raise
    except Exception:  # noqa: S110 - not JSON, or the client went away: FastAPI answers that as always
        pass


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` first, then whatever the client sends next."""
    sent = False

    async def replayed() -> AsgiMessage:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
