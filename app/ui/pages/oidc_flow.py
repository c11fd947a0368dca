"""The steps every sign-in with the console's identity provider takes, wherever it starts: the
console's sign-in (:mod:`app.ui.pages.oidc`) and the phone's (:mod:`app.ui.pages.join_sso`).

Each has a flow cookie of its own (:class:`FlowCookie`) and a flow key of its own, derived from
the database's one (:func:`flow_key`); both accept posts only from the console's public origin
(:func:`from_console`), send the browser to the provider with a page that moves on
(:func:`to_provider`), and check the provider's answer with the cookie, the tab's binding and
the state before the provider is asked (:func:`verify`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Request
from starlette.responses import Response

from app.domain.oidc import FLOW_TTL
from app.services import console_oidc
from app.services.console_oidc import OidcSignIn, ProviderUser
from app.ui.render import page
from app.ui.session import origin
from app.web.deps import in_worker_thread, write_place
from app.web.runtime import runtime

__all__ = ["ANSWER_FIELDS", "CALLBACK", "FlowCookie", "begin", "flow_key", "from_console", "signed_in_at",
           "to_provider", "verify"]

#: Where the provider answers every sign-in: the console's registered redirect URL ends so.
CALLBACK = "/ui/oidc/callback"
#: The fields of the provider's answer that a callback posts on.
ANSWER_FIELDS = ("state", "code", "error")
_FLOW_KEY = "flow"


@dataclass(frozen=True, slots=True)
class FlowCookie:
    """A sign-in's flow cookie: ``name`` at ``path`` over plain HTTP, ``__Host-name`` at ``/``
    over TLS; ``SameSite=Lax`` and HTTP only either way."""

    name: str
    path: str

    def _where(self, request: Request) -> tuple[str, str, bool]:
        tls = request.url.scheme == "https"
        return (f"__Host-{self.name}", "/", True) if tls else (self.name, self.path, False)

    def read(self, request: Request) -> str | None:
        """The cookie the browser sent with ``request``, if any."""
        return request.cookies.get(self._where(request)[0])

    def set(self, response: Response, request: Request, value: str) -> None:
        """Set the cookie to ``value`` for a flow's lifetime."""
        name, path, secure = self._where(request)
        response.set_cookie(name, value, max_age=FLOW_TTL, path=path, httponly=True, samesite="lax", secure=secure)

    def forget(self, response: Response, request: Request) -> None:
        """Have the browser forget the cookie."""
        name, path, secure = self._where(request)
        response.delete_cookie(name, path=path, httponly=True, samesite="lax", secure=secure)


async def flow_key(request: Request, config: OidcSignIn, *, label: bytes | None = None) -> bytes:
    """The key of the sign-in flows: the database's, from this process's memory or (the first
    time) one short transaction of its own; with ``label``, derived for that purpose only (a
    cookie of one flow opens no other)."""
    found = config.keys.get(_FLOW_KEY)
    if found is None:
        parts = runtime(request)

        def read() -> bytes:
            with parts.units() as uow:
                key = console_oidc.flow_key(uow)
                uow.commit()
            return key

        async with write_place(request):
            found = await in_worker_thread(read)
        config.keys.keep(_FLOW_KEY, found)
    return found if label is None else hmac.new(found, label, hashlib.sha256).digest()


def from_console(request: Request, config: OidcSignIn) -> bool:
    """Whether the browser says this post comes from the console's public origin (the redirect
    URL's): its ``Origin``, or without one its ``Referer``; a post with neither is refused."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    return sent is not None and origin(sent) == origin(config.redirect_url)


def signed_in_at(config: OidcSignIn) -> str:
    """The console's public origin, from the configured redirect URL (never from the request)."""
    return config.redirect_url.removesuffix(CALLBACK)


async def begin(config: OidcSignIn, *, key: bytes, binding: str) -> tuple[str, str]:
    """A new flow bound to ``binding``: (the flow cookie's value, the provider's URL).

    Raises:
        SignInRefused: ``binding`` is not of the shape the sign-in page makes.
        ProviderUnavailable: the provider's discovery document cannot be read.
    """
    return await in_worker_thread(console_oidc.begin, config=config, key=key, binding=binding,
                                  redirect_uri=config.redirect_url)


def to_provider(request: Request, config: OidcSignIn, *, cookie: FlowCookie, value: str, url: str) -> Response:
    """A page that moves the browser on to the provider at ``url``, setting the flow cookie. Not
    a redirect: the console's CSP lets a form be redirected only here."""
    response = page("oidc_start.html", {"authorization_url": url, "provider": config.name})
    response.headers["Cache-Control"] = "no-store"
    cookie.set(response, request, value)
    return response


async def verify(request: Request, config: OidcSignIn, *, key: bytes, cookie: FlowCookie,
                 form: Mapping[str, str]) -> ProviderUser:
    """The provider's answer posted in ``form`` (with the tab's binding), checked against the flow
    cookie: the user it signs in.

    Raises:
        SignInRefused: the flow, the binding or the answer is not good (:func:`console_oidc.verify`).
        NoScopeMapped: the mapping gives the user no scope.
        ProviderUnavailable: the provider cannot be asked.
    """
    answer = {k: form.get(k, "") for k in ANSWER_FIELDS}
    user: ProviderUser = await in_worker_thread(
        console_oidc.verify, config=config, key=key, cookie=cookie.read(request), binding=form.get("binding", ""),
        answer=answer, redirect_uri=config.redirect_url)
    return user
