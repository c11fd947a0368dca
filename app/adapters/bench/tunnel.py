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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.adapters.lab import LabHost
from app.domain.bench_tunnel import PARALLEL_FLOWS, PING_SIZES, SuiteRun, SuiteSpec
from app.domain.errors import GatewayError, QossError

__all__ = [
    "BenchError",
    "OpenTunnel",
    "TunnelOpener",
    "charon_cpu_seconds",
    "iperf3_bytes",
    "iperf3_mbps",
    "measure_pair",
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


# --------------------------------------------------------------------------- processes


def _in_netns(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *args]


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run to completion in its own process group; on timeout kill the group."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill(proc)
        raise BenchError(f"{' '.join(args[4:6])}: no answer within {timeout:g} s") from exc
    finally:
        _kill(proc)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@contextlib.contextmanager
def _iperf_server(host: LabHost, address: str, port: int, timeout: float) -> Iterator[None]:
    """A one-off iperf3 server bound to ``address`` in the host's namespace; killed on exit."""
    proc = subprocess.Popen(
        _in_netns(host.netns, "iperf3", "-s", "-1", "-B", address, "-p", str(port)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
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
           port: int = IPERF_PORT) -> float:
    """TCP Mbit/s from ``src`` (in ``client``'s namespace) to ``dst`` (in ``server``'s).

    Raises:
        BenchError: a process failed or timed out.
        ValueError: ``duration`` is not a whole number of seconds >= 1.
    """
    return iperf3_mbps(_iperf3_report(client, server, src, dst, duration=duration, flows=flows, port=port))


def _iperf3_report(client: LabHost, server: LabHost, src: str, dst: str, *, duration: float, flows: int = 1,
                   port: int = IPERF_PORT) -> str:
    _check_duration(duration)
    with _iperf_server(server, dst, port, timeout=5.0):
        done = _run(_in_netns(client.netns, "iperf3", "-c", dst, "-B", src, "-p", str(port), "-t", str(int(duration)),
                              "-P", str(flows), "--connect-timeout", "3000", "--json"),
                    timeout=duration + 20)
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


def charon_cpu_seconds(hosts: Sequence[LabHost]) -> float:
    """User + system CPU seconds the charons in these hosts' namespaces have used so far.

    With kernel-libipsec, ESP runs in charon (crypto and the TUN device's reads and
    writes), so its CPU time per byte is the suite's own cost, much less disturbed by
    other load on a shared machine than throughput is.
    """
    ticks = 0
    for host in hosts:
        for pid in _run(["ip", "netns", "pids", host.netns], timeout=5).stdout.split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != "charon":
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def ping(client: LabHost, src: str, dst: str, *, size: int, count: int) -> float:
    """Mean RTT in ms of ``count`` echoes with ``size`` payload bytes.

    Raises:
        BenchError: no answer.
    """
    done = _run(_in_netns(client.netns, "ping", "-q", "-n", "-I", src, "-c", str(count), "-i", "0.01",
                          "-s", str(size), "-W", "2", "-w", str(max(5, count // 10 + 5)), dst),
                timeout=count * 0.05 + 15)
    return ping_mean_ms(done.stdout)


def measure_pair(
    run: SuiteRun, client: LabHost, server: LabHost, src: str, dst: str, *, duration: float, ping_count: int,
    flows: Sequence[int] = PARALLEL_FLOWS, sizes: Sequence[int] = PING_SIZES,
) -> None:
    """One repetition between two addresses, appended to ``run`` (flows 1 is the throughput,
    with the charons' CPU time per byte beside it)."""
    for n in sorted(set(flows) | {1}):
        if n == 1:
            before = charon_cpu_seconds((client, server))
            report = _iperf3_report(client, server, src, dst, duration=duration)
            used = charon_cpu_seconds((client, server)) - before
            mbps = iperf3_mbps(report)
            run.throughput_mbps.append(mbps)
            run.cpu_ns_per_byte.append(used * 1e9 / max(iperf3_bytes(report), 1))
        else:
            mbps = iperf3(client, server, src, dst, duration=duration, flows=n)
        if n in flows:
            run.parallel_mbps.setdefault(n, []).append(mbps)
    for size in sizes:
        run.rtt_ms.setdefault(size, []).append(ping(client, src, dst, size=size, count=ping_count))


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
    sizes: Sequence[int] = PING_SIZES, baseline: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[SuiteRun, list[SuiteRun], dict[str, str]]:
    """Measure the baseline and every suite, ``repetitions`` times, interleaved.

    A suite the opener cannot bring up is skipped (name -> reason in the third value) and
    not tried again; a repetition whose measurement fails is logged and left out (a suite
    with none left is skipped). ``progress`` is called once per baseline or suite measurement.

    Returns:
        The baseline (empty if ``baseline`` is false), one run per measured suite, the skipped suites.
    """
    if repetitions < 1 or ping_count < 1:
        raise ValueError("repetitions >= 1 and ping_count >= 1")
    _check_duration(duration)
    base = SuiteRun(None)
    runs = {s: SuiteRun(s) for s in suites}
    skipped: dict[str, str] = {}
    src, dst = initiator.inside_address, responder.inside_address
    for _ in range(repetitions):
        if baseline:
            try:
                measure_pair(base, initiator, responder, initiator.ike_address, responder.ike_address,
                             duration=duration, ping_count=ping_count, flows=flows, sizes=sizes)
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
                measure_pair(run, initiator, responder, src, dst, duration=duration, ping_count=ping_count,
                             flows=flows, sizes=sizes)
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
