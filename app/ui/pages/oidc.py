"""Signing in with the organisation's OpenID provider: ``POST /ui/oidc/start`` sends the browser
there, ``/ui/oidc/callback`` takes its answer and opens a console session of the user.

The flow is bound to the browser tab that started it, by what no other origin can set or read:

1. The sign-in page's button posts to ``/ui/oidc/start`` from the console's public origin (the
   redirect URL's; ``Origin`` checked), with a random *binding* its script (``oidc.js``) made
   and keeps in this origin's ``sessionStorage``. The flow cookie's MAC covers the binding.
2. The provider sends the browser back to ``GET /ui/oidc/callback``: a page of this console,
   nothing checked or stored, whose script posts the answer (code, state) with the binding from
   ``sessionStorage`` to ``POST /ui/oidc/callback``, again from the console's own ``Origin``.
3. There the cookie, the binding and the state must match, and the state must not have been
   answered before; only then is the provider asked. A flow cookie planted by a sibling origin
   (cookie tossing) comes without its binding, which sits in the attacker's own browser: the
   victim is not signed in as the attacker.

No database transaction is open while the provider is asked: the keys are read once per process
(one short transaction), and the session and its audit record are written in a short one after
the provider has answered.

The flow cookie (``qoss_oidc``, path ``/ui/oidc``; ``__Host-qoss_oidc`` over TLS) is
``SameSite=Lax``. The session cookie is ``SameSite=Strict``; the callback's answer is a page of
this console that moves on to the tables itself.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import RedirectResponse, Response

from app.adapters.oidc import OidcProvider
from app.domain.oidc import NoScopeMapped, ProviderUnavailable, SignInRefused, mapping_fingerprint, parse_mapping
from app.services import console_oidc
from app.services.console_oidc import OidcSignIn, SignedIn
from app.settings import Settings
from app.ui.pages import oidc_flow
from app.ui.pages.common import console_router, failed
from app.ui.pages.oidc_flow import ANSWER_FIELDS, FlowCookie, signed_in_at
from app.ui.render import page
from app.ui.session import LoginFormDep, set_session_cookie
from app.web.deps import Principal, in_unit
from app.web.runtime import runtime

__all__ = ["FLOW_COOKIE", "FLOW_COOKIE_TLS", "configured", "post_logout_url", "router"]

router = console_router()

#: The flow cookie over plain HTTP (path ``/ui/oidc``) and over TLS (``__Host-``: path ``/``).
FLOW_COOKIE = "qoss_oidc"
FLOW_COOKIE_TLS = "__Host-qoss_oidc"
_COOKIE = FlowCookie(FLOW_COOKIE, "/ui/oidc")


def configured(settings: Settings, *, provider: OidcProvider | None = None) -> OidcSignIn | None:
    """The console's sign-in with the provider the settings name (None: none is configured).

    Args:
        settings: ``oidc_*`` and ``ui_session_ttl``.
        provider: the seam for tests (default: an :class:`OidcProvider` for the settings).

    Raises:
        ValueError: an issuer without ``oidc_redirect_url`` (settings made without validation).
    """
    if settings.oidc_issuer is None or settings.oidc_client_id is None:
        return None
    if settings.oidc_redirect_url is None:
        raise ValueError("QOSS_OIDC_REDIRECT_URL: needed with QOSS_OIDC_ISSUER")
    secret = settings.oidc_client_secret.get_secret_value() if settings.oidc_client_secret else None
    mapping = parse_mapping(settings.oidc_scopes_by_claim)
    return OidcSignIn(
        provider=provider or OidcProvider(issuer=settings.oidc_issuer, client_id=settings.oidc_client_id,
                                          client_secret=secret, timeout=settings.oidc_timeout,
                                          in_flight=settings.oidc_calls_in_flight),
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


def post_logout_url(request: Request, config: OidcSignIn) -> str:
    """Where the provider sends the browser after signing out there: this console's sign-in page,
    at the configured redirect URL's origin (never from the request)."""
    return f"{signed_in_at(config)}/ui/login"


def _refused(request: Request, status: int, error: str, message: str, *, forget: bool = True) -> Response:
    """A page saying why not; the sign-in's flow cookie forgotten unless ``forget`` is false."""
    failed(request, error, status)
    response = page("error.html", {"title": "Sign-in refused", "message": message, "console": None,
                                   "section": "login"}, status=status)
    if forget:
        _COOKIE.forget(response, request)
    return response


def _elsewhere(request: Request, config: OidcSignIn) -> Response:
    """A post from another origin: refused, and the flow cookie left alone (another site cannot
    so end a sign-in in progress)."""
    return _refused(request, 403, "CsrfRefused", "This sign-in was not sent by this console's sign-in page. "
                                                 f"Sign in at {signed_in_at(config)}/ui/login.",
                    forget=False)


def _unavailable(request: Request, exc: ProviderUnavailable) -> Response:
    return _refused(request, 502, "ProviderUnavailable", f"{exc.message}. Try again later, or sign in "
                                                         "with an API token.")


@router.get("/oidc/start")
def start_page() -> Response:
    """A sign-in starts from the sign-in page's button (a post with its binding): there."""
    return RedirectResponse("/ui/login", status_code=303)


@router.post("/oidc/start")
async def start(request: Request, form: LoginFormDep) -> Response:
    """Send the browser to the provider, with a new sign-in's state, nonce and PKCE challenge,
    bound to the ``binding`` the sign-in page's script keeps (posted from the console's origin).
    A page that moves on, not a redirect: the console's CSP lets a form be redirected only here."""
    config = _config(request)
    if config is None:
        return _refused(request, 404, "NotFound", "This console has no identity provider to sign in with.")
    if not oidc_flow.from_console(request, config):
        return _elsewhere(request, config)
    key = await oidc_flow.flow_key(request, config)
    try:
        cookie, url = await oidc_flow.begin(config, key=key, binding=form.get("binding", ""))
    except SignInRefused as exc:
        return _refused(request, 400, "SignInRefused", exc.message)
    except ProviderUnavailable as exc:
        return _unavailable(request, exc)
    return oidc_flow.to_provider(request, config, cookie=_COOKIE, value=cookie, url=url)


@router.get("/oidc/callback")
def callback_page(request: Request) -> Response:
    """The provider's answer arrives here: a page of this console whose script posts it, with the
    binding this tab's sign-in page kept, to ``POST /ui/oidc/callback`` (nothing is checked or
    stored here)."""
    if _config(request) is None:
        return _refused(request, 404, "NotFound", "This console has no identity provider to sign in with.")
    fields = {k: request.query_params.get(k, "")[:2048] for k in ANSWER_FIELDS}
    response = page("oidc_callback.html", {"console": None, "section": "login", **fields})
    response.headers["Cache-Control"] = "no-store"
    return response


@router.post("/oidc/callback")
async def callback(request: Request, form: LoginFormDep) -> Response:
    """The provider's answer, posted by the callback page from this console's origin: a session
    of the user with the scopes the mapping gives, or a page saying why not (nothing stored).
    The sign-in is in the audit log with the user's name and subject, never a code or a token."""
    config = _config(request)
    if config is None:
        return _refused(request, 404, "NotFound", "This console has no identity provider to sign in with.")
    if not oidc_flow.from_console(request, config):
        return _elsewhere(request, config)
    key = await oidc_flow.flow_key(request, config)
    try:
        user = await oidc_flow.verify(request, config, key=key, cookie=_COOKIE, form=form)
    except NoScopeMapped as exc:
        request.state.principal = Principal(None, exc.user, frozenset())
        request.state.audit_detail = "console sign-in with the identity provider refused: no scope mapped"
        return _refused(request, 403, "NoScopeMapped", f"{exc.message}. Ask an administrator of qoss to map "
                                                       "one of your groups to the scopes you need.")
    except SignInRefused as exc:
        return _refused(request, 401, type(exc).__name__, exc.message)
    except ProviderUnavailable as exc:
        return _unavailable(request, exc)
    request.state.principal = Principal(None, user.name, user.scopes)
    request.state.audit_detail = f"console sign-in with the identity provider (subject {user.subject})"[:200]
    signed_in: SignedIn = await in_unit(request, lambda uow, _reads: console_oidc.open_session(
        uow=uow, config=config, user=user))
    response = page("signed_in.html", {"console": None, "section": "login", "name": user.name})
    set_session_cookie(response, request, signed_in.session_id, signed_in.record.expires_at)
    _COOKIE.forget(response, request)
    return response
