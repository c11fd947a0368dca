"""A bench lab: two lab hosts registered as gateways in a migrated database, and the tunnels of
a measurement opened and closed through the tunnel service (``qoss bench tunnel``, the
benchmarks). Everything it started is stopped on exit, also on failure or SIGTERM.

With ``families`` including 6 the lab's hosts also get their IPv6 addresses and the two
charons are registered a second time, as an IPv6 pair of gateways (``...-left6``,
``...-right6``): IKE address ``fd00:71::1`` / ``::2``, inside network ``fd01::/64`` /
``fd02::/64``. A tunnel between that pair runs IKE and ESP over IPv6 and carries the IPv6
inside addresses (``fd01::1`` to ``fd02::1``); the IPv4 pair is registered as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from app.adapters.db.unit_of_work import SqlUnitOfWork
    from app.adapters.vici.gateway import ViciGateway
    from app.domain.policies import Levels
    from app.domain.requests import TunnelSpec
    from app.domain.tunnels import Gateway
    from app.lab.hosts import Lab, LabHost
    from app.measure.adapters.tunnel import OpenTunnel, Route
    from app.measure.domain.tunnel import SuiteSpec
    from app.settings import Settings

__all__ = ["BenchLab", "ServiceTunnels", "bench_lab", "read_micro_prior", "unit_of_work"]


@dataclass
class ServiceTunnels:
    """Opens and closes pinned tunnels through the tunnel service, one transaction each.

    Args:
        sessions: the database's session factory.
        settings: for the default table and the VICI timeout.
        initiator: gateway name of the initiating side.
        responder: gateway name of the responding side.
        candidates: the ESP transforms a pin forbids all but the suite's of.
        rating_table: the negotiating table (None: the default table).
        min_levels: minimums the tunnel request states (pinning still applies).
    """

    sessions: sessionmaker[Session]
    settings: Settings
    initiator: str
    responder: str
    candidates: Sequence[str]
    rating_table: str | None = None
    min_levels: Levels | None = None

    def _vici(self, path: str) -> ViciGateway:
        from app.adapters.vici.gateway import ViciGateway

        return ViciGateway(path, self.settings.vici_timeout)

    def create(self, request: TunnelSpec) -> OpenTunnel:
        """Create a tunnel through the service (one committed transaction)."""
        from app.measure.adapters.tunnel import OpenTunnel
        from app.measure.domain.tunnel import SuiteSpec
        from app.services import tunnels

        with unit_of_work(self.sessions) as uow:
            record = tunnels.create_tunnel(uow=uow, vici=self._vici, request=request,
                                           default_table=self.settings.default_table)
        suite = record.negotiation["suite"]
        esp = SuiteSpec(suite["encryption"], None if suite.get("aead") else suite["integrity"]).name
        return OpenTunnel(id=record.id, conn=record.conn, esp=esp, ike=str(record.negotiation["proposals"]["ike"]))

    def request(self, *, forbids: Sequence[str] = (), objective_id: int | None = None) -> TunnelSpec:
        from app.domain.requests import TunnelSpec

        return TunnelSpec(initiator=self.initiator, responder=self.responder, forbids=tuple(forbids),
                          objective_id=objective_id, rating_table=self.rating_table, min_levels=self.min_levels)

    def choose(self) -> OpenTunnel:
        """The tunnel the service brings up for the minimums alone (no pin)."""
        return self.create(self.request())

    def open(self, suite: SuiteSpec) -> OpenTunnel:
        """Bring up a tunnel of exactly ``suite``, trying :func:`pin_attempts` in order.

        Raises:
            BenchError: no attempt made the service choose ``suite`` (the last reason is given).
        """
        from app.domain.errors import NoFeasibleSuite, UnsupportedProtection
        from app.measure.adapters.traffic import BenchError
        from app.measure.domain.tunnel import pin_attempts

        last = "no attempt"
        for pin in pin_attempts(suite, self.candidates):
            try:
                tunnel = self.create(self.request(forbids=pin.forbids, objective_id=pin.objective_id))
            except (NoFeasibleSuite, UnsupportedProtection) as exc:
                last = exc.message
                continue
            if tunnel.esp == suite.name:
                return tunnel
            last = f"the service chose {tunnel.esp}"
            self.close(tunnel)
        raise BenchError(f"the tunnel service cannot be made to choose {suite.name}: {last}")

    def feasible(self, suite: SuiteSpec) -> bool:
        """Whether the service can bring up ``suite`` under the minimums (it is taken down again)."""
        from app.measure.adapters.traffic import BenchError

        try:
            tunnel = self.open(suite)
        except BenchError:
            return False
        self.close(tunnel)
        return True

    def close(self, tunnel: OpenTunnel) -> None:
        from app.services import tunnels

        with unit_of_work(self.sessions) as uow:
            tunnels.delete_tunnel(uow=uow, vici=self._vici, tunnel_id=tunnel.id)


@dataclass
class BenchLab:
    """A running bench lab: two hosts registered as gateways in a migrated database (and as an
    IPv6 pair, ``gateways6``, when the lab has IPv6)."""

    lab: Lab
    initiator: LabHost
    responder: LabHost
    gateways: tuple[Gateway, Gateway]
    settings: Settings
    sessions: sessionmaker[Session]
    gateways6: tuple[Gateway, Gateway] | None = None

    @property
    def backend(self) -> str:
        return self.gateways[0].backend or "unknown"

    def candidates(self, rating_table: str | None = None) -> list[str]:
        """ESP transforms both gateways support, the back end can use and the table rates."""
        from app.measure.domain.tunnel import esp_candidates
        from app.services.ratings import get_table

        supported = set(self.gateways[0].algorithms) & set(self.gateways[1].algorithms)
        with unit_of_work(self.sessions) as uow:
            table = get_table(uow=uow, name=rating_table or self.settings.default_table)
        rated = [k for k, r in table.ratings.items() if r.performance > 0]
        return esp_candidates(supported, libipsec=self.backend == "kernel-libipsec", rated=rated)

    def tunnels(self, candidates: Sequence[str], *, rating_table: str | None = None,
                min_levels: Levels | None = None, family: int = 4) -> ServiceTunnels:
        """Tunnels between the IPv4 pair of gateways, or with ``family`` 6 the IPv6 pair.

        Raises:
            ValueError: family 6 in a lab without IPv6.
        """
        pair = self.gateways
        if family == 6:
            if self.gateways6 is None:
                raise ValueError("this bench lab has no IPv6: bench_lab(families=(4, 6))")
            pair = self.gateways6
        return ServiceTunnels(self.sessions, self.settings, pair[0].name, pair[1].name, candidates, rating_table,
                              min_levels)

    def routes(self, candidates: Sequence[str], families: Sequence[int]) -> list[Route]:
        """One :class:`~app.measure.adapters.tunnel.Route` per family, in order: its tunnels and addresses.

        Raises:
            ValueError: family 6 in a lab without IPv6.
        """
        from app.measure.adapters.tunnel import Route

        out = []
        for family in families:
            opener = self.tunnels(candidates, family=family)
            left, right = self.initiator, self.responder
            if family == 6:
                if None in (left.ike_address6, right.ike_address6, left.inside_address6, right.inside_address6):
                    raise ValueError("this bench lab has no IPv6 addresses")
                out.append(Route(6, opener, (str(left.ike_address6), str(right.ike_address6)),
                                 (str(left.inside_address6), str(right.inside_address6))))
            else:
                out.append(Route(4, opener, (left.ike_address, right.ike_address),
                                 (left.inside_address, right.inside_address)))
        return out


@contextlib.contextmanager
def bench_lab(database_url: str | None = None, prefix_hint: str = "qbt",
              families: Sequence[int] = (4,)) -> Iterator[BenchLab]:
    """A lab under a unique prefix and a database; everything is torn down on exit.

    ``families``: with 6 among them the hosts get their IPv6 addresses too and are also
    registered as the IPv6 pair of gateways (see the module doc).
    """
    from app.adapters.db.engine import make_session_factory
    from app.bootstrap import charons, engine_for, prepare_database
    from app.domain.requests import GatewaySpec
    from app.lab.hosts import Lab
    from app.services import gateways
    from app.settings import Settings

    previous = _exit_on_sigterm()
    state = Path(tempfile.mkdtemp(prefix="qoss-bt-", dir="/tmp"))  # short: UNIX socket paths
    tag = uuid.uuid4().hex[:4]
    ipv6 = 6 in families
    lab = Lab(state / "lab", prefix=f"{prefix_hint}{os.getpid() % 10000}-{tag}", families=(4, 6) if ipv6 else (4,))
    settings = Settings(database_url=database_url or f"sqlite:///{state}/qoss.db", reconcile_on_start=False)
    engine = None
    names: list[str] = []
    try:
        prepare_database(settings)
        engine = engine_for(settings)
        sessions = make_session_factory(engine)
        lab.up()
        left, right = lab.host("left"), lab.host("right")
        registered = []
        bodies = [GatewaySpec(name=f"bt{tag}-{host.name}", vici_socket=host.vici_socket,
                              ike_address=host.ike_address, inside_networks=(f"{host.inside_address}/32",))
                  for host in (left, right)]
        if ipv6:
            bodies += [GatewaySpec(name=f"bt{tag}-{host.name}6", vici_socket=host.vici_socket,
                                   ike_address=str(host.ike_address6), inside_networks=(str(host.inside_network6),))
                       for host in (left, right)]
        for body in bodies:
            with unit_of_work(sessions) as uow:
                registered.append(gateways.register_gateway(
                    uow=uow, vici=charons(settings), body=body,
                    allowed_socket_dirs=[lab.state_dir]))
            names.append(body.name)
        yield BenchLab(lab, left, right, (registered[0], registered[1]), settings, sessions,
                       (registered[2], registered[3]) if ipv6 else None)
    finally:
        try:
            if engine is not None and database_url:
                _forget(make_session_factory(engine), names)
        finally:
            if engine is not None:
                engine.dispose()
            lab.down()
            shutil.rmtree(state, ignore_errors=True)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm() -> Any:
    """Make SIGTERM (e.g. from ``timeout``) unwind like Ctrl-C, so the lab is torn down.

    Returns the previous handler, or None where handlers cannot be set (not the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


@contextlib.contextmanager
def unit_of_work(sessions: Callable[[], Session]) -> Iterator[SqlUnitOfWork]:
    """A unit of work on a fresh session, committed when the block ends without an error."""
    from app.adapters.db.unit_of_work import SqlUnitOfWork

    with SqlUnitOfWork(sessions(), owned=True) as uow:
        yield uow
        uow.commit()


def _forget(sessions: sessionmaker[Session], names: Sequence[str]) -> None:
    """Remove the bench's tunnel records and gateways from a database that outlives the run."""
    from app.services import gateways


    with unit_of_work(sessions) as uow:
        gateways.forget_gateways(uow=uow, names=names)


def read_micro_prior(path: Path, machine: str) -> dict[str, float]:
    """Per-transform ns/byte at 1400 B from a ``qoss bench micro --out`` document measured on ``machine``.

    Raises:
        ValueError: unreadable, not such a document, from another machine, or without data-plane figures.
    """
    from app.adapters.files import read_document
    from app.measure.domain.tunnel import micro_prior

    try:
        doc = json.loads(read_document(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {type(exc).__name__}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "qoss-bench-micro" or not isinstance(doc.get("results"), list):
        raise ValueError(f"{path} is not a `qoss bench micro --out` document")
    if doc.get("machine") != machine:
        raise ValueError(f"{path} was measured on {str(doc.get('machine'))[:80]!r}, this is {machine!r}")
    prior = micro_prior(r for r in doc["results"] if isinstance(r, dict) and "algorithm" in r)
    if not prior:
        raise ValueError(f"{path} has no per-byte figures")
    return prior


