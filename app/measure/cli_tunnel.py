"""``qoss bench tunnel``: throughput, RTT and parallel flows through real lab tunnels.

The command builds its own lab (two charons with kernel-libipsec in network namespaces
under a unique prefix) and its own SQLite database in a temporary directory (or uses
``--database-url``), registers the two charons as gateways through the gateway service,
and brings each suite's tunnel up and down through the tunnel service
(:func:`app.services.tunnels.create_tunnel` / ``delete_tunnel``), pinned to the suite by
the request's ``forbids`` (see :mod:`app.measure.domain.tunnel`). Everything it started is
stopped on exit, also on failure or Ctrl-C. ``--cpus`` pins both charons (every thread),
iperf3 and ping to a CPU set for the run (:func:`app.measure.adapters.tunnel.run_bench`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.domain.errors import QossError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from app.adapters.db.unit_of_work import SqlUnitOfWork
    from app.adapters.lab import Lab, LabHost
    from app.adapters.vici.driver import ViciGateway
    from app.domain.tunnels import Gateway
    from app.measure.adapters.tunnel import OpenTunnel
    from app.measure.domain.tunnel import SuiteRun, SuiteSpec
    from app.services.inputs import MinLevelsIn, TunnelIn
    from app.settings import Settings

# Everything heavier than typer is imported where it is used, so that loading the
# ``qoss`` command line (which registers this command) stays cheap.

__all__ = ["BenchLab", "ServiceTunnels", "bench_lab", "bench_tunnel"]


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
    min_levels: MinLevelsIn | None = None

    def __post_init__(self) -> None:
        from app.services.ratings import TableCache

        self.cache = TableCache()

    def _vici(self, path: str) -> ViciGateway:
        from app.adapters.vici.driver import ViciGateway

        return ViciGateway(path, self.settings.vici_timeout)

    def create(self, request: TunnelIn) -> OpenTunnel:
        """Create a tunnel through the service (one committed transaction)."""
        from app.measure.adapters.tunnel import OpenTunnel
        from app.measure.domain.tunnel import SuiteSpec
        from app.services import tunnels

        with _unit(self.sessions) as uow:
            record = tunnels.create_tunnel(uow=uow, cache=self.cache, vici=self._vici, request=request,
                                           default_table=self.settings.default_table)
        suite = record.negotiation["suite"]
        esp = SuiteSpec(suite["encryption"], None if suite.get("aead") else suite["integrity"]).name
        return OpenTunnel(id=record.id, conn=record.conn, esp=esp, ike=str(record.negotiation["proposals"]["ike"]))

    def request(self, *, forbids: Sequence[str] = (), objective_id: int | None = None) -> TunnelIn:
        from app.services.inputs import TunnelIn

        return TunnelIn(initiator=self.initiator, responder=self.responder, forbids=list(forbids),
                                objective_id=objective_id, rating_table=self.rating_table,
                                min_levels=self.min_levels)

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

        with _unit(self.sessions) as uow:
            tunnels.delete_tunnel(uow=uow, vici=self._vici, tunnel_id=tunnel.id)


@dataclass
class BenchLab:
    """A running bench lab: two hosts registered as gateways in a migrated database."""

    lab: Lab
    initiator: LabHost
    responder: LabHost
    gateways: tuple[Gateway, Gateway]
    settings: Settings
    sessions: sessionmaker[Session]

    @property
    def backend(self) -> str:
        return self.gateways[0].backend or "unknown"

    def candidates(self, rating_table: str | None = None) -> list[str]:
        """ESP transforms both gateways support, the back end can use and the table rates."""
        from app.measure.domain.tunnel import esp_candidates
        from app.services.ratings import get_table

        supported = set(self.gateways[0].algorithms) & set(self.gateways[1].algorithms)
        with _unit(self.sessions) as uow:
            table = get_table(uow=uow, name=rating_table or self.settings.default_table)
        rated = [k for k, r in table.ratings.items() if r.performance > 0]
        return esp_candidates(supported, libipsec=self.backend == "kernel-libipsec", rated=rated)

    def tunnels(self, candidates: Sequence[str], *, rating_table: str | None = None,
                min_levels: MinLevelsIn | None = None) -> ServiceTunnels:
        return ServiceTunnels(self.sessions, self.settings, self.gateways[0].name, self.gateways[1].name,
                              candidates, rating_table, min_levels)


@contextlib.contextmanager
def bench_lab(database_url: str | None = None, prefix_hint: str = "qbt") -> Iterator[BenchLab]:
    """A lab under a unique prefix and a database; everything is torn down on exit."""
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.adapters.lab import Lab
    from app.adapters.vici.driver import ViciGateway
    from app.bootstrap import prepare_database
    from app.services import gateways
    from app.services.inputs import GatewayIn
    from app.settings import Settings

    previous = _exit_on_sigterm()
    state = Path(tempfile.mkdtemp(prefix="qoss-bt-", dir="/tmp"))  # short: UNIX socket paths
    tag = uuid.uuid4().hex[:4]
    lab = Lab(state / "lab", prefix=f"{prefix_hint}{os.getpid() % 10000}-{tag}")
    settings = Settings(database_url=database_url or f"sqlite:///{state}/qoss.db", reconcile_on_start=False)
    engine = None
    names: list[str] = []
    try:
        prepare_database(settings)
        engine = make_engine(settings.database_url, fast_paths=settings.fast_paths)
        sessions = make_session_factory(engine)
        lab.up()
        left, right = lab.host("left"), lab.host("right")
        registered = []
        for host in (left, right):
            body = GatewayIn(name=f"bt{tag}-{host.name}", vici_socket=host.vici_socket,
                                     ike_address=host.ike_address, inside_networks=[f"{host.inside_address}/32"])
            with _unit(sessions) as uow:
                registered.append(gateways.register_gateway(
                    uow=uow, vici=lambda p: ViciGateway(p, settings.vici_timeout), body=body,
                    allowed_socket_dirs=[lab.state_dir]))
            names.append(body.name)
        yield BenchLab(lab, left, right, (registered[0], registered[1]), settings, sessions)
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
def _unit(sessions: Callable[[], Session]) -> Iterator[SqlUnitOfWork]:
    """A unit of work on a fresh session, committed when the block ends without an error."""
    from app.adapters.db.unit_of_work import SqlUnitOfWork

    with SqlUnitOfWork(sessions(), owned=True) as uow:
        yield uow
        uow.commit()


def _forget(sessions: sessionmaker[Session], names: Sequence[str]) -> None:
    """Remove the bench's tunnel records and gateways from a database that outlives the run."""
    from app.services import gateways


    with _unit(sessions) as uow:
        gateways.forget_gateways(uow=uow, names=names)


def _fmt(stat: dict[str, Any] | None, digits: int = 0) -> str:
    if not stat:
        return "-"
    return f"{stat['median']:.{digits}f} ±{stat['spread'] * 100:.0f}%"


def _summary(document: dict[str, Any]) -> str:
    base = document["baseline"]
    base_mbps = (base.get("throughput_mbps") or {}).get("median") or 0.0
    lines = [f"{'suite':<24} {'Mbit/s':>13} {'x base':>6} {'2 flows':>13} {'4 flows':>13} "
             f"{'RTT 64 B ms':>15} {'RTT 1400 B ms':>15}"]
    for row in [{"esp": "(no IPsec)", **base}, *document["suites"]]:
        mbps = row.get("throughput_mbps")
        ratio = f"{mbps['median'] / base_mbps:.2f}" if mbps and base_mbps else "-"
        rtt, par = row.get("rtt_ms", {}), row.get("parallel_mbps", {})
        lines.append(f"{row['esp']:<24} {_fmt(mbps):>13} {ratio:>6} {_fmt(par.get('2')):>13} "
                     f"{_fmt(par.get('4')):>13} {_fmt(rtt.get('64'), 3):>15} {_fmt(rtt.get('1400'), 3):>15}")
    return "\n".join(lines)


def read_micro_prior(path: Path, machine: str) -> dict[str, float]:
    """Per-transform ns/byte at 1400 B from a ``qoss bench micro --out`` document measured on ``machine``.

    Raises:
        ValueError: unreadable, not such a document, from another machine, or without data-plane figures.
    """
    from app.measure.domain.tunnel import micro_prior

    try:
        doc = json.loads(path.read_text())
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


def _write_table(*, runs: Sequence[SuiteRun], name: str, base: str, machine: str, backend: str, date: str,
                 database_url: str | None, prior: Mapping[str, float] | None = None) -> dict[str, Any]:
    from app.adapters.db.engine import make_engine, make_session_factory
    from app.adapters.files import dump_rating_table_yaml
    from app.bootstrap import prepare_database
    from app.measure.domain.tunnel import tunnel_table
    from app.services.ratings import get_table, import_table
    from app.settings import Settings

    settings = Settings(database_url=database_url) if database_url else Settings()
    prepare_database(settings)
    engine = make_engine(settings.database_url, fast_paths=settings.fast_paths)
    try:
        with _unit(make_session_factory(engine)) as uow:
            table = tunnel_table(name=name, base=get_table(uow=uow, name=base), runs=runs,
                                 machine=machine, backend=backend, date=date, prior=prior)
            text = dump_rating_table_yaml(table)
            target = Path("var/bench")
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{table.name}.yaml").write_text(text)
            existing = None
            with contextlib.suppress(QossError):
                existing = get_table(uow=uow, name=name).revision
            imported = import_table(uow=uow, table=table, fmt="yaml", author="qoss bench",
                                    expected_revision=existing)
    finally:
        engine.dispose()
    return {"table": imported.name, "revision": imported.revision, "ratings": len(imported.ratings),
            "file": str(target / f"{table.name}.yaml"), "database": settings.database_url.split("@")[-1]}


def bench_tunnel(
    suites: Annotated[str | None, typer.Option(help="comma-separated ESP suites, e.g. aes128gcm16,aes128-sha256 "
                                               "(default: every transform both gateways can use, see docs)")] = None,
    repetitions: Annotated[int, typer.Option(min=1, max=20, help="repetitions, interleaved over the suites")] = 3,
    duration: Annotated[int, typer.Option(min=1, max=30, help="seconds per iperf3 run (whole seconds)")] = 2,
    ping_count: Annotated[int, typer.Option(min=1, max=200, help="echoes per RTT sample")] = 20,
    out: Annotated[Path | None, typer.Option(help="write the JSON document here")] = None,
    write_table: Annotated[str | None, typer.Option(help="write and import a rating table of this name")] = None,
    base: Annotated[str, typer.Option(help="table whose security levels the measured table keeps")] =
        "standards-2026",
    database_url: Annotated[str | None, typer.Option("--database-url", help="run in this database (default: a "
                                                     "throw-away SQLite); --write-table imports here too "
                                                     "(default: QOSS_DATABASE_URL)")] = None,
    cpus: Annotated[str | None, typer.Option(help="pin both charons (all threads), iperf3 and ping to these CPUs "
                                             "for the run, e.g. 1 or 0,1: steadier throughput on a small "
                                             "shared machine (default: not pinned)")] = None,
    micro: Annotated[Path | None, typer.Option(help="with --write-table: JSON of `qoss bench micro --out` from "
                                               "this machine; suites tied within the noise of the tunnel "
                                               "samples are then ordered by their crypto cost")] = None,
) -> None:
    """iperf3 and ping through real ESP tunnels (one per suite) and without IPsec, in a fresh lab (root).

    Per suite and repetition: TCP Mbit/s with 1, 2 and 4 flows, mean RTT by ICMP payload
    size (64-1400 B). Reported as median and spread = (max - min) / median. With --cpus the
    charons and iperf3 share the given CPUs, so throughput reflects each suite's CPU cost
    rather than where the scheduler put them; the document records the set.
    """
    from app.measure.adapters.micro import machine_id
    from app.measure.adapters.pinning import parse_cpus
    from app.measure.adapters.traffic import BenchError
    from app.measure.adapters.tunnel import run_bench
    from app.measure.domain.report import pinning
    from app.measure.domain.tunnel import bench_document, default_suites, parse_suite

    try:
        specs = [parse_suite(s) for s in suites.split(",") if s.strip()] if suites else None
    except QossError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(2) from exc
    try:
        cpu_set = parse_cpus(cpus) if cpus is not None else None
    except ValueError as exc:
        typer.echo(f"--cpus: {exc}", err=True)
        raise typer.Exit(2) from exc
    if micro is not None and write_table is None:
        typer.echo("--micro orders the suites of the table --write-table writes: give both", err=True)
        raise typer.Exit(2)
    try:
        prior = read_micro_prior(micro, machine_id()) if micro is not None else None
    except ValueError as exc:
        typer.echo(f"--micro: {exc}", err=True)
        raise typer.Exit(2) from exc
    if write_table is not None or database_url is not None:
        from app.cli_db import setup_database

        setup_database(database_url)  # before minutes of measuring; one it cannot use is one line (app/cli_db.py)
    try:
        with bench_lab(database_url) as bl:
            candidates = bl.candidates()
            specs = specs or default_suites(candidates)
            unusable = {s.name: "not every transform is supported by both gateways, usable by the back end "
                        "and rated" for s in specs if not set(s.transforms) <= set(candidates)}
            specs = [s for s in specs if s.name not in unusable]
            opener = bl.tunnels(candidates)
            with typer.progressbar(length=repetitions * (len(specs) + 1), label="measuring",
                                   file=sys.stderr) as bar:
                baseline, runs, skipped = run_bench(
                    initiator=bl.initiator, responder=bl.responder, opener=opener, suites=specs,
                    repetitions=repetitions, duration=duration, ping_count=ping_count, cpus=cpu_set,
                    progress=lambda _: bar.update(1))
            skipped = {**unusable, **skipped}
            backend = bl.backend
    except (BenchError, QossError) as exc:
        typer.echo(f"bench tunnel failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    machine, date = machine_id(), datetime.now(UTC).date().isoformat()
    document = bench_document(machine=machine, backend=backend, date=date, repetitions=repetitions,
                              duration_s=float(duration), baseline=baseline, suites=runs, cpus=cpu_set)
    typer.echo(_summary(document))
    if cpu_set is not None:
        typer.echo(pinning(cpu_set))
    for name, reason in skipped.items():
        typer.echo(f"skipped {name}: {reason}", err=True)
    if out is not None:
        out.write_text(json.dumps(document, indent=2) + "\n")
    if write_table is not None:
        try:
            written = _write_table(runs=runs, name=write_table, base=base, machine=machine, backend=backend,
                                   date=date, database_url=database_url, prior=prior)
        except QossError as exc:
            typer.echo(json.dumps({"error": type(exc).__name__, "detail": exc.detail()}), err=True)
            raise typer.Exit(2) from exc
        typer.echo(json.dumps(written))
