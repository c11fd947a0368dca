"""``qoss token create`` applies the rules POST /v1/tokens applies (app.domain.auth): a
refused name, scope or lifetime is one JSON error, exit status 2, and nothing is written (run
in-process: the same group and exit path as the script)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from app.cli.main import app


def qoss(*args: str, db: Path) -> Result:
    return CliRunner().invoke(app, list(args), env={"QOSS_DATABASE_URL": f"sqlite:///{db}", "QOSS_TOKEN": None,
                                                     "QOSS_CONFIG": None, "XDG_CONFIG_HOME": str(db.parent / "config")})


def _refused(db: Path, *args: str) -> str:
    done = qoss("token", "create", *args, db=db)
    assert done.exit_code == 2, (done.exit_code, done.stdout, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    error = json.loads(done.stderr)
    assert error["error"] == "InvalidInput"
    return str(error["detail"])


@pytest.mark.parametrize("name", ['"><img src=x>', "ops team", "-ops", "a" * 65])
def test_a_name_the_api_refuses_is_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    db = tmp_path / "q.db"
    detail = _refused(db, "--name", name, "--scopes", "admin")
    assert detail.startswith("a token name is 1-64 characters")
    assert name not in detail
    assert not db.exists()  # refused before the database is even opened


@pytest.mark.parametrize(("args", "detail"), [
    (("--scopes", "admin,root"), "scopes must be a non-empty subset of"),
    (("--scopes", ""), "scopes must be a non-empty subset of"),
    (("--scopes", "admin", "--expires-in", "0"), "expires_in is 1 second to 366 days"),
    (("--scopes", "admin", "--expires-in", str(366 * 86400 + 1)), "expires_in is 1 second to 366 days"),
], ids=["unknown-scope", "no-scope", "no-lifetime", "too-long"])
def test_scopes_and_lifetimes_the_api_refuses_are_refused(tmp_path: Path, args: tuple[str, ...], detail: str) -> None:
    db = tmp_path / "q.db"
    assert _refused(db, "--name", "ops", *args).startswith(detail)
    assert not db.exists()


def test_a_plain_name_still_makes_a_token_audited_as_the_local_operator(tmp_path: Path) -> None:
    import getpass

    db = tmp_path / "q.db"
    assert qoss("db", "upgrade", db=db).exit_code == 0
    made = qoss("token", "create", "--name", "ops.team@site-1", "--scopes", "tunnels:read", "-o", "json", db=db)
    assert made.exit_code == 0, made.stderr
    assert json.loads(made.stdout)["name"] == "ops.team@site-1"
    with sqlite3.connect(db) as conn:
        tokens = conn.execute("SELECT name, created_by FROM api_tokens").fetchall()
        audit = conn.execute("SELECT token_name, action, detail FROM audit_events").fetchall()
    assert tokens == [("ops.team@site-1", f"local:{getpass.getuser()}")]
    assert [(a[0], a[1]) for a in audit] == [(f"local:{getpass.getuser()}", "POST")]


def test_the_machine_makes_tokens_only_until_the_database_has_an_admin(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    assert qoss("db", "upgrade", db=db).exit_code == 0
    assert qoss("token", "create", "--name", "reader", "--scopes", "tunnels:read", db=db).exit_code == 0
    first = qoss("token", "create", "--name", "first-admin", "--scopes", "admin", "-o", "json", db=db)
    assert first.exit_code == 0, first.stderr
    again = qoss("token", "create", "--name", "second", "--scopes", "tunnels:read", db=db)
    assert again.exit_code == 2
    assert json.loads(again.stderr)["error"] == "Conflict"
    with sqlite3.connect(db) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM api_tokens ORDER BY name")]
        conn.execute("UPDATE api_tokens SET revoked_at = created_at WHERE name = 'first-admin'")
    assert names == ["first-admin", "reader"]
    assert qoss("token", "create", "--name", "after-revoke", "--scopes", "admin", db=db).exit_code == 0
