"""Signing in and out: a server-side session for an API token (or, through :mod:`app.ui.pages.oidc`,
for the identity provider's user), its id in an HttpOnly cookie."""

from __future__ import annotations

from datetime import timedelta

from fastapi import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from app.domain.auth import Unauthenticated
from app.services import ui_sessions
from app.ui.pages.common import AnyWriter, console_router, failed
from app.ui.pages.oidc import post_logout_url
from app.ui.render import page
from app.ui.session import (
    ConsoleDep,
    LoginFormDep,
    clear_login_cookie,
    clear_session_cookie,
    login_check,
    login_key,
    new_login_nonce,
    set_login_cookie,
    set_session_cookie,
)
from app.web.deps import Principal, SettingsDep, UnitDep
from app.web.runtime import runtime

__all__ = ["router"]

router = console_router()


@router.get("")
def home() -> Response:
    return RedirectResponse("/ui/tables", status_code=303)


@router.get("/login")
def login_form(request: Request, uow: UnitDep) -> Response:
    """The sign-in form (its CSRF value, a nonce this server signs, is also a short-lived cookie)."""
    nonce = new_login_nonce(login_key(uow))
    response = page("login.html", {"console": None, "csrf": nonce, "error": None, "oidc_name": _oidc_name(request)})
    set_login_cookie(response, request, nonce)
    return response


@router.post("/login")
def login(request: Request, form: LoginFormDep, uow: UnitDep, settings: SettingsDep) -> Response:
    """Sign in with an API token: a server-side session, its id in an HttpOnly cookie."""
    key = login_key(uow)
    login_check(request, form, key)
    try:
        session_id, record, token = ui_sessions.sign_in(
            uow=uow, presented=form.get("token", "").strip(), ttl=timedelta(seconds=settings.ui_session_ttl),
            source=request.client.host if request.client else "",
            failures=runtime(request).auth_failures)
    except Unauthenticated:
        failed(request, "Unauthenticated", 401)
        nonce = new_login_nonce(key)
        response = page("login.html", {"console": None, "csrf": nonce, "oidc_name": _oidc_name(request),
                                       "error": "That token was not accepted (unknown, expired or revoked)."},
                        status=401)
        set_login_cookie(response, request, nonce)
        return response
    request.state.principal = Principal(token.id, token.name, token.scopes)
    request.state.audit_detail = "console sign-in"
    signed_in = RedirectResponse("/ui/tables", status_code=303)
    set_session_cookie(signed_in, request, session_id, record.expires_at)
    clear_login_cookie(signed_in, request)
    return signed_in


@router.get("/session")
def session(who: ConsoleDep) -> Response:
    """The live session's CSRF token (``{"csrf": ...}``), for a page that outlived its session:
    once the admin has signed in again in another tab, ``session.js`` puts the new session's
    token in the page's forms before sending one. As readable as the token in every page: only
    by the console's own scripts (no CORS, the cookie SameSite=Strict); 401 without a session."""
    return JSONResponse({"csrf": who.csrf})


@router.post("/logout")
def logout(request: Request, who: AnyWriter, uow: UnitDep) -> Response:
    """End the session (CSRF-checked, so another site cannot sign an admin out)."""
    ui_sessions.sign_out(uow=uow, session_id=who.session_id)
    request.state.audit_detail = "console sign-out"
    config = runtime(request).oidc
    end_session = (config.provider.end_session_url(post_logout_redirect_uri=post_logout_url(request, config))
                   if config is not None and who.token is None else None)
    response: Response
    if end_session is None:
        response = RedirectResponse("/ui/login", status_code=303)
    else:  # the identity provider's user: on to the provider's sign-out (a page: CSP form-action is 'self')
        response = page("signed_out.html", {"end_session_url": end_session, "provider": config.name if config else ""})
    clear_session_cookie(response, request)
    return response


def _oidc_name(request: Request) -> str | None:
    """The identity provider's name for the sign-in button (None: no such sign-in)."""
    config = runtime(request).oidc
    return config.name if config is not None else None
