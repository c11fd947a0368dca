"""Every command that opens the database, on one it cannot use: one line, exit status 2, nothing created.

Set-up commands (``db upgrade``, ``serve``, ``lab up``) migrate the database; every other
command that opens it on this machine (the first token, the agent's, the audit's) refuses one
that is missing, never migrated, behind or unreadable with one line naming ``qoss db upgrade``
(app/cli/db.py). Most cases run in-process (``CliRunner``: the
same group and exit path as ``main``); two run as real processes, as a user sees them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from app.adapters.db.migrate import downgrade
from app.cli.main import app
from tests.cli.run import qoss
from tests.fixtures.db import postgres_database

UPGRADE = "run 'qoss db upgrade' (with the same --database-url)"


def run(*args: str, url: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [*args, "--database-url", url], env=env)


def assert_one_line(result: Result, *phrases: str) -> None:
    """Exit status 2 and a single ``qoss: ...`` line on stderr holding every phrase; nothing on stdout."""
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("qoss: ")
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What the commands read besides the database: a user's public key, a negotiation request."""
    directory = tmp_path_factory.mktemp("inputs")
    assert CliRunner().invoke(app, ["agent", "keygen", "alice", "--dir", str(directory / "keys")]).exit_code == 0
    request = directory / "request.json"
    request.write_text(json.dumps({"peers": [{"name": "app", "min_levels": {"integrity": 4}}]}))
    return {"pub": directory / "keys" / "alice.pub.json", "request": request,
            "agent_config": directory / "absent.yaml"}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database at head, copied by the tests that change it."""
    path = tmp_path_factory.mktemp("template") / "q.db"
    result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", f"sqlite:///{path}"])
    assert result.exit_code == 0, result.stderr
    return path


def copy(template: Path, to: Path) -> str:
    to.write_bytes(template.read_bytes())
    return f"sqlite:///{to}"


#: Every command that works on an existing database on this machine (its arguments up to the
#: database option); the others go through the service (test_through_service.py).
WORKING = {
    "agent enroll": lambda f: ["agent", "enroll", str(f["pub"]), "--objective", "3"],
    "agent users": lambda f: ["agent", "users"],
    "agent revoke": lambda f: ["agent", "revoke", "alice", "--config", str(f["agent_config"])],
    "token create": lambda f: ["token", "create", "--name", "first", "--scopes", "admin"],
    "audit verify": lambda f: ["audit", "verify"],
    "audit export": lambda f: ["audit", "export"],
}


@pytest.mark.parametrize("command", WORKING)
def test_a_command_on_a_database_that_does_not_exist_says_run_db_upgrade_and_creates_nothing(
        tmp_path: Path, files: dict[str, Path], command: str) -> None:
    db = tmp_path / "sub" / "never.db"
    assert_one_line(run(*WORKING[command](files), url=f"sqlite:///{db}"), "there is no database at", UPGRADE)
    assert not (tmp_path / "sub").exists()


@pytest.mark.parametrize("command", ["agent users", "audit verify", "token create"])
def test_a_command_on_a_database_never_migrated_says_so_and_changes_nothing(
        tmp_path: Path, files: dict[str, Path], command: str) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    assert_one_line(run(*WORKING[command](files), url=f"sqlite:///{db}"), "was never migrated", UPGRADE)
    assert db.stat().st_size == 0
    assert not list(tmp_path.glob("empty.db-*"))


@pytest.mark.parametrize("command", ["agent enroll", "agent users", "token create"])
def test_a_command_on_a_database_behind_names_both_migrations_until_it_is_upgraded(
        tmp_path: Path, migrated: Path, files: dict[str, Path], command: str) -> None:
    url = copy(migrated, tmp_path / "old.db")
    downgrade(url, "-1")
    assert_one_line(run(*WORKING[command](files), url=url), "is at migration", "this qoss needs", UPGRADE)
    assert run("db", "upgrade", url=url).exit_code == 0
    after = run(*WORKING[command](files), url=url)
    assert after.exit_code == 0, after.stderr


def test_a_database_from_a_newer_version_is_refused_by_every_command_and_by_db_upgrade(
        tmp_path: Path, migrated: Path) -> None:
    url = copy(migrated, tmp_path / "newer.db")
    with sqlite3.connect(tmp_path / "newer.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'f00dfeed'")
    assert_one_line(run("agent", "users", url=url), "at migration f00dfeed", "does not know")
    assert_one_line(run("db", "upgrade", url=url), "cannot migrate", "f00dfeed")


@pytest.mark.parametrize("kind", ["directory", "not a database"])
def test_a_database_that_cannot_be_read_is_one_line_for_reading_and_setting_up(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "x.db"
    if kind == "directory":
        db.mkdir()
    else:
        db.write_bytes(b"these bytes are not a SQLite database, however long they go on")
    before = db.read_bytes() if db.is_file() else None
    assert_one_line(run("agent", "users", url=f"sqlite:///{db}"), "cannot read the database")
    assert_one_line(run("db", "upgrade", url=f"sqlite:///{db}"), "cannot set up the database")
    assert (db.read_bytes() if db.is_file() else None) == before


def test_an_unreachable_postgresql_is_one_line_without_the_password() -> None:
    url = "postgresql+psycopg://qoss:not-this-password@127.0.0.1:1/qoss"
    for args in (["agent", "users"], ["db", "upgrade"], ["token", "create", "--name", "a", "--scopes", "admin"]):
        result = run(*args, url=url)
        assert_one_line(result, "127.0.0.1", "refused")
        assert "not-this-password" not in result.stderr


@pytest.fixture
def postgres_never_migrated() -> Iterator[str]:
    with postgres_database() as url:
        downgrade(url, "base")
        yield url


@pytest.mark.postgres
def test_a_postgresql_database_never_migrated_is_refused_then_set_up(postgres_never_migrated: str) -> None:
    url = postgres_never_migrated
    assert_one_line(run("agent", "users", url=url), "was never migrated", UPGRADE)
    assert_one_line(run("token", "create", "--name", "first-admin", "--scopes", "admin", url=url),
                    "was never migrated", UPGRADE)
    assert run("db", "upgrade", url=url).exit_code == 0
    made = run("token", "create", "--name", "first-admin", "--scopes", "admin", "--plain", url=url)
    assert made.exit_code == 0, made.stderr
    assert run("agent", "users", url=url).stdout.strip() == "[]"


def test_db_upgrade_makes_a_database_the_first_token_then_goes_in(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new/q.db"
    made = run("db", "upgrade", url=url)
    assert made.exit_code == 0, made.stderr
    token = run("token", "create", "--name", "first", "--scopes", "admin", "-o", "json", url=url)
    assert token.exit_code == 0, token.stderr
    assert json.loads(token.stdout)["scopes"] == ["admin"]


def test_a_failed_set_up_removes_the_file_and_directories_it_made(tmp_path: Path) -> None:
    ratings = tmp_path / "ratings"
    ratings.mkdir()
    (ratings / "broken.yaml").write_text("name: broken\nratings: 7\n")
    result = run("db", "upgrade", url=f"sqlite:///{tmp_path}/new/sub/q.db", env={"QOSS_RATINGS_DIR": str(ratings)})
    assert_one_line(result, "cannot load the shipped data", "broken")
    assert not (tmp_path / "new").exists()


def test_a_database_error_met_later_in_a_command_is_one_line(tmp_path: Path, migrated: Path) -> None:
    url = copy(migrated, tmp_path / "q.db")
    with sqlite3.connect(tmp_path / "q.db") as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        conn.execute(f"DROP TABLE {next(t for t in tables if 'token' in t)}")
    assert_one_line(run("token", "create", "--name", "t", "--scopes", "admin", url=url), "database error",
                    "no such table")


def test_as_a_user_sees_it_agent_enroll_on_a_fresh_path_then_after_db_upgrade(
        tmp_path: Path, files: dict[str, Path]) -> None:
    db = tmp_path / "host.db"
    out = qoss("agent", "enroll", str(files["pub"]), "--objective", "3", db=db)
    assert out.returncode == 2, out.stdout
    assert out.stderr.splitlines() == [f"qoss: there is no database at sqlite:///{db}: {UPGRADE} to create it"]
    assert not db.exists()
    assert qoss("db", "upgrade", db=db).returncode == 0
    enrolled = qoss("agent", "enroll", str(files["pub"]), "--objective", "3", db=db)
    assert enrolled.returncode == 0, enrolled.stderr
    assert json.loads(enrolled.stdout)["user_id"] == "alice"


def test_as_a_user_sees_it_the_first_token_on_a_fresh_path(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    out = qoss("token", "create", "--name", "first", "--scopes", "admin", db=db)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [f"qoss: there is no database at sqlite:///{db}: {UPGRADE} to create it"]
    assert not db.exists()
