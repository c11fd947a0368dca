"""The work only one replica may do, run by whichever leads (``app.adapters.db.leader``):
reconcile when it takes office, the tunnel monitor, moving tunnels after edits. With one
process (SQLite) it leads from the start; with several on PostgreSQL another takes over
within seconds when the leader dies."""

from __future__ import annotations

import logging
import threading
import uuid

from app.services.rekey import Rekeyer
from app.services.tunnel_monitor import TunnelMonitor
from app.web.runtime import Runtime

__all__ = ["LeaderDuties"]

log = logging.getLogger("qoss.leader")


class LeaderDuties:
    """Starts the leader's work when elected and stops it when deposed (the runtime carries
    ``tunnel_monitor`` and ``rekeyer`` while it leads, None otherwise)."""

    def __init__(self, parts: Runtime) -> None:
        self._parts = parts
        self._lock = threading.Lock()
        self._started = False  # the first election is at start; a later one is a takeover

    def elected(self) -> None:
        s, parts = self._parts.settings, self._parts
        with self._lock:
            first, self._started = not self._started, True
            if s.reconcile_on_start:
                self._reconcile("at start" if first else "on taking the lead")
            if s.monitor_tunnels:
                parts.tunnel_monitor = TunnelMonitor(units=parts.units, reads=parts.read_units, vici=parts.vici_factory,
                                                     listen=parts.sa_events.listener,
                                                     resync=s.monitor_interval,
                                                     metrics=parts.metrics)
                parts.tunnel_monitor.start()
            if s.rekey:
                parts.rekeyer = Rekeyer(
                    units=parts.units, reads=parts.read_units, vici=parts.vici_factory, default_table=s.default_table,
                    cheaper=s.rekey_cheaper, concurrency=s.rekey_concurrency,
                    teardown_noncompliant=s.rekey_teardown_noncompliant, drain=s.rekey_drain, retry=s.rekey_retry,
                    watch=s.rekey_watch, metrics=parts.metrics, peering=parts.peering)
                parts.rekeyer.start()

    def deposed(self) -> None:
        with self._lock:
            workers = (self._parts.tunnel_monitor, self._parts.rekeyer)
            self._parts.tunnel_monitor = self._parts.rekeyer = None
            for worker in workers:
                if worker is not None:
                    worker.stop()

    def _reconcile(self, when: str) -> None:
        from app.services.reconcile import reconcile

        parts = self._parts
        with parts.units() as uow:
            report = reconcile(uow=uow, vici=parts.vici_factory,
                               default_table=self._parts.settings.default_table)
            changed = {"restored": len(report.restored), "failed": len(report.failed),
                       "orphans_removed": len(report.orphans_removed)}
            if any(changed.values()):  # a state change made by no request: its own record, in its transaction
                uow.audit.append(
                    request_id=f"startup-{uuid.uuid4().hex[:12]}", token_id=None, token_name=None, scopes=[],
                    source="local", action="POST", object="/v1/tunnels/reconcile", outcome=200,
                    detail=f"reconcile {when}: " + " ".join(f"{k}={v}" for k, v in changed.items()),
                )
            uow.commit()
        if any(report.as_dict().values()):
            log.info("reconcile %s: %s", when, report.as_dict())
