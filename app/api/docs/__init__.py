"""The interactive API documentation, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served from
the copies of their files in ``static/`` (``static/VENDORED.md``): the pages load nothing from
anywhere else, so they work on a machine with no way out.

The pages are FastAPI's own (:func:`fastapi.openapi.docs.get_swagger_ui_html`,
:func:`~fastapi.openapi.docs.get_redoc_html`) pointed at those files, each with its own
Content-Security-Policy:

- scripts only from here, and the one inline script FastAPI writes into the Swagger UI page
  (its options) by its SHA-256, computed from the page itself;
- requests (the OpenAPI document, **Try it out**) only to here;
- inline styles allowed: ReDoc builds its stylesheet at run time (styled-components), and
  FastAPI's ReDoc page has a ``<style>`` of its own; ReDoc's search runs in a worker made from
  a ``blob:`` URL.

ReDoc's bundle names one file on another host, the Redocly logo at the foot of its menu (no
option turns it off): the bundle is served with that address replaced by an empty image, which
ReDoc hides, so the page asks no other host for anything. The copy in ``static/`` stays the
release as published (its checksum is the one ``VENDORED.md`` records).

:func:`install` is all the application does to have them; the application is made with
``docs_url=None, redoc_url=None`` so that FastAPI's own pages (which load from a CDN) are not
there.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.staticfiles import StaticFiles

from app.web.static import WithHeaders

__all__ = ["DOCS_PATH", "REDOC_LOGO", "REDOC_PATH", "STATIC_PATH", "inline_script_hashes", "install"]

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
STATIC_PATH = "/docs/static"

#: What every answer here carries beside its Content-Security-Policy.
_HEADERS: Mapping[str, str] = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
_COMMON_CSP = ("default-src 'none'; img-src 'self' data:; connect-src 'self'; form-action 'self'; "
               "frame-ancestors 'none'; base-uri 'none'")
_STATIC_CSP = "default-src 'none'; frame-ancestors 'none'"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
#: The one address on another host in ReDoc's bundle, and what is served in its place.
REDOC_LOGO = (b"https://cdn.redoc.ly/redoc/logo-mini.svg", b"data:,")


def inline_script_hashes(html: str) -> list[str]:
    """The CSP sources (``'sha256-…'``) of the inline scripts of ``html`` (those without ``src``)."""
    return [f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode('ascii')}'"
            for body in _INLINE_SCRIPT.findall(html)]


def _page(html: HTMLResponse, csp: str) -> HTMLResponse:
    for name, value in {"Content-Security-Policy": csp, **_HEADERS}.items():
        html.headers[name] = value
    html.headers["Cache-Control"] = "no-cache"
    return html


def install(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their files (``/docs/static``) on ``app``, whose own
    ``docs_url`` and ``redoc_url`` are None. Neither page is in the OpenAPI document."""
    if app.openapi_url is None:
        return
    openapi_url = app.openapi_url
    title = app.title
    folder = files("app.api.docs") / "static"
    redoc_js = (folder / "redoc.standalone.js").read_bytes().replace(*REDOC_LOGO)

    async def redoc_bundle(_: Request) -> Response:
        return Response(redoc_js, media_type="text/javascript; charset=utf-8", headers={
            "Content-Security-Policy": _STATIC_CSP, **_HEADERS, "Cache-Control": "public, max-age=86400"})

    app.add_route(f"{STATIC_PATH}/redoc.standalone.js", redoc_bundle, include_in_schema=False)  # before the mount
    app.mount(STATIC_PATH, WithHeaders(StaticFiles(directory=str(folder)), {"Content-Security-Policy": _STATIC_CSP,
                                                                          **_HEADERS}), name="api-docs-static")

    swagger = get_swagger_ui_html(
        openapi_url=openapi_url, title=f"{title} · API (Swagger UI)",
        swagger_js_url=f"{STATIC_PATH}/swagger-ui-bundle.js", swagger_css_url=f"{STATIC_PATH}/swagger-ui.css",
        swagger_favicon_url=f"{STATIC_PATH}/favicon.png", oauth2_redirect_url=None,
        # no badge from the public validator: the page asks nothing of any other host
        swagger_ui_parameters={"validatorUrl": None},
    )
    swagger_csp = (f"{_COMMON_CSP}; script-src 'self' {' '.join(inline_script_hashes(bytes(swagger.body).decode()))}; "
                   "style-src 'self'")
    redoc = get_redoc_html(
        openapi_url=openapi_url, title=f"{title} · API (ReDoc)",
        redoc_js_url=f"{STATIC_PATH}/redoc.standalone.js", redoc_favicon_url=f"{STATIC_PATH}/favicon.png",
        with_google_fonts=False,
    )
    redoc_csp = f"{_COMMON_CSP}; script-src 'self'; style-src 'self' 'unsafe-inline'; worker-src blob:"
    swagger_body, redoc_body = bytes(swagger.body), bytes(redoc.body)

    async def swagger_ui(_: Request) -> Response:
        return _page(HTMLResponse(swagger_body), swagger_csp)

    async def redoc_ui(_: Request) -> Response:
        return _page(HTMLResponse(redoc_body), redoc_csp)

    app.add_route(DOCS_PATH, swagger_ui, include_in_schema=False)
    app.add_route(REDOC_PATH, redoc_ui, include_in_schema=False)
