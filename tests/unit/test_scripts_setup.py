"""scripts/setup.sh keeps one .venv for both README commands: serve.sh (the runtime lock) leaves
an environment synced to the dev lock as it is, since the dev lock has every runtime pin, and
test.sh finds its dev tools still there. The script runs as it is, in a copy of the project
where uv, dpkg-query and the virtualenv's python only record that they were called."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

DEV = "requirements/dev.txt"
RUNTIME = "requirements/runtime.txt"


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of setup.sh, the real lock files and pyproject.toml, with recording fakes."""
    root = tmp_path / "project"
    for folder in ("requirements", "scripts"):
        (root / folder).mkdir(parents=True)
    for name in ("scripts/setup.sh", DEV, RUNTIME, "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, root / name)
    calls = tmp_path / "uv-calls"
    _executable(root / "scripts/uv.sh", f'#!/bin/sh\necho "$*" >> {calls}\n')
    _executable(root / ".venv/bin/python", "#!/bin/sh\nexit 0\n")  # compileall
    _executable(tmp_path / "bin/dpkg-query", "#!/bin/sh\nprintf 'install ok installed'\n")
    return root


def _setup(project: Path, lock: str) -> list[str]:
    """Run setup.sh with QOSS_LOCK=lock; the uv commands it ran."""
    calls = project.parent / "uv-calls"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "QOSS_LOCK": lock, "PYTHON": sys.executable,
           "PATH": f"{project.parent / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "scripts/setup.sh"], cwd=project, env=env, check=True, capture_output=True, timeout=60)
    return calls.read_text().splitlines() if calls.exists() else []


def _synced(calls: list[str]) -> list[str]:
    return [call.split()[-1] for call in calls if call.startswith("pip sync ")]


def test_serving_leaves_the_dev_environment_as_it_is(project: Path) -> None:
    assert _synced(_setup(project, DEV)) == [DEV]
    assert _setup(project, RUNTIME) == []  # serve.sh: nothing removed, nothing installed
    assert _setup(project, DEV) == []  # test.sh again: its tools are still there
    assert _setup(project, RUNTIME) == []


def test_a_fresh_environment_for_serving_gets_the_runtime_lock_alone(project: Path) -> None:
    assert _synced(_setup(project, RUNTIME)) == [RUNTIME]
    assert _setup(project, RUNTIME) == []
    assert _synced(_setup(project, DEV)) == [DEV]  # the dev tools once
    assert _setup(project, RUNTIME) == []


def test_a_runtime_pin_the_dev_lock_lacks_is_synced(project: Path) -> None:
    assert _synced(_setup(project, DEV)) == [DEV]
    runtime = project / RUNTIME
    text = runtime.read_text()
    first = next(line for line in text.splitlines() if "==" in line and not line.startswith("#"))
    name, _, rest = first.partition("==")
    runtime.write_text(text.replace(first, f"{name}==0.0.0.dev0 " + rest.partition(" ")[2], 1))
    assert _synced(_setup(project, RUNTIME)) == [RUNTIME]


def test_a_changed_dev_lock_is_synced_again(project: Path) -> None:
    assert _synced(_setup(project, DEV)) == [DEV]
    with (project / DEV).open("a") as lock:
        lock.write("# changed\n")
    assert _synced(_setup(project, RUNTIME)) == [RUNTIME]  # the dev environment is out of date: not kept
    assert _synced(_setup(project, DEV)) == [DEV]


def test_serve_sh_asks_setup_for_the_runtime_lock() -> None:
    serve = (REPO_ROOT / "scripts/serve.sh").read_text()
    assert "QOSS_LOCK=${QOSS_LOCK:-requirements/runtime.txt} bash scripts/setup.sh" in serve
