"""The vendored htmx is the pinned release: its checksum is the one VENDORED.md records."""

from __future__ import annotations

import hashlib
import re
import tomllib

from tests import REPO_ROOT

STATIC = REPO_ROOT / "app" / "ui" / "static"


def test_htmx_is_the_recorded_release_with_its_licence() -> None:
    record = (STATIC / "VENDORED.md").read_text()
    row = re.search(r"\| `htmx\.min\.js` \|.*?\| ([0-9.]+) \| `([0-9a-f]{64})` \|", record)
    assert row, record
    assert hashlib.sha256((STATIC / "htmx.min.js").read_bytes()).hexdigest() == row.group(2)
    assert f'version:"{row.group(1)}"' in (STATIC / "htmx.min.js").read_text()
    assert "Zero-Clause BSD" in (STATIC / "htmx.LICENSE").read_text()


def test_templates_and_static_files_travel_in_the_package() -> None:
    """The wheel is the whole ``app`` package (files git tracks, whatever their kind): the build
    names no file pattern that could leave a template or a static file behind (the wheel test
    finds them in the built wheel)."""
    wheel = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["app"]
    assert not {"only-include", "include", "exclude"} & set(wheel)
    assert (REPO_ROOT / "app" / "ui" / "templates" / "base.html").is_file()
    assert not [line for line in (REPO_ROOT / ".gitignore").read_text().splitlines()
                if line.strip().endswith((".html", ".js", ".css", "static/", "templates/"))]
