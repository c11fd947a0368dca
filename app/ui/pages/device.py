"""A user's own page (not the admin's): enrol a phone or laptop through this Host.

No console sign-in: the user's private keys prove who they are, in the browser. The page only
carries what is public (Host's id and X25519 key, each target's Ed25519 key, the platforms); its
script (``static/device.js``) reads the user's key files locally, signs and seals the agent's
connect message exactly as ``qoss agent device enrol`` does, posts it to ``/v1/agent/requests``,
opens Target's sealed answer, and offers the profile, the one-time passphrase and a one-time
link (``/v1/agent/handoffs``) for the phone. Host relays an answer it cannot read.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.domain.agent.platforms import PLATFORMS
from app.ui.pages.common import console_router, host_here
from app.ui.render import page

__all__ = ["router"]

router = console_router()


@router.get("/device")
def device(request: Request) -> Response:
    """The device enrolment page of this Host (404 where this server does not play Host)."""
    host = host_here(request, nothing="there is no device enrolment here")
    published = host.published()
    platforms = [(p.name, p.label, p.offer) for p in PLATFORMS.values()]
    return page("device.html", {"console": None, "host": published, "platforms": platforms})
