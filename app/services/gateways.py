"""Gateways: the strongSwan charons qoss drives, registered with what they can do.

A registration (and a refresh) reads charon first, outside any write transaction, and writes
only once charon has answered: :func:`probe_gateway` reads, :func:`add_gateway` writes. The
socket named must be a socket really under one of the allowed directories (links resolved) and
answer ``version`` as a charon does; anything else is one and the same
:class:`~app.domain.errors.GatewayUnreachable`, so an answer tells nothing of what the path
holds (the precise cause goes to the log).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from app.domain.charon_port import ViciFactory
from app.domain.errors import Conflict, GatewayError, GatewayUnreachable, InvalidInput, NotFound
from app.domain.ports import UnitOfWork
from app.domain.requests import GatewaySpec
from app.domain.tunnels import Gateway, keywords_from_charon, parse_traffic_selectors

__all__ = [
    "NO_CHARON",
    "add_gateway",
    "delete_gateway",
    "forget_gateways",
    "get_gateway",
    "list_gateways",
    "probe_gateway",
    "read_gateway_again",
    "refresh_gateway",
    "register_gateway",
]

log = logging.getLogger("qoss.gateways")

#: What a client is told of a socket that is not a charon's, whatever the cause: missing, not a
#: socket, outside the allowed directories once its links are resolved, refused, reset, silent,
#: or answering something other than charon's ``version``.
NO_CHARON = "no charon answered on that socket"


class _NotACharon(Exception):
    """The precise reason a path is no charon's socket (logged, never answered)."""


def _check_path(path: str, allowed: Sequence[Path]) -> None:
    """The path as written must name a place under an allowed directory (nothing is looked at)."""
    written = Path(path)
    if ".." in written.parts or not any(written.is_relative_to(d) for d in allowed):
        raise InvalidInput(f"vici_socket must be under one of {[str(d) for d in allowed]}")


def _real_socket(path: str, allowed: Sequence[Path]) -> str:
    """The path with every link resolved, if that is a socket under an allowed directory (each
    resolved too: ``/var/run`` is often a link to ``/run``).

    Raises:
        _NotACharon: it is not.
    """
    real = os.path.realpath(path)
    if not any(Path(real).is_relative_to(os.path.realpath(d)) for d in allowed):
        raise _NotACharon(f"it resolves to {real}, outside the allowed directories")
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        raise _NotACharon(f"{real}: {exc.strerror or type(exc).__name__}") from exc
    if not stat.S_ISSOCK(mode):
        raise _NotACharon(f"{real} is not a socket")
    return real


def _read_capabilities(gateway: Gateway, vici: ViciFactory, socket_path: str) -> Gateway:
    """``gateway`` with what the charon on ``socket_path`` says it has.

    Raises:
        _NotACharon: no charon's answer (a socket error, a protocol error, a refusal, or a
            ``version`` reply without a daemon and a version).
    """
    try:
        v = vici(socket_path)
        version = v.version()
        if not (version.daemon.strip() and version.version.strip()):
            raise _NotACharon("its version reply names no daemon or no version")
        stats = v.stats()
        algorithms = keywords_from_charon(v.get_algorithms().as_sections(), version=version.version)
    except GatewayError as exc:
        raise _NotACharon(exc.message) from exc
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


def _probe(gateway: Gateway, vici: ViciFactory, shown: str, allowed: Sequence[Path]) -> Gateway:
    """Read ``gateway``'s charon; every failure is the one :data:`NO_CHARON` about ``shown``."""
    try:
        real = _real_socket(gateway.vici_socket, allowed)
        return _read_capabilities(gateway, vici, real)
    except _NotACharon as exc:
        log.warning("gateway %s: no charon on %s: %s", gateway.name, shown, exc)
        raise GatewayUnreachable(shown, NO_CHARON) from exc


def probe_gateway(
    *, vici: ViciFactory, body: GatewaySpec, allowed_socket_dirs: Sequence[Path],
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"),
) -> Gateway:
    """The gateway ``body`` describes, with its back end and algorithms read from its charon
    over VICI; nothing is stored (see :func:`add_gateway`). The socket is recorded by its real
    path (links resolved).

    Raises:
        InvalidInput: a bad address or network, or a socket path not under an allowed directory.
        GatewayUnreachable: no charon answered on the socket (:data:`NO_CHARON`, whatever the cause).
    """
    try:
        address = str(ipaddress.ip_address(body.ike_address))
    except ValueError as exc:
        raise InvalidInput(f"ike_address {body.ike_address[:45]!r} is not an IP address") from exc
    ip = ipaddress.ip_address(address)
    if not any(ip in ipaddress.ip_network(net) for net in allowed_networks):
        raise InvalidInput(f"ike_address {address} is outside the allowed networks {list(allowed_networks)}")
    _check_path(body.vici_socket, allowed_socket_dirs)
    gateway = Gateway(
        name=body.name,
        vici_socket=body.vici_socket,
        ike_address=address,
        identity=body.identity or f"{body.name}.qoss",
        inside_networks=parse_traffic_selectors(body.inside_networks, "inside_networks"),
    )
    read = _probe(gateway, vici, body.vici_socket, allowed_socket_dirs)
    return Gateway(name=read.name, vici_socket=os.path.realpath(body.vici_socket), ike_address=read.ike_address,
                   identity=read.identity, inside_networks=read.inside_networks, backend=read.backend,
                   version=read.version, algorithms=read.algorithms)


def add_gateway(*, uow: UnitOfWork, gateway: Gateway) -> Gateway:
    """Store a gateway :func:`probe_gateway` read, with its ``gateway.registered`` event.

    Raises:
        AlreadyExists: a gateway of that name exists.
    """
    uow.gateways.create(gateway)
    uow.events.append("gateway.registered", gateway.name, {"backend": gateway.backend, "version": gateway.version,
                                                           "algorithms": len(gateway.algorithms)},
                      scope="tunnels:read")
    return gateway


def register_gateway(
    *, uow: UnitOfWork, vici: ViciFactory, body: GatewaySpec, allowed_socket_dirs: Sequence[Path],
    allowed_networks: Sequence[str] = ("0.0.0.0/0", "::/0"),
) -> Gateway:
    """:func:`probe_gateway` and :func:`add_gateway` in one unit of work (the command line's way;
    the API reads charon before it takes a write transaction).

    Raises:
        InvalidInput, GatewayUnreachable: as :func:`probe_gateway` (nothing is stored).
        AlreadyExists: a gateway of that name exists.
    """
    return add_gateway(uow=uow, gateway=probe_gateway(vici=vici, body=body, allowed_socket_dirs=allowed_socket_dirs,
                                                      allowed_networks=allowed_networks))


def read_gateway_again(*, vici: ViciFactory, gateway: Gateway, allowed_socket_dirs: Sequence[Path]) -> Gateway:
    """``gateway`` with its back end and algorithms read from its charon again; nothing is stored
    (see :func:`refresh_gateway`).

    Raises:
        GatewayUnreachable: no charon answered on its socket (:data:`NO_CHARON`).
    """
    return _probe(gateway, vici, gateway.vici_socket, allowed_socket_dirs)


def refresh_gateway(*, uow: UnitOfWork, gateway: Gateway) -> Gateway:
    """Store what :func:`read_gateway_again` read, with its ``gateway.refreshed`` event.

    Raises:
        NotFound: the gateway was deleted meanwhile.
    """
    uow.gateways.update(gateway)
    uow.events.append("gateway.refreshed", gateway.name, {"backend": gateway.backend, "version": gateway.version,
                                                          "algorithms": len(gateway.algorithms)},
                      scope="tunnels:read")
    return gateway


def list_gateways(*, uow: UnitOfWork) -> list[Gateway]:
    return uow.gateways.list()


def get_gateway(*, uow: UnitOfWork, name: str) -> Gateway:
    return uow.gateways.get(name)


def delete_gateway(*, uow: UnitOfWork, name: str) -> None:
    """Forget a gateway, with its ``gateway.deleted`` event; refused while tunnels use it."""
    in_use = [t.id for t in uow.tunnels.list() if name in (t.initiator, t.responder)]
    if in_use:
        raise Conflict(f"gateway {name} carries tunnels {in_use[:10]}: delete them first")
    uow.gateways.delete(name)
    uow.events.append("gateway.deleted", name, {}, scope="tunnels:read")


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
