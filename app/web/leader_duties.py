"""The work only one replica may do, run by whichever leads (``app.adapters.db.leader``):
reconcile when it takes office, the tunnel monitor, moving tunnels after edits. With one
process (SQLite) it leads from the start; with several on PostgreSQL another takes over
within seconds when the leader dies."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from app.services.rekey import Rekeyer
from app.services.tunnel_monitor import TunnelMonitor
from app.settings import Settings

__all__ = ["LeaderDuties"]

log = logging.getLogger("qoss.leader")


class LeaderDuties:
    """Starts the leader's work when elected and stops it when deposed (``app.state`` carries
    ``tunnel_monitor`` and ``rekeyer`` while it leads, None otherwise)."""

    def __init__(self, state: Any, settings: Settings) -> None:
        self._state, self._settings = state, settings
        self._lock = threading.Lock()
        self._started = False  # the first election is at start; a later one is a takeover
        state.tunnel_monitor = None
        state.rekeyer = None

    def elected(self) -> None:
        s, state = self._settings, self._state
        with self._lock:
            first, self._started = not self._started, True
            if s.reconcile_on_start:
                self._reconcile("at start" if first else "on taking the lead")
            if s.monitor_tunnels:
                state.tunnel_monitor = TunnelMonitor(units=state.units, reads=state.read_units, vici=state.vici_factory,
                                                     listen=state.sa_events.listener,
                                                     resync=s.monitor_interval,
                                                     metrics=state.metrics)
                state.tunnel_monitor.start()
            if s.rekey:
                state.rekeyer = Rekeyer(
                    units=state.units, reads=state.read_units, vici=state.vici_factory, default_table=s.default_table,
                    cheaper=s.rekey_cheaper, concurrency=s.rekey_concurrency,
                    teardown_noncompliant=s.rekey_teardown_noncompliant, drain=s.rekey_drain, retry=s.rekey_retry,
                    watch=s.rekey_watch, metrics=state.metrics)
                state.rekeyer.start()

    def deposed(self) -> None:
        with self._lock:
            for name in ("tunnel_monitor", "rekeyer"):
                worker = getattr(self._state, name)
                setattr(self._state, name, None)
                if worker is not None:
                    worker.stop()

    def _reconcile(self, when: str) -> None:
        from app.services.reconcile import reconcile

        state = self._state
        with state.units() as uow:
            report = reconcile(uow=uow, cache=state.table_cache, vici=state.vici_factory,
                               default_table=self._settings.default_table)
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
