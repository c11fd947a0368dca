"""The vendored htmx is the pinned release: its checksum is the one VENDORED.md records."""

from __future__ import annotations

import hashlib
import re

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
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"ui/templates/*.html", "ui/static/*"' in pyproject
