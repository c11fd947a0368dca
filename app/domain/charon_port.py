"""The charon port: what the services ask of one strongSwan charon (:class:`ViciPort`), the
commands they hand it as values (:data:`CharonCommand`, run in order on one connection by
:meth:`ViciPort.batch` or a :class:`CharonPipeline`), a charon by its socket path
(:data:`ViciFactory`), and charon's own reports of SAs coming up (:class:`UpReports`).

``app.adapters.vici`` has them on the VICI protocol; ``tests/fakes`` has them in memory.
A new command: its value here, its entry in ``app.adapters.vici.commands``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "CharonCommand",
    "CharonPipeline",
    "Initiate",
    "ListSas",
    "LoadCert",
    "LoadConn",
    "LoadKey",
    "LoadPool",
    "LoadShared",
    "Terminate",
    "Unload",
    "UpReports",
    "ViciFactory",
    "ViciPort",
]


@dataclass(frozen=True, slots=True)
class LoadShared:
    """``load-shared``: a secret for ``owners`` (never in a log, a repr or an error).

    ``type`` is ``IKE`` (a PSK for the identities in ``owners``) or ``PPK`` (an RFC 8784
    post-quantum preshared key; ``owners`` is its PPK id, which a conn names as ``ppk_id``;
    strongSwan >= 5.7).
    """

    name: str
    secret: bytes = field(repr=False)
    owners: tuple[str, ...]
    type: str = "IKE"


@dataclass(frozen=True, slots=True)
class LoadConn:
    """``load-conn``: load or replace conn ``name`` (swanctl.conf-style settings)."""

    name: str
    conn: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class LoadPool:
    """``load-pool``: load or replace virtual-IP pool ``name`` (a subnet or a range)."""

    name: str
    addrs: str


@dataclass(frozen=True, slots=True)
class Initiate:
    """``initiate`` a CHILD_SA (and its IKE_SA); a failure's reply carries charon's log lines."""

    child: str
    ike: str
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Terminate:
    """``terminate`` IKE_SA ``ike`` and wait at most ``timeout_ms`` for it to end (``force``: not
    for the peer's answer to the delete); nothing to terminate is a refusal (charon's "no
    matching SAs"). The defaults are every teardown's (a tunnel's, an agent session's at the
    client and at Target)."""

    ike: str
    timeout_ms: int = 3000
    force: bool = True


@dataclass(frozen=True, slots=True)
class ListSas:
    """``list-sas``: its reply is the IKE_SAs (the VICI adapter's ``IkeSa`` shape)."""

    ike: str | None = None


@dataclass(frozen=True, slots=True)
class Unload:
    """``unload-conn``, ``unload-pool`` or ``unload-shared`` (``what``: conn, pool or shared)."""

    what: str
    name: str


@dataclass(frozen=True, slots=True)
class LoadCert:
    """``load-cert``: an X.509 certificate (DER); ``ca``: a trust anchor."""

    data: bytes = field(repr=False)
    ca: bool = False


@dataclass(frozen=True, slots=True)
class LoadKey:
    """``load-key``: a private key (PKCS#8 DER; never in a log, a repr or an error)."""

    data: bytes = field(repr=False)
    type: str = "any"


CharonCommand = LoadShared | LoadConn | LoadPool | Initiate | Terminate | ListSas | Unload | LoadCert | LoadKey


class CharonPipeline(Protocol):
    """Commands written to one charon connection now, their replies read later (charon answers
    one connection's requests in order). Closing gives the connection back once every reply
    was read."""

    def send(self, commands: Sequence[CharonCommand]) -> None:
        """Write ``commands`` in one go without waiting (``GatewayUnreachable``: the socket failed)."""
        ...

    def finish(self) -> builtins.list[Any]:
        """Every reply so far, in the order sent: the reply (a :class:`ListSas`'s: its IKE_SAs), or
        the ``GatewayRejected`` charon's refusal makes of it."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> CharonPipeline: ...

    def __exit__(self, *exc: object) -> None: ...


class ViciPort(Protocol):
    """What the services ask of one strongSwan charon (``app.adapters.vici.ViciGateway`` has it).

    Failures are the domain's ``GatewayUnreachable`` (charon does not answer) and
    ``GatewayRejected`` (charon refused), both ``GatewayError``.
    """

    socket_path: str

    def version(self) -> Any:
        """``.daemon`` and ``.version``."""
        ...

    def stats(self) -> Any:
        """``.backend``: the IPsec back end (``kernel-netlink``, ``kernel-libipsec``)."""
        ...

    def get_algorithms(self) -> Any:
        """``.as_sections()``: charon's algorithms by section, as its ``get-algorithms`` lists them."""
        ...

    def load_shared(self, name: str, secret: bytes, /, owners: Sequence[str]) -> None: ...

    def unload_shared(self, name: str, /) -> None: ...

    def get_shared(self) -> builtins.list[str]: ...

    def load_conn(self, name: str, conn: Mapping[str, Any], /) -> None: ...

    def unload_conn(self, name: str, /) -> None: ...

    def list_conns(self) -> builtins.list[str]: ...

    def initiate(self, *, child: str, ike: str, timeout_ms: int = ...) -> Any: ...

    def terminate(self, *, ike: str | None = ..., ike_id: int | None = ..., child_id: int | None = ...,
                  timeout_ms: int = ..., force: bool = ...) -> Any: ...

    def list_sas(self, *, ike: str | None = ...) -> builtins.list[Any]:
        """The IKE_SAs (``app.adapters.vici.models.IkeSa`` shape: name, state, algorithms, children)."""
        ...

    def batch(self, commands: Sequence[CharonCommand]) -> builtins.list[Any]:
        """Run ``commands`` in order on one connection, pipelined: per command as
        :meth:`CharonPipeline.finish` gives it (the others still ran after a refusal)."""
        ...

    def pipeline(self) -> CharonPipeline:
        """Commands written now, their replies read later, on one connection."""
        ...


#: A charon by its VICI socket path.
ViciFactory = Callable[[str], ViciPort]


class UpReports(Protocol):
    """Charon's own reports of CHILD_SAs coming up (``app.adapters.vici.sa_events.SaEventHub``
    has it): what a set-up can read instead of asking ``list-sas``."""

    def expect(self, socket_path: str, ike: str, /) -> AbstractContextManager[Callable[[float], Any]]:
        """Enter before initiating conn ``ike``; the value is ``wait(timeout)``: the reported
        IKE_SA (``list_sas``'s shape) or None (no report in time: ask ``list-sas``)."""
        ...

    def detached(self, socket_path: str, /) -> bool:
        """Whether a set-up may ask this charon to initiate without waiting for the SAs (its
        reports then say when they are up)."""
        ...
