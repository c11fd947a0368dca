"""``qoss negotiate``, ``qoss gateways``, ``qoss tunnel`` and ``qoss token``: through the
service's API (:mod:`app.cli.client`), audited under the token's name. ``qoss token create``
with no token chosen is the set-up command that makes the first admin token in the database
itself (:func:`app.cli.main.token_create`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.client import Output, connect, show
from app.cli.common import read_input

__all__ = ["gateways_app", "negotiate", "tunnel_app"]

gateways_app = typer.Typer(help="Registered gateways (charons qoss drives); without a command, the list.",
                           invoke_without_command=True)
tunnel_app = typer.Typer(help="Tunnels between registered gateways.", no_args_is_help=True)

_TUNNEL_COLUMNS = ["id", "state", "initiator", "responder", "esp_proposal", "created_at"]
_GATEWAY_COLUMNS = ["name", "ike_address", "identity", "inside_networks", "backend"]


def negotiate(
    request: Annotated[str, typer.Argument(help="negotiation request JSON file, or - for stdin")] = "-",
    output: Output = None,
) -> None:
    """Negotiate (POST /v1/negotiations): the cheapest suite that meets every peer's minimums."""
    text = read_input(request)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        typer.echo(json.dumps({"error": "ValidationError", "detail": f"not JSON: {exc.msg} at line {exc.lineno}"}),
                   err=True)
        raise typer.Exit(2) from None
    with connect() as service:
        show(service.call("POST", "/v1/negotiations", json=document), output)


@gateways_app.callback()
def gateways_list(ctx: typer.Context, output: Output = None) -> None:
    """List the registered gateways (the group's commands register, check and remove them)."""
    if ctx.invoked_subcommand is None:
        with connect() as service:
            show(service.call("GET", "/v1/gateways"), output, _GATEWAY_COLUMNS)


@gateways_app.command("add")
def gateways_add(
    name: str,
    vici_socket: Annotated[str, typer.Option(help="the charon's VICI socket, as the service's machine sees it")],
    ike_address: Annotated[str, typer.Option(help="its IKE address")],
    inside: Annotated[list[str], typer.Option("--inside", help="a network it protects (repeatable)")],
    identity: Annotated[str | None, typer.Option(help="its IKE identity (default: its address)")] = None,
    output: Output = None,
) -> None:
    """Register a charon: the service reads its back end and algorithms over VICI."""
    body = {"name": name, "vici_socket": vici_socket, "ike_address": ike_address, "inside_networks": inside,
            **({"identity": identity} if identity else {})}
    with connect() as service:
        show(service.call("POST", "/v1/gateways", json=body), output)


@gateways_app.command("check")
def gateways_check(
    name: str,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="keep nothing: show what would change and its impact")]
    = False,
    output: Output = None,
) -> None:
    """Read a gateway's back end and algorithms again; its tunnels are negotiated again after it."""
    with connect() as service:
        show(service.call("POST", f"/v1/gateways/{name}/refresh", params={"dry_run": "true"} if dry_run else None),
             output)


@gateways_app.command("remove")
def gateways_remove(name: str) -> None:
    """Forget a gateway (refused while tunnels use it)."""
    with connect() as service:
        service.call("DELETE", f"/v1/gateways/{name}")
    typer.echo(f"gateway {name} removed")


@tunnel_app.command("up")
def tunnel_up(
    initiator: Annotated[str, typer.Argument(help="initiating gateway")],
    responder: Annotated[str | None, typer.Argument(help="responding gateway (omit with --peer)")] = None,
    policy: Annotated[str | None, typer.Option(help="stored policy name")] = None,
    confidentiality: Annotated[int, typer.Option(min=0, max=10)] = 0,
    integrity: Annotated[int, typer.Option(min=0, max=10)] = 0,
    key_exchange: Annotated[int, typer.Option(min=0, max=10)] = 0,
    post_quantum: Annotated[int, typer.Option(min=0, max=10, help="post-quantum minimum (0: none; above 0 needs a "
                                                               "post-quantum preshared key or ML-KEM)")] = 0,
    rating_table: Annotated[str | None, typer.Option(help="negotiating rating table")] = None,
    peer: Annotated[str | None, typer.Option(help="IKE address of an unmanaged peer (instead of RESPONDER)")] = None,
    peer_id: Annotated[str | None, typer.Option(help="the peer's IKE identity (default: its address)")] = None,
    psk_file: Annotated[Path | None, typer.Option(help="file holding the peer's PSK, or - for stdin (never on the "
                                                      "command line)")]
        = None,
    remote_ts: Annotated[list[str] | None, typer.Option(help="the peer's protected networks (repeatable)")] = None,
    output: Output = None,
) -> None:
    """Negotiate and bring up a tunnel (as POST /v1/tunnels), to a gateway or an unmanaged --peer."""
    from pydantic import ValidationError

    from app.web.schemas import TunnelIn

    body: dict[str, Any] = {
        "initiator": initiator, "min_levels": {"confidentiality": confidentiality, "integrity": integrity,
                                               "key_exchange": key_exchange, "post_quantum": post_quantum},
        **{k: v for k, v in {"responder": responder, "policy": policy, "rating_table": rating_table,
                             "remote_ts": remote_ts or None}.items() if v is not None}}
    if peer is not None:
        if psk_file is None:
            raise typer.BadParameter("--peer needs --psk-file")
        psk = read_input(str(psk_file)).strip()  # a regular file of at most 1 MiB; errors never quote it
        body["peer"] = {"address": peer, "psk": psk, **({"identity": peer_id} if peer_id else {})}
    try:  # checked here first: a refusal sends nothing, and its message names fields, never the PSK
        TunnelIn.model_validate(body)
    except ValidationError as exc:
        typer.echo("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()), err=True)
        raise typer.Exit(2) from None
    with connect() as service:
        show(service.call("POST", "/v1/tunnels", json=body), output)


@tunnel_app.command("list")
def tunnel_list(
    state: Annotated[str | None, typer.Option(help="only tunnels in this state")] = None,
    output: Output = None,
) -> None:
    """List tunnels, oldest first (every page)."""
    records: list[Any] = []
    with connect() as service:
        params: dict[str, Any] | None = {"limit": 1000, **({"state": state} if state else {})}
        path = "/v1/tunnels"
        while True:
            answer = service.send("GET", path, params=params)
            if answer.status_code != 200:
                service.refused(answer)
            records.extend(answer.json())
            following = answer.links.get("next", {}).get("url")
            if not following:
                break
            path, params = following, None
    show(records, output, _TUNNEL_COLUMNS)


@tunnel_app.command("show")
def tunnel_show(tunnel_id: str, output: Output = None) -> None:
    """One tunnel with its live state from charon."""
    with connect() as service:
        show(service.call("GET", f"/v1/tunnels/{tunnel_id}"), output)


@tunnel_app.command("down")
def tunnel_down(tunnel_id: str) -> None:
    """Terminate a tunnel and unload it from both charons."""
    with connect() as service:
        service.call("DELETE", f"/v1/tunnels/{tunnel_id}")
    typer.echo(f"tunnel {tunnel_id} down")
