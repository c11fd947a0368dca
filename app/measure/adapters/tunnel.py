"""Tunnel benchmark: iperf3 and ping between two lab namespaces, through real ESP tunnels.

For each repetition (repetitions interleaved, so slow phases of a shared machine hit every
suite alike): the no-IPsec baseline straight over the veth IKE addresses, then each suite
in turn: the tunnel is brought up through the injected :class:`TunnelOpener` (the product's
tunnel service in ``qoss bench tunnel``), measured between the two inside addresses, its
CHILD_SA read back from the initiator's charon (algorithms and byte counters), and deleted
before the next suite, so traffic never flows through a previous suite's SA.

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
    ping,
    run_command,
)
from app.measure.domain.tunnel import PARALLEL_FLOWS, PING_SIZES, SuiteRun, SuiteSpec

__all__ = [
    "OpenTunnel",
    "TunnelOpener",
    "charon_cpu_seconds",
    "charon_pids",
    "measure_pair",
    "run_bench",
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


def run_bench(
    *, initiator: Host, responder: Host, opener: TunnelOpener, suites: Sequence[SuiteSpec],
    repetitions: int, duration: float, ping_count: int = 20, flows: Sequence[int] = PARALLEL_FLOWS,
    sizes: Sequence[int] = PING_SIZES, baseline: bool = True, cpus: frozenset[int] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[SuiteRun, list[SuiteRun], dict[str, str]]:
    """Measure the baseline and every suite, ``repetitions`` times, interleaved.

    A suite the opener cannot bring up is skipped (name -> reason in the third value) and
    not tried again; a repetition whose measurement fails is logged and left out (a suite
    with none left is skipped). ``progress`` is called once per baseline or suite measurement.

    With ``cpus``, every thread of the charons in both hosts' namespaces is pinned to that
    CPU set for the whole run (again before each measurement, for threads started since)
    and gets its previous affinity back at the end, also on failure or Ctrl-C; iperf3 and
    ping run on the same set.

    Returns:
        The baseline (empty if ``baseline`` is false), one run per measured suite, the skipped suites.

    Raises:
        ValueError: bad counts, a duration iperf3 cannot take, or a CPU set that is empty or
            not usable here.
        BenchError: ``cpus`` is given and no charon thread can be found or pinned.
    """
    if repetitions < 1 or ping_count < 1:
        raise ValueError("repetitions >= 1 and ping_count >= 1")
    check_duration(duration)
    pinning: contextlib.AbstractContextManager[ThreadPins | None] = (
        contextlib.nullcontext() if cpus is None else pin_threads(cpus, lambda: charon_pids((initiator, responder))))
    with pinning as pins:
        if pins is not None and pins.pinned == 0:
            raise BenchError(f"no charon running in {initiator.netns} or {responder.netns} to pin")
        return _run_bench(initiator=initiator, responder=responder, opener=opener, suites=suites,
                          repetitions=repetitions, duration=duration, ping_count=ping_count, flows=flows,
                          sizes=sizes, baseline=baseline, progress=progress, pins=pins)


def _run_bench(
    *, initiator: Host, responder: Host, opener: TunnelOpener, suites: Sequence[SuiteSpec],
    repetitions: int, duration: float, ping_count: int, flows: Sequence[int], sizes: Sequence[int],
    baseline: bool, progress: Callable[[str], None], pins: ThreadPins | None,
) -> tuple[SuiteRun, list[SuiteRun], dict[str, str]]:
    cpus = pins.cpus if pins is not None else None

    def measure(run: SuiteRun, src: str, dst: str) -> None:
        if pins is not None:
            pins.pin()  # threads charon started since (e.g. for the new tunnel)
        measure_pair(run, initiator, responder, src, dst, duration=duration, ping_count=ping_count,
                     flows=flows, sizes=sizes, cpus=cpus)

    base = SuiteRun(None)
    runs = {s: SuiteRun(s) for s in suites}
    skipped: dict[str, str] = {}
    src, dst = initiator.inside_address, responder.inside_address
    for _ in range(repetitions):
        if baseline:
            try:
                measure(base, initiator.ike_address, responder.ike_address)
            except BenchError as exc:  # one lost repetition does not end a long run
                _log.warning("baseline repetition lost: %s", exc)
            progress("baseline")
        for suite in suites:
            if suite.name in skipped:
                progress(suite.name)
                continue
            try:
                tunnel = opener.open(suite)
            except (QossError, BenchError) as exc:
                skipped[suite.name] = str(exc)[:300]
                _log.warning("suite %s skipped: %s", suite.name, exc)
                progress(suite.name)
                continue
            try:
                run = runs[suite]
                run.esp, run.ike = tunnel.esp, tunnel.ike
                measure(run, src, dst)
                run.observed.append(_observe(initiator, tunnel.conn))
            except BenchError as exc:  # one lost repetition does not end a long run
                _log.warning("suite %s: repetition lost: %s", suite.name, exc)
            finally:
                opener.close(tunnel)
            progress(suite.name)
    for suite, run in runs.items():
        if suite.name not in skipped and not run.throughput_mbps:
            skipped[suite.name] = "no repetition could be measured"
    return base, [r for s, r in runs.items() if s.name not in skipped], skipped
