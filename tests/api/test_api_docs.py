"""``/docs`` and ``/redoc`` from the packaged copies of Swagger UI and ReDoc: the vendored files
are the recorded releases with their licences, the pages name no other host, and each page's
Content-Security-Policy admits its scripts and nothing else (the browser test,
``tests/ui/browser/test_admin_daily.py``, loads them with every outside request aborted)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from app.api.docs import REDOC_LOGO, inline_script_hashes
from app.main import create_app
from app.settings import Settings
from tests import REPO_ROOT

STATIC = REPO_ROOT / "app" / "api" / "docs" / "static"
_OUTSIDE = re.compile(rb"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def app() -> Any:
    """The application, never started: these pages need no database, no state."""
    return create_app(Settings(database_url="sqlite:///unused-by-these-tests.db"))


class _Client:
    """Plain calls on the application in-process (each its own event loop)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def get(self, path: str) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://qoss.test") as client:
                return await client.get(path)

        return anyio.run(call)


@pytest.fixture
def client(app: Any) -> _Client:
    return _Client(app)


def _recorded() -> list[tuple[str, str, str]]:
    """(file, version, sha256) of each row of VENDORED.md."""
    rows = re.findall(r"^\| `([^`]+)` \|.*?\| ([0-9.]+) \| `([0-9a-f]{64})` \|", (STATIC / "VENDORED.md").read_text(),
                      re.MULTILINE)
    assert len(rows) == 4, rows
    return rows


@pytest.mark.parametrize(("name", "version", "sha256"), _recorded(), ids=lambda v: str(v)[:24])
def test_each_vendored_file_is_the_recorded_release(name: str, version: str, sha256: str) -> None:
    data = (STATIC / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == sha256
    if name.endswith(".js"):
        assert version.encode() in data


def test_the_licences_travel_with_the_files() -> None:
    assert "Apache License" in (STATIC / "swagger-ui.LICENSE").read_text()
    assert "SmartBear" in (STATIC / "swagger-ui.NOTICE").read_text()
    assert "MIT License" in (STATIC / "redoc.LICENSE").read_text()
    for bundled in ("swagger-ui-bundle.js.LICENSE.txt", "redoc.standalone.js.LICENSE.txt"):
        assert (STATIC / bundled).stat().st_size > 0


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_a_docs_page_names_no_other_host(client: _Client, path: str) -> None:
    page = client.get(path)
    assert page.status_code == 200
    assert not _OUTSIDE.search(page.content), page.text
    for asset in re.findall(r'(?:src|href)="(/docs/static/[^"]+)"', page.text):
        answer = client.get(asset)
        assert answer.status_code == 200, asset
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_swagger_ui_admits_its_own_inline_script_and_nothing_else(client: _Client) -> None:
    page = client.get("/docs")
    csp = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    scripts = csp["script-src"].split()
    assert scripts == ["'self'", *inline_script_hashes(page.text)]
    assert len(scripts) == 2  # the one inline script: Swagger UI's options
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"  # noqa: PT018
    assert "validatorUrl\": null" in page.text or '"validatorUrl": null' in page.text
    assert page.headers["x-frame-options"] == "DENY"


def test_redoc_runs_only_scripts_from_here(client: _Client) -> None:
    page = client.get("/redoc")
    csp = dict(part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";"))
    assert csp["script-src"] == "'self'"
    assert csp["worker-src"] == "blob:"  # ReDoc's search
    assert "fonts.googleapis.com" not in page.text


def test_the_redoc_bundle_is_served_without_its_one_outside_address(client: _Client) -> None:
    shipped = (STATIC / "redoc.standalone.js").read_bytes()
    assert shipped.count(REDOC_LOGO[0]) == 1  # the release as published names it once
    served = client.get("/docs/static/redoc.standalone.js")
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("text/javascript")
    assert REDOC_LOGO[0] not in served.content
    assert served.content == shipped.replace(*REDOC_LOGO)


def test_the_docs_are_not_operations_of_the_api(client: _Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not {p for p in paths if p.startswith(("/docs", "/redoc"))}


def test_the_packaged_copy_is_inside_the_package() -> None:
    assert STATIC.is_relative_to(Path(REPO_ROOT / "app"))
