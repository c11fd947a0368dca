"""Reconcile: make the tunnel records and what the charons hold agree."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from app.domain.charon_port import ViciFactory
from app.domain.errors import GatewayError, GatewayRejected
from app.domain.ports import UnitOfWork
from app.domain.tunnels import TunnelState, is_tunnel_conn, ppk_secret_name
from app.services.tunnel_setup import bring_up, established, teardown
from app.services.tunnels import result_from

__all__ = ["ReconcileReport", "reconcile"]


@dataclass
class ReconcileReport:
    """What reconciliation found and did."""

    healthy: list[str]
    restored: list[str]
    failed: dict[str, str]
    orphans_removed: list[str]
    unreachable: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "restored": self.restored,
            "failed": self.failed,
            "orphans_removed": self.orphans_removed,
            "unreachable": self.unreachable,
        }


def reconcile(*, uow: UnitOfWork, vici: ViciFactory, default_table: str) -> ReconcileReport:
    """Make charon and the records agree (documented in the README).

    - A tunnel whose conn is loaded and whose SA is ESTABLISHED on both ends: healthy.
    - A tunnel missing from either charon (e.g. charon restarted): restored with a fresh
      PSK and the suite recorded at creation, re-verified; if that fails it is marked
      ``failed`` with the reason (its partial configuration is removed).
    - A ``qoss-*`` conn or secret on a charon with no record: an orphan of a crash
      part-way, unloaded. The tunnel agent's ``qoss-agent-*`` ones are not this service's
      (the agent shares the charons and reconciles its own).
    - A tunnel to an unmanaged peer that is no longer established: its remains on the
      gateway are removed and it is marked ``failed`` (its PSK was never kept).
    - A gateway that does not answer: its tunnels are left as they are and reported.
    """
    report = ReconcileReport([], [], {}, [], {})
    gateways = {g.name: g for g in uow.gateways.list()}
    tunnels = uow.tunnels
    records = tunnels.list()
    known = {r.conn for r in records} | {ppk_secret_name(r.conn) for r in records}
    conns: dict[str, set[str]] = {}
    for name, gw in gateways.items():
        v = vici(gw.vici_socket)
        try:
            conns[name] = set(v.list_conns())
            shared = set(v.get_shared())
        except GatewayError as exc:
            report.unreachable[name] = exc.message
            continue
        for orphan in sorted({c for c in conns[name] | shared if is_tunnel_conn(c)} - known):
            with contextlib.suppress(GatewayRejected, ValueError):
                v.terminate(ike=orphan, timeout_ms=3000, force=True)
            with contextlib.suppress(GatewayRejected):
                if orphan in conns[name]:
                    v.unload_conn(orphan)
            with contextlib.suppress(GatewayRejected):
                if orphan in shared:
                    v.unload_shared(orphan)
            report.orphans_removed.append(f"{name}:{orphan}")
    for record in records:
        initiator = gateways.get(record.initiator)
        responder = gateways.get(record.responder) if record.responder is not None else None
        if initiator is None or (record.peer is None and responder is None) \
                or record.initiator in report.unreachable or record.responder in report.unreachable:
            continue
        managed = [record.initiator] if record.responder is None else [record.initiator, record.responder]
        present = all(record.conn in conns.get(side, set()) for side in managed)
        if present and established(vici, initiator, record.conn):
            report.healthy.append(record.id)
            if record.state is not TunnelState.UP:
                _set_state(uow, record.id, TunnelState.UP, "")
            continue
        teardown(record, initiator, responder, vici, strict=False)
        if record.peer is not None:
            # The peer's PSK is write-only (never stored), so this tunnel cannot be rebuilt.
            reason = "the tunnel to an unmanaged peer is gone and its PSK is not kept: create it again"
            report.failed[record.id] = reason
            _set_state(uow, record.id, TunnelState.FAILED, f"reconcile: {reason}")
            continue
        assert responder is not None
        result = result_from(record)
        try:
            bring_up(tunnel_id=record.id, initiator=initiator, far=responder, local_ts=record.local_ts,
                      remote_ts=record.remote_ts, result=result, vici=vici)
        except GatewayError as exc:
            report.failed[record.id] = exc.message
            _set_state(uow, record.id, TunnelState.FAILED, f"reconcile: {exc.message}"[:500])
            continue
        report.restored.append(record.id)
        _set_state(uow, record.id, TunnelState.UP, "restored by reconcile")
    return report


def _set_state(uow: UnitOfWork, tunnel_id: str, state: TunnelState, detail: str) -> None:
    uow.tunnels.set_state(tunnel_id, state, detail)
    uow.events.append("tunnel.state", tunnel_id, {"state": state.value, "detail": detail}, scope="tunnels:read")
