"""``qoss agent invite USER --platform P``: Host's one-time invitation for a user's phone, printed
once (the link, its secret in the fragment; Host keeps only its SHA-256), and refused with one line
for a platform a phone does not join with, a lifetime beyond a day, a bad link base, or a user
who has keys of their own. The refusals run in-process (``CliRunner``: the same group and exit
path as the script); the printed invitation comes from a real ``qoss`` process."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

from typer.testing import CliRunner, Result

from app.cli.main import app
from tests.cli.run import qoss


def _in_process(*args: str, db: Path) -> Result:
    return CliRunner().invoke(app, list(args), env={"QOSS_DATABASE_URL": f"sqlite:///{db}", "QOSS_TOKEN": None,
                                                     "QOSS_CONFIG": None, "XDG_CONFIG_HOME": str(db.parent / "config")})


def _migrated(tmp_path: Path) -> Path:
    db = tmp_path / "host.db"
    done = _in_process("db", "upgrade", db=db)
    assert done.exit_code == 0, done.output
    return db


def test_an_invitation_is_printed_once_and_kept_by_its_digest_only(tmp_path: Path) -> None:
    db = _migrated(tmp_path)
    done = qoss("agent", "invite", "amy", "--platform", "apple", "--expires", "10m",
                "--link-base", "https://vpn.example.org/", db=db)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    link = printed["link"]
    assert re.fullmatch(r"https://vpn\.example\.org/ui/join#i=[A-Za-z0-9_-]{43}", link)
    secret = link.split("#i=", 1)[1]
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT id, digest, user_id, platform, created_by FROM agent_invitations").fetchall()
    assert rows == [(printed["id"], hashlib.sha256(secret.encode()).hexdigest(), "amy", "apple", rows[0][4])]
    assert rows[0][4].startswith("cli:")
    assert secret not in db.read_bytes().decode("latin-1")


def test_bad_invitations_are_refused_in_one_line(tmp_path: Path) -> None:
    db = _migrated(tmp_path)
    for args in (("--platform", "swanctl"), ("--platform", "android", "--expires", "25h"),
                 ("--platform", "android", "--expires", "soon"),
                 ("--platform", "android", "--link-base", "vpn.example.org")):
        done = _in_process("agent", "invite", "bo", *args, db=db)
        assert done.exit_code == 2, (args, done.stdout, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
        assert json.loads(done.stderr)["error"] == "InvalidInput", args
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM agent_invitations").fetchone() == (0,)
