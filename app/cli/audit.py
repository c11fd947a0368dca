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
    """The settings, and read-only sessions on a database at this version's migration head (else one
    line: app/cli/db.py)."""
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for
    from app.cli.db import require_database

    settings = require_database(database_url)
    engine = engine_for(settings, writes=False)
    return settings, engine, make_session_factory(engine)


@audit_app.command("verify")
def verify(
    checkpoints: Annotated[list[Path] | None, typer.Option(
        "--checkpoints", help="another checkpoints file to hold the chain against (another replica's "
        "audit/checkpoints.jsonl); repeatable")] = None,
    database_url: DbUrl = None,
) -> None:
    """Walk the hash chain in id order: exit 0 if intact, 1 naming the first entry altered or out of place.

    Keyed entries are checked with the audit key (QOSS_AUDIT_KEY_FILE, else
    QOSS_STATE_DIR/audit/chain.key); the chain's end is held against the checkpoints in
    QOSS_STATE_DIR/audit/checkpoints.jsonl (and --checkpoints) and the head the writers
    record, so entries removed from the end are found too. Exit 2: the key or a checkpoint
    cannot be used.
    """
    from app.adapters.audit_seal import AuditSeal, AuditSealError
    from app.adapters.db.audit_log import verify_log
    from app.adapters.state_dir import UnsafeStateDir
    from app.cli.common import need_files

    need_files(*(checkpoints or ()))
    settings, engine, factory = _read_session(database_url)
    try:
        seal = AuditSeal.from_settings(settings)
        with factory() as session, session.begin():
            report = verify_log(session=session, seal=seal, more_checkpoints=checkpoints or ())
    except (AuditSealError, UnsafeStateDir, OSError) as exc:
        typer.echo(f"cannot verify the audit chain: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        engine.dispose()
    if report.broken is None:
        keyed = "unkeyed" if report.keyed_from is None else f"keyed from entry {report.keyed_from}"
        typer.echo(f"{report.entries} entries, chain intact (last entry {report.last_id}, hash {report.last_hash}; "
                   f"{keyed}; {report.checkpoints} checkpoints agree)")
        return
    where = "" if report.broken.id is None or report.broken.kind == "truncated" else f" at entry {report.broken.id}"
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

    _, engine, factory = _read_session(database_url)
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
