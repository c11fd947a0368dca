"""Templates (Jinja2, autoescaped everywhere) and the headers every console answer carries."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from starlette.responses import HTMLResponse, Response

__all__ = ["SECURITY_HEADERS", "page", "secure", "share", "when"]

#: No inline script or style, no framing, forms post only here; htmx is served from 'self'.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": _CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}

_ENV = Environment(
    loader=PackageLoader("app.ui", "templates"),
    autoescape=True,  # every template, whatever its name: a value is text, never markup
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def when(value: object) -> Markup | str:
    """A moment as people read it, to the second in UTC (``2026-11-27 02:31:05 UTC``), inside a
    ``<time>`` whose ``datetime`` is the exact moment for machines; the ``when`` filter of the
    templates. ``value`` is a datetime or its ISO 8601 text (a naive one is UTC; a day alone
    stays a day); None or empty is empty, and any other text is shown as it is (escaped)."""
    if value is None or value == "":
        return ""
    moment = value
    if isinstance(value, str) and len(value) == 10:  # a day alone: 2026-11-23
        try:
            return Markup('<time datetime="{0}">{0}</time>').format(date.fromisoformat(value).isoformat())
        except ValueError:
            return value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
    if not isinstance(moment, datetime):
        return str(value)
    moment = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    return Markup('<time datetime="{}">{}</time>').format(
        moment.isoformat().replace("+00:00", "Z"), moment.strftime("%Y-%m-%d %H:%M:%S UTC"))


_ENV.filters["when"] = when


def share(**values: object) -> None:
    """Give every template these names (the console's navigation: :mod:`app.ui.pages`)."""
    _ENV.globals.update(values)


def secure(response: Response, *, cache: bool = False) -> Response:
    """Add the console's security headers (and ``no-store`` unless ``cache``: pages hold a CSRF token)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if not cache:
        response.headers["Cache-Control"] = "no-store"
    return response


def page(template: str, context: Mapping[str, Any], *, status: int = 200,
         headers: Mapping[str, str] | None = None) -> HTMLResponse:
    """Render ``template`` with ``context`` as an HTML answer with the console's headers."""
    html = _ENV.get_template(template).render(**context)
    response = HTMLResponse(html, status_code=status, headers=dict(headers or {}))
    secure(response)
    return response
