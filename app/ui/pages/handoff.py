"""The page a one-time link opens on the phone (``/ui/handoff#t=<secret>&k=<key>``).

Static: the server sends the same page to everyone and learns nothing from it, for the link's
secret and key are in the fragment, which a browser never sends. Its script
(``static/handoff.js``) fetches the sealed profile once (``/v1/agent/handoffs/<secret>``),
opens it with the key (AES-256-GCM: WebCrypto, or the vendored noble-ciphers where the page is
not a secure context), checks it, and offers it as a download of its own media type and file
name, for the device's VPN client to import. A profile Host changed does not open, and the
page says so. No console sign-in, no third-party host, the console's strict CSP.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.ui.pages.common import console_router, host_here
from app.ui.render import page

__all__ = ["router"]

router = console_router()


@router.get("/handoff")
def handoff(request: Request) -> Response:
    """The one-time link's page of this Host (404 where this server does not play Host)."""
    host_here(request, nothing="there are no one-time links here")
    return page("handoff.html", {}, headers={"Referrer-Policy": "no-referrer"})
