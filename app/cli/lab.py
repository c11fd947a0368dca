"""``qoss lab``: the strongSwan lab in network namespaces (root), and the tunnel agent's lab."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.common import DbUrl, Unit, emit
from app.cli.db import settings_for
from app.domain.errors import NotFound

__all__ = ["lab_app"]

lab_app = typer.Typer(help="The strongSwan lab: charons in network namespaces (root). `lab up` builds two "
                      "gateways (left, right); `lab up --agent` builds the tunnel agent's client, Host and Target, "
                      "which users then `lab join`; `lab up --peers` builds two sites, each with its own charon "
                      "and qoss, peered.", no_args_is_help=True)

LabPrefix = Annotated[str, typer.Option(
    "--prefix", envvar="QOSS_LAB_PREFIX", help="namespace names start with PREFIX- (distinct prefixes: independent "
    "labs on one machine)")]


@lab_app.command("up")
def lab_up(
    database_url: DbUrl = None,
    hosts: Annotated[int, typer.Option(help="number of hosts (2: left, right)")] = 2,
    agent: Annotated[bool, typer.Option(
        "--agent", help="build the tunnel agent's lab instead: client, Host and Target with their servers "
        "(with --family: Target's IKE address, protected networks and pool of those families)")] = False,
    peers: Annotated[bool, typer.Option(
        "--peers", help="build two peered sites instead: site-a and site-b, each its own namespace, charon and "
        "qoss serve (IPv4 only)")] = False,
    prefix: LabPrefix = "qoss",
    family: Annotated[str, typer.Option(
        help="address families: 4, 6, 4,6 or 6,4. With 6 the hosts also get IPv6 addresses (IKE on "
        "fd00:71::/64, inside fd01::/64, fd02::/64, ...); the first family listed is the one IKE runs over "
        "and the gateways are registered with, their inside networks those of every family listed")] = "4",
) -> None:
    """Create the namespaces, start one charon each, and register them as gateways (migrating the database).

    --family 6: IKE between fd00:71::1 and fd00:71::2, inside networks fd01::/64 (left,
    fd01::1 answers) and fd02::/64 (right, fd02::1). --family 4,6: IKE over IPv4, the inside
    networks of both families (a dual-stack tunnel); --family 6,4: the same over IPv6. The
    IPv4 addresses are always there.

    With --agent: three namespaces PREFIX-client, PREFIX-host and PREFIX-target (a bridge in
    PREFIX-hub joins them), a charon in each, key pairs for Host and Target, their agent
    configs and SQLite databases, and Host's and Target's `qoss serve` in the background,
    all under QOSS_LAB_DIR/agent; the database of --database-url is not used. Prints where
    each part is (namespaces, addresses, URLs, pids, logs) as JSON. Then `qoss lab join
    NAME` for each user; `qoss lab down` removes it all, also after a failed `up`.
    --agent --family 6: the servers listen and Target takes IKE on the IPv6 IKE addresses
    (Host fd00:71::2, Target fd00:71::3), Target protects fd03::/64 and hands out virtual IPs
    from fd08::/124; with 6,4 or 4,6 it protects 10.3.0.1/32 too and gives each client an
    address of each family (10.8.0.0/28 with fd08::/124 beside it).

    With --peers: namespaces PREFIX-site-a and PREFIX-site-b on the lab network 10.77.0.0/24
    (inside networks 10.1.0.1/32 and 10.2.0.1/32), a charon and a `qoss serve` in each with
    its own database, state directory and admin token, all under QOSS_LAB_DIR/peers; the
    database of --database-url is not used. Each site's charon is registered as its gateway
    and each site as the other's peer, through their APIs. Prints one JSON line: {"sites":
    {"site-a": {url, token, gateway, inside, netns, vici, pid, lab_url}, "site-b": {...}}},
    url reaching the site's API from here (a relay on 127.0.0.1), lab_url from the lab network.
    """
    from app.domain.requests import GatewaySpec
    from app.lab.hosts import Lab
    from app.lab.processes import LabError
    from app.services import gateways

    families = _families(family)
    if peers:
        if agent or hosts != 2 or families != (4,):
            raise typer.BadParameter("--peers builds its own two IPv4 sites: leave out --agent, --hosts and --family")
        from app.lab.peers import PeersLab

        try:
            sites = PeersLab(settings_for(database_url).lab_dir / "peers", prefix=prefix).up()
        except (LabError, ValueError) as exc:
            typer.echo(f"lab up failed: {exc}", err=True)
            raise typer.Exit(1) from exc
        typer.echo(json.dumps(sites, sort_keys=True))
        return
    if agent:
        if hosts != 2:
            raise typer.BadParameter("--agent builds its own three hosts: leave out --hosts")
        from app.lab.agent import AgentLab

        try:
            emit(AgentLab(settings_for(database_url).lab_dir / "agent", prefix=prefix, families=families).up())
        except (LabError, ValueError) as exc:
            typer.echo(f"lab up failed: {exc}", err=True)
            raise typer.Exit(1) from exc
        return

    unit = Unit(database_url, setup=True)
    try:
        lab = Lab(unit.settings.lab_dir, prefix=prefix, families=families)
        made = lab.up(n_hosts=hosts)
    except (LabError, ValueError) as exc:
        typer.echo(f"lab up failed: {exc}", err=True)
        raise typer.Exit(1) from exc

    def register(**kw: Any) -> list[dict[str, Any]]:
        out = []
        for h in made:
            with contextlib.suppress(NotFound):
                gateways.delete_gateway(uow=kw["uow"], name=h.name)
            body = GatewaySpec(name=h.name, vici_socket=h.vici_socket, ike_address=h.gateway_ike_address,
                               inside_networks=tuple(h.inside_networks))
            gw = gateways.register_gateway(uow=kw["uow"], vici=kw["vici"], body=body,
                                          allowed_socket_dirs=[unit.settings.lab_dir])
            out.append({**gw.as_dict(), "netns": h.netns, "inside_address": h.inside_address,
                        **({"inside_address6": h.inside_address6} if h.inside_address6 else {}),
                        "log": h.log_path})
        return out

    emit(unit.run(lambda **kw: register(**kw)))


def _families(text: str) -> tuple[int, ...]:
    """``--family``: ``4``, ``6``, ``4,6`` or ``6,4``."""
    try:
        families = tuple(int(part) for part in text.split(","))
    except ValueError:
        families = ()
    if not families or len(set(families)) != len(families) or not set(families) <= {4, 6}:
        raise typer.BadParameter("4, 6, 4,6 or 6,4", param_hint="--family")
    return families


@lab_app.command("join")
def lab_join(
    name: Annotated[str, typer.Argument(help="the user (a-z, 0-9, . _ -): enrolled at Host on first join")],
    objective: Annotated[int, typer.Option(min=1, max=4, help="Objective-ID (Liu et al. Table 2-2)")] = 3,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    post_quantum: Annotated[int, typer.Option(
        min=0, max=10, help="post-quantum minimum: above 0 the tunnel gets a PPK at both ends")] = 0,
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
    from app.lab.agent import AgentLab
    from app.lab.agent_users import join
    from app.lab.processes import LabError

    try:
        lab = AgentLab(settings_for(None).lab_dir / "agent")
        if not lab.state_file.exists():
            raise LabError(f"no agent lab is up in {lab.state_dir}: run 'qoss lab up --agent' first")
        levels = {"confidentiality": confidentiality, "integrity": integrity, "key_exchange": key_exchange,
                  "post_quantum": post_quantum}
        result = join(lab, name, objective=objective, min_levels={k: v for k, v in levels.items() if v})
    except (LabError, ValueError) as exc:
        typer.echo(f"lab join failed: {exc}", err=True)
        raise typer.Exit(2) from exc
    emit(result)
    if not (result["ping"] or {}).get("crossed"):
        raise typer.Exit(1)


@lab_app.command("device")
def lab_device(
    name: Annotated[str, typer.Argument(help="the user (a-z, 0-9, . _ -): enrolled at Host if new")],
    platform: Annotated[str | None, typer.Option(
        help="the device's VPN client: android, apple, windows, networkmanager, swanctl")] = None,
    out: Annotated[Path | None, typer.Option(help="where the profile and its files go")] = None,
    revoke: Annotated[bool, typer.Option("--revoke", help="revoke NAME's devices instead")] = False,
    link: Annotated[bool, typer.Option(
        "--link", help="also leave the profile at Host for one download (android, apple); prints its link")] = False,
    objective: Annotated[int, typer.Option(min=2, max=4, help="Objective-ID (Liu et al. Table 2-2)")] = 3,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    post_quantum: Annotated[int, typer.Option(
        min=0, max=10, help="post-quantum minimum: above 0 the profile carries a PPK (apple, swanctl)")] = 0,
) -> None:
    """A user enrols a phone or laptop in the agent lab (`qoss lab up --agent`), as they would:
    `qoss agent device enrol` through the lab's Host and Target, the profile for --platform
    written into --out. Prints one JSON line: profile (its path), passphrase (the PKCS#12's,
    shown once), ticket, platform, ike_proposal, esp_proposal, gateway, identity, files; with
    --link also link (one download, from the lab's namespaces, within 10 minutes).
    A stock client in the namespace PREFIX-device can then join with that profile.
    With --revoke: revokes every device NAME enrolled (their live tunnels end, their
    certificates are refused from then on); prints {"revoked": [tickets]}.
    Exit status 2 when Target refused or no lab is up.
    """
    from app.lab.agent import AgentLab
    from app.lab.agent_users import device, revoke_devices
    from app.lab.processes import LabError

    try:
        lab = AgentLab(settings_for(None).lab_dir / "agent")
        if not lab.state_file.exists():
            raise LabError(f"no agent lab is up in {lab.state_dir}: run 'qoss lab up --agent' first")
        if revoke:
            result: dict[str, Any] = {"revoked": revoke_devices(lab, name)}
        else:
            if platform is None or out is None:
                raise typer.BadParameter("--platform and --out (or --revoke)")
            levels = {"confidentiality": confidentiality, "integrity": integrity, "key_exchange": key_exchange,
                      "post_quantum": post_quantum}
            result = device(lab, name, platform=platform, out_dir=str(out.resolve()), objective=objective,
                            min_levels={k: v for k, v in levels.items() if v}, link=link)
    except (LabError, ValueError) as exc:
        typer.echo(f"lab device failed: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(result, sort_keys=True))


@lab_app.command("invite")
def lab_invite(
    name: Annotated[str, typer.Argument(help="the user whose phone is invited (a-z, 0-9, . _ -)")],
    platform: Annotated[str, typer.Option(help="the phone's or laptop's client: android, apple, windows, "
                                                "networkmanager")],
    expires: Annotated[str, typer.Option(help="how long the invitation lives: 15m, 1h, 900s (at most 24h)")] = "15m",
) -> None:
    """A one-time invitation for NAME's phone at the agent lab's Host (`qoss lab up --agent`), as
    `qoss agent invite` makes it. Prints one JSON line: link (Host's join page with the secret in
    its fragment, reachable from this machine's browser as a phone on the lab network reaches
    Host), id, expires_at, user_id, platform. Exit status 2 when it is refused or no lab is up.
    """
    from app.cli.agent import duration_seconds
    from app.domain.errors import QossError
    from app.lab.agent import AgentLab
    from app.lab.processes import LabError

    try:
        lab = AgentLab(settings_for(None).lab_dir / "agent")
        result = lab.invite(name, platform=platform, ttl=duration_seconds(expires))
    except (LabError, QossError, ValueError) as exc:
        typer.echo(f"lab invite failed: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(result, sort_keys=True))


@lab_app.command("down")
def lab_down(database_url: DbUrl = None) -> None:
    """Take down everything `lab up` built, also after a failed or partial `up`.

    The agent lab: its servers (and any client still running), charons, namespaces and its
    state directory. The peers lab: its services, relays, charons, namespaces and its state
    directory. The gateway lab: its charons and namespaces, and its tunnels and
    gateways in the database (which must be migrated). Prints "lab down"; exit status 1,
    with one line per problem, if something could not be removed.
    """
    from app.cli.db import DatabaseUnusable
    from app.lab.agent import AgentLab
    from app.lab.hosts import Lab
    from app.lab.peers import PeersLab
    from app.lab.processes import LabError
    from app.services import gateways

    lab_dir = settings_for(database_url).lab_dir
    problems = []
    try:
        AgentLab(lab_dir / "agent").down()
    except (LabError, ValueError) as exc:
        problems.append(f"agent lab: {exc}")
    try:
        PeersLab(lab_dir / "peers").down()
    except (LabError, ValueError) as exc:
        problems.append(f"peers lab: {exc}")
    names: list[str] = []
    try:
        lab = Lab(lab_dir)
        names = [h.name for h in lab.hosts]
        lab.down()
    except (LabError, ValueError) as exc:
        problems.append(f"lab: {exc}")
    if names:
        try:
            Unit(database_url).run(lambda **kw: gateways.forget_gateways(uow=kw["uow"], names=names))
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
    url, users). "peers": null, or the peers lab (healthy, prefix, namespaces, charons,
    sockets, and whether each site's service and relay runs). "healthy" at the top: something
    is up and every part of it is well. Exit status 1 when not healthy.
    """
    from app.lab.agent import AgentLab
    from app.lab.hosts import Lab
    from app.lab.peers import PeersLab

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
    peers_lab = PeersLab(lab_dir / "peers")
    peers = None
    if peers_lab.recorded:
        lab = peers_lab.lab.status()
        running = peers_lab.running()
        peers_healthy = lab.healthy and bool(running) and all(running.values())
        peers = {"healthy": peers_healthy, "prefix": peers_lab.prefix, "namespaces": lab.namespaces,
                 "charons": lab.charons, "sockets": lab.sockets, "running": running}
        parts.append(peers_healthy)
    healthy = bool(parts) and all(parts)
    emit({"healthy": healthy, "namespaces": status.namespaces, "charons": status.charons,
           "sockets": status.sockets, "agent": agent, "peers": peers})
    if not healthy:
        raise typer.Exit(1)
