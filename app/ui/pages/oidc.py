"""Signing in with the organisation's OpenID provider: ``/ui/oidc/start`` sends the browser there,
``/ui/oidc/callback`` takes its answer and opens a console session of the user.

The flow cookie (``qoss_oidc``, path ``/ui/oidc``; ``__Host-qoss_oidc`` over TLS) is
``SameSite=Lax``, so that the browser sends it back with the provider's redirect (a top-level
navigation from another site). The session cookie is ``SameSite=Strict``: a redirect that
continues the provider's navigation would arrive without it, so the callback answers with a
page of this console that moves on to the tables itself (a same-site navigation).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import RedirectResponse, Response

from app.adapters.oidc import OidcProvider
from app.domain.oidc import (
    FLOW_TTL,
    NoScopeMapped,
    ProviderUnavailable,
    SignInRefused,
    mapping_fingerprint,
    parse_mapping,
)
from app.services import console_oidc
from app.services.auth import record_audit
from app.services.console_oidc import OidcSignIn
from app.settings import Settings
from app.ui.pages.common import console_router, failed
from app.ui.render import page
from app.ui.session import set_session_cookie
from app.web.deps import Principal, UnitDep
from app.web.provenance import audit_fields
from app.web.runtime import runtime

__all__ = ["FLOW_COOKIE", "FLOW_COOKIE_TLS", "configured", "post_logout_url", "router"]

router = console_router()

#: The flow cookie over plain HTTP (path ``/ui/oidc``) and over TLS (``__Host-``: path ``/``).
FLOW_COOKIE = "qoss_oidc"
FLOW_COOKIE_TLS = "__Host-qoss_oidc"
CALLBACK = "/ui/oidc/callback"


def configured(settings: Settings, *, provider: OidcProvider | None = None) -> OidcSignIn | None:
    """The console's sign-in with the provider the settings name (None: none is configured).

    Args:
        settings: ``oidc_*`` and ``ui_session_ttl``.
        provider: the seam for tests (default: an :class:`OidcProvider` for the settings).
    """
    if settings.oidc_issuer is None or settings.oidc_client_id is None:
        return None
    secret = settings.oidc_client_secret.get_secret_value() if settings.oidc_client_secret else None
    mapping = parse_mapping(settings.oidc_scopes_by_claim)
    return OidcSignIn(
        provider=provider or OidcProvider(issuer=settings.oidc_issuer, client_id=settings.oidc_client_id,
                                          client_secret=secret),
        name=settings.oidc_provider_name or urlsplit(settings.oidc_issuer).hostname or settings.oidc_issuer,
        mapping=mapping,
        fingerprint=mapping_fingerprint(issuer=settings.oidc_issuer, client_id=settings.oidc_client_id,
                                        mapping=mapping),
        request_scopes=tuple(settings.oidc_request_scopes), max_ttl=timedelta(seconds=settings.ui_session_ttl),
        session_ttl=timedelta(seconds=settings.oidc_session_ttl) if settings.oidc_session_ttl else None,
        redirect_url=settings.oidc_redirect_url)


def _config(request: Request) -> OidcSignIn | None:
    found = runtime(request).oidc
    return found


def _redirect_uri(request: Request, config: OidcSignIn) -> str:
    return config.redirect_url or f"{request.url.scheme}://{request.url.netloc}{CALLBACK}"


def post_logout_url(request: Request, config: OidcSignIn) -> str:
    """Where the provider sends the browser after signing out there: this console's sign-in page
    (at the redirect URL's origin, when one is configured)."""
    base = _redirect_uri(request, config).removesuffix(CALLBACK)
    return f"{base}/ui/login"


def _flow_cookie(request: Request) -> tuple[str, str]:
    return (FLOW_COOKIE_TLS, "/") if request.url.scheme == "https" else (FLOW_COOKIE, "/ui/oidc")


def _refused(request: Request, status: int, error: str, message: str) -> Response:
    failed(request, error, status)
    response = page("error.html", {"title": "Sign-in refused", "message": message, "console": None,
                                   "section": "login"}, status=status)
    name, path = _flow_cookie(request)
    response.delete_cookie(name, path=path, httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


@router.get("/oidc/start")
def start(request: Request, uow: UnitDep) -> Response:
    """Send the browser to the provider, with a new sign-in's state, nonce and PKCE challenge."""
    config = _config(request)
    if config is None:
        return _refused(request, 404, "NotFound", "This console has no identity provider to sign in with.")
    try:
        cookie, url = console_oidc.begin(config=config, key=console_oidc.flow_key(uow),
                                         redirect_uri=_redirect_uri(request, config))
    except ProviderUnavailable as exc:
        return _refused(request, 502, "ProviderUnavailable", f"{exc.message}. Try again later, or sign in "
                                                             "with an API token.")
    response = RedirectResponse(url, status_code=303)
    name, path = _flow_cookie(request)
    response.set_cookie(name, cookie, max_age=FLOW_TTL, path=path, httponly=True, samesite="lax",
                        secure=request.url.scheme == "https")
    return response


@router.get("/oidc/callback")
def callback(request: Request, uow: UnitDep) -> Response:
    """The provider's answer: a session of the user with the scopes the mapping gives, or a page
    saying why not (nothing stored). The sign-in is in the audit log with the user's name and
    subject, never a code or a token."""
    config = _config(request)
    if config is None:
        return _refused(request, 404, "NotFound", "This console has no identity provider to sign in with.")
    answer: dict[str, Any] = {k: request.query_params.get(k, "") for k in ("state", "code", "error")}
    try:
        signed_in = console_oidc.finish(
            uow=uow, config=config, key=console_oidc.flow_key(uow), cookie=request.cookies.get(
                _flow_cookie(request)[0]), answer=answer, redirect_uri=_redirect_uri(request, config))
    except NoScopeMapped as exc:
        request.state.principal = Principal(None, exc.user, frozenset())
        request.state.audit_detail = "console sign-in with the identity provider refused: no scope mapped"
        return _refused(request, 403, "NoScopeMapped", f"{exc.message}. Ask an administrator of qoss to map "
                                                       "one of your groups to the scopes you need.")
    except SignInRefused as exc:
        return _refused(request, 401, type(exc).__name__, exc.message)
    except ProviderUnavailable as exc:
        return _refused(request, 502, "ProviderUnavailable", f"{exc.message}. Try again later, or sign in "
                                                             "with an API token.")
    record = signed_in.record
    request.state.principal = Principal(None, signed_in.name, record.scopes or frozenset())
    request.state.audit_detail = f"console sign-in with the identity provider (subject {record.subject})"[:200]
    record_audit(uow=uow, **audit_fields(request, 200))
    response = page("signed_in.html", {"console": None, "section": "login", "name": signed_in.name})
    set_session_cookie(response, request, signed_in.session_id, record.expires_at)
    name, path = _flow_cookie(request)
    response.delete_cookie(name, path=path, httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response
