"""``qoss peers``: other qoss services this one negotiates tunnels with, through the service's
API (:mod:`app.cli.client`), audited under the token's name like any client's change."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app.cli.client import Output, connect, show

__all__ = ["peers_app"]

peers_app = typer.Typer(help="Peers: other qoss services (through the service: QOSS_URL, QOSS_TOKEN or a context).",
                        no_args_is_help=True)


@peers_app.command("identity")
def peers_identity(output: Output = None) -> None:
    """This service's peering name and public keys: what the other side's administrator registers."""
    with connect() as service:
        show(service.call("GET", "/v1/peering/identity"), output)


@peers_app.command("list")
def peers_list(output: Output = None) -> None:
    """The registered peers."""
    with connect() as service:
        show(service.call("GET", "/v1/peers"), output)


@peers_app.command("add")
def peers_add(
    name: Annotated[str, typer.Argument(help="the peer's name, as it calls itself (its QOSS_PEER_NAME)")],
    url: Annotated[str, typer.Option(help="its API's base URL, as this service reaches it")],
    sign_key: Annotated[str, typer.Option("--sign-key", help="its sign_public_key (from its identity)")],
    kem_key: Annotated[str, typer.Option("--kem-key", help="its kem_public_key (from its identity)")],
    gateway: Annotated[list[str], typer.Option("--gateway", help="a gateway of ours it may ask for (repeat)")],
    network: Annotated[list[str], typer.Option("--network", help="a network of ours it may ask for (repeat)")],
    confidentiality: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    integrity: Annotated[int | None, typer.Option(min=0, max=10)] = None,
    key_exchange: Annotated[int | None, typer.Option("--key-exchange", min=0, max=10)] = None,
    post_quantum: Annotated[int | None, typer.Option("--post-quantum", min=0, max=10)] = None,
    mlkem_key: Annotated[str | None, typer.Option(
        "--mlkem-key", help="its mlkem_public_key (from its identity): messages to it are sealed hybrid")] = None,
    output: Output = None,
) -> None:
    """Register a peer with what it may ask for and the minimum levels we demand of its tunnels."""
    levels = {k: v for k, v in (("confidentiality", confidentiality), ("integrity", integrity),
                                ("key_exchange", key_exchange), ("post_quantum", post_quantum)) if v is not None}
    body: dict[str, Any] = {"name": name, "url": url, "sign_public_key": sign_key, "kem_public_key": kem_key,
                            "gateways": gateway, "networks": network, **({"min_levels": levels} if levels else {}),
                            **({"mlkem_public_key": mlkem_key} if mlkem_key else {})}
    with connect() as service:
        show(service.call("POST", "/v1/peers", json=body), output)


def _state(name: str, state: str, output: Output) -> None:
    with connect() as service:
        show(service.call("PATCH", f"/v1/peers/{name}", json={"state": state}), output)


@peers_app.command("suspend")
def peers_suspend(name: str, output: Output = None) -> None:
    """No new tunnels with this peer; running ones stay."""
    _state(name, "suspended", output)


@peers_app.command("resume")
def peers_resume(name: str, output: Output = None) -> None:
    """New tunnels with this peer again."""
    _state(name, "active", output)


@peers_app.command("revoke")
def peers_revoke(name: str, output: Output = None) -> None:
    """End the peering: every tunnel it carries ends, on both sides."""
    _state(name, "revoked", output)
