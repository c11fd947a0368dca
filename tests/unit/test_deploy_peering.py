"""The systemd set of a peering side (a central qoss, or one beside a site's gateway):
``deploy/debian/qoss.service`` with the drop-in ``qoss.service.d/peering.conf`` passes
``systemd-analyze verify`` (its command pointed at this install's ``qoss``), and each
``peering.env`` example names only settings qoss has, with values it accepts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.domain.peering import valid_peer_name
from app.settings import Settings
from tests import REPO_ROOT

DEBIAN = REPO_ROOT / "deploy" / "debian"
DROP_IN = DEBIAN / "qoss.service.d" / "peering.conf"
EXAMPLES = sorted(DEBIAN.glob("*.env.example"))
QOSS = Path(sys.executable).parent / "qoss"


def _settings_of(path: Path) -> dict[str, str]:
    """An EnvironmentFile's assignments (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    return values


def _keys(text: str, section: str) -> dict[str, list[str]]:
    """A unit file's settings in ``section``, each key's values in order."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif line and not line.startswith("#") and current == section:
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_the_drop_in_needs_a_peering_env_and_leaves_the_janitor_running() -> None:
    service = _keys(DROP_IN.read_text(), "Service")
    assert service["EnvironmentFile"] == ["/etc/qoss/peering.env"]  # no "-": required
    assert service["KillMode"] == ["process"]
    assert "ExecStart" not in service  # the unit's own command, hardening and user stay as they are


def test_the_unit_and_its_peering_drop_in_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    unit = (DEBIAN / "qoss.service").read_text()
    assert "ExecStart=/opt/qoss/bin/qoss serve" in unit
    assert QOSS.is_file(), QOSS
    # the installed layout's command is this install's qoss: the same console script
    (tmp_path / "qoss.service").write_text(unit.replace("/opt/qoss/bin/qoss", str(QOSS)))
    (tmp_path / "qoss.service.d").mkdir()
    shutil.copy(DROP_IN, tmp_path / "qoss.service.d" / "peering.conf")
    if analyze is None:  # parse it at least: every line a section, a comment or KEY=VALUE
        for line in (*unit.splitlines(), *DROP_IN.read_text().splitlines()):
            assert not line.strip() or line.startswith(("#", "[")) or "=" in line, line
        return
    done = subprocess.run([analyze, "verify", str(tmp_path / "qoss.service")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr  # no unknown key, no warning
    serve = subprocess.run([str(QOSS), "serve", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert serve.returncode == 0, serve.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_a_peering_env_example_names_only_settings_qoss_takes(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = _settings_of(example)
    known = {f"QOSS_{name.upper()}" for name in Settings.model_fields}
    assert set(values) <= known, set(values) - known
    assert valid_peer_name(values["QOSS_PEER_NAME"])
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.peer_name == values["QOSS_PEER_NAME"]
    assert settings.host == values["QOSS_HOST"]
    assert [str(p) for p in settings.vici_socket_dirs] == ["/run/strongswan"]


def test_the_examples_are_one_centre_and_a_site() -> None:
    assert [p.name for p in EXAMPLES] == ["centre.env.example", "site.env.example"]
    names = {_settings_of(p)["QOSS_PEER_NAME"] for p in EXAMPLES}
    assert len(names) == 2
