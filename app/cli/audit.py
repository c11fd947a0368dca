"""``qoss audit``: check the audit log's hash chain, export it for a SIEM (JSON lines)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

__all__ = ["audit_app"]

audit_app = typer.Typer(help="The audit log: check its hash chain, export it (JSON lines).", no_args_is_help=True)

DbUrl = Annotated[str | None, typer.Option("--database-url", envvar="QOSS_DATABASE_URL", help="SQLAlchemy URL")]


def _read_session(database_url: str | None) -> Any:
    """A read-only session on a database at this version's migration head (else one line: app/cli/db.py)."""
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for
    from app.cli.db import require_database

    settings = require_database(database_url)
    engine = engine_for(settings, writes=False)
    return engine, make_session_factory(engine)


@audit_app.command("verify")
def verify(database_url: DbUrl = None) -> None:
    """Walk the hash chain in id order: exit 0 if intact, 1 naming the first entry altered or out of place.

    Also finds entries removed from the end (the chain must end where the writers recorded).
    """
    from app.adapters.db.audit_log import verify_log

    engine, factory = _read_session(database_url)
    try:
        with factory() as session, session.begin():
            report = verify_log(session=session)
    finally:
        engine.dispose()
    if report.broken is None:
        typer.echo(f"{report.entries} entries, chain intact (last entry {report.last_id}, hash {report.last_hash})")
        return
    where = "" if report.broken.id is None else f" at entry {report.broken.id}"
    typer.echo(f"chain broken{where}: {report.broken.detail} ({report.entries} entries before it intact)")
    raise typer.Exit(1)


@audit_app.command("export")
def export(
    since: Annotated[int | None, typer.Option(min=0, help="only entries with a larger id (the last one you have)")]
    = None,
    out: Annotated[Path | None, typer.Option(help="write to FILE (default: standard output)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Entries oldest first as JSON lines, each with its prev_hash and hash (for a SIEM)."""
    from app.adapters.db.audit_log import export_lines

    engine, factory = _read_session(database_url)
    try:
        with contextlib.ExitStack() as stack:
            sink: TextIO = sys.stdout if out is None else stack.enter_context(out.open("w", encoding="ascii"))
            session = stack.enter_context(factory())
            stack.enter_context(session.begin())
            for line in export_lines(session=session, since=since):
                sink.write(line + "\n")
            sink.flush()
    finally:
        engine.dispose()
