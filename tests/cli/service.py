"""A real ``qoss serve`` for the commands that go through the API, and those commands run
in-process (``CliRunner``: the same group and exit path as the ``qoss`` script) against it.

The configuration file's directory is one of the test's own (``XDG_CONFIG_HOME``), so a
developer's ``~/.config/qoss`` never takes part."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from typer.testing import CliRunner, Result

from app.bootstrap import prepare_database
from app.cli.main import app
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.served import serving

__all__ = ["Service", "served"]

QOSS = Path(sys.executable).parent / "qoss"


@dataclass
class Service:
    """A served qoss: its URL, its database, an admin token, and where this test keeps files."""

    base: str
    database_url: str
    admin: str
    where: Path

    def token(self, name: str, scopes: list[str]) -> str:
        """A new token, made through the API with the admin's (audited like any)."""
        answer = httpx.post(f"{self.base}/v1/tokens", json={"name": name, "scopes": scopes},
                            headers={"Authorization": f"Bearer {self.admin}"})
        assert answer.status_code == 201, answer.text
        token = str(answer.json()["token"])
        register(token)
        return token

    def cli(self, *args: str, token: str | None = None, stdin: str | None = None,
            env: Mapping[str, str | None] | None = None) -> Result:
        """``qoss ARGS`` through this service with ``token`` (default: the admin's; "" for none)."""
        chosen = self.admin if token is None else token
        environment = {"QOSS_URL": self.base, "QOSS_TOKEN": chosen or None,
                       "QOSS_CONFIG": None, "XDG_CONFIG_HOME": str(self.where / "config"), "QOSS_CONTEXT": None,
                       **(env or {})}
        return CliRunner().invoke(app, list(args), input=stdin, env=environment)


@contextmanager
def served(where: Path, **env: str) -> Iterator[Service]:
    """``qoss serve`` on a new SQLite database in ``where`` (no monitor, no reconcile)."""
    url = f"sqlite:///{where / 'qoss.db'}"
    prepare_database(Settings(database_url=url))
    environment = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_RECONCILE_ON_START": "false",
                   "QOSS_STATE_DIR": str(where / "state"), "QOSS_LOG_LEVEL": "warning",
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
                   **env}
    try:
        command = [str(QOSS), "serve", "--database-url", url]
        with serving(command, env=environment, log=where / "serve.log") as (base, _):
            yield Service(base=base, database_url=url, admin=make_token(url, "cli-admin", ["admin"]), where=where)
    finally:
        keep_log(where / "serve.log", f"cli-serve-{where.name}.log")
