"""Who is signed in to the console, and the checks on every change it asks for.

- The session cookie (``qoss_session``) is HttpOnly, SameSite=Strict, path ``/ui``, Secure
  when the request came over TLS (directly, or from a trusted proxy's ``X-Forwarded-Proto``:
  :mod:`app.web.provenance`), and expires with the session.
- Every request finds the session and checks its token again
  (:func:`app.services.ui_sessions.resolve`): a revoked token is signed out at once. A session of
  the identity provider's user (:mod:`app.services.console_oidc`) has no token: it holds while
  the provider's mapping is the one it was granted under (the runtime's ``oidc``).
- Every change needs the session's CSRF token, in the form (``csrf``) or in the
  ``X-CSRF-Token`` header htmx sends; then the token's scope (403 otherwise).
- A form may be ``application/x-www-form-urlencoded`` (at most 64 KiB) or, to upload a file,
  ``multipart/form-data`` (at most 1 MiB): an uploaded file is a field whose value is the file's
  text. Either has at most 64 fields; a part may not itself be multipart. The body is counted
  as it arrives and parsed in a worker thread; a form over its limit is 413, one of another
  kind 415, a malformed one 400 (:class:`FormRefused`).
- Sign-in has no session yet. Its form carries a nonce that must equal the short-lived
  sign-in cookie (double submit), and the nonce must be one this server made in the last 15
  minutes (``random.expiry.HMAC`` under the database's ``console-login`` key), so a cookie
  tossed in from another port of the same host (same site: SameSite does not stop it) with a
  nonce of the attacker's choosing is refused. A browser's ``Origin`` (or, without one, its
  ``Referer``) must be the console's own origin or one of ``console_origins``: a page on
  another port posting a nonce it fetched for itself is refused there. Over TLS the cookie is
  ``__Host-qoss_login`` (Secure, path ``/``, no domain), which no plain-HTTP page can set.
  The sign-in form is urlencoded only (8 KiB at most).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import quopri
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import Annotated
from urllib.parse import parse_qsl, urlsplit

from fastapi import Depends, Request
from starlette.responses import Response

from app.domain.auth import Forbidden, TokenRecord
from app.domain.ports import UnitOfWork
from app.domain.sessions import csrf_matches, csrf_token
from app.services.ui_sessions import resolve
from app.web.deps import Principal, ReadUnitDep, in_worker_thread
from app.web.runtime import runtime

__all__ = [
    "INVALID_UPLOAD",
    "LOGIN_COOKIE",
    "LOGIN_COOKIE_TLS",
    "SESSION_COOKIE",
    "Console",
    "ConsoleDep",
    "CsrfRefused",
    "FormDep",
    "FormRefused",
    "LoginFormDep",
    "SignInRequired",
    "clear_login_cookie",
    "clear_session_cookie",
    "console",
    "form_fields",
    "login_check",
    "login_form_fields",
    "login_key",
    "new_login_nonce",
    "origin",
    "set_login_cookie",
    "set_session_cookie",
    "writer",
]

SESSION_COOKIE = "qoss_session"
#: The sign-in cookie over plain HTTP (path ``/ui/login``).
LOGIN_COOKIE = "qoss_login"
#: The sign-in cookie over TLS: the prefix makes a browser take it only Secure, path ``/``, no domain.
LOGIN_COOKIE_TLS = "__Host-qoss_login"
_LOGIN_TTL = 900
_LOGIN_KEY = "console-login"
_LOGIN_CONTEXT = b"qoss console sign-in\x00"
_MAX_LOGIN_FORM = 8192
_MAX_FORM = 65536
_MAX_UPLOAD = 1_048_576  # a rating table's YAML, as the API's import takes it
_MAX_FIELDS = 64
_MAX_PART_HEAD = 8192
_URLENCODED = "application/x-www-form-urlencoded"
_MULTIPART = "multipart/form-data"
#: The field a form's upload that is not UTF-8 text is named under: ``<field>.invalid``.
INVALID_UPLOAD = ".invalid"


class SignInRequired(Exception):
    """No live session: the console answers with the sign-in page (303), or htmx with a notice
    (401, nothing swapped: :mod:`app.ui.routing`)."""


class CsrfRefused(Exception):
    """A change without the session's (or the sign-in form's) CSRF token: 403."""


@dataclass(frozen=True)
class Console:
    """Who is signed in: the token, or the identity provider's user (``token`` None, ``scopes``
    as the mapping gave them); the session id (for the CSRF token) and what they may do."""

    token: TokenRecord | None
    session_id: str
    name: str
    scopes: frozenset[str]
    #: Whose streams an event stream counts against: the token's id, or ``oidc:<subject>``.
    holder: str

    @property
    def csrf(self) -> str:
        return csrf_token(self.session_id)

    def may(self, scope: str) -> bool:
        """Whether the session has ``scope`` (or ``admin``): what it may not do is not shown."""
        return scope in self.scopes or "admin" in self.scopes

    def may_any(self, scopes: list[str]) -> bool:
        """Whether the token has one of ``scopes`` (any token, for none): a page shown to each of them."""
        return not scopes or any(self.may(s) for s in scopes)


def console(request: Request, uow: ReadUnitDep) -> Console:
    """The live session of this request, read in the request's read unit of work (a plain
    function: FastAPI runs it in a worker thread)."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        raise SignInRequired()
    oidc = runtime(request).oidc  # the identity provider's sign-in, if configured
    try:
        record, token = resolve(uow=uow, session_id=session_id, mapping_hash=oidc.fingerprint if oidc else None)
    except PermissionError as exc:  # Unauthenticated
        raise SignInRequired() from exc
    if token is not None:
        found = Console(token=token, session_id=session_id, name=token.name, scopes=token.scopes, holder=token.id)
    else:
        found = Console(token=None, session_id=session_id, name=record.user_name or "", scopes=record.scopes or
                        frozenset(), holder=record.holder)
    request.state.principal = Principal(token.id if token else None, found.name, found.scopes)
    request.state.console = found  # an error page keeps the nav
    return found


ConsoleDep = Annotated[Console, Depends(console)]


class FormRefused(Exception):
    """A form the console does not read: over its size (413), not a form it takes (415), or
    malformed (400). The console answers with an error page saying which."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def _kind(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def _body(request: Request, limit: int, what: str) -> bytes:
    """The body, counted as it arrives: refused (413) before it is read if its ``Content-Length``
    is over ``limit``, and as soon as more than ``limit`` bytes have come."""
    too_large = FormRefused(413, "PayloadTooLarge", f"{what} is limited to {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def form_fields(request: Request) -> dict[str, str]:
    """A form's fields as a dict (the last value of a repeated field).

    ``application/x-www-form-urlencoded`` (64 KiB at most), or ``multipart/form-data`` (1 MiB
    at most) where an uploaded file's field holds the file's text (one that is not UTF-8 is
    left out and named under ``<field>.invalid``). Any other body is an empty form (and so has
    no CSRF token). Parsed in a worker thread.

    Raises:
        FormRefused: over its size or field count (413), a nested multipart part or an
            unknown transfer encoding (415), malformed (400).
    """
    kind = _kind(request)
    if kind == _MULTIPART:
        body = await _body(request, _MAX_UPLOAD, "a form with a file")
        return await in_worker_thread(_multipart, request.headers["content-type"], body)
    if kind != _URLENCODED:
        return {}
    return await in_worker_thread(_urlencoded, await _body(request, _MAX_FORM, "a form"))


async def login_form_fields(request: Request) -> dict[str, str]:
    """The sign-in form's fields: urlencoded only (415 otherwise, unread), 8 KiB at most."""
    if _kind(request) != _URLENCODED:
        raise FormRefused(415, "UnsupportedMediaType", f"the sign-in form is sent as {_URLENCODED}")
    return await in_worker_thread(_urlencoded, await _body(request, _MAX_LOGIN_FORM, "the sign-in form"))


def _urlencoded(body: bytes) -> dict[str, str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise FormRefused(400, "InvalidForm", "the form is not UTF-8") from None
    try:
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=_MAX_FIELDS)
    except ValueError:  # more than max_num_fields
        raise FormRefused(413, "PayloadTooLarge", f"a form has at most {_MAX_FIELDS} fields") from None
    return {k: v for k, v in pairs if "\x00" not in v}


def _param(header: str, value: str, name: str) -> str | None:
    """A parameter of a header value (``boundary`` of a Content-Type, ``name`` of a Content-Disposition)."""
    message = Message()
    message[header] = value
    found = message.get_param(name, header=header)
    if found is None:
        return None
    return collapse_rfc2231_value(found) if isinstance(found, tuple) else found


def _multipart(content_type: str, body: bytes) -> dict[str, str]:
    """The fields of a ``multipart/form-data`` body (RFC 7578), one level deep: a part is its
    headers and its bytes, never parsed further."""
    boundary = _param("content-type", content_type, "boundary")
    if not boundary or len(boundary) > 70:
        raise FormRefused(400, "InvalidForm", "a multipart form names its boundary (1 to 70 characters)")
    sections = (b"\r\n" + body).split(b"\r\n--" + boundary.encode("latin-1", "replace"))
    if len(sections) - 2 > _MAX_FIELDS:
        raise FormRefused(413, "PayloadTooLarge", f"a form has at most {_MAX_FIELDS} fields")
    fields: dict[str, str] = {}
    for section in sections[1:]:
        if section.startswith(b"--"):
            return fields
        line_end = section.find(b"\r\n")
        if line_end < 0 or section[:line_end].strip(b" \t"):
            raise FormRefused(400, "InvalidForm", "a part of the form is cut short")
        _field(section[line_end + 2:], fields)
    raise FormRefused(400, "InvalidForm", "the form ends before its closing boundary")


def _field(part: bytes, fields: dict[str, str]) -> None:
    """Add one part of a multipart form to ``fields`` (a part that is not form-data is skipped)."""
    if part.startswith(b"\r\n"):
        head, data = b"", part[2:]
    else:
        head, found, data = part.partition(b"\r\n\r\n")
        if not found:
            raise FormRefused(400, "InvalidForm", "a part of the form has no end to its headers")
    if len(head) > _MAX_PART_HEAD:
        raise FormRefused(413, "PayloadTooLarge", f"a part's headers are limited to {_MAX_PART_HEAD} bytes")
    headers: dict[str, str] = {}
    for line in head.decode("utf-8", "replace").split("\r\n") if head else []:
        header, colon, value = line.partition(":")
        if not colon:
            raise FormRefused(400, "InvalidForm", "a part of the form has a header line without a name")
        headers[header.strip().lower()] = value.strip()
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind.startswith("multipart/"):
        raise FormRefused(415, "UnsupportedMediaType", "a form's field may not itself be multipart")
    disposition = headers.get("content-disposition", "")
    name = _param("content-disposition", disposition, "name")
    if disposition.split(";")[0].strip().lower() != "form-data" or not name:
        return
    data = _decoded(data, headers.get("content-transfer-encoding", "").lower())
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        fields[name + INVALID_UPLOAD] = "not UTF-8 text"
        return
    if "\x00" in text:
        fields[name + INVALID_UPLOAD] = "not text"
        return
    fields[name] = text


def _decoded(data: bytes, encoding: str) -> bytes:
    """A part's bytes without its Content-Transfer-Encoding (which RFC 7578 leaves to old senders)."""
    if encoding in ("", "binary", "8bit", "7bit"):
        return data
    if encoding == "base64":
        try:
            return base64.b64decode(b"".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise FormRefused(400, "InvalidForm", "a part's base64 does not decode") from None
    if encoding == "quoted-printable":
        return quopri.decodestring(data)
    raise FormRefused(415, "UnsupportedMediaType", f"a part's transfer encoding {encoding[:32]!r} is not read")


FormDep = Annotated[dict[str, str], Depends(form_fields)]
LoginFormDep = Annotated[dict[str, str], Depends(login_form_fields)]


def writer(scope: str | None) -> Callable[..., Awaitable[Console]]:
    """A dependency for a change: a live session, its CSRF token, then ``scope`` (403 without)."""

    async def dependency(request: Request, who: ConsoleDep, form: FormDep) -> Console:
        presented = form.get("csrf") or request.headers.get("x-csrf-token")
        if not csrf_matches(who.session_id, presented):
            raise CsrfRefused()
        if scope is not None and not who.may(scope):
            raise Forbidden(scope)  # 403
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


def login_key(uow: UnitOfWork) -> bytes:
    """This database's key for the sign-in nonces: 32 random bytes, made by the first caller."""
    return bytes.fromhex(uow.server_keys.get_or_create(_LOGIN_KEY, lambda: secrets.token_hex(32)))


def _login_mac(key: bytes, body: str) -> str:
    digest = hmac.new(key, _LOGIN_CONTEXT + body.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def new_login_nonce(key: bytes, *, now: float | None = None) -> str:
    """A sign-in nonce: ``random.expiry.mac``, the mac an HMAC-SHA-256 under ``key`` of the rest;
    it holds for 15 minutes from ``now`` (the present by default)."""
    expires = int(time.time() if now is None else now) + _LOGIN_TTL
    body = f"{secrets.token_urlsafe(18)}.{expires}"
    return f"{body}.{_login_mac(key, body)}"


def _minted(key: bytes, nonce: str) -> bool:
    """Whether ``nonce`` was made by :func:`new_login_nonce` under ``key`` and has not expired."""
    body, dot, mac = nonce.rpartition(".")
    expires = body.rpartition(".")[2]
    if not dot or not expires.isdigit() or len(nonce) > 128 or not nonce.isascii():
        return False
    if not hmac.compare_digest(mac.encode("ascii"), _login_mac(key, body).encode("ascii")):
        return False
    now = time.time()
    return now <= int(expires) <= now + _LOGIN_TTL


def _login_cookie(request: Request) -> tuple[str, str]:
    """The sign-in cookie's name and path: ``__Host-`` (path ``/``) over TLS."""
    return (LOGIN_COOKIE_TLS, "/") if _secure(request) else (LOGIN_COOKIE, "/ui/login")


def set_login_cookie(response: Response, request: Request, nonce: str) -> None:
    name, path = _login_cookie(request)
    response.set_cookie(name, nonce, max_age=_LOGIN_TTL, path=path, httponly=True, samesite="strict",
                        secure=_secure(request))


def clear_login_cookie(response: Response, request: Request) -> None:
    name, path = _login_cookie(request)
    response.delete_cookie(name, path=path, httponly=True, samesite="strict", secure=_secure(request))


def origin(url: str) -> str | None:
    """``scheme://host:port`` of an ``http(s)`` URL (the port always written, the host in lower
    case); None for anything else (``null``, a path, no host)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}:{port or (443 if scheme == 'https' else 80)}"


def _same_origin(request: Request) -> bool:
    """Whether the browser says this request comes from the console's own origin (the scheme and
    ``Host`` it was sent to) or one of ``console_origins``. ``Origin`` decides; without one,
    ``Referer``; a client that sends neither (not a browser posting a form) is let through."""
    sent = request.headers.get("origin")
    if sent is None:
        sent = request.headers.get("referer")
        if sent is None:
            return True
    claimed = origin(sent)
    if claimed is None:
        return False
    configured: list[str] = runtime(request).settings.console_origins
    return claimed == origin(str(request.url)) or claimed in {origin(o) for o in configured}


def login_check(request: Request, form: dict[str, str], key: bytes) -> None:
    """The sign-in form's CSRF check: sent from the console's own origin, its ``csrf`` equal to
    the sign-in cookie, and a nonce this server made under ``key`` within 15 minutes."""
    if not _same_origin(request):
        raise CsrfRefused()
    cookie = request.cookies.get(_login_cookie(request)[0], "")
    presented = form.get("csrf", "")
    if not cookie or not hmac.compare_digest(cookie.encode(), presented.encode()) or not _minted(key, cookie):
        raise CsrfRefused()
