"""Prometheus metrics: the :class:`~app.domain.ports.Metrics` port on ``prometheus_client``,
the tunnel counts read from the database at scrape time, and the exposition.

Every metric is declared once, in :data:`CATALOGUE` (name, kind, help, labels); counting a
name it does not declare, or with other labels, is a bug and raises.

Several processes (workers behind one address, or replicas on one host) are summed by
``prometheus_client``'s multi-process mode: set ``PROMETHEUS_MULTIPROC_DIR`` to a directory
every process shares, emptied before the first of them starts. The variable is read when
``prometheus_client`` is first imported, so it belongs in the environment, not in qoss's
settings. Each process then writes its values to files there, and whichever process a
scrape reaches sums every process's files (:func:`exposition`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import create_engine, func, pool, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from app.adapters.db.models import TunnelRow
from app.adapters.db.write_gate import gates

__all__ = [
    "CATALOGUE",
    "CONTENT_TYPE",
    "MULTIPROC_ENV",
    "MetricSpec",
    "PrometheusMetrics",
    "ScrapeReader",
    "WriteGateCounts",
    "exposition",
]

#: The environment variable of ``prometheus_client``'s multi-process mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The text exposition format's media type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Seconds: from a fast API answer (1 ms) to a tunnel set-up that waits for charon (30 s).
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: ``kind`` is ``counter`` or ``histogram`` (seconds)."""

    kind: str
    help: str
    labels: tuple[str, ...] = ()


#: Every metric qoss counts (the tunnel gauge, read at scrape time, is :class:`_TunnelCounts`).
CATALOGUE: Mapping[str, MetricSpec] = {
    "qoss_http_requests_total": MetricSpec(
        "counter", "HTTP requests answered, by route template, method and status", ("route", "method", "status")),
    "qoss_http_request_seconds": MetricSpec(
        "histogram", "Seconds from a request's arrival to its answer's last byte, by route template and method",
        ("route", "method")),
    "qoss_negotiations_total": MetricSpec(
        "counter", "POST /v1/negotiations by outcome: chosen, or the error's name (NoFeasibleSuite, NotFound, ...)",
        ("outcome",)),
    "qoss_tunnel_setups_total": MetricSpec(
        "counter", "Tunnel creations by outcome: up, or the error's name (NoFeasibleSuite, GatewayUnreachable, ...)",
        ("outcome",)),
    "qoss_tunnel_setup_seconds": MetricSpec(
        "histogram", "Seconds to load, initiate and verify a tunnel in strongSwan, by outcome", ("outcome",)),
    "qoss_rekey_moves_total": MetricSpec(
        "counter", "Tunnels the re-keyer moved to a compliant suite (moved) or could not (refused)", ("outcome",)),
    "qoss_rekey_move_seconds": MetricSpec(
        "histogram", "Seconds for one make-before-break move, from reading the tunnel to recording the move"),
    "qoss_sa_reports_total": MetricSpec(
        "counter", "Tunnel set-ups' waits for charon's report of an end's CHILD_SA coming up: reported (read "
        "instead of list-sas), missed (none in time or no event connection: list-sas asked)", ("outcome",)),
    "qoss_vici_calls_total": MetricSpec(
        "counter", "VICI commands sent to a charon, by gateway (its VICI socket)", ("gateway",)),
    "qoss_vici_errors_total": MetricSpec(
        "counter", "VICI commands that failed, by gateway and error (GatewayUnreachable, GatewayRejected)",
        ("gateway", "error")),
    "qoss_agent_joins_total": MetricSpec(
        "counter", "Tunnel-agent messages accepted, by role (host, target, revocation) and kind "
        "(connect, disconnect, revoke)", ("role", "kind")),
    "qoss_agent_refusals_total": MetricSpec(
        "counter", "Tunnel-agent messages refused, by role and reason (the error's name: AgentRejected, "
        "RateLimited, NoFeasibleSuite, ...)", ("role", "reason")),
    "qoss_revisions_total": MetricSpec(
        "counter", "New revisions of rating tables and policies (create, replace, patch, revert), by kind",
        ("kind",)),
    "qoss_monitor_lag_seconds": MetricSpec(
        "histogram", "Seconds from a charon's up/down event to the tunnel monitor's check of that tunnel "
        "(includes the monitor's settle time, 1 to 1.25 s)"),
}


class PrometheusMetrics:
    """The :class:`~app.domain.ports.Metrics` port on ``prometheus_client`` (thread-safe).

    Args:
        registry: where the metrics are registered (a fresh one per application by default;
            in multi-process mode the values live in ``PROMETHEUS_MULTIPROC_DIR`` whatever it is).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics: dict[str, Counter | Histogram] = {}
        for name, spec in CATALOGUE.items():
            if spec.kind == "counter":
                self._metrics[name] = Counter(name.removesuffix("_total"), spec.help, spec.labels,
                                              registry=self.registry)
            else:
                self._metrics[name] = Histogram(name, spec.help, spec.labels, registry=self.registry,
                                                buckets=_BUCKETS)

    def _child(self, name: str, labels: Mapping[str, str]) -> Any:
        metric = self._metrics[name]  # KeyError: not in the catalogue
        return metric.labels(**labels) if labels else metric

    def count(self, name: str, /, amount: float = 1.0, **labels: str) -> None:
        self._child(name, labels).inc(amount)

    def observe(self, name: str, value: float, /, **labels: str) -> None:
        self._child(name, labels).observe(value)


class _TunnelCounts(Collector):
    """``qoss_tunnels{state, gateway}``: the tunnel records by state and initiating gateway, read
    from the database when scraped (by :class:`ScrapeReader`, in its thread)."""

    def __init__(self, counts: Iterable[tuple[str, str, int]], *, read: bool = True) -> None:
        self._counts = list(counts)
        self._read = read

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("qoss_tunnels", "Tunnel records by state and initiating gateway (read from "
                                   "the database at scrape time: the same figure on every process)",
                                   labels=["state", "gateway"])
        for state, gateway, n in self._counts:
            family.add_metric([state, gateway], n)
        yield family
        up = GaugeMetricFamily("qoss_tunnels_scrape_ok", "1 if qoss_tunnels could be read from the database "
                               "at this scrape, 0 if the database did not answer in time")
        up.add_metric([], 1 if self._read else 0)
        yield up


class WriteGroupsLike(Protocol):
    """What the metrics read of ``app.adapters.db.write_groups.WriteGroups``."""

    groups: int
    writes: int
    waited: float


class WriteGateCounts(Collector):
    """This process's SQLite writer queue (``app.adapters.db.write_gate``), per database file:
    write transactions, and the seconds writers waited for their turn and held it; with
    ``groups`` (``app.adapters.db.write_groups``), the groups of tunnel set-ups' writes committed
    together and the writes they held."""

    def __init__(self, groups: WriteGroupsLike | None = None) -> None:
        self._groups = groups

    def collect(self) -> Iterator[Metric]:
        if self._groups is not None:
            groups = CounterMetricFamily("qoss_sqlite_write_groups", "Groups of tunnel set-ups' writes this "
                                         "process committed in one SQLite transaction each (or failed)")
            groups.add_metric([], self._groups.groups)
            grouped = CounterMetricFamily("qoss_sqlite_grouped_writes", "Tunnel set-ups' writes those groups held "
                                          "(divided by the groups: the mean group)")
            grouped.add_metric([], self._groups.writes)
            waited = CounterMetricFamily("qoss_sqlite_group_wait_seconds", "Seconds tunnel set-ups' writes waited "
                                         "in line for their group to be written (or to lead the next one)")
            waited.add_metric([], self._groups.waited)
            yield from (groups, grouped, waited)
        writes = CounterMetricFamily("qoss_sqlite_writes", "SQLite write transactions of this process (they run "
                                     "one at a time)", labels=["database"])
        waited = CounterMetricFamily("qoss_sqlite_write_wait_seconds", "Seconds this process's SQLite write "
                                     "transactions waited for their turn", labels=["database"])
        held = CounterMetricFamily("qoss_sqlite_write_held_seconds", "Seconds one of this process's SQLite write "
                                   "transactions was open (its rate is the share of time the queue was busy)",
                                   labels=["database"])
        for database, gate in sorted(gates().items()):
            writes.add_metric([database], gate.entered + gate.bypassed)
            waited.add_metric([database], gate.waited)
            held.add_metric([database], gate.busy)
        yield from (writes, waited, held)


def exposition(registry: CollectorRegistry, extra: Iterable[Collector] = (), *,
               multiproc_dir: str | None = None) -> bytes:
    """The text exposition: ``registry``'s metrics (or, in multi-process mode, every process's,
    summed from ``multiproc_dir``, by default ``$PROMETHEUS_MULTIPROC_DIR``) and ``extra``'s."""
    path = multiproc_dir if multiproc_dir is not None else os.environ.get(MULTIPROC_ENV)
    scrape = CollectorRegistry()
    if path:
        MultiProcessCollector(scrape, path=path)  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    else:
        scrape.register(_Forward(registry))
    for collector in extra:
        scrape.register(collector)
    return generate_latest(scrape)


class _Forward(Collector):
    """Another registry's metrics, as one collector."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()


class ScrapeReader:
    """What a scrape needs from the database, on a connection and a thread of its own (no pool),
    within ``timeout`` seconds: it answers while every worker thread and pooled connection is busy,
    and never on the event loop.

    Args:
        database_url: the service's database.
        timeout: seconds a scrape waits for the database before leaving the tunnel counts out.
    """

    def __init__(self, database_url: str, timeout: float = 2.0) -> None:
        args: dict[str, Any] = ({"timeout": timeout, "check_same_thread": False}
                                if database_url.startswith("sqlite") else {"connect_timeout": max(1, int(timeout))})
        self._engine: Engine = create_engine(database_url, poolclass=pool.NullPool, connect_args=args)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qoss-metrics")
        self.timeout = timeout

    def submit(self, work: Callable[[Session], Any]) -> Any:
        """A future of ``work`` run with a read-only session, in this reader's thread."""

        def run() -> Any:
            with Session(self._engine) as session:
                try:
                    return work(session)
                finally:
                    session.rollback()

        return self._thread.submit(run)

    def tunnel_counts(self, session: Session) -> Collector:
        """The tunnel gauge (an empty one, with ``qoss_tunnels_scrape_ok 0``, if the database fails)."""
        deadline = time.monotonic() + self.timeout
        try:
            rows = session.execute(select(TunnelRow.state, TunnelRow.initiator, func.count())
                                   .group_by(TunnelRow.state, TunnelRow.initiator)).all()
        except Exception:  # the database is away: the rest of the exposition still answers
            return _TunnelCounts((), read=False)
        if time.monotonic() > deadline:
            return _TunnelCounts((), read=False)
        return _TunnelCounts([(str(state), str(gateway), int(n)) for state, gateway, n in rows])

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._engine.dispose()
