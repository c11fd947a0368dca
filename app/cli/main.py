"""The ``qoss`` command line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from app.cli.agent import agent_app
from app.cli.audit import audit_app
from app.cli.bench import bench_micro, bench_report
from app.cli.bench_tunnel import bench_tunnel
from app.cli.common import DbUrl, Unit, emit, fail, prepared, read_input, settings_of
from app.cli.db import DatabaseGroup, settings_for, setup_database
from app.cli.events import events as events_command
from app.cli.lab import lab_app
from app.domain.errors import QossError

__all__ = ["app", "main"]

app = typer.Typer(help="qoss: Quality-of-Security-Service negotiation for IPsec.", no_args_is_help=True,
                  cls=DatabaseGroup)
ratings_app = typer.Typer(help="Rating tables.", no_args_is_help=True)
policies_app = typer.Typer(help="Policies.", no_args_is_help=True)
db_app = typer.Typer(help="The database.", no_args_is_help=True)
app.add_typer(ratings_app, name="ratings")
app.add_typer(policies_app, name="policies")
app.add_typer(db_app, name="db")
tunnel_app = typer.Typer(help="Tunnels between registered gateways.", no_args_is_help=True)
app.add_typer(tunnel_app, name="tunnel")
token_app = typer.Typer(help="API tokens (the first admin token is made here).", no_args_is_help=True)
bench_app = typer.Typer(help="Measure this machine and turn it into ratings.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(token_app, name="token")



@app.command()
def serve(
    database_url: DbUrl = None,
    host: Annotated[str | None, typer.Option(help="address to listen on (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default 8000)")] = None,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", help="a reverse proxy's address or network whose forwarded header names the client "
        "(repeat for more; default QOSS_TRUSTED_PROXIES, none)")] = None,
    forwarded_header: Annotated[str | None, typer.Option(
        help="the header those proxies write: x-forwarded-for (default) or forwarded")] = None,
) -> None:
    """Migrate the database, load the shipped tables, and serve the API.

    Forwarded headers are read by qoss alone, from the trusted proxies only: uvicorn's own
    proxy-header handling (which trusts 127.0.0.1 by default) is off.
    """
    from app.main import create_app
    from app.web.server import serve as serve_http

    settings = settings_for(database_url)
    if host:
        settings.host = host
    if port:
        settings.port = port
    if trusted_proxy or forwarded_header:
        try:
            settings = type(settings).model_validate({
                **settings.model_dump(), **({"trusted_proxies": trusted_proxy} if trusted_proxy else {}),
                **({"forwarded_header": forwarded_header} if forwarded_header else {})})
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    prepared = setup_database(settings.database_url)[1]
    if prepared.tables_added or prepared.policies_added:
        typer.echo(f"loaded tables {prepared.tables_added} and policies {prepared.policies_added}", err=True)
    serve_http(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
               backlog=settings.listen_backlog, max_connections=settings.connections_held,
               waiting_room=settings.waiting_room, silent_timeout=settings.silent_timeout,
               header_timeout=settings.header_timeout, body_timeout=settings.body_timeout,
               max_connections_per_source=settings.max_connections_per_source,
               trusted_proxies=settings.trusted_proxies)


@db_app.command("upgrade")
def db_upgrade(database_url: DbUrl = None) -> None:
    """Run the migrations (creating a SQLite database if there is none) and load shipped data the database lacks."""
    _, prepared = setup_database(database_url)
    typer.echo(json.dumps({"tables_added": prepared.tables_added, "policies_added": prepared.policies_added}))


@app.command()
def negotiate(
    request: Annotated[str, typer.Argument(help="negotiation request JSON file, or - for stdin")] = "-",
    database_url: DbUrl = None,
) -> None:
    """Negotiate exactly as POST /v1/negotiations does; the answer is JSON on stdout."""
    from pydantic import ValidationError

    from app.adapters.db.engine import make_session_factory
    from app.adapters.db.unit_of_work import SqlUnitOfWork
    from app.bootstrap import engine_for
    from app.services.inputs import NegotiationIn
    from app.services.negotiation import run_negotiation
    from app.services.ratings import TableCache

    try:
        body = NegotiationIn.model_validate_json(read_input(request))
    except ValidationError as exc:
        typer.echo(json.dumps({"error": "ValidationError", "detail": json.loads(exc.json())}, indent=2), err=True)
        raise typer.Exit(2) from exc
    settings = settings_of(database_url)
    engine = engine_for(settings)
    try:
        with SqlUnitOfWork(make_session_factory(engine)(), owned=True) as uow:
            result = run_negotiation(uow=uow, cache=TableCache(), request=body, default_table=settings.default_table)
    except QossError as exc:
        fail(exc)
    finally:
        engine.dispose()
    typer.echo(json.dumps(result.as_dict(), indent=2))


@ratings_app.command("list")
def ratings_list(database_url: DbUrl = None) -> None:
    """List the rating tables in the database."""
    from app.services.ratings import list_tables

    with prepared(database_url) as (_, uow):
        typer.echo(json.dumps(list_tables(uow=uow), indent=2, default=str))


@ratings_app.command("export")
def ratings_export(
    name: str,
    fmt: Annotated[str, typer.Option("--format", help="yaml or csv")] = "yaml",
    database_url: DbUrl = None,
) -> None:
    """Print a table as YAML or CSV."""
    from app.adapters import files
    from app.services.ratings import get_table

    with prepared(database_url) as (_, uow):
        typer.echo(files.dump_rating_table(get_table(uow=uow, name=name), fmt), nl=False)


@ratings_app.command("import")
def ratings_import(
    path: Annotated[str | None, typer.Argument(help="YAML or CSV file, or - for stdin")] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="yaml or csv (default: from the file name)")] = None,
    name: Annotated[str | None, typer.Option(help="table name (required for CSV)")] = None,
    revision: Annotated[int | None, typer.Option(help="replace this current revision of an existing table")] = None,
    author: Annotated[str, typer.Option(help="recorded as the revision's author")] = "cli",
    shipped: Annotated[str | None, typer.Option(
        "--shipped", help="restore this shipped table (loaded once per database: deleted, it stays deleted)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Import a table (new, or a new revision with --revision), or restore a shipped one with --shipped."""
    from app.adapters import files
    from app.services.ratings import import_table, restore_shipped_table

    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    kind = fmt or ("csv" if path and path.endswith(".csv") else "yaml")
    text = read_input(path) if path is not None else ""  # before the database: a refusal changes nothing
    with prepared(database_url) as (settings, uow):
        if shipped is not None:
            table = restore_shipped_table(uow=uow, tables=files.load_rating_tables(settings.ratings_dir), name=shipped)
        else:
            table = import_table(uow=uow, table=files.parse_rating_table(text, kind, name=name),
                                 fmt=kind, author=author, expected_revision=revision)
    typer.echo(json.dumps({"name": table.name, "revision": table.revision, "ratings": len(table.ratings)}))


@ratings_app.command("edit")
def ratings_edit(
    name: str,
    algorithm: str,
    confidentiality: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    integrity: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    key_exchange: Annotated[int | None, typer.Option("--key-exchange", min=0, max=10)] = None,
    performance: Annotated[float | None, typer.Option(min=0, max=10)] = None,
    reason: Annotated[str | None, typer.Option(help="why, kept with the rating")] = None,
    author: Annotated[str, typer.Option(help="recorded as the revision's author")] = "cli",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="change nothing: print the impact on running tunnels "
                                                            "and agent sessions")]
    = False,
    database_url: DbUrl = None,
) -> None:
    """Edit one algorithm's rating (a new revision), as PATCH /v1/rating-tables/NAME/ratings/ALG does.

    With --dry-run nothing is kept: prints which running tunnels and agent sessions would fall
    below their minimums, get a cheaper or different choice, or stay. Otherwise the edit is
    committed and the tunnels below their minimums are moved to a compliant suite
    (make-before-break) by this command; the moves are printed. The agent sessions below their
    minimums are closed by the running Target, which reads the edit from the database.
    """
    from app.services.impact import preview
    from app.services.ratings import get_table, update_rating

    changes = {k: v for k, v in {"confidentiality": confidentiality, "integrity": integrity,
                                 "key_exchange": key_exchange, "performance": performance,
                                 "reason": reason}.items() if v is not None}
    if not changes:
        raise typer.BadParameter("give at least one of --confidentiality --integrity --key-exchange --performance "
                                 "--reason")

    def edit(**kw: Any) -> dict[str, Any]:
        uow = kw["uow"]
        table = update_rating(uow=uow, name=name, algorithm=algorithm, changes=changes, author=author,
                              expected_revision=get_table(uow=uow, name=name).revision)
        out: dict[str, Any] = {"table": name, "revision": table.revision}
        if dry_run:
            report = preview(uow, default_table=kw["default_table"], sessions=sessions)
            out.update(dry_run=True, impact=report.as_list(), sessions=report.sessions_list())
        return out

    unit = Unit(database_url)
    sessions = unit.agent_sessions() if dry_run else []
    out = unit.run(edit)
    if not dry_run and unit.settings.rekey:
        out.update(unit.rekey(f"rating table {name} revision {out['revision']}"))
    emit(out)


@ratings_app.command("history")
def ratings_history(name: str, database_url: DbUrl = None) -> None:
    """A table's revisions, oldest first: who, when, why, what changed."""
    from app.services.ratings import table_revisions

    emit(Unit(database_url).run(lambda **kw: table_revisions(uow=kw["uow"], name=name)))


RevertTo = Annotated[int, typer.Option("--to", min=1, help="the revision whose content to restore")]
RevertWhy = Annotated[str | None, typer.Option(help="why, for the history")]
RevertAuthor = Annotated[str, typer.Option(help="recorded as the revision's author")]


def _revert(kind: str, name: str, to: int, message: str | None, author: str, database_url: str | None) -> None:
    """Revert a rating table or policy to revision ``to``, based on its current revision."""
    from app.services.policies import revert_policy
    from app.services.ratings import revert_table

    def revert(**kw: Any) -> dict[str, Any]:
        uow = kw["uow"]
        store = uow.tables if kind == "table" else uow.policies
        args = {"uow": uow, "name": name, "revision": to, "author": author, "message": message,
                "expected_revision": store.current_revision(name)}
        revision = revert_table(**args).revision if kind == "table" else revert_policy(**args)[1]
        return {kind: name, "revision": revision, "reverted_to": to}

    emit(Unit(database_url).run(revert))


@ratings_app.command("revert")
def ratings_revert(name: str, to: RevertTo, message: RevertWhy = None, author: RevertAuthor = "cli",
                   database_url: DbUrl = None) -> None:
    """Go back to revision --to: a new revision with its content ("reverted to N"), history kept."""
    _revert("table", name, to, message, author, database_url)


@policies_app.command("history")
def policies_history(name: str, database_url: DbUrl = None) -> None:
    """A policy's revisions, oldest first: who, when, why, what changed."""
    from app.services.policies import policy_revisions

    emit(Unit(database_url).run(lambda **kw: policy_revisions(uow=kw["uow"], name=name)))


@policies_app.command("revert")
def policies_revert(name: str, to: RevertTo, message: RevertWhy = None, author: RevertAuthor = "cli",
                    database_url: DbUrl = None) -> None:
    """Go back to revision --to of a policy: a new revision with its content."""
    _revert("policy", name, to, message, author, database_url)


@policies_app.command("import")
def policies_import(
    path: Annotated[str | None, typer.Argument(help="policy YAML file, or - for stdin")] = None,
    author: Annotated[str, typer.Option(help="recorded as the revision's author")] = "cli",
    shipped: Annotated[str | None, typer.Option(
        "--shipped", help="restore this shipped policy (loaded once per database: deleted, it stays deleted)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Store a new policy from a YAML file, or restore a shipped one with --shipped."""
    from app.adapters import files
    from app.services.policies import create_policy, restore_shipped_policy

    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    text = read_input(path) if path is not None else ""  # before the database: a refusal changes nothing
    with prepared(database_url) as (settings, uow):
        if shipped is not None:
            policy, revision = restore_shipped_policy(
                uow=uow, policies=files.load_policies(settings.policies_dir), name=shipped)
        else:
            document = files.parse_policy_yaml(text).as_dict()
            policy, revision = create_policy(uow=uow, document=document, author=author)
    typer.echo(json.dumps({"name": policy.name, "revision": revision}))


@policies_app.command("check")
def policies_check(paths: Annotated[list[Path], typer.Argument(help="policy YAML files")]) -> None:
    """Validate policy files; exit 1 if any is invalid."""
    from app.adapters.files import load_policy

    bad = 0
    for path in paths:
        try:
            policy = load_policy(path)
        except FileNotFoundError:
            bad += 1
            typer.echo(f"{path}: INVALID: no such file")
            continue
        except (QossError, OSError) as exc:
            bad += 1
            typer.echo(f"{path}: INVALID: {exc}")
            continue
        typer.echo(f"{path}: ok ({policy.name}, {policy.option.value}, min {policy.min_levels.as_dict()})")
    if bad:
        raise typer.Exit(1)


@app.command("gateways")
def gateways_list(database_url: DbUrl = None) -> None:
    """List the registered gateways."""
    from app.services import gateways

    emit(Unit(database_url).run(lambda **kw: [g.as_dict() for g in gateways.list_gateways(uow=kw["uow"])]))


@tunnel_app.command("up")
def tunnel_up(
    initiator: Annotated[str, typer.Argument(help="initiating gateway")],
    responder: Annotated[str | None, typer.Argument(help="responding gateway (omit with --peer)")] = None,
    policy: Annotated[str | None, typer.Option(help="stored policy name")] = None,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    rating_table: Annotated[str | None, typer.Option(help="negotiating rating table")] = None,
    peer: Annotated[str | None, typer.Option(help="IKE address of an unmanaged peer (instead of RESPONDER)")] = None,
    peer_id: Annotated[str | None, typer.Option(help="the peer's IKE identity (default: its address)")] = None,
    psk_file: Annotated[Path | None, typer.Option(help="file holding the peer's PSK, or - for stdin (never on the "
                                                      "command line)")]
        = None,
    remote_ts: Annotated[list[str] | None, typer.Option(help="the peer's protected networks (repeatable)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Negotiate and bring up a tunnel (as POST /v1/tunnels), to a gateway or an unmanaged --peer."""
    from pydantic import SecretStr, ValidationError

    from app.services import tunnels
    from app.services.inputs import MinLevelsIn, TunnelIn, TunnelPeerIn

    peer_in = None
    try:
        if peer is not None:
            if psk_file is None:
                raise typer.BadParameter("--peer needs --psk-file")
            psk = read_input(str(psk_file)).strip()  # a regular file of at most 1 MiB; errors never quote it
            peer_in = TunnelPeerIn(address=peer, identity=peer_id, psk=SecretStr(psk))
        body = TunnelIn(initiator=initiator, responder=responder, peer=peer_in, remote_ts=remote_ts or None,
                                policy=policy, rating_table=rating_table,
                                min_levels=MinLevelsIn(confidentiality=confidentiality, integrity=integrity,
                                                       key_exchange=key_exchange))
    except ValidationError as exc:  # the message names fields and rules, never the PSK
        typer.echo("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()), err=True)
        raise typer.Exit(2) from None
    unit = Unit(database_url)
    record = unit.run(tunnels.create_tunnel, request=body, allowed_networks=unit.settings.gateway_networks)
    emit(record.as_dict())


@tunnel_app.command("list")
def tunnel_list(database_url: DbUrl = None) -> None:
    """List tunnels, oldest first (a JSON array, written a page of records at a time)."""
    from app.services import tunnels

    def write(uow: Any, **_: Any) -> None:
        cursor, written = None, 0
        while True:
            page = tunnels.page_tunnels(uow=uow, limit=500, cursor=cursor)
            for record in page.records:
                item = textwrap.indent(json.dumps(record.as_dict(), indent=2, default=str), "  ")
                typer.echo(("[\n" if written == 0 else ",\n") + item, nl=False)
                written += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        typer.echo("\n]" if written else "[]")

    Unit(database_url).run(write)


@tunnel_app.command("show")
def tunnel_show(tunnel_id: str, database_url: DbUrl = None) -> None:
    """One tunnel with its live state from charon."""
    from app.services import tunnels

    emit(Unit(database_url).run(
        lambda **kw: tunnels.tunnel_status(uow=kw["uow"], vici=kw["vici"], tunnel_id=tunnel_id)))


@tunnel_app.command("down")
def tunnel_down(tunnel_id: str, database_url: DbUrl = None) -> None:
    """Terminate a tunnel and unload it from both charons."""
    from app.services import tunnels

    Unit(database_url).run(lambda **kw: tunnels.delete_tunnel(uow=kw["uow"], vici=kw["vici"],
                                                               tunnel_id=tunnel_id))
    typer.echo(f"tunnel {tunnel_id} down")


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="who or what the token is for")],
    scopes: Annotated[str, typer.Option(help="comma-separated, e.g. admin or ratings:write,tunnels:read")],
    expires_in: Annotated[int | None, typer.Option(help="seconds (default: one year)")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="print only the token")] = False,
    database_url: DbUrl = None,
) -> None:
    """Create a token; it is printed once and never again. The name, scopes and lifetime follow
    the rules of POST /v1/tokens (app.domain.auth), checked before the database is opened."""
    from app.domain.auth import token_lifetime, validate_scopes, validate_token_name
    from app.services.auth import create_token

    wanted = [s.strip() for s in scopes.split(",")]
    try:
        validate_token_name(name)
        validate_scopes(wanted)
        token_lifetime(expires_in)
    except QossError as exc:
        fail(exc)

    def make(**kw: Any) -> tuple[str, Any]:
        return create_token(uow=kw["uow"], name=name, scopes=wanted, expires_in=expires_in, created_by="cli")

    token, record = Unit(database_url, setup=True).run(make)  # the first admin token: a set-up command
    if plain:
        typer.echo(token)
    else:
        emit({"id": record.id, "name": record.name, "scopes": sorted(record.scopes), "token": token,
               "expires_at": record.expires_at})


@token_app.command("list")
def token_list(database_url: DbUrl = None) -> None:
    """List tokens (never their secrets)."""
    from app.services.auth import list_tokens

    emit(Unit(database_url).run(lambda **kw: list_tokens(uow=kw["uow"])))


@token_app.command("revoke")
def token_revoke(token_id: str, database_url: DbUrl = None) -> None:
    """Revoke a token at once."""
    from app.services.auth import revoke_token

    Unit(database_url).run(lambda **kw: revoke_token(uow=kw["uow"], token_id=token_id))
    typer.echo(f"token {token_id} revoked")


app.add_typer(agent_app, name="agent")  # the groups after the commands above: the order of --help
app.add_typer(audit_app, name="audit")
app.add_typer(lab_app, name="lab")
app.command("events")(events_command)
bench_app.command("micro")(bench_micro)
bench_app.command("report")(bench_report)
bench_app.command("tunnel")(bench_tunnel)


def _version(value: bool) -> None:
    if value:
        from app import __version__

        typer.echo(f"qoss {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")] = False) -> None:
    """qoss: Quality-of-Security-Service negotiation for IPsec."""


def _settings_errors(exc: ValidationError) -> list[str]:
    """A bad ``QOSS_*`` value, one line each, named as it is set (the variable, not the field)."""
    lines = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error.get("loc", ())) or "settings"
        variable = f"QOSS_{field.split('.')[0].upper()}"
        value = error.get("input")
        shown = f" (got {str(value)[:60]!r})" if isinstance(value, str | int | float) else ""
        lines.append(f"{variable}: {error.get('msg', 'invalid')}{shown}")
    return lines


def main() -> None:
    """Entry point of the ``qoss`` script."""
    try:
        app()
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        for line in _settings_errors(exc):
            typer.echo(f"qoss: {line}", err=True)
        raise SystemExit(2) from None
