"""The tunnel benchmark's measurement matrix (pure): address family x transport protocol.

A *cell* is one address family (4 or 6: the outer IKE/ESP addresses and the inside
addresses iperf3 and ping use are both of that family) and one protocol:

- ``tcp``: single-flow TCP throughput (iperf3), throughput by number of parallel flows
  (iperf3 ``-P``), and RTT by ICMP payload size (ping);
- ``udp``: the highest UDP throughput with at most :data:`UDP_LOSS_LIMIT` % loss, found by
  :func:`udp_rate_search` over iperf3 ``-u -b`` rates, with the jitter and loss iperf3 reports
  at that rate; RTT by size as in the TCP cell.

ICMP is neither TCP nor UDP: RTT is measured once per suite, family and repetition, and
shown in each cell of that family; its samples say ``"protocol": "icmp"``.

The rate search is bounded in probes (``max_steps``) and in seconds (``budget_s``): it
starts at a hint (the suite's UDP rate in the previous repetition, else its TCP throughput
if it was just measured, never above :data:`UDP_MAX_MBPS`), raises the rate by
half while the loss stays within the limit, steps down to 90 % of what got through when it does not,
and then bisects (geometric mean) between the fastest rate within the limit and the slowest
beyond it (a rate that lost too much bounds it at 110 % of what arrived) until they are within
``tolerance`` of each other. The result is the probe within
the limit that delivered most; if no probe kept within the limit, the one with the least
loss, marked as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.errors import InvalidInput
from app.measure.domain.tunnel import SuiteRun, bench_document

__all__ = [
    "FAMILIES",
    "PROTOCOLS",
    "UDP_LOSS_LIMIT",
    "UDP_MAX_MBPS",
    "UDP_PAYLOAD",
    "UDP_SEARCH_STEPS",
    "UDP_START_MBPS",
    "CellRuns",
    "UdpProbe",
    "UdpSearch",
    "ipv6_table_name",
    "matrix_document",
    "parse_families",
    "parse_protocols",
    "udp_rate_search",
]

FAMILIES: tuple[int, ...] = (4, 6)
PROTOCOLS: tuple[str, ...] = ("tcp", "udp")
#: Loss (%) a UDP rate may cause and still count as carried.
UDP_LOSS_LIMIT = 1.0
#: Probes of the UDP rate search per suite, family and repetition.
UDP_SEARCH_STEPS = 5
#: First offered rate (Mbit/s) when no TCP figure of the suite is at hand.
UDP_START_MBPS = 200.0
#: Highest rate offered (Mbit/s): one iperf3 UDP stream between two namespaces here loses
#: several % at 1 Gbit/s already, with or without IPsec.
UDP_MAX_MBPS = 2000.0
#: UDP payload bytes: one datagram fits the TUN device's MTU of 1400 in both families
#: (1400 - 40 IPv6 - 8 UDP), and the same payload over both keeps the IPv6/IPv4 ratio a
#: matter of the headers only.
UDP_PAYLOAD = 1352


def parse_families(text: str) -> tuple[int, ...]:
    """``--family``: ``4``, ``6``, ``4,6`` or ``6,4`` (measured in that order).

    Raises:
        InvalidInput: anything else.
    """
    try:
        families = tuple(int(part) for part in text.split(","))
    except ValueError:
        families = ()
    if not families or len(set(families)) != len(families) or not set(families) <= set(FAMILIES):
        raise InvalidInput(f"--family {text[:20]!r}: 4, 6, 4,6 or 6,4")
    return families


def parse_protocols(text: str) -> tuple[str, ...]:
    """``--protocol``: ``tcp``, ``udp``, ``tcp,udp`` or ``udp,tcp``.

    Raises:
        InvalidInput: anything else.
    """
    protocols = tuple(part.strip().lower() for part in text.split(","))
    if not protocols or len(set(protocols)) != len(protocols) or not set(protocols) <= set(PROTOCOLS):
        raise InvalidInput(f"--protocol {text[:20]!r}: tcp, udp or tcp,udp")
    return protocols


def ipv6_table_name(name: str) -> str:
    """The name of the rating table ``--write-table NAME`` writes from IPv6 measurements: ``NAME-ipv6``."""
    return f"{name}-ipv6"


# --------------------------------------------------------------------------- UDP rate search


@dataclass(frozen=True, slots=True)
class UdpProbe:
    """One iperf3 UDP run: the rate offered, what arrived, and the receiver's jitter and loss."""

    offered_mbps: float
    received_mbps: float
    jitter_ms: float
    loss_percent: float


@dataclass(frozen=True, slots=True)
class UdpSearch:
    """The result of :func:`udp_rate_search`: the chosen probe, every probe in order, and
    whether the chosen one kept within the loss limit."""

    best: UdpProbe
    probes: tuple[UdpProbe, ...]
    within_limit: bool


def udp_rate_search(
    probe: Callable[[float], UdpProbe], *, start_mbps: float = UDP_START_MBPS, max_steps: int = UDP_SEARCH_STEPS,
    budget_s: float = 60.0, clock: Callable[[], float] | None = None, loss_limit: float = UDP_LOSS_LIMIT,
    tolerance: float = 0.1, max_mbps: float = 10_000.0, min_mbps: float = 1.0,
) -> UdpSearch:
    """The highest UDP rate with at most ``loss_limit`` % loss (see the module doc).

    Args:
        probe: runs iperf3 at an offered rate (Mbit/s) and reports it.
        start_mbps: the first rate offered.
        max_steps: probes at most (>= 1).
        budget_s: no probe starts after this many seconds (the first always runs).
        clock: monotonic seconds (default :func:`time.monotonic`).
        loss_limit: loss (%) still counted as carried.
        tolerance: stop once the fastest rate within the limit and the slowest beyond it
            differ by less than this fraction.
        max_mbps, min_mbps: the range offered rates are kept in.

    Raises:
        InvalidInput: bad bounds.
    """
    if max_steps < 1 or not (0 < min_mbps <= start_mbps) or not math.isfinite(start_mbps) or tolerance <= 0:
        raise InvalidInput("udp_rate_search: max_steps >= 1, 0 < min_mbps <= start_mbps, tolerance > 0")
    if clock is None:
        import time

        clock = time.monotonic
    began = clock()
    rate = min(start_mbps, max_mbps)
    probes: list[UdpProbe] = []
    good: float | None = None  # fastest offered rate within the limit
    bad: float | None = None  # slowest offered rate beyond it
    while len(probes) < max_steps and (not probes or clock() - began < budget_s):
        result = probe(rate)
        probes.append(result)
        if result.loss_percent <= loss_limit:
            good = rate if good is None else max(good, rate)
        else:  # the path carried about what arrived: no point offering much more
            ceiling = min(rate, max(result.received_mbps * 1.1, min_mbps))
            bad = ceiling if bad is None else min(bad, ceiling)
        if good is not None and bad is not None and bad <= good:
            bad = good * (1 + tolerance)  # a noisy ceiling under a rate that passed: stop
        if bad is None:
            if rate >= max_mbps:
                break
            nxt = min(rate * 1.5, max_mbps)
        elif good is None:
            # Just under what got through (what the path carried at that rate).
            nxt = max(min(result.received_mbps, rate) * 0.9, min_mbps)
            if rate <= min_mbps:
                break
        else:
            if bad <= good * (1 + tolerance):
                break
            nxt = math.sqrt(good * bad)
        rate = nxt
    within = [p for p in probes if p.loss_percent <= loss_limit]
    if within:
        return UdpSearch(max(within, key=lambda p: p.received_mbps), tuple(probes), True)
    return UdpSearch(min(probes, key=lambda p: (p.loss_percent, -p.received_mbps)), tuple(probes), False)


# --------------------------------------------------------------------------- the document


@dataclass
class CellRuns:
    """What one cell measured: the no-IPsec baseline and every suite measured in it."""

    family: int
    protocol: str
    baseline: SuiteRun
    suites: list[SuiteRun]

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.family, "protocol": self.protocol, "baseline": self.baseline.as_dict(),
                "suites": [s.as_dict() for s in self.suites]}


def _samples(cells: Iterable[CellRuns]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for cell in cells:
        for run in [cell.baseline, *cell.suites]:
            for sample in run.samples:
                key = tuple(sorted(sample.items()))
                if key not in seen:  # the ICMP samples are shared by the cells of a family
                    seen.add(key)
                    out.append(dict(sample))
    return out


def matrix_document(
    *, machine: str, backend: str, date: str, repetitions: int, duration_s: float, cells: Sequence[CellRuns],
    cpus: Iterable[int] | None = None, udp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``qoss-bench-tunnel`` JSON document, version 2: the matrix.

    ``baseline`` and ``suites`` repeat the first cell, as version 1 readers expect them;
    ``cells`` holds every cell (``family``, ``protocol``, ``baseline``, ``suites``);
    ``samples`` every single measurement with its suite (``null``: no IPsec), ``family``,
    ``protocol`` (``tcp``, ``udp``, ``icmp``), ``metric``, ``flows`` or ``size``, and
    ``repetition``. ``udp`` records how the UDP rate was searched.

    Raises:
        InvalidInput: no cell.
    """
    if not cells:
        raise InvalidInput("a measurement matrix needs at least one cell")
    first = cells[0]
    return {
        **bench_document(machine=machine, backend=backend, date=date, repetitions=repetitions,
                         duration_s=duration_s, baseline=first.baseline, suites=first.suites, cpus=cpus),
        "version": 2,
        "families": list(dict.fromkeys(c.family for c in cells)),  # in the order measured
        "protocols": list(dict.fromkeys(c.protocol for c in cells)),
        "udp": dict(udp) if udp is not None else None,
        "cells": [c.as_dict() for c in cells],
        "samples": _samples(cells),
    }
