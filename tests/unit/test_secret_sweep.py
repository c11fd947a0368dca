"""The suite-wide secret sweep finds what it is meant to find (so a clean sweep means something)."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

from tests.fixtures.secrets import find_leaks


def test_sweep_finds_raw_hex_and_base64_forms(tmp_path: Path) -> None:
    secret = secrets.token_bytes(32)
    files = []
    for i, form in enumerate((secret, secret.hex().encode(), base64.b64encode(secret))):
        path = tmp_path / f"f{i}.log"
        path.write_bytes(b"noise " + form + b" noise")
        files.append(path)
    clean = tmp_path / "clean.db"
    clean.write_bytes(secrets.token_bytes(4096))
    leaks = find_leaks([secret], [*files, clean])
    assert sorted(leak.split(":")[0] for leak in leaks) == sorted(str(f) for f in files)
