"""VICI commands on the wire, and the one entry per command that turns the charon port's values
(:data:`app.domain.charon_port.CharonCommand`) into them and reads their replies
(:data:`ENTRIES`): what :meth:`~app.adapters.vici.gateway.ViciGateway.batch` and
:meth:`~app.adapters.vici.gateway.ViciGateway.pipeline` send.

A new VICI command for the services: its value in ``app/domain/charon_port.py``, its entry here
(name and message, reply parser), and a handler in the wire fake (``tests/fakes/fake_charon.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from app.adapters.vici.models import (
    IkeSa,
    parse_ike_sa,
)
from app.domain.charon_port import (
    CharonCommand,
    Initiate,
    ListSas,
    LoadCert,
    LoadConn,
    LoadKey,
    LoadPool,
    LoadShared,
    Terminate,
    Unload,
)

__all__ = [
    "ENTRIES",
    "Command",
    "Entry",
    "initiate_command",
    "list_sas_command",
    "load_cert_command",
    "load_conn_command",
    "load_key_command",
    "load_pool_command",
    "load_shared_command",
    "sas_of",
    "terminate_command",
    "to_wire",
    "unload_command",
]


_CMD_UNKNOWN = 2  # vici Packet.CMD_UNKNOWN
#: Commands charon may safely receive twice (read-only, or load-and-replace): only these are
#: sent again, on a new connection, when a reused connection fails with a socket error.
_REPEATABLE = frozenset({
    "version", "stats", "get-algorithms", "get-shared", "get-pools", "list-sas", "list-conns",
    "load-conn", "load-shared", "load-pool", "load-cert", "load-key",
})


class Command(NamedTuple):
    """One VICI command for :meth:`ViciGateway.batch` (built by the ``*_command`` functions)."""

    name: str
    message: Mapping[str, Any] | None = None
    #: Values that must never appear in a log line or an exception (a PSK).
    secrets: tuple[str, ...] = ()
    #: A streamed command's event (``control-log``, ``list-sa`` ...): registered just before the
    #: command and unregistered just after it, in the same write. Its decoded reply carries the
    #: events it streamed, decoded, under ``"events"``.
    stream: str | None = None
    #: Seconds charon may take on top of the gateway's timeout before it replies
    #: (``initiate``'s own timeout).
    wait: float = 0.0


def load_conn_command(name: str, conn: Mapping[str, Any]) -> Command:
    """``load-conn``: load or replace connection ``name`` with swanctl.conf-style settings."""
    return Command("load-conn", {name: dict(conn)})


def load_shared_command(id: str, secret: bytes | str, owners: Sequence[str], type: str = "IKE") -> Command:
    """``load-shared`` with a unique ``id``; the secret is kept out of every log and exception."""
    data = secret if isinstance(secret, bytes) else secret.encode("utf-8")
    hidden = [data.decode("utf-8", errors="replace")]
    if isinstance(secret, str):
        hidden.append(secret)
    return Command("load-shared", {"id": id, "type": type, "data": data, "owners": list(owners)}, tuple(hidden))


def load_pool_command(name: str, addrs: str, attributes: Mapping[str, Sequence[str]] | None = None) -> Command:
    """``load-pool``: load or replace virtual IP pool ``name`` (a subnet or a range)."""
    pool: dict[str, Any] = {"addrs": addrs}
    for key, values in (attributes or {}).items():
        pool[key] = list(values)
    return Command("load-pool", {name: pool})


def load_cert_command(data: bytes, *, ca: bool = False) -> Command:
    """``load-cert``: an X.509 certificate (DER or PEM); ``ca`` marks it a trust anchor."""
    return Command("load-cert", {"type": "X509", "flag": "CA" if ca else "NONE", "data": bytes(data)})


def load_key_command(data: bytes, type: str = "any") -> Command:
    """``load-key``: a private key (DER or PEM); its bytes are kept out of every log and exception."""
    if type not in ("any", "rsa", "ecdsa", "ed25519", "ed448"):
        raise ValueError(f"no private key type {type!r}")
    return Command("load-key", {"type": type, "data": bytes(data)}, (bytes(data).decode("latin-1"),))


def _initiate_message(child: str | None, ike: str | None, timeout_ms: int, loglevel: int) -> dict[str, Any]:
    message: dict[str, Any] = {"timeout": timeout_ms, "loglevel": loglevel, "init-limits": "no"}
    if child is not None:
        message["child"] = child
    if ike is not None:
        message["ike"] = ike
    return message


def initiate_command(child: str | None = None, ike: str | None = None, timeout_ms: int = 10_000,
                     loglevel: int = 1) -> Command:
    """``initiate`` (streamed): see :meth:`ViciGateway.initiate`. In a batch, a failure is a
    :class:`GatewayRejected` with charon's log lines that say why, as ``initiate`` gives."""
    return Command("initiate", _initiate_message(child, ike, timeout_ms, loglevel), stream="control-log",
                   wait=max(timeout_ms, 0) / 1000.0)


def _terminate_message(*, ike: str | None = None, child: str | None = None, ike_id: int | None = None,
                      child_id: int | None = None, timeout_ms: int = 5_000, force: bool = False,
                      loglevel: int = 1) -> dict[str, Any]:
    """``terminate``'s message (see :meth:`ViciGateway.terminate`).

    Raises:
        ValueError: no selector named.
    """
    message: dict[str, Any] = {"timeout": timeout_ms, "loglevel": loglevel}
    for key, value in (("ike", ike), ("child", child), ("ike-id", ike_id), ("child-id", child_id)):
        if value is not None:
            message[key] = value
    if len(message) == 2:
        raise ValueError("terminate needs ike, child, ike_id or child_id")
    if force:
        message["force"] = "yes"
    return message


def terminate_command(ike: str, timeout_ms: int = 3000, *, force: bool = True) -> Command:
    """``terminate`` IKE_SA ``ike`` (streamed): in a batch or a pipeline, nothing to terminate is a
    :class:`GatewayRejected` (charon's "no matching SAs"), as :meth:`ViciGateway.terminate` gives."""
    return Command("terminate", _terminate_message(ike=ike, timeout_ms=timeout_ms, force=force),
                   stream="control-log", wait=max(timeout_ms, 0) / 1000.0)


def _list_sas_message(ike: str | None, ike_id: int | None) -> dict[str, Any]:
    # Not ``noblock``: an IKE_SA a worker holds would be read half-updated (a CHILD_SA
    # just reported established may be missing); charon waits for it instead.
    message: dict[str, Any] = {}
    if ike is not None:
        message["ike"] = ike
    if ike_id is not None:
        message["ike-id"] = ike_id
    return message


def list_sas_command(ike: str | None = None, ike_id: int | None = None) -> Command:
    """``list-sas`` (streamed): read the IKE_SAs from its reply's ``events`` with :func:`sas_of`."""
    return Command("list-sas", _list_sas_message(ike, ike_id), stream="list-sa")


def sas_of(events: Sequence[Mapping[str, Any]]) -> list[IkeSa]:
    """The IKE_SAs in decoded ``list-sa`` events."""
    return [parse_ike_sa(name, body) for event in events for name, body in event.items() if isinstance(body, Mapping)]


def unload_command(what: str, name: str) -> Command:
    """``unload-conn``/``unload-pool`` (by name) or ``unload-shared`` (by id)."""
    if what not in ("conn", "pool", "shared"):
        raise ValueError(f"nothing to unload called {what!r}")
    return Command(f"unload-{what}", {"id" if what == "shared" else "name": name})


class Entry(NamedTuple):
    """One command of the charon port: its wire form, and what its decoded reply means."""

    command: Callable[[Any], Command]
    reply: Callable[[dict[str, Any]], Any] = lambda reply: reply


#: The charon port's commands (:data:`app.domain.charon_port.CharonCommand`), one entry each.
ENTRIES: dict[type, Entry] = {
    LoadShared: Entry(lambda c: load_shared_command(c.name, c.secret, c.owners, c.type)),
    LoadConn: Entry(lambda c: load_conn_command(c.name, c.conn)),
    LoadPool: Entry(lambda c: load_pool_command(c.name, c.addrs)),
    Initiate: Entry(lambda c: initiate_command(child=c.child, ike=c.ike, timeout_ms=c.timeout_ms)),
    Terminate: Entry(lambda c: terminate_command(c.ike, c.timeout_ms, force=c.force)),
    ListSas: Entry(lambda c: list_sas_command(ike=c.ike), lambda reply: sas_of(reply["events"])),
    Unload: Entry(lambda c: unload_command(c.what, c.name)),
    LoadCert: Entry(lambda c: load_cert_command(c.data, ca=c.ca)),
    LoadKey: Entry(lambda c: load_key_command(c.data, c.type)),
}


def to_wire(commands: Sequence[CharonCommand]) -> list[Command]:
    """The wire form of the charon port's commands."""
    return [ENTRIES[type(c)].command(c) for c in commands]

