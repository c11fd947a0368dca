"""``qoss agent``: keys, enrolment and revocation (Host), connect and disconnect (Client)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.domain.agent.platforms import PLATFORMS
from app.domain.errors import QossError

if TYPE_CHECKING:
    from app.adapters.vici.sa_events import SaEventHub
    from app.settings import Settings

__all__ = ["agent_app", "duration_seconds"]

agent_app = typer.Typer(help="The tunnel agent: mobile users get tunnels on demand (Client / Host / Target).",
                        no_args_is_help=True)

DbUrl = Annotated[str | None, typer.Option("--database-url", envvar="QOSS_DATABASE_URL", help="SQLAlchemy URL")]
ServerConfig = Annotated[Path | None, typer.Option("--config", envvar="QOSS_AGENT_CONFIG",
                                                   help="the server's agent config (YAML)")]
ClientConfigOpt = Annotated[Path, typer.Option("--config", envvar="QOSS_AGENT_CLIENT_CONFIG",
                                               help="the client's agent config (YAML)")]


def _emit(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def _fail(exc: QossError, code: int = 2) -> None:
    from app.cli.common import fail

    fail(exc, code)


def _session_factory(ctx: typer.Context, database_url: str | None) -> Any:
    """Sessions on the Host's or Target's database, which must be migrated already: these
    commands set nothing up (``qoss db upgrade`` does; app/cli/db.py says it in one line). The
    engine's connections are closed when the command ends."""
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import engine_for
    from app.cli.db import require_database

    settings = require_database(database_url)
    engine = engine_for(settings)
    ctx.call_on_close(engine.dispose)
    return make_session_factory(engine), settings


@agent_app.command("keygen")
def keygen(
    name: Annotated[str, typer.Argument(help="user or server id (a-z, 0-9, . _ -)")],
    directory: Annotated[Path, typer.Option("--dir", help="where the key files go")] = Path("var/agent"),
    force: Annotated[bool, typer.Option("--force", help="replace existing keys")] = False,
    add_mlkem: Annotated[bool, typer.Option(
        "--add-mlkem", help="keep the existing keys and add an ML-KEM-768 key beside them")] = False,
) -> None:
    """Make an Ed25519 (signing), an X25519 and an ML-KEM-768 (sealing, hybrid) key: private files
    0600, public ``<name>.pub.json``. With --add-mlkem, keys made without an ML-KEM-768 key gain one
    (enrol or register the new public file again)."""
    from app.adapters.agent.crypto import KeyPair, load_keys, write_keys
    from app.domain.errors import InvalidInput

    try:
        if add_mlkem:
            keys = load_keys(directory, name)
            if keys.public.mlkem is not None:
                raise InvalidInput(f"the keys of {name} in {directory} have an ML-KEM-768 key already")
            keys = keys.with_mlkem()
        else:
            keys = KeyPair.generate(name)
        public_file = write_keys(keys, directory, overwrite=force or add_mlkem)
    except QossError as exc:
        _fail(exc)
        return
    _emit({"id": name, **keys.public.as_dict(), "public_key_file": str(public_file)})


@agent_app.command("enroll")
def enroll(
    ctx: typer.Context,
    public_key_file: Annotated[Path, typer.Argument(help="the user's <name>.pub.json")],
    objective: Annotated[list[int], typer.Option("--objective", help="an Objective-ID 1-4 the user may ask for")],
    database_url: DbUrl = None,
) -> None:
    """Host: enrol a user's public keys and allowed Objective-IDs (re-enrols a revoked user)."""
    from app.adapters.agent.crypto import load_public
    from app.adapters.db.agent import UserRepository
    from app.cli.common import need_files
    from app.domain.agent import EnrolledUser
    from app.domain.errors import InvalidInput

    need_files(public_key_file)
    try:
        if not objective or any(o not in (1, 2, 3, 4) for o in objective):
            raise InvalidInput("--objective takes Objective-IDs 1-4")
        user_id, keys = load_public(public_key_file)
        factory, _ = _session_factory(ctx, database_url)
        user = EnrolledUser(user_id=user_id, sign_public_key=keys.sign, kem_public_key=keys.kem,
                            objectives=frozenset(objective), mlkem_public_key=keys.mlkem)
        with factory() as session, session.begin():
            UserRepository(session).enroll(user)
    except QossError as exc:
        _fail(exc)
        return
    _emit(user.as_dict())


_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str) -> int:
    """``15m``, ``1h``, ``900s`` or ``900`` as seconds.

    Raises:
        InvalidInput: anything else.
    """
    from app.domain.errors import InvalidInput

    value = text.strip().lower()
    unit = _UNITS.get(value[-1:], 0)
    number = value[:-1] if unit else value
    if not number.isdigit() or len(number) > 6:
        raise InvalidInput(f"{text!r} is not a duration: say 15m, 1h or 900s")
    return int(number) * (unit or 1)


@agent_app.command("invite")
def invite(
    ctx: typer.Context,
    user_id: Annotated[str, typer.Argument(help="the user whose phone is invited (a-z, 0-9, . _ -)")],
    platform: Annotated[str, typer.Option(help="the phone's or laptop's client: android, apple, windows, "
                                                "networkmanager")],
    expires: Annotated[str, typer.Option(help="how long it lives: 15m, 1h, 900s (60 s to 24 h)")] = "15m",
    link_base: Annotated[str, typer.Option(help="Host's address as the phone reaches it")] = "http://localhost:8000",
    objective: Annotated[list[int] | None, typer.Option(
        "--objective", help="an Objective-ID 1-4 the user may ask for (default 3, ESP)")] = None,
    database_url: DbUrl = None,
) -> None:
    """Host: a one-time invitation for a user's phone. Prints the link once (its secret is in the
    fragment: Host keeps only its SHA-256) with its id and expiry, and draws the link as a QR
    code on the terminal for the phone's camera. On the phone, the link's page makes the user's
    keys, registers them for USER and enrols one device of --platform. A user enrolled with keys
    of their own is refused: invite the phone under a user id of its own (e.g. USER-phone)."""
    import getpass

    from app.adapters.agent.crypto import CRYPTO
    from app.adapters.db.agent_store import SqlAgentStore
    from app.domain.errors import InvalidInput
    from app.services.agent.invitations import HostInvitations, join_link

    try:
        if not link_base.startswith(("http://", "https://")) or any(c in link_base for c in " #?"):
            raise InvalidInput("--link-base is Host's http:// or https:// address, e.g. https://vpn.example.org")
        ttl = duration_seconds(expires)
        factory, _ = _session_factory(ctx, database_url)
        # Host's id matters only to a redemption (signed for it), which the server checks.
        invitations = HostInvitations(host_id="", store=SqlAgentStore(factory), crypto=CRYPTO)
        secret, listed = invitations.invite(user_id=user_id, platform=platform, ttl=ttl,
                                            created_by=f"cli:{getpass.getuser()}", objectives=objective)
    except QossError as exc:
        _fail(exc)
        return
    link = join_link(link_base, secret)
    if sys.stderr.isatty():
        import segno

        segno.make(link, error="m").terminal(out=sys.stderr, compact=True)
    _emit({"link": link, "id": listed["id"], "expires_at": listed["expires_at"], "user_id": user_id,
           "platform": platform})


@agent_app.command("users")
def users(ctx: typer.Context, database_url: DbUrl = None) -> None:
    """Host: the enrolled users."""
    from app.adapters.db.agent import UserRepository

    factory, _ = _session_factory(ctx, database_url)
    with factory() as session:
        _emit([{**u.as_dict(), "created_at": c, "revoked_at": r} for u, c, r in UserRepository(session).all()])


@agent_app.command("revoke")
def revoke(ctx: typer.Context, user_id: str, config: ServerConfig = None, database_url: DbUrl = None) -> None:
    """Host: revoke a user and tell every target to take the user's tunnels down."""
    from app.adapters.agent.crypto import CRYPTO, load_keys
    from app.adapters.agent.devices import LocalDeviceKit
    from app.adapters.db.agent_store import SqlAgentStore
    from app.adapters.db.unit_of_work import sql_units_of_work
    from app.bootstrap import agent_post, charons
    from app.cli.common import need_files
    from app.services.agent.config import load_server_config
    from app.services.agent.host import HostAgent
    from app.services.agent.target import TargetAgent

    if config is None:
        typer.echo("--config (or QOSS_AGENT_CONFIG) names the Host's agent config", err=True)
        raise typer.Exit(2)
    try:
        factory, settings = _session_factory(ctx, database_url)  # the database first, as every command
        need_files(config)
        agent_config = load_server_config(config)
        keys = load_keys(agent_config.key_dir, agent_config.id)
        store = SqlAgentStore(factory)
        target = None
        if agent_config.target is not None:
            target = TargetAgent(config=agent_config, keys=keys, crypto=CRYPTO, store=store,
                                 units=sql_units_of_work(factory),
                                 vici=charons(settings),
                                 default_table=settings.default_table,
                                 devices=LocalDeviceKit(agent_config.key_dir, owner=agent_config.target_identity,
                                                        gateway_addresses=[agent_config.target.ike_address]))
        host = HostAgent(config=agent_config, keys=keys, crypto=CRYPTO, store=store, local_target=target,
                         post=agent_post(settings))
        _emit(host.revoke(user_id))
    except QossError as exc:
        _fail(exc)


def client_reports(settings: Settings) -> SaEventHub | None:
    """The client's reports of its charon's SAs (``SaEventHub``, wired as the service's is), or None
    when ``settings`` turn them off (``QOSS_SA_REPORTS``). With ``QOSS_DETACHED_INITIATE`` false
    the hub answers that charon must wait, and it never connects."""
    from app.adapters.vici.sa_events import SaEventHub
    from app.bootstrap import sa_listener

    if not settings.sa_reports:
        return None
    return SaEventHub(listen=sa_listener(settings), detached=settings.detached_initiate)


def _client(config: Path) -> Any:
    """The user's client; its HTTP to Host takes the fast path unless ``QOSS_FAST_PATHS`` is false.
    It initiates without waiting in charon and reads charon's report of the SAs, unless
    ``QOSS_SA_REPORTS`` or ``QOSS_DETACHED_INITIATE`` is false (then charon waits and ``list-sas``
    is read)."""
    from app.adapters.agent.crypto import CRYPTO, load_keys
    from app.adapters.vici.gateway import ViciGateway
    from app.bootstrap import agent_post
    from app.cli.common import need_files
    from app.services.agent.client import AgentClient
    from app.services.agent.config import load_client_config
    from app.settings import Settings

    need_files(config)
    cfg = load_client_config(config)
    settings = Settings()
    post = agent_post(settings)
    client = AgentClient(config=cfg, keys=load_keys(cfg.key_dir, cfg.user), crypto=CRYPTO,
                         vici=ViciGateway(cfg.vici_socket, 20.0), post=post,
                         reports=client_reports(settings))
    gc.freeze()  # the modules' objects: no full collection over them during the connect
    return client


_POST_QUANTUM = "post-quantum minimum (0 none; above 0 the tunnel needs a post-quantum mechanism)"
_POST_QUANTUM_DEVICE = ("post-quantum minimum (0 none; above 0 the profile carries a post-quantum preshared key: "
                        "apple and swanctl only)")


def _levels(confidentiality: int, integrity: int, key_exchange: int, post_quantum: int) -> dict[str, int]:
    """The minimums a request names; ``post_quantum`` only when asked for (a Target that predates it
    then reads the request as before)."""
    levels = {"confidentiality": confidentiality, "integrity": integrity, "key_exchange": key_exchange}
    return {**levels, "post_quantum": post_quantum} if post_quantum else levels


@agent_app.command("connect")
def connect(
    config: ClientConfigOpt,
    target: Annotated[str, typer.Option(help="the target's id")],
    objective: Annotated[int, typer.Option(min=1, max=4, help="Objective-ID (Liu et al. Table 2-2)")] = 3,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    post_quantum: Annotated[int, typer.Option(min=0, max=10, help=_POST_QUANTUM)] = 0,
    lifetime: Annotated[int, typer.Option(min=30, max=86_400, help="seconds")] = 600,
    refresh: Annotated[bool, typer.Option(
        "--refresh", help="read the local charon's algorithms and back end again instead of the cache")] = False,
) -> None:
    """Client: ask Host for a tunnel to a target, verify the answer, bring the tunnel up, report it.

    The local charon's algorithms and back end are cached in the state directory and read
    again when charon restarts, after an hour, or with ``--refresh``.
    """
    try:
        report = _client(config).connect(
            target=target, objective_id=objective, lifetime=lifetime, refresh=refresh,
            min_levels=_levels(confidentiality, integrity, key_exchange, post_quantum),
        )
    except QossError as exc:
        _fail(exc)
        return
    _emit(report)


device_app = typer.Typer(help="Client: phones and laptops, with the VPN client they already have.",
                         no_args_is_help=True)
agent_app.add_typer(device_app, name="device")
#: The profiles that hold everything (the PKCS#12 inside): a phone can take them from a link.
_LINKABLE = tuple(name for name, p in PLATFORMS.items() if p.linkable)


@device_app.command("enrol")
def device_enrol(
    config: ClientConfigOpt,
    target: Annotated[str, typer.Option(help="the target's id")],
    platform: Annotated[str, typer.Option(help=f"the device's VPN client: {', '.join(PLATFORMS)}")],
    out: Annotated[Path, typer.Option(help="where the profile and its files go (made 0700)")],
    objective: Annotated[int, typer.Option(min=2, max=4, help="Objective-ID (Liu et al. Table 2-2)")] = 3,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    post_quantum: Annotated[int, typer.Option(min=0, max=10, help=_POST_QUANTUM_DEVICE)] = 0,
    link: Annotated[bool, typer.Option(
        "--link", help="also leave the profile at Host for one download and show its link as a QR code "
        "(android, apple: the profiles that hold everything)")] = False,
    link_base: Annotated[str | None, typer.Option(
        help="the Host URL the phone reaches (default: the client config's)")] = None,
) -> None:
    """Enrol a device through Host: Target negotiates its suite, issues its certificate and
    writes a profile for its VPN client into --out. Prints the profile's path, the PKCS#12's
    one-time passphrase (shown once, stored nowhere) and beside it the SHA-256 fingerprint of
    the gateway's CA ("ca_fingerprint"), to compare with the one the device shows on import.
    With --link, the profile also waits at Host for one download within 10 minutes, sealed
    under a key that is only in the link's fragment (Host can neither read nor change it): its
    link is printed (as "link") and drawn as a QR code on the terminal, for the phone's camera."""
    if platform not in PLATFORMS:
        typer.echo(f"--platform: one of {', '.join(PLATFORMS)}", err=True)
        raise typer.Exit(2)
    if link and platform not in _LINKABLE:
        typer.echo(f"--link: only for {', '.join(_LINKABLE)} (a {platform} profile has files beside it)", err=True)
        raise typer.Exit(2)
    try:
        client = _client(config)
        report = client.enrol_device(
            target=target, objective_id=objective, platform=platform, out_dir=out,
            min_levels=_levels(confidentiality, integrity, key_exchange, post_quantum))
    except QossError as exc:
        _fail(exc)
        return
    failed = None
    if link:  # the device is enrolled: its report (and passphrase) is printed whatever happens here
        try:
            report["link"] = client.handoff(report, link_base=link_base)
        except QossError as exc:
            failed = exc
    if "link" in report and sys.stderr.isatty():
        import segno

        segno.make(report["link"], error="m").terminal(out=sys.stderr, compact=True)
    _emit(report)
    if failed is not None:
        typer.echo(f"the profile is enrolled and written, but Host did not keep it for a link: {failed.message}",
                   err=True)
        raise typer.Exit(1)


@device_app.command("list")
def device_list(config: ClientConfigOpt, offline: Annotated[bool, typer.Option(
        "--offline", help="only what this machine kept: do not ask each device's Target")] = False,
        everywhere: Annotated[bool, typer.Option(
            "--everywhere", help="every device of yours at every target, wherever it was enrolled from "
                                 "(the phone's page too), as each Target says")] = False) -> None:
    """The devices enrolled from here (no passphrases), each with what its Target says of it now:
    ``state`` (``active``; ``revoked``, ``expired`` or ``closed`` with the ``reason``: a profile an
    edit left below its minimums says "its profile is stale: enrol the device again"). With
    ``--everywhere``: every device of yours, as each Target lists it (``active``, ``stale``,
    ``revoked``, ``expired``, ``ended``)."""
    if everywhere and offline:
        from app.domain.errors import InvalidInput

        _fail(InvalidInput("--everywhere asks the targets: it cannot be --offline"))
    client = _client(config)
    _emit(client.devices_everywhere() if everywhere else client.devices(ask=not offline))


@device_app.command("revoke")
def device_revoke(config: ClientConfigOpt, ticket: Annotated[str, typer.Argument(help="the device's ticket")]) -> None:
    """Revoke a device (one enrolled from here, or any active one of yours at a target, such as the
    phone that joined from its own page): its live tunnel ends and its certificate is accepted no more."""
    try:
        _emit(_client(config).revoke_device(ticket))
    except QossError as exc:
        _fail(exc)


@agent_app.command("disconnect")
def disconnect(
    config: ClientConfigOpt,
    ticket: Annotated[str | None, typer.Argument(help="one tunnel's ticket (default: all)")] = None,
) -> None:
    """Client: tear a tunnel down here and at its target."""
    try:
        _emit({"closed": _client(config).disconnect(ticket)})
    except QossError as exc:
        _fail(exc)


@agent_app.command("status")
def status(config: ClientConfigOpt) -> None:
    """Client: the tunnels this client brought up, and whether charon has each one's SA up now.

    A tunnel the target closed (expired ticket, revoked user) has no SA left: it is cleaned up
    here (conn and secret unloaded) and listed once more with ``closed``."""
    try:
        _emit(_client(config).status())
    except QossError as exc:
        _fail(exc)
