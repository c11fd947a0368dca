"""Single sign-on on the phone's page instead of an invitation: ``/ui/join/sign-in``.

Where the console's OpenID provider is configured, a person with only a phone signs in with it
and enrols one device of their own, as an invitation for their own user id would let them:

1. ``GET /ui/join/sign-in``: the platform (recognised from the browser, changeable) and the
   provider's button. Its script (``oidc.js``, the console's sign-in's) makes a random *binding*,
   keeps it and the platform in this tab's ``sessionStorage`` and posts the binding to ``POST
   /ui/join/oidc/start`` from this console's own origin (``Origin`` checked).
2. The console's own sign-in flow (:mod:`app.services.console_oidc`) under a key of its own:
   state, nonce and PKCE, the flow cookie (``qoss_join_oidc``) bound to the binding. The provider
   answers at the console's registered redirect URL (``/ui/oidc/callback``), whose script
   (``oidc.js``) finds this tab's join binding and posts the answer with it and the platform to
   ``POST /ui/join/oidc/callback``, again from the console's origin.
3. There the cookie, the binding and the state must match and the state is taken once; only
   then is the provider asked. The mapping must give the person ``agent:enroll-device`` (or
   ``admin``); their agent user id is their ``preferred_username`` (else their verified email's
   local part: :func:`app.domain.oidc.agent_user_id`). Host makes a one-time invitation of a few
   minutes for that user id and platform, made by ``oidc:<name>``, and the page moves on to the
   phone's join page with it (``/ui/join#i=…``), which redeems it as any invitation: the phone's
   keys for that user id and one device enrolment.

Anyone the mapping does not let enrol devices is refused with a page that says so; nothing is
made. Every outcome is in the audit log under the signed-in name, never a code, token or secret.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.domain.agent.platforms import LABELS
from app.domain.errors import AlreadyExists, InvalidInput
from app.domain.oidc import DEVICE_SCOPE, NoScopeMapped, ProviderUnavailable, SignInRefused
from app.services.agent.host import HostAgent
from app.services.agent.invitations import INVITATION_PLATFORMS
from app.services.console_oidc import OidcSignIn
from app.ui.pages import oidc_flow
from app.ui.pages.common import console_router, failed
from app.ui.pages.oidc_flow import FlowCookie, signed_in_at
from app.ui.render import page
from app.ui.session import LoginFormDep
from app.web.deps import Principal, in_worker_thread
from app.web.runtime import runtime

__all__ = ["JOIN_FLOW_COOKIE", "JOIN_FLOW_COOKIE_TLS", "SIGN_IN_INVITATION_TTL", "router"]

router = console_router()

#: The phone's sign-in flow cookie over plain HTTP (path ``/ui/join/oidc``) and over TLS.
JOIN_FLOW_COOKIE = "qoss_join_oidc"
JOIN_FLOW_COOKIE_TLS = "__Host-qoss_join_oidc"
#: Seconds the invitation a sign-in makes lives: the phone's page redeems it at once.
SIGN_IN_INVITATION_TTL = 300
#: The phone's sign-in flows are under the console's flow key derived for them only (a console
#: sign-in's cookie opens no phone sign-in, and the other way round).
_LABEL = b"qoss phone sign-in\x00"
_COOKIE = FlowCookie(JOIN_FLOW_COOKIE, "/ui/join/oidc")


def _said(request: Request, status: int, error: str, title: str, message: str, *, forget: bool = True) -> Response:
    """A page for the phone's user saying what happened and what to do; the flow cookie forgotten."""
    failed(request, error, status)
    response = page("join_refused.html", {"title": title, "message": message},
                    status=status)
    if forget:
        _COOKIE.forget(response, request)
    return response


def _here(request: Request, *, posted: bool = True) -> tuple[OidcSignIn, HostAgent] | Response:
    """The provider and Host of the phone's sign-in, or the page saying why not: neither is here,
    or (``posted``) the post comes from another origin."""
    parts = runtime(request)
    config, host = parts.oidc, parts.agent_host
    if config is None or host is None:
        return _none_here(request)
    if posted and not oidc_flow.from_console(request, config):
        return _elsewhere(request, config)
    return config, host


def _none_here(request: Request) -> Response:
    return _said(request, 404, "NotFound", "No sign-in here",
                 "This server offers no sign-in to enrol a phone. Ask your administrator for an invitation link.")


def _elsewhere(request: Request, config: OidcSignIn) -> Response:
    where = signed_in_at(config)
    return _said(request, 403, "CsrfRefused", "Sign-in refused",
                 f"This sign-in was not sent by this server's page. Open {where}/ui/join/sign-in and sign in there.",
                 forget=False)


@router.get("/join/sign-in")
def sign_in_page(request: Request) -> Response:
    """The phone's sign-in with the identity provider, to enrol a device without an invitation."""
    found = _here(request, posted=False)
    if isinstance(found, Response):
        return found
    config, _ = found
    response = page("join_sign_in.html", {"provider": config.name,
                                          "platforms": [(p, LABELS[p]) for p in INVITATION_PLATFORMS]})
    response.headers["Cache-Control"] = "no-store"
    return response


@router.post("/join/oidc/start")
async def start(request: Request, form: LoginFormDep) -> Response:
    """Send the phone to the provider, the flow bound to the binding this tab keeps."""
    found = _here(request)
    if isinstance(found, Response):
        return found
    config, _ = found
    key = await oidc_flow.flow_key(request, config, label=_LABEL)
    try:
        cookie, url = await oidc_flow.begin(config, key=key, binding=form.get("binding", ""))
    except SignInRefused:
        return _said(request, 400, "SignInRefused", "Sign-in refused",
                     "This sign-in did not start from this server's page. Go back to the page and sign in again.")
    except ProviderUnavailable:
        return _unavailable(request, config)
    return oidc_flow.to_provider(request, config, cookie=_COOKIE, value=cookie, url=url)


@router.post("/join/oidc/callback")
async def callback(request: Request, form: LoginFormDep) -> Response:
    """The provider's answer, posted on by the callback page with this tab's binding and platform:
    an invitation of the signed-in person's own user id for that platform, and on to the join page;
    or a page saying why not (nothing made)."""
    found = _here(request)
    if isinstance(found, Response):
        return found
    config, host = found
    platform = form.get("platform", "")
    if platform not in INVITATION_PLATFORMS:
        return _said(request, 422, "InvalidInput", "Which device?",
                     "This sign-in names no device type. Go back to the sign-in page, choose your device and sign "
                     "in again.")
    key = await oidc_flow.flow_key(request, config, label=_LABEL)
    again = "Go back to the sign-in page and sign in again."
    try:
        user = await oidc_flow.verify(request, config, key=key, cookie=_COOKIE, form=form)
    except NoScopeMapped as exc:
        request.state.principal = Principal(None, exc.user, frozenset())
        request.state.audit_detail = "phone sign-in refused: no scope mapped"
        return _not_allowed(request, exc.user.removeprefix("oidc:"))
    except SignInRefused as exc:
        return _said(request, 401, type(exc).__name__, "Sign-in refused", f"{exc.message} {again}")
    except ProviderUnavailable:
        return _unavailable(request, config)
    request.state.principal = Principal(None, user.name, user.scopes)
    if not ({DEVICE_SCOPE, "admin"} & user.scopes):
        request.state.audit_detail = "phone sign-in refused: agent:enroll-device not mapped"
        return _not_allowed(request, user.name.removeprefix("oidc:"))
    if user.agent_user is None:
        request.state.audit_detail = "phone sign-in refused: no agent user id in the claims"
        return _said(request, 403, "InvalidInput", "No user name to enrol",
                     f"{config.name} gives no user name this network can enrol devices under. Ask your "
                     "administrator for an invitation link instead.")
    agent_user = user.agent_user
    try:
        secret, made = await in_worker_thread(
            host.invitations.invite, user_id=agent_user, platform=platform, created_by=user.name,
            ttl=SIGN_IN_INVITATION_TTL)
    except AlreadyExists:
        request.state.audit_detail = f"phone sign-in refused: {agent_user} is enrolled with keys of their own"
        return _said(request, 409, "AlreadyExists", "Enrolled already",
                     f"Your user name {agent_user} is enrolled with keys of its own (from a computer), so a phone "
                     "cannot join under it. Ask your administrator for an invitation for your phone.")
    except InvalidInput as exc:
        return _said(request, 422, "InvalidInput", "Cannot enrol this device", f"{exc.message}.")
    request.state.audit_detail = (f"phone sign-in: device enrolment for user={agent_user} platform={platform} "
                                  f"invitation={made['id']}")[:200]
    response = page("join_signed_in.html", {"next_url": f"/ui/join#i={secret}", "name": user.name})
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    _COOKIE.forget(response, request)
    return response


def _unavailable(request: Request, config: OidcSignIn) -> Response:
    return _said(request, 502, "ProviderUnavailable", "Sign-in not available",
                 f"{config.name} does not answer just now. Try again in a few minutes.")


def _not_allowed(request: Request, who: str) -> Response:
    return _said(request, 403, "NoScopeMapped", "Not allowed to enrol devices",
                 f"You signed in as {who}, but your account is not allowed to enrol devices on this network. Ask "
                 "your administrator to add you to the group that may, or for an invitation link.")
