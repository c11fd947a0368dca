"""The page an invitation opens on the phone (``/ui/join#i=<secret>``): a user with nothing but a
phone joins.

Static and public: the server sends the same page to everyone (Host's id, its X25519 key, each
target's Ed25519 key, the platforms a phone or laptop joins with) and learns nothing from it, for
the invitation's secret is in the fragment, which a browser never sends. Its script
(``static/join.js``) makes the user's keys in the browser, keeps them in this origin's storage
(``static/phone-keys.js``), redeems the invitation with their public halves
(``POST /v1/agent/invitations/redeem``), then enrols the device as the device page does
(``static/agent-client.js``) and offers the profile for the phone's platform, with the one-time
passphrase. No console sign-in, no other host, the console's strict CSP, no referrer.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.domain.agent.platforms import PLATFORMS
from app.services.agent.invitations import INVITATION_PLATFORMS
from app.ui.pages.common import console_router, host_here
from app.ui.render import page

__all__ = ["router"]

router = console_router()


@router.get("/join")
def join(request: Request) -> Response:
    """The invitation's page of this Host (404 where this server does not play Host)."""
    host = host_here(request, nothing="there are no invitations here")
    platforms = [(name, PLATFORMS[name].label, PLATFORMS[name].offer, PLATFORMS[name].media_type)
                 for name in INVITATION_PLATFORMS]
    return page("join.html", {"host": host.published(), "platforms": platforms},
                headers={"Referrer-Policy": "no-referrer"})
