"""A user's own page for their devices (not the admin's): ``/ui/my-devices``.

No console sign-in: the keys this browser holds for the user (made on the phone when it joined,
kept in its storage by ``static/phone-keys.js``) prove who they are. The page carries only what
is public (Host's id and X25519 key, each target's Ed25519 key, the platforms' names); its script
(``static/my-devices.js``) signs and seals the agent's "my devices" request to each target through
Host, opens each target's sealed answer, lists the devices with their state, and revokes one (the
agent's disconnect of its ticket) after the user confirms. Host relays answers it cannot read.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.domain.agent.platforms import LABELS
from app.ui.pages.common import console_router, host_here
from app.ui.render import page
from app.web.runtime import runtime

__all__ = ["router"]

router = console_router()


@router.get("/my-devices")
def my_devices(request: Request) -> Response:
    """The user's devices page of this Host (404 where this server does not play Host)."""
    host = host_here(request, nothing="there are no devices here")
    sign_in = runtime(request).oidc
    return page("my_devices.html", {"console": None, "host": host.published(), "labels": dict(LABELS),
                                    "sign_in": sign_in.name if sign_in is not None else None})
