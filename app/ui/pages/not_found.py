"""The console's answer to a path it does not have: a 404 page, with the navigation when
signed in. Its router is the last of the console's (:func:`app.ui.install`)."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from app.ui.pages.common import console_router
from app.ui.render import page
from app.ui.session import SignInRequired, console
from app.web.deps import ReadUnitDep

__all__ = ["router"]

router = console_router()


@router.get("/{path:path}")
def not_found(request: Request, path: str, uow: ReadUnitDep) -> Response:
    """404: no page at ``/ui/<path>`` (a plain function: the session is read in a worker thread)."""
    try:
        who = console(request, uow)
    except SignInRequired:
        who = None
    request.state.error_name = "NotFound"
    return page("error.html", {"title": "Page not found", "message": f"The console has no page at /ui/{path}.",
                               "console": who, "section": None}, status=404)
