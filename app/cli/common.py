"""What the command-line modules share: the database option, settings, failures as JSON,
input files and one unit of work."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.db import require_database, setup_database
from app.cli.refusals import fail
from app.domain.errors import InvalidInput, QossError

__all__ = ["DbUrl", "Unit", "check_agent_config", "emit", "fail", "need_files", "prepared", "read_input",
           "settings_of"]

DbUrl = Annotated[str | None, typer.Option("--database-url", envvar="QOSS_DATABASE_URL", help="SQLAlchemy URL")]


def settings_of(database_url: str | None) -> Any:
    """The settings of a command that works on an existing database: it must be at this
    version's newest migration, else the command stops with one line naming `qoss db upgrade`
    (app/cli/db.py; set-up commands call :func:`setup_database` instead)."""
    return require_database(database_url)


def need_files(*paths: Path | str | None) -> None:
    """Refuse, before any work, a file named on the command line that is not there: one line
    ``{"error": "InvalidInput", "detail": "PATH: no such file"}`` and exit 2 (None and ``-``,
    standard input, pass)."""
    for path in paths:
        if path is not None and str(path) != "-" and not Path(path).exists():
            fail(InvalidInput(f"{path}: no such file"))


def check_agent_config(settings: Any) -> None:
    """Refuse, before anything is served, an agent config (``QOSS_AGENT_CONFIG``) the service
    could not start its roles with (a file that is not there or does not parse, a bad field,
    keys that cannot be read): one line naming the variable and the file, exit status 2."""
    if settings.agent_config is None:
        return
    from app.adapters.agent.crypto import CRYPTO, load_keys
    from app.services.agent.config import load_server_config

    try:
        config = load_server_config(settings.agent_config)
        load_keys(config.key_dir, config.id)
        parties = {**(config.host.targets if config.host else {}), **(config.target.hosts if config.target else {})}
        for party in parties.values():
            party.keys(config.base_dir, CRYPTO)
    except QossError as exc:
        why = " ".join(exc.message.split())
        path = str(settings.agent_config)
        named = "QOSS_AGENT_CONFIG" if path in why else f"QOSS_AGENT_CONFIG={path}"
        typer.echo(f"qoss: {named}: {why}", err=True)
        raise typer.Exit(2) from None


@contextlib.contextmanager
def prepared(database_url: str | None) -> Iterator[tuple[Any, Any]]:
    """The settings and one unit of work on the database, migrated and loaded as at a start;
    committed when the block ends without an error. A refusal exits with its message."""
    from app.adapters.db.engine import make_session_factory
    from app.adapters.db.unit_of_work import SqlUnitOfWork
    from app.bootstrap import engine_for, prepare_database

    settings = settings_of(database_url)
    prepare_database(settings)
    engine = engine_for(settings)
    try:
        with SqlUnitOfWork(make_session_factory(engine)(), owned=True) as uow:
            yield settings, uow
            uow.commit()
    except QossError as exc:
        fail(exc)
    finally:
        engine.dispose()


def read_input(path: str) -> str:
    """The text of a document named on the command line, ``-`` for standard input: at most
    :data:`app.adapters.files.MAX_DOCUMENT_BYTES` of UTF-8 (no more is read), from a regular
    file only (:func:`app.adapters.files.read_document`). A refusal prints its error as JSON
    and exits 2."""
    from app.adapters import files

    try:
        if path == "-":
            return files.decode_document(sys.stdin.buffer.read(files.MAX_DOCUMENT_BYTES + 1), "standard input")
        return files.read_document(path)
    except FileNotFoundError:
        fail(InvalidInput(f"{path}: no such file"))
    except OSError as exc:
        fail(InvalidInput(f"{path}: cannot read it ({(exc.strerror or type(exc).__name__).lower()})"))
    except QossError as exc:
        fail(exc)


class Unit:
    """A database at this version's migration head and one unit of work, for CLI commands that act
    in-process; ``setup``: a set-up command, which migrates the database (app/cli/db.py)."""

    def __init__(self, database_url: str | None, *, setup: bool = False) -> None:
        self.settings = setup_database(database_url)[0] if setup else settings_of(database_url)

    def run(self, fn: Any, **kw: Any) -> Any:
        from app.adapters.db.engine import make_session_factory
        from app.adapters.db.unit_of_work import SqlUnitOfWork
        from app.adapters.vici.gateway import ViciGateway
        from app.bootstrap import engine_for

        engine = engine_for(self.settings)
        timeout = self.settings.vici_timeout
        try:
            with SqlUnitOfWork(make_session_factory(engine)(), owned=True) as uow:
                done = fn(uow=uow, vici=lambda p: ViciGateway(p, timeout),
                          default_table=self.settings.default_table, **kw)
                uow.commit()
                return done
        except QossError as exc:
            fail(exc)
        finally:
            engine.dispose()

    def agent_sessions(self) -> list[Any]:
        """The active agent sessions in this database (what an edit's dry run assesses beside the tunnels)."""
        from app.adapters.db.agent_store import SqlAgentStore
        from app.adapters.db.engine import make_session_factory
        from app.bootstrap import engine_for
        from app.services.agent.target_edits import active_sessions

        engine = engine_for(self.settings)
        try:
            return active_sessions(SqlAgentStore(make_session_factory(engine)))
        finally:
            engine.dispose()


def emit(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))
