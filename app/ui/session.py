"""Who is signed in to the console, and the checks on every change it asks for.

- The session cookie (``qoss_session``) is HttpOnly, SameSite=Strict, path ``/ui``, Secure
  when the request came over TLS (directly, or from a trusted proxy's ``X-Forwarded-Proto``:
  :mod:`app.web.provenance`), and expires with the session.
- Every request finds the session and checks its token again
  (:func:`app.services.ui_sessions.resolve`): a revoked token is signed out at once.
- Every change needs the session's CSRF token, in the form (``csrf``) or in the
  ``X-CSRF-Token`` header htmx sends; then the token's scope (403 otherwise).
- A form may be ``application/x-www-form-urlencoded`` or, to upload a file,
  ``multipart/form-data``: an uploaded file is a field whose value is the file's text.
- Sign-in has no session yet: its form carries a random value that must equal the
  short-lived ``qoss_login`` cookie (double submit; SameSite=Strict keeps it same-site).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Depends, Request
from starlette.responses import Response

from app.domain.auth import TokenRecord, check_scopes
from app.domain.sessions import csrf_matches, csrf_token
from app.services.ui_sessions import resolve
from app.web.deps import Principal, ReadUnitDep

__all__ = [
    "INVALID_UPLOAD",
    "LOGIN_COOKIE",
    "SESSION_COOKIE",
    "Console",
    "ConsoleDep",
    "CsrfRefused",
    "FormDep",
    "SignInRequired",
    "clear_session_cookie",
    "console",
    "form_fields",
    "login_check",
    "new_login_nonce",
    "set_login_cookie",
    "set_session_cookie",
    "writer",
]

SESSION_COOKIE = "qoss_session"
LOGIN_COOKIE = "qoss_login"
_MAX_FORM = 65536
_MAX_UPLOAD = 1_048_576  # a rating table's YAML, as the API's import takes it
_MAX_FIELDS = 64
#: The field a form's upload that is not UTF-8 text is named under: ``<field>.invalid``.
INVALID_UPLOAD = ".invalid"


class SignInRequired(Exception):
    """No live session: the console answers with the sign-in page (303, or ``HX-Redirect``)."""


class CsrfRefused(Exception):
    """A change without the session's (or the sign-in form's) CSRF token: 403."""


@dataclass(frozen=True)
class Console:
    """The signed-in token, its session id (for the CSRF token) and what it may do."""

    token: TokenRecord
    session_id: str

    @property
    def csrf(self) -> str:
        return csrf_token(self.session_id)

    @property
    def name(self) -> str:
        return self.token.name

    def may(self, scope: str) -> bool:
        """Whether the token has ``scope`` (or ``admin``): what it may not do is not shown."""
        try:
            check_scopes(self.token, scope)
        except PermissionError:
            return False
        return True

    def may_any(self, scopes: list[str]) -> bool:
        """Whether the token has one of ``scopes`` (any token, for none): a page shown to each of them."""
        return not scopes or any(self.may(s) for s in scopes)


def console(request: Request, uow: ReadUnitDep) -> Console:
    """The live session of this request, read in the request's read unit of work (a plain
    function: FastAPI runs it in a worker thread)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        raise SignInRequired()
    try:
        _, token = resolve(uow=uow, session_id=session_id)
    except PermissionError as exc:  # Unauthenticated
        raise SignInRequired() from exc
    request.state.principal = Principal(token.id, token.name, token.scopes)
    return Console(token=token, session_id=session_id)


ConsoleDep = Annotated[Console, Depends(console)]


async def form_fields(request: Request) -> dict[str, str]:
    """A form's fields as a dict (the last value of a repeated field).

    ``application/x-www-form-urlencoded``, or ``multipart/form-data`` where an uploaded file's
    field holds the file's text (one that is not UTF-8 is left out and named under
    ``<field>.invalid``). Any other body is an empty form (and so has no CSRF token).
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        body = await request.body()
        return _multipart(request.headers["content-type"], body) if len(body) <= _MAX_UPLOAD else {}
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = await request.body()
    if len(body) > _MAX_FORM:
        return {}
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=_MAX_FIELDS)
    except (UnicodeDecodeError, ValueError):
        return {}
    return {k: v for k, v in pairs if "\x00" not in v}


def _multipart(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a ``multipart/form-data`` body, read by the standard library's MIME parser."""
    try:
        head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    except UnicodeEncodeError:
        return {}
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return {}
    fields: dict[str, str] = {}
    for part in list(message.iter_parts())[:_MAX_FIELDS]:
        name = part.get_param("name", header="content-disposition")
        if part.get_content_disposition() != "form-data" or not isinstance(name, str):
            continue
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            fields[name + INVALID_UPLOAD] = "not UTF-8 text"
            continue
        if "\x00" in text:
            fields[name + INVALID_UPLOAD] = "not text"
            continue
        fields[name] = text
    return fields


FormDep = Annotated[dict[str, str], Depends(form_fields)]


def writer(scope: str | None) -> Callable[..., Awaitable[Console]]:
    """A dependency for a change: a live session, its CSRF token, then ``scope`` (403 without)."""

    async def dependency(request: Request, who: ConsoleDep, form: FormDep) -> Console:
        presented = form.get("csrf") or request.headers.get("x-csrf-token")
        if not csrf_matches(who.session_id, presented):
            raise CsrfRefused()
        if scope is not None:
            check_scopes(who.token, scope)  # Forbidden: 403
        return who

    return dependency


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def set_session_cookie(response: Response, request: Request, session_id: str, expires_at: datetime) -> None:
    max_age = max(0, int((expires_at - datetime.now(UTC)).total_seconds()))
    response.set_cookie(SESSION_COOKIE, session_id, max_age=max_age, path="/ui", httponly=True,
                        samesite="strict", secure=_secure(request))


def clear_session_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/ui", httponly=True, samesite="strict", secure=_secure(request))


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)


def set_login_cookie(response: Response, request: Request, nonce: str) -> None:
    response.set_cookie(LOGIN_COOKIE, nonce, max_age=900, path="/ui/login", httponly=True, samesite="strict",
                        secure=_secure(request))


def login_check(request: Request, form: dict[str, str]) -> None:
    """The sign-in form's CSRF check: its ``csrf`` must equal the ``qoss_login`` cookie."""
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    presented = form.get("csrf", "")
    if not cookie or not hmac.compare_digest(cookie.encode(), presented.encode()):
        raise CsrfRefused()
