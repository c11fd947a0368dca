"""What CI runs: .ci/run runs scripts/test.sh alone, and test.sh's full run ends with the
container stack check (scripts/compose-check.sh), whose failure fails the run; with pytest
arguments it runs those tests and nothing else. test.sh runs as it is, in a copy of the project
where every step it calls (setup, lock check, PostgreSQL, ruff, mypy, pytest, the compose check)
only records that it ran and answers what the test asks."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import REPO_ROOT

STEPS = {
    "scripts/setup.sh": "setup", "scripts/lock.sh": "lock", "scripts/compose-check.sh": "compose-check",
    ".venv/bin/ruff": "ruff", ".venv/bin/mypy": "mypy", ".venv/bin/pytest": "pytest",
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "scripts/test.sh", root / "scripts/test.sh")
    calls = tmp_path / "calls"
    for path, name in STEPS.items():
        rc = {"compose-check": "${FAKE_STACK_RC:-0}", "pytest": "${FAKE_PYTEST_RC:-0}"}.get(name, "0")
        _executable(root / path, f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit {rc}\n')
    _executable(root / "scripts/pg.sh", '#!/bin/sh\n[ "$1" = start ] && echo postgresql://127.0.0.1:1/qoss\nexit 0\n')
    return root


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _test_sh(project: Path, *args: str, stack_rc: int = 0, pytest_rc: int = 0) -> tuple[int, list[str], str]:
    """Run test.sh ARGS: its exit status, the steps it ran (in order), its stderr."""
    calls = project.parent / "calls"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "FAKE_STACK_RC": str(stack_rc), "FAKE_PYTEST_RC": str(pytest_rc)}
    done = subprocess.run(["bash", "scripts/test.sh", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, [line.split()[0] for line in calls.read_text().splitlines()], done.stderr


def test_ci_runs_the_test_command_and_nothing_else() -> None:
    lines = [line for line in (REPO_ROOT / ".ci/run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-1] == "exec bash scripts/test.sh"
    assert not any("compose" in line for line in lines)  # the stack check comes through test.sh


def test_the_full_run_ends_with_the_compose_check(project: Path) -> None:
    rc, steps, _ = _test_sh(project)
    assert rc == 0
    assert steps[-3:] == ["pytest", "pytest", "compose-check"]  # after pytest, never beside it
    assert steps.count("compose-check") == 1


def test_a_failed_compose_check_fails_the_run(project: Path) -> None:
    rc, steps, stderr = _test_sh(project, stack_rc=1)
    assert rc != 0
    assert "compose-check" in steps
    assert "the container stack check failed" in stderr


def test_a_failed_pytest_still_runs_the_compose_check_and_fails(project: Path) -> None:
    rc, steps, _ = _test_sh(project, pytest_rc=1)
    assert rc == 1
    assert steps[-1] == "compose-check"


def test_pytest_arguments_run_those_tests_alone(project: Path) -> None:
    rc, steps, _ = _test_sh(project, "tests/unit/test_deploy.py", stack_rc=1)
    assert rc == 0
    assert "compose-check" not in steps
    assert steps.count("pytest") == 1
