"""Traffic between lab namespaces: iperf3 and ping run there, and what they print read back.

Per measurement: ``iperf3 -s -1`` in the responder's namespace bound to its address and
a fixed port, ``iperf3 -c --json`` from the initiator's namespace for ``duration`` seconds,
and ``ping -c N -i 0.01 -s SIZE`` for a payload size (the mean RTT of N echoes is one
sample; ``ping -6`` to an IPv6 address). UDP: ``iperf3 -u -b RATE -l 1352 --json`` at an
offered rate, read back as what arrived with the receiver's jitter and loss. Every
subprocess runs in its own process group, on a CPU set if given, has a timeout and is
killed with its process group on any exit. Needs root, iproute2, iperf3
and iputils ping.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

from app.measure.adapters.hosts import Host
from app.measure.domain.matrix import UDP_PAYLOAD, UdpProbe

__all__ = [
    "IPERF_PORT",
    "BenchError",
    "check_duration",
    "iperf3",
    "iperf3_bytes",
    "iperf3_mbps",
    "iperf3_report",
    "iperf3_udp",
    "iperf3_udp_probe",
    "ping",
    "ping_mean_ms",
    "run_command",
]

IPERF_PORT = 5201
_RTT = re.compile(r"=\s*([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)\s*ms")


class BenchError(RuntimeError):
    """A measurement could not be taken (the message says which and why)."""


def _iperf3_report(report: str) -> dict[str, Any]:
    """The JSON object of ``iperf3 --json`` output.

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
    return data


def iperf3_mbps(report: str) -> float:
    """Received Mbit/s from ``iperf3 --json`` output (the sum over parallel flows).

    Raises:
        BenchError: not an iperf3 JSON report, or it reports an error.
    """
    data = _iperf3_report(report)
    try:
        bits = float(data["end"]["sum_received"]["bits_per_second"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError("iperf3 JSON has no end.sum_received.bits_per_second") from exc
    return bits / 1e6


def iperf3_udp_probe(report: str) -> UdpProbe:
    """Offered rate, received Mbit/s, jitter and loss from ``iperf3 -u --json`` output.

    The receiver's figures are ``end.sum_received`` (iperf3 3.10 and later); older ones
    report only ``end.sum`` (the sender's bytes with the receiver's jitter and loss), so
    there the received rate is the sent one less the loss.

    Raises:
        BenchError: not an iperf3 UDP JSON report, or it reports an error.
    """
    data = _iperf3_report(report)
    try:
        end = data["end"]
        offered = float(data["start"]["test_start"]["target_bitrate"]) / 1e6
        received = end.get("sum_received")
        if isinstance(received, dict):
            mbps = float(received["bits_per_second"]) / 1e6
            jitter, loss = float(received["jitter_ms"]), float(received["lost_percent"])
        else:
            total = end["sum"]
            jitter, loss = float(total["jitter_ms"]), float(total["lost_percent"])
            mbps = float(total["bits_per_second"]) / 1e6 * (1 - loss / 100)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BenchError("iperf3 JSON has no UDP summary (end.sum_received or end.sum with jitter and loss)") from exc
    return UdpProbe(offered_mbps=offered, received_mbps=mbps, jitter_ms=jitter, loss_percent=loss)


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


def _on_cpus(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that sets the child's CPU affinity (inherited through ``ip netns exec``)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def run_command(args: list[str], timeout: float,
                cpus: frozenset[int] | None = None) -> subprocess.CompletedProcess[str]:
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
def _iperf_server(host: Host, address: str, port: int, timeout: float,
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
            listening = run_command(_in_netns(host.netns, "ss", "-Hltn", f"sport = :{port}"), timeout=5)
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


def check_duration(duration: float) -> None:
    # iperf3 reads -t as a whole number of seconds, and 0 means "run for ever".
    if duration < 1 or duration != int(duration):
        raise ValueError("an iperf3 duration is a whole number of seconds, at least 1")


def iperf3(client: Host, server: Host, src: str, dst: str, *, duration: float, flows: int = 1,
           port: int = IPERF_PORT, cpus: frozenset[int] | None = None) -> float:
    """TCP Mbit/s from ``src`` (in ``client``'s namespace) to ``dst`` (in ``server``'s),
    both iperf3 processes on ``cpus`` if given.

    Raises:
        BenchError: a process failed or timed out.
        ValueError: ``duration`` is not a whole number of seconds >= 1.
    """
    return iperf3_mbps(iperf3_report(client, server, src, dst, duration=duration, flows=flows, port=port,
                                      cpus=cpus))


def iperf3_report(client: Host, server: Host, src: str, dst: str, *, duration: float, flows: int = 1,
                   port: int = IPERF_PORT, cpus: frozenset[int] | None = None) -> str:
    check_duration(duration)
    with _iperf_server(server, dst, port, timeout=5.0, cpus=cpus):
        done = run_command(_in_netns(client.netns, "iperf3", "-c", dst, "-B", src, "-p", str(port),
                                     "-t", str(int(duration)), "-P", str(flows), "--connect-timeout", "3000", "--json"),
                           timeout=duration + 20, cpus=cpus)
    return done.stdout


def iperf3_udp(client: Host, server: Host, src: str, dst: str, *, duration: float, rate_mbps: float,
               payload: int = UDP_PAYLOAD, port: int = IPERF_PORT, cpus: frozenset[int] | None = None) -> UdpProbe:
    """One UDP run at ``rate_mbps`` offered from ``src`` to ``dst`` (datagrams of ``payload``
    bytes), both iperf3 processes on ``cpus`` if given.

    Raises:
        BenchError: a process failed or timed out.
        ValueError: ``duration`` is not a whole number of seconds >= 1.
    """
    check_duration(duration)
    with _iperf_server(server, dst, port, timeout=5.0, cpus=cpus):
        done = run_command(_in_netns(client.netns, "iperf3", "-c", dst, "-B", src, "-p", str(port), "-u",
                                     "-b", f"{max(1, round(rate_mbps * 1e6))}", "-l", str(payload),
                                     "-t", str(int(duration)), "--connect-timeout", "3000", "--json"),
                           timeout=duration + 20, cpus=cpus)
    return iperf3_udp_probe(done.stdout)


def iperf3_bytes(report: str) -> int:
    """Bytes received from ``iperf3 --json`` output.

    Raises:
        BenchError: no ``end.sum_received.bytes``.
    """
    try:
        return int(json.loads(report)["end"]["sum_received"]["bytes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError("iperf3 JSON has no end.sum_received.bytes") from exc


def ping(client: Host, src: str, dst: str, *, size: int, count: int, cpus: frozenset[int] | None = None) -> float:
    """Mean RTT in ms of ``count`` echoes with ``size`` payload bytes (ping on ``cpus`` if given;
    ``ping -6`` to an IPv6 address).

    Raises:
        BenchError: no answer.
    """
    family = ["-6"] if ":" in dst else []
    done = run_command(_in_netns(client.netns, "ping", *family, "-q", "-n", "-I", src, "-c", str(count), "-i", "0.01",
                                 "-s", str(size), "-W", "2", "-w", str(max(5, count // 10 + 5)), dst),
                       timeout=count * 0.05 + 15, cpus=cpus)
    return ping_mean_ms(done.stdout)

