"""Two rules every ``qoss`` command keeps, checked on all of them in-process (``CliRunner``: the
same group and exit path as ``main``):

- a file named on the command line that is not there is one line on stderr,
  ``{"error": "InvalidInput", "detail": "PATH: no such file"}``, and exit status 2, before
  anything else is done; never a traceback;
- a switch (``--dry-run``, ``--force``, ``--help`` ...) takes no value, and ``--help`` shows
  none beside it (no ``<bool>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from app.cli.main import app


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("switches") / "q.db"
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", f"sqlite:///{path}"])
    assert result.exit_code == 0, result.output
    return path


def _run(*args: str, db: Path) -> Result:
    return CliRunner().invoke(app, list(args), env={"QOSS_DATABASE_URL": f"sqlite:///{db}"})


def _no_such_file(result: Result, path: Path) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert json.loads(lines[0]) == {"error": "InvalidInput", "detail": f"{path}: no such file"}


MISSING_FILE_COMMANDS = {
    "negotiate": ["negotiate", "{missing}"],
    "ratings-import": ["ratings", "import", "{missing}"],
    "ratings-import-csv": ["ratings", "import", "{missing}", "--name", "t"],
    "policies-import": ["policies", "import", "{missing}"],
    "tunnel-up-psk-file": ["tunnel", "up", "left", "--peer", "10.99.0.2", "--psk-file", "{missing}",
                           "--remote-ts", "10.2.0.1/32"],
    "agent-enroll": ["agent", "enroll", "{missing}", "--objective", "3"],
    "agent-revoke-config": ["agent", "revoke", "alice", "--config", "{missing}"],
    "agent-connect-config": ["agent", "connect", "--config", "{missing}", "--target", "t"],
    "agent-status-config": ["agent", "status", "--config", "{missing}"],
    "agent-disconnect-config": ["agent", "disconnect", "--config", "{missing}"],
    "agent-device-list-config": ["agent", "device", "list", "--config", "{missing}"],
    "agent-device-revoke-config": ["agent", "device", "revoke", "--config", "{missing}", "ticket"],
    "agent-device-enrol-config": ["agent", "device", "enrol", "--config", "{missing}", "--target", "t",
                                  "--platform", "swanctl", "--out", "{out}"],
    "audit-verify-checkpoints": ["audit", "verify", "--checkpoints", "{missing}"],
    "bench-report-micro": ["bench", "report", "--micro", "{missing}", "--out", "{out}"],
    "bench-tunnel-micro": ["bench", "tunnel", "--micro", "{missing}", "--write-table", "t"],
}


@pytest.mark.parametrize("args", MISSING_FILE_COMMANDS.values(), ids=MISSING_FILE_COMMANDS.keys())
def test_a_missing_file_is_one_line_and_exit_2(db: Path, tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "nowhere" / "input.yaml"
    filled = [a.format(missing=missing, out=tmp_path / "out") for a in args]
    _no_such_file(_run(*filled, db=db), missing)
    assert not (tmp_path / "out").exists()  # nothing was done


def test_policies_check_names_a_missing_file_beside_the_others(db: Path, tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    result = _run("policies", "check", str(missing), db=db)
    assert (result.exit_code, result.stdout) == (1, f"{missing}: INVALID: no such file\n")


def _commands(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def test_no_help_shows_a_value_beside_a_switch() -> None:
    group = typer.main.get_command(app)
    commands = list(_commands(group))
    assert len(commands) > 40
    for path in commands:
        command = group
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        switches = [p for p in command.get_params(typer.Context(command)) if getattr(p, "is_bool_flag", False)]
        assert switches, path  # --help at least
        assert all(p.metavar == "" for p in switches), path  # what --help shows beside the switch: nothing
    for path in [(), ("ratings", "edit"), ("agent", "keygen"), ("token", "create"), ("lab", "device")]:
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        assert "--help" in shown and "<bool>" not in shown, path  # noqa: PT018
    assert "--dry-run" in CliRunner().invoke(app, ["ratings", "edit", "--help"]).output
