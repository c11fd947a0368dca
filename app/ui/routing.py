"""The route class of every console page: domain errors and refusals become HTML pages (never
the API's JSON), and every answer carries the console's security headers; and the link a page
puts in the console's navigation (:class:`NavLink`, listed in :data:`app.ui.pages.navigation`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from app.domain.errors import QossError
from app.ui.render import page, secure
from app.ui.session import CsrfRefused, FormRefused, SignInRequired
from app.web.errors import status_for
from app.web.routing import QossRoute

__all__ = ["ConsoleRoute", "NavLink", "is_htmx"]

log = logging.getLogger("qoss.ui")
LOGIN = "/ui/login"


@dataclass(frozen=True, slots=True)
class NavLink:
    """A page's link in the console's navigation bar.

    Attributes:
        key: the ``section`` its pages render with; the link is marked current on them.
        href: where it goes.
        label: what it says.
        scopes: shown to a token with one of these (any token, for none).
    """

    key: str
    href: str
    label: str
    scopes: tuple[str, ...] = ()


def is_htmx(request: Request) -> bool:
    """Whether htmx asked (then the answer is a fragment, not a page)."""
    return request.headers.get("hx-request") == "true"


def _sign_in(request: Request) -> Response:
    """No live session: a page goes to the sign-in page; htmx (and live.js) gets 401 with a notice
    to sign in again in a new tab, and swaps nothing (``HX-Reswap: none``), so that an open edit
    form keeps what the admin typed (``session.js`` shows the notice)."""
    if is_htmx(request):
        return page("_session_ended.html", {"login": LOGIN}, status=401, headers={"HX-Reswap": "none"})
    return RedirectResponse(LOGIN, status_code=303)


def _refused(request: Request, status: int, title: str, message: str) -> Response:
    """The error page, with the navigation when the request's session was found."""
    return page("error.html", {"title": title, "message": message,
                               "console": getattr(request.state, "console", None), "section": None}, status=status)


class ConsoleRoute(QossRoute):
    """A :class:`~app.web.routing.QossRoute` whose errors are pages, and whose answers carry
    :data:`SECURITY_HEADERS`.

    The status it answers is noted on the request (``route_status``, ``answer_status``), as
    the API's routes do, for the audit record of a change (:func:`app.web.deps.get_unit`).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        declared = self.status_code or 200

        async def console_route(request: Request) -> Response:
            request.state.route_status = declared
            try:
                response = await handler(request)
            except SignInRequired:
                request.state.error_name = "Unauthenticated"
                response = _sign_in(request)
            except CsrfRefused:
                request.state.error_name = "CsrfRefused"
                response = _refused(request, 403, "Refused",
                                    "This form was not sent by this console (its CSRF token is missing or wrong). "
                                    "Reload the page and try again.")
            except FormRefused as exc:
                request.state.error_name = exc.error
                response = _refused(request, exc.status, "Cannot read this form", exc.message)
            except QossError as exc:
                request.state.error_name = type(exc).__name__
                status = status_for(exc)
                response = _refused(request, status, "Not allowed" if status == 403 else "Cannot do that",
                                    exc.message)
            except RequestValidationError as exc:
                request.state.error_name = "ValidationError"
                response = _refused(request, 422, "Invalid request",
                                    "; ".join(str(e.get("msg", "")) for e in exc.errors()) or "invalid request")
            request.state.answer_status = response.status_code
            return secure(response)

        return console_route
