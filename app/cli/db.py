"""How a ``qoss`` command gets at its database: one mechanism for every command.

Two kinds of command open the database:

* **set-up commands** migrate it (creating a SQLite file if need be) and load the shipped
  tables and policies it lacks: ``serve``, ``db upgrade``, ``lab up`` and the benchmarks'
  ``--write-table`` (:func:`setup_database`);
* **every other command that opens it** (``token create`` with no token chosen: the first
  admin token; ``agent``; ``audit``) needs a database already at this version's newest
  migration and otherwise stops with one line that says why and names ``qoss db upgrade``
  (:func:`require_database`); asking creates no file and changes nothing. (The commands on
  tables, policies, gateways, tunnels and tokens go through the service: app/cli/client.py.)

Either way a database that cannot be reached or read (no server, not a database, a
directory) is refused the same way; a set-up that fails removes the SQLite file (and the
directories) it created. Both raise :class:`DatabaseUnusable`, which the ``qoss`` command
group (:class:`DatabaseGroup`) prints as one line on stderr, ``qoss: ...``, with exit status 2,
never a traceback; it does the same with a database error met later in a command (the
server went away, the file is locked).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from app.bootstrap import Prepared
    from app.settings import Settings

__all__ = ["DatabaseGroup", "DatabaseUnusable", "require_database", "settings_for", "settings_problems",
           "setup_database"]

_UPGRADE = "run 'qoss db upgrade' (with the same --database-url)"


class DatabaseUnusable(Exception):
    """The command's database cannot be used as it stands (:class:`DatabaseGroup` prints ``message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def settings_for(database_url: str | None) -> Settings:
    """The settings, with ``database_url`` (the ``--database-url`` option) if given, and what they
    cannot check alone (:func:`settings_problems`: one line each naming the variable, exit 2)."""
    from app.settings import Settings

    settings = Settings(database_url=database_url) if database_url else Settings()
    problems = settings_problems(settings)
    for line in problems:
        typer.echo(f"qoss: {line}", err=True)
    if problems:
        raise typer.Exit(2)
    return settings


def settings_problems(settings: Settings) -> list[str]:
    """What the settings cannot check alone, one line each naming the variable: the identity
    provider's mapping names only scopes qoss has (the domain's vocabulary)."""
    from app.domain.oidc import parse_mapping

    try:
        parse_mapping(settings.oidc_scopes_by_claim)
    except ValueError as exc:
        return [f"QOSS_OIDC_SCOPES_BY_CLAIM: Value error, {exc}"]
    return []


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is shown as the user gave it, minus what could be a password
        return url.split("@")[-1]


def _reason(exc: BaseException) -> str:
    """The first line of what went wrong (the driver's own message for a database error)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def require_database(database_url: str | None) -> Settings:
    """The settings of a command that works on an existing database at this version's migration head.

    Raises:
        DatabaseUnusable: missing, never migrated, behind, migrated by an unknown (newer)
            version, or unreadable; nothing is created or changed.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from app.adapters.db.migrate import schema_state

    settings = settings_for(database_url)
    url = _shown(settings.database_url)
    try:
        state = schema_state(settings.database_url)
    except (SQLAlchemyError, OSError, ValueError) as exc:
        raise DatabaseUnusable(f"cannot read the database {url}: {_reason(exc)}") from exc
    if state.kind == "missing":
        raise DatabaseUnusable(f"there is no database at {url}: {_UPGRADE} to create it")
    if state.kind == "empty":
        raise DatabaseUnusable(f"the database {url} was never migrated: {_UPGRADE} first")
    if state.kind == "behind":
        raise DatabaseUnusable(f"the database {url} is at migration {state.revision}, this qoss needs "
                               f"{state.head}: {_UPGRADE} first")
    if state.kind == "unknown":
        raise DatabaseUnusable(f"the database {url} is at migration {state.revision}, which this qoss does not "
                               "know (a newer qoss migrated it?): use that version")
    return settings


def setup_database(database_url: str | None) -> tuple[Settings, Prepared]:
    """Migrate the database (creating a SQLite file if need be) and load the shipped data it lacks.

    Raises:
        DatabaseUnusable: it could not be done; a SQLite file and directories this call
            created are removed again.
    """
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from app.adapters.db.migrate import sqlite_path
    from app.bootstrap import prepare_database
    from app.domain.errors import QossError

    settings = settings_for(database_url)
    url = _shown(settings.database_url)
    path = sqlite_path(settings.database_url)
    made_file = path is not None and not path.exists()
    made_dirs = [] if path is None else [d for d in path.absolute().parents if not d.exists()]
    try:
        return settings, prepare_database(settings)
    except BaseException as exc:
        if made_file and path is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{path}{suffix}").unlink()
            for directory in made_dirs:  # deepest first
                with contextlib.suppress(OSError):
                    directory.rmdir()
        if isinstance(exc, CommandError):  # e.g. a revision these migrations do not know
            raise DatabaseUnusable(f"cannot migrate the database {url}: {_reason(exc)}") from exc
        if isinstance(exc, (SQLAlchemyError, OSError)):
            raise DatabaseUnusable(f"cannot set up the database {url}: {_reason(exc)}") from exc
        if isinstance(exc, QossError):
            raise DatabaseUnusable(f"cannot load the shipped data into {url}: {_reason(exc)}") from exc
        raise


class DatabaseGroup(TyperGroup):
    """The ``qoss`` command group: a database a command cannot use is one line on stderr and exit
    status 2, not a traceback.

    That is :class:`DatabaseUnusable`, and of the errors met later only those of the
    database's environment (it cannot be reached, is locked, lost a table); a refusal
    (:class:`~app.domain.errors.QossError`) that a command did not catch is printed as every
    refusal is (:func:`app.cli.common.fail`, exit 2). Anything else is a bug and keeps its
    traceback.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_switches(self)

    def get_params(self, ctx: typer.Context) -> list[Any]:  # type: ignore[override]  # as invoke
        params: list[Any] = super().get_params(ctx)
        _plain(params)  # typer's completion switches join the group after it is made
        return params

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer's Context is its click's
        try:
            return super().invoke(ctx)
        except DatabaseUnusable as exc:
            typer.echo(f"qoss: {exc.message}", err=True)
            raise typer.Exit(2) from None
        except Exception as exc:
            from app.domain.errors import QossError

            if isinstance(exc, QossError):  # a refusal a command let through: its one error, not a traceback
                from app.cli.refusals import fail

                fail(exc)
            from sqlalchemy.exc import InterfaceError, OperationalError

            if isinstance(exc, (OperationalError, InterfaceError)):
                typer.echo(f"qoss: database error: {_reason(exc)}", err=True)
                raise typer.Exit(2) from None
            from app.adapters.audit_seal import AuditKeyError

            if isinstance(exc, AuditKeyError):  # the audit chain's key is missing or another one
                typer.echo(f"qoss: {exc}", err=True)
                raise typer.Exit(2) from None
            raise


def _plain_switches(command: Any) -> None:
    """A switch (``--dry-run``, ``--force``, ``--help``) takes no value: its line in ``--help``
    shows none (typer would write ``<bool>`` beside it, as if ``--dry-run true`` were how to
    give it). Here and in every command below."""
    help_option = command.get_help_option(typer.Context(command))  # made once, kept by the command
    _plain([*command.params, *([help_option] if help_option is not None else [])])
    for sub in getattr(command, "commands", {}).values():
        _plain_switches(sub)


def _plain(params: list[Any]) -> None:
    for param in params:
        if getattr(param, "is_bool_flag", False) and param.metavar is None:
            param.metavar = ""
