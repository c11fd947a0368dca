"""Gateways: the strongSwan charons qoss drives, registered with what they can do."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from app.domain.errors import Conflict, InvalidInput, NotFound
from app.domain.ports import UnitOfWork, ViciFactory
from app.domain.tunnels import Gateway, keywords_from_charon, parse_traffic_selectors
from app.services.inputs import GatewayIn

__all__ = [
    "delete_gateway",
    "forget_gateways",
    "get_gateway",
    "list_gateways",
    "refresh_gateway",
    "register_gateway",
]


def _check_socket(path: str, allowed: Sequence[Path]) -> None:
    resolved = Path(path)
    if ".." in resolved.parts or not any(resolved.is_relative_to(d) for d in allowed):
        raise InvalidInput(f"vici_socket must be under one of {[str(d) for d in allowed]}")


def _read_capabilities(gateway: Gateway, vici: ViciFactory) -> Gateway:
    v = vici(gateway.vici_socket)
    version = v.version()
    stats = v.stats()
    algorithms = keywords_from_charon(v.get_algorithms().as_sections())
    return Gateway(
        name=gateway.name,
        vici_socket=gateway.vici_socket,
        ike_address=gateway.ike_address,
        identity=gateway.identity,
        inside_networks=gateway.inside_networks,
        backend=stats.backend,
        version=f"{version.daemon} {version.version}",
        algorithms=algorithms,
    )


def register_gateway(
    *, uow: UnitOfWork, vici: ViciFactory, body: GatewayIn, allowed_socket_dirs: Sequence[Path],
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"),
) -> Gateway:
    """Register a charon: its back end and algorithms are read from it over VICI.

    Raises:
        InvalidInput: a bad address, network or socket path.
        GatewayUnreachable: charon does not answer on the socket (nothing is stored).
        AlreadyExists: a gateway of that name exists.
    """
    _check_socket(body.vici_socket, allowed_socket_dirs)
    try:
        address = str(ipaddress.ip_address(body.ike_address))
    except ValueError as exc:
        raise InvalidInput(f"ike_address {body.ike_address[:45]!r} is not an IP address") from exc
    ip = ipaddress.ip_address(address)
    if not any(ip in ipaddress.ip_network(net) for net in allowed_networks):
        raise InvalidInput(f"ike_address {address} is outside the allowed networks {list(allowed_networks)}")
    gateway = Gateway(
        name=body.name,
        vici_socket=body.vici_socket,
        ike_address=address,
        identity=body.identity or f"{body.name}.qoss",
        inside_networks=parse_traffic_selectors(body.inside_networks, "inside_networks"),
    )
    gateway = _read_capabilities(gateway, vici)
    uow.gateways.create(gateway)
    return gateway


def refresh_gateway(*, uow: UnitOfWork, vici: ViciFactory, name: str) -> Gateway:
    """Read a gateway's back end and algorithms again."""
    repo = uow.gateways
    gateway = _read_capabilities(repo.get(name), vici)
    repo.update(gateway)
    uow.events.append("gateway.refreshed", name, {"backend": gateway.backend, "version": gateway.version,
                                                  "algorithms": len(gateway.algorithms)}, scope="tunnels:read")
    return gateway


def list_gateways(*, uow: UnitOfWork) -> list[Gateway]:
    return uow.gateways.list()


def get_gateway(*, uow: UnitOfWork, name: str) -> Gateway:
    return uow.gateways.get(name)


def delete_gateway(*, uow: UnitOfWork, name: str) -> None:
    """Forget a gateway; refused while tunnels use it."""
    in_use = [t.id for t in uow.tunnels.list() if name in (t.initiator, t.responder)]
    if in_use:
        raise Conflict(f"gateway {name} carries tunnels {in_use[:10]}: delete them first")
    uow.gateways.delete(name)


def forget_gateways(*, uow: UnitOfWork, names: Sequence[str]) -> None:
    """Drop the records of these gateways and of every tunnel using one of them (a lab or a
    bench run that is gone); charon's own state is not touched. Unknown names are skipped."""
    repo = uow.tunnels
    for t in repo.list():
        if t.initiator in names or t.responder in names:
            repo.delete(t.id)
    for name in names:
        with contextlib.suppress(NotFound):
            uow.gateways.delete(name)
