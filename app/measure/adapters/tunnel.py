"""Tunnel benchmark: iperf3 and ping between two lab namespaces, through real ESP tunnels.

For each repetition (repetitions interleaved, so slow phases of a shared machine hit every
suite alike): the no-IPsec baseline straight over the veth IKE addresses, then each suite
in turn: the tunnel is brought up through the injected :class:`TunnelOpener` (the product's
tunnel service in ``qoss bench tunnel``), measured between the two inside addresses, its
CHILD_SA read back from the initiator's charon (algorithms and byte counters), and deleted
before the next suite, so traffic never flows through a previous suite's SA.

Per measurement: ``iperf3 -s -1`` in the responder's namespace bound to its address and
a fixed port, ``iperf3 -c --json`` from the initiator's namespace for ``duration`` seconds
(1, 2 and 4 parallel flows; the single flow is the throughput figure), and
``ping -c N -i 0.01 -s SIZE`` for each payload size (the mean RTT of N echoes is one
sample). Every subprocess has a timeout and is killed with its process group on any exit.
Needs root, iproute2, iperf3 and iputils ping.

With ``cpus`` (a CPU set, e.g. ``frozenset({1})``), every thread of both charons is pinned
to it for the whole run and given back its previous affinity at the end (also on failure
or Ctrl-C), and iperf3 (client and server) and ping are started with that affinity. On a
small shared machine the scheduler otherwise places the charons and iperf3 differently in
every run, and single-flow throughput spreads 20-90 % from run to run; on one CPU it
reflects each suite's CPU cost instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.adapters.lab import LabHost
from app.domain.errors import GatewayError, QossError
from app.measure.domain.tunnel import PARALLEL_FLOWS, PING_SIZES, SuiteRun, SuiteSpec

__all__ = [
    "BenchError",
    "OpenTunnel",
    "ThreadPins",
    "TunnelOpener",
    "charon_cpu_seconds",
    "charon_pids",
    "check_cpus",
    "iperf3_bytes",
    "iperf3_mbps",
    "measure_pair",
    "parse_cpus",
    "pin_threads",
    "ping_mean_ms",
    "run_bench",
]

_log = logging.getLogger(__name__)

IPERF_PORT = 5201
_RTT = re.compile(r"=\s*([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)\s*ms")


class BenchError(RuntimeError):
    """A measurement could not be taken (the message says which and why)."""


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


# --------------------------------------------------------------------------- parsing


def iperf3_mbps(report: str) -> float:
    """Received Mbit/s from ``iperf3 --json`` output (the sum over parallel flows).

    Raises:
        BenchError: not an iperf3 JSON report, or it reports an error.
    """
    try:
        data = json.loads(report)
    except ValueError as exc:
        raise BenchError(f"iperf3 printed no JSON: {report[:200]!r}") from exc
    if not isinstance(data, dict):
        raise BenchError("iperf3 JSON is not an object")
    if data.get("error"):
        raise BenchError(f"iperf3: {str(data['error'])[:200]}")
    try:
        bits = float(data["end"]["sum_received"]["bits_per_second"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError("iperf3 JSON has no end.sum_received.bits_per_second") from exc
    return bits / 1e6


def ping_mean_ms(output: str) -> float:
    """The mean RTT from ping's summary line (``rtt min/avg/max/mdev = a/b/c/d ms``).

    Raises:
        BenchError: no summary line (e.g. every echo was lost).
    """
    found = _RTT.search(output)
    if found is None:
        raise BenchError(f"ping printed no RTT summary: {output[-200:]!r}")
    return float(found.group(2))


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def check_cpus(cpus: Iterable[int]) -> frozenset[int]:
    """``cpus`` as a set, if it is non-empty and this process may run on every CPU in it.

    Raises:
        ValueError: empty, or a CPU outside ``os.sched_getaffinity(0)`` (the message names the allowed CPUs).
    """
    wanted = frozenset(cpus)
    allowed = os.sched_getaffinity(0)
    if not wanted:
        raise ValueError(f"the CPU set is empty; this process may use CPUs {_cpu_list(allowed)}")
    outside = wanted - allowed
    if outside:
        raise ValueError(f"CPU {_cpu_list(outside)} not usable; this process may use CPUs {_cpu_list(allowed)}")
    return wanted


def parse_cpus(text: str) -> frozenset[int]:
    """A comma-separated CPU list (``1``, ``0,1``), checked by :func:`check_cpus`.

    Raises:
        ValueError: not a list of CPU numbers, or a CPU this process may not use.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdecimal() for p in parts):
        raise ValueError(f"expected comma-separated CPU numbers such as 1 or 0,1, not {text!r}")
    return check_cpus(int(p) for p in parts)


# --------------------------------------------------------------------------- processes


def _in_netns(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *args]


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _on_cpus(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that sets the child's CPU affinity (inherited through ``ip netns exec``)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _run(args: list[str], timeout: float, cpus: frozenset[int] | None = None) -> subprocess.CompletedProcess[str]:
    """Run to completion in its own process group (on ``cpus`` if given); on timeout kill the group."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_on_cpus(cpus))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill(proc)
        raise BenchError(f"{' '.join(args[4:6])}: no answer within {timeout:g} s") from exc
    finally:
        _kill(proc)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@contextlib.contextmanager
def _iperf_server(host: LabHost, address: str, port: int, timeout: float,
                  cpus: frozenset[int] | None = None) -> Iterator[None]:
    """A one-off iperf3 server bound to ``address`` in the host's namespace (on ``cpus`` if given);
    killed on exit."""
    proc = subprocess.Popen(
        _in_netns(host.netns, "iperf3", "-s", "-1", "-B", address, "-p", str(port)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_on_cpus(cpus),
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            listening = _run(_in_netns(host.netns, "ss", "-Hltn", f"sport = :{port}"), timeout=5)
            if address in listening.stdout:
                break
            if proc.poll() is not None:
                raise BenchError(f"iperf3 server in {host.netns} exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise BenchError(f"iperf3 server in {host.netns} not listening within {timeout:g} s")
            time.sleep(0.02)
        yield
    finally:
        _kill(proc)


def _check_duration(duration: float) -> None:
    # iperf3 reads -t as a whole number of seconds, and 0 means "run for ever".
    if duration < 1 or duration != int(duration):
        raise ValueError("an iperf3 duration is a whole number of seconds, at least 1")


def iperf3(client: LabHost, server: LabHost, src: str, dst: str, *, duration: float, flows: int = 1,
           port: int = IPERF_PORT, cpus: frozenset[int] | None = None) -> float:
    """TCP Mbit/s from ``src`` (in ``client``'s namespace) to ``dst`` (in ``server``'s),
    both iperf3 processes on ``cpus`` if given.

    Raises:
        BenchError: a process failed or timed out.
        ValueError: ``duration`` is not a whole number of seconds >= 1.
    """
    return iperf3_mbps(_iperf3_report(client, server, src, dst, duration=duration, flows=flows, port=port,
                                      cpus=cpus))


def _iperf3_report(client: LabHost, server: LabHost, src: str, dst: str, *, duration: float, flows: int = 1,
                   port: int = IPERF_PORT, cpus: frozenset[int] | None = None) -> str:
    _check_duration(duration)
    with _iperf_server(server, dst, port, timeout=5.0, cpus=cpus):
        done = _run(_in_netns(client.netns, "iperf3", "-c", dst, "-B", src, "-p", str(port), "-t", str(int(duration)),
                              "-P", str(flows), "--connect-timeout", "3000", "--json"),
                    timeout=duration + 20, cpus=cpus)
    return done.stdout


def iperf3_bytes(report: str) -> int:
    """Bytes received from ``iperf3 --json`` output.

    Raises:
        BenchError: no ``end.sum_received.bytes``.
    """
    try:
        return int(json.loads(report)["end"]["sum_received"]["bytes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError("iperf3 JSON has no end.sum_received.bytes") from exc


def charon_pids(hosts: Sequence[LabHost]) -> list[int]:
    """The charon processes in these hosts' namespaces (``ip netns pids``, comm ``charon``)."""
    found = []
    for host in hosts:
        for pid in _run(["ip", "netns", "pids", host.netns], timeout=5).stdout.split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "charon":
                    found.append(int(pid))
            except OSError:  # gone in between
                continue
    return found


def charon_cpu_seconds(hosts: Sequence[LabHost]) -> float:
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


class ThreadPins:
    """Pins every thread of some processes to a CPU set and gives each its previous affinity back.

    :meth:`pin` may be called again at any time: threads seen for the first time are
    pinned too. A thread is created with its creator's affinity, so one that appears in a
    process after the first :meth:`pin` is taken to have had that process's main thread's
    original affinity (what it would have had unpinned), and gets that back.

    Args:
        cpus: the CPU set (see :func:`check_cpus`).
        processes: called by every :meth:`pin`: the pids whose threads to pin.
    """

    def __init__(self, cpus: frozenset[int], processes: Callable[[], Iterable[int]]) -> None:
        self.cpus = cpus
        self._processes = processes
        self._previous: dict[tuple[int, int], set[int]] = {}  # (pid, tid) -> affinity before pinning
        self._seen: set[int] = set()
        self.pinned = 0  #: threads pinned by the last :meth:`pin`

    def pin(self) -> int:
        """Pin every thread of every process now (new ones and old ones alike).

        Returns:
            How many threads are pinned now.

        Raises:
            BenchError: the affinity of a thread cannot be set (e.g. not root).
        """
        pinned = 0
        for pid in self._processes():
            try:
                tids = sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
            except OSError:  # the process is gone
                continue
            known = pid in self._seen
            self._seen.add(pid)
            for tid in tids:
                try:
                    if (pid, tid) not in self._previous:
                        main = self._previous.get((pid, pid))
                        self._previous[pid, tid] = (set(main) if known and main is not None
                                                    else os.sched_getaffinity(tid))
                    os.sched_setaffinity(tid, self.cpus)
                except ProcessLookupError:  # the thread ended in between
                    continue
                except OSError as exc:
                    raise BenchError(f"cannot pin thread {tid} of process {pid} to CPU "
                                     f"{_cpu_list(self.cpus)}: {exc}") from exc
                pinned += 1
        self.pinned = pinned
        return pinned

    def restore(self) -> None:
        """Give every thread pinned so far its previous affinity (threads that ended are skipped)."""
        for (pid, tid), affinity in self._previous.items():
            if not Path(f"/proc/{pid}/task/{tid}").exists():  # ended: its tid may be someone else's now
                continue
            try:
                os.sched_setaffinity(tid, affinity)
            except ProcessLookupError:
                continue
            except OSError as exc:  # restore the others all the same
                _log.warning("cannot restore the CPU affinity of thread %d of process %d: %s", tid, pid, exc)
        self._previous.clear()
        self._seen.clear()


@contextlib.contextmanager
def pin_threads(cpus: frozenset[int], processes: Callable[[], Iterable[int]]) -> Iterator[ThreadPins]:
    """Every thread of ``processes()`` pinned to ``cpus`` (call ``pin()`` again to take new
    threads along); each thread's previous affinity is restored on exit, also on an exception
    or Ctrl-C.

    Raises:
        ValueError: ``cpus`` is empty or not usable here (:func:`check_cpus`).
        BenchError: a thread's affinity cannot be set.
    """
    pins = ThreadPins(check_cpus(cpus), processes)
    try:
        pins.pin()
        yield pins
    finally:
        pins.restore()


def ping(client: LabHost, src: str, dst: str, *, size: int, count: int, cpus: frozenset[int] | None = None) -> float:
    """Mean RTT in ms of ``count`` echoes with ``size`` payload bytes (ping on ``cpus`` if given).

    Raises:
        BenchError: no answer.
    """
    done = _run(_in_netns(client.netns, "ping", "-q", "-n", "-I", src, "-c", str(count), "-i", "0.01",
                          "-s", str(size), "-W", "2", "-w", str(max(5, count // 10 + 5)), dst),
                timeout=count * 0.05 + 15, cpus=cpus)
    return ping_mean_ms(done.stdout)


def measure_pair(
    run: SuiteRun, client: LabHost, server: LabHost, src: str, dst: str, *, duration: float, ping_count: int,
    flows: Sequence[int] = PARALLEL_FLOWS, sizes: Sequence[int] = PING_SIZES, cpus: frozenset[int] | None = None,
) -> None:
    """One repetition between two addresses, appended to ``run`` (flows 1 is the throughput,
    with the charons' CPU time per byte beside it). iperf3 and ping run on ``cpus`` if given
    (the charons are pinned by :func:`run_bench`)."""
    for n in sorted(set(flows) | {1}):
        if n == 1:
            before = charon_cpu_seconds((client, server))
            report = _iperf3_report(client, server, src, dst, duration=duration, cpus=cpus)
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


def _observe(host: LabHost, conn: str) -> dict[str, Any]:
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
    *, initiator: LabHost, responder: LabHost, opener: TunnelOpener, suites: Sequence[SuiteSpec],
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
    _check_duration(duration)
    pinning: contextlib.AbstractContextManager[ThreadPins | None] = (
        contextlib.nullcontext() if cpus is None else pin_threads(cpus, lambda: charon_pids((initiator, responder))))
    with pinning as pins:
        if pins is not None and pins.pinned == 0:
            raise BenchError(f"no charon running in {initiator.netns} or {responder.netns} to pin")
        return _run_bench(initiator=initiator, responder=responder, opener=opener, suites=suites,
                          repetitions=repetitions, duration=duration, ping_count=ping_count, flows=flows,
                          sizes=sizes, baseline=baseline, progress=progress, pins=pins)


def _run_bench(
    *, initiator: LabHost, responder: LabHost, opener: TunnelOpener, suites: Sequence[SuiteSpec],
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
