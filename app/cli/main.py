"""The ``qoss`` command line."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from app.cli.agent import agent_app
from app.cli.audit import audit_app
from app.cli.bench import bench_micro, bench_report
from app.cli.bench_tunnel import bench_tunnel
from app.cli.client import Output, connect, show
from app.cli.common import DbUrl, Unit, check_agent_config, fail
from app.cli.contexts import context_app
from app.cli.db import DatabaseGroup, settings_for, setup_database
from app.cli.events import events as events_command
from app.cli.lab import lab_app
from app.cli.peers import peers_app
from app.cli.tables import policies_app, ratings_app
from app.cli.tunnels import gateways_app, negotiate, tunnel_app
from app.domain.errors import QossError

__all__ = ["app", "main"]

app = typer.Typer(help="qoss: Quality-of-Security-Service negotiation for IPsec.", no_args_is_help=True,
                  cls=DatabaseGroup)
db_app = typer.Typer(help="The database (on this machine).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens (the first admin token is made here).", no_args_is_help=True)
bench_app = typer.Typer(help="Measure this machine and turn it into ratings.", no_args_is_help=True)



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
    check_agent_config(settings)  # before the database is touched: a refusal leaves nothing behind
    prepared = setup_database(settings.database_url)[1]
    if prepared.tables_added or prepared.policies_added:
        typer.echo(f"loaded tables {prepared.tables_added} and policies {prepared.policies_added}", err=True)
    serve_http(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
               backlog=settings.listen_backlog, max_connections=settings.connections_held,
               waiting_room=settings.waiting_room, silent_timeout=settings.silent_timeout,
               header_timeout=settings.header_timeout, body_timeout=settings.body_timeout,
               send_timeout=settings.send_timeout, max_connections_per_source=settings.max_connections_per_source,
               trusted_proxies=settings.trusted_proxies)


@db_app.command("upgrade")
def db_upgrade(database_url: DbUrl = None) -> None:
    """Run the migrations (creating a SQLite database if there is none) and load shipped data the database lacks."""
    _, prepared = setup_database(database_url)
    typer.echo(json.dumps({"tables_added": prepared.tables_added, "policies_added": prepared.policies_added}))


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="who or what the token is for")],
    scopes: Annotated[str, typer.Option(help="comma-separated, e.g. admin or ratings:write,tunnels:read")],
    expires_in: Annotated[int | None, typer.Option(help="seconds (default: one year)")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="print only the token")] = False,
    database_url: DbUrl = None,
    output: Output = None,
) -> None:
    """Create a token; it is printed once and never again.

    With a token chosen (QOSS_TOKEN or a context's), through the service QOSS_URL or the context
    names (POST /v1/tokens, an admin token, audited under its name; with no service named, it
    stops: a token is never sent to a default address). Without one, in the database itself: the set-up
    command that makes the first admin token, on a database that exists (`qoss db upgrade` or
    `qoss serve` made it) and has no admin token yet, audited as the local operator. The name,
    scopes and lifetime follow the same rules either way (app.domain.auth), checked before
    anything is opened.
    """
    from app.cli.client import chosen
    from app.domain.auth import token_lifetime, validate_scopes, validate_token_name

    wanted = [s.strip() for s in scopes.split(",")]
    try:
        validate_token_name(name)
        validate_scopes(wanted)
        token_lifetime(expires_in)
    except QossError as exc:
        fail(exc)
    if chosen().token:
        with connect() as service:
            made = service.call("POST", "/v1/tokens", json={"name": name, "scopes": wanted,
                                                            **({"expires_in": expires_in} if expires_in else {})})
    else:
        made = _local_token(database_url, name, wanted, expires_in)
    if plain:
        typer.echo(made["token"])
    else:
        show(made, output)


def _local_token(database_url: str | None, name: str, scopes: list[str], expires_in: int | None) -> dict[str, Any]:
    """A token made in the database by this machine's operator (audited as ``local:USER``), while
    it has no admin token (:func:`app.services.auth.create_first_token`)."""
    import getpass

    from app.services.auth import create_first_token, made_token

    operator = f"local:{getpass.getuser()}"

    def make(**kw: Any) -> tuple[str, Any]:
        return create_first_token(uow=kw["uow"], name=name, scopes=scopes, expires_in=expires_in,
                                  created_by=operator)

    return made_token(*Unit(database_url).run(make))


@token_app.command("list")
def token_list(output: Output = None) -> None:
    """List tokens (never their secrets), through the service (an admin token)."""
    with connect() as service:
        show(service.call("GET", "/v1/tokens"), output, ["id", "name", "scopes", "created_by", "expires_at",
                                                          "revoked"])


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token at once, through the service (an admin token)."""
    with connect() as service:
        service.call("DELETE", f"/v1/tokens/{token_id}")
    typer.echo(f"token {token_id} revoked")


app.command("negotiate")(negotiate)  # the order of --help
app.add_typer(gateways_app, name="gateways")
app.add_typer(tunnel_app, name="tunnel")
app.add_typer(ratings_app, name="ratings")
app.add_typer(policies_app, name="policies")
app.add_typer(peers_app, name="peers")
app.add_typer(token_app, name="token")
app.add_typer(context_app, name="context")
app.add_typer(db_app, name="db")
app.add_typer(bench_app, name="bench")
app.add_typer(agent_app, name="agent")
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
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")] = False,
    context: Annotated[str | None, typer.Option(
        "--context", envvar="QOSS_CONTEXT", help="the configuration file's context to use (qoss context list)")]
    = None,
) -> None:
    """qoss: Quality-of-Security-Service negotiation for IPsec.

    The commands that read or change tables, policies, gateways, tunnels and tokens go through a
    running service (QOSS_URL and QOSS_TOKEN, or a context: see qoss context); serve, db, lab,
    bench, agent and audit work on this machine.
    """
    from app.cli import client

    client.selected_context = context


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
