"""The benchmark runs `qoss bench report` reads: the JSON documents of ``qoss bench micro --out``
and ``qoss bench tunnel --out`` (optional keys may be missing), checked and made into values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.domain.errors import InvalidInput
from app.domain.scoring import MicroResult

__all__ = ["MicroRun", "Stat", "TunnelCell", "TunnelRun", "TunnelSuite", "parse_micro", "parse_tunnel"]


@dataclass(frozen=True, slots=True)
class MicroRun:
    """A ``qoss bench micro --out`` document."""

    machine: str
    results: tuple[MicroResult, ...]
    date: str | None = None
    backend: str | None = None
    library: str | None = None
    command: str | None = None
    elapsed_s: float | None = None

    def get(self, keyword: str) -> MicroResult | None:
        return next((r for r in self.results if r.keyword == keyword), None)


@dataclass(frozen=True, slots=True)
class Stat:
    """Median of repeated measurements, their relative spread, and the samples."""

    median: float
    spread: float | None = None
    samples: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class TunnelSuite:
    """One ESP suite measured through a real tunnel."""

    esp: str
    ike: str | None
    throughput: Stat | None
    rtt_ms: Mapping[int, Stat] = field(default_factory=dict)
    parallel: Mapping[int, Stat] = field(default_factory=dict)
    #: UDP cells only: the offered rate, the receiver's jitter and loss at the rate chosen.
    offered: Stat | None = None
    jitter_ms: Stat | None = None
    loss_percent: Stat | None = None


@dataclass(frozen=True, slots=True)
class TunnelCell:
    """One cell of the measurement matrix: an address family and a transport protocol."""

    family: int
    protocol: str
    baseline: TunnelSuite | None
    suites: tuple[TunnelSuite, ...]

    @property
    def label(self) -> str:
        """``IPv4 TCP``, ``IPv6 UDP``."""
        return f"IPv{self.family} {self.protocol.upper()}"


@dataclass(frozen=True, slots=True)
class TunnelRun:
    """A ``qoss bench tunnel --out`` document."""

    machine: str | None
    backend: str | None
    date: str | None
    repetitions: int | None
    duration_s: float | None
    baseline: TunnelSuite | None
    suites: tuple[TunnelSuite, ...]
    cpus: tuple[int, ...] | None = None  # the CPUs charons, iperf3 and ping were pinned to; None: not pinned
    #: Every cell measured; a version 1 document is the one cell IPv4 TCP.
    cells: tuple[TunnelCell, ...] = ()

    def cell(self, family: int, protocol: str) -> TunnelCell | None:
        return next((c for c in self.cells if (c.family, c.protocol) == (family, protocol)), None)


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{where}: expected a number")
    return float(value)


def _opt_text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return str(value) if value is not None else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where}: expected an object")
    return value


def parse_micro(data: Any) -> MicroRun:
    """Read a ``qoss bench micro --out`` document.

    Raises:
        InvalidInput: not such a document.
    """
    doc = _mapping(data, "micro")
    if doc.get("kind", "qoss-bench-micro") != "qoss-bench-micro":
        raise InvalidInput(f"micro: kind is {doc.get('kind')!r}, not 'qoss-bench-micro'")
    rows = doc.get("results")
    if not isinstance(rows, list) or not rows:
        raise InvalidInput("micro: 'results' must be a non-empty list")
    results = []
    for i, raw in enumerate(rows):
        row = _mapping(raw, f"micro.results[{i}]")
        where = f"micro.results[{i}]"
        keyword = row.get("algorithm")
        if not isinstance(keyword, str):
            raise InvalidInput(f"{where}.algorithm: expected a keyword")
        spread = _num(row.get("spread", 0.0), f"{where}.spread")
        samples = int(_num(row.get("samples", 0), f"{where}.samples"))
        method = str(row.get("method", ""))
        if row.get("ops_per_s") is not None:
            results.append(MicroResult(keyword, {}, spread, samples, method,
                                       ops_per_s=_num(row["ops_per_s"], f"{where}.ops_per_s")))
            continue
        ns = _mapping(row.get("ns"), f"{where}.ns")
        try:
            by_size = {int(size): _num(v, f"{where}.ns.{size}") for size, v in ns.items()}
        except ValueError as exc:
            raise InvalidInput(f"{where}.ns: sizes must be integers") from exc
        if 1400 not in by_size or len(by_size) < 2:
            raise InvalidInput(f"{where}.ns: needs 1400 B and at least one other size")
        results.append(MicroResult(keyword, by_size, spread, samples, method))
    machine = doc.get("machine")
    elapsed = doc.get("elapsed_s")
    return MicroRun(
        machine=str(machine) if machine is not None else "unknown machine", results=tuple(results),
        date=_opt_text(doc, "date"), backend=_opt_text(doc, "backend"), library=_opt_text(doc, "library"),
        command=_opt_text(doc, "command"), elapsed_s=_num(elapsed, "micro.elapsed_s") if elapsed is not None else None,
    )


def _stat(value: Any, where: str) -> Stat | None:
    if value is None:
        return None
    data = _mapping(value, where)
    if "median" not in data:
        raise InvalidInput(f"{where}.median: missing")
    spread = data.get("spread")
    samples = data.get("samples") or []
    if not isinstance(samples, list):
        raise InvalidInput(f"{where}.samples: expected a list")
    return Stat(_num(data["median"], f"{where}.median"),
                _num(spread, f"{where}.spread") if spread is not None else None,
                tuple(_num(s, f"{where}.samples") for s in samples))


def _stats_by_int(value: Any, where: str) -> dict[int, Stat]:
    if value is None:
        return {}
    out = {}
    for key, raw in _mapping(value, where).items():
        try:
            number = int(key)
        except ValueError as exc:
            raise InvalidInput(f"{where}: key {key!r} is not an integer") from exc
        stat = _stat(raw, f"{where}.{key}")
        if stat is not None:
            out[number] = stat
    return out


def _suite(value: Any, where: str, *, esp: str | None = None) -> TunnelSuite:
    data = _mapping(value, where)
    name = esp if esp is not None else data.get("esp")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.esp: expected a proposal")
    return TunnelSuite(
        esp=name, ike=_opt_text(data, "ike"), throughput=_stat(data.get("throughput_mbps"), f"{where}.throughput_mbps"),
        rtt_ms=_stats_by_int(data.get("rtt_ms"), f"{where}.rtt_ms"),
        parallel=_stats_by_int(data.get("parallel_mbps"), f"{where}.parallel_mbps"),
        offered=_stat(data.get("offered_mbps"), f"{where}.offered_mbps"),
        jitter_ms=_stat(data.get("jitter_ms"), f"{where}.jitter_ms"),
        loss_percent=_stat(data.get("loss_percent"), f"{where}.loss_percent"),
    )


def _cells(value: Any) -> tuple[TunnelCell, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidInput("tunnel.cells: expected a non-empty list")
    out = []
    for i, raw in enumerate(value):
        where = f"tunnel.cells[{i}]"
        data = _mapping(raw, where)
        family, protocol = data.get("family"), data.get("protocol")
        if family not in (4, 6) or isinstance(family, bool):
            raise InvalidInput(f"{where}.family: 4 or 6")
        if protocol not in ("tcp", "udp"):
            raise InvalidInput(f"{where}.protocol: tcp or udp")
        suites = data.get("suites", [])
        if not isinstance(suites, list):
            raise InvalidInput(f"{where}.suites: expected a list")
        baseline = data.get("baseline")
        out.append(TunnelCell(
            family=int(family), protocol=str(protocol),
            baseline=_suite(baseline, f"{where}.baseline", esp="(no IPsec)") if baseline is not None else None,
            suites=tuple(_suite(s, f"{where}.suites[{j}]") for j, s in enumerate(suites))))
    if len({(c.family, c.protocol) for c in out}) != len(out):
        raise InvalidInput("tunnel.cells: each family and protocol at most once")
    return tuple(out)


def _cpus(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value)):
        raise InvalidInput(f"{where}: expected a non-empty list of CPU numbers or null")
    return tuple(sorted(set(value)))


def parse_tunnel(data: Any) -> TunnelRun:
    """Read a ``qoss bench tunnel --out`` document (kind ``qoss-bench-tunnel``, version 1 or 2;
    ``cpus`` is optional: older documents have none and were not pinned; ``cells`` is
    optional: a document without it is the one cell IPv4 TCP, its ``baseline`` and ``suites``).

    Raises:
        InvalidInput: not such a document.
    """
    doc = _mapping(data, "tunnel")
    if doc.get("kind") != "qoss-bench-tunnel":
        raise InvalidInput(f"tunnel: kind is {doc.get('kind')!r}, not 'qoss-bench-tunnel'")
    suites = doc.get("suites", [])
    if not isinstance(suites, list):
        raise InvalidInput("tunnel.suites: expected a list")
    baseline = doc.get("baseline")
    reps, duration = doc.get("repetitions"), doc.get("duration_s")
    top_baseline = _suite(baseline, "tunnel.baseline", esp="(no IPsec)") if baseline is not None else None
    top_suites = tuple(_suite(s, f"tunnel.suites[{i}]") for i, s in enumerate(suites))
    cells = _cells(doc.get("cells")) or (TunnelCell(4, "tcp", top_baseline, top_suites),)
    return TunnelRun(
        machine=_opt_text(doc, "machine"), backend=_opt_text(doc, "backend"), date=_opt_text(doc, "date"),
        repetitions=int(_num(reps, "tunnel.repetitions")) if reps is not None else None,
        duration_s=_num(duration, "tunnel.duration_s") if duration is not None else None,
        baseline=top_baseline, suites=top_suites, cpus=_cpus(doc.get("cpus"), "tunnel.cpus"), cells=cells,
    )
