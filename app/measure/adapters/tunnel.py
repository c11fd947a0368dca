"""Tunnel benchmark: iperf3 and ping between two lab namespaces, through real ESP tunnels.

For each repetition (repetitions interleaved, so slow phases of a shared machine hit every
suite alike): the no-IPsec baseline straight over the veth IKE addresses, then each suite
in turn: the tunnel is brought up through the injected :class:`TunnelOpener` (the product's
tunnel service in ``qoss bench tunnel``), measured between the two inside addresses, its
CHILD_SA read back from the initiator's charon (algorithms and byte counters), and deleted
before the next suite, so traffic never flows through a previous suite's SA.

:func:`run_matrix` does this for every cell of the measurement matrix (address family x
protocol, :mod:`app.measure.domain.matrix`): per family its own tunnels (IKE over that
family) and addresses, per suite one tunnel for all the protocols; :func:`run_bench` is the
one cell IPv4 x TCP.

Each measurement is iperf3 and ping between two addresses (:mod:`app.measure.adapters.traffic`),
with the charons' CPU time beside the single flow's throughput. With ``cpus``, the charons'
threads are pinned for the whole run (:mod:`app.measure.adapters.pinning`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.domain.errors import GatewayError, QossError
from app.measure.adapters.hosts import Host
from app.measure.adapters.pinning import ThreadPins, pin_threads
from app.measure.adapters.traffic import (
    BenchError,
    check_duration,
    iperf3,
    iperf3_bytes,
    iperf3_mbps,
    iperf3_report,
    iperf3_udp,
    ping,
    run_command,
)
from app.measure.domain.matrix import (
    PROTOCOLS,
    UDP_MAX_MBPS,
    UDP_SEARCH_STEPS,
    UDP_START_MBPS,
    CellRuns,
    UdpProbe,
    udp_rate_search,
)
from app.measure.domain.tunnel import PARALLEL_FLOWS, PING_SIZES, SuiteRun, SuiteSpec

__all__ = [
    "MatrixResult",
    "OpenTunnel",
    "Route",
    "TunnelOpener",
    "charon_cpu_seconds",
    "charon_pids",
    "measure_pair",
    "run_bench",
    "run_matrix",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OpenTunnel:
    """A tunnel that is up: its id for closing, the charon conn name and its proposals."""

    id: str
    conn: str
    esp: str
    ike: str


class TunnelOpener(Protocol):
    """Brings one suite's tunnel up between the two hosts, and takes it down again."""

    def open(self, suite: SuiteSpec) -> OpenTunnel: ...

    def close(self, tunnel: OpenTunnel) -> None: ...


def charon_pids(hosts: Sequence[Host]) -> list[int]:
    """The charon processes in these hosts' namespaces (``ip netns pids``, comm ``charon``)."""
    found = []
    for host in hosts:
        for pid in run_command(["ip", "netns", "pids", host.netns], timeout=5).stdout.split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "charon":
                    found.append(int(pid))
            except OSError:  # gone in between
                continue
    return found


def charon_cpu_seconds(hosts: Sequence[Host]) -> float:
    """User + system CPU seconds the charons in these hosts' namespaces have used so far.

    With kernel-libipsec, ESP runs in charon (crypto and the TUN device's reads and
    writes), so its CPU time per byte is the suite's own cost, much less disturbed by
    other load on a shared machine than throughput is.
    """
    ticks = 0
    for pid in charon_pids(hosts):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def measure_pair(
    run: SuiteRun, client: Host, server: Host, src: str, dst: str, *, duration: float, ping_count: int,
    flows: Sequence[int] = PARALLEL_FLOWS, sizes: Sequence[int] = PING_SIZES, cpus: frozenset[int] | None = None,
) -> None:
    """One repetition between two addresses, appended to ``run`` (flows 1 is the throughput,
    with the charons' CPU time per byte beside it). iperf3 and ping run on ``cpus`` if given
    (the charons are pinned by :func:`run_bench`)."""
    for n in sorted(set(flows) | {1}):
        if n == 1:
            before = charon_cpu_seconds((client, server))
            report = iperf3_report(client, server, src, dst, duration=duration, cpus=cpus)
            used = charon_cpu_seconds((client, server)) - before
            mbps = iperf3_mbps(report)
            run.throughput_mbps.append(mbps)
            run.cpu_ns_per_byte.append(used * 1e9 / max(iperf3_bytes(report), 1))
        else:
            mbps = iperf3(client, server, src, dst, duration=duration, flows=n, cpus=cpus)
        if n in flows:
            run.parallel_mbps.setdefault(n, []).append(mbps)
    for size in sizes:
        run.rtt_ms.setdefault(size, []).append(ping(client, src, dst, size=size, count=ping_count, cpus=cpus))


def _observe(host: Host, conn: str) -> dict[str, Any]:
    try:
        sas = host.gateway(timeout=5.0).list_sas(ike=conn)
    except GatewayError as exc:
        return {"error": exc.message}
    for sa in sas:
        for child in sa.children:
            if child.name == conn:
                return {"encr_alg": child.encr_alg, "encr_keysize": child.encr_keysize,
                        "integ_alg": child.integ_alg, "bytes_out": child.bytes_out, "bytes_in": child.bytes_in,
                        "ike_encr_alg": sa.encr_alg, "ike_integ_alg": sa.integ_alg, "ike_prf_alg": sa.prf_alg,
                        "ike_dh_group": sa.dh_group}
    return {"error": f"no CHILD_SA {conn}"}


@dataclass(frozen=True, slots=True)
class Route:
    """How one address family is measured: the opener of its tunnels and its address pairs.

    Attributes:
        family: 4 or 6.
        opener: brings a suite's tunnel up with IKE over this family, its selectors the
            inside networks of this family.
        outer: the initiator's and responder's IKE addresses (the no-IPsec baseline runs there).
        inside: the initiator's and responder's inside addresses (through the tunnel).
    """

    family: int
    opener: TunnelOpener
    outer: tuple[str, str]
    inside: tuple[str, str]


@dataclass
class MatrixResult:
    """What :func:`run_matrix` measured: one :class:`CellRuns` per family and protocol, in the
    order asked, and the suites skipped (name, with `` over IPv6`` for IPv6, -> reason)."""

    cells: list[CellRuns]
    skipped: dict[str, str]


def run_bench(
    *, initiator: Host, responder: Host, opener: TunnelOpener, suites: Sequence[SuiteSpec],
    repetitions: int, duration: float, ping_count: int = 20, flows: Sequence[int] = PARALLEL_FLOWS,
    sizes: Sequence[int] = PING_SIZES, baseline: bool = True, cpus: frozenset[int] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[SuiteRun, list[SuiteRun], dict[str, str]]:
    """Measure the baseline and every suite over IPv4 with TCP, ``repetitions`` times, interleaved
    (:func:`run_matrix` with the one cell IPv4 x TCP, between the hosts' IPv4 addresses).

    Returns:
        The baseline (empty if ``baseline`` is false), one run per measured suite, the skipped suites.

    Raises:
        ValueError, BenchError: as :func:`run_matrix`.
    """
    route = Route(4, opener, (initiator.ike_address, responder.ike_address),
                  (initiator.inside_address, responder.inside_address))
    result = run_matrix(initiator=initiator, responder=responder, routes=[route], protocols=("tcp",), suites=suites,
                        repetitions=repetitions, duration=duration, ping_count=ping_count, flows=flows, sizes=sizes,
                        baseline=baseline, cpus=cpus, progress=progress)
    (cell,) = result.cells
    return cell.baseline, cell.suites, result.skipped


def run_matrix(
    *, initiator: Host, responder: Host, routes: Sequence[Route], protocols: Sequence[str], suites: Sequence[SuiteSpec],
    repetitions: int, duration: float, ping_count: int = 20, flows: Sequence[int] = PARALLEL_FLOWS,
    sizes: Sequence[int] = PING_SIZES, baseline: bool = True, cpus: frozenset[int] | None = None,
    udp_steps: int = UDP_SEARCH_STEPS, progress: Callable[[str], None] = lambda _: None,
) -> MatrixResult:
    """Measure the baseline and every suite in every cell (family x protocol), ``repetitions``
    times, interleaved (see :mod:`app.measure.domain.matrix` for what a cell measures).

    Per repetition, per family (``routes`` in order): the baseline between the outer
    addresses, then each suite in turn: its tunnel is opened with the family's opener, every
    protocol is measured through it (TCP first: its throughput is where the UDP rate search
    starts), then RTT by size (ICMP, once), the CHILD_SA is read back, and the tunnel is closed.
    The UDP search makes at most ``udp_steps`` runs, and starts none after
    ``udp_steps * (duration + 2)`` seconds.

    A suite the opener cannot bring up is skipped in that family (name -> reason; `` over IPv6``
    is added for IPv6) and not tried again there; a repetition whose measurement fails is
    logged and left out (a suite with none left is skipped). ``progress`` is called once per
    baseline or suite measurement (each family counts). With ``cpus``, every thread of the
    charons in both hosts' namespaces is pinned to that CPU set for the whole run and gets its
    previous affinity back at the end, also on failure or Ctrl-C; iperf3 and ping run on the same set.

    Raises:
        ValueError: bad counts, protocols or families, a duration iperf3 cannot take, or a CPU
            set that is empty or not usable here.
        BenchError: ``cpus`` is given and no charon thread can be found or pinned.
    """
    if repetitions < 1 or ping_count < 1 or udp_steps < 1:
        raise ValueError("repetitions >= 1, ping_count >= 1 and udp_steps >= 1")
    if not protocols or not set(protocols) <= set(PROTOCOLS) or len(set(protocols)) != len(protocols):
        raise ValueError(f"protocols: distinct ones of {', '.join(PROTOCOLS)}")
    if not routes or len({r.family for r in routes}) != len(routes) or not {r.family for r in routes} <= {4, 6}:
        raise ValueError("routes: one per family, 4 or 6")
    check_duration(duration)
    pinning: contextlib.AbstractContextManager[ThreadPins | None] = (
        contextlib.nullcontext() if cpus is None else pin_threads(cpus, lambda: charon_pids((initiator, responder))))
    with pinning as pins:
        if pins is not None and pins.pinned == 0:
            raise BenchError(f"no charon running in {initiator.netns} or {responder.netns} to pin")
        return _Matrix(initiator=initiator, responder=responder, protocols=tuple(protocols), duration=duration,
                       ping_count=ping_count, flows=tuple(flows), sizes=tuple(sizes), udp_steps=udp_steps,
                       pins=pins).run(routes=routes, suites=suites, repetitions=repetitions, baseline=baseline,
                                      progress=progress)


def _skip_key(name: str, family: int) -> str:
    return name if family == 4 else f"{name} over IPv6"


@dataclass
class _Matrix:
    initiator: Host
    responder: Host
    protocols: tuple[str, ...]
    duration: float
    ping_count: int
    flows: tuple[int, ...]
    sizes: tuple[int, ...]
    udp_steps: int
    pins: ThreadPins | None

    @property
    def cpus(self) -> frozenset[int] | None:
        return self.pins.cpus if self.pins is not None else None

    def run(self, *, routes: Sequence[Route], suites: Sequence[SuiteSpec], repetitions: int, baseline: bool,
            progress: Callable[[str], None]) -> MatrixResult:
        specs: list[SuiteSpec | None] = [None, *suites]
        runs = {(r.family, p, s): SuiteRun(s) for r in routes for p in self.protocols for s in specs}
        skipped: dict[str, str] = {}
        for repetition in range(repetitions):
            for route in routes:
                family = route.family
                if baseline:
                    try:
                        self.measure(runs, family, None, route.outer, repetition)
                    except BenchError as exc:  # one lost repetition does not end a long run
                        _log.warning("baseline repetition lost (IPv%d): %s", family, exc)
                    progress("baseline")
                for suite in suites:
                    key = _skip_key(suite.name, family)
                    if key in skipped:
                        progress(suite.name)
                        continue
                    try:
                        tunnel = route.opener.open(suite)
                    except (QossError, BenchError) as exc:
                        skipped[key] = str(exc)[:300]
                        _log.warning("suite %s skipped: %s", key, exc)
                        progress(suite.name)
                        continue
                    try:
                        for p in self.protocols:
                            runs[family, p, suite].esp, runs[family, p, suite].ike = tunnel.esp, tunnel.ike
                        self.measure(runs, family, suite, route.inside, repetition)
                        observed = _observe(self.initiator, tunnel.conn)
                        for p in self.protocols:
                            runs[family, p, suite].observed.append(observed)
                    except BenchError as exc:  # one lost repetition does not end a long run
                        _log.warning("suite %s: repetition lost: %s", key, exc)
                    finally:
                        route.opener.close(tunnel)
                    progress(suite.name)
        for route in routes:
            for suite in suites:
                key = _skip_key(suite.name, route.family)
                if key not in skipped and not any(runs[route.family, p, suite].throughput_mbps for p in self.protocols):
                    skipped[key] = "no repetition could be measured"
        cells = [CellRuns(r.family, p, runs[r.family, p, None],
                          [runs[r.family, p, s] for s in suites if _skip_key(s.name, r.family) not in skipped])
                 for r in routes for p in self.protocols]
        return MatrixResult(cells, skipped)

    def measure(self, runs: dict[tuple[int, str, SuiteSpec | None], SuiteRun], family: int, suite: SuiteSpec | None,
                pair: tuple[str, str], repetition: int) -> None:
        """One repetition of one suite (or the baseline) in one family: every protocol, then RTT."""
        if self.pins is not None:
            self.pins.pin()  # threads charon started since (e.g. for the new tunnel)
        src, dst = pair
        esp = suite.name if suite is not None else None

        def sample(run: SuiteRun, protocol: str, metric: str, value: float, **where: float) -> None:
            run.samples.append({"esp": esp, "family": family, "protocol": protocol, "metric": metric, **where,
                                "repetition": repetition, "value": round(value, 4)})

        hint: float | None = None
        for protocol in sorted(self.protocols, key=PROTOCOLS.index):  # TCP first: where UDP starts
            run = runs[family, protocol, suite]
            if protocol == "tcp":
                measure_pair(run, self.initiator, self.responder, src, dst, duration=self.duration,
                             ping_count=self.ping_count, flows=self.flows, sizes=(), cpus=self.cpus)
                hint = run.throughput_mbps[-1]
                sample(run, "tcp", "throughput_mbps", hint, flows=1)
                for n in self.flows:
                    if n != 1:
                        sample(run, "tcp", "throughput_mbps", run.parallel_mbps[n][-1], flows=n)
            else:
                self.measure_udp(run, src, dst, hint, sample)
        ping_runs = [runs[family, p, suite] for p in self.protocols]
        for size in self.sizes:
            rtt = ping(self.initiator, src, dst, size=size, count=self.ping_count, cpus=self.cpus)
            for run in ping_runs:
                run.rtt_ms.setdefault(size, []).append(rtt)
            sample(ping_runs[0], "icmp", "rtt_ms", rtt, size=size)

    def measure_udp(self, run: SuiteRun, src: str, dst: str, hint: float | None,
                    sample: Callable[..., None]) -> None:
        # Where to start: this suite's last UDP rate, else its TCP throughput just measured (UDP
        # through one iperf3 stream rarely carries more), else a default; never above UDP_MAX_MBPS.
        start = run.offered_mbps[-1] * 1.1 if run.offered_mbps else hint * 1.1 if hint else UDP_START_MBPS

        def probe(rate: float) -> UdpProbe:
            return iperf3_udp(self.initiator, self.responder, src, dst, duration=self.duration, rate_mbps=rate,
                              cpus=self.cpus)

        found = udp_rate_search(probe, start_mbps=min(max(start, 1.0), UDP_MAX_MBPS), max_steps=self.udp_steps,
                                budget_s=self.udp_steps * (self.duration + 2), max_mbps=UDP_MAX_MBPS)
        best = found.best
        run.throughput_mbps.append(best.received_mbps)
        run.offered_mbps.append(best.offered_mbps)
        run.jitter_ms.append(best.jitter_ms)
        run.loss_percent.append(best.loss_percent)
        run.within_loss_limit.append(found.within_limit)
        sample(run, "udp", "throughput_mbps", best.received_mbps, flows=1)
        sample(run, "udp", "offered_mbps", best.offered_mbps, flows=1)
        sample(run, "udp", "jitter_ms", best.jitter_ms, flows=1)
        sample(run, "udp", "loss_percent", best.loss_percent, flows=1)
        for step, tried in enumerate(found.probes):  # every rate tried, in order: value = what arrived
            sample(run, "udp", "udp_probe", tried.received_mbps, step=step, offered_mbps=round(tried.offered_mbps, 1),
                   jitter_ms=round(tried.jitter_ms, 4), loss_percent=round(tried.loss_percent, 4))
