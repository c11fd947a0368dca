"""The ``qoss`` command line."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli_db import DatabaseGroup, require_database, settings_for, setup_database
from app.domain.errors import NotFound, QossError

__all__ = ["app", "main"]

app = typer.Typer(help="qoss: Quality-of-Security-Service negotiation for IPsec.", no_args_is_help=True,
                  cls=DatabaseGroup)
ratings_app = typer.Typer(help="Rating tables.", no_args_is_help=True)
policies_app = typer.Typer(help="Policies.", no_args_is_help=True)
db_app = typer.Typer(help="The database.", no_args_is_help=True)
app.add_typer(ratings_app, name="ratings")
app.add_typer(policies_app, name="policies")
app.add_typer(db_app, name="db")
lab_app = typer.Typer(help="The strongSwan lab: charons in network namespaces (root). `lab up` builds two "
                      "gateways (left, right); `lab up --agent` builds the tunnel agent's client, Host and Target, "
                      "which users then `lab join`.", no_args_is_help=True)
tunnel_app = typer.Typer(help="Tunnels between registered gateways.", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
app.add_typer(tunnel_app, name="tunnel")
token_app = typer.Typer(help="API tokens (the first admin token is made here).", no_args_is_help=True)
bench_app = typer.Typer(help="Measure this machine and turn it into ratings.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(token_app, name="token")

DbUrl = Annotated[str | None, typer.Option("--database-url", envvar="QOSS_DATABASE_URL", help="SQLAlchemy URL")]


def _settings(database_url: str | None) -> Any:
    """The settings of a command that works on an existing database: it must be at this
    version's newest migration, else the command stops with one line naming `qoss db upgrade`
    (app/cli_db.py; set-up commands call :func:`setup_database` instead)."""
    return require_database(database_url)


def _fail(exc: QossError, code: int = 2) -> None:
    typer.echo(json.dumps({"error": type(exc).__name__, "detail": exc.detail()}, indent=2), err=True)
    raise typer.Exit(code)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read(1_048_577)
    return Path(path).read_text(encoding="utf-8")


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
    import uvicorn

    from app.api.http_protocol import OneWriteHttpProtocol
    from app.api.main import create_app

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
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                http=OneWriteHttpProtocol, proxy_headers=False, backlog=settings.listen_backlog)


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

    from app.adapters.db.engine import make_engine, make_session_factory
    from app.services.negotiation import NegotiationIn, run_negotiation
    from app.services.ratings import TableCache

    try:
        body = NegotiationIn.model_validate_json(_read(request))
    except ValidationError as exc:
        typer.echo(json.dumps({"error": "ValidationError", "detail": json.loads(exc.json())}, indent=2), err=True)
        raise typer.Exit(2) from exc
    settings = _settings(database_url)
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            result = run_negotiation(session=session, cache=TableCache(), request=body,
                                     default_table=settings.default_table)
    except QossError as exc:
        _fail(exc)
    finally:
        engine.dispose()
    typer.echo(json.dumps(result.as_dict(), indent=2))


@ratings_app.command("list")
def ratings_list(database_url: DbUrl = None) -> None:
    """List the rating tables in the database."""
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.services.bootstrap import prepare_database
    from app.services.ratings import list_tables

    settings = _settings(database_url)
    prepare_database(settings)
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            typer.echo(json.dumps(list_tables(session=session), indent=2, default=str))
    finally:
        engine.dispose()


@ratings_app.command("export")
def ratings_export(
    name: str,
    fmt: Annotated[str, typer.Option("--format", help="yaml or csv")] = "yaml",
    database_url: DbUrl = None,
) -> None:
    """Print a table as YAML or CSV."""
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.services.bootstrap import prepare_database
    from app.services.ratings import export_table

    settings = _settings(database_url)
    prepare_database(settings)
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            typer.echo(export_table(session=session, name=name, fmt=fmt), nl=False)
    except QossError as exc:
        _fail(exc)
    finally:
        engine.dispose()


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
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.services.bootstrap import prepare_database
    from app.services.ratings import import_table, restore_shipped_table

    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    settings = _settings(database_url)
    prepare_database(settings)
    kind = fmt or ("csv" if path and path.endswith(".csv") else "yaml")
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            if shipped is not None:
                table = restore_shipped_table(session=session, tables=files.load_rating_tables(settings.ratings_dir),
                                              name=shipped)
            else:
                table = import_table(session=session, text=_read(path or "-"), fmt=kind, author=author, name=name,
                                     expected_revision=revision)
    except QossError as exc:
        _fail(exc)
    finally:
        engine.dispose()
    typer.echo(json.dumps({"name": table.name, "revision": table.revision, "ratings": len(table.ratings)}))


@ratings_app.command("history")
def ratings_history(name: str, database_url: DbUrl = None) -> None:
    """A table's revisions, oldest first: who, when, why, what changed."""
    from app.services.ratings import table_revisions

    _emit(_Unit(database_url).run(lambda **kw: table_revisions(session=kw["session"], name=name)))


RevertTo = Annotated[int, typer.Option("--to", min=1, help="the revision whose content to restore")]
RevertWhy = Annotated[str | None, typer.Option(help="why, for the history")]
RevertAuthor = Annotated[str, typer.Option(help="recorded as the revision's author")]


def _revert(kind: str, name: str, to: int, message: str | None, author: str, database_url: str | None) -> None:
    """Revert a rating table or policy to revision ``to``, based on its current revision."""
    from app.adapters.db.repositories import PolicyRepository, RatingTableRepository
    from app.services.policies import revert_policy
    from app.services.ratings import revert_table

    def revert(**kw: Any) -> dict[str, Any]:
        session = kw["session"]
        repo = RatingTableRepository(session) if kind == "table" else PolicyRepository(session)
        args = {"session": session, "name": name, "revision": to, "author": author, "message": message,
                "expected_revision": repo.current_revision(name)}
        revision = revert_table(**args).revision if kind == "table" else revert_policy(**args)[1]
        return {kind: name, "revision": revision, "reverted_to": to}

    _emit(_Unit(database_url).run(revert))


@ratings_app.command("revert")
def ratings_revert(name: str, to: RevertTo, message: RevertWhy = None, author: RevertAuthor = "cli",
                   database_url: DbUrl = None) -> None:
    """Go back to revision --to: a new revision with its content ("reverted to N"), history kept."""
    _revert("table", name, to, message, author, database_url)


@policies_app.command("history")
def policies_history(name: str, database_url: DbUrl = None) -> None:
    """A policy's revisions, oldest first: who, when, why, what changed."""
    from app.services.policies import policy_revisions

    _emit(_Unit(database_url).run(lambda **kw: policy_revisions(session=kw["session"], name=name)))


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
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.adapters.db.repositories import PolicyRepository
    from app.services.bootstrap import prepare_database
    from app.services.policies import restore_shipped_policy

    if (path is None) == (shipped is None):
        raise typer.BadParameter("give a file to import or --shipped NAME, not both")
    settings = _settings(database_url)
    prepare_database(settings)
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            if shipped is not None:
                policy, revision = restore_shipped_policy(
                    session=session, policies=files.load_policies(settings.policies_dir), name=shipped)
            else:
                policy = files.parse_policy_yaml(_read(path or "-"))
                revision = PolicyRepository(session).create(policy, author=author)
    except QossError as exc:
        _fail(exc)
    finally:
        engine.dispose()
    typer.echo(json.dumps({"name": policy.name, "revision": revision}))


@policies_app.command("check")
def policies_check(paths: Annotated[list[Path], typer.Argument(help="policy YAML files")]) -> None:
    """Validate policy files; exit 1 if any is invalid."""
    from app.adapters.files import load_policy

    bad = 0
    for path in paths:
        try:
            policy = load_policy(path)
        except (QossError, OSError) as exc:
            bad += 1
            typer.echo(f"{path}: INVALID: {exc}")
            continue
        typer.echo(f"{path}: ok ({policy.name}, {policy.option.value}, min {policy.min_levels.as_dict()})")
    if bad:
        raise typer.Exit(1)


class _Unit:
    """A database at this version's migration head and one unit of work, for CLI commands that act
    in-process; ``setup``: a set-up command, which migrates the database (app/cli_db.py)."""

    def __init__(self, database_url: str | None, *, setup: bool = False) -> None:
        self.settings = setup_database(database_url)[0] if setup else _settings(database_url)

    def run(self, fn: Any, **kw: Any) -> Any:
        from app.adapters.db.engine import make_engine, make_session_factory
        from app.adapters.vici.driver import ViciGateway
        from app.services.ratings import TableCache

        engine = make_engine(self.settings.database_url)
        timeout = self.settings.vici_timeout
        try:
            with make_session_factory(engine)() as session, session.begin():
                return fn(session=session, cache=TableCache(), vici=lambda p: ViciGateway(p, timeout),
                          default_table=self.settings.default_table, **kw)
        except QossError as exc:
            _fail(exc)
        finally:
            engine.dispose()


def _emit(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


LabPrefix = Annotated[str, typer.Option(
    "--prefix", envvar="QOSS_LAB_PREFIX", help="namespace names start with PREFIX- (distinct prefixes: independent "
    "labs on one machine)")]


@lab_app.command("up")
def lab_up(
    database_url: DbUrl = None,
    hosts: Annotated[int, typer.Option(help="number of hosts (2: left, right)")] = 2,
    agent: Annotated[bool, typer.Option(
        "--agent", help="build the tunnel agent's lab instead: client, Host and Target with their servers")] = False,
    prefix: LabPrefix = "qoss",
) -> None:
    """Create the namespaces, start one charon each, and register them as gateways (migrating the database).

    With --agent: three namespaces PREFIX-client, PREFIX-host and PREFIX-target (a bridge in
    PREFIX-hub joins them), a charon in each, key pairs for Host and Target, their agent
    configs and SQLite databases, and Host's and Target's `qoss serve` in the background,
    all under QOSS_LAB_DIR/agent; the database of --database-url is not used. Prints where
    each part is (namespaces, addresses, URLs, pids, logs) as JSON. Then `qoss lab join
    NAME` for each user; `qoss lab down` removes it all, also after a failed `up`.
    """
    from app.adapters.lab import Lab, LabError
    from app.services import tunnels

    if agent:
        if hosts != 2:
            raise typer.BadParameter("--agent builds its own three hosts: leave out --hosts")
        from app.adapters.lab_agent import AgentLab

        try:
            _emit(AgentLab(settings_for(database_url).lab_dir / "agent", prefix=prefix).up())
        except (LabError, ValueError) as exc:
            typer.echo(f"lab up failed: {exc}", err=True)
            raise typer.Exit(1) from exc
        return

    unit = _Unit(database_url, setup=True)
    try:
        lab = Lab(unit.settings.lab_dir, prefix=prefix)
        made = lab.up(n_hosts=hosts)
    except (LabError, ValueError) as exc:
        typer.echo(f"lab up failed: {exc}", err=True)
        raise typer.Exit(1) from exc

    def register(**kw: Any) -> list[dict[str, Any]]:
        out = []
        for h in made:
            with contextlib.suppress(NotFound):
                tunnels.delete_gateway(session=kw["session"], name=h.name)
            body = tunnels.GatewayIn(name=h.name, vici_socket=h.vici_socket, ike_address=h.ike_address,
                                     inside_networks=[f"{h.inside_address}/32"])
            gw = tunnels.register_gateway(session=kw["session"], vici=kw["vici"], body=body,
                                          allowed_socket_dirs=[unit.settings.lab_dir])
            out.append({**gw.as_dict(), "netns": h.netns, "inside_address": h.inside_address,
                        "log": h.log_path})
        return out

    _emit(unit.run(lambda **kw: register(**kw)))


@lab_app.command("join")
def lab_join(
    name: Annotated[str, typer.Argument(help="the user (a-z, 0-9, . _ -): enrolled at Host on first join")],
    objective: Annotated[int, typer.Option(min=1, max=4, help="Objective-ID (Liu et al. Table 2-2)")] = 3,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
) -> None:
    """A user joins the agent lab (`qoss lab up --agent`): a tunnel on demand, then a ping through it.

    On first join, makes NAME's key pair and client config and enrols NAME at Host (every
    Objective-ID). Then runs `qoss agent connect` as NAME in the client's namespace (Host
    vouches, Target negotiates and hands out a virtual IP) and pings Target's protected
    address from the virtual IP. Prints JSON: user, enrolled (now), virtual_ip, suite (as
    the client's charon reports it: ike, child), proposals (what Target negotiated), ticket,
    conn, ping (transmitted, received, rtt_avg_ms, esp_packets, crossed) and client_config
    (for `ip netns exec PREFIX-client qoss agent status|disconnect --config FILE`).
    Several users join one after another, each with their own virtual IP. Exit status 0 when
    the ping crossed the tunnel, 1 when it did not, 2 when NAME could not connect.
    """
    from app.adapters.lab import LabError
    from app.adapters.lab_agent import AgentLab

    try:
        lab = AgentLab(settings_for(None).lab_dir / "agent")
        if not lab.state_file.exists():
            raise LabError(f"no agent lab is up in {lab.state_dir}: run 'qoss lab up --agent' first")
        levels = {"confidentiality": confidentiality, "integrity": integrity, "key_exchange": key_exchange}
        result = lab.join(name, objective=objective, min_levels={k: v for k, v in levels.items() if v})
    except (LabError, ValueError) as exc:
        typer.echo(f"lab join failed: {exc}", err=True)
        raise typer.Exit(2) from exc
    _emit(result)
    if not (result["ping"] or {}).get("crossed"):
        raise typer.Exit(1)


@lab_app.command("down")
def lab_down(database_url: DbUrl = None) -> None:
    """Take down everything `lab up` built, also after a failed or partial `up`.

    The agent lab: its servers (and any client still running), charons, namespaces and its
    state directory. The gateway lab: its charons and namespaces, and its tunnels and
    gateways in the database (which must be migrated). Prints "lab down"; exit status 1,
    with one line per problem, if something could not be removed.
    """
    from app.adapters.lab import Lab, LabError
    from app.adapters.lab_agent import AgentLab
    from app.cli_db import DatabaseUnusable
    from app.services import tunnels

    lab_dir = settings_for(database_url).lab_dir
    problems = []
    try:
        AgentLab(lab_dir / "agent").down()
    except (LabError, ValueError) as exc:
        problems.append(f"agent lab: {exc}")
    names: list[str] = []
    try:
        lab = Lab(lab_dir)
        names = [h.name for h in lab.hosts]
        lab.down()
    except (LabError, ValueError) as exc:
        problems.append(f"lab: {exc}")
    if names:
        try:
            _Unit(database_url).run(lambda **kw: tunnels.forget_gateways(session=kw["session"], names=names))
        except DatabaseUnusable as exc:
            problems.append(f"gateways {', '.join(names)} are still registered: {exc.message}")
    for problem in problems:
        typer.echo(f"lab down: {problem}", err=True)
    typer.echo("lab down")
    if problems:
        raise typer.Exit(1)


@lab_app.command("status")
def lab_status(database_url: DbUrl = None) -> None:
    """Namespaces, charons and sockets of the lab, and of the agent lab with its servers and users (JSON).

    Top level: the gateway lab (healthy, namespaces, charons, sockets); "agent": null, or the
    agent lab (healthy, prefix, namespaces, charons, sockets, servers with running, pid and
    url, users). "healthy" at the top: something is up and every part of it is well. Exit
    status 1 when not healthy.
    """
    from app.adapters.lab import Lab
    from app.adapters.lab_agent import AgentLab

    lab_dir = settings_for(database_url).lab_dir
    status = Lab(lab_dir).status()
    agent_lab = AgentLab(lab_dir / "agent")
    agent = None
    parts = [status.healthy] if status.namespaces else []
    if agent_lab.recorded:
        got = agent_lab.status()
        described = agent_lab.describe()
        agent = {"healthy": got.healthy, "prefix": agent_lab.prefix, "namespaces": got.lab.namespaces,
                 "charons": got.lab.charons, "sockets": got.lab.sockets,
                 "servers": {role: {"running": running, "pid": described.get(role, {}).get("pid"),
                                    "url": described.get(role, {}).get("url")}
                             for role, running in got.servers.items()},
                 "users": got.users}
        parts.append(got.healthy)
    healthy = bool(parts) and all(parts)
    _emit({"healthy": healthy, "namespaces": status.namespaces, "charons": status.charons,
           "sockets": status.sockets, "agent": agent})
    if not healthy:
        raise typer.Exit(1)


@app.command("gateways")
def gateways_list(database_url: DbUrl = None) -> None:
    """List the registered gateways."""
    from app.services import tunnels

    _emit(_Unit(database_url).run(lambda **kw: [g.as_dict() for g in tunnels.list_gateways(session=kw["session"])]))


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
    psk_file: Annotated[Path | None, typer.Option(help="file holding the peer's PSK (never on the command line)")]
        = None,
    remote_ts: Annotated[list[str] | None, typer.Option(help="the peer's protected networks (repeatable)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Negotiate and bring up a tunnel (as POST /v1/tunnels), to a gateway or an unmanaged --peer."""
    from pydantic import SecretStr, ValidationError

    from app.services import tunnels
    from app.services.negotiation import MinLevelsIn

    peer_in = None
    try:
        if peer is not None:
            if psk_file is None:
                raise typer.BadParameter("--peer needs --psk-file")
            psk = psk_file.read_text().strip()
            peer_in = tunnels.TunnelPeerIn(address=peer, identity=peer_id, psk=SecretStr(psk))
        body = tunnels.TunnelIn(initiator=initiator, responder=responder, peer=peer_in, remote_ts=remote_ts or None,
                                policy=policy, rating_table=rating_table,
                                min_levels=MinLevelsIn(confidentiality=confidentiality, integrity=integrity,
                                                       key_exchange=key_exchange))
    except ValidationError as exc:  # the message names fields and rules, never the PSK
        typer.echo("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()), err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"cannot read --psk-file: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    unit = _Unit(database_url)
    record = unit.run(tunnels.create_tunnel, request=body, allowed_networks=unit.settings.gateway_networks)
    _emit(record.as_dict())


@tunnel_app.command("list")
def tunnel_list(database_url: DbUrl = None) -> None:
    """List tunnels."""
    from app.services import tunnels

    _emit(_Unit(database_url).run(lambda **kw: [t.as_dict() for t in tunnels.list_tunnels(session=kw["session"])]))


@tunnel_app.command("show")
def tunnel_show(tunnel_id: str, database_url: DbUrl = None) -> None:
    """One tunnel with its live state from charon."""
    from app.services import tunnels

    _emit(_Unit(database_url).run(
        lambda **kw: tunnels.tunnel_status(session=kw["session"], vici=kw["vici"], tunnel_id=tunnel_id)))


@tunnel_app.command("down")
def tunnel_down(tunnel_id: str, database_url: DbUrl = None) -> None:
    """Terminate a tunnel and unload it from both charons."""
    from app.services import tunnels

    _Unit(database_url).run(lambda **kw: tunnels.delete_tunnel(session=kw["session"], vici=kw["vici"],
                                                               tunnel_id=tunnel_id))
    typer.echo(f"tunnel {tunnel_id} down")


@bench_app.command("micro")
def bench_micro(
    budget: Annotated[float, typer.Option(help="seconds per algorithm at most")] = 1.0,
    only: Annotated[str | None, typer.Option(help="comma-separated keywords (default: all measurable)")] = None,
    write_table: Annotated[str | None, typer.Option(help="write and import a rating table of this name")] = None,
    base: Annotated[str, typer.Option(help="table whose security levels the measured table keeps")] =
        "standards-2026",
    out: Annotated[Path | None, typer.Option(help="also write the raw results as JSON here")] = None,
    sweep_limit: Annotated[float, typer.Option(help="seconds for the sweep with re-measurements of noisy runs")] =
        50.0,
    repeat: Annotated[int, typer.Option(min=1, max=9, help="whole sweeps to run; each figure is their median")] = 1,
    database_url: DbUrl = None,
) -> None:
    """Time every transform the crypto library offers (64-1400 B), fit ns = a*bytes + b, score 0-10."""
    import time
    from datetime import UTC, datetime

    from app.adapters.files import dump_rating_table_yaml
    from app.domain.scoring import combine_repeats, measured_table
    from app.measure.adapters.micro import BACKEND, available, library_version, machine_id, run_micro

    keywords = [k.strip() for k in only.split(",")] if only else available()
    unit = _Unit(database_url, setup=True) if write_table is not None else None  # before a minute of measuring
    began = time.monotonic()
    with typer.progressbar(length=len(keywords) * repeat, label="measuring") as bar:
        try:
            results = combine_repeats([run_micro(keywords, budget_per_algorithm=budget, sweep_limit=sweep_limit,
                                                 progress=lambda _: bar.update(1)) for _ in range(repeat)])
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from exc
    rows = []
    for r in results:
        row: dict[str, Any] = {"algorithm": r.keyword, "method": r.method, "spread": round(r.spread, 4),
                               "samples": r.samples}
        if r.ops_per_s is not None:
            row["ops_per_s"] = round(r.ops_per_s)
        else:
            fit = r.fit
            row.update(a_ns_per_byte=round(fit.a, 4), b_ns=round(fit.b, 1), r2=round(fit.r2, 4),
                       mb_per_s_1400=round(r.mb_per_s, 1), ns=dict(r.ns_by_size))
        rows.append(row)
    elapsed = round(time.monotonic() - began, 1)
    if out is not None:
        command = " ".join(["qoss bench micro", f"--budget {budget}", *([f"--only {only}"] if only else []),
                            *([f"--repeat {repeat}"] if repeat > 1 else []), f"--out {out}"])
        out.write_text(json.dumps({
            "kind": "qoss-bench-micro", "version": 1, "machine": machine_id(), "backend": BACKEND,
            "library": library_version(), "date": datetime.now(UTC).date().isoformat(), "command": command,
            "budget_per_algorithm": budget, "repeat": repeat, "elapsed_s": elapsed, "results": rows}, indent=2)
            + "\n")
    typer.echo(json.dumps({"machine": machine_id(), "algorithms": len(rows), "elapsed_s": elapsed,
                           "worst_spread": max(r["spread"] for r in rows)}))
    if write_table is None or unit is None:
        return

    def write(**kw: Any) -> dict[str, Any]:
        from app.services.ratings import get_table, import_table

        table = measured_table(
            name=write_table, base=get_table(session=kw["session"], name=base), results=results,
            machine=machine_id(), backend=BACKEND,
            date=datetime.now(UTC).date().isoformat(),
            description=f"Measured by `qoss bench micro` on {machine_id()}; levels from {base}.",
        )
        text = dump_rating_table_yaml(table)
        target = Path("var/bench")
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{table.name}.yaml").write_text(text)
        imported = import_table(session=kw["session"], text=text, fmt="yaml", author="qoss bench")
        return {"table": imported.name, "revision": imported.revision, "ratings": len(imported.ratings),
                "file": str(target / f"{table.name}.yaml")}

    _emit(unit.run(write))


@bench_app.command("report")
def bench_report(
    micro: Annotated[Path, typer.Option(help="JSON written by `qoss bench micro --out`")],
    out: Annotated[Path, typer.Option(help="directory for report.md and the PNG plots")],
    tunnel: Annotated[Path | None, typer.Option(help="JSON written by `qoss bench tunnel --out`")] = None,
    levels_from: Annotated[str, typer.Option(help="shipped rating table for today's security levels")] =
        "standards-2026",
) -> None:
    """Markdown report with plots: throughput, latency fits, key exchange, today beside the published tables."""
    try:
        from app.measure.adapters.report import write_report
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        typer.echo("qoss bench report draws its plots with matplotlib, which this install lacks: "
                   "install qoss with its bench extra (pip install 'qoss[bench]')", err=True)
        raise typer.Exit(2) from None
    from app.adapters.files import load_rating_table
    from app.resources import SHIPPED_RATINGS_DIR

    table = load_rating_table(SHIPPED_RATINGS_DIR / f"{levels_from}.yaml")
    levels = {k: r.confidentiality if r.confidentiality is not None else r.integrity
              for k, r in table.ratings.items()}
    command = " ".join(["qoss bench report", f"--micro {micro}", *([f"--tunnel {tunnel}"] if tunnel else []),
                        f"--out {out}"])
    micro_command = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        micro_command = json.loads(micro.read_text()).get("command")
    try:
        report = write_report(micro_path=micro, tunnel_path=tunnel, out_dir=out, levels=levels,
                              commands=[c for c in (micro_command, command) if c])
    except QossError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    _emit({"report": str(report.markdown), "plots": [str(p) for p in report.plots],
           "flips": sum(len(c.flips) for c in report.comparisons)})


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="who or what the token is for")],
    scopes: Annotated[str, typer.Option(help="comma-separated, e.g. admin or ratings:write,tunnels:read")],
    expires_in: Annotated[int | None, typer.Option(help="seconds (default: one year)")] = None,
    plain: Annotated[bool, typer.Option("--plain", help="print only the token")] = False,
    database_url: DbUrl = None,
) -> None:
    """Create a token; it is printed once and never again."""
    from app.services.auth import create_token

    def make(**kw: Any) -> tuple[str, Any]:
        return create_token(session=kw["session"], name=name, scopes=[s.strip() for s in scopes.split(",")],
                            expires_in=expires_in, created_by="cli")

    token, record = _Unit(database_url, setup=True).run(make)  # the first admin token: a set-up command
    if plain:
        typer.echo(token)
    else:
        _emit({"id": record.id, "name": record.name, "scopes": sorted(record.scopes), "token": token,
               "expires_at": record.expires_at})


@token_app.command("list")
def token_list(database_url: DbUrl = None) -> None:
    """List tokens (never their secrets)."""
    from app.services.auth import list_tokens

    _emit(_Unit(database_url).run(lambda **kw: list_tokens(session=kw["session"])))


@token_app.command("revoke")
def token_revoke(token_id: str, database_url: DbUrl = None) -> None:
    """Revoke a token at once."""
    from app.services.auth import revoke_token

    _Unit(database_url).run(lambda **kw: revoke_token(session=kw["session"], token_id=token_id))
    typer.echo(f"token {token_id} revoked")


from app.cli_agent import agent_app  # noqa: E402 - after the commands above, so the order of --help stays

app.add_typer(agent_app, name="agent")

from app.cli_audit import audit_app  # noqa: E402 - after the commands above, so the order of --help stays

app.add_typer(audit_app, name="audit")

from app.measure.cli_tunnel import bench_tunnel  # noqa: E402

bench_app.command("tunnel")(bench_tunnel)


def main() -> None:
    """Entry point of the ``qoss`` script."""
    app()


if __name__ == "__main__":
    main()
